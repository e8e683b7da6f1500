#!/usr/bin/env bash
# The standard benchmark suite (`make bench`). Slow: never part of `make test`.
#
#   scripts/bench.sh BUILD_DIR
#
# Synthesises the benchmark models it needs (deterministic, cached in $BENCH_MODELS), runs the
# Google Benchmark microbenchmarks and `arbor bench` on them, prints everything, and appends a
# section with the commit, the machine and the raw results to docs/benchmarks-history.md (the
# dated journal; docs/benchmarks.md quotes the latest figures of each area from it).
# The serving section starts `arbor serve` on the stories15M-shape model on a free loopback
# port and drives it with `arbor bench serve` at several request rates, then measures the load
# generator's own overhead against `arbor bench null-server`; its Markdown tables go into the
# appended section, the JSON and plots into BUILD_DIR/bench-results/.
# Knobs: BENCH_MODELS (default BUILD_DIR/bench-models), BENCH_THREADS (default: all cores),
#        BENCH_QUICK=1 (fewer shapes, repetitions and rates), BENCH_NO_DOC=1 (don't touch the
#        doc), BENCH_NO_SERVE=1 (skip the serving section), BENCH_SERVE_ONLY=1 (only the
#        serving section), BENCH_NO_SPEC=1 (skip the speculation sections, scripts/bench_spec.sh and
#        scripts/bench_tree.sh), BENCH_NO_ARCH=1 (skip the architectures against llama.cpp,
#        scripts/bench_arch.sh), BENCH_NO_ROUTER=1 (skip `arbor bench router`).
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
results="$build/bench-results"
mkdir -p "$results"
server_pids=()
port=0
cleanup() {
  for pid in "${server_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  rm -f "$log"
}
trap cleanup EXIT

say() { echo "$@" | tee -a "$log"; }
run() {  # run CMD... : echo the command, tee its stdout into the log
  say ""
  say "\$ $*"
  "$@" | tee -a "$log"
}

