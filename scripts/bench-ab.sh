#!/usr/bin/env bash
# Compare two shoal builds on YCSB A and C in one run: bash scripts/bench-ab.sh OLD_BIN NEW_BIN [ROUNDS] [SECONDS]
# Each round starts OLD then NEW on a fresh data directory, loads 100,000 records and runs
# workloads A and C for SECONDS each with 8 threads; NEW's client drives both, so only the
# server differs. Prints ops/s, read latency and the server's CPU per operation.
set -u
OLD=$1
NEW=$2
ROUNDS=${3:-2}
SECS=${4:-20}
PORT=${SHOAL_AB_PORT:-27991}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for r in $(seq "$ROUNDS"); do
  for which in old new; do
    bin=$OLD
    [ "$which" = new ] && bin=$NEW
    db=$(mktemp -d "${TMPDIR:-/tmp}/shoal-ab.XXXXXX")
    "$bin" serve --port "$PORT" --dbpath "$db" >"$db.log" 2>&1 &
    pid=$!
    sleep 2
    "$NEW" bench ycsb load -P workloada -p recordcount=100000 -p batchsize=100 -threads 8 --url "mongodb://127.0.0.1:$PORT/ycsb" --drop >/dev/null 2>&1
    for w in a c; do
      c0=$(cpu_ticks "$pid")
      t0=$(date +%s.%N)
      out=$("$NEW" bench ycsb run -P "workload$w" -p recordcount=100000 -p operationcount=100000000 -p maxexecutiontime="$SECS" -threads 8 --url "mongodb://127.0.0.1:$PORT/ycsb" 2>&1)
      c1=$(cpu_ticks "$pid")
      t1=$(date +%s.%N)
      field() { echo "$out" | grep -m1 "$1" | awk -F', ' '{print $3}'; }
      tput=$(field '\[OVERALL\], Throughput')
      ops=$(echo "$tput $t0 $t1" | awk '{printf "%d", $1 * ($3 - $2)}')
      # Clock ticks are 10 ms: µs per operation = ticks * 10,000 / operations.
      cpu=$(echo "$c0 $c1 $ops" | awk '{ if ($3 > 0) printf "%.1f", ($2 - $1) * 10000 / $3; else print "-" }')
      echo "round $r $which workload$w ops/s=$tput read_avg_us=$(field '\[READ\], AverageLatency') read_p99_us=$(field '\[READ\], 99thPercentileLatency') server_cpu_us_per_op=$cpu"
    done
    kill "$pid"
    wait "$pid" 2>/dev/null
    rm -rf "$db" "$db.log"
  done
done
