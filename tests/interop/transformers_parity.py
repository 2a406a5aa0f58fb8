"""Loads the models Strata exported with Hugging Face transformers and compares logits.

usage: transformers_parity.py DIR   (DIR/<model>/{config.json, model.safetensors, expected.safetensors})
Exit status 0 when every model's logits match within 1e-4, 1 otherwise.
"""
import pathlib
import sys

import torch
import transformers
from safetensors.torch import load_file

failed = False
for model_dir in sorted(p for p in pathlib.Path(sys.argv[1]).iterdir() if p.is_dir()):
    expected = load_file(model_dir / "expected.safetensors")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(expected["tokens"]).logits
    diff = (logits - expected["logits"]).abs().max().item()
    ok = diff < 1e-4
    failed |= not ok
    print(f"{model_dir.name}: {type(model).__name__} loaded, max |logit difference| = {diff:.3e} {'ok' if ok else 'MISMATCH'}")
sys.exit(1 if failed else 0)
