"""Loads the Hugging Face export of a tensor-parallel run in transformers and compares it.

usage: tp_export_parity.py WHOLE_HF SPLIT_HF SPLIT_RUN
WHOLE_HF and SPLIT_HF are `strata ckpt export` of one strategy trained in one process and split
over tensor-parallel ranks (same seed, data and steps); SPLIT_RUN is the split run's directory.
Exit status 0 when
  1. every exported tensor of the split run equals the one-process run's within 1e-3 (the runs
     sum in another order: about 1e-5 after 8 steps; a misplaced piece is off by the weights' own
     scale, 1e-2 and more),
  2. transformers' logits of the two exports agree within 1e-4 (the bound of
     transformers_parity.py), and
  3. transformers' loss on the validation windows the split run evaluated at its last step equals
     that run's own val_loss (Strata's split forward and vocab-parallel loss) within 2e-6 relative
     (the tolerance of the tensor-parallel parity tests).
"""
import json
import pathlib
import sys
import tomllib

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file

whole_hf, split_hf, run = map(pathlib.Path, sys.argv[1:4])
strategy = tomllib.loads((run / "strategy.toml").read_text())
job, data, seq_len = strategy["job"], strategy["data"], strategy["model"]["seq_len"]

whole, split = load_file(whole_hf / "model.safetensors"), load_file(split_hf / "model.safetensors")
if whole.keys() != split.keys():
    sys.exit(f"the exports hold different tensors: {sorted(whole.keys() ^ split.keys())}")
worst_name = max(whole, key=lambda n: (whole[n] - split[n]).abs().max().item())
weight_diff = (whole[worst_name] - split[worst_name]).abs().max().item()

# The windows Strata's evaluation reads: byte tokens of the text's last val_fraction, window w
# being tokens [w * seq_len, + seq_len + 1), eval_batches micro-batches of micro_batch windows.
text = pathlib.Path(data["path"]).read_bytes()
val = torch.tensor(list(text[len(text) - int(len(text) * data["val_fraction"]):]), dtype=torch.long)
windows = (len(val) - 1) // seq_len
micro_batch = job["micro_batch"]
if micro_batch == 0:
    sys.exit("the split run must set [job] micro_batch (its evaluation batches are recomputed here)")
batch = torch.stack([val[(w % windows) * seq_len:][: seq_len + 1] for w in range(job["eval_batches"] * micro_batch)])


def logits(model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(batch[:, :-1]).logits


split_logits = logits(split_hf)
logit_diff = (logits(whole_hf) - split_logits).abs().max().item()
loss = F.cross_entropy(split_logits.flatten(0, 1), batch[:, 1:].flatten()).item()
strata_loss = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["val_loss"]
loss_diff = abs(loss - strata_loss) / strata_loss

ok = weight_diff < 1e-3 and logit_diff < 1e-4 and loss_diff < 2e-6
print(f"{strategy['job']['model']} at tensor {strategy['parallel']['tensor']}: largest weight difference to one process "
      f"{weight_diff:.3e} ({worst_name}), logits {logit_diff:.3e}; transformers' validation loss {loss:.7f}, "
      f"the run's {strata_loss:.7f} (relative {loss_diff:.3e}) {'ok' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
