#!/usr/bin/env bash
# The module map check (cmake/module_graph.cmake) must fail on a stale map, print the difference
# and the command that regenerates it; its update mode must make the map current; and a module
# without a row in the hand-written descriptions must be named. Works on copies of
# docs/architecture.md and cmake/modules.cmake.
#   module_map_test.sh <source dir> <cmake>
set -euo pipefail
root=$1
cmake_bin=${2:-cmake}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$root/docs/architecture.md" "$tmp/architecture.md"
cp "$root/cmake/modules.cmake" "$tmp/modules.cmake"
run() { "$cmake_bin" -DDOC="$tmp/architecture.md" -DMODULES_FILE="$tmp/modules.cmake" "$@" \
          -P "$root/cmake/module_graph.cmake" 2>&1; }
fail() { echo "FAIL: $1"; echo "$out"; exit 1; }

out=$(run) || fail "the unmodified copy is not current:"

# A new declaration (spec uses kv) makes the map stale: the diff shows the new arrow and row.
sed -i 's/^set(ARBOR_DEPS_spec base sampling)$/set(ARBOR_DEPS_spec base sampling kv)/' "$tmp/modules.cmake"
grep -q '^set(ARBOR_DEPS_spec base sampling kv)$' "$tmp/modules.cmake" || { out=""; fail "could not edit the copy"; }
if out=$(run); then fail "the check passed with a declaration the map does not show:"; fi
grep -qF '+  spec --> kv' <<< "$out" || fail "the diff does not show the new arrow:"
grep -qF '+| `src/spec` | `arbor_spec` | base, sampling, kv |' <<< "$out" || fail "the diff does not show the new row:"
grep -qF -- '-| `src/spec` | `arbor_spec` | base, sampling |' <<< "$out" || fail "the diff does not show the old row:"
grep -qF 'cmake -DMODE=update -P cmake/module_graph.cmake' <<< "$out" || fail "the regeneration command is not printed:"
echo "PASS: a stale map fails with its diff and the regeneration command"

# update rewrites only the block; afterwards the check passes.
out=$(run -DMODE=update) || fail "update failed:"
out=$(run) || fail "the map is stale right after an update:"
grep -qF '  spec --> kv' "$tmp/architecture.md" || { out=$(cat "$tmp/architecture.md"); fail "update did not write the arrow:"; }
diff <(sed '/module-map:begin/,/module-map:end/d' "$root/docs/architecture.md") \
     <(sed '/module-map:begin/,/module-map:end/d' "$tmp/architecture.md") > /dev/null ||
  { out=""; fail "update changed text outside the block"; }
echo "PASS: update makes the map current and leaves the rest of the file alone"

# A module without a description row is named.
sed -i '/^| `src\/grammar` | structured output/d' "$tmp/architecture.md"
if out=$(run); then fail "the check passed with src/grammar's description row removed:"; fi
grep -qF 'src/grammar has no row in the table after the map' <<< "$out" || fail "the missing row is not named:"
echo "PASS: a module without a description row is named"
