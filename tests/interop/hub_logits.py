"""Compares exported models with the hub model they started from, in transformers.

usage: hub_logits.py TOKENS HUB_DIR EXPORT_DIR... [--class NAME] [--rope-type TYPE]
Loads each directory with AutoModelForCausalLM (fp32), runs the same 2 x TOKENS random tokens and
prints the largest logit difference of each export from the hub model. Exit status 0 when every
export is within 1e-5, is of class NAME, has rope_parameters' rope_type TYPE (where given) and
states the hub model's context (max_position_embeddings, GPT-2's n_positions).
"""
import argparse
import sys

import torch
from transformers import AutoModelForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("tokens", type=int)
parser.add_argument("hub")
parser.add_argument("exports", nargs="+")
parser.add_argument("--class", dest="kind")
parser.add_argument("--rope-type")
args = parser.parse_args()

torch.manual_seed(1)
tokens = torch.randint(0, 256, (2, args.tokens))


def load(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits, model


hub, hub_model = load(args.hub)
failed = False
for path in args.exports:
    logits, model = load(path)
    diff = (logits - hub).abs().max().item()
    kind = type(model).__name__
    rope = getattr(model.config, "rope_parameters", None) or {}
    context = model.config.max_position_embeddings
    ok = diff < 1e-5 and (not args.kind or kind == args.kind) and (not args.rope_type or rope.get("rope_type") == args.rope_type)
    ok = ok and context == hub_model.config.max_position_embeddings
    failed |= not ok
    print(f"{path}: {kind}, rope {rope}, context {context}, max |logit difference| from the hub model = {diff:.3e}: {'ok' if ok else 'MISMATCH'}")
sys.exit(1 if failed else 0)
