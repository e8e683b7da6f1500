#!/usr/bin/env bash
# The standard benchmark suite (`make bench`). Slow: never part of `make test`.
#
#   scripts/bench.sh BUILD_DIR
#
# Synthesises the benchmark models it needs (deterministic, cached in $BENCH_MODELS), runs the
# Google Benchmark microbenchmarks and `arbor bench` on them, prints everything, and appends a
# section with the commit, the machine and the raw results to docs/benchmarks.md.
# Knobs: BENCH_MODELS (default BUILD_DIR/bench-models), BENCH_THREADS (default: all cores),
#        BENCH_QUICK=1 (fewer shapes and repetitions), BENCH_NO_DOC=1 (don't touch the doc).
set -euo pipefail
build=${1:?usage: scripts/bench.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${ARBOR_SHARED_DIR:-$root/../shared}
models=${BENCH_MODELS:-$build/bench-models}
threads=${BENCH_THREADS:-$(nproc)}
arbor="$build/arbor"
vocab="$shared/tokenizers/hf/llama2/tokenizer.json"
reps=5
[ "${BENCH_QUICK:-0}" = 1 ] && reps=3
mkdir -p "$models"
log=$(mktemp)
trap 'rm -f "$log"' EXIT

say() { echo "$@" | tee -a "$log"; }
run() {  # run CMD... : echo the command, tee its stdout into the log
  say ""
  say "\$ $*"
  "$@" | tee -a "$log"
}

synth() {  # synth SHAPE TYPE [extra flags]
  local shape=$1 type=$2; shift 2
  local out="$models/$shape-$type.gguf"
  if [ ! -f "$out" ]; then
    "$arbor" synth --shape "$shape" --type "$type" --vocab "$vocab" -o "$out" "$@" >&2
  fi
  echo "$out"
}

[ -f "$vocab" ] || { echo "error: tokenizer for synthetic models not found: $vocab" >&2; exit 2; }

say "## make bench — $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD)"
say ""
say "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB;"
say "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg); threads: $threads"
say ""
say '```'

gbench="--benchmark_repetitions=$reps --benchmark_report_aggregates_only=true"
for b in kv/kv_bench tokenizer/tokenizer_bench kernels/kernels_bench; do
  if [ -x "$build/bench/$b" ]; then
    # shellcheck disable=SC2086
    run "$build/bench/$b" $gbench
  fi
done

s15=$(synth stories15m q4_0 --context 1024)
run "$arbor" bench -m "$s15" -t "$threads" -r "$reps"

if [ "${BENCH_QUICK:-0}" != 1 ]; then
  for type in q4_0 q8_0 f16; do
    m=$(synth tinyllama-1.1b "$type")
    run "$arbor" bench -m "$m" -t "$threads" -r "$reps" -p 512 -n 128 --batch 1,2,4,8,16
  done
  s110=$(synth stories110m q4_0)
  run "$arbor" bench -m "$s110" -t "$threads" -r "$reps" -p 512 -n 128 --batch 1,8
  if "$arbor" bench throughput --help >/dev/null 2>&1; then
    run "$arbor" bench throughput -m "$s110" -t "$threads"
  fi
fi
say '```'

if [ "${BENCH_NO_DOC:-0}" != 1 ]; then
  { echo; cat "$log"; } >> "$root/docs/benchmarks.md"
  echo "appended to docs/benchmarks.md" >&2
fi
