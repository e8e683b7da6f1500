#!/usr/bin/env bash
# `make serve` then the README's first chat request: starts the server the way `make serve` does
# (scripts/serve.sh: the default model, stories260K, which has no chat template, and no
# --chat-template), runs the README's `curl ... /v1/chat/completions` command as written (only
# the port changed) and expects a 200 chat completion, and the startup warning that names the
# fallback template and --chat-template.
#   serve_readme_test.sh <source dir> <arbor binary> <shared dir>
set -euo pipefail
root=$1
bin=$2
shared=${ARBOR_SHARED_DIR:-$3}
tmp=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/log" ] && sed 's/^/  server: /' "$tmp/log"; exit 1; }

model="$shared/models/stories260K/stories260K.gguf"
[ -f "$model" ] || fail "missing shared data: $model (set ARBOR_SHARED_DIR)"

# The README's command: from its first line that posts to /v1/chat/completions to the first line
# without a continuation backslash.
cmd=$(awk '/curl .*\/v1\/chat\/completions/ && !done { on = 1 }
           on { print; if ($0 !~ /\\$/) { on = 0; done = 1 } }' "$root/README.md")
[ -n "$cmd" ] || fail "README.md has no curl command for /v1/chat/completions"
grep -q '127.0.0.1:8080' <<< "$cmd" || fail "the README's command does not use 127.0.0.1:8080: $cmd"

ARBOR_SHARED_DIR="$shared" PORT=0 bash "$root/scripts/serve.sh" "$bin" \
    --port-file "$tmp/port" > "$tmp/log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  [ -s "$tmp/port" ] && break
  kill -0 "$pid" 2>/dev/null || fail "the server exited before listening"
  sleep 0.1
done
[ -s "$tmp/port" ] || fail "the server did not start listening within 60 s"
port=$(cat "$tmp/port")

run=${cmd//127.0.0.1:8080/127.0.0.1:$port}
out=$(eval "$run -w '\n%{http_code}'") || fail "curl failed: $run"
status=${out##*$'\n'}
body=${out%$'\n'*}
[ "$status" = 200 ] || fail "the README's chat request answered $status: $body"
/usr/bin/python3 -c '
import json, sys
j = json.loads(sys.argv[1])
assert j["object"] == "chat.completion", j
m = j["choices"][0]["message"]
assert m["role"] == "assistant" and isinstance(m["content"], str) and m["content"], j
assert j["choices"][0]["finish_reason"] in ("stop", "length"), j
' "$body" || fail "not a chat completion: $body"
grep -q "no chat template.*'chatml'.*--chat-template" "$tmp/log" \
  || fail "no startup warning naming the fallback template and --chat-template"
echo "ok"
