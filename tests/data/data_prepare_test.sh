#!/usr/bin/env bash
# data_prepare_test.sh STRATA PYTHON WORKDIR: a user's own text to a trained, exported model
# (issue 62 items 1-3). `strata data prepare` tokenizes a JSON Lines corpus and a plain text file
# (built from the bundled text) with a byte-level BPE it trains, and again with that tokenizer.json
# given: every document ends with the end-of-text id, the token files decode back to the inputs,
# meta.json's counts match the files, the same tokenizer gives the same ids. A strategy naming only
# the directory takes vocab_size, document_end and dtype from meta.json, trains on one rank and on
# two (fsdp), and the export carries the tokenizer: transformers' AutoTokenizer round-trips text
# and AutoModelForCausalLM generates, and `strata sample` (through the prepared tokenizer) gives
# transformers' greedy text. A stated vocabulary below the data's is refused, naming both;
# bad input to prepare is one line and exit status 2.
set -uo pipefail
strata=$1 python=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { echo "data_prepare_test: $1" >&2; fail=1; }
export STRATA_PYTHON=$python

# A corpus: 120 documents of 25 verses as JSON Lines, and a plain text file (one document).
"$python" - "$work" <<'PY'
import json, sys
lines = open("data/kjv.txt", encoding="utf-8").read().splitlines()
with open(f"{sys.argv[1]}/corpus.jsonl", "w") as f:
    for i in range(120):
        f.write(json.dumps({"id": i, "body": "\n".join(lines[25 * i:25 * i + 25])}) + "\n")
with open(f"{sys.argv[1]}/extra.txt", "w") as f:
    f.write("\n".join(lines[3000:3100]))
PY
"$strata" data prepare "$work/corpus.jsonl" "$work/extra.txt" -o "$work/prepared" --train-tokenizer 1000 --text-field body \
  > "$work/prepare.txt" 2>&1 || check "prepare failed: $(cat "$work/prepare.txt")"
grep -q "^strata data prepare: 121 documents" "$work/prepare.txt" || check "prepare did not count 121 documents: $(cat "$work/prepare.txt")"
"$python" - "$work" <<'PY' || check "the prepared files are not what the inputs say"
import json, sys
import numpy as np
from tokenizers import Tokenizer
work = sys.argv[1]
d = f"{work}/prepared"
meta = json.load(open(f"{d}/meta.json"))
tok = Tokenizer.from_file(f"{d}/tokenizer.json")
assert meta["vocab_size"] == tok.get_vocab_size() == 1000, meta
assert meta["eos_id"] == tok.token_to_id("<|endoftext|>") and meta["dtype"] == "uint16", meta
train, val = np.fromfile(f"{d}/train.bin", "<u2"), np.fromfile(f"{d}/val.bin", "<u2")
assert meta["tokens"] == {"train": train.size, "val": val.size}, meta
assert meta["documents"] == {"train": 115, "val": 6}, meta
stream = np.concatenate([train, val])
ends = np.flatnonzero(stream == meta["eos_id"])
assert ends.size == 121 and ends[-1] == stream.size - 1, ends.size
docs = [json.loads(l)["body"] for l in open(f"{work}/corpus.jsonl")] + [open(f"{work}/extra.txt").read()]
begin = 0
for doc, end in zip(docs, ends):
    assert tok.decode(stream[begin:end].tolist()) == doc, (doc[:60], tok.decode(stream[begin:end].tolist())[:60])
    begin = end + 1
