#!/bin/bash
# The cost of snapshot history on a replica set: YCSB A and C (w:"majority") on a fresh
# 3-member set with minSnapshotHistoryWindowInSeconds 300 (the default) and 0, in turns.
#   bash scripts/history-ab.sh [ROUNDS]
# Prints ops/s, the primary's CPU ticks during each workload and its data directory's size.
set -u
B=${SHOAL:-$(dirname "$0")/../target/release/shoal}
DIR=${TMPDIR:-/tmp}/shoal-history-ab
PORT=${SHOAL_AB_PORT:-29400}
for round in $(seq "${1:-2}"); do
  for win in 300 0; do
    d=$DIR/w$win
    rm -rf "$d"
    "$B" cluster up --members 3 --port "$PORT" --dir "$d" --setParameter minSnapshotHistoryWindowInSeconds=$win >/dev/null 2>&1
    sleep 2
    pid=$(pgrep -f "bind_ip 127.0.0.1 --port $PORT" | head -1)
    url="mongodb://127.0.0.1:$PORT,127.0.0.2:$PORT,127.0.0.3:$PORT/ycsb?replicaSet=rs0"
    "$B" bench ycsb load -P workloada -p recordcount=100000 -p batchsize=100 -threads 8 --url "$url" --drop >/dev/null 2>&1
    for w in a c; do
      c0=$(awk '{print $14+$15}' "/proc/$pid/stat")
      out=$("$B" bench ycsb run -P "workload$w" -p recordcount=100000 -p operationcount=100000000 -p maxexecutiontime=20 -threads 8 --url "$url" 2>&1)
      c1=$(awk '{print $14+$15}' "/proc/$pid/stat")
      tput=$(echo "$out" | grep -m1 'OVERALL\], Throughput' | awk -F', ' '{printf "%d", $3}')
      echo "round $round window ${win}s workload $w: $tput ops/s, primary CPU ticks $((c1 - c0))"
    done
    echo "round $round window ${win}s: primary data directory $(du -sh "$d/m0" | cut -f1)"
    "$B" cluster down --dir "$d" >/dev/null 2>&1
  done
done
rm -rf "$DIR"