quantized() {  # quantized SRC.gguf RECIPE: `arbor quantize` SRC to RECIPE (q4_K_M, bf16, ...), cached
  local src=$1 recipe=$2
  local out="${src%-*.gguf}-$recipe.gguf"
  if [ ! -f "$out" ]; then
    "$arbor" --log-level warn quantize "$src" "$out" "$recipe" >&2
  fi
  echo "$out"
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
cpu_field() { lscpu | sed -n "s/^$1: *//p" | head -1; }
# Family and model tell hosts with the same brand string apart (Zen 4 is family 25, Zen 5 26).
say "Machine: $(cpu_field 'Model name') (family $(cpu_field 'CPU family'), model $(cpu_field 'Model')), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB;"
say "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg); threads: $threads"
say ""
serve_only=${BENCH_SERVE_ONLY:-0}
[ "$serve_only" != 1 ] && say '```'

# The microbenchmarks are outside the default build: `make bench` builds them (target arbor_bench).
for b in kv/kv_bench tokenizer/tokenizer_bench kernels/kernels_bench grammar/grammar_bench \
         engine/engine_bench; do
  [ -x "$build/bench/$b" ] || [ "$serve_only" = 1 ] ||
    say "warning: $build/bench/$b not built (cmake --build $build --target arbor_bench); skipped"
done
gbench="--benchmark_repetitions=$reps --benchmark_report_aggregates_only=true"
for b in kv/kv_bench tokenizer/tokenizer_bench kernels/kernels_bench engine/engine_bench; do
  if [ -x "$build/bench/$b" ] && [ "$serve_only" != 1 ]; then
    # shellcheck disable=SC2086
    run "$build/bench/$b" $gbench
  fi
done

# Structured-output mask cost per token (32k and 128k vocabularies).
if [ -x "$build/bench/grammar/grammar_bench" ] && [ "$serve_only" != 1 ]; then
  run "$build/bench/grammar/grammar_bench"
fi

s15=$(synth stories15m q4_0 --context 1024)
[ "$serve_only" != 1 ] && run "$arbor" bench -m "$s15" -t "$threads" -r "$reps"

if [ "${BENCH_QUICK:-0}" != 1 ] && [ "$serve_only" != 1 ]; then
  for type in q4_0 q8_0 f16; do
    m=$(synth tinyllama-1.1b "$type")
    run "$arbor" bench -m "$m" -t "$threads" -r "$reps" -p 512 -n 128 --batch 1,2,4,8,16
  done
  # The files people download (issue 16): llama-quantize's K mixtures and BF16, made from the
  # F16 model by `arbor quantize`, at the test sizes of the issue's llama.cpp figures.
  f16=$(synth tinyllama-1.1b f16)
  for spec in q4_K_M:512:128 q3_K_M:512:128 q5_K_M:128:32 q6_K:128:32 bf16:128:32 f16:128:32; do
    IFS=: read -r recipe pp tg <<<"$spec"
    m=$([ "$recipe" = f16 ] && echo "$f16" || quantized "$f16" "$recipe")
    run "$arbor" bench -m "$m" -t "$threads" -r "$reps" -p "$pp" -n "$tg" --batch 1,16 \
      --verify 1,4,8
  done
  # Peak RSS of the Q4_0 1.1B model with a full 2048-token KV cache (issue 4: at most file +
  # KV + 150 MB): a ~540-token prompt, then generation to 2048 positions.
  m=$(synth tinyllama-1.1b q4_0)
  prompt=$(printf 'the cat sat on the mat %.0s' $(seq 1 90))
  say ""
  say "\$ $arbor generate -m $m -p '<the cat sat on the mat x 90>' -n 1500 --temp 0 --ignore-eos"
  "$arbor" --log-level warn generate -m "$m" -p "$prompt" -n 1500 --temp 0 --ignore-eos \
    2>&1 >/dev/null | grep -E '^(prompt|generation|memory):' | tee -a "$log"
  s110=$(synth stories110m q4_0)
  run "$arbor" bench -m "$s110" -t "$threads" -r "$reps" -p 512 -n 128 --batch 1,8,16
  # Offline engine throughput (issue 6): 128 requests, 128 prompt / 128 output tokens.
  run "$arbor" bench throughput -m "$s110" -t "$threads" --sweep-max-num-seqs 1,4,16,32
fi
[ "$serve_only" != 1 ] && say '```'

# Speculation on a CPU with a real draft for a realistic-cost target (issue 14) and token trees
# against chains (issue 15): their own scripts, Markdown out (scripts/bench_spec.sh,
# scripts/bench_tree.sh; BENCH_NO_SPEC=1 skips both).
if [ "${BENCH_NO_SPEC:-0}" != 1 ] && [ "$serve_only" != 1 ]; then
  say ""
  BENCH_MODELS="$models" BENCH_THREADS="$threads" ARBOR_SHARED_DIR="$shared" \
    "$root/scripts/bench_spec.sh" "$build" | tee -a "$log" ||
    say "speculation section failed (see $build/bench-results/spec/*.log)"
  say ""
  BENCH_MODELS="$models" BENCH_THREADS="$threads" ARBOR_SHARED_DIR="$shared" \
    "$root/scripts/bench_tree.sh" "$build" | tee -a "$log" ||
    say "token-tree section failed (see $build/bench-results/tree/*.log)"
fi

# The 2026 architectures against llama.cpp on the same files, 2 threads (issue 33; its own script,
# Markdown out; BENCH_NO_ARCH=1 skips it).
if [ "${BENCH_NO_ARCH:-0}" != 1 ] && [ "$serve_only" != 1 ]; then
  say ""
  BENCH_MODELS="$models" ARBOR_SHARED_DIR="$shared" "$root/scripts/bench_arch.sh" "$build" |
    tee -a "$log" || say "architecture section failed"
fi

# start_server NAME CMD...: runs CMD (an arbor server taking --port 0 --port-file) in the
# background and waits until it answers /health; sets $port.
start_server() {
  local name=$1; shift
  local pf="$results/$name.port"
  rm -f "$pf"
  "$@" --port 0 --port-file "$pf" >"$results/$name.log" 2>&1 &
  server_pids+=($!)
  for _ in $(seq 1 600); do
    if [ -s "$pf" ] && curl -sf "http://127.0.0.1:$(cat "$pf")/health" >/dev/null 2>&1; then
      port=$(cat "$pf")
      return 0
    fi
    kill -0 "${server_pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "error: $name did not start; see $results/$name.log" >&2
  return 1
}

stop_server() {  # stop_server: SIGTERM the last started server and wait for it
  local pid=${server_pids[-1]}
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  unset 'server_pids[-1]'
}

serve_section() {
  local n=48 rates=1,4,16,64,inf
  [ "${BENCH_QUICK:-0}" = 1 ] && { n=16; rates=4,inf; }
  start_server serve "$arbor" --log-level warn serve -m "$s15" --host 127.0.0.1 -t "$threads" ||
    return 1
  say ""
  say "### Serving (arbor bench serve)"
  say ""
  say "\`arbor serve -m stories15m-q4_0.gguf -t $threads\` (default engine flags), driven by"
  say '```'
  say "arbor bench serve --url http://127.0.0.1:PORT -n $n --input-len 128 --output-len 64 \\"
  say "    --request-rate $rates --max-seconds 120 --goodput ttft:1000 tpot:100"
  say '```'
  "$arbor" --log-level warn bench serve --url "http://127.0.0.1:$port" -n "$n" --input-len 128 \
    --output-len 64 --request-rate "$rates" --max-seconds 120 --goodput ttft:1000 tpot:100 \
    --result-json "$results/serve.json" --result-md "$results/serve.md" \
    --plot "$results/serve" >/dev/null
  say ""
  tail -n +3 "$results/serve.md" | tee -a "$log"
  stop_server
  say ""
  say "Plots: \`$results/serve.svg\`, \`.png\`; JSON: \`$results/serve.json\`."

  # The load generator's own overhead: the null server answers at once (or paced at 100
  # tokens/s), so what the generator reports beyond that is its own cost.
  local nn=2000 nrates=500,2000
  [ "${BENCH_QUICK:-0}" = 1 ] && { nn=500; nrates=500; }
  start_server null "$arbor" --log-level warn bench null-server --host 127.0.0.1 || return 1
  say ""
  say "Load generator overhead against \`arbor bench null-server\` (no model; 64-token streams"
  say "written at once):"
  say ""
  "$arbor" --log-level warn bench serve --url "http://127.0.0.1:$port" -n "$nn" --output-len 64 \
    --request-rate "$nrates" --max-seconds 60 --result-json "$results/null.json" \
    --result-md "$results/null.md" >/dev/null
  tail -n +3 "$results/null.md" | tee -a "$log"
  stop_server
  start_server null-paced "$arbor" --log-level warn bench null-server --host 127.0.0.1 \
    --tokens-per-second 100 || return 1
  say ""
  say "Against \`arbor bench null-server --tokens-per-second 100\` (true ITL 10 ms):"
  say ""
  "$arbor" --log-level warn bench serve --url "http://127.0.0.1:$port" -n 200 --output-len 64 \
    --request-rate 50 --max-seconds 60 --result-json "$results/null-paced.json" \
    --result-md "$results/null-paced.md" >/dev/null
  tail -n +3 "$results/null-paced.md" | tee -a "$log"
  stop_server
}

if [ "${BENCH_NO_SERVE:-0}" != 1 ]; then
  serve_section || say "serving section failed (see $results/*.log)"
fi

# The router in front of 4 replicas, one and two routers, per policy, and its overhead (issue 37;
# docs/router.md, "Benchmark"); BENCH_NO_ROUTER=1 skips it.
if [ "${BENCH_NO_ROUTER:-0}" != 1 ] && [ "$serve_only" != 1 ]; then
  s15r=$(synth stories15m f32 --context 2048)
  say ""
  say '```'
  run "$arbor" --log-level error bench router -m "$s15r" --overhead-requests 200 ||
    say "router section failed"
  say '```'
fi

if [ "${BENCH_NO_DOC:-0}" != 1 ]; then
  { echo; cat "$log"; } >> "$root/docs/benchmarks-history.md"
  echo "appended to docs/benchmarks-history.md; update the tables of docs/benchmarks.md it changes" >&2
fi
