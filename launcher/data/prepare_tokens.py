"""`strata data prepare`: a user's text to the token files the `tokens` dataset reads.

Run by the strata command (launcher/cmd_data.cpp) with the Python that has Hugging Face
`tokenizers` (the venv scripts/setup makes); the arguments were checked there. Tokenizing is the
library's own batch encoder (Rust, parallel over the cores); nothing here is a tokenizer.

Inputs: plain text files (each file one document), JSON Lines (one document per line, its text in
--text-field) and Parquet when pyarrow is installed. Output directory:
  train.bin, val.bin   the token stream, little-endian uint16 (vocabulary <= 65536) or uint32,
                       every document followed by the end-of-text id; val.bin is the tail
                       (--val-fraction of the documents; of the tokens when that is under one
                       document)
  tokenizer.json       the tokenizer used (given, or trained on the corpus)
  meta.json            vocabulary size, end-of-text id and token, dtype, documents and tokens per
                       split, the inputs; the `tokens` dataset reads it
"""
import argparse
import json
import os
import sys
import time

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_CANDIDATES = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>"]
BATCH_DOCUMENTS = 1024


def fail(message):
    print(f"strata data prepare: error: {message}", file=sys.stderr)
    sys.exit(2)


def read_documents(paths, text_field):
    """Yields (path, text) for every document of every input, in order."""
    for path in paths:
        lower = path.lower()
        if lower.endswith((".jsonl", ".json", ".ndjson")):
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as e:
                        fail(f"{path}:{number}: not a JSON line ({e.msg})")
                    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                        fail(f"{path}:{number}: no string field '{text_field}' (--text-field names it)")
                    yield record[text_field]
        elif lower.endswith(".parquet"):
            try:
                import pyarrow.parquet as pq
            except ImportError:
                fail(f"{path}: reading Parquet needs pyarrow in {sys.prefix} (pip install pyarrow)")
            table = pq.read_table(path, columns=[text_field])
            for text in table.column(text_field).to_pylist():
                if isinstance(text, str):
                    yield text
        else:
            with open(path, encoding="utf-8", errors="strict") as f:
                try:
                    yield f.read()
                except UnicodeDecodeError as e:
                    fail(f"{path}: not UTF-8 text (byte {e.start})")


