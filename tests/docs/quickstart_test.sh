#!/usr/bin/env bash
# quickstart_test.sh STRATA PYTHON WORKDIR: every ```bash block of docs/quickstart.md, as written,
# in order, in a fresh directory whose data/ is the repository's, with this build's strata and the
# venv's python first on the PATH. A block that fails fails the test, naming it.
set -uo pipefail
strata=$1 python=$2 work=$3
root=$(pwd)
rm -rf "$work" && mkdir -p "$work/bin"
ln -s "$root/data" "$work/data"
ln -s "$root/examples" "$work/examples"
ln -s "$(realpath "$strata")" "$work/bin/strata"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$python" > "$work/bin/python" && chmod +x "$work/bin/python"  # a venv's python must keep its path
export PATH="$work/bin:$PATH" STRATA_PYTHON=$python
"$python" - "$root/docs/quickstart.md" "$work" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
for i, block in enumerate(blocks, 1):
    open(f"{sys.argv[2]}/block_{i:02d}.sh", "w").write("set -eo pipefail\n" + block)
print(f"{len(blocks)} blocks")
PY
fail=0
cd "$work"
for block in block_*.sh; do
  if ! bash "$block" > "${block%.sh}.out" 2>&1; then
    echo "quickstart_test: $block failed:" >&2; sed 's/^/    /' "$block" >&2; tail -5 "${block%.sh}.out" >&2; fail=1; break
  fi
done
# What the page promises came out.
[ $fail -ne 0 ] || {
  [ -s my_data/meta.json ] && [ -s my_run.html ] && [ -s my_model/tokenizer.json ] && ls runs/my_run/tensorboard/events.out.tfevents.* > /dev/null || { echo "quickstart_test: a promised file is missing" >&2; fail=1; }
  grep -q '"step":90' runs/my_run/metrics.jsonl || { echo "quickstart_test: the resumed run did not reach step 90" >&2; fail=1; }
  grep -q "^And God said" block_*.out || { echo "quickstart_test: transformers did not continue the prompt" >&2; fail=1; }
  grep -q "^  n_layer *= 2 *# .*my_model/config.json$" block_*.out || { echo "quickstart_test: plan did not take n_layer from my_model/config.json" >&2; fail=1; }
  grep -q "^  model *= \"gpt\" *# .*my_model/config.json$" block_*.out || { echo "quickstart_test: plan did not take [job] model from my_model/config.json" >&2; fail=1; }
  # The fine-tune starts from the trained model: its first loss is the first run's last, not a fresh start's.
  first() { sed -n "${2}s/.*\"loss\":\([^,]*\),.*/\1/p" "$1"; }
  awk -v a="$(first runs/finetune/metrics.jsonl 1)" -v b="$(first runs/my_run/metrics.jsonl 1)" 'BEGIN { exit !(a < b - 1) }' ||
    { echo "quickstart_test: the fine-tune's first loss is not below a fresh start's" >&2; fail=1; }
}
exit $fail