PY
# A plain text file of several pieces (the bundled text, 4.3 MB; pieces of 1 Mi characters) is
# encoded in pieces in bounded memory: its ids are exactly those of the whole file encoded at once,
# with the byte-level BPE (cuts after a newline are pre-token boundaries) and with a tokenizer
# whose Metaspace pre-tokenizer prepends to each piece (every cut is undone, and said so).
"$python" - "$work" <<'PY' || check "a Metaspace tokenizer could not be made"
import sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
text = open("data/kjv.txt", encoding="utf-8").read()
tok.train_from_iterator([text[:200000]], trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "</s>"]))
tok.save(f"{sys.argv[1]}/metaspace.json")
open(f"{sys.argv[1]}/book.txt", "w", encoding="utf-8").write(text[:2500000])
PY
"$strata" data prepare data/kjv.txt -o "$work/whole_book" --tokenizer "$work/prepared/tokenizer.json" > "$work/whole_book.txt" 2>&1 ||
  check "prepare of the bundled text failed: $(cat "$work/whole_book.txt")"
grep -q "cuts of plain text files" "$work/whole_book.txt" && check "the byte-level BPE undid a cut: $(cat "$work/whole_book.txt")"
"$strata" data prepare "$work/book.txt" -o "$work/metaspace" --tokenizer "$work/metaspace.json" > "$work/metaspace.txt" 2>&1 ||
  check "prepare with a Metaspace tokenizer failed: $(cat "$work/metaspace.txt")"
grep -Eq "note: ([0-9]+) of the \1 cuts of plain text files gave other tokens with this tokenizer" "$work/metaspace.txt" ||
  check "the undone cuts were not said: $(cat "$work/metaspace.txt")"
"$python" - data/kjv.txt "$work/whole_book" "$work/prepared/tokenizer.json" "$work/book.txt" "$work/metaspace" "$work/metaspace.json" <<'PY' ||
import json, sys
import numpy as np
from tokenizers import Tokenizer
for text_file, prepared, tokenizer in (sys.argv[1:4], sys.argv[4:7]):
    tok, meta = Tokenizer.from_file(tokenizer), json.load(open(f"{prepared}/meta.json"))
    kind = "<u2"
    got = np.concatenate([np.fromfile(f"{prepared}/train.bin", kind), np.fromfile(f"{prepared}/val.bin", kind)]).tolist()
    want = tok.encode(open(text_file, encoding="utf-8").read(), add_special_tokens=False).ids + [meta["eos_id"]]
    assert got == want, (text_file, len(got), len(want), next(i for i, (a, b) in enumerate(zip(got, want)) if a != b))
PY
  check "a plain text file encoded in pieces gave other ids than the whole file"

# SIGTERM (a scheduler, `kill`) while it encodes: exit 130, one line, and the directory holds what it
# held before (here the files of a finished run into it), no temporary file.
cp -r "$work/whole_book" "$work/interrupted"
for _ in 1 2 3 4; do cat data/kjv.txt; done > "$work/four_books.txt"
"$strata" data prepare "$work/four_books.txt" -o "$work/interrupted" --tokenizer "$work/prepared/tokenizer.json" > "$work/interrupted.txt" 2>&1 &
preparing=$!
for _ in $(seq 300); do [[ -e $work/interrupted/train.bin.tmp ]] && break; sleep 0.1; done
kill -TERM $preparing
wait $preparing
status=$?
[[ $status == 130 ]] && [[ $(cat "$work/interrupted.txt") == "strata data prepare: interrupted; the output directory was left as it was" ]] &&
  diff -r "$work/whole_book" "$work/interrupted" > /dev/null ||
  check "SIGTERM during prepare: status $status, $(cat "$work/interrupted.txt"); $(diff -rq "$work/whole_book" "$work/interrupted")"

# The tokenizer it wrote, given back: the same ids.
"$strata" data prepare "$work/corpus.jsonl" -o "$work/again" --tokenizer "$work/prepared/tokenizer.json" --text-field body \
  > "$work/again.txt" 2>&1 || check "prepare with --tokenizer failed: $(cat "$work/again.txt")"
