#!/usr/bin/env bash
# Token-tree speculation against chains (issue 15).
#
#   scripts/bench_tree.sh BUILD_DIR            (also run by scripts/bench.sh)
#
# Targets: stories260K itself (F32) and stories260K inflated to TinyLlama-1.1B's shape in Q8_0
# (docs/inflate.md: the same next-token function at the cost of a 1B model). Draft: stories260K's
# first 4 layers (a weak draft, ~25 % chain acceptance). Single stream, greedy, 8 story prompts
# of 128 tokens one after another (8 times over on stories260K), through `arbor serve`:
#   * plain decoding; a chain (--spec-k 4); trees of budgets 8, 16 and 32 (--spec-k 6
#     levels, width 4), each in two modes:
#       fixed — every request asks for `speculation: {mode: fixed}`, so every step verifies the
#               whole chain or tree: the accepted drafts per verification compare the shapes;
#       auto  — the speculation policy sizes chains and trees each step: the tokens/s a user
#               gets.
#   * every output compared with plain greedy, token for token (its text);
#   * under load: 4 concurrent streams on the inflated target, plain / chain / tree 16, auto.
# Every configuration runs once per round, right after a plain run; ratios are medians of the
# per-round ratios. Knobs: BENCH_MODELS, BENCH_THREADS, BENCH_TREE_ROUNDS (default 3),
# BENCH_QUICK=1 (one round, 4 prompts), ARBOR_SHARED_DIR.
set -euo pipefail
build=${1:?usage: scripts/bench_tree.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${ARBOR_SHARED_DIR:-$root/../shared}
models=${BENCH_MODELS:-$build/bench-models}
threads=${BENCH_THREADS:-$(nproc)}
rounds=${BENCH_TREE_ROUNDS:-3}
num_prompts=8
if [ "${BENCH_QUICK:-0}" = 1 ]; then rounds=1; num_prompts=4; fi
arbor="$build/arbor"
out="$build/bench-results/tree"
mkdir -p "$models" "$out"
# shellcheck source=scripts/serve_lib.sh
source "$root/scripts/serve_lib.sh"

small="$shared/models/stories260K/stories260K.gguf"
[ -f "$small" ] || { echo "error: $small not found (ARBOR_SHARED_DIR?)" >&2; exit 2; }
inflated="$models/inflated-1b-q8_0.gguf"
weak="$models/stories260K-first4layers.gguf"
[ -f "$inflated" ] || "$arbor" --log-level warn synth --inflate "$small" --shape tinyllama-1.1b \
  --type q8_0 -o "$inflated"
[ -f "$weak" ] || "$arbor" --log-level warn convert llama2c \
  "$shared/models/stories260K/stories260K-first4layers.bin" \
  "$shared/models/stories260K/tok512.bin" -o "$weak"

# run NAME TARGET K|0 [serve flags...]: one server, the prompts one after another (speculation
# fixed at K levels when K > 0 and MODE=fixed), then one line of JSON into $out/NAME.json.
run() {
  local name=$1 target=$2 k=$3; shift 3
  start_arbor_serve "$out" "$name" "$arbor" -m "$target" -t "$threads" "$@"
  python3 - "$server_url" "$k" "${MODE:-auto}" "$num_prompts" "${REPEAT:-1}" \
    "${CONC:-1}" >"$out/$name.json" <<'EOF'
import concurrent.futures, json, sys, time, urllib.request
url, k, mode, n, repeat = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
conc = int(sys.argv[6])
starts = ["Once upon a time, there was a little girl named Lily.", "One day, a big dog went to the park.",
          "Tom and Sue were best friends. They liked to play", "The sun was shining and the birds were singing.",
          "There was a small cat who lived in a house.", "Once upon a time, a boy named Tim had a red ball.",
          "In a big forest, there lived a little bear.", "Ben found a shiny rock in the garden."][:n]
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))
post("/v1/completions", {"prompt": "Once", "max_tokens": 8, "temperature": 0})  # warm-up
def metrics():
    m = {}
    for line in urllib.request.urlopen(url + "/metrics").read().decode().splitlines():
        if line.startswith("arbor_spec_") and not line.startswith("arbor_spec_acceptance_by"):
            name, value = line.rsplit(" ", 1)
            m[name.split("{", 1)[0]] = float(value)  # labels (model_name) dropped
    return m
before = metrics()
def one(s):
    body = {"prompt": s, "max_tokens": 128, "temperature": 0}
    if k > 0 and mode == "fixed":
        body["speculation"] = {"mode": "fixed", "k": k}
    return post("/v1/completions", body)
t0 = time.time()
with concurrent.futures.ThreadPoolExecutor(max_workers=conc) as pool:
    results = list(pool.map(one, starts * repeat))
seconds = time.time() - t0
texts = [r["choices"][0]["text"] for r in results]
tokens = sum(r["usage"]["completion_tokens"] for r in results)
after = metrics()
d = lambda key: after.get(key, 0.0) - before.get(key, 0.0)
print(json.dumps({"tok_s": tokens / seconds, "texts": texts[:n],
                  "verify": d("arbor_spec_verify_steps_total"),
                  "drafts": d("arbor_spec_draft_tokens_total"),
                  "accepted": d("arbor_spec_accepted_tokens_total")}))
EOF
  stop_arbor_serve
}

weakd=(--spec draft --draft-model "$weak")
targets=(small inflated)
declare -A path=([small]="$small" [inflated]="$inflated")
configs=(chain4 tree8 tree16 tree32)
declare -A flags=([chain4]="--spec-k 4" [tree8]="--spec-k 6 --spec-tree-budget 8"
                  [tree16]="--spec-k 6 --spec-tree-budget 16" [tree32]="--spec-k 6 --spec-tree-budget 32")
