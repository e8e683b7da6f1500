#!/usr/bin/env bash
# Prints the average run time of every current test of BUILD that took >= 2 s, costliest first,
# in CTest's cost-data format ("name runs seconds"), from BUILD's last ctest runs. The Makefile
# seeds a fresh build folder with it (tests/ctest_costs/) so that ctest -j orders tests by cost.
set -euo pipefail
build="${1:?usage: ctest_costs.sh BUILD}"
costs="$build/Testing/Temporary/CTestCostData.txt"
[ -f "$costs" ] || { echo "ctest_costs: no $costs (run the tests first)" >&2; exit 1; }
names="$(cd "$build" && ctest -N | sed -n 's/^ *Test *#[0-9]*: //p')"
awk 'NR == FNR { keep[$1] = 1; next } /^---/ { exit }
     NF == 3 && ($1 in keep) && $3 >= 2 { printf "%s 1 %.2f\n", $1, $3 }' \
  <(echo "$names") "$costs" | sort -k3 -rn
