#!/usr/bin/env bash
# The 2026 architectures side by side with llama.cpp (issue 33's speed table): Qwen3-0.6B and
# Gemma-3-1B shapes (`arbor synth --arch`), Q8_0 and Q4_K_M (`arbor quantize` from F16), 2
# threads, llama.cpp's prebuilt libllama (tests/reference/.llama/llama_ref bench, the pinned
# npm package, scripts/install_reference.sh) and arbor in the same run, on the same files,
# interleaved round by round so both see the same machine state.
#
#   scripts/bench_arch.sh BUILD_DIR
#
# Prints a Markdown table: prefill (pp512) and decode (tg128) tok/s of both (medians of the
# rounds), arbor / llama.cpp, arbor's verify-4 step (a 5-token multi-query step after 256
# cached tokens) over its decode step, and the memory bandwidth arbor probed during its decode
# test (median GB/s): a shared VM's memory speed moves between runs, and with it every ratio of
# a bandwidth-bound decode step to a compute-bound verification step. Knobs: BENCH_MODELS (default BUILD_DIR/bench-models),
# BENCH_THREADS (2), BENCH_ROUNDS (3), BENCH_PP / BENCH_TG (512 / 128), BENCH_SPECS (ARCH:VOCAB_FILE pairs, vocab files under
# ARBOR_SHARED_DIR; default the two above), BENCH_RECIPES (`arbor quantize` recipes; default
# "q8_0 q4_K_M"). The codebook types' table (issue 36):
#   BENCH_SPECS=qwen3:tokenizers/hf/qwen3/tokenizer.json \
#     BENCH_RECIPES="mxfp4 iq4_nl iq4_xs q4_0" scripts/bench_arch.sh build
set -euo pipefail
build=${1:?usage: scripts/bench_arch.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${ARBOR_SHARED_DIR:-$root/../shared}
models=${BENCH_MODELS:-$build/bench-models}
threads=${BENCH_THREADS:-2}
rounds=${BENCH_ROUNDS:-3}
pp=${BENCH_PP:-512}
tg=${BENCH_TG:-128}
arbor="$build/arbor"
ref="$root/tests/reference/.llama/llama_ref"
[ -x "$ref" ] || "$root/scripts/install_reference.sh" >&2
[ -x "$ref" ] || { echo "error: $ref is missing (scripts/install_reference.sh)" >&2; exit 2; }
mkdir -p "$models"

model() {  # model ARCH VOCAB RECIPE: the synthetic file, cached
  local arch=$1 vocab=$2 recipe=$3
  local f16="$models/$arch-f16.gguf" out="$models/$arch-$recipe.gguf"
  [ -f "$f16" ] || "$arbor" --log-level warn synth --arch "$arch" --type f16 --vocab "$vocab" \
    -o "$f16" >&2
  [ -f "$out" ] || "$arbor" --log-level warn quantize "$f16" "$out" "$recipe" >&2
  echo "$out"
}

median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "### Architectures against llama.cpp — $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
     "$(git -C "$root" rev-parse --short HEAD)"
echo ""
echo "$cpu, $threads threads, $rounds interleaved rounds (medians); llama.cpp: prebuilt libllama" \
     "of @node-llama-cpp/linux-x64 3.22.1 (de3ff81), F16 KV cache, flash attention off."
echo ""
echo "| model | arbor pp$pp | llama.cpp pp$pp | prefill × | arbor tg$tg | llama.cpp tg$tg | decode × | verify-4 / decode step | memory probe GB/s |"
echo "|---|---|---|---|---|---|---|---|---|"
specs=${BENCH_SPECS:-qwen3:tokenizers/hf/qwen3/tokenizer.json gemma3:tokenizers/hf/llama2/tokenizer.json}
for spec in $specs; do
  IFS=: read -r arch vocab <<<"$spec"
  for recipe in ${BENCH_RECIPES:-q8_0 q4_K_M}; do
    m=$(model "$arch" "$shared/$vocab" "$recipe")
    apps=() atgs=() lpps=() ltgs=() ratios=() probes=()
    for ((r = 0; r < rounds; r++)); do
      line=$("$ref" bench "$m" --pp "$pp" --tg "$tg" --threads "$threads" --reps 1 | tail -1)
      lpps+=("$(sed -E "s/pp $pp: ([0-9.]+).*/\1/" <<<"$line")")
      ltgs+=("$(sed -E "s/.*tg $tg: ([0-9.]+).*/\1/" <<<"$line")")
      read -r app atg ver probe < <("$arbor" --log-level warn bench -m "$m" -t "$threads" -r 1 \
        -p "$pp" -n "$tg" --batch 1 --verify 1,4 --json | /usr/bin/python3 -c '
import json, statistics, sys
j = json.load(sys.stdin)
tests = {t["name"][:2]: t for t in j["tests"]}
ver = [v for v in j["verify"] if v["tokens_per_step"] == 5][0]["cost_vs_decode_step"]
probe = statistics.median(tests["tg"].get("probed_bandwidth_gbs") or [0])
print(tests["pp"]["median"], tests["tg"]["median"], ver, probe)')
      apps+=("$app") atgs+=("$atg") ratios+=("$ver") probes+=("$probe")
    done
    app=$(printf '%s\n' "${apps[@]}" | median); atg=$(printf '%s\n' "${atgs[@]}" | median)
    lpp=$(printf '%s\n' "${lpps[@]}" | median); ltg=$(printf '%s\n' "${ltgs[@]}" | median)
    ver=$(printf '%s\n' "${ratios[@]}" | median)
    probe=$(printf '%s\n' "${probes[@]}" | median)
    printf '| %s %s | %.1f | %.1f | %.2f× | %.1f | %.1f | %.2f× | %.2f | %.1f |\n' "$arch" "$recipe" \
      "$app" "$lpp" "$(echo "$app / $lpp" | bc -l)" "$atg" "$ltg" "$(echo "$atg / $ltg" | bc -l)" \
      "$ver" "$probe"
  done
done
