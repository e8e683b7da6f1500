#!/usr/bin/env bash
# MTP self-speculation (--spec mtp) on the Qwen3.5-2B shape (issue 39), side by side with
# llama.cpp's MTP speculation (its draft-mtp driver) on the same files.
#
#   scripts/bench_spec_mtp.sh BUILD_DIR
#
# Two files of the qwen3.5-2b shape with its MTP block (`arbor synth --shape qwen3.5-2b`, the
# Qwen3 tokenizer's vocabulary, Q8_0 quantised to Q4_K_M by `arbor quantize`):
#   echo    `--untied --residual-damp D --mtp-echo`: a constructed file whose MTP head computes
#           the damped trunk's function of the current token, so its drafts agree with the
#           target most of the time (docs/qwen35.md), as a trained head's do — what speculation
#           then gains;
#   random  the random-weight file: its head almost never agrees, and speculation must then
#           cost nothing (the policy stops drafting).
# Each round, per file:
#   1. `arbor serve --spec mtp --spec-k K`: scripts/spec_paired.py at 1 and 4 streams — every
#      request twice on the same server, with speculation off per request and on, interleaved
#      (the figures to trust on a shared VM); the greedy texts of both halves must be equal;
#   2. llama.cpp (`llama_ref spec`: the prebuilt libllama, de3ff81): plain, then `--mtp --draft
#      K` at p_min 0.75 (its default) and at p_min 0; its ids must equal its plain ids.
# Prints a Markdown table: output tok/s per round and the median ratio to plain.
#
# Knobs: BENCH_MODELS (BUILD_DIR/bench-models), BENCH_THREADS (2), BENCH_ROUNDS (2),
# BENCH_SPEC_K (4), BENCH_TOKENS (128 per request), BENCH_PAIR_N (6 prompts), BENCH_DAMP (the
# echo file's --residual-damp, 8e-4), BENCH_FILES ("echo random").
set -euo pipefail
build=${1:?usage: scripts/bench_spec_mtp.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${ARBOR_SHARED_DIR:-$root/../shared}
models=${BENCH_MODELS:-$build/bench-models}
threads=${BENCH_THREADS:-2}
rounds=${BENCH_ROUNDS:-2}
spec_k=${BENCH_SPEC_K:-4}
tokens=${BENCH_TOKENS:-128}
pair_n=${BENCH_PAIR_N:-6}
damp=${BENCH_DAMP:-8e-4}
files=${BENCH_FILES:-echo random}
arbor="$build/arbor"
ref="$root/tests/reference/.llama/llama_ref"
out="$build/bench-results/spec-mtp"
mkdir -p "$models" "$out"
# shellcheck source=scripts/serve_lib.sh
source "$root/scripts/serve_lib.sh"
[ -x "$ref" ] || "$root/scripts/install_reference.sh" >&2
[ -x "$ref" ] || { echo "error: $ref is missing (scripts/install_reference.sh)" >&2; exit 2; }
vocab="$shared/tokenizers/hf/qwen3/tokenizer.json"
[ -f "$vocab" ] || { echo "error: $vocab not found (ARBOR_SHARED_DIR?)" >&2; exit 2; }

# make_file NAME [synth flags]: $models/qwen35-2b-mtp-NAME-q4_K_M.gguf
make_file() {
  local name=$1; shift
  local f="$models/qwen35-2b-mtp-$name-q4_K_M.gguf" q8="$models/qwen35-2b-mtp-$name-q8_0.gguf"
  if [ ! -f "$f" ]; then
    "$arbor" --log-level warn synth --shape qwen3.5-2b --vocab "$vocab" --type q8_0 "$@" -o "$q8" >&2
    "$arbor" --log-level warn quantize "$q8" "$f" q4_K_M >&2
    rm -f "$q8"
  fi
  echo "$f"
}
declare -A target
for f in $files; do
  case $f in
    echo) target[echo]=$(make_file "echo-damp$damp" --untied --residual-damp "$damp" --mtp-echo) ;;
    random) target[random]=$(make_file random) ;;
    *) echo "error: BENCH_FILES names $f (echo, random)" >&2; exit 2 ;;
  esac
done

prompts="$out/prompts.jsonl" prompts_txt="$out/prompts.txt"
head -n "$pair_n" "$root/scripts/story_prompts.txt" >"$prompts_txt"
python3 - "$prompts" "$tokens" "$prompts_txt" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for s in open(sys.argv[3]).read().splitlines():
        f.write(json.dumps({"prompt": s, "max_tokens": int(sys.argv[2])}) + "\n")
PY

