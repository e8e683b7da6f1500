#!/usr/bin/env bash
# Runs a command and prints how long it took, so a `make test` log (CI's) shows where the time
# went: "[make test] release build: 1234 s".
#
#   scripts/timed.sh LABEL COMMAND [ARG...]
#
# The command's exit status is the script's.
set -uo pipefail
label=${1:?usage: scripts/timed.sh LABEL COMMAND [ARG...]}
shift
start=$(date +%s)
echo "[make test] $label: started $(date -u '+%H:%M:%S UTC')"
"$@"
rc=$?
echo "[make test] $label: $(( $(date +%s) - start )) s (exit $rc)"
exit $rc