declare -A levels=([chain4]=4 [tree8]=6 [tree16]=6 [tree32]=6)
# stories260K decodes ~20,000 tok/s: its prompts run 8 times over so that a run lasts long
# enough to time (texts are compared on the first pass).
declare -A repeat=([small]=8 [inflated]=1)
for r in $(seq 1 "$rounds"); do
  for t in "${targets[@]}"; do
    export REPEAT=${repeat[$t]}
    MODE=auto run "${t}_plain_$r" "${path[$t]}" 0
    for c in "${configs[@]}"; do
      # shellcheck disable=SC2086
      MODE=fixed run "${t}_${c}_fixed_$r" "${path[$t]}" "${levels[$c]}" "${weakd[@]}" ${flags[$c]}
      # shellcheck disable=SC2086
      MODE=auto run "${t}_${c}_auto_$r" "${path[$t]}" "${levels[$c]}" "${weakd[@]}" ${flags[$c]}
    done
  done
  # Under load: 4 concurrent streams on the inflated target (16 requests), policy on.
  export REPEAT=2 CONC=4
  MODE=auto run "c4_plain_$r" "$inflated" 0
  # shellcheck disable=SC2086
  MODE=auto run "c4_chain4_$r" "$inflated" 4 "${weakd[@]}" ${flags[chain4]}
  # shellcheck disable=SC2086
  MODE=auto run "c4_tree16_$r" "$inflated" 6 "${weakd[@]}" ${flags[tree16]}
  export CONC=1
done

python3 - "$out" "$rounds" "$threads" <<'EOF'
import json, statistics, sys
out, rounds, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load = lambda name: json.load(open(f"{out}/{name}.json"))
names = {"small": "stories260K (F32)", "inflated": "stories260K inflated to TinyLlama-1.1B, Q8_0"}
configs = [("chain4", "chain, k = 4"), ("tree8", "tree, budget 8"), ("tree16", "tree, budget 16"),
           ("tree32", "tree, budget 32")]
mismatch = False
print("### Token trees against chains (issue 15)")
print()
print(f"Draft: stories260K's first 4 layers. Single stream, greedy, 8 story prompts x 128 tokens (8 times over on stories260K); "
      f"{threads} threads; {rounds} round(s), each configuration right after a plain run, medians.")
print("Chains `--spec-k 4`; trees `--spec-k 6 --spec-tree-budget B` (width 4). *fixed*: every step verifies "
      "the whole chain or tree; *auto*: the speculation policy sizes them.")
for t in ["small", "inflated"]:
    print()
    print(f"**{names[t]}**")
    print()
    print("| configuration | drafts verified / step (fixed) | accepted / step (fixed) | vs chain | tok/s auto (plain) | auto vs plain | auto vs chain |")
    print("|---|---|---|---|---|---|---|")
    rows = {}
    for c, label in configs:
        acc, nodes, ratio_plain, tps, plain = [], [], [], [], []
        for r in range(1, rounds + 1):
            p = load(f"{t}_plain_{r}")
            for mode in ["fixed", "auto"]:
                x = load(f"{t}_{c}_{mode}_{r}")
                if x["texts"] != p["texts"]:
                    mismatch = True
                    print(f"MISMATCH: {t} {c} {mode} round {r} differs from plain greedy", file=sys.stderr)
            f = load(f"{t}_{c}_fixed_{r}")
            a = load(f"{t}_{c}_auto_{r}")
            acc.append(f["accepted"] / max(f["verify"], 1))
            nodes.append(f["drafts"] / max(f["verify"], 1))
            tps.append(a["tok_s"]); plain.append(p["tok_s"]); ratio_plain.append(a["tok_s"] / p["tok_s"])
        rows[c] = dict(acc=statistics.median(acc), nodes=statistics.median(nodes), tps=tps,
                       plain=plain, ratio_plain=statistics.median(ratio_plain))
    for c, label in configs:
        x = rows[c]
        vs_chain = x["acc"] / max(rows["chain4"]["acc"], 1e-9)
        auto_vs_chain = statistics.median(a / b for a, b in zip(x["tps"], rows["chain4"]["tps"]))
        print(f"| {label} | {x['nodes']:.1f} | {x['acc']:.2f} | {vs_chain:.2f}x | "
              f"{statistics.median(x['tps']):.1f} ({statistics.median(x['plain']):.1f}) | "
              f"**{x['ratio_plain']:.2f}** | {auto_vs_chain:.2f} |")
print()
print("**Under load: 4 concurrent streams, inflated target, policy on (16 requests x 128 tokens)**")
print()
print("| configuration | output tok/s per round | vs plain (median) |")
print("|---|---|---|")
for c, label in [("plain", "plain"), ("chain4", "chain, k = 4"), ("tree16", "tree, budget 16")]:
    tps = [load(f"c4_{c}_{r}")["tok_s"] for r in range(1, rounds + 1)]
    ratio = statistics.median(load(f"c4_{c}_{r}")["tok_s"] / load(f"c4_plain_{r}")["tok_s"] for r in range(1, rounds + 1))
    if c != "plain":
        for r in range(1, rounds + 1):
            if load(f"c4_{c}_{r}")["texts"] != load(f"c4_plain_{r}")["texts"]:
                mismatch = True
                print(f"MISMATCH: 4 streams {c} round {r} differs from plain greedy", file=sys.stderr)
    print(f"| {label} | {', '.join('%.1f' % x for x in tps)} | **{ratio:.2f}** |")
print()
print("Outputs: " + ("**MISMATCH** (see stderr)" if mismatch else "every configuration's greedy text equals plain decoding's."))
sys.exit(1 if mismatch else 0)
EOF
