#!/usr/bin/env bash
# The one command that runs every test: rustfmt and clippy, Rust (unit + integration against
# the real binary), pytest with pymongo, node:test with the Node driver, mongosh scripts, and
# the drivers' specification tests through pymongo's unified-format runner.
# Then each fuzz target briefly (scripts/fuzz.sh).
# Installs what is missing (idempotent, fast when already installed), prints each runner's
# summary, then one final line "N passed, N failed" over all runners. Exit non-zero on any failure.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
# SHOAL_RUST_SCOPE="-p shoal" limits the Rust run locally; CI runs the whole workspace.
RUST_SCOPE="${SHOAL_RUST_SCOPE:---workspace}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
SHOAL_BIN="$TARGET_DIR/debug/shoal"
export SHOAL_BIN
LOG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/shoal-test-logs.XXXXXX")"
PY_DIR="$ROOT/tests/compat/python"
NODE_DIR="$ROOT/tests/compat/node"
VENV="$ROOT/.venv"

TOTAL_PASSED=0
TOTAL_FAILED=0
SUMMARIES=()

log() { printf '\n==> %s\n' "$*"; }

# Add one runner's counts; a runner that crashed without a summary counts as one failure.
record() {
  local name="$1" passed="$2" failed="$3"
  TOTAL_PASSED=$((TOTAL_PASSED + passed))
  TOTAL_FAILED=$((TOTAL_FAILED + failed))
  SUMMARIES+=("[$name] $passed passed, $failed failed")
  printf '[%s] %s passed, %s failed\n' "$name" "$passed" "$failed"
}

sum_matches() { # sum_matches REGEX FILE: adds up the first capture group of every match
  grep -oE "$1" "$2" 2>/dev/null | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}'
}

# Servers under test hold 1000+ sockets; children inherit this.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || ulimit -n 65536 2>/dev/null || true

# ---------------------------------------------------------------- installs (idempotent)

ensure_python() {
  local want have
  want="$(sha256sum "$PY_DIR/requirements.txt" | cut -d' ' -f1)"
  have="$(cat "$VENV/.requirements.sha256" 2>/dev/null || true)"
  if [[ -x "$VENV/bin/python" && "$want" == "$have" ]]; then
    return 0
  fi
  log "installing python venv at .venv"
  if ! command -v python3 >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq python3 python3-venv >/dev/null
  fi
  if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV" 2>/dev/null || {
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && python3 -m venv "$VENV"
    } || return 1
  fi
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$PY_DIR/requirements.txt" || return 1
  echo "$want" >"$VENV/.requirements.sha256"
}

ensure_node() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    log "installing nodejs and npm"
    apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null || return 1
  fi
  local want have
  want="$(cat "$NODE_DIR/package.json" "$NODE_DIR/package-lock.json" 2>/dev/null | sha256sum | cut -d' ' -f1)"
  have="$(cat "$NODE_DIR/node_modules/.shoal-deps.sha256" 2>/dev/null || true)"
  if [[ -x "$NODE_DIR/node_modules/.bin/mongosh" && "$want" == "$have" ]]; then
    return 0
  fi
  log "installing npm packages in tests/compat/node"
  if [[ -f "$NODE_DIR/package-lock.json" ]]; then
    (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error) || return 1
  else
    (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error) || return 1
  fi
  echo "$want" >"$NODE_DIR/node_modules/.shoal-deps.sha256"
}

# The TLS tests make a throwaway CA with openssl (tests/compat/make_test_certs.sh).
ensure_openssl() {
  command -v openssl >/dev/null 2>&1 && return 0
  log "installing openssl"
  apt-get update -qq && apt-get install -y -qq openssl >/dev/null
}

PY_OK=1
NODE_OK=1
ensure_openssl || echo "openssl setup failed: the TLS tests will fail"
ensure_python || { echo "python setup failed"; PY_OK=0; }
ensure_node || { echo "node setup failed"; NODE_OK=0; }

