#!/usr/bin/env bash
# The whole GPU check of the CUDA executor in one command (docs/cuda.md, "Running on a GPU").
#
#   scripts/gpu_check.sh pack [BUILD_DIR]   here, on the development machine (no GPU needed)
#   scripts/gpu_check.sh run                on the GPU machine; results under $OUT
#
# pack: collects what the GPU machine needs into gpu-run/ (ignored by git; at most ~25 MiB, so
#   it travels with the working tree through the device tool's `carry`): the arbor binary and the
#   CUDA test binaries of BUILD_DIR (default build/, which must be configured with
#   -DARBOR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a), their ctest files, the few shared files the
#   GPU tests read (stories260K, TinyStories-656K, goldens, the llama SPM tokenizer), and
#   llama.cpp's llama-bench built with CUDA when LLAMA_BENCH=path/to/llama-bench is given.
#   Everything goes into one xz tarball.
#
# run: unpacks the bundle where the ctest files expect it (the build directory's absolute path of
#   the development machine, so `ctest -L gpu` runs as there), then, each phase under its own
#   time limit so that the whole fits one 10-minute command with time to spare:
#     1. the card (nvidia-smi), 2. `ctest -L gpu -j 8` (a skipped GPU test counts as a failure
#     here: on a GPU nothing may skip), 3. compute-sanitizer memcheck over each failed test,
#     4. `arbor synth` of the benchmark shapes (TinyLlama-1.1B and an 8B llama-3 shape, Q4_0),
#     5. `arbor bench --device cuda` on each, 6. llama-bench on the same files when bundled.
#     7. (phase "profile", not by default) per-kernel device time of a few decode steps (ncu).
#   Writes $OUT/summary-TAG.txt (printed last) and $OUT/logs-TAG.tar.gz (every log and JSON), TAG
#   = GPU_CHECK_TAG (default "run").
#   Knobs: GPU_CHECK_BUDGET (seconds the whole may take, default 480), GPU_CHECK_PHASES (default "tests sanitize bench llama"), GPU_CHECK_TESTS (a ctest -R
#   regex to run a subset), GPU_BENCH_SHAPES (default "tinyllama 8b").
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mode=${1:?usage: scripts/gpu_check.sh pack [BUILD_DIR] | run}

gpu_tests=(cuda_unit_test device_choice_test cuda_ops_test cuda_matmul_gpu_test
           cuda_model_gpu_test model_golden_gpu_test spec_golden_gpu_test)
shared_files=(models/stories260K models/tinystories-656K goldens
              tokenizers/llamacpp-vocab/ggml-vocab-llama-spm.gguf)

pack() {
  local build; build="$(cd "${1:-$root/build}" && pwd)" || exit 2
  local shared="${ARBOR_SHARED_DIR:-$root/../shared}"
  grep -q '^ARBOR_CUDA:BOOL=ON' "$build/CMakeCache.txt" ||
    { echo "error: $build is not configured with -DARBOR_CUDA=ON" >&2; exit 2; }
  cmake --build "$build" --target arbor "${gpu_tests[@]}" || exit 1
  local stage; stage="$(mktemp -d)"
  mkdir -p "$stage/build/tests/cuda" "$stage/shared" "$stage/bin"
  echo "$build" >"$stage/build_dir"
  git -C "$root" rev-parse --short HEAD >"$stage/commit"
  git -C "$root" status --porcelain --untracked-files=no | grep -q . && echo "+local changes" >>"$stage/commit"
  cp "$build/arbor" "$stage/bin/"
  for t in "${gpu_tests[@]}"; do
    cp "$build/tests/cuda/$t" "$build/tests/cuda/$t[1]_include.cmake" \
       "$build/tests/cuda/$t[1]_tests.cmake" "$stage/build/tests/cuda/"
  done
  cp "$build/tests/cuda/CTestTestfile.cmake" "$stage/build/tests/cuda/"
  strip "$stage/bin/arbor" "$stage/build/tests/cuda/"*_test
  for f in "${shared_files[@]}"; do
    mkdir -p "$stage/shared/$(dirname "$f")"
    cp -r "$shared/$f" "$stage/shared/$f" || exit 1
  done
  if [ -n "${LLAMA_BENCH:-}" ]; then
    cp "$LLAMA_BENCH" "$stage/bin/llama-bench" && strip "$stage/bin/llama-bench"
  fi
  mkdir -p "$root/gpu-run"
  tar -C "$stage" -cJf "$root/gpu-run/bundle.tar.xz" . || exit 1
  rm -rf "$stage"
  echo "gpu_check: packed $(du -h "$root/gpu-run/bundle.tar.xz" | cut -f1) into gpu-run/bundle.tar.xz"
}