declare -A tps
mismatch="" llama_mismatch=""
# arbor_round FILE R: one server with --spec mtp, the paired runs at 1 and 4 streams.
arbor_round() {
  local f=$1 r=$2 pair c
  start_arbor_serve "$out" "arbor_${f}_$r" "$arbor" -m "${target[$f]}" -t "$threads" \
    --spec mtp --spec-k "$spec_k"
  for c in 1 4; do
    pair=$(python3 "$root/scripts/spec_paired.py" "$server_url" "$prompts" --concurrency "$c" \
      --requests "$pair_n" --tokens "$tokens" --texts "$out/${f}_on_$r.txt" \
      --off-texts "$out/${f}_off_$r.txt")
    tps[${f}_off_c${c}_$r]=${pair% *}
    tps[${f}_on_c${c}_$r]=${pair#* }
  done
  cmp -s "$out/${f}_on_$r.txt" "$out/${f}_off_$r.txt" || mismatch+=" $f(round $r)"
  curl -s "$server_url/metrics" |
    grep -E '^arbor_spec_(draft_tokens|accepted_tokens|verify_steps)_total' >"$out/${f}_$r.metrics" || true
  stop_arbor_serve
}
# llama_round FILE NAME R [llama_ref spec flags]
llama_round() {
  local f=$1 name=$2 r=$3 line; shift 3
  line=$("$ref" spec "${target[$f]}" "$prompts_txt" -n "$tokens" --threads "$threads" \
    --ids "$out/${f}_${name}_$r.ids" "$@" 2>/dev/null | tail -1)
  echo "$line" >"$out/${f}_${name}_$r.line"
  tps[${f}_${name}_c1_$r]=$(sed -E 's/.*: ([0-9.]+) tok\/s.*/\1/' <<<"$line")
}
for r in $(seq 1 "$rounds"); do
  for f in $files; do
    arbor_round "$f" "$r"
    llama_round "$f" lplain "$r"
    llama_round "$f" lmtp "$r" --mtp --draft "$spec_k" --p-min 0.75
    llama_round "$f" lmtp0 "$r" --mtp --draft "$spec_k" --p-min 0
    cmp -s "$out/${f}_lplain_$r.ids" "$out/${f}_lmtp_$r.ids" || llama_mismatch+=" $f p_min 0.75 (round $r)"
    cmp -s "$out/${f}_lplain_$r.ids" "$out/${f}_lmtp0_$r.ids" || llama_mismatch+=" $f p_min 0 (round $r)"
  done
done

row() { echo "| $1 | $(ratio_cells "$2" "$3" "$rounds") |"; }
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "### MTP self-speculation, Qwen3.5-2B shape — $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD)"
echo
echo "$cpu ($(nproc) cores), $threads threads, $rounds rounds, greedy, $tokens tokens per request,"
echo "$pair_n prompts. arbor: \`--spec mtp --spec-k $spec_k\` (the policy sizes each step), paired"
echo "in one server (scripts/spec_paired.py). llama.cpp: \`llama_ref spec --mtp --draft $spec_k\`"
echo "(its draft-mtp driver: greedy top-1 while its top-10-renormalised probability >= p_min)."
echo "arbor's texts with speculation equal its texts without: $([ -z "$mismatch" ] && echo 'yes, in every round' || echo "**NO:$mismatch**");"
echo "llama.cpp's ids with MTP equal its plain ids: $([ -z "$llama_mismatch" ] && echo 'yes' || echo "no at$llama_mismatch")."
echo
echo "| file, configuration | output tok/s: spec / plain, per round | ratio (median) |"
echo "|---|---|---|"
for f in $files; do
  echo "| **$f**: $(basename "${target[$f]}") ($(du -BM "${target[$f]}" | cut -f1)) | | |"
  row "arbor, 1 stream (paired, speculation off per request)" "${f}_on_c1" "${f}_off_c1"
  row "arbor, 4 streams (paired)" "${f}_on_c4" "${f}_off_c4"
  row "llama.cpp MTP, 1 stream, p_min 0.75" "${f}_lmtp_c1" "${f}_lplain_c1"
  row "llama.cpp MTP, 1 stream, p_min 0" "${f}_lmtp0_c1" "${f}_lplain_c1"
  row "arbor plain / llama.cpp plain, 1 stream" "${f}_off_c1" "${f}_lplain_c1"
  row "arbor MTP / llama.cpp MTP (p_min 0.75), 1 stream" "${f}_on_c1" "${f}_lmtp_c1"
done
echo
for f in $files; do
  awk -v f="$f" '/draft_tokens_total/{d+=$NF} /accepted_tokens_total/{a+=$NF} /verify_steps_total/{v+=$NF}
       END{printf "arbor %s: %d of %d drafts accepted in %d verifications (all rounds).\n", f, a, d, v}' \
    "$out"/"${f}"_*.metrics
  for r in $(seq 1 "$rounds"); do
    echo "llama.cpp $f round $r: p_min 0.75: $(cat "$out/${f}_lmtp_$r.line"); p_min 0: $(cat "$out/${f}_lmtp0_$r.line")"
  done
done
[ -z "$mismatch" ]
