# Shared by the benchmark scripts (source it): start an `arbor serve` and wait until it answers.
#
#   start_arbor_serve DIR NAME ARBOR [serve args...]
#     runs ARBOR --log-level info serve ARGS --host 127.0.0.1 --port 0 --port-file DIR/NAME.port
#     in the background with its log in DIR/NAME.log, waits (up to 300 s: a 17 GB mixture packs
#     and measures its step costs for 100 s on 2 cores) for /health, and sets
#     server_pid and server_url. Exits the script, naming the log, when the server dies first.
#   stop_arbor_serve     SIGTERM server_pid and wait for it.
start_arbor_serve() {
  local dir=$1 name=$2 arbor=$3; shift 3
  local pf="$dir/$name.port"
  rm -f "$pf"
  "$arbor" --log-level info serve --host 127.0.0.1 --port 0 --port-file "$pf" "$@" \
    >"$dir/$name.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 3000); do
    [ -s "$pf" ] && curl -sf "http://127.0.0.1:$(cat "$pf")/health" >/dev/null 2>&1 && break
    kill -0 "$server_pid" 2>/dev/null || { echo "error: server $name died; see $dir/$name.log" >&2; exit 1; }
    sleep 0.1
  done
  server_url="http://127.0.0.1:$(cat "$pf")"
}

stop_arbor_serve() {
  kill -TERM "$server_pid"
  wait "$server_pid" 2>/dev/null || true
}

# ratio_cells CONFIG BASE ROUNDS: two Markdown table cells from the caller's associative array
# tps (keys NAME_ROUND, tokens/s): "C / B, C / B, ..." per round, then the median of the
# per-round ratios C / B in bold.
ratio_cells() {
  local cfg=$1 base=$2 rounds=$3 vals="" ratios="" r
  for r in $(seq 1 "$rounds"); do
    vals+="$(printf '%.1f / %.1f' "${tps[${cfg}_$r]}" "${tps[${base}_$r]}"), "
    ratios+="$(python3 -c "print(${tps[${cfg}_$r]} / ${tps[${base}_$r]})") "
  done
  # shellcheck disable=SC2086
  echo "${vals%, } | **$(python3 -c "import statistics,sys; print('%.2f' % statistics.median(map(float, sys.argv[1:])))" $ratios)**"
}
