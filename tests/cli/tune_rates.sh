# Sourced by the tests that run `strata tune` case by case, each case in a cache of its own (a
# trial found in the cache runs nothing and leaves no run directory to read).
# measure_rates STRATA DIR RANKS...: the machine's rates for each rank count (strata doctor's
# collectives and matmul, about 4 s each here), measured once into DIR/rates.
# case_cache DIR NAME: points XDG_CACHE_HOME at DIR/cache-NAME, holding those rates and no trial.
measure_rates() {
  local strata=$1 dir=$2 ranks
  shift 2
  for ranks in "$@"; do
    XDG_CACHE_HOME=$dir/rates "$strata" tune tests/cli/parity.toml -n "$ranks" --dry-run > "$dir/rates-$ranks.log" 2>&1 ||
      { echo "strata tune --dry-run -n $ranks failed: $(tail -3 "$dir/rates-$ranks.log")" >&2; return 1; }
  done
}
case_cache() {
  export XDG_CACHE_HOME=$1/cache-$2
  mkdir -p "$XDG_CACHE_HOME/strata" && cp "$1/rates/strata/tune_cache.jsonl" "$XDG_CACHE_HOME/strata/"
}
