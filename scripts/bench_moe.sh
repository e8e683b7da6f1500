#!/usr/bin/env bash
# Mixtures of experts at their real sizes side by side with llama.cpp (issue 36's speed and
# memory figures): the Qwen3-30B-A3B shape in Q4_K_M (18.6 GB) and the gpt-oss-20b shape in
# MXFP4 (12 GB), synthetic (`arbor synth`, then `arbor quantize` for the K mixture), 2 threads,
# interleaved round by round: llama.cpp's prebuilt libllama (tests/reference/.llama/llama_ref
# bench, scripts/install_reference.sh) and `arbor bench`, each under /usr/bin/time for its peak
# resident set. Needs ~70 GB of disk while the Q8_0 intermediate exists (it is deleted after
# quantizing) and a machine with more memory than the largest file.
#
#   scripts/bench_moe.sh BUILD_DIR
#
# Knobs: BENCH_MODELS (default BUILD_DIR/bench-models), BENCH_THREADS (2), BENCH_ROUNDS (2),
# BENCH_PP / BENCH_TG (512 / 64), BENCH_MOE_FILES ("q30b gptoss20b": which files).
# Prints a Markdown table: prefill and decode tok/s of both (medians), the ratios, and each
# engine's peak resident memory.
set -euo pipefail
build=${1:?usage: scripts/bench_moe.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${ARBOR_SHARED_DIR:-$root/../shared}
models=${BENCH_MODELS:-$build/bench-models}
threads=${BENCH_THREADS:-2}
rounds=${BENCH_ROUNDS:-2}
pp=${BENCH_PP:-512}
tg=${BENCH_TG:-64}
arbor="$build/arbor"
ref="$root/tests/reference/.llama/llama_ref"
vocab="$shared/tokenizers/hf/qwen3/tokenizer.json"
[ -x "$ref" ] || "$root/scripts/install_reference.sh" >&2
[ -x "$ref" ] || { echo "error: $ref is missing (scripts/install_reference.sh)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time is missing (apt-get install time)" >&2; exit 2; }
mkdir -p "$models"

file_for() {  # file_for NAME: the synthetic file, made once
  case $1 in
    q30b)
      local out="$models/qwen3-30b-a3b-q4_K_M.gguf" q8="$models/qwen3-30b-a3b-q8_0.gguf"
      if [ ! -f "$out" ]; then
        [ -f "$q8" ] || "$arbor" --log-level warn synth --shape qwen3-30b-a3b --type q8_0 \
          --vocab "$vocab" -o "$q8" >&2
        "$arbor" --log-level warn quantize "$q8" "$out" q4_K_M >&2
        rm -f "$q8"
      fi
      echo "$out" ;;
    gptoss20b)
      # gpt-oss's o200k vocabulary is not in ../shared: Qwen 3's tokenizer, the embedding padded
      # to gpt-oss-20b's 201,088 rows (the preset's vocab).
      local out="$models/gpt-oss-20b-mxfp4.gguf"
      [ -f "$out" ] || "$arbor" --log-level warn synth --shape gpt-oss-20b --type mxfp4 \
        --vocab "$vocab" -o "$out" >&2
      echo "$out" ;;
    *) echo "error: unknown file $1" >&2; exit 2 ;;
  esac
}

median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
rss_gib() { awk '/^maxrss/ {printf "%.2f", $2 / 1048576}' "$1"; }

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "### Mixtures of experts against llama.cpp — $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
     "$(git -C "$root" rev-parse --short HEAD)"
echo ""
echo "$cpu ($(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB), $threads threads, $rounds" \
     "interleaved rounds (medians); llama.cpp: prebuilt libllama of @node-llama-cpp/linux-x64" \
     "3.22.1 (de3ff81), mmapped weights, F16 KV cache, flash attention off."
echo ""
echo "| file | arbor pp$pp | llama.cpp pp$pp | prefill × | arbor tg$tg | llama.cpp tg$tg | decode × | arbor peak RSS GiB | llama.cpp peak RSS GiB |"
echo "|---|---|---|---|---|---|---|---|---|"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for name in ${BENCH_MOE_FILES:-q30b gptoss20b}; do
  m=$(file_for "$name")
  apps=() atgs=() lpps=() ltgs=() arss=() lrss=()
  for ((r = 0; r < rounds; r++)); do
    line=$(/usr/bin/time -f 'maxrss %M' -o "$tmp/ref.time" "$ref" bench "$m" --pp "$pp" \
      --tg "$tg" --threads "$threads" --reps 1 | tail -1)
    lpps+=("$(sed -E "s/pp $pp: ([0-9.]+).*/\1/" <<<"$line")")
    ltgs+=("$(sed -E "s/.*tg $tg: ([0-9.]+).*/\1/" <<<"$line")")
    lrss+=("$(rss_gib "$tmp/ref.time")")
    read -r app atg < <(/usr/bin/time -f 'maxrss %M' -o "$tmp/arbor.time" "$arbor" \
      --log-level warn bench -m "$m" -t "$threads" -r 1 -p "$pp" -n "$tg" --batch 1 --json |
      /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
rate = {t["name"][:2]: t["median"] for t in j["tests"]}
print(rate["pp"], rate["tg"])')
    apps+=("$app") atgs+=("$atg") arss+=("$(rss_gib "$tmp/arbor.time")")
  done
  app=$(printf '%s\n' "${apps[@]}" | median); atg=$(printf '%s\n' "${atgs[@]}" | median)
  lpp=$(printf '%s\n' "${lpps[@]}" | median); ltg=$(printf '%s\n' "${ltgs[@]}" | median)
  ar=$(printf '%s\n' "${arss[@]}" | median); lr=$(printf '%s\n' "${lrss[@]}" | median)
  printf '| %s | %.1f | %.1f | %.2f× | %.1f | %.1f | %.2f× | %s | %s |\n' "$(basename "$m")" \
    "$app" "$lpp" "$(echo "$app / $lpp" | bc -l)" "$atg" "$ltg" "$(echo "$atg / $ltg" | bc -l)" \
    "$ar" "$lr"
done
