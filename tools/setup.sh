#!/usr/bin/env bash
# Installs everything castor needs on Debian 12 and builds it.
#
#   tools/setup.sh            install packages (if missing), configure, build
#   tools/setup.sh --no-build install packages only
#
# Idempotent: packages already present are not reinstalled and `apt-get
# update` runs at most once, only when something is missing. The build goes
# to build/ (CMake + Ninja, RelWithDebInfo); CASTOR_BUILD_DIR overrides it.
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR="${CASTOR_BUILD_DIR:-build}"

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config git ccache
  # libraries castor links
  libonnx-dev libprotobuf-dev protobuf-compiler libabsl-dev zlib1g-dev
  libopenblas-dev
  libgloo-dev  # data-parallel training on the CPU (training/distributed/)
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev graphviz
  openmpi-bin  # `mpirun -np 2 castor train` in tests/distributed_test.cc
  # the offline Bazel build (see third_party/bazel/README.md)
  bazel-bootstrap bazel-rules-java
  # data and sample-model generation
  dataset-fashion-mnist python3-onnx python3-torch python3-torchvision python3-numpy python3-venv
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${#missing[@]} Debian package(s): ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#PACKAGES[@]} Debian packages present"
fi

# Python packages for tests and benchmarks (ONNX Runtime as the reference
# runtime, onnxconverter-common as the converter castor is compared with) go
# into .venv/, which still sees Debian's torch and onnx. numpy stays below 2
# because Debian's torch is built against numpy 1.
VENV_PACKAGES=("numpy<2" "onnxruntime==1.32.0" "onnxconverter-common==1.16.0")
VENV_STAMP=".venv/castor-packages"
if [[ ! -f "$VENV_STAMP" || "$(cat "$VENV_STAMP")" != "${VENV_PACKAGES[*]}" ]]; then
  echo "setup: creating .venv/ with ${VENV_PACKAGES[*]}"
  /usr/bin/python3 -m venv --system-site-packages .venv
  .venv/bin/pip install --quiet --disable-pip-version-check "${VENV_PACKAGES[@]}"
  echo "${VENV_PACKAGES[*]}" > "$VENV_STAMP"
else
  echo "setup: .venv/ up to date"
fi

if [[ "${1:-}" == "--no-build" ]]; then exit 0; fi

echo "setup: configuring and building in ${BUILD_DIR}/"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" --parallel "$(nproc)"
echo "setup: built ${BUILD_DIR}/castor"
