"""`strata data prepare`: a user's text to the token files the `tokens` dataset reads.

Run by the strata command (launcher/cmd_data.cpp) with the Python that has Hugging Face
`tokenizers` (the venv scripts/setup makes); the arguments were checked there. Tokenizing is the
library's own batch encoder (Rust, parallel over the cores); nothing here is a tokenizer.

Inputs: plain text files (each file one document), JSON Lines (one document per line, its text in
--text-field), a .json file holding one array (of such records, or of strings) and Parquet when
pyarrow is installed. Output directory:
  train.bin, val.bin   the token stream, little-endian uint16 (vocabulary <= 65536) or uint32,
                       every document followed by the end-of-text id; val.bin is the tail
                       (--val-fraction of the documents; of the tokens when that is under one
                       document)
  tokenizer.json       the tokenizer used (given, or trained on the corpus)
  meta.json            vocabulary size, end-of-text id and token, dtype, documents and tokens per
                       split, the inputs; the `tokens` dataset reads it
"""
import argparse
import array
import codecs
import json
import os
import signal
import sys
import time

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_CANDIDATES = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>"]
# Memory stays bounded whatever the corpus: a plain text file is read in pieces of about
# PIECE_CHARS characters, and the batch encoder gets at most BATCH_PIECES pieces or BATCH_CHARS
# characters at a time (its encodings cost about 100 bytes a token); the tokens go to disk as
# they come. Encoding a 50 MB text file whole took 9.1 GB.
PIECE_CHARS = 1 << 20
BATCH_PIECES = 1024
BATCH_CHARS = 16 << 20
# Around each cut of a plain text file, this many characters on either side are encoded whole
# and apart: the cut stays only where both give the same tokens.
WINDOW_CHARS = 4096


def fail(message):
    print(f"strata data prepare: error: {message}", file=sys.stderr)
    sys.exit(2)


def first_bad_byte(path):
    """The offset of the first byte of `path` that is not UTF-8 (read in blocks, as the text was)."""
    decoder, offset = codecs.getincrementaldecoder("utf-8")("strict"), 0
    with open(path, "rb") as f:
        while True:
            raw = f.read(1 << 20)
            try:
                decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                return max(0, offset + e.start - len(decoder.getstate()[0]))
            if not raw:
                return offset
            offset += len(raw)


def last_cut(text):
    """Where to end a piece of plain text: just after its last newline that a non-space follows
    (where the pre-tokenizers of byte-level BPEs split anyway); 0 when there is none."""
    i = text.rfind("\n", 0, len(text) - 1)
    while i >= 0 and text[i + 1].isspace():
        i = text.rfind("\n", 0, i)
    return i + 1


def text_pieces(path):
    """A plain text file as one document in pieces: yields (text, ends_document)."""
    with open(path, encoding="utf-8", errors="strict") as f:
        carry = ""
        while True:
            try:
                block = f.read(PIECE_CHARS)
            except UnicodeDecodeError:
                fail(f"{path}: not UTF-8 text (byte {first_bad_byte(path)})")
            if not block:
                yield carry, True
                return
            text = carry + block
            cut = last_cut(text)
            if cut == 0 and len(text) < 16 * PIECE_CHARS:  # one long line: read on to its end
                carry = text
                continue
            cut = cut or len(text)  # a line of 16 pieces: cut inside it (the encoder checks every cut)
            yield text[:cut], False
            carry = text[cut:]


def json_array(path):
    """Whether a .json file is one JSON array (of records or strings) rather than JSON Lines."""
    with open(path, encoding="utf-8") as f:
        while (c := f.read(1)) and c.isspace():
            pass
    return c == "["


def array_documents(path, text_field):
    """The documents of a .json file that is one array: each element a record with `text_field`,
    or a string. Parsed whole (the library has no streaming parser): JSON Lines is the format for
    corpora larger than memory."""
    try:
        with open(path, encoding="utf-8") as f:
            elements = json.load(f)
    except json.JSONDecodeError as e:
        fail(f"{path}:{e.lineno}: not JSON ({e.msg})")
    for number, element in enumerate(elements, 1):
        if isinstance(element, str):
            yield element, True
        elif isinstance(element, dict) and isinstance(element.get(text_field), str):
            yield element[text_field], True
        else:
            fail(f"{path}: element {number} of the array is neither a string nor a record with a string field '{text_field}' "
                 "(--text-field names it)")