# ---------------------------------------------------------------- build

log "cargo build -p shoal"
BUILD_OK=1
cargo build -p shoal 2>&1 | tail -n 40 || BUILD_OK=0
[[ -x "$SHOAL_BIN" ]] || BUILD_OK=0
if [[ $BUILD_OK -eq 0 ]]; then
  echo "build failed: $SHOAL_BIN missing"
fi

# ---------------------------------------------------------------- tidy

# rustfmt and clippy (with the workspace's lint table, warnings denied): one test each.
log "cargo fmt --check, cargo clippy"
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || echo "rustup could not add rustfmt and clippy"
fi
TIDY_PASSED=0
TIDY_FAILED=0
if cargo fmt --all --check >"$LOG_DIR/fmt.log" 2>&1; then
  TIDY_PASSED=$((TIDY_PASSED + 1))
else
  head -n 40 "$LOG_DIR/fmt.log"
  TIDY_FAILED=$((TIDY_FAILED + 1))
fi
if cargo clippy --workspace --all-targets -- -D warnings >"$LOG_DIR/clippy.log" 2>&1; then
  TIDY_PASSED=$((TIDY_PASSED + 1))
else
  grep -E -A8 '^(warning|error)' "$LOG_DIR/clippy.log" | head -n 80
  TIDY_FAILED=$((TIDY_FAILED + 1))
fi
record tidy "$TIDY_PASSED" "$TIDY_FAILED"

# ---------------------------------------------------------------- rust

log "rust tests (workspace)"
RUST_LOG_FILE="$LOG_DIR/rust.log"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run $RUST_SCOPE --no-fail-fast 2>&1 | tee "$RUST_LOG_FILE"
  summary="$(grep -E '^ *Summary .* tests? run:' "$RUST_LOG_FILE" | tail -n 1)"
  if [[ -n "$summary" ]]; then
    passed="$(echo "$summary" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)"
    failed=0
    for kind in failed 'timed out'; do
      n="$(echo "$summary" | grep -oE "[0-9]+ $kind" | grep -oE '[0-9]+' || true)"
      failed=$((failed + ${n:-0}))
    done
    record rust "${passed:-0}" "$failed"
  else
    record rust 0 1
  fi
else
  cargo test $RUST_SCOPE --no-fail-fast 2>&1 | tee "$RUST_LOG_FILE"
  passed="$(sum_matches 'test result: [a-zA-Z]+\. [0-9]+ passed' "$RUST_LOG_FILE")"
  failed="$(sum_matches '; [0-9]+ failed' "$RUST_LOG_FILE")"
  # A target that did not compile runs no tests: count it as a failure.
  if grep -q 'could not compile' "$RUST_LOG_FILE" || ! grep -q 'test result:' "$RUST_LOG_FILE"; then failed=$((failed + 1)); fi
  record rust "$passed" "$failed"
fi

# ---------------------------------------------------------------- python

log "pytest (pymongo)"
if [[ $PY_OK -eq 1 && $BUILD_OK -eq 1 ]]; then
  PY_LOG_FILE="$LOG_DIR/pytest.log"
  (cd "$PY_DIR" && "$VENV/bin/python" -m pytest -q -rfE -p no:cacheprovider .) 2>&1 | tee "$PY_LOG_FILE"
  last="$(grep -E '(passed|failed|error|no tests ran)' "$PY_LOG_FILE" | tail -n 1)"
  passed="$(echo "$last" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || true)"
  failed="$(echo "$last" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' || true)"
  errors="$(echo "$last" | grep -oE '[0-9]+ errors?' | grep -oE '[0-9]+' || true)"
  failed=$(( ${failed:-0} + ${errors:-0} ))
  passed=${passed:-0}
  if [[ $passed -eq 0 && $failed -eq 0 ]]; then failed=1; fi # nothing ran: that is a failure
  record pytest "$passed" "$failed"
else
  record pytest 0 1
fi