def train_tokenizer(paths, text_field, vocab_size, eos):
    """A byte-level BPE (GPT-2's scheme) trained on the corpus, with `eos` as its one special token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[eos], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=sys.stderr.isatty())
    tokenizer.train_from_iterator(read_documents(paths, text_field), trainer=trainer)
    return tokenizer


def end_of_text(tokenizer, named):
    if named:
        token_id = tokenizer.token_to_id(named)
        if token_id is None:
            fail(f"--eos '{named}' is not a token of the tokenizer")
        return named, token_id
    for token in EOS_CANDIDATES:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token, token_id
    fail("the tokenizer has none of " + ", ".join(EOS_CANDIDATES) + ": name its end-of-text token with --eos")


class Progress:
    """Documents and tokens so far, on one line of standard error, at most twice a second."""

    def __init__(self, total_bytes):
        self.total, self.done, self.tokens, self.last = total_bytes, 0, 0, 0.0
        self.start = time.monotonic()

    def add(self, text_bytes, tokens, final=False):
        self.done += text_bytes
        self.tokens += tokens
        now = time.monotonic()
        if not sys.stderr.isatty() or (now - self.last < 0.5 and not final):
            return
        self.last = now
        share = self.done / self.total if self.total else 1.0
        rate = self.tokens / max(now - self.start, 1e-9)
        bar = "#" * int(30 * share)
        print(f"\r  [{bar:<30}] {100 * share:5.1f}%  {self.tokens:,} tokens  {rate:,.0f} tokens/s", end="\n" if final else "",
              file=sys.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenizer")
    parser.add_argument("--train-tokenizer", type=int, default=0)
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--eos")
    args = parser.parse_args()
    # The output directory first: an unwritable one is refused before the tokenizer's training.
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        fail(f"-o {args.out}: cannot create the output directory ({e.strerror})")

    started = time.monotonic()
    if args.tokenizer:
        try:
            tokenizer = Tokenizer.from_file(args.tokenizer)
        except Exception as e:  # the library's own message says what is wrong with the file
            fail(f"--tokenizer {args.tokenizer}: not a Hugging Face tokenizer.json ({str(e).splitlines()[0]})")
    else:
        tokenizer = train_tokenizer(args.inputs, args.text_field, args.train_tokenizer, args.eos or "<|endoftext|>")
    trained_s = time.monotonic() - started
    eos_token, eos_id = end_of_text(tokenizer, args.eos)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32

    # Documents in order; each batch goes through the library's batch encoder (all cores).
    total_bytes = sum(os.path.getsize(p) for p in args.inputs)
    progress = Progress(total_bytes)
    streams, lengths, batch = [], [], []
    encode_s = 0.0

    def flush():
        nonlocal encode_s
        t = time.monotonic()
        encodings = tokenizer.encode_batch(batch, add_special_tokens=False)
        encode_s += time.monotonic() - t
        for encoding in encodings:
            ids = np.asarray(encoding.ids + [eos_id], dtype=dtype)
            streams.append(ids)
            lengths.append(len(ids))
        progress.add(sum(len(text.encode("utf-8")) for text in batch), sum(len(e.ids) + 1 for e in encodings))
        batch.clear()

    encode_started = time.monotonic()
    empty = 0  # documents without text (an empty file, "text": ""): an end-of-text token alone teaches nothing
    for text in read_documents(args.inputs, args.text_field):
        if not text:
            empty += 1
            continue
        batch.append(text)
        if len(batch) == BATCH_DOCUMENTS:
            flush()
    if batch:
        flush()
    progress.add(0, 0, final=True)
    documents = len(streams)
    if documents == 0:
        fail("the inputs hold no text" + (f" ({empty} empty documents)" if empty else ""))
    # Whole documents from the tail where there are enough of them; fewer than one document's
    # share (a book or two) and the tail of the tokens is the validation split instead, as the
    # tokens dataset splits a single file: holding out one of two books would take half the text.
    val_documents = int(round(documents * args.val_fraction)) if documents * args.val_fraction >= 1 else 0
    if val_documents == 0:
        stream = np.concatenate(streams)
        cut = len(stream) - int(len(stream) * args.val_fraction)
        train, val = stream[:cut], stream[cut:]
    else:
        train = np.concatenate(streams[: documents - val_documents])
        val = np.concatenate(streams[documents - val_documents:])
    train.astype("<" + np.dtype(dtype).str[1:]).tofile(os.path.join(args.out, "train.bin"))
    val.astype("<" + np.dtype(dtype).str[1:]).tofile(os.path.join(args.out, "val.bin"))
    tokenizer.save(os.path.join(args.out, "tokenizer.json"))
    tokens = int(train.size + val.size)
    elapsed = time.monotonic() - encode_started
    meta = {
        "format": "strata-tokens 1",
        "vocab_size": vocab_size,
        "eos_id": eos_id,
        "eos_token": eos_token,
        "dtype": "uint16" if dtype == np.uint16 else "uint32",
        "tokenizer": "tokenizer.json",
        "tokenizer_source": args.tokenizer or f"trained: byte-level BPE, vocabulary {args.train_tokenizer}",
        "documents": {"train": documents - val_documents, "val": val_documents},
        "empty_documents_skipped": empty,
        "tokens": {"train": int(train.size), "val": int(val.size)},
        "inputs": [os.path.abspath(p) for p in args.inputs],
        "seconds": {"train_tokenizer": round(trained_s, 3), "encode": round(encode_s, 3), "read_encode_write": round(elapsed, 3)},
    }
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    skipped = f" ({empty} empty ones skipped)" if empty else ""
    print(f"strata data prepare: {documents} documents{skipped}, {tokens:,} tokens ({int(train.size):,} train, {int(val.size):,} val) "
          f"in {elapsed:.1f} s ({tokens / max(elapsed, 1e-9):,.0f} tokens/s); vocabulary {vocab_size}, end of text "
          f"{eos_token!r} = {eos_id}; written to {args.out}")
    print("Train on it with, in the strategy ([job] dataset, [model] vocab_size and [data] document_end are read from meta.json "
          f"when left out):\n  [data]\n  path = \"{os.path.abspath(args.out)}\"")


if __name__ == "__main__":
    try:
        main()
    except OSError as e:  # a file that cannot be read or written (permissions, a full disk): one line, exit 2
        fail(f"{e.filename}: {e.strerror}" if e.filename else str(e))
