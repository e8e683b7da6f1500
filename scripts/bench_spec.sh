#!/usr/bin/env bash
# Speculative decoding on a CPU with a real draft for a realistic-cost target (issue 14).
#
#   scripts/bench_spec.sh BUILD_DIR            (also run by scripts/bench.sh)
#
# The target is stories260K inflated to TinyLlama-1.1B's shape (`arbor synth --inflate --shape
# tinyllama-1.1b`, docs/inflate.md): the next-token function of stories260K at the cost of a 1B
# model. Drafts: stories260K itself (a near-perfect draft; the target's Q8_0 weights make it
# disagree now and then) and its first 4 layers (a weak one). Prints, as Markdown:
#   1. `arbor bench --verify` curves r(n), n = 1..17, of the inflated target in Q8_0 and F16;
#   2. greedy single-stream decode through `arbor serve` (8 story prompts one after another,
#      256 tokens each): plain, draft at k = 4 and 8, the weak draft at k = 4; every output
#      compared with plain greedy, token for token (its text);
#   3. aggregate output tokens/s at 4 and 16 concurrent streams, speculation off and on.
# Every configuration runs in each of BENCH_SPEC_ROUNDS rounds (default 3) right after a plain
# run; the tables give the median of the per-round ratios, since the machine's speed drifts.
# Knobs: BENCH_MODELS, BENCH_THREADS, BENCH_SPEC_ROUNDS, BENCH_QUICK=1 (one round, fewer
# requests), ARBOR_SHARED_DIR.
set -euo pipefail
build=${1:?usage: scripts/bench_spec.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${ARBOR_SHARED_DIR:-$root/../shared}
models=${BENCH_MODELS:-$build/bench-models}
threads=${BENCH_THREADS:-$(nproc)}
rounds=${BENCH_SPEC_ROUNDS:-3}
arbor="$build/arbor"
out="$build/bench-results/spec"
single_n=8 conc_n=2
if [ "${BENCH_QUICK:-0}" = 1 ]; then rounds=1; single_n=4; conc_n=1; fi
mkdir -p "$models" "$out"
# shellcheck source=scripts/serve_lib.sh
source "$root/scripts/serve_lib.sh"

small="$shared/models/stories260K/stories260K.gguf"
[ -f "$small" ] || { echo "error: $small not found (ARBOR_SHARED_DIR?)" >&2; exit 2; }
target_q8="$models/inflated-1b-q8_0.gguf"
target_f16="$models/inflated-1b-f16.gguf"
weak="$models/stories260K-first4layers.gguf"
[ -f "$target_q8" ] || "$arbor" --log-level warn synth --inflate "$small" --shape tinyllama-1.1b \
  --type q8_0 -o "$target_q8"
[ -f "$target_f16" ] || "$arbor" --log-level warn synth --inflate "$small" \
  --shape tinyllama-1.1b --type f16 -o "$target_f16"
[ -f "$weak" ] || "$arbor" --log-level warn convert llama2c \
  "$shared/models/stories260K/stories260K-first4layers.bin" \
  "$shared/models/stories260K/tok512.bin" -o "$weak"

# Story openings (the models were trained on TinyStories; random ids would make the weak draft
# look worse than it is). 16 distinct prompts, cycled by the load generator.
prompts="$out/prompts.jsonl"
python3 - "$prompts" "$root/scripts/story_prompts.txt" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for s in open(sys.argv[2]).read().splitlines():
        f.write(json.dumps({"prompt": s, "max_tokens": 256}) + "\n")
EOF

echo "### Speculation on a CPU: stories260K inflated to TinyLlama-1.1B's shape (issue 14)"
echo
echo "Target: \`arbor synth --inflate stories260K.gguf --shape tinyllama-1.1b --type q8_0|f16\`"
echo "(dim 2048, ffn 5632, 22 layers, 256 heads x 8, 32 kv heads; vocab 512). Drafts: stories260K"
echo "(F32) and its first 4 layers. $threads threads; $rounds rounds, each configuration right after"
echo "a plain run; ratios are medians of the per-round ratios."
echo
for m in "$target_q8" "$target_f16"; do
  echo '```'
  echo "\$ arbor bench -m $(basename "$m") -t $threads -r 5 -p 64 -n 16 --batch 1 (verify 1..16)"
  "$arbor" --log-level warn bench -m "$m" -t "$threads" -r 5 -p 64 -n 16 --batch 1 \
    | sed -n '/^verification/,$p'
  echo '```'
  echo
done

# serve_run NAME CONCURRENCY NUM_REQUESTS [serve flags...]: starts arbor serve on the Q8_0
# target, runs the load, writes $out/NAME.json (+ the greedy texts of the 16 prompts, 128 tokens
# each, to $out/NAME.txt when CONCURRENCY is 1) and prints the output tokens/s.
serve_run() {
  local name=$1 conc=$2 n=$3; shift 3
  start_arbor_serve "$out" "$name" "$arbor" -m "$target_q8" -t "$threads" "$@"
  local url=$server_url
  "$arbor" --log-level warn bench serve --url "$url" --prompts-file "$prompts" -n "$n" \
    --max-concurrency "$conc" --result-json "$out/$name.json" >/dev/null
  if [ "$conc" = 1 ]; then
    python3 - "$url" "$prompts" >"$out/$name.txt" <<'EOF'
import json, sys, urllib.request
url, path = sys.argv[1], sys.argv[2]
for line in open(path):
    body = json.dumps({"prompt": json.loads(line)["prompt"], "max_tokens": 128, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    print(json.dumps(json.load(urllib.request.urlopen(req))["choices"][0]["text"]))
EOF
  fi
  curl -s "$url/metrics" | grep -E '^arbor_spec_(draft_tokens|accepted_tokens|verify_steps)_total' \
    >"$out/$name.metrics" || true
  stop_arbor_serve
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['runs'][0]['output_throughput'])" \
    "$out/$name.json"
}

draft=(--spec draft --draft-model "$small")
weakd=(--spec draft --draft-model "$weak")
declare -A tps
configs_single=(k4 k8 weak4)
configs_conc=(c4_draft c4_weak c16_draft c16_weak)
for r in $(seq 1 "$rounds"); do
  tps[plain1_$r]=$(serve_run "plain1_$r" 1 "$single_n")
  tps[k4_$r]=$(serve_run "k4_$r" 1 "$single_n" "${draft[@]}" --spec-k 4)
  tps[k8_$r]=$(serve_run "k8_$r" 1 "$single_n" "${draft[@]}" --spec-k 8)
  tps[weak4_$r]=$(serve_run "weak4_$r" 1 "$single_n" "${weakd[@]}" --spec-k 4)
  for c in 4 16; do
    tps[plain${c}_$r]=$(serve_run "plain${c}_$r" "$c" $((c * conc_n)))
    tps[c${c}_draft_$r]=$(serve_run "c${c}_draft_$r" "$c" $((c * conc_n)) "${draft[@]}" --spec-k 4)
    tps[c${c}_weak_$r]=$(serve_run "c${c}_weak_$r" "$c" $((c * conc_n)) "${weakd[@]}" --spec-k 4)
  done
  for cfg in "${configs_single[@]}"; do
    cmp -s "$out/plain1_$r.txt" "$out/${cfg}_$r.txt" || { echo "MISMATCH: $cfg round $r differs from plain greedy" >&2; tps[mismatch]=1; }
  done
done

# row LABEL CONFIG BASE: output tok/s of CONFIG and BASE per round, and the median ratio.
row() {
  local label=$1 cfg=$2 base=$3
  local acc
  acc=$(awk '/draft_tokens_total/{d+=$NF} /accepted_tokens_total/{a+=$NF} /verify_steps_total/{v+=$NF}
             END{if (d > 0) printf "%d/%d accepted in %d verifications", a, d, v; else print "none"}' \
        "$out/${cfg}"_*.metrics)
  echo "| $label | $(ratio_cells "$cfg" "$base" "$rounds") | $acc |"
}
echo "Greedy decode through \`arbor serve -m inflated-1b-q8_0.gguf -t $threads [--spec draft --draft-model D --spec-k K]\`,"
echo "driven by \`arbor bench serve --prompts-file prompts.jsonl -n N --max-concurrency C\` (256 tokens per"
echo "request; the single-stream outputs of 16 prompts x 128 tokens compared with plain greedy:"
echo "$([ -z "${tps[mismatch]:-}" ] && echo 'all identical' || echo '**MISMATCH**'))."
echo
echo "| configuration | output tok/s: spec / plain, per round | ratio (median) | drafts |"
echo "|---|---|---|---|"
row "1 stream, draft stories260K, k = 4" k4 plain1
row "1 stream, draft stories260K, k = 8" k8 plain1
row "1 stream, draft first 4 layers, k = 4" weak4 plain1
row "4 streams, draft stories260K, k = 4" c4_draft plain4
row "4 streams, draft first 4 layers, k = 4" c4_weak plain4
row "16 streams, draft stories260K, k = 4" c16_draft plain16
row "16 streams, draft first 4 layers, k = 4" c16_weak plain16
echo
grep -h "speculation:" "$out"/k4_1.log | sed 's/^.*\] /Server log (k = 4): /' | head -1
[ -z "${tps[mismatch]:-}" ]