# ---------------------------------------------------------------- node driver

log "node:test (Node driver)"
if [[ $NODE_OK -eq 1 && $BUILD_OK -eq 1 ]]; then
  NODE_LOG_FILE="$LOG_DIR/node.log"
  (cd "$NODE_DIR" && node --test --test-reporter=tap test/*.test.mjs) 2>&1 | tee "$NODE_LOG_FILE"
  passed="$(grep -E '^# pass [0-9]+' "$NODE_LOG_FILE" | tail -n 1 | grep -oE '[0-9]+' || true)"
  failed="$(grep -E '^# fail [0-9]+' "$NODE_LOG_FILE" | tail -n 1 | grep -oE '[0-9]+' || true)"
  cancelled="$(grep -E '^# cancelled [0-9]+' "$NODE_LOG_FILE" | tail -n 1 | grep -oE '[0-9]+' || true)"
  if [[ -z "$passed" ]]; then
    record node 0 1
  else
    record node "$passed" $(( ${failed:-0} + ${cancelled:-0} ))
  fi
else
  record node 0 1
fi

# ---------------------------------------------------------------- mongosh

log "mongosh scripts"
if [[ $NODE_OK -eq 1 && $BUILD_OK -eq 1 ]]; then
  SH_LOG_FILE="$LOG_DIR/mongosh.log"
  (cd "$NODE_DIR" && node run-mongosh.mjs) 2>&1 | tee "$SH_LOG_FILE"
  line="$(grep -E '^mongosh: [0-9]+ passed, [0-9]+ failed' "$SH_LOG_FILE" | tail -n 1)"
  if [[ -z "$line" ]]; then
    record mongosh 0 1
  else
    record mongosh "$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+')" "$(echo "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')"
  fi
else
  record mongosh 0 1
fi

# ---------------------------------------------------------------- driver specifications

# The drivers' specification tests (unified format) through pymongo's own runner, against a
# standalone, a replica set and a router (scripts/spec-tests.sh); one count per topology.
log "driver specification tests (pymongo's unified-format runner)"
if [[ $BUILD_OK -eq 1 ]]; then
  SPEC_LOG_FILE="$LOG_DIR/spec.log"
  bash scripts/spec-tests.sh 2>&1 | tee "$SPEC_LOG_FILE"
  for topology in setup standalone replset router; do
    line="$(grep -E "^\[spec-$topology\] [0-9]+ passed, [0-9]+ failed" "$SPEC_LOG_FILE" | tail -n 1)"
    [[ -z "$line" ]] && { [[ $topology == setup ]] || record "spec-$topology" 0 1; continue; }
    record "spec-$topology" "$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+')" "$(echo "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')"
  done
else
  record spec 0 1
fi

# ---------------------------------------------------------------- fuzz

# Each fuzz target briefly, from its committed corpus (scripts/fuzz.sh); a target counts as
# one test. SHOAL_FUZZ_SECONDS sets the time per target.
log "fuzz targets"
FUZZ_LOG_FILE="$LOG_DIR/fuzz.log"
bash scripts/fuzz.sh "${SHOAL_FUZZ_SECONDS:-15}" 2>&1 | tee "$FUZZ_LOG_FILE"
passed="$(grep -cE '^fuzz [a-z_]+: .* no crash$' "$FUZZ_LOG_FILE" || true)"
failed="$(grep -cE '^fuzz [a-z_]+: FAILED' "$FUZZ_LOG_FILE" || true)"
if [[ ${passed:-0} -eq 0 && ${failed:-0} -eq 0 ]]; then failed=1; fi # the build failed: nothing ran
record fuzz "${passed:-0}" "${failed:-0}"

# ---------------------------------------------------------------- total

log "summary"
for s in "${SUMMARIES[@]}"; do echo "$s"; done
rm -rf "$LOG_DIR"
echo "$TOTAL_PASSED passed, $TOTAL_FAILED failed"
[[ $TOTAL_FAILED -eq 0 ]]
