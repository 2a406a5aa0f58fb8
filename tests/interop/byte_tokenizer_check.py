"""byte_tokenizer_check.py EXPORT_DIR [GREEDY_OUT [TOKENS]]: a byte-level (`text` dataset) export loads in transformers
with its tokenizer: the vocabulary is the 256 bytes, any UTF-8 text encodes to exactly its bytes
(the ids the run trained on) and decodes back, config.json's special ids are null or inside the
vocabulary, and AutoModelForCausalLM generates text that decodes. GREEDY_OUT receives the bytes of
"In the" and TOKENS (20) greedy tokens, to compare with `strata sample --temperature 0`."""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

export = sys.argv[1]
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 20
failures = []
tokenizer = AutoTokenizer.from_pretrained(export)
if len(tokenizer) != 256:
    failures.append(f"vocabulary {len(tokenizer)}, not 256")
for text in ["In the beginning God created the heaven and the earth.", "héllo wörld ✓ \t\n  two  spaces", "\x00\x01\x7f"]:
    ids = tokenizer(text)["input_ids"]
    if ids != list(text.encode("utf-8")):
        failures.append(f"{text!r} encodes to {ids[:12]}..., not its bytes")
    back = tokenizer.decode(ids)
    if back != text:
        failures.append(f"{text!r} decodes back to {back!r}")
config = json.load(open(f"{export}/config.json"))
for key in ("bos_token_id", "eos_token_id"):
    value = config.get(key)
    if value is not None and not 0 <= value < config["vocab_size"]:
        failures.append(f"config.json {key} = {value} outside the vocabulary {config['vocab_size']}")
model = AutoModelForCausalLM.from_pretrained(export)
prompt = tokenizer("In the", return_tensors="pt")
with torch.no_grad():
    out = model.generate(**prompt, max_new_tokens=tokens, do_sample=False)
continuation = tokenizer.decode(out[0])
if not continuation.startswith("In the") or out.shape[1] != prompt["input_ids"].shape[1] + tokens:
    failures.append(f"generation gave {continuation!r} ({out.shape[1]} tokens)")
print(f"generated: {continuation!r}")
if len(sys.argv) > 2:
    open(sys.argv[2], "wb").write(bytes(out[0].tolist()))
if failures:
    print("byte_tokenizer_check: " + "; ".join(failures))
    sys.exit(1)
print("byte-level tokenizer: 256 bytes, round trip exact, generation decodes")