# --- run, on the GPU machine ------------------------------------------------------------------
out=${OUT:-/tmp/gpu-check-out}
work=/tmp/gpu-check
logs=$work/logs
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
say() { echo "[gpu_check +$(elapsed)s] $*" | tee -a "$logs/summary.txt"; }
# Seconds left of the command's budget (GPU_CHECK_BUDGET, default 480), and a phase's limit: the
# smaller of its own and what is left less a margin for packing the logs.
left() { echo $(( ${GPU_CHECK_BUDGET:-480} - $(elapsed) )); }
limit() { local l; l=$(( $(left) - 15 )); (( l < $1 )) && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
phase_on() { [[ " ${GPU_CHECK_PHASES:-tests sanitize bench llama} " == *" $1 "* ]]; }

finish() {
  local tag=${GPU_CHECK_TAG:-run}  # distinct tags keep the files of several runs in one command
  cp "$logs/summary.txt" "$out/summary-$tag.txt" 2>/dev/null
  tar -C "$logs" -czf "$out/logs-$tag.tar.gz" . 2>/dev/null
  echo "===== summary ====="; cat "$out/summary-$tag.txt"
}

unpack() {
  rm -rf "$work"; mkdir -p "$work/bundle" "$logs" "$out"
  tar -C "$work/bundle" -xJf "$root/gpu-run/bundle.tar.xz" || { echo "no bundle" >&2; exit 2; }
  build_dir=${GPU_CHECK_BUILD_DIR:-$(cat "$work/bundle/build_dir")}  # override: a dry run here
  mkdir -p "$build_dir/tests"
  rm -rf "$build_dir/tests/cuda"
  cp -r "$work/bundle/build/tests/cuda" "$build_dir/tests/cuda"
  export ARBOR_SHARED_DIR=$work/bundle/shared
  arbor=$work/bundle/bin/arbor
}

card() {
  say "commit $(tr '\n' ' ' <"$work/bundle/commit")"
  nvidia-smi >"$logs/nvidia-smi.txt" 2>&1
  say "card: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1)"
  say "nvcc: $(nvcc --version 2>/dev/null | tail -2 | head -1)"
}

run_tests() {
  local regex=${GPU_CHECK_TESTS:-.}
  ( cd "$build_dir/tests/cuda" &&
    timeout "$(limit "${GPU_TEST_LIMIT:-240}")" ctest -L gpu -R "$regex" -j 8 --timeout 200 \
      --output-on-failure --output-junit "$logs/ctest.xml" >"$logs/ctest.log" 2>&1 )
  local rc=$?
  say "ctest -L gpu (rc $rc): $(grep -E 'tests passed|tests failed' "$logs/ctest.log" | tail -1)"
  grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess|Not Run|Skipped|Exception)' \
    "$logs/ctest.log" | sed 's/^/  /' | tee -a "$logs/summary.txt"
  say "skipped (on a GPU, a failure): $(grep -c '(Skipped)' "$logs/ctest.log")"
  grep -E 'Test +#[0-9]+: .* sec' "$logs/ctest.log" | sort -t' ' -k1 >"$logs/ctest_times.txt"
}

