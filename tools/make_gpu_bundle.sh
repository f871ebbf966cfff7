#!/usr/bin/env bash
# Packs castor's CUDA build for a GPU machine that cannot build it (it has no
# Debian dev packages: no protobuf/onnx/absl/openblas headers or libraries).
#
# Run here, from anywhere inside the repository:
#   bash tools/make_gpu_bundle.sh [--build-dir DIR] [--jobs N] [--cuda-architectures LIST]
#                                 [--xz] [--no-build] [--output FILE] [--zoo DIR]
#
# It configures a separate build directory (default build-gpu-bundle:
# Release, -DCASTOR_CUDA=ON, Ninja, the project's default
# CMAKE_CUDA_ARCHITECTURES), builds `castor` and every cuda_*_test target
# (today one: cuda_backend_test),
# and assembles gpu-bundle/:
#   bin/       castor, the cuda_*_test binaries and the CUDA backend's
#              module libcastor_cuda.so, stripped
#   lib/       the shared libraries they need (found with ldd), except the
#              system ones the GPU machine surely has (glibc's libc, libm,
#              libpthread, libdl, librt, ld-linux; libstdc++, libgcc_s) and
#              the CUDA/NVIDIA ones it brings itself (libcuda, libcudart,
#              libcublas*, libcudnn*, libnvrtc, libnvJitLink, ...)
#   lib-fallback/  this machine's libstdc++ and libgcc_s, which
#              tools/gpu_check.sh uses only if the GPU machine's are too old
#   models/    models/*.onnx and models/generate.py (the torch definitions)
#   conformance/onnx-node/  the ONNX node conformance cases from ../shared
#              (tools/gpu_check.sh runs them with castor conformance --backend
#              cuda); left out, with a warning, when ../shared lacks them
#   zoo/       the small models of the test zoo (tests/zoo/; .onnx of at most
#              4 MiB with their .ref.json, the data cut to 64 samples) and
#              tests/zoo/gpu_agreement.py, which gpu_check.sh runs (CUDA
#              against CPU); from --zoo DIR (default build/tests/zoo, where
#              ctest's zoo_ci generates it); left out, with a warning, when
#              there is none
#   bench/gpu_train_vs_torch.py, tools/gpu_check.sh
#   MANIFEST   what was built, from which paths, with which toolkit, and the
#              newest GLIBC_/GLIBCXX_ symbol versions the binaries need
# then packs gpu-bundle.tar.gz (gzip -9) at the repository root, prints its
# size, and refuses (exit 1) when it is over 60 MiB. The GPU machine gets it
# with the run tool's carry list ["gpu-bundle.tar.gz"] and runs
# `bash tools/gpu_check.sh` there.
#
# The CUDA backend's device code lives once, in the module
# libcastor_cuda.so, which castor and the tests load from bin/ beside them
# (backend/cuda_loader.cc). Should the bundle outgrow the limit:
# --cuda-architectures LIST sets CMAKE_CUDA_ARCHITECTURES (e.g. 90-real, the
# H200 only: about a third of the device code); without it the project's
# default applies, even in a build directory configured with a LIST before.
# --xz packs gpu-bundle.tar.xz with xz -9 instead (smaller, a few minutes to
# pack); gpu_check.sh takes either (carry ["gpu-bundle.tar.xz"] then).
# --no-build packs an existing build directory as it is (its cuda_*_test
# binaries found by name under tests/); --output writes the archive elsewhere
# (gpu-bundle/ is then assembled next to it).
set -euo pipefail

readonly LIMIT_MIB=60
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="build-gpu-bundle"
JOBS=""
CUDA_ARCHS=""
USE_XZ=0
OUTPUT_GIVEN=0
DO_BUILD=1
OUTPUT="$ROOT/gpu-bundle.tar.gz"
ZOO_DIR="$ROOT/build/tests/zoo"

