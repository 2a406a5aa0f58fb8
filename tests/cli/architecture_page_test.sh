#!/usr/bin/env bash
# docs/architecture.md names everything a newcomer looks for (issue 60): every `strata` command
# (from `strata --help`), every bundled plugin directory, every plugin header and every folder of
# core/src; and the plugin ABI version `strata --version` reports. Fails naming what the page
# misses, so a new command, plugin, header, subsystem or ABI minor comes with its line on the page.
# usage: architecture_page_test.sh STRATA SOURCE_DIR
set -euo pipefail
strata=$1 source=$2
page=$source/docs/architecture.md
missing=()
commands=$("$strata" --help | awk '/^Commands:/ {on = 1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on = 0}')
[[ -n $commands ]] || { echo "no commands read from strata --help"; exit 1; }
for c in $commands; do grep -q "\`$c\`" "$page" || missing+=("command $c"); done
for d in "$source"/plugins/*/; do
  p=$(basename "$d")
  grep -q "$p" "$page" || missing+=("plugin $p")
done
for h in "$source"/plugin_api/include/strata/*.h; do
  b=$(basename "$h")
  grep -q "\`$b\`" "$page" || missing+=("header $b")
done
for d in "$source"/core/src/*/; do
  f=$(basename "$d")
  grep -q "core/src/$f/" "$page" || missing+=("folder core/src/$f")
done
abi=$("$strata" --version | sed -n 's/.*(plugin ABI \([0-9.]*\)).*/\1/p')
[[ -n $abi ]] || { echo "no plugin ABI version read from strata --version"; exit 1; }
grep -q "versioned ($abi," "$page" || missing+=("plugin ABI $abi (the page says $(grep -o 'versioned ([0-9.]*' "$page" | head -1))")
if ((${#missing[@]})); then
  printf 'docs/architecture.md does not name: %s\n' "${missing[@]}"
  exit 1
fi
echo "docs/architecture.md names every command, plugin, plugin header and core/src folder"
