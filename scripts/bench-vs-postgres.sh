#!/bin/bash
# Same-run comparison: shoal and PostgreSQL alternate (two rounds), each with a fresh load and
# the same client. Needs a release build and a local PostgreSQL with user/database bench
# (docs/benchmarks.md says how). Results: one file per target, round and workload in $OUT.
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
S=$ROOT/target/release/shoal; T=${T:-20}; OUT=${OUT:-/tmp/shoal-cmp}; DATA=${DATA:-/tmp/shoal-cmp-data}; mkdir -p $OUT
for r in 1 2; do
 for tgt in shoal pg; do
  if [ $tgt = shoal ]; then
    pkill -f "serve --port 27017"; sleep 0.5; rm -rf $DATA; mkdir -p $DATA
    nohup $S serve --port 27017 --dbpath $DATA > $OUT/server.log 2>&1 & sleep 1
    U=mongodb://127.0.0.1:27017/ycsb; IU=mongodb://127.0.0.1:27017/
  else
    U=postgresql://bench:bench@127.0.0.1:5432/bench; IU=$U
  fi
  $S bench ycsb load -P workloada -p recordcount=100000 -p batchsize=100 -threads 8 --url $U --drop > $OUT/$tgt-r$r-load.txt 2>&1; sleep 3
  for w in a b c; do
    $S bench ycsb run -P workload$w -p recordcount=100000 -p operationcount=10000000 -p maxexecutiontime=$T -threads 8 --url $U > $OUT/$tgt-r$r-$w.txt 2>&1
  done
  $S bench insert --url $IU --indexes 3 --workers 4 --batch-size 100 --run-seconds $T > $OUT/$tgt-r$r-insert.txt 2>&1
 done
done
pkill -f "serve --port 27017"
