#!/usr/bin/env bash
# Run the fuzz targets in fuzz/ with libFuzzer on stable Rust, without cargo-fuzz: the same
# coverage instrumentation cargo-fuzz uses, applied by RUSTFLAGS.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]   each target for SECONDS (default 20), all by default
#
# Each target starts from its committed corpus (fuzz/corpus/TARGET, read only) and writes
# what it finds new to a scratch directory; a crash's input lands in fuzz/artifacts/TARGET/
# and the script exits non-zero. Add a finding to the corpus with
#   cp <input> fuzz/corpus/TARGET/
# SHOAL_FUZZ_KEEP=1 merges each run's new inputs into the committed corpus (libFuzzer's
# -merge=1 keeps only inputs that add coverage).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT/fuzz"
SECONDS_EACH="${1:-20}"
shift || true
TRIPLE="$(rustc -vV | sed -n 's/^host: //p')"
ALL_TARGETS=(wire_message bson_document query_filter update aggregate index_key)
TARGETS=("${@:-${ALL_TARGETS[@]}}")

# --target keeps the instrumentation off build scripts and proc macros.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
if ! cargo build --release --locked --target "$TRIPLE" --bins 2>&1 | tail -n 5; then
  echo "fuzz: build failed"
  exit 1
fi
BIN_DIR="$ROOT/fuzz/target/$TRIPLE/release"

failed=0
for t in "${TARGETS[@]}"; do
  scratch="$(mktemp -d "${TMPDIR:-/tmp}/shoal-fuzz-$t.XXXXXX")"
  mkdir -p "corpus/$t" "artifacts/$t"
  # -rss_limit_mb: a target that needs more than this for inputs of at most 4 KB has a bug.
  "$BIN_DIR/$t" "$scratch" "corpus/$t" -max_total_time="$SECONDS_EACH" -max_len=4096 -rss_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$scratch.log" 2>&1
  rc=$?
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch.log")"
  cov="$(grep -oE 'cov: [0-9]+' "$scratch.log" | tail -1)"
  if [[ $rc -ne 0 ]]; then
    echo "fuzz $t: FAILED after ${runs:-?} runs ($cov); log $scratch.log"
    grep -E "panicked|ERROR|SUMMARY|Test unit written" "$scratch.log" | head -n 20
    failed=1
    continue
  fi
  echo "fuzz $t: ${runs:-?} runs in ${SECONDS_EACH}s, $cov, no crash"
  if [[ "${SHOAL_FUZZ_KEEP:-0}" == 1 ]]; then
    "$BIN_DIR/$t" -merge=1 "corpus/$t" "$scratch" >/dev/null 2>&1
  fi
  rm -rf "$scratch" "$scratch.log"
done
exit $failed