"$python" -c "
import numpy as np, sys
a = np.concatenate([np.fromfile('$work/again/train.bin', '<u2'), np.fromfile('$work/again/val.bin', '<u2')])
b = np.concatenate([np.fromfile('$work/prepared/train.bin', '<u2'), np.fromfile('$work/prepared/val.bin', '<u2')])
sys.exit(0 if np.array_equal(a, b[:a.size]) else 1)" || check "the same tokenizer gave other ids"
# A .json file holding one array (of records, pretty-printed; or of strings) gives the ids the same
# documents give as JSON Lines; an element that is neither is named.
"$python" - "$work" <<'PY'
import json, sys
docs = [json.loads(l)["body"] for l in open(f"{sys.argv[1]}/corpus.jsonl")]
json.dump([{"body": d} for d in docs], open(f"{sys.argv[1]}/records.json", "w"), indent=2)
json.dump(docs, open(f"{sys.argv[1]}/strings.json", "w"))
json.dump(docs[:3] + [{"title": "no body"}], open(f"{sys.argv[1]}/bad_array.json", "w"))
PY
for kind in records strings; do
  "$strata" data prepare "$work/$kind.json" -o "$work/$kind" --tokenizer "$work/prepared/tokenizer.json" --text-field body > /dev/null 2>&1 &&
    cmp -s "$work/$kind/train.bin" "$work/again/train.bin" && cmp -s "$work/$kind/val.bin" "$work/again/val.bin" ||
    check "a JSON array of $kind did not give the JSON Lines' ids"
done

# Train on it naming only the directory (the tokens dataset, its vocabulary and document end from
# meta.json); one rank, then two with fsdp; export; transformers.
cat > "$work/strategy.toml" <<TOML
[job]
model = "gpt"
steps = 4
global_batch = 4
threads = 1
eval_every = 0
checkpoint_every = 4

[model]
n_layer = 1
n_head = 2
d_model = 32
seq_len = 32

[data]
path = "$work/prepared"

