#!/usr/bin/env bash
# The drivers' specification tests in the unified format (mongodb/specifications), run by an
# official driver's runner: pymongo's test suite, from its pinned source distribution, which
# carries the runner (test/unified_format.py) and the specification files. Each topology is a
# real shoal: a standalone, a 3-member replica set and a router in front of one shard.
#
#   scripts/spec-tests.sh [standalone|replset|router ...]   (default: all three)
#
# Prints "[spec-<topology>] N passed, N failed" for each. Tests of features shoal does not
# have are deselected by tests/spec/absent.txt (and absent-TOPOLOGY.txt), each line with its
# reason.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYMONGO_VERSION=4.10.1
PYMONGO_SHA256=a9de02be53b6bb98efe0b9eda84ffa1ec027fcb23a2de62c4f941d9a2f2f3330
CACHE="$ROOT/.cache/spec"
SRC="$CACHE/pymongo-$PYMONGO_VERSION"
VENV="$ROOT/.venv-spec"
SHOAL_BIN="${SHOAL_BIN:-$ROOT/target/debug/shoal}"
PORT_BASE="${SHOAL_SPEC_PORT:-28100}"
# The specification suites, as pymongo's test modules that load them.
SUITES=(
  test/test_crud_unified.py
  test/test_retryable_reads_unified.py
  test/test_retryable_writes_unified.py
  test/test_sessions_unified.py
  test/test_command_logging.py
  test/test_command_monitoring.py
  test/test_connection_logging.py
  test/test_connection_monitoring.py
  test/test_discovery_and_monitoring.py
  test/test_csot.py
  test/test_versioned_api.py
  test/test_transactions_unified.py
  test/test_transactions.py
  test/test_change_stream.py
)

ensure_runner() {
  mkdir -p "$CACHE"
  local tarball="$CACHE/pymongo-$PYMONGO_VERSION.tar.gz"
  if [[ ! -f "$tarball" ]] || ! echo "$PYMONGO_SHA256  $tarball" | sha256sum -c --quiet 2>/dev/null; then
    rm -f "$tarball"
    python3 -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps "pymongo==$PYMONGO_VERSION" -d "$CACHE" || return 1
    echo "$PYMONGO_SHA256  $tarball" | sha256sum -c --quiet || return 1
  fi
  [[ -f "$SRC/test/unified_format.py" ]] || tar -xzf "$tarball" -C "$CACHE" || return 1
  if [[ ! -x "$VENV/bin/python" || ! -f "$VENV/.pymongo-$PYMONGO_VERSION" ]]; then
    rm -rf "$VENV"
    python3 -m venv "$VENV" || return 1
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$tarball" "pytest==8.4.2" "pytest-asyncio==0.25.3" || return 1
    touch "$VENV/.pymongo-$PYMONGO_VERSION"
  fi
}

# pytest's --deselect for each test id in absent.txt, and in absent-TOPOLOGY.txt for what one
# topology lacks (text after '#' is the reason).
deselects() { # deselects TOPOLOGY
  cat "$ROOT/tests/spec/absent.txt" "$ROOT/tests/spec/absent-$1.txt" 2>/dev/null | grep -vE '^\s*(#|$)' | sed 's/\s*#.*$//' | while read -r id; do
    printf -- '--deselect=%s\n' "$id"
  done
}

DIRS=()
cleanup() {
  for d in "${DIRS[@]}"; do
    if [[ -f "$d/routers.pid" ]]; then xargs kill <"$d/routers.pid" 2>/dev/null; fi
    if [[ -f "$d/cluster.pids" ]]; then "$SHOAL_BIN" cluster down --dir "$d" >/dev/null 2>&1; fi
    if [[ -f "$d/serve.pid" ]]; then kill "$(cat "$d/serve.pid")" 2>/dev/null; fi
    rm -rf "$d"
  done
}
trap cleanup EXIT

