#!/usr/bin/env bash
# out_of_tree_test.sh BUILD_DIR SOURCE_DIR WORK
# What a third party does: install Strata into a fresh prefix, copy sdk/template elsewhere,
# build it with find_package(Strata), train with it loaded, then with it switched off; build
# the sdk/examples the same way and run their tests (which use Strata::testing), and a program
# with its own model trained through the library API.
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
strata=$work/prefix/bin/strata
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
build_plugin() {  # DIR: configure and build against the installed prefix only
  local dir=$1
  cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}" \
    > "$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
  cmake --build "$dir/build" > "$dir.build.log" 2>&1 || { cat "$dir.build.log"; exit 1; }
}

# Every project is configured and built first, in two lanes: the test holds 2 processors, and
# each build is mostly one compiler parsing libtorch's headers (about 30 s a file here).
cp -r "$src/sdk/template" "$work/template"
for project in ema fast_gelu eager_1f1b mlp_lm plain_module; do cp -r "$src/sdk/examples/$project" "$work/$project"; done
{ build_plugin "$work/template"; build_plugin "$work/ema"; build_plugin "$work/fast_gelu"; } &
other_lane=$!
build_plugin "$work/eager_1f1b"; build_plugin "$work/mlp_lm"; build_plugin "$work/plain_module"
wait "$other_lane"

cd "$work/template"
"$strata" plugins > plugins.txt
grep -q "template 0.1.0" plugins.txt && { echo "the template plugin must not be on the default path"; exit 1; }
"$strata" run strategy.toml --out runs/on > on.log
grep -q '"param_norm":' runs/on/metrics.jsonl || { echo "template pass did not run"; cat on.log; exit 1; }
# (Through a file: grep -q stops reading early, and under pipefail the writer's SIGPIPE fails the line.)
"$strata" plan strategy.toml --set pass.template_pass.enabled=false > plan_off.txt
grep -q "^Disabled: template_pass" plan_off.txt
"$strata" run strategy.toml --out runs/off --set pass.template_pass.enabled=false > off.log
if grep -q '"param_norm":' runs/off/metrics.jsonl; then echo "disabled template pass still ran"; exit 1; fi
echo "template: built out of tree, trained with it on (param_norm reported) and off"

for example in ema fast_gelu eager_1f1b; do
  ctest --test-dir "$work/$example/build" --output-on-failure > "$work/$example.test.log" 2>&1 || { cat "$work/$example.test.log"; exit 1; }
  echo "example $example: built out of tree, its tests pass"
done

# Programs with their own models, trained through the library API (strata/accelerate.h): one
# written as blocks, one a plain torch::nn::Module; their parity under mpirun is
# parity.accelerate_programs.
declare -A one_process=([mlp_lm]="parallel.tensor=1 pass.tensor_parallel.enabled=false" [plain_module]="parallel.data=1 pass.fsdp.enabled=false")
for program in mlp_lm plain_module; do
  cd "$work/$program"
  # shellcheck disable=SC2086  # the settings are separate words
  "build/train_$program" strategy.toml ${one_process[$program]} > run.log 2>&1 || { cat run.log; exit 1; }
  grep -q "^last step 4 loss " run.log || { echo "train_$program did not train 4 steps"; cat run.log; exit 1; }
  echo "example $program: a program's own model built out of tree and trained through strata::accelerate"
done

# The third-party schedule trains two pipeline stages through the installed launcher.
cd "$work/eager_1f1b"
"$strata" plan -n 2 strategy.toml > plan.txt
grep -q "^Schedule eager_1f1b: p = 2, m = 4" plan.txt || { echo "plan does not show the eager_1f1b schedule"; cat plan.txt; exit 1; }
"$strata" run -n 2 strategy.toml --out runs/eager > eager.log 2>&1 || { cat eager.log; exit 1; }
grep -q '"step":4' runs/eager/metrics.jsonl || { echo "eager_1f1b run did not reach step 4"; cat eager.log; exit 1; }
echo "example eager_1f1b: a plugin's schedule trained 2 pipeline stages"

# A third-party replacement pair (ATorch's register_replace_pair): fast_gelu declares fp32 on CPU;
# module_replace chooses it for fp32 and plan refuses it when amp makes the blocks compute in bf16.
cd "$work/fast_gelu"
"$strata" plan strategy.toml > plan.txt
grep -q "^  gelu: gelu.fast_fp32_cpu in every block (chosen)$" plan.txt || { echo "plan does not show fast_gelu chosen"; cat plan.txt; exit 1; }
"$strata" run strategy.toml --out runs/fast_gelu > run.log 2>&1 || { cat run.log; exit 1; }
grep -q '"step":2' runs/fast_gelu/metrics.jsonl || { echo "fast_gelu run did not reach step 2"; cat run.log; exit 1; }
set +e
"$strata" plan strategy.toml --set pass.amp.enabled=true > bf16.txt 2>&1
status=$?
set -e
[[ $status == 2 ]] && grep -q "implementation 'gelu.fast_fp32_cpu' supports devices cpu, dtypes Float, but the blocks compute on cpu in BFloat16 (pass 'amp')" bf16.txt ||
  { echo "plan did not refuse fast_gelu under amp bf16 (exit $status)"; cat bf16.txt; exit 1; }
echo "example fast_gelu: chosen by module_replace for fp32, refused at plan time for bf16"
