#!/usr/bin/env bash
# Decode speed under a JSON Schema against free decoding, through `arbor serve`.
#
#   scripts/bench_structured.sh MODEL.gguf [ROUNDS] [TOKENS]
#
# One request at a time, greedy, ignore_eos, TOKENS (default 128) tokens each; the rounds
# alternate free and constrained requests so that the machine's drift hits both alike. Prints
# tokens/s per request and the median ratio constrained / free.
set -euo pipefail
model=${1:?usage: bench_structured.sh MODEL.gguf [ROUNDS] [TOKENS]}
rounds=${2:-5}
tokens=${3:-128}
root=$(cd "$(dirname "$0")/.." && pwd)
arbor=${ARBOR_BIN:-$root/build/arbor}
port=${PORT:-18093}

"$arbor" --log-level warn serve -m "$model" --port "$port" -t "${THREADS:-2}" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.2
done

schema='{"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string"},"ok":{"type":"boolean"}},"required":["id","name","ok"]}}'
request() {  # $1: extra JSON fields ("" for none); prints tokens/s
  local body="{\"prompt\":\"List the records:\",\"max_tokens\":$tokens,\"temperature\":0,\"ignore_eos\":true$1}"
  local t0 t1 n
  t0=$(date +%s.%N)
  n=$(curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d "$body" | python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["completion_tokens"])')
  t1=$(date +%s.%N)
  python3 -c "print(f'{$n / ($t1 - $t0):.2f}')"
}

request "" >/dev/null  # warm-up
free=() constrained=()
for r in $(seq "$rounds"); do
  f=$(request "")
  c=$(request ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"r\",\"schema\":$schema}}")
  free+=("$f")
  constrained+=("$c")
  echo "round $r: free $f tok/s, json_schema $c tok/s"
done
python3 - "${free[@]}" -- "${constrained[@]}" <<'EOF'
import statistics, sys
args = sys.argv[1:]
cut = args.index("--")
free, cons = [float(x) for x in args[:cut]], [float(x) for x in args[cut + 1:]]
mf, mc = statistics.median(free), statistics.median(cons)
print(f"median: free {mf:.2f} tok/s, json_schema {mc:.2f} tok/s, ratio {mc / mf:.3f}")
EOF
