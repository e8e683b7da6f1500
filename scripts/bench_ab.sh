#!/usr/bin/env bash
# Interleaved A/B of two arbor builds on the engine's plain, speculative and tree paths (the
# check a refactor of the step, the scheduler or the executor owes: tokens/s unchanged or
# better). `arbor bench throughput` on stories260K (ARBOR_SHARED_DIR), draft = the model itself
# (every greedy draft accepted, so the speculative paths run at full depth), each configuration
# run ROUNDS times alternating A and B; prints the median output tokens/s of each and B/A.
#
#   scripts/bench_ab.sh A_BINARY B_BINARY [ROUNDS=5]
# BENCH_AB_ONLY=REGEX runs only the configurations whose name matches.
set -euo pipefail
a=${1:?usage: scripts/bench_ab.sh A_BINARY B_BINARY [ROUNDS]}
b=${2:?usage: scripts/bench_ab.sh A_BINARY B_BINARY [ROUNDS]}
rounds=${3:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${ARBOR_SHARED_DIR:-$root/../shared}
model="$shared/models/stories260K/stories260K.gguf"
[ -f "$model" ] || { echo "error: $model not found (ARBOR_SHARED_DIR?)" >&2; exit 2; }
threads=${BENCH_THREADS:-$(nproc)}
common=(--log-level warn bench throughput -m "$model" -t "$threads" --input-len 32 --json)
draft=(--spec draft --draft-model "$model" --spec-k 4)
declare -A configs=(
  ["plain 16 streams"]="--num-requests 128 --max-num-seqs 16 --output-len 256"
  ["plain 1 stream"]="--num-requests 12 --max-num-seqs 1 --output-len 256"
  ["draft chain k=4, 1 stream"]="--num-requests 12 --max-num-seqs 1 --output-len 256 ${draft[*]}"
  ["draft chain k=4, 16 streams"]="--num-requests 128 --max-num-seqs 16 --output-len 256 ${draft[*]}"
  ["draft tree 8 nodes, 1 stream"]="--num-requests 12 --max-num-seqs 1 --output-len 256 ${draft[*]} --spec-tree-budget 8"
  ["suffix, 16 streams"]="--num-requests 128 --max-num-seqs 16 --output-len 256 --spec suffix --distinct-prompts 4"
)
tps() { "$@" | sed -n 's/.*"output_tokens_per_s": \([0-9.]*\).*/\1/p' | head -1; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
echo "| configuration | A tok/s | B tok/s | B/A |"
echo "|---|---|---|---|"
for name in "plain 16 streams" "plain 1 stream" "draft chain k=4, 1 stream" \
            "draft chain k=4, 16 streams" "draft tree 8 nodes, 1 stream" "suffix, 16 streams"; do
  [[ "$name" =~ ${BENCH_AB_ONLY:-.} ]] || continue
  read -r -a extra <<< "${configs[$name]}"
  as=() bs=()
  for ((r = 0; r < rounds; ++r)); do
    as+=("$(tps "$a" "${common[@]}" "${extra[@]}")")
    bs+=("$(tps "$b" "${common[@]}" "${extra[@]}")")
  done
  ma=$(printf '%s\n' "${as[@]}" | median)
  mb=$(printf '%s\n' "${bs[@]}" | median)
  awk -v n="$name" -v a="$ma" -v b="$mb" 'BEGIN {printf "| %s | %.0f | %.0f | %.3f |\n", n, a, b, b / a}'
done
