#!/usr/bin/env bash
# The include check must fail on each kind of violation of cmake/modules.cmake and name it. In a
# copy of src/ (and of modules.cmake) it plants an allowed include (the executor including the
# model), forbidden ones (the engine including the model, which it must never see; a CUDA source
# including the executor; the scheduler including grammar/, reachable only through sampling), a
# declaration no source uses, and one of a later module, and checks every verdict.
#   include_check_test.sh <source dir> <cmake>
set -euo pipefail
root=$1
cmake_bin=${2:-cmake}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$root/src" "$tmp/src"
cp "$root/cmake/modules.cmake" "$tmp/modules.cmake"
check() { "$cmake_bin" -DSRC_DIR="$tmp/src" -DMODULES_FILE="$tmp/modules.cmake" \
            -P "$root/cmake/check_includes.cmake" 2>&1; }
# expect_violation LABEL EXPECTED: the check fails and prints EXPECTED.
expect_violation() {
  local out
  if out=$(check); then
    echo "FAIL: the check passed with $1"; exit 1
  fi
  if ! grep -qF "$2" <<< "$out"; then
    echo "FAIL: $1 is not reported as expected. Wanted: $2"; echo "Got:"; echo "$out"; exit 1
  fi
  echo "PASS: $2"
}

out=$(check) || { echo "FAIL: the unmodified copy does not pass:"; echo "$out"; exit 1; }

# Allowed: the executor may use the model.
printf '#include "model/llama_model.h"\n' >> "$tmp/src/executor/local_executor.cc"
out=$(check) || { echo "FAIL: an allowed include was rejected:"; echo "$out"; exit 1; }

# Forbidden: the engine must not see the model (nor kernels through it).
printf '\n#include "model/llama_model.h"\n' >> "$tmp/src/engine/engine_core.cc"
if out=$(check); then
  echo "FAIL: the check passed with engine/engine_core.cc including model/llama_model.h"
  exit 1
fi
lines=$(wc -l < "$tmp/src/engine/engine_core.cc")
expected="src/engine/engine_core.cc:$lines: module 'engine' must not include #include \"model/llama_model.h\""
if ! grep -qF "$expected" <<< "$out"; then
  echo "FAIL: the violation is not reported as expected. Wanted: $expected"
  echo "Got:"; echo "$out"
  exit 1
fi
echo "PASS: $expected"

# CUDA sources are checked too: src/cuda must not see the executor.
printf '\n#include "executor/cpu_executor.h"\n' >> "$tmp/src/cuda/matmul.cu"
out=$(check) || true
lines=$(wc -l < "$tmp/src/cuda/matmul.cu")
expected="src/cuda/matmul.cu:$lines: module 'cuda' must not include #include \"executor/cpu_executor.h\""
if ! grep -qF "$expected" <<< "$out"; then
  echo "FAIL: a forbidden include in a .cu file is not reported. Wanted: $expected"
  echo "Got:"; echo "$out"
  exit 1
fi
echo "PASS: $expected"

# Declared directly, not through another module: the scheduler reaches grammar only through
# sampling, so it may not include a grammar header.
cp -r "$root/src/." "$tmp/src/"
out=$(check) || { echo "FAIL: the restored copy does not pass:"; echo "$out"; exit 1; }
printf '\n#include "grammar/grammar_spec.h"\n' >> "$tmp/src/sched/scheduler.cc"
lines=$(wc -l < "$tmp/src/sched/scheduler.cc")
expect_violation "sched/scheduler.cc including grammar/grammar_spec.h" \
  "src/sched/scheduler.cc:$lines: module 'sched' must not include #include \"grammar/grammar_spec.h\""
cp "$root/src/sched/scheduler.cc" "$tmp/src/sched/scheduler.cc"

# A declaration that no source uses: spec declaring kv.
sed -i 's/^set(ARBOR_DEPS_spec base sampling)$/set(ARBOR_DEPS_spec base sampling kv)/' "$tmp/modules.cmake"
grep -q '^set(ARBOR_DEPS_spec base sampling kv)$' "$tmp/modules.cmake" || { echo "FAIL: could not edit"; exit 1; }
expect_violation "spec declaring kv, which it does not use" \
  "cmake/modules.cmake: module 'spec' declares 'kv' but no source of src/spec includes a kv/ header"

# A module may name only modules before it (no cycles): base declaring http.
cp "$root/cmake/modules.cmake" "$tmp/modules.cmake"
sed -i 's/^set(ARBOR_DEPS_base "")$/set(ARBOR_DEPS_base http)/' "$tmp/modules.cmake"
grep -q '^set(ARBOR_DEPS_base http)$' "$tmp/modules.cmake" || { echo "FAIL: could not edit"; exit 1; }
expect_violation "base declaring http" \
  "cmake/modules.cmake: module 'base' declares 'http', which is not a module listed before it"