die() { echo "make_gpu_bundle: error: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --build-dir) BUILD_DIR="${2:?--build-dir needs a directory}"; shift 2 ;;
    --build-dir=*) BUILD_DIR="${1#*=}"; shift ;;
    --jobs|-j) JOBS="${2:?--jobs needs a number}"; shift 2 ;;
    --jobs=*) JOBS="${1#*=}"; shift ;;
    --cuda-architectures) CUDA_ARCHS="${2:?--cuda-architectures needs a list}"; shift 2 ;;
    --cuda-architectures=*) CUDA_ARCHS="${1#*=}"; shift ;;
    --xz) USE_XZ=1; shift ;;
    --no-build) DO_BUILD=0; shift ;;
    --output) OUTPUT="${2:?--output needs a file}"; OUTPUT_GIVEN=1; shift 2 ;;
    --output=*) OUTPUT="${1#*=}"; OUTPUT_GIVEN=1; shift ;;
    --zoo) ZOO_DIR="${2:?--zoo needs a directory}"; shift 2 ;;
    --zoo=*) ZOO_DIR="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

cd "$ROOT"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
case "$OUTPUT" in /*) ;; *) OUTPUT="$PWD/$OUTPUT" ;; esac
if ((USE_XZ)); then
  ((OUTPUT_GIVEN)) || OUTPUT="$ROOT/gpu-bundle.tar.xz"
  [[ "$OUTPUT" == *.tar.xz ]] || die "--output must end in .tar.xz with --xz: $OUTPUT"
  COMPRESS=(xz -9 -T "${JOBS:-2}")
else
  [[ "$OUTPUT" == *.tar.gz ]] || die "--output must end in .tar.gz: $OUTPUT"
  COMPRESS=(gzip -9)
fi
STAGE="$(dirname "$OUTPUT")/gpu-bundle"

for tool in ldd strip objdump tar "${COMPRESS[0]}"; do
  command -v "$tool" >/dev/null || die "'$tool' is needed and not installed"
done

# --- build ------------------------------------------------------------------
if ((DO_BUILD)); then
  command -v cmake >/dev/null || die "cmake is not installed"
  command -v ninja >/dev/null || die "ninja is not installed"
  if [[ -n "$CUDA_ARCHS" ]]; then
    arch_arg=("-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS")
  else
    arch_arg=(-UCMAKE_CUDA_ARCHITECTURES)  # the project's default
  fi
  echo "== configure $BUILD_DIR (Release, CASTOR_CUDA=ON, Ninja, CUDA architectures" \
    "${CUDA_ARCHS:-of the project})"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCASTOR_CUDA=ON \
    "${arch_arg[@]}" || die "cmake configure failed"
else
  [[ -f "$BUILD_DIR/build.ninja" ]] || die "--no-build: $BUILD_DIR is no configured build"
fi
# The test targets the build defines now (binaries of targets since removed
# may still lie in an old build directory; they are not packed).
mapfile -t TEST_TARGETS < <(ninja -C "$BUILD_DIR" -t targets all 2>/dev/null \
  | sed -n 's/^\(cuda_[A-Za-z0-9_]*_test\): .*/\1/p' | sort -u)
