#!/bin/bash
# Interleaved A/B of two 3-member sets started side by side, e.g.
#   /path/to/shoal-a cluster up --members 3 --port 27017 --dir /tmp/a
#   /path/to/shoal-b cluster up --members 3 --port 27018 --dir /tmp/b
#   ROUNDS=3 SECS=6 scripts/replset-ab.sh 27017 27018
# Each round runs YCSB inserts (8 threads) at w:1 and w:"majority" on each set and prints
# throughput with the machine's busy, idle and stolen CPU ticks (/proc/stat) during the run.
set -euo pipefail
SHOAL=${SHOAL:-$(dirname "$0")/../target/release/shoal}
SECS=${SECS:-6}
run() {
  local w=$1 port=$2
  local url="mongodb://127.0.0.1:$port,127.0.0.2:$port,127.0.0.3:$port/ab$RANDOM?replicaSet=rs0&w=$w"
  local s0 s1 out
  s0=($(head -1 /proc/stat))
  out=$("$SHOAL" bench ycsb load -P workloada -p recordcount=2000000 -p insertcount=2000000 -threads 8 -p maxexecutiontime="$SECS" --url "$url" --drop 2>&1)
  s1=($(head -1 /proc/stat))
  local thr busy idle steal
  thr=$(grep 'OVERALL], Throughput' <<<"$out" | awk -F', ' '{printf "%.0f", $3}')
  busy=$(( (s1[1]+s1[3]+s1[6]+s1[7]) - (s0[1]+s0[3]+s0[6]+s0[7]) ))
  idle=$(( s1[4]-s0[4] + s1[5]-s0[5] ))
  steal=$(( s1[8]-s0[8] ))
  echo "port=$port w=$w inserts/s=$thr busy=$busy idle=$idle steal=$steal (ticks)"
}
for round in $(seq 1 "${ROUNDS:-3}"); do
  echo "round $round"
  for port in "$@"; do
    run 1 "$port"
    run majority "$port"
  done
done
