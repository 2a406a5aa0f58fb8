#!/usr/bin/env bash
# baseline_plugin_test.sh BUILD_DIR SOURCE_DIR WORK
# A plugin a third party built at the baseline release (sdk/abi/BASELINE names its commit) keeps
# loading: sdk/template and sdk/examples/ema are taken from that commit's sources and compiled
# against that commit's plugin headers (both read with git archive: no copies in the tree), then
# linked to and loaded by today's installed Strata. The template pass trains; ema's own tests
# (which load it through Strata::testing) pass. Exits 77 (skipped) where the clone lacks the
# baseline commit, e.g. a shallow one.
set -euo pipefail
build=$1 src=$2 work=$3
commit=$(sed -n 's/^commit //p' "$src/sdk/abi/BASELINE")
abi=$(sed -n 's/^abi //p' "$src/sdk/abi/BASELINE")
if ! git -C "$src" cat-file -e "$commit^{commit}" 2> /dev/null; then
  echo "skipped: this clone lacks the baseline commit $commit (a shallow clone?)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work/baseline"
git -C "$src" archive "$commit" plugin_api/include sdk/template sdk/examples/ema | tar -x -C "$work/baseline"
chmod -R go-w "$work/baseline"  # archives keep 0775 directories, where strata refuses plugins
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
strata=$work/prefix/bin/strata
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
build_old() {  # DIR: today's installed Strata, but the baseline's plugin headers first (-I before
  # the imported targets' -isystem), as the plugin was compiled at the baseline
  local dir=$1
  cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}" \
    -DCMAKE_CXX_FLAGS="-I$work/baseline/plugin_api/include" > "$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
  cmake --build "$dir/build" -v > "$dir.build.log" 2>&1 || { cat "$dir.build.log"; exit 1; }
  grep -q -- "-I$work/baseline/plugin_api/include" "$dir.build.log" || { echo "not compiled against the baseline's headers"; exit 1; }
}

# Both built first, side by side (the test holds 2 processors).
build_old "$work/baseline/sdk/template" &
template_build=$!
build_old "$work/baseline/sdk/examples/ema"
wait "$template_build"

cd "$work/baseline/sdk/template"
"$strata" run strategy.toml --out runs/old > run.log 2>&1 || { echo "the baseline's template plugin did not load and train"; cat run.log; exit 1; }
grep -q '"param_norm":' runs/old/metrics.jsonl || { echo "the baseline's template pass did not run"; cat run.log; exit 1; }
echo "template from $commit (plugin ABI $abi): built against its own headers, loaded by $("$strata" --version | head -1), trained"

# (Its test trains in the temporary directory and, as that commit wrote it, leaves the run there.)
TMPDIR="$work" ctest --test-dir "$work/baseline/sdk/examples/ema/build" --output-on-failure > "$work/ema.test.log" 2>&1 || { cat "$work/ema.test.log"; exit 1; }
echo "example ema from $commit: built against its own headers, its tests pass against today's Strata"
