#!/usr/bin/env bash
# Installs the JavaScript test dependencies (the official `openai` and `@anthropic-ai/sdk` npm
# clients, LangChain, @huggingface/inference, pinned in tests/server/js/package-lock.json;
# @anthropic-ai/sdk at 0.41.0, the last release that supports Node 18, Debian 12's) into
# tests/server/js/node_modules.
# Idempotent: does nothing when node_modules already matches the lock file. Never fails the
# build (an offline machine can still build and serve): without node/npm or without the registry
# it says so and exits 0, and the JS e2e tests (ServerJs.*) then fail, naming what is missing.
set -uo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)/tests/server/js"
cd "$dir" || exit 0
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "install_js_deps: node/npm not found; the openai-client e2e test will fail" >&2
  exit 0
fi
stamp=node_modules/.arbor-lock-stamp
if [ -f "$stamp" ] && cmp -s package-lock.json "$stamp"; then
  echo "install_js_deps: up to date ($dir/node_modules)"
  exit 0
fi
if npm ci --no-audit --no-fund --loglevel=error >/tmp/arbor_npm_ci.log 2>&1; then
  cp package-lock.json "$stamp"
  echo "install_js_deps: installed openai $(node -p "require('./node_modules/openai/package.json').version" 2>/dev/null || echo '?') and @anthropic-ai/sdk $(node -p "require('./node_modules/@anthropic-ai/sdk/package.json').version" 2>/dev/null || echo '?') into $dir/node_modules"
else
  echo "install_js_deps: npm ci failed (registry unreachable or offline?); the openai-client" \
       "e2e test will fail. Log: /tmp/arbor_npm_ci.log" >&2
  tail -n 5 /tmp/arbor_npm_ci.log >&2
fi
exit 0
