#!/usr/bin/env bash
# Builds castor's libFuzzer targets (tests/fuzz/) with Debian's clang and runs
# each for a given time, then prints executions and findings per target.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]      (default 60 s; all targets)
#   tools/fuzz.sh --list
#
# Targets: onnx_model model_pipeline npy npz idx checkpoint policy_json.
# The build goes to build-fuzz/ (CASTOR_FUZZ_BUILD_DIR overrides it):
# clang, -fsanitize=fuzzer,address,undefined, CUDA and benchmarks off.
# Each target fuzzes a working copy of its seed corpus in
# build-fuzz/fuzz-runs/TARGET/corpus (new inputs stay there, the repository's
# corpus is not touched) with its dictionary from tests/fuzz/dict/; crashes,
# leaks, timeouts and OOMs land in build-fuzz/fuzz-runs/TARGET/findings/.
# A finding is fixed in castor, then copied to tests/fuzz/corpus/TARGET/ as
# regression-<what> (ctest replays it from then on).
# Exit status: 0 when no target found anything, 1 otherwise, 2 on bad usage.
# CASTOR_FUZZ_JOBS (default 1) runs that many fuzzing processes per target
# (libFuzzer -fork); CASTOR_FUZZ_EXTRA passes further libFuzzer flags.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_TARGETS=(onnx_model model_pipeline npy npz idx checkpoint policy_json)
declare -A DICT=([onnx_model]=onnx [model_pipeline]=onnx [checkpoint]=onnx [npy]=npy
                 [npz]=npz [idx]=idx [policy_json]=policy_json)

if [[ "${1:-}" == "--list" ]]; then printf '%s\n' "${ALL_TARGETS[@]}"; exit 0; fi
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,21p' "$0"; exit 0; fi
SECONDS_PER_TARGET=60
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then SECONDS_PER_TARGET=$1; shift; fi
TARGETS=("$@")
if ((${#TARGETS[@]} == 0)); then TARGETS=("${ALL_TARGETS[@]}"); fi
for target in "${TARGETS[@]}"; do
  if [[ -z "${DICT[$target]:-}" ]]; then
    echo "fuzz.sh: unknown target '$target' (targets: ${ALL_TARGETS[*]})" >&2
    exit 2
  fi
done

BUILD_DIR="${CASTOR_FUZZ_BUILD_DIR:-build-fuzz}"
CLANG_FUZZER=$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null | head -1 || true)
if ! command -v clang++ >/dev/null || [[ -z "$CLANG_FUZZER" ]]; then
  echo "fuzz.sh: needs clang with libFuzzer (Debian: apt-get install clang libclang-rt-dev" \
       "or clang-14's bundled runtime)" >&2
  exit 2
fi

echo "== building the fuzz targets in $BUILD_DIR/ (clang, libFuzzer + ASan + UBSan)"
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCASTOR_FUZZ=ON -DCASTOR_CUDA=OFF -DCASTOR_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$BUILD_DIR" --parallel "${CASTOR_FUZZ_BUILD_JOBS:-$(nproc)}" \
  --target "${TARGETS[@]/#/fuzz_}"

# The planner's memory budget; one BLAS thread; fatal sanitizer reports.
export CASTOR_MEMORY_LIMIT="${CASTOR_MEMORY_LIMIT:-1G}"
export OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

RUNS_DIR="$BUILD_DIR/fuzz-runs"
SUMMARY=()
any_findings=0
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
for target in "${TARGETS[@]}"; do
  work="$RUNS_DIR/$target"
  mkdir -p "$work/corpus" "$work/findings"
  cp -n tests/fuzz/corpus/"$target"/* "$work/corpus/" 2>/dev/null || true
  log="$work/fuzz.log"
  echo "== fuzzing $target for ${SECONDS_PER_TARGET}s (log: $log)"
  fork=()
  if [[ "${CASTOR_FUZZ_JOBS:-1}" -gt 1 ]]; then fork=(-fork="$CASTOR_FUZZ_JOBS" -ignore_crashes=1); fi
  started=$(date +%s)
  set +e
  # shellcheck disable=SC2086
  "$BUILD_DIR/tests/fuzz/fuzz_$target" "$work/corpus" \
    -dict="tests/fuzz/dict/${DICT[$target]}.dict" \
    -max_total_time="$SECONDS_PER_TARGET" -timeout=25 -rss_limit_mb=3072 -malloc_limit_mb=2048 \
    -artifact_prefix="$work/findings/" -print_final_stats=1 "${fork[@]}" \
    ${CASTOR_FUZZ_EXTRA:-} >"$log" 2>&1
  status=$?
  set -e
  seconds=$(($(date +%s) - started))
  # libFuzzer's final stats (one block per process with -fork), else its
  # last status line; either may be missing after a crash.
  execs=$({ grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" || true; } |
          awk '{s+=$2} END {print s+0}')
  if [[ "$execs" == 0 ]]; then
    execs=$({ grep -oE '^#[0-9]+' "$log" || true; } | tail -1 | tr -d '#')
  fi
  findings=$(find "$work/findings" -type f | wc -l)
  if ((findings > 0)) || ((status != 0)); then any_findings=1; fi
  SUMMARY+=("$(printf '%-16s %12s execs %6ss %4s findings  exit %s' "$target" "${execs:-?}" \
                "${seconds:-?}" "$findings" "$status")")
  find "$work/findings" -type f -printf '    %p\n' | head -20
done

echo "== summary ($(nproc) CPUs: $cpu; load $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%s\n' "${SUMMARY[@]}"
exit "$any_findings"
