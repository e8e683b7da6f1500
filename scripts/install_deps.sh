#!/usr/bin/env bash
# Installs the Debian packages arbor needs, and only the missing ones (idempotent).
# Usage: scripts/install_deps.sh [--tests]
#   (none)    what building and serving need (`make serve`)
#   --tests   also what the tests and benchmarks need (`make test`, `make bench`): GoogleTest,
#             Google Benchmark, curl, numpy, jinja2, gnuplot, chromium, node and npm
set -euo pipefail

with_tests=0
case "${1:-}" in
  "") ;;
  --tests) with_tests=1 ;;
  *) echo "usage: $0 [--tests]" >&2; exit 2 ;;
esac

packages=(
  build-essential cmake ninja-build pkg-config
  libcli11-dev nlohmann-json3-dev libxxhash-dev libpcre2-dev libboost-dev
  # Tensor parallelism across hosts (src/collective/gloo_collective.h); without it the build
  # still succeeds and GlooCollective::connect says what is missing.
  libgloo-dev
  # Model shards over gRPC (src/shard, docs/shards.md): the library, and protoc with its gRPC
  # plugin, which generate the protocol's code from src/shard/shard.proto at build time.
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
)

if [ "$with_tests" = 1 ]; then
  packages+=(
    libgtest-dev libgmock-dev libbenchmark-dev
    curl gnuplot-nox
    # tests/model/inflate_test.cc compares `synth --inflate` with shared/tools/inflate_gguf.py,
    # which runs on /usr/bin/python3 with numpy.
    python3-numpy
    # tests/chat/template_reference_test.cc renders the chat templates of shared/templates with
    # Python's jinja2 (tests/chat/render_chat_reference.py) as the reference for arbor's engine.
    python3-jinja2
    # tests/server/server_web_browser_test.cc drives the web page in headless Chromium through
    # the DevTools protocol (tests/server/web/browser_test.mjs).
    chromium
  )
  # node and npm run the official `openai` client in the end-to-end tests. Debian's packages are
  # installed only when the commands are absent (a NodeSource nodejs already bundles npm).
  command -v node >/dev/null 2>&1 || packages+=(nodejs)
  command -v npm >/dev/null 2>&1 || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} Debian packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
