#!/usr/bin/env bash
# README command (2): set everything up and run the whole test suite:
#   1. the Bazel build and its unit tests (offline; see third_party/bazel/),
#   2. the CMake build's ctest suite (cpu tier; cuda-labelled tests skip
#      cleanly without a GPU). ctest runs last so the output ends with its
#      summary line.
# Set CASTOR_SKIP_BAZEL=1 to skip step 1 during development.
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

echo "== ctest"
cd "$BUILD_DIR"
ctest --output-on-failure --parallel "$(nproc)" --timeout 900