wait_port() { # wait_port HOST PORT
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

run_topology() {
  local topology="$1" port dir
  dir="$(mktemp -d "${TMPDIR:-/tmp}/shoal-spec-$topology.XXXXXX")"
  DIRS+=("$dir")
  case "$topology" in
    standalone)
      port=$PORT_BASE
      "$SHOAL_BIN" serve --port "$port" --dbpath "$dir/db" --setParameter enableTestCommands=1 >"$dir/serve.log" 2>&1 &
      echo $! >"$dir/serve.pid"
      wait_port 127.0.0.1 "$port" || { echo "[spec-$topology] the server did not start"; tail "$dir/serve.log"; return 1; }
      ;;
    replset)
      port=$((PORT_BASE + 10))
      "$SHOAL_BIN" cluster up --members 3 --port "$port" --dir "$dir" --setParameter enableTestCommands=1 >"$dir/up.log" 2>&1 \
        || { echo "[spec-$topology] the set did not start"; tail "$dir/up.log"; return 1; }
      ;;
    router)
      # A cluster of one shard, and two more routers on adjacent ports, as the runner looks
      # for a second router on the next port (useMultipleMongoses).
      local cluster_port=$((PORT_BASE + 30))
      port=$((PORT_BASE + 20))
      "$SHOAL_BIN" cluster up --shards 1 --port "$cluster_port" --dir "$dir" --setParameter enableTestCommands=1 >"$dir/up.log" 2>&1 \
        || { echo "[spec-$topology] the cluster did not start"; tail "$dir/up.log"; return 1; }
      for p in "$port" $((port + 1)); do
        "$SHOAL_BIN" router --configdb "cfg/127.0.0.1:$((cluster_port + 1))" --port "$p" --setParameter enableTestCommands=1 >"$dir/router-$p.log" 2>&1 &
        echo $! >>"$dir/routers.pid"
        wait_port 127.0.0.1 "$p" || { echo "[spec-$topology] a router did not start"; tail "$dir/router-$p.log"; return 1; }
      done
      ;;
  esac
  local out="$dir/pytest.log"
  mapfile -t skip < <(deselects "$topology")
  (cd "$SRC" && DB_IP=127.0.0.1 DB_PORT="$port" "$VENV/bin/python" -m pytest -q -rfE -p no:cacheprovider \
    -o addopts="" "${skip[@]}" "${SUITES[@]}") >"$out" 2>&1
  grep -E '^(FAILED|ERROR) ' "$out" | sed "s/^/[spec-$topology] /"
  local last passed failed errors
  last="$(grep -E '[0-9]+ (passed|failed)' "$out" | tail -n 1)"
  passed="$(echo "$last" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || true)"
  failed="$(echo "$last" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' || true)"
  errors="$(echo "$last" | grep -oE '[0-9]+ errors?' | grep -oE '[0-9]+' || true)"
  failed=$(( ${failed:-0} + ${errors:-0} ))
  if [[ -z "$last" ]]; then tail -n 30 "$out"; failed=1; fi
  echo "[spec-$topology] ${passed:-0} passed, $failed failed ($(grep -oE '[0-9]+ skipped' <<<"$last" || echo '0 skipped'), $(grep -oE '[0-9]+ deselected' <<<"$last" || echo '0 deselected'))"
  cleanup_one "$dir"
}

cleanup_one() {
  local d="$1"
  if [[ -f "$d/routers.pid" ]]; then
    while read -r pid; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done <"$d/routers.pid"
    rm -f "$d/routers.pid"
  fi
  if [[ -f "$d/cluster.pids" ]]; then "$SHOAL_BIN" cluster down --dir "$d" >/dev/null 2>&1; fi
  if [[ -f "$d/serve.pid" ]]; then kill "$(cat "$d/serve.pid")" 2>/dev/null; wait "$(cat "$d/serve.pid")" 2>/dev/null; fi
}

ensure_runner || { echo "[spec-setup] 0 passed, 1 failed (could not install pymongo $PYMONGO_VERSION's test suite)"; exit 1; }
topologies=("$@")
[[ ${#topologies[@]} -eq 0 ]] && topologies=(standalone replset router)
for t in "${topologies[@]}"; do
  run_topology "$t"
done
