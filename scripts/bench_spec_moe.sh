#!/usr/bin/env bash
# Speculative decoding on a mixture of experts at the Qwen3-30B-A3B shape (issue 36), side by
# side with llama.cpp's speculative decoding on the same files.
#
#   scripts/bench_spec_moe.sh BUILD_DIR
#
# Target: stories260K inflated to the Qwen3-30B-A3B shape as a Mixtral-style mixture (`arbor synth
# --inflate stories260K.gguf --shape qwen3-30b-a3b`: dim 2048, 48 layers, 128 experts of 768, 8
# routed per token, a random router; every expert is stories260K's FFN, so the mixture keeps its
# next-token function while each token's rows touch 8 experts chosen by its hidden state, as a
# trained mixture's do), quantised to Q4_K_M (~18 GB; the Q8_0 intermediate is deleted). Draft:
# stories260K itself (F32), a draft that agrees with the target except where 4-bit weights move
# it. A weak draft beside it: stories260K's first 4 layers (its first draft agrees ~45 % of the
# time), which cannot pay on this curve: speculation must then cost nothing. Greedy throughout.
# Each round:
#   1. arbor serve, plain: 1 stream (the prompts one after another; their texts kept), then 4 and
#      16 concurrent streams (`arbor bench serve`);
#   2. the same with `--spec draft --draft-model stories260K.gguf --spec-k K` (the policy chooses
#      how many of the K drafts each step verifies), and with the weak draft (BENCH_WEAK=1, the
#      default); the 1-stream texts must equal plain's. Each speculating server first runs the
#      paired comparison (scripts/spec_paired.py): the same requests with speculation off per
#      request, interleaved on the same server at 1, 4 and 16 streams — the figures to trust on a
#      shared VM, whose drift between separate servers (10-20 %) exceeds a 3 % margin;
#   3. llama.cpp (tests/reference/.llama/llama_ref spec: the prebuilt libllama, the
#      speculative-simple loop): plain, and the same draft at its defaults (K 8, p_min 0.75) and
#      at p_min 0; its speculative ids must equal its plain ids.
# Prints a Markdown table: output tok/s per round and the median ratio to plain.
#
# Knobs: BENCH_MODELS (BUILD_DIR/bench-models), BENCH_THREADS (2), BENCH_ROUNDS (2), BENCH_SPEC_K
# (8), BENCH_MOE_LAYERS (48), BENCH_TOKENS (128 per request), BENCH_SINGLE_N (6 prompts),
# BENCH_WEAK (1: the weak-draft rows), BENCH_LLAMA (1: the llama.cpp rows), BENCH_PAIR_N (8
# prompts of the paired single-stream run), BENCH_SEPARATE (1: also the runs against a separate
# plain server).
# Each round takes ~15 minutes on 2 Zen 4 cores (the target's first load from disk ~2 more).
set -euo pipefail
build=${1:?usage: scripts/bench_spec_moe.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${ARBOR_SHARED_DIR:-$root/../shared}
models=${BENCH_MODELS:-$build/bench-models}
threads=${BENCH_THREADS:-2}
rounds=${BENCH_ROUNDS:-2}
spec_k=${BENCH_SPEC_K:-8}
layers=${BENCH_MOE_LAYERS:-48}
tokens=${BENCH_TOKENS:-128}
single_n=${BENCH_SINGLE_N:-6}
weak_rows=${BENCH_WEAK:-1}
pair_n=${BENCH_PAIR_N:-8}
separate=${BENCH_SEPARATE:-1}
llama_rows=${BENCH_LLAMA:-1}
arbor="$build/arbor"
ref="$root/tests/reference/.llama/llama_ref"
out="$build/bench-results/spec-moe"
mkdir -p "$models" "$out"
# shellcheck source=scripts/serve_lib.sh
source "$root/scripts/serve_lib.sh"
[ -x "$ref" ] || "$root/scripts/install_reference.sh" >&2
[ -x "$ref" ] || { echo "error: $ref is missing (scripts/install_reference.sh)" >&2; exit 2; }

small="$shared/models/stories260K/stories260K.gguf"
[ -f "$small" ] || { echo "error: $small not found (ARBOR_SHARED_DIR?)" >&2; exit 2; }
target="$models/inflated-q30b-${layers}l-q4_K_M.gguf"
weak="$models/stories260K-first4layers.gguf"
[ -f "$weak" ] || "$arbor" --log-level warn convert llama2c \
  "$shared/models/stories260K/stories260K-first4layers.bin" \
  "$shared/models/stories260K/tok512.bin" -o "$weak"
if [ ! -f "$target" ]; then
  q8="$models/inflated-q30b-${layers}l-q8_0.gguf"
  [ -f "$q8" ] || "$arbor" --log-level warn synth --inflate "$small" --shape qwen3-30b-a3b \
    --layers "$layers" --type q8_0 -o "$q8" >&2
  "$arbor" --log-level warn quantize "$q8" "$target" q4_K_M >&2
  rm -f "$q8"
fi

# 16 story openings (scripts/story_prompts.txt; the models were trained on TinyStories), as JSON
# lines and as plain lines.
prompts="$out/prompts.jsonl" prompts_txt="$out/prompts.txt"
python3 - "$prompts" "$tokens" "$root/scripts/story_prompts.txt" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for s in open(sys.argv[3]).read().splitlines():
        f.write(json.dumps({"prompt": s, "max_tokens": int(sys.argv[2])}) + "\n")
EOF
cp "$root/scripts/story_prompts.txt" "$prompts_txt"

# single URL N OUT.txt: the first N prompts one after another, greedy; writes their texts and
# prints the output tokens/s over the whole run.
single() {
  python3 - "$1" "$prompts" "$2" "$tokens" "$3" <<'EOF'
import json, sys, time, urllib.request
url, path, n, tokens, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
lines = open(path).read().splitlines()[:n]
t0, made, texts = time.time(), 0, []
for line in lines:
    body = json.dumps({"prompt": json.loads(line)["prompt"], "max_tokens": tokens,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req))
    made += r["usage"]["completion_tokens"]
    texts.append(json.dumps(r["choices"][0]["text"]))
open(out, "w").write("\n".join(texts) + "\n")
print(made / (time.time() - t0))
EOF
}

# arbor_round NAME [serve flags...]: one server, the 1-, 4- and 16-stream runs; sets tps[NAME_c$c_$r]
# (and, for a speculating server, tps[NAME_pair_c$c_$r] / tps[NAME_pairoff_c$c_$r]: the same
# server with speculation off per request, paired — scripts/spec_paired.py).
declare -A tps
arbor_round() {
  local name=$1 r=$2; shift 2
  start_arbor_serve "$out" "${name}_$r" "$arbor" -m "$target" -t "$threads" "$@"
  # Untimed warm-up: every prompt in one request touches the experts' pages once (a speculating
  # server's startup measurement does; a plain one's first request would pay it).
  curl -sf "$server_url/v1/completions" -H 'Content-Type: application/json' \
    -d "$(python3 -c 'import json,sys; print(json.dumps({"prompt": " ".join(open(sys.argv[1]).read().splitlines()), "max_tokens": 8}))' "$prompts_txt")" \
    >/dev/null
  if [ "$name" != plain ]; then
    local pair c
    for c in 1 4 16; do
      pair=$(python3 "$root/scripts/spec_paired.py" "$server_url" "$prompts" --concurrency "$c" \
        --requests "$pair_n" --tokens "$tokens" --texts "$out/${name}_pair_$r.txt" \
        --off-texts "$out/${name}_pairoff_$r.txt")
      tps[${name}_pairoff_c${c}_$r]=${pair% *}
      tps[${name}_pair_c${c}_$r]=${pair#* }
    done
    cmp -s "$out/${name}_pair_$r.txt" "$out/${name}_pairoff_$r.txt" ||
      mismatch+=" arbor $name paired(round $r)"
  fi
  if [ "$separate" = 1 ]; then
    separate_runs "$name" "$r"
  fi
  curl -s "$server_url/metrics" | grep -E '^arbor_spec_(draft_tokens|accepted_tokens|verify_steps)_total' \
    >"$out/${name}_$r.metrics" || true
  stop_arbor_serve
}

# separate_runs NAME R: on the running server, the 1-stream run (texts kept) and the 4- and
# 16-stream runs of `arbor bench serve`, each compared with the plain server's.
separate_runs() {
  local name=$1 r=$2 c
  tps[${name}_c1_$r]=$(single "$server_url" "$single_n" "$out/${name}_$r.txt")
  for c in 4 16; do
    "$arbor" --log-level warn bench serve --url "$server_url" --prompts-file "$prompts" \
      -n $((2 * c)) --max-concurrency "$c" \
      --result-json "$out/${name}_c${c}_$r.json" >/dev/null
    tps[${name}_c${c}_$r]=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['runs'][0]['output_throughput'])" \
      "$out/${name}_c${c}_$r.json")
  done
}

# llama_round NAME R [llama_ref spec flags]: llama.cpp, 1 stream; sets tps[NAME_c1_R].
llama_round() {
  local name=$1 r=$2; shift 2
  local line
  line=$("$ref" spec "$target" "$prompts_txt" -n "$tokens" --threads "$threads" \
    --ids "$out/${name}_$r.ids" "$@" 2>/dev/null | tail -1)
  echo "$line" >"$out/${name}_$r.line"
  tps[${name}_c1_$r]=$(sed -E 's/.*: ([0-9.]+) tok\/s.*/\1/' <<<"$line")
}

head -n "$single_n" "$prompts_txt" >"$out/prompts_single.txt"
prompts_txt="$out/prompts_single.txt"
mismatch="" llama_mismatch=""
for r in $(seq 1 "$rounds"); do
  [ "$separate" = 1 ] && arbor_round plain "$r"
  arbor_round spec "$r" --spec draft --draft-model "$small" --spec-k "$spec_k"
  [ "$separate" = 1 ] && { cmp -s "$out/plain_$r.txt" "$out/spec_$r.txt" || mismatch+=" arbor(round $r)"; }
  if [ "$weak_rows" = 1 ]; then
    arbor_round weak "$r" --spec draft --draft-model "$weak" --spec-k "$spec_k"
    [ "$separate" = 1 ] && { cmp -s "$out/plain_$r.txt" "$out/weak_$r.txt" || mismatch+=" arbor weak draft(round $r)"; }
  fi
  [ "$llama_rows" = 1 ] || continue
  llama_round lplain "$r"
  llama_round lspec "$r" --draft-model "$small" --draft 8 --p-min 0.75
  llama_round lspec0 "$r" --draft-model "$small" --draft "$spec_k" --p-min 0
  cmp -s "$out/lplain_$r.ids" "$out/lspec_$r.ids" || llama_mismatch+=" p_min 0.75 (round $r)"
  cmp -s "$out/lplain_$r.ids" "$out/lspec0_$r.ids" || llama_mismatch+=" p_min 0 (round $r)"
done

# row LABEL CONFIG BASE: tok/s of CONFIG / BASE per round and the median ratio.
row() { echo "| $1 | $(ratio_cells "$2" "$3" "$rounds") |"; }
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "### Speculation on a mixture of experts (Qwen3-30B-A3B shape, $layers layers) — $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD)"
echo
echo "$cpu ($(nproc) cores), $threads threads, $rounds rounds; target $(basename "$target")"
echo "($(du -BM "$target" | cut -f1)), draft stories260K (F32); greedy, $tokens tokens per request;"
echo "1 stream: $single_n prompts one after another; 4 and 16 streams: \`arbor bench serve -n 2C"
echo "--max-concurrency C\`. arbor: \`--spec draft --draft-model stories260K.gguf --spec-k $spec_k\`"
echo "(the policy sizes each step). llama.cpp: \`llama_ref spec\` (prebuilt libllama 3.22.1,"
echo "de3ff81; the speculative-simple loop), 1 stream. Each server answers one untimed warm-up"
echo "request first. arbor's greedy outputs with speculation equal plain greedy: $([ -z "$mismatch" ] && echo 'yes, in every round' || echo "**NO:$mismatch**");"
if [ "$llama_rows" = 1 ]; then
  echo "llama.cpp's: $([ -z "$llama_mismatch" ] && echo 'yes' || echo "no at$llama_mismatch (its verification batch changes the logits)")."
else
  echo "llama.cpp not run (BENCH_LLAMA=0)."
fi
echo
echo "| configuration | output tok/s: spec / plain, per round | ratio (median) |"
echo "|---|---|---|"
for c in 1 4 16; do
  row "arbor, $c stream(s), paired in one server (speculation off per request)" \
    "spec_pair_c$c" "spec_pairoff_c$c"
done
if [ "$weak_rows" = 1 ]; then
  for c in 1 4 16; do
    row "arbor, weak draft (first 4 layers), $c stream(s), paired in one server" \
      "weak_pair_c$c" "weak_pairoff_c$c"
  done
fi
if [ "$separate" = 1 ]; then
  row "arbor, 1 stream, against a separate plain server" spec_c1 plain_c1
  row "arbor, 4 streams, against a separate plain server" spec_c4 plain_c4
  row "arbor, 16 streams, against a separate plain server" spec_c16 plain_c16
  if [ "$weak_rows" = 1 ]; then
    row "arbor, weak draft, 1 stream, against a separate plain server" weak_c1 plain_c1
    row "arbor, weak draft, 4 streams, against a separate plain server" weak_c4 plain_c4
    row "arbor, weak draft, 16 streams, against a separate plain server" weak_c16 plain_c16
  fi
fi
if [ "$llama_rows" = 1 ]; then
  row "llama.cpp, 1 stream, K 8, p_min 0.75 (its defaults)" lspec_c1 lplain_c1
  row "llama.cpp, 1 stream, K $spec_k, p_min 0" lspec0_c1 lplain_c1
  if [ "$separate" = 1 ]; then
    row "arbor plain / llama.cpp plain, 1 stream" plain_c1 lplain_c1
    row "arbor spec / llama.cpp spec at its defaults, 1 stream" spec_c1 lspec_c1
  fi
fi
echo
awk '/draft_tokens_total/{d+=$NF} /accepted_tokens_total/{a+=$NF} /verify_steps_total/{v+=$NF}
     END{printf "arbor drafts (all rounds and stream counts): %d of %d accepted in %d verifications.\n", a, d, v}' \
  "$out"/spec_*.metrics
if [ "$weak_rows" = 1 ]; then
  awk '/draft_tokens_total/{d+=$NF} /accepted_tokens_total/{a+=$NF} /verify_steps_total/{v+=$NF}
       END{printf "arbor weak draft: %d of %d accepted in %d verifications.\n", a, d, v}' \
    "$out"/weak_*.metrics
fi
for r in $(seq 1 "$rounds"); do
  [ "$llama_rows" = 1 ] || break
  echo "llama.cpp round $r: $(cat "$out/lspec_$r.line"); p_min 0: $(cat "$out/lspec0_$r.line")"
done
grep -h "speculation: expert term\|speculation: up to" "$out/spec_1.log" | sed 's/^.*\] /arbor log: /'
[ -z "$mismatch" ]
