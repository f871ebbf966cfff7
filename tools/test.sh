#!/usr/bin/env bash
# README command (2): set everything up and run the whole test suite:
#   1. the Bazel build and its unit tests (offline; see third_party/bazel/),
#   2. the sanitizer tier: castor, the loader/pass/executor/training/CLI
#      tests, the conformance cases and the fuzz corpus replays built with
#      ASan + UBSan into build-sanitize/ (any report fails the test; see
#      README "Fuzzing and sanitizers"),
#   3. the CMake build's ctest suite (cpu tier; cuda-labelled tests skip
#      cleanly without a GPU). ctest runs last so the output ends with its
#      summary line.
# Set CASTOR_SKIP_BAZEL=1 or CASTOR_SKIP_SANITIZE=1 to skip step 1 or 2
# during development.
set -euo pipefail

cd "$(dirname "$0")/.."
bash tools/setup.sh
BUILD_DIR="${CASTOR_BUILD_DIR:-build}"

# Paths the tests read (Bazel passes them through with --test_env).
export CASTOR_SOURCE_DIR="$PWD"
export CASTOR_SHARED_DIR="$(cd .. && pwd)/shared"

if [[ "${CASTOR_SKIP_BAZEL:-0}" != "1" ]]; then
  echo "== bazel test //..."
  # The disk cache in the home directory survives a fresh clone elsewhere
  # on the same machine (Bazel's output base is per workspace path).
  bazel test --disk_cache="${HOME}/.cache/castor-bazel-disk" //...
  bazel shutdown
fi

if [[ "${CASTOR_SKIP_SANITIZE:-0}" != "1" ]]; then
  SANITIZE_DIR="${CASTOR_SANITIZE_BUILD_DIR:-build-sanitize}"
  echo "== sanitizer tier (ASan + UBSan) in ${SANITIZE_DIR}/"
  cmake -S . -B "$SANITIZE_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCASTOR_SANITIZE=address,undefined -DCASTOR_CUDA=OFF -DCASTOR_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$SANITIZE_DIR" --parallel "$(nproc)" --target sanitizer_tier
  (cd "$SANITIZE_DIR" &&
   ASAN_OPTIONS=abort_on_error=1:allocator_may_return_null=1 \
     ctest -L 'sanitize|fuzz' --output-on-failure --parallel "$(nproc)" --timeout 900)
fi

echo "== ctest"
cd "$BUILD_DIR"
ctest --output-on-failure --parallel "$(nproc)" --timeout 900
