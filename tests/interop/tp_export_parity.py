"""Loads the Hugging Face export of a tensor-parallel run in transformers and compares it.

usage: tp_export_parity.py WHOLE_HF SPLIT_HF SPLIT_RUN [SPLIT_BF16_HF]
WHOLE_HF and SPLIT_HF are `strata ckpt export` of one strategy trained in one process and split
over tensor-parallel ranks (same seed, data and steps); SPLIT_RUN is the split run's directory;
SPLIT_BF16_HF the split run exported with --dtype bf16.
Exit status 0 when
  1. every exported tensor of the split run equals the one-process run's within 1e-3 (the runs
     sum in another order: about 1e-5 after 8 steps; a misplaced piece is off by the weights' own
     scale, 1e-2 and more),
  2. transformers' logits of the two exports agree within 1e-4 (the bound of
     transformers_parity.py), and
  3. transformers' loss on the validation windows the split run evaluated at its last step equals
     that run's own val_loss (Strata's split forward and vocab-parallel loss) within 2e-6 relative
     (the tolerance of the tensor-parallel parity tests),
  4. the bf16 export holds each fp32 weight rounded to bf16, exactly, its config.json says
     torch_dtype bfloat16 (fp32's says float32), transformers loads it as bf16 with
     dtype="auto", and its logits are the fp32 export's within bf16's rounding (5e-2).
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
split_bf16_hf = pathlib.Path(sys.argv[4]) if len(sys.argv) > 4 else None
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

if split_bf16_hf:
    bf16 = load_file(split_bf16_hf / "model.safetensors")
    rounded = bf16.keys() == split.keys() and all(
        bf16[n].dtype == torch.bfloat16 and torch.equal(bf16[n], split[n].to(torch.bfloat16)) for n in split)
    dtypes = (json.loads((split_bf16_hf / "config.json").read_text()).get("torch_dtype"),
              json.loads((split_hf / "config.json").read_text()).get("torch_dtype"))
    model = transformers.AutoModelForCausalLM.from_pretrained(split_bf16_hf, dtype="auto").eval()
    with torch.no_grad():
        bf16_logit_diff = (model(batch[:, :-1]).logits.float() - split_logits).abs().max().item()
    bf16_ok = rounded and dtypes == ("bfloat16", "float32") and model.dtype == torch.bfloat16 and bf16_logit_diff < 5e-2
    print(f"bf16 export: weights {'rounded exactly' if rounded else 'NOT the fp32 ones rounded'}, torch_dtype {dtypes[0]} "
          f"(fp32 export: {dtypes[1]}), loaded as {model.dtype}, logits within {bf16_logit_diff:.3e} of fp32's "
          f"{'ok' if bf16_ok else 'MISMATCH'}")
    ok = ok and bf16_ok
print(f"{strategy['job']['model']} at tensor {strategy['parallel']['tensor']}: largest weight difference to one process "
      f"{weight_diff:.3e} ({worst_name}), logits {logit_diff:.3e}; transformers' validation loss {loss:.7f}, "
      f"the run's {strata_loss:.7f} (relative {loss_diff:.3e}) {'ok' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
