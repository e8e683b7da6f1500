#!/usr/bin/env bash
# The include check must fail on a forbidden include and name it. Plants one (the engine
# including the model, which it must never see) in a copy of src/, and one that is allowed (the
# executor including the model), and checks both verdicts.
#   include_check_test.sh <source dir> <cmake>
set -euo pipefail
root=$1
cmake_bin=${2:-cmake}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$root/src" "$tmp/src"
check() { "$cmake_bin" -DSRC_DIR="$tmp/src" -DMODULES_FILE="$root/cmake/modules.cmake" \
            -P "$root/cmake/check_includes.cmake" 2>&1; }

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
