#!/usr/bin/env bash
# `make serve` installs and builds only what serving needs; `make test` the test-only rest.
# Runs scripts/install_deps.sh with dpkg-query, apt-get and sudo replaced by shims (every package
# missing, the install command recorded), and `make -n` for what the targets would run.
#   serve_deps_test.sh <source dir>
set -euo pipefail
root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
printf '#!/bin/sh\nexit 1\n' > "$tmp/bin/dpkg-query"
printf '#!/bin/sh\necho "$@" >> "%s/apt.log"\n' "$tmp" > "$tmp/bin/apt-get"
printf '#!/bin/sh\nexec "$@"\n' > "$tmp/bin/sudo"
chmod +x "$tmp/bin/"*
fail() { echo "FAIL: $*"; exit 1; }
test_only=(libgtest-dev libgmock-dev libbenchmark-dev python3-numpy gnuplot-nox curl chromium)

PATH="$tmp/bin:$PATH" bash "$root/scripts/install_deps.sh" > /dev/null
install=$(grep '^install ' "$tmp/apt.log") || fail "install_deps.sh installed nothing"
for p in "${test_only[@]}"; do
  grep -qw -- "$p" <<< "$install" && fail "install_deps.sh (make serve) installs $p: $install"
done
for p in cmake ninja-build libboost-dev libcli11-dev; do
  grep -qw -- "$p" <<< "$install" || fail "install_deps.sh misses $p: $install"
done

rm "$tmp/apt.log"
PATH="$tmp/bin:$PATH" bash "$root/scripts/install_deps.sh" --tests > /dev/null
install=$(grep '^install ' "$tmp/apt.log") || fail "install_deps.sh --tests installed nothing"
for p in "${test_only[@]}" cmake; do
  grep -qw -- "$p" <<< "$install" || fail "install_deps.sh --tests misses $p: $install"
done

serve=$(make -C "$root" -n serve BUILD="$tmp/no-build")
grep -q -- '--tests' <<< "$serve" && fail "make serve installs the test dependencies: $serve"
grep -q 'install_js_deps' <<< "$serve" && fail "make serve installs the npm packages: $serve"
grep -q 'ARBOR_BUILD_TESTS=OFF' <<< "$serve" || fail "make serve configures the tests: $serve"
grep -q -- '--target arbor' <<< "$serve" || fail "make serve builds more than arbor: $serve"
tests=$(make -C "$root" -n test-release BUILD="$tmp/no-build")
grep -q 'install_deps.sh --tests' <<< "$tests" || fail "make test skips the test deps: $tests"
grep -q 'install_js_deps' <<< "$tests" || fail "make test skips the npm packages: $tests"
echo "ok"