((${#TEST_TARGETS[@]})) || die "no cuda_*_test target in $BUILD_DIR (tests/cuda_*_test.cc)"
if ((DO_BUILD)); then
  echo "== build castor and ${#TEST_TARGETS[@]} test targets: ${TEST_TARGETS[*]}"
  ninja -C "$BUILD_DIR" ${JOBS:+-j "$JOBS"} castor "${TEST_TARGETS[@]}" || die "the build failed"
fi

# The binary a target name built (CMake puts tests under tests/, castor at the top).
binary_of() {
  local name="$1" found
  for found in "$BUILD_DIR/$name" "$BUILD_DIR/tests/$name" "$BUILD_DIR/tools/$name"; do
    [[ -f "$found" && -x "$found" ]] && { echo "$found"; return 0; }
  done
  found="$(find "$BUILD_DIR" -path '*/CMakeFiles' -prune -o -type f -name "$name" -perm -u+x \
    -print -quit)"
  [[ -n "$found" ]] || return 1
  echo "$found"
}

CASTOR_BIN="$(binary_of castor)" || die "no castor binary in $BUILD_DIR"
# The CUDA backend's module, built beside castor (CMakeLists.txt).
CUDA_MODULE="$(dirname "$CASTOR_BIN")/libcastor_cuda.so"
[[ -f "$CUDA_MODULE" ]] || die "no CUDA backend module $CUDA_MODULE (is $BUILD_DIR a CUDA build?)"
BINARIES=("$CASTOR_BIN" "$CUDA_MODULE")
for name in "${TEST_TARGETS[@]}"; do
  path="$(binary_of "$name")" || die "target $name built no binary in $BUILD_DIR"
  BINARIES+=("$path")
done

# --- stage --------------------------------------------------------------------
echo "== assemble $STAGE"
rm -rf "$STAGE"
mkdir -p "$STAGE"/{bin,lib,lib-fallback,models,bench,tools}

for path in "${BINARIES[@]}"; do
  cp "$path" "$STAGE/bin/"
  strip --strip-all "$STAGE/bin/$(basename "$path")"
done
# The module resolves castor's code against the executable that loads it:
# check, after stripping, that each bundled executable exports all of it.
stripped=()
for path in "${BINARIES[@]}"; do
  [[ "$path" == "$CUDA_MODULE" ]] || stripped+=("$STAGE/bin/$(basename "$path")")
done
bash "$ROOT/tests/cuda_module_symbols_check.sh" "$STAGE/bin/$(basename "$CUDA_MODULE")" \
  "${stripped[@]}" || die "a bundled executable cannot load the CUDA backend module"

# Libraries the GPU machine has itself: glibc and the GCC runtime ...
is_system_lib() {
  case "$1" in
    linux-vdso.so*|linux-gate.so*|ld-linux*.so*|libc.so*|libm.so*|libmvec.so*|libpthread.so*| \
    libdl.so*|librt.so*|libresolv.so*|libutil.so*|libanl.so*|libnsl.so*|libstdc++.so*| \
    libgcc_s.so*) return 0 ;;
  esac
  return 1
}
# ... and CUDA/NVIDIA libraries, which come from its toolkit, driver or the
# nvidia-* Python wheels torch installs.
is_cuda_lib() {
  case "$1" in
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libcudnn*.so*|libnvrtc*.so*| \
    libnvJitLink.so*|libnvjitlink.so*|libcufft*.so*|libcurand.so*|libcusolver*.so*| \
    libcusparse*.so*|libnccl.so*|libcupti.so*|libnvToolsExt.so*|libnvtx*.so*|libnvblas.so*| \
    libnvidia-*.so*|libnvperf*.so*|libcufile*.so*|libnvfatbin.so*) return 0 ;;
  esac
  return 1
}

declare -A BUNDLED=() CUDA_NEEDED=()
missing=()
for path in "${BINARIES[@]}"; do
  while read -r line; do
    # "libfoo.so.1 => /path/libfoo.so.1 (0x...)", "libfoo.so.1 => not found",
    # "/lib64/ld-linux-x86-64.so.2 (0x...)", "linux-vdso.so.1 (0x...)"
    name="${line%% *}"
    name="$(basename "$name")"
    [[ -n "$name" ]] || continue
    if is_system_lib "$name"; then continue; fi
    if is_cuda_lib "$name"; then CUDA_NEEDED[$name]=1; continue; fi
    if [[ "$line" == *"=> not found"* ]]; then
      missing+=("$name (needed by $(basename "$path"))")
      continue
    fi
    [[ "$line" == *" => "* ]] || continue
    resolved="$(awk '{print $3}' <<<"$line")"
    [[ -f "$resolved" ]] || { missing+=("$name -> $resolved"); continue; }
    [[ -n "${BUNDLED[$name]:-}" ]] && continue
    cp -L "$resolved" "$STAGE/lib/$name"
    chmod u+w "$STAGE/lib/$name"
    strip --strip-unneeded "$STAGE/lib/$name" 2>/dev/null || true
    BUNDLED[$name]="$resolved"
  done < <(ldd "$path")
done
((${#missing[@]} == 0)) || die "ldd cannot resolve: ${missing[*]}"

# This machine's GCC runtime, for a GPU machine whose libstdc++ is older
# than the one the binaries were linked against (gpu_check.sh decides).
for name in libstdc++.so.6 libgcc_s.so.1; do
  resolved="$(ldd "$CASTOR_BIN" | awk -v n="$name" '$1 == n {print $3}')"
  if [[ -n "$resolved" && -f "$resolved" ]]; then
    cp -L "$resolved" "$STAGE/lib-fallback/$name"
    chmod u+w "$STAGE/lib-fallback/$name"
    strip --strip-unneeded "$STAGE/lib-fallback/$name" 2>/dev/null || true
  fi
done

shopt -s nullglob
models=("$ROOT"/models/*.onnx)
shopt -u nullglob
((${#models[@]})) || die "no models/*.onnx"
cp "${models[@]}" "$STAGE/models/"
cp "$ROOT/models/generate.py" "$STAGE/models/"
CONFORMANCE_DIR="$ROOT/../shared/conformance/onnx-node"
if [[ -d "$CONFORMANCE_DIR" ]]; then
  mkdir -p "$STAGE/conformance"
  cp -r "$CONFORMANCE_DIR" "$STAGE/conformance/"
else
  echo "make_gpu_bundle: warning: no $CONFORMANCE_DIR; the bundle has no conformance cases" >&2
fi
# The zoo's small models and their data (64 samples: gpu_agreement.py
# trains 3 steps of 16).
if compgen -G "$ZOO_DIR/*.ref.json" >/dev/null; then
  mkdir -p "$STAGE/zoo"
  /usr/bin/python3 - "$ZOO_DIR" "$STAGE/zoo" <<'PY' || die "cannot pack the zoo from $ZOO_DIR"
import glob, json, os, shutil, sys
import numpy as np
src, dst = sys.argv[1], sys.argv[2]
data = set()
for path in sorted(glob.glob(os.path.join(src, "*.ref.json"))):
    ref = json.load(open(path))
    onnx = os.path.join(src, ref["onnx"])
    if not os.path.exists(onnx) or os.path.getsize(onnx) > 4 << 20:
        continue
    shutil.copy(path, dst)
    shutil.copy(onnx, dst)
    data.add(ref["data"])
for name in sorted(data):
    arrays = np.load(os.path.join(src, name))
    np.savez(os.path.join(dst, name), **{k: arrays[k][:64] for k in arrays.files})
print("zoo: %d models, %d data files" % (len(glob.glob(os.path.join(dst, "*.onnx"))), len(data)))
PY
  cp "$ROOT/tests/zoo/gpu_agreement.py" "$ROOT/tests/zoo/expected_failures.txt" "$STAGE/zoo/"
else
  echo "make_gpu_bundle: warning: no zoo in $ZOO_DIR (run ctest -R zoo_ci, or pass --zoo DIR);" \
    "the bundle has no zoo models" >&2
fi
cp "$ROOT/bench/gpu_train_vs_torch.py" "$STAGE/bench/"
cp "$ROOT/tools/gpu_check.sh" "$STAGE/tools/"

# The newest symbol versions the bundled files need from glibc and libstdc++.
newest_version() {
  objdump -T "$STAGE"/bin/* "$STAGE"/lib/* 2>/dev/null | grep -o "$1_[0-9][0-9.]*" \
    | sort -u -V | tail -n 1
}
cmake_cache_value() {
  sed -n "s/^$1:[A-Z]*=//p" "$BUILD_DIR/CMakeCache.txt" 2>/dev/null | head -n 1
}
# The CUDA compiler and the code the objects carry, as the build used them.
arch_label="the project default"
((DO_BUILD)) || arch_label="as $BUILD_DIR was configured"
cuda_compiler_file="$(find "$BUILD_DIR/CMakeFiles" -maxdepth 2 -name CMakeCUDACompiler.cmake \
  -print -quit 2>/dev/null)"
nvcc_path="$(sed -n 's/^set(CMAKE_CUDA_COMPILER "\(.*\)")$/\1/p' "$cuda_compiler_file" 2>/dev/null)"
cuda_code="$(grep -o -- '--generate-code=arch=[^ ]*' "$BUILD_DIR/build.ninja" 2>/dev/null \
  | sed 's/.*code=\[\(.*\)\]/\1/' | tr ',' '\n' | sort -u | tr '\n' ' ' | sed 's/ $//')"
{
  echo "bundle_format=1"
  echo "created=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host=$(uname -srm)"
  echo "build_dir=$BUILD_DIR"
  echo "build_type=$(cmake_cache_value CMAKE_BUILD_TYPE)"
  echo "cuda_architectures=${CUDA_ARCHS:-$arch_label}${cuda_code:+ ($cuda_code)}"
  echo "nvcc=${nvcc_path:-unknown} $( [[ -x "$nvcc_path" ]] && "$nvcc_path" --version | tail -n 1)"
  # Paths compiled into the tests (tests/CMakeLists.txt): gpu_check.sh links
  # them to the GPU machine's checkout when they do not exist there.
  echo "source_dir=$ROOT"
  echo "castor_binary=$CASTOR_BIN"
  echo "shared_dir=$(cmake_cache_value CASTOR_SHARED_DIR)"
  echo "needs_glibc=$(newest_version GLIBC)"
  echo "needs_glibcxx=$(newest_version GLIBCXX)"
  echo "cuda_libraries=$(printf '%s\n' "${!CUDA_NEEDED[@]}" | sort | tr '\n' ' ' | sed 's/ $//')"
  echo "binaries=$(find "$STAGE/bin" -type f -printf '%f\n' | sort | tr '\n' ' ' | sed 's/ $//')"
  for name in $(printf '%s\n' "${!BUNDLED[@]}" | sort); do
    echo "lib $name <- ${BUNDLED[$name]}"
  done
} >"$STAGE/MANIFEST"

# --- pack ---------------------------------------------------------------------
echo "== pack $OUTPUT"
rm -f "$OUTPUT"
tar -C "$(dirname "$STAGE")" -cf - gpu-bundle | "${COMPRESS[@]}" >"$OUTPUT.partial"
mv "$OUTPUT.partial" "$OUTPUT"
bytes="$(stat -c %s "$OUTPUT")"
mib="$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')"

echo
echo "contents (uncompressed):"
du -sh "$STAGE"/bin "$STAGE"/lib "$STAGE"/lib-fallback "$STAGE"/models "$STAGE"/conformance \
  "$STAGE"/zoo \
  2>/dev/null | sed 's/^/  /'
find "$STAGE/bin" -type f -printf '%f %s\n' | sort \
  | awk '{printf "  bin/%-40s %6.1f MiB\n", $1, $2 / 1048576}'
echo "  lib/: ${#BUNDLED[@]} libraries: $(printf '%s\n' "${!BUNDLED[@]}" | sort | tr '\n' ' ')"
echo "  from the GPU machine: ${!CUDA_NEEDED[*]}"
echo "  needs glibc $(sed -n 's/^needs_glibc=//p' "$STAGE/MANIFEST"), libstdc++" \
  "$(sed -n 's/^needs_glibcxx=//p' "$STAGE/MANIFEST")"
echo
echo "$OUTPUT: $mib MiB ($bytes bytes)"
if ((bytes > LIMIT_MIB * 1048576)); then
  echo "make_gpu_bundle: error: the bundle is $mib MiB, over the $LIMIT_MIB MiB limit (the run" \
    "tool carries at most 64 MiB in all); pack it with --xz (smaller, slower to pack)," \
    "or build for fewer CUDA architectures (--cuda-architectures" \
    "90-real for the H200), or drop test binaries; removed $OUTPUT so that it cannot be" \
    "carried by mistake" >&2
  rm -f "$OUTPUT"
  exit 1
fi

# The run tool carries ignored paths: the archive (and the staging folder)
# should be in .gitignore.
check_ignored() {
  local rel="$1"
  if command -v git >/dev/null && [[ -z "${CASTOR_BUNDLE_NO_GIT:-}" ]] \
      && git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$ROOT" check-ignore -q -- "$rel"
  else
    grep -qxE "/?(${rel//./\\.}|gpu-bundle\*|\*\.tar\.gz)/?" "$ROOT/.gitignore" 2>/dev/null
  fi
}
if [[ "$(dirname "$OUTPUT")" == "$ROOT" ]]; then
  for rel in "$(basename "$OUTPUT")" gpu-bundle; do
    if ! check_ignored "$rel"; then
      echo "make_gpu_bundle: warning: $rel is not ignored by git; add" \
        "'/$rel$([[ -d "$ROOT/$rel" ]] && echo /)' to .gitignore" \
        "(the run tool's carry takes ignored paths)" >&2
    fi
  done
fi

echo
echo "On the GPU machine, with the run tool:"
echo "  carry: [\"$(basename "$OUTPUT")\"]"
echo "  command: bash tools/gpu_check.sh"
echo "  timeout_s: 540"
