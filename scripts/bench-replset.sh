#!/bin/bash
# Same-run comparison of write concerns: a 3-member replica set (chaining on, default
# settings) under YCSB load with w:1 and w:"majority" (two rounds), then a standalone with the
# same client. Needs a release build and pymongo (PY, default python3) for replSetInitiate.
# Every member runs on this machine, sharing its cores with the client.
set -e
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B=$ROOT/target/release/shoal; PY=${PY:-python3}; DATA=${DATA:-/tmp/shoal-bench-replset}; N=${N:-30000}
rm -rf $DATA && mkdir -p $DATA/d1 $DATA/d2 $DATA/d3 $DATA/s
for i in 1 2 3; do $B serve --port 2720$i --dbpath $DATA/d$i --replSet rs0 --wiredTigerCacheSizeGB 0.5 > $DATA/log$i 2>&1 & done
sleep 1
$PY -c "
import pymongo, time
c = pymongo.MongoClient('127.0.0.1', 27201, directConnection=True)
c.admin.command('replSetInitiate', {'_id': 'rs0', 'version': 1, 'members': [{'_id': i, 'host': f'127.0.0.1:2720{i+1}'} for i in range(3)]})
time.sleep(4)"
U="mongodb://127.0.0.1:27201,127.0.0.1:27202,127.0.0.1:27203/?replicaSet=rs0"
for round in 1 2; do
  for w in 1 majority; do
    echo "rs3 w=$w round $round: $($B bench ycsb load -P workloada -p recordcount=$N -threads 8 --drop --url "$U&w=$w" 2>&1 | grep -E 'Throughput|INSERT\], Average' | tr '\n' ' ')"
  done
done
pkill -f "serve --port 2720" || true
sleep 1
$B serve --port 27301 --dbpath $DATA/s --wiredTigerCacheSizeGB 0.5 > $DATA/logs 2>&1 &
sleep 1
for round in 1 2; do
  echo "standalone round $round: $($B bench ycsb load -P workloada -p recordcount=$N -threads 8 --drop --url "mongodb://127.0.0.1:27301/" 2>&1 | grep -E 'Throughput|INSERT\], Average' | tr '\n' ' ')"
done
pkill -f "serve --port 27301" || true
