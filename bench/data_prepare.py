"""`strata data prepare` against the tokenizers library's own batch encoder, on the bundled corpus.

Run from the repository root after building: python bench/data_prepare.py [--rounds 3]
The corpus is data/kjv.txt cut into documents of 25 verses, as JSON Lines (about 4.3 MB). A round
times (a) the whole command, start-up, reading, encoding and writing included, with a trained
tokenizer given (--tokenizer), and (b) Tokenizer.encode_batch alone over the same documents in
this process, which is the floor: everything the command adds is read, check and write, and (c)
the whole command on one plain text file of the bundled text 12 times over (50 MB, one document),
with its peak resident memory: such a file is encoded in pieces, its tokens written as they come.
Rounds are interleaved; medians and ratios go to bench/results/data_prepare.md with the command
and the CPU.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from tokenizers import Tokenizer

from machine import cpu_model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--strata", default="build/bin/strata")
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="strata-bench-prepare-")
    lines = open("data/kjv.txt", encoding="utf-8").read().splitlines()
    docs = ["\n".join(lines[i:i + 25]) for i in range(0, len(lines), 25)]
    corpus = os.path.join(work, "kjv.jsonl")
    with open(corpus, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    env = dict(os.environ, STRATA_PYTHON=sys.executable)
    t = time.monotonic()
    subprocess.run([args.strata, "data", "prepare", corpus, "-o", os.path.join(work, "trained"), "--train-tokenizer", str(args.vocab)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    train_s = time.monotonic() - t
    tokenizer_file = os.path.join(work, "trained", "tokenizer.json")
    tokenizer = Tokenizer.from_file(tokenizer_file)
    tokens = json.load(open(os.path.join(work, "trained", "meta.json")))["tokens"]
    total = tokens["train"] + tokens["val"]
    big_text = os.path.join(work, "kjv_x12.txt")
    with open(big_text, "w", encoding="utf-8") as f:
        for _ in range(12):
            f.write(open("data/kjv.txt", encoding="utf-8").read())
    command_s, encoder_s, text_s, text_peak_mib = [], [], [], []
    for _ in range(args.rounds):
        t = time.monotonic()
        child = subprocess.Popen([args.strata, "data", "prepare", big_text, "-o", os.path.join(work, "text"), "--tokenizer", tokenizer_file],
                                 env=env, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        assert status == 0, "strata data prepare of the plain text file failed"
        text_s.append(time.monotonic() - t)
        text_peak_mib.append(usage.ru_maxrss / 1024)  # the largest of the command's processes (the Python that encodes)
        t = time.monotonic()
        subprocess.run([args.strata, "data", "prepare", corpus, "-o", os.path.join(work, "given"), "--tokenizer", tokenizer_file],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        command_s.append(time.monotonic() - t)
        t = time.monotonic()
        tokenizer.encode_batch(docs, add_special_tokens=False)
        encoder_s.append(time.monotonic() - t)
    command, encoder = statistics.median(command_s), statistics.median(encoder_s)
    text_tokens = json.load(open(os.path.join(work, "text", "meta.json")))["tokens"]
    text_total = text_tokens["train"] + text_tokens["val"]
    out = os.path.join("bench", "results", "data_prepare.md")
    with open(out, "w") as f:
        f.write("# strata data prepare: tokenizing throughput on CPU\n\n")
        f.write(f"Command: `{sys.executable} bench/data_prepare.py --rounds {args.rounds}` (from the repository root).\n")
        f.write(f"CPU: {cpu_model()}, {os.cpu_count()} cores; tokenizers {__import__('tokenizers').__version__}.\n")
        f.write(f"Corpus: data/kjv.txt as {len(docs)} JSON Lines documents of 25 verses, {os.path.getsize(corpus) / 1e6:.1f} MB; "
                f"byte-level BPE of vocabulary {args.vocab} trained by `--train-tokenizer` first ({train_s:.1f} s, not in the table).\n\n")
        f.write("| what | median s | tokens/s | ratio to the encoder |\n|---|---|---|---|\n")
        f.write(f"| `strata data prepare --tokenizer` (whole command: start-up, read, encode, write) | {command:.2f} | {total / command:,.0f} | {command / encoder:.2f} |\n")
        f.write(f"| `Tokenizer.encode_batch` alone, in process (the library's floor) | {encoder:.2f} | {total / encoder:,.0f} | 1.00 |\n\n")
        f.write(f"One plain text file, data/kjv.txt 12 times over ({os.path.getsize(big_text) / 1e6:.1f} MB, one document, {text_total:,} tokens), "
                f"the whole command with the same tokenizer: median {statistics.median(text_s):.2f} s "
                f"({text_total / statistics.median(text_s):,.0f} tokens/s), peak resident memory {statistics.median(text_peak_mib):,.0f} MiB "
                f"(rounds: {', '.join(f'{x:.2f} s' for x in text_s)}). For comparison, measured by hand with /usr/bin/time -v: "
                f"`--train-tokenizer 2048` on this file (training included) took 9.1 GB and 67 s when the file was encoded whole "
                f"(before 2026-12-01), and takes 0.9 GB and 14 s in pieces, the token files byte-identical.\n\n")
        f.write(f"{total:,} tokens. Rounds (s): command {', '.join(f'{x:.2f}' for x in command_s)}; "
                f"encoder {', '.join(f'{x:.2f}' for x in encoder_s)}.\n")
    print(open(out).read())


if __name__ == "__main__":
    main()
