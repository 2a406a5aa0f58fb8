#!/usr/bin/env bash
# cuda_runtime_test.sh STRATA PARITY_TOML WORKDIR
# libtorch_cuda.so is loaded only where a CUDA driver is (core/src/host/cuda_runtime.cpp), and
# STRATA_LOAD_TORCH_CUDA=1/0 forces it either way. Checks, with the dynamic loader's own trace and
# a driver check made apart from Strata's: what is loaded, what `strata --version` says, the
# error of a CUDA job that cannot have one, and that a CPU run trains bit for bit the same with
# libtorch_cuda loaded and without it.
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
loads_cuda() { local trace; trace=$(LD_DEBUG=files "$@" 2>&1 >/dev/null); grep -q 'file=.*libtorch_cuda\.so .*generating link map' <<< "$trace"; }
version_runtime() { "$@" --version | sed -n 's/^CUDA .*; runtime: //p'; }

if python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null; then driver=yes; else driver=no; fi
echo "CUDA driver on this machine: $driver"

# Default: loaded exactly where a driver is.
if loads_cuda "$strata" --version; then loaded=yes; else loaded=no; fi
[[ $loaded == "$driver" ]] || fail "libtorch_cuda loaded: $loaded, driver: $driver"
runtime=$(version_runtime "$strata")
if [[ $driver == no ]]; then
  [[ $runtime == "libtorch_cuda not loaded (no CUDA driver)" ]] || fail "version says '$runtime'"
else
  [[ $runtime =~ ^([0-9]+\ device\(s\)|no\ CUDA\ device)$ ]] || fail "version says '$runtime'"
fi
# Forced either way.
loads_cuda env STRATA_LOAD_TORCH_CUDA=1 "$strata" --version || fail "STRATA_LOAD_TORCH_CUDA=1 did not load libtorch_cuda"
runtime=$(STRATA_LOAD_TORCH_CUDA=1 version_runtime "$strata")
[[ $runtime =~ ^([0-9]+\ device\(s\)|no\ CUDA\ device)$ ]] || fail "with STRATA_LOAD_TORCH_CUDA=1 version says '$runtime'"
! loads_cuda env STRATA_LOAD_TORCH_CUDA=0 "$strata" --version || fail "STRATA_LOAD_TORCH_CUDA=0 loaded libtorch_cuda"
runtime=$(STRATA_LOAD_TORCH_CUDA=0 version_runtime "$strata")
[[ $runtime == "libtorch_cuda not loaded (STRATA_LOAD_TORCH_CUDA=0)" ]] || fail "with STRATA_LOAD_TORCH_CUDA=0 version says '$runtime'"
echo "loaded where the driver is, and as forced; strata --version says so"

# A CUDA job without libtorch_cuda: one line naming why, exit status 2.
set +e
STRATA_LOAD_TORCH_CUDA=0 "$strata" run "$strategy" --disable ddp --set job.device=cuda --out "$work/cuda" > "$work/cuda.log" 2>&1
status=$?
set -e
[[ $status == 2 ]] || { cat "$work/cuda.log"; fail "a CUDA job without libtorch_cuda exited $status"; }
grep -q 'no CUDA device is available (STRATA_LOAD_TORCH_CUDA=0)' "$work/cuda.log" || { cat "$work/cuda.log"; fail "the error does not say why"; }
echo "a CUDA job without libtorch_cuda: $(grep -m1 'error' "$work/cuda.log")"

# The same CPU training with and without it.
STRATA_LOAD_TORCH_CUDA=0 "$strata" run "$strategy" --disable ddp --set job.steps=4 --out "$work/without" > /dev/null
STRATA_LOAD_TORCH_CUDA=1 "$strata" run "$strategy" --disable ddp --set job.steps=4 --out "$work/with" > /dev/null
"$(dirname "$0")/same_losses.sh" "CPU run with libtorch_cuda loaded vs not" 0 4 "$work/without" "$work/with"
rm -rf "$work"