def read_documents(paths, text_field):
    """Yields (text, ends_document) for every piece of every document of every input, in order: a
    JSON Lines record or a Parquet row is one piece, a plain text file is one document in pieces."""
    for path in paths:
        lower = path.lower()
        if lower.endswith(".json") and json_array(path):
            yield from array_documents(path, text_field)
        elif lower.endswith((".jsonl", ".json", ".ndjson")):
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
                    yield record[text_field], True
        elif lower.endswith(".parquet"):
            try:
                import pyarrow.parquet as pq
            except ImportError:
                fail(f"{path}: reading Parquet needs pyarrow in {sys.prefix} (pip install pyarrow)")
            for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_PIECES, columns=[text_field]):
                for text in batch.column(0).to_pylist():
                    if isinstance(text, str):
                        yield text, True
        else:
            yield from text_pieces(path)


def train_tokenizer(paths, text_field, vocab_size, eos):
    """A byte-level BPE (GPT-2's scheme) trained on the corpus, with `eos` as its one special token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[eos], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=sys.stderr.isatty())
    tokenizer.train_from_iterator((text for text, _ in read_documents(paths, text_field)), trainer=trainer)
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


class TokenWriter:
    """Pieces in, in order; their tokens out to `path` as they are encoded, an end-of-text id after
    each document's last piece. The tokens of a document cut in pieces must be those of the whole
    document: each cut is checked (a window around it encoded whole and apart) and a cut the
    tokenizer does not allow is undone, its two pieces encoded together."""

    def __init__(self, tokenizer, eos_id, dtype, path, progress):
        self.tokenizer, self.eos_id, self.progress = tokenizer, eos_id, progress
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # ids only, when the library has it
        self.out = open(path, "wb")
        self.pending, self.pending_chars = [], 0  # [text, ends_document]
        self.document_tokens = array.array("q")  # each document's tokens, its end-of-text id included
        self.open_document = 0  # tokens of the document whose pieces are being written
        self.in_document = False  # a piece came that did not end its document
        self.cuts, self.cuts_undone, self.encode_s = 0, 0, 0.0

    def ids(self, text):
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def cut_keeps_tokens(self, before, after):
        a, b = before[-WINDOW_CHARS:], after[:WINDOW_CHARS]
        return self.ids(a + b) == self.ids(a) + self.ids(b)

    def add(self, text, ends_document):
        in_document, self.in_document = self.in_document, not ends_document
        self.cuts += in_document
        if in_document and not self.cut_keeps_tokens(self.pending[-1][0], text):
            self.cuts_undone += 1
            self.pending[-1][0] += text
            self.pending[-1][1] = ends_document
        else:
            self.pending.append([text, ends_document])
        self.pending_chars += len(text)
        if len(self.pending) >= BATCH_PIECES or self.pending_chars >= BATCH_CHARS:
            self.flush(final=False)

    def flush(self, final=True):
        # A document's last piece written stays behind (unless this is the end) so that the next
        # piece's cut can still be undone.
        keep = [] if final or self.pending[-1][1] else [self.pending.pop()]
        started = time.monotonic()
        encodings = self.encode_batch([text for text, _ in self.pending], add_special_tokens=False)
        self.encode_s += time.monotonic() - started
        tokens = 0
        for (text, ends_document), encoding in zip(self.pending, encodings):
            ids = encoding.ids + [self.eos_id] if ends_document else encoding.ids
            np.asarray(ids, dtype=self.dtype).tofile(self.out)
            self.open_document += len(ids)
            tokens += len(ids)
            if ends_document:
                self.document_tokens.append(self.open_document)
                self.open_document = 0
        self.progress.add(sum(len(text.encode("utf-8")) for text, _ in self.pending), tokens)
        self.pending = keep
        self.pending_chars = sum(len(text) for text, _ in keep)

    def close(self):
        if self.pending:
            self.flush()
        self.out.close()


def split_tail(train_path, val_path, train_tokens, itemsize):
    """Moves the tokens of `train_path` after the first `train_tokens` into `val_path`."""
    with open(train_path, "r+b") as f, open(val_path, "wb") as val:
        f.seek(train_tokens * itemsize)
        while chunk := f.read(64 << 20):
            val.write(chunk)
        f.truncate(train_tokens * itemsize)


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

    # Documents in order, their tokens to disk as each batch is encoded; the validation split is
    # the tail, moved out at the end. Every file is written under a temporary name and renamed
    # at the very end: an interrupted or failed run leaves the directory as it was.
    total_bytes = sum(os.path.getsize(p) for p in args.inputs)
    progress = Progress(total_bytes)
    outputs = {name: os.path.join(args.out, name) for name in ("train.bin", "val.bin", "tokenizer.json", "meta.json")}
    temporary = {name: path + ".tmp" for name, path in outputs.items()}
    writer = TokenWriter(tokenizer, eos_id, dtype, temporary["train.bin"], progress)
    encode_started = time.monotonic()
    empty = 0  # documents without text (an empty file, "text": ""): an end-of-text token alone teaches nothing
    try:
        for text, ends_document in read_documents(args.inputs, args.text_field):
            if not text and ends_document and not writer.in_document:
                empty += 1
                continue
            writer.add(text, ends_document)
        writer.close()
        progress.add(0, 0, final=True)
        lengths = np.frombuffer(writer.document_tokens, dtype=np.int64) if writer.document_tokens else np.zeros(0, np.int64)
        documents = int(lengths.size)
        if documents == 0:
            fail("the inputs hold no text" + (f" ({empty} empty documents)" if empty else ""))
        # Whole documents from the tail where there are enough of them; fewer than one document's
        # share (a book or two) and the tail of the tokens is the validation split instead, as the
        # tokens dataset splits a single file: holding out one of two books would take half the text.
        total = int(lengths.sum())
        val_documents = int(round(documents * args.val_fraction)) if documents * args.val_fraction >= 1 else 0
        val_tokens = int(lengths[documents - val_documents:].sum()) if val_documents else int(total * args.val_fraction)
        split_tail(temporary["train.bin"], temporary["val.bin"], total - val_tokens, np.dtype(dtype).itemsize)
        train_size, val_size = total - val_tokens, val_tokens
        tokenizer.save(temporary["tokenizer.json"])
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
            "tokens": {"train": train_size, "val": val_size},
            "inputs": [os.path.abspath(p) for p in args.inputs],
            "seconds": {"train_tokenizer": round(trained_s, 3), "encode": round(writer.encode_s, 3), "read_encode_write": round(elapsed, 3)},
        }
        with open(temporary["meta.json"], "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
    except BaseException:  # a bad input found on the way (exit 2), an interrupt: no partial file left
        writer.out.close()
        for path in temporary.values():
            if os.path.exists(path):
                os.remove(path)
        raise
    for name in ("train.bin", "val.bin", "tokenizer.json", "meta.json"):  # meta.json, which the dataset reads first, last
        os.replace(temporary[name], outputs[name])
    tokens = total
    skipped = f" ({empty} empty ones skipped)" if empty else ""
    print(f"strata data prepare: {documents} documents{skipped}, {tokens:,} tokens ({train_size:,} train, {val_size:,} val) "
          f"in {elapsed:.1f} s ({tokens / max(elapsed, 1e-9):,.0f} tokens/s); vocabulary {vocab_size}, end of text "
          f"{eos_token!r} = {eos_id}; written to {args.out}")
    if writer.cuts_undone:
        print(f"strata data prepare: note: {writer.cuts_undone} of the {writer.cuts} cuts of plain text files gave other tokens "
              "with this tokenizer (its normalizer or pre-tokenizer reads across lines) and were undone: those pieces were "
              "encoded together, taking more memory")
    print("Train on it with, in the strategy ([job] dataset, [model] vocab_size and [data] document_end are read from meta.json "
          f"when left out):\n  [data]\n  path = \"{os.path.abspath(args.out)}\"")


def interrupted(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (a scheduler, `kill`) as Ctrl-C: the temporary files are removed


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupted)
    try:
        main()
    except KeyboardInterrupt:
        print("strata data prepare: interrupted; the output directory was left as it was", file=sys.stderr)
        sys.exit(130)
    except OSError as e:  # a file that cannot be read or written (permissions, a full disk): one line, exit 2
        fail(f"{e.filename}: {e.strerror}" if e.filename else str(e))
