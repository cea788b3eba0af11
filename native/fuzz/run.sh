#!/usr/bin/env bash
# Builds the libFuzzer targets of native/fuzz/ (STATECORE_FUZZ: clang, ASan + UBSan) into
# build/fuzz and runs each over a temporary copy of its corpus (native/fuzz/corpus/<target>/),
# so the repository's corpus never grows by itself. Fails on any crash, leak, timeout or
# sanitizer report, and says where the input that caused it is.
#
#   native/fuzz/run.sh                        # every target 30 s, one after the other
#   native/fuzz/run.sh --jobs 2               # the same, two targets at a time (what CI runs)
#   native/fuzz/run.sh --seconds 1800 bulk_load
#   native/fuzz/run.sh --replay               # every corpus file once (seeds and findings)
#
# CC / CXX choose the compilers (default clang-14 / clang++-14); CMAKE_ARGS adds configure arguments.
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds=30
replay=0
jobs=1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --replay) replay=1; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for src in native/fuzz/fuzz_*.cpp; do
    name=$(basename "$src" .cpp)
    targets+=("${name#fuzz_}")
  done
fi

# -O1 -g1: what libFuzzer's documentation builds with, and reports name files and lines.
# CMAKE_ARGS (word-split) adds configure arguments, e.g. a generator.
# shellcheck disable=SC2086
CC=${CC:-clang-14} CXX=${CXX:-clang++-14} cmake -S . -B build/fuzz -DSTATECORE_FUZZ=ON \
  -DSTATECORE_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  ${CMAKE_ARGS:-} >/dev/null
# Only the fuzz targets asked for (they link the core, not the batch kernels of statecore_native,
# the largest translation units).
for t in "${targets[@]}"; do
  if [ ! -f "native/fuzz/fuzz_$t.cpp" ]; then
    echo "no fuzz target $t (native/fuzz/fuzz_$t.cpp)" >&2
    exit 2
  fi
done
cmake --build build/fuzz -j2 --target "${targets[@]/#/fuzz_}" >/dev/null

# Fuzzes target $1 (binary $2, corpus $3) in the work directory $4: its report goes to
# $4/report, its exit status to $4/status.
fuzz_one() {
  local t=$1 bin=$2 corpus=$3 work=$4 status=0
  mkdir "$work/corpus"
  if [ -d "$corpus" ]; then cp "$corpus"/* "$work/corpus/"; fi
  {
    echo "== $t: ${seconds} s from $(ls "$work/corpus" | wc -l) inputs (work directory $work)"
    "$bin" "$work/corpus" -seed=1 -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -print_funcs=0 -artifact_prefix="$work/" >"$work/log" 2>&1 \
      || status=$?
    grep -E '^#[0-9]+[[:space:]]+DONE' "$work/log" | tail -n 1 || true
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$work/log" \
      || true
    if [ "$status" != 0 ]; then
      grep -v -E '^(#[0-9]+|INFO:|MS:|\s*NEW_FUNC)' "$work/log" | tail -n 60
      echo "!! $t failed (exit $status); input(s): $(ls "$work" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | sed "s|^|$work/|" | tr '\n' ' ')"
    fi
  } >"$work/report"
  echo "$status" >"$work/status"
}

failed=()
works=()
for t in "${targets[@]}"; do
  bin=build/fuzz/native/fuzz/fuzz_$t
  corpus=native/fuzz/corpus/$t
  if [ ! -x "$bin" ]; then
    echo "no fuzz target $t (native/fuzz/fuzz_$t.cpp)" >&2
    exit 2
  fi
  if [ "$replay" = 1 ]; then
    echo "== $t: replaying $(ls "$corpus" | wc -l) inputs"
    if ! "$bin" "$corpus"/* >"build/fuzz/replay-$t.log" 2>&1; then
      tail -n 40 "build/fuzz/replay-$t.log"
      failed+=("$t")
    fi
    continue
  fi
  # Each target is one process (libFuzzer's own -jobs would fuzz one target several times):
  # up to $jobs of them run at once, each reporting into its work directory.
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  work=$(mktemp -d "${TMPDIR:-/tmp}/statecore-native-fuzz-$t-XXXXXX")
  works+=("$t:$work")
  fuzz_one "$t" "$bin" "$corpus" "$work" &
done
wait

for tw in ${works[@]+"${works[@]}"}; do
  t=${tw%%:*}
  work=${tw#*:}
  cat "$work/report"
  if [ "$(cat "$work/status" 2>/dev/null || echo missing)" != 0 ]; then
    failed+=("$t")
  else
    rm -rf "$work"
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "native fuzzing failed: ${failed[*]}" >&2
  exit 1
fi
echo "native fuzzing passed: ${targets[*]}"