[optimizer]
name = "adamw"
lr = 0.003
TOML
"$strata" plan "$work/strategy.toml" > "$work/plan.txt" 2>&1 || check "plan failed: $(cat "$work/plan.txt")"
grep -q "vocab_size *= 1000 *# .*meta.json" "$work/plan.txt" || check "plan does not take vocab_size from meta.json: $(cat "$work/plan.txt")"
grep -q "document_end *= 0 *# .*meta.json" "$work/plan.txt" || check "plan does not take document_end from meta.json"
"$strata" run "$work/strategy.toml" --out "$work/run" > "$work/run.txt" 2>&1 || check "run failed: $(tail -3 "$work/run.txt")"
{ cat "$work/strategy.toml"; printf '\n[[pass]]\nname = "fsdp"\n'; } > "$work/fsdp.toml"
"$strata" run "$work/fsdp.toml" -n 2 --out "$work/run_fsdp" > "$work/run_fsdp.txt" 2>&1 || check "2-rank fsdp run failed: $(tail -3 "$work/run_fsdp.txt")"
grep -q "data 2" "$work/run_fsdp.txt" || check "the fsdp run was not data 2: $(head -2 "$work/run_fsdp.txt")"
for run in run run_fsdp; do
  "$strata" ckpt export "$work/$run" "$work/$run-hf" > /dev/null 2>&1 || check "$run: export failed"
  [ -f "$work/$run-hf/tokenizer.json" ] || check "$run: the export has no tokenizer.json"
  "$python" - "$work/$run-hf" <<'PY' 2>/dev/null || check "$run: transformers cannot tokenize and generate from the export"
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
text = "And God said, Let there be light"
ids = tok(text, return_tensors="pt")
assert tok.decode(ids.input_ids[0]) == text and tok.vocab_size == 1000 and tok.eos_token_id == 0
assert model.config.eos_token_id == 0
out = model.generate(**ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
assert out.shape[1] == ids.input_ids.shape[1] + 8
open(sys.argv[1] + "/greedy.txt", "w").write(tok.decode(out[0], skip_special_tokens=False))
PY
  # strata sample through the prepared tokenizer: greedy, the same text as transformers' generate.
  "$strata" sample "$work/$run" --prompt "And God said, Let there be light" --tokens 8 --temperature 0 | head -c -1 > "$work/$run-sample.txt" ||
    check "$run: strata sample failed"
  cmp -s "$work/$run-sample.txt" "$work/$run-hf/greedy.txt" || check "$run: strata sample's greedy text differs from transformers': $(cat "$work/$run-sample.txt") vs $(cat "$work/$run-hf/greedy.txt")"
  # The export itself, as transformers reads it (config.json, weights, tokenizer.json): the same text.
  "$strata" sample "$work/$run-hf" --prompt "And God said, Let there be light" --tokens 8 --temperature 0 | head -c -1 > "$work/$run-hf-sample.txt" ||
    check "$run: strata sample of the export failed"
  cmp -s "$work/$run-hf-sample.txt" "$work/$run-hf/greedy.txt" || check "$run: strata sample of the export differs from transformers': $(cat "$work/$run-hf-sample.txt")"
done
# Fine-tuning an export: data made with its tokenizer plans; data made with another is refused,
# naming both tokenizer files and the way to prepare it with the weights'.
"$strata" plan "$work/strategy.toml" --set "model.init_from=$work/run-hf" > "$work/same_tokenizer.txt" 2>&1 ||
  check "data prepared with the weights' tokenizer was refused: $(cat "$work/same_tokenizer.txt")"
"$strata" data prepare "$work/extra.txt" -o "$work/other" --train-tokenizer 400 > /dev/null 2>&1 || check "prepare with 400 tokens failed"
msg=$("$strata" plan "$work/strategy.toml" --set "model.init_from=$work/run-hf" --set "data.path=$work/other" 2>&1); status=$?
[ $status -eq 2 ] && [[ $msg == *"[data] path: $work/other/tokenizer.json made these tokens, another tokenizer than the weights' $work/run-hf/tokenizer.json (id "*"--tokenizer $work/run-hf/tokenizer.json\`"* ]] ||
  check "data made with another tokenizer than the weights' was not refused: $status $msg"
msg=$("$strata" plan "$work/strategy.toml" --set model.vocab_size=500 2>&1); status=$?
[ $status -eq 2 ] && [[ $msg == *"vocabulary of 1000 tokens but [model] vocab_size is 500"* ]] || check "a vocabulary below the data's was not refused: $status $msg"

msg=$("$strata" plan "$work/strategy.toml" --set data.document_end=5 2>&1); status=$?
[ $status -eq 2 ] && [[ $msg == *"document_end = 5 but"*"meta.json says documents end with 0 (<|endoftext|>)"* ]] || check "a document_end other than the data's was not refused: $status $msg"
msg=$("$strata" plan "$work/strategy.toml" --set data.dtype=uint32 2>&1); status=$?
[ $status -eq 2 ] && [[ $msg == *'dtype = "uint32" but'*"meta.json says the tokens are uint16"* ]] || check "a dtype other than the data's was not refused: $status $msg"
"$strata" plan "$work/strategy.toml" --set data.document_end=-1 > /dev/null 2>&1 || check "document_end = -1 (one document) was refused"

# A directory: its corpus files at any depth in path order, hidden ones apart, the others named.
# Two documents: the validation split is the tail of the tokens, not one of the two.
mkdir -p "$work/dir/b_sub" "$work/dir/.git" && cp "$work/extra.txt" "$work/dir/a.txt" && cp "$work/corpus.jsonl" "$work/dir/b_sub/c.JSONL"
echo "ref: refs/heads/main" > "$work/dir/.git/HEAD" && echo "not text" > "$work/dir/notes.pdf"
"$strata" data prepare "$work/dir" -o "$work/from_dir" --train-tokenizer 300 --text-field body > "$work/from_dir.txt" 2>&1 ||
  check "prepare of a directory failed: $(cat "$work/from_dir.txt")"
grep -qF "strata data prepare: $work/dir: 2 files read, 1 skipped (not .txt, .md, .jsonl, .json, .ndjson, .parquet; the first: $work/dir/notes.pdf)" "$work/from_dir.txt" &&
  grep -q "^strata data prepare: 121 documents" "$work/from_dir.txt" || check "a directory's files were not read as they should: $(cat "$work/from_dir.txt")"
"$python" -c "
import json, sys
m = json.load(open('$work/from_dir/meta.json'))
sys.exit(0 if m['inputs'] == ['$work/dir/a.txt', '$work/dir/b_sub/c.JSONL'] else 1)" || check "a directory's files are not in path order: $(cat "$work/from_dir/meta.json")"
mkdir -p "$work/two_books" && cp "$work/extra.txt" "$work/two_books/1.txt" && cp "$work/extra.txt" "$work/two_books/2.txt"
"$strata" data prepare "$work/two_books" -o "$work/two" --train-tokenizer 300 > /dev/null 2>&1 || check "prepare of two books failed"
"$python" -c "
import json, sys
m = json.load(open('$work/two/meta.json'))
t = m['tokens']
sys.exit(0 if m['documents'] == {'train': 2, 'val': 0} and 0.04 < t['val'] / (t['train'] + t['val']) < 0.06 else 1)" ||
  check "two documents did not hold out 5% of their tokens: $(cat "$work/two/meta.json")"

# Bad input: one line, exit status 2.
expect_refused() {
  local what=$1 pattern=$2; shift 2
  msg=$("$strata" "$@" 2>&1); status=$?
  [ $status -eq 2 ] && [ "$(printf '%s\n' "$msg" | wc -l)" -eq 1 ] && [[ $msg == *$pattern* ]] || check "$what: status $status: $msg"
}
expect_refused "no tokenizer option" "needs one of --tokenizer" data prepare "$work/extra.txt" -o "$work/x"
expect_refused "a missing input" "is not a file or a directory" data prepare "$work/nothing.txt" -o "$work/x" --train-tokenizer 300
expect_refused "a small vocabulary" "needs a vocabulary above 256" data prepare "$work/extra.txt" -o "$work/x" --train-tokenizer 100
printf '{"text": "fine"}\nnot json\n' > "$work/bad.jsonl"
expect_refused "a bad JSON line" "bad.jsonl:2: not a JSON line" data prepare "$work/bad.jsonl" -o "$work/x" --train-tokenizer 300
expect_refused "a missing text field" "no string field 'body'" data prepare "$work/bad.jsonl" -o "$work/x" --train-tokenizer 300 --text-field body
expect_refused "an array element without the field" "bad_array.json: element 4 of the array is neither a string nor a record with a string field 'body'" data prepare "$work/bad_array.json" -o "$work/x" --train-tokenizer 300 --text-field body
expect_refused "not a tokenizer" "not a Hugging Face tokenizer.json" data prepare "$work/extra.txt" -o "$work/x" --tokenizer "$work/bad.jsonl"
: > "$work/empty.txt" && printf '{"text": ""}\n' > "$work/empty.jsonl"
expect_refused "inputs without text" "the inputs hold no text (2 empty documents)" data prepare "$work/empty.txt" "$work/empty.jsonl" -o "$work/x" --train-tokenizer 300
"$strata" data prepare "$work/empty.txt" "$work/extra.txt" -o "$work/skipped" --train-tokenizer 300 > "$work/skipped.txt" 2>&1 &&
  grep -q "^strata data prepare: 1 documents (1 empty ones skipped)" "$work/skipped.txt" &&
  grep -q '"empty_documents_skipped": 1' "$work/skipped/meta.json" || check "an empty document was not skipped: $(cat "$work/skipped.txt")"
# A tokenizer that adds a BOS (as a hub Llama's does): strata sample on the directory encodes the
# prompt as transformers' tokenizer(prompt) does, and prints transformers' greedy text.
mkdir -p "$work/hf_bos" && cp "$work/run-hf"/* "$work/hf_bos/"
"$python" - "$work/hf_bos" <<'PY' || check "transformers with a BOS-adding tokenizer failed"
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
d = sys.argv[1]
t = json.load(open(f"{d}/tokenizer.json"))
t["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                       "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}
json.dump(t, open(f"{d}/tokenizer.json", "w"))
tok = AutoTokenizer.from_pretrained(d)
ids = tok("And God said", return_tensors="pt")
assert ids.input_ids[0, 0].item() == 0, ids.input_ids
out = AutoModelForCausalLM.from_pretrained(d).generate(**ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)
open(f"{d}/greedy.txt", "w").write(tok.decode(out[0], skip_special_tokens=False))
PY
"$strata" sample "$work/hf_bos" --prompt "And God said" --tokens 6 --temperature 0 | head -c -1 > "$work/hf_bos-sample.txt" || check "strata sample with a BOS failed"
cmp -s "$work/hf_bos-sample.txt" "$work/hf_bos/greedy.txt" || check "strata sample with a BOS differs from transformers': $(cat "$work/hf_bos-sample.txt") vs $(cat "$work/hf_bos/greedy.txt")"
mkdir -p "$work/hf_without_tokenizer" && cp "$work/run-hf/config.json" "$work/run-hf/model.safetensors" "$work/hf_without_tokenizer/"
expect_refused "an export without tokenizer.json" "has no tokenizer.json: strata sample needs the tokenizer" sample "$work/hf_without_tokenizer" --prompt hi
mkdir -p "$work/hf_broken_tokenizer" && cp "$work/run-hf/config.json" "$work/run-hf/model.safetensors" "$work/hf_broken_tokenizer/"
echo '{"model": {"type": "BPE", "vocab": 5}}' > "$work/hf_broken_tokenizer/tokenizer.json"
mkdir -p "$work/tmp"
TMPDIR=$work/tmp expect_refused "a tokenizer.json the library cannot read" \
  "$work/hf_broken_tokenizer/tokenizer.json is not a tokenizer.json the tokenizers library reads (invalid type" \
  sample "$work/hf_broken_tokenizer" --prompt hi
[ -z "$(ls -A "$work/tmp")" ] || check "strata sample left its temporary directory: $(ls "$work/tmp")"
mkdir -p "$work/bert" && echo '{"model_type": "bert"}' > "$work/bert/config.json" && cp "$work/run-hf/tokenizer.json" "$work/bert/"
expect_refused "a model type nothing loads" "describes a bert model, which no registered model loads" sample "$work/bert" --prompt hi
# The text dataset on a prepared directory: refused once (after the run's start line), naming
# the dataset that reads it.
msg=$("$strata" run "$work/strategy.toml" --set job.dataset=text --set model.vocab_size=256 --out "$work/text_on_tokens" 2>&1); status=$?
[ $status -eq 2 ] && [ "$(printf '%s\n' "$msg" | grep -c error)" -eq 1 ] &&
  [[ $msg == *"[data] $work/prepared holds no .txt file; it holds the token files strata data prepare wrote, which [job] dataset = \"tokens\" reads"* ]] ||
  check "the text dataset on a prepared directory: status $status: $msg"
mkdir -p "$work/no_text" && echo x > "$work/no_text/a.png"
expect_refused "a directory without text" "input $work/no_text holds no file of the kinds strata data prepare reads" data prepare "$work/no_text" -o "$work/x" --train-tokenizer 300
expect_refused "no subcommand" "takes a subcommand: prepare" data
expect_refused "an output directory under a file" "-o $work/bad.jsonl/out: cannot create the output directory (Not a directory)" \
  data prepare "$work/extra.txt" -o "$work/bad.jsonl/out" --train-tokenizer 300
exit $fail
