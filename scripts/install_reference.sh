#!/usr/bin/env bash
# Installs llama.cpp as the independent reference of arbor's architecture and tokenizer tests
# (tests/reference/README.md), into tests/reference/.llama (ignored by git):
#   * the prebuilt CPU libllama of the npm package @node-llama-cpp/linux-x64 3.22.1
#     (llama.cpp de3ff81, one ggml CPU backend per ISA level; the best one loads at run time),
#   * llama.cpp's public headers, from the source bundle the npm package node-llama-cpp 3.22.1
#     ships (the same commit),
#   * tests/reference/llama_ref.cc compiled against them (.llama/llama_ref).
# Both tarballs are fetched with `npm pack` (no dependency tree) and checked against the SHA-256
# sums below. Idempotent: does nothing when .llama/llama_ref is current. Never fails the build
# (an offline machine can still build and serve): without npm or the registry it says so and
# exits 0, and the reference tests then fail, naming what is missing.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/tests/reference/.llama"
src="$root/tests/reference/llama_ref.cc"
version=3.22.1
declare -A sha256=(
  [node-llama-cpp-$version.tgz]=a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f
  [node-llama-cpp-linux-x64-$version.tgz]=0d953e1503d5ab4608d8ed5b739132308c81ac05ffeb760d2a7f30e08a9f90e0
)
stamp="$dest/.stamp"
want_stamp="$version $(sha256sum "$src" | cut -c1-16)"
if [ -x "$dest/llama_ref" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want_stamp" ]; then
  echo "install_reference: up to date ($dest)"
  exit 0
fi
fail() { echo "install_reference: $*; the llama.cpp reference tests will fail" >&2; exit 0; }
command -v npm >/dev/null 2>&1 || fail "npm not found"
command -v git >/dev/null 2>&1 || fail "git not found"
mkdir -p "$dest/pkg" || fail "cannot create $dest"
cd "$dest/pkg" || exit 0
for f in "${!sha256[@]}"; do
  if [ ! -f "$f" ] || ! echo "${sha256[$f]}  $f" | sha256sum -c --status; then
    rm -f "$f"
  fi
done
if [ ! -f "node-llama-cpp-$version.tgz" ] || [ ! -f "node-llama-cpp-linux-x64-$version.tgz" ]; then
  echo "install_reference: fetching node-llama-cpp $version and @node-llama-cpp/linux-x64 $version"
  npm pack --silent --pack-destination . "node-llama-cpp@$version" \
    "@node-llama-cpp/linux-x64@$version" >/dev/null 2>/tmp/arbor_reference_npm.log ||
    fail "npm pack failed (registry unreachable?), log: /tmp/arbor_reference_npm.log"
fi
for f in "${!sha256[@]}"; do
  echo "${sha256[$f]}  $f" | sha256sum -c --status || fail "$f does not match its pinned SHA-256"
done
rm -rf "$dest/lib" "$dest/src" "$dest/include"
mkdir -p "$dest/lib" "$dest/include"
tar -xzf "node-llama-cpp-linux-x64-$version.tgz" -C "$dest/lib" --strip-components=3 \
  package/bins/linux-x64 || fail "cannot unpack the linux-x64 binaries"
tar -xzf "node-llama-cpp-$version.tgz" package/llama/gitRelease.bundle ||
  fail "cannot unpack the llama.cpp source bundle"
git clone -q package/llama/gitRelease.bundle "$dest/src" 2>/dev/null ||
  fail "cannot clone the llama.cpp source bundle"
cp "$dest/src/include/llama.h" "$dest/src/ggml/include/"*.h "$dest/include/"
echo "install_reference: llama.cpp $(git -C "$dest/src" log -1 --format=%h) headers, prebuilt" \
     "libllama $version"
g++ -O1 -std=c++17 -I"$dest/include" "$src" -o "$dest/llama_ref" -L"$dest/lib" \
  -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -l:libggml-base.so -Wl,-rpath,"$dest/lib" \
  -DLLAMA_REF_LIBDIR="\"$dest/lib\"" || fail "cannot compile $src"
rm -rf "$dest/src" package
echo "$want_stamp" > "$stamp"
echo "install_reference: built $dest/llama_ref"
