#!/usr/bin/env python3
"""Writes a one-rank Strata checkpoint holding N tiny tensors, to time how `strata ckpt info` and
`strata ckpt consolidate` scale with the number of tensors (issue 21, item 3).

usage: many_tensors_checkpoint.py N OUT_DIR     (OUT_DIR/step_00000001/ is written)
"""
import hashlib, json, os, struct, sys

n, out = int(sys.argv[1]), sys.argv[2]
step = os.path.join(out, "step_00000001")
os.makedirs(step, exist_ok=True)
header = {"__metadata__": {"format": "strata-checkpoint-1", "step": "1", "slices": "{}"}}
for i in range(n):
    header[f"model/t{i:07d}"] = {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
text = json.dumps(header, separators=(",", ":"))
text += " " * ((8 - len(text) % 8) % 8)
path = os.path.join(step, "rank_00000.safetensors")
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text.encode() + b"\0" * (4 * n))
digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
manifest = {"format": "strata-checkpoint-1", "step": 1, "state_hash": "x", "world_size": 1,
            "files": {"rank_00000.safetensors": {"bytes": os.path.getsize(path), "sha256": digest}}}
json.dump(manifest, open(os.path.join(step, "manifest.json"), "w"))
