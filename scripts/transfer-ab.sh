#!/bin/bash
# Two builds against each other on the transfer benchmark, in turns:
#   bash scripts/transfer-ab.sh OLD/shoal NEW/shoal [ROUNDS] [SECONDS]
# Each turn starts a fresh 3-member set from that build (`cluster up`), loads 100,000
# accounts, warms up for 5 s, then runs `bench transfer` (8 workers, w:"majority", on the
# primary) and prints transactions/s, the primary's and one secondary's CPU per transfer,
# and the machine's idle CPU. The new build's client drives both.
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=${3:-2} SECS=${4:-20}
PORT=${PORT:-29210}
URL="mongodb://127.0.0.1:$PORT/?directConnection=true&w=majority"
for round in $(seq 1 "$ROUNDS"); do
  for name in old new; do
    if [ "$name" = old ]; then BIN=$OLD; else BIN=$NEW; fi
    DIR=$(mktemp -d /tmp/shoal-transfer-ab.XXXXXX)
    "$BIN" cluster up --members 3 --dir "$DIR" --port "$PORT" >/dev/null
    P=$(pgrep -f "serve.*$DIR/m0"); S=$(pgrep -f "serve.*$DIR/m1")
    "$NEW" bench transfer --url "$URL" --accounts 100000 --workers 8 --run-seconds 5 >/dev/null 2>&1
    out=$("$NEW" bench transfer --url "$URL" --accounts 100000 --workers 8 --run-seconds "$SECS" --no-load \
      --watch-pid primary="$P" --watch-pid secondary="$S" 2>&1)
    echo "$name round $round: $(grep -o '[0-9]* transactions/s' <<<"$out") |" \
      "$(grep -o 'primary CPU: [0-9.]* us' <<<"$out") | $(grep -o 'secondary CPU: [0-9.]* us' <<<"$out") |" \
      "$(grep -o 'idle: [0-9]*%' <<<"$out")"
    "$BIN" cluster down --dir "$DIR" >/dev/null 2>&1 || true
    rm -rf "$DIR"
  done
done
