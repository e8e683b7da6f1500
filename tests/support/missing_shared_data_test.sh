#!/usr/bin/env bash
# Runs a test executable that needs shared data with ARBOR_SHARED_DIR at an empty folder and
# CI=true: it must fail (a skip would count as a pass in CTest), name every expected missing file
# by its full path, and skip nothing.
# Usage: missing_shared_data_test.sh TEST_EXECUTABLE GTEST_FILTER REL_PATH...
set -u
bin=$1
filter=$2
shift 2
empty=$(mktemp -d "${TMPDIR:-/tmp}/arbor_empty_shared_XXXXXX")
trap 'rm -rf "$empty"' EXIT
out=$(ARBOR_SHARED_DIR="$empty" CI=true "$bin" --gtest_filter="$filter" 2>&1)
rc=$?
fail() {
  echo "FAIL: $*"
  echo "---- output of $bin ----"
  echo "$out"
  exit 1
}
[ "$rc" -ne 0 ] || fail "$bin exited 0 with an empty shared folder"
for rel in "$@"; do
  grep -qF "shared test data missing: $empty/$rel" <<<"$out" || fail "the output does not name $empty/$rel"
done
! grep -q "SKIPPED" <<<"$out" || fail "a test skipped instead of failing"
grep -q "ARBOR_SHARED_DIR" <<<"$out" || fail "the output does not say how to point ARBOR_SHARED_DIR at the data"
echo "ok: $(basename "$bin") exited $rc and named $# missing files under $empty"