sanitize() {
  command -v compute-sanitizer >/dev/null || { say "no compute-sanitizer"; return; }
  local failed; failed=$(grep -oE '[0-9]+ - [^ ]+ \((Failed|SEGFAULT|Subprocess aborted|Exception|Timeout)' \
    "$logs/ctest.log" | awk '{print $3}' | head -"${GPU_SANITIZE_MAX:-3}")
  [ -z "$failed" ] && return
  for name in $failed; do
    (( $(left) > 120 )) || { say "memcheck: no time left"; break; }
    local bin; bin=$(grep -l "\[=\[$name\]=\]" "$build_dir"/tests/cuda/*_tests.cmake | head -1)
    bin=${bin%\[1\]_tests.cmake}
    local filter=${name#gpu.}
    ( cd "$build_dir/tests/cuda" &&
      timeout "$(limit 45)" compute-sanitizer --tool memcheck --print-limit 20 "$bin" --gtest_filter="$filter" \
        >"$logs/sanitize_$filter.log" 2>&1 )
    say "memcheck $filter: $(grep -E 'ERROR SUMMARY' "$logs/sanitize_$filter.log" | tail -1)"
    grep -m3 -E 'Invalid|out of bounds|Address' "$logs/sanitize_$filter.log" | sed 's/^/  /' |
      tee -a "$logs/summary.txt"
  done
}

synth_shape() {  # synth_shape NAME -> path of the model
  local name=$1 path=$work/$1-q4_0.gguf
  local vocab=$ARBOR_SHARED_DIR/tokenizers/llamacpp-vocab/ggml-vocab-llama-spm.gguf
  case $name in
    tinyllama) "$arbor" synth --shape tinyllama-1.1b --type q4_0 --vocab "$vocab" -o "$path" ;;
    8b) "$arbor" synth --shape custom --dim 4096 --ffn 14336 --layers 32 --heads 32 --kv-heads 8 \
          --vocab-size 128256 --context 8192 --type q4_0 --vocab "$vocab" -o "$path" ;;
  esac >>"$logs/synth.log" 2>&1 || { say "synth $name failed"; return 1; }
  echo "$path"
}

bench() {
  for shape in ${GPU_BENCH_SHAPES:-tinyllama 8b}; do
    (( $(left) > 60 )) || { say "bench $shape: no time left"; break; }
    local model; model=$(synth_shape "$shape") || continue
    timeout "$(limit 150)" "$arbor" bench --device cuda -m "$model" --reps 3 -p 512 -n 128 \
      --batch 1 8 32 64 --verify 1 2 4 8 16 --bandwidth-mib 1024 --json \
      >"$logs/bench_$shape.json" 2>"$logs/bench_$shape.err"
    say "arbor bench $shape (rc $?): $(python3 - "$logs/bench_$shape.json" <<'EOF' 2>&1 | head -20
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no JSON:", e); sys.exit()
print("  device", d.get("device"), "| bandwidth", round(d.get("bandwidth_gbs", 0), 1), "GB/s")
for t in d.get("tests", []):
    print("  %-12s %10.1f tok/s  (bw %.2f)" % (t["name"], t["median"], t.get("bandwidth_fraction", 0)))
EOF
)"
    tail -3 "$logs/bench_$shape.err" | sed 's/^/  /' | tee -a "$logs/summary.txt"
    if phase_on llama && [ -x "$work/bundle/bin/llama-bench" ]; then
      # llama.cpp links the CUDA runtime and cuBLAS dynamically: the machine's own CUDA 13.
      local found libs="" lib
      found=$(find /usr/local /usr/lib /opt -name 'libcu*.so.13*' 2>/dev/null)
      for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
        libs+=$(dirname "$(grep -m1 "/$lib" <<<"$found")"):
      done
      say "llama-bench libraries: $libs"
      LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:-}" timeout "$(limit 120)" "$work/bundle/bin/llama-bench" \
        -m "$model" -ngl 99 -p 512 -n 128 -r 3 -o md >"$logs/llama_$shape.md" 2>"$logs/llama_$shape.err"
      say "llama-bench $shape (rc $?):"; grep -E '^\|' "$logs/llama_$shape.md" | tee -a "$logs/summary.txt"
      tail -2 "$logs/llama_$shape.err" | sed 's/^/  /' | tee -a "$logs/summary.txt"
    fi
    rm -f "$model"
  done
}

# Per-kernel device time of a few greedy decode steps under Nsight Compute (one metric, so one
# replay per kernel): where a decode step's time goes, kernel by kernel (not part of the default).
profile() {
  command -v ncu >/dev/null || { say "no ncu"; return; }
  for shape in ${GPU_BENCH_SHAPES:-tinyllama 8b}; do
    (( $(left) > 90 )) || { say "profile $shape: no time left"; break; }
    local model; model=$(synth_shape "$shape") || continue
    timeout "$(limit 120)" ncu --clock-control none --metrics gpu__time_duration.sum \
      --print-summary per-kernel --csv "$arbor" generate --device cuda -m "$model" \
      -p "Once upon a time" -n 4 --temp 0 --ignore-eos >"$logs/profile_$shape.csv" \
      2>"$logs/profile_$shape.err"
    say "profile $shape (rc $?): kernels by total time (name, invocations, mean ns, total ms)"
    python3 - "$logs/profile_$shape.csv" <<'EOF2' 2>&1 | head -25 | tee -a "$logs/summary.txt"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 8]
if not rows: print("  no rows"); sys.exit()
h = rows[0]
def col(name):
    return next(i for i, c in enumerate(h) if c.strip().lower() == name)
try:
    k, n, mean = col("kernel name"), col("invocations"), col("average")
except StopIteration:
    print("  header:", h); sys.exit()
unit = next((i for i, c in enumerate(h) if c.strip().lower() == "metric unit"), None)
scale = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9}
agg = {}
for r in rows[1:]:
    try:
        name, cnt = r[k].split("(")[0][:60], int(r[n].replace(",", ""))
        avg = float(r[mean].replace(",", "")) * scale.get(r[unit].strip() if unit is not None else "ns", 1)
    except ValueError:
        continue
    a = agg.setdefault(name, [0, 0.0]); a[0] += cnt; a[1] += cnt * avg
for name, (cnt, tot) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print("  %-60s %6d %10.0f %9.3f" % (name, cnt, tot / cnt, tot / 1e6))
EOF2
    # The decode matmul in detail: throughput, memory, occupancy and stall sections for a few
    # launches of the Q4_0 kernel after warm-up.
    if (( $(left) > 60 )); then
      timeout "$(limit 90)" ncu --clock-control none -k regex:mma_quant_kernel --launch-skip 200 \
        --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section WarpStateStats --section LaunchStats "$arbor" generate \
        --device cuda -m "$model" -p "Once upon a time" -n 8 --temp 0 --ignore-eos \
        >"$logs/profile_${shape}_matmul.txt" 2>&1
      say "matmul detail $shape (rc $?):"
      grep -E 'mma_quant_kernel|Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Registers Per|Grid Size|Block Size|Stall' \
        "$logs/profile_${shape}_matmul.txt" | head -40 | sed 's/^/  /' | tee -a "$logs/summary.txt"
    fi
    rm -f "$model"
  done
}

case $mode in
  pack) pack "${2:-}" ;;
  run)
    unpack; trap finish EXIT
    card
    phase_on tests && run_tests
    phase_on sanitize && sanitize
    phase_on bench && bench
    phase_on profile && profile
    say "done" ;;
  *) echo "usage: scripts/gpu_check.sh pack [BUILD_DIR] | run" >&2; exit 2 ;;
esac
