#!/usr/bin/env bash
# The one prepared check of castor's CUDA backend on a GPU machine (run tool).
#
# Run from the repository root on the GPU machine, with the bundle that
# tools/make_gpu_bundle.sh made here carried along:
#   run(command="bash tools/gpu_check.sh", carry=["gpu-bundle.tar.gz"], timeout_s=540)
# (or carry=["gpu-bundle.tar.xz"] for a bundle packed with --xz)
#
# That machine has the NVIDIA driver, the CUDA toolkit, python3 with torch and
# onnxruntime, but none of the Debian dev packages castor builds against, so
# castor cannot be built there: this script only runs the prebuilt bundle.
#   1. unpacks gpu-bundle.tar.gz (else gpu-bundle.tar.xz, or $CASTOR_GPU_BUNDLE)
#      into a temporary dir;
#   2. prints nvidia-smi's name/driver/memory line and `castor --version`;
#   3. runs every bundled cuda_*_test binary (--gtest_brief=1, each under
#      `timeout`; 13-16 s in all on an H200, 2026-12-04) and counts
#      passed/failed/skipped;
#   4. runs the bundled ONNX node conformance cases on CUDA (`castor
#      conformance --backend cuda`; a failure other than a missing kernel is a
#      problem);
#   4b. trains the bundled zoo models (tests/zoo/gpu_agreement.py): float32
#      on cuda against the cpu backend, 3 steps, within the zoo's PyTorch
#      float32 bands, and mixed_float16/mixed_bfloat16 on cuda finite
#      (bounded by GPU_CHECK_ZOO_BUDGET_S, 90);
#   5. runs bench/gpu_train_vs_torch.py --quick (castor vs PyTorch training
#      throughput; bounded to ~2.5 minutes), then cnn and resnet at batch 16
#      with --cuda-graphs off (node-by-node steps; bounded to ~1 minute);
#   6. prints one summary block: tests per binary, the slowest tests,
#      conformance, the benchmark tables, wall time.
# castor and the tests run with LD_LIBRARY_PATH = the bundle's lib/, the CUDA
# toolkit's lib64 and every nvidia/*/lib of python3's site-packages (cuDNN,
# cuBLAS, ... of the torch wheels). Python itself keeps its own environment
# (castor reaches the benchmark through a small wrapper script), so torch
# loads the CUDA libraries it was built with.
#
# Everything it writes goes under ${OUT:-/tmp/castor-gpu-check}: gpu_check.log
# (this output), logs/<test>.log and logs/<test>.json (gtest's report),
# logs/bench.log, bench.json, bench/ (castor's metrics and logs per
# benchmark run), and the same for the node-by-node benchmark
# (logs/bench_node_by_node.log, bench_node_by_node.json, bench_node_by_node/).
#
# Exit status: 0 when every test binary passed; 1 when a test failed, a binary
# crashed or timed out, a binary's tests were all skipped on a machine with a
# GPU (the backend could not start), a binary did not run for lack of time,
# a conformance case failed other than for a missing kernel, or castor
# crashed during the benchmark; 2 when the bundle is missing.
# Benchmark rows that fail are listed in the summary (and bench.json).
#
# Tunables (environment): GPU_CHECK_TEST_BUDGET_S (200), GPU_CHECK_TEST_TIMEOUT_S
# (200, per binary), GPU_CHECK_ZOO_BUDGET_S (90), GPU_CHECK_BENCH_BUDGET_S (140),
# GPU_CHECK_NODE_BENCH_BUDGET_S (60; less when the run is past 400 s),
# GPU_CHECK_SKIP_BENCH=1 (both benchmarks), GPU_CHECK_BENCH_ARGS (more
# arguments for the first benchmark only, split on spaces).
set -uo pipefail

ROOT="$PWD"
OUT_DIR="${OUT:-/tmp/castor-gpu-check}"
# gpu-bundle.tar.gz, or gpu-bundle.tar.xz (make_gpu_bundle.sh --xz).
BUNDLE_TGZ="${CASTOR_GPU_BUNDLE:-$ROOT/gpu-bundle.tar.gz}"
if [[ -z "${CASTOR_GPU_BUNDLE:-}" && ! -f "$BUNDLE_TGZ" && -f "$ROOT/gpu-bundle.tar.xz" ]]; then
  BUNDLE_TGZ="$ROOT/gpu-bundle.tar.xz"
fi
TEST_BUDGET_S="${GPU_CHECK_TEST_BUDGET_S:-200}"
TEST_TIMEOUT_S="${GPU_CHECK_TEST_TIMEOUT_S:-200}"
BENCH_BUDGET_S="${GPU_CHECK_BENCH_BUDGET_S:-140}"
ZOO_BUDGET_S="${GPU_CHECK_ZOO_BUDGET_S:-90}"
NODE_BENCH_BUDGET_S="${GPU_CHECK_NODE_BENCH_BUDGET_S:-60}"
STARTED="$(date +%s)"

say() { printf '%s\n' "$*"; }
elapsed() { echo $(($(date +%s) - STARTED)); }
# A MANIFEST value of the bundle (key=value lines).
manifest() { sed -n "s/^$1=//p" "$BUNDLE/MANIFEST" 2>/dev/null | head -n 1; }

check() {
  mkdir -p "$OUT_DIR/logs" || { say "gpu_check: cannot create $OUT_DIR"; return 2; }
  say "== castor GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname), in $ROOT"

  # --- the bundle -------------------------------------------------------------
  if [[ ! -f "$BUNDLE_TGZ" ]]; then
    say "gpu_check: the bundle $BUNDLE_TGZ (or gpu-bundle.tar.xz) is missing."
    say "  Make it on the build machine (from the repository root):"
    say "    bash tools/make_gpu_bundle.sh"
    say "  and carry it here with the run tool: carry=[\"gpu-bundle.tar.gz\"]."
    say "  castor cannot be built on this machine: it has no Debian dev packages"
    say "  (protobuf, onnx, absl and openblas headers and libraries), only the CUDA"
    say "  toolkit, python3, torch and onnxruntime."
    return 2
  fi
  WORK="$(mktemp -d /tmp/castor-gpu-bundle.XXXXXX)" || return 2
  trap 'rm -rf "$WORK"' EXIT
  # GNU tar detects gzip or xz itself; Python's tarfile if tar cannot.
  if ! tar -xf "$BUNDLE_TGZ" -C "$WORK" 2>"$WORK/tar.err" \
      && ! python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "$BUNDLE_TGZ" "$WORK"; then
    say "gpu_check: cannot unpack $BUNDLE_TGZ: $(head -n 3 "$WORK/tar.err")"
    return 2
  fi
  BUNDLE="$WORK/gpu-bundle"
  [[ -x "$BUNDLE/bin/castor" ]] || { say "gpu_check: $BUNDLE_TGZ holds no bin/castor"; return 2; }
  cp "$BUNDLE/MANIFEST" "$OUT_DIR/MANIFEST" 2>/dev/null
  say "bundle: $BUNDLE_TGZ ($(du -h "$BUNDLE_TGZ" | cut -f1)), made $(manifest created)" \
    "on $(manifest host)"
  say "  $(manifest build_type) build, CUDA architectures $(manifest cuda_architectures)," \
    "$(manifest nvcc)"

  # --- library path for castor and the tests ------------------------------------
  local nvidia_dirs dirs=() dir
  nvidia_dirs="$(timeout 60 python3 - <<'EOF' 2>/dev/null
import glob, os, site
roots = []
try:
    import nvidia  # the namespace package of NVIDIA's wheels (torch's dependencies)
    roots += list(getattr(nvidia, "__path__", []))
except Exception:
    pass
try:
    roots += [os.path.join(p, "nvidia") for p in site.getsitepackages()]
except Exception:
    pass
try:
    roots.append(os.path.join(site.getusersitepackages(), "nvidia"))
except Exception:
    pass
seen = []
for root in roots:
    for d in sorted(glob.glob(os.path.join(root, "*", "lib"))):
        d = os.path.realpath(d)
        if os.path.isdir(d) and d not in seen:
            seen.append(d)
print("\n".join(seen))
EOF
)"
  for dir in "$BUNDLE/lib" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -d "$dir" ]] && dirs+=("$dir")
  done
  while IFS= read -r dir; do
    [[ -n "$dir" ]] && dirs+=("$dir")
  done <<<"$nvidia_dirs"
  CASTOR_LD="$(IFS=:; echo "${dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

  # The GCC runtime of the build machine, only when this one's is too old.
  if LD_LIBRARY_PATH="$CASTOR_LD" ldd "$BUNDLE/bin/castor" 2>&1 \
      | grep -q -e "GLIBCXX_[0-9.]*' not found" -e "CXXABI_[0-9.]*' not found" \
        -e "GCC_[0-9.]*' not found"; then
    say "note: this machine's libstdc++/libgcc_s are older than the build machine's" \
      "(needs $(manifest needs_glibcxx)); using the bundle's lib-fallback/"
    CASTOR_LD="$BUNDLE/lib-fallback:$CASTOR_LD"
  fi
  say "LD_LIBRARY_PATH for castor and the tests:"
  tr ':' '\n' <<<"$CASTOR_LD" | sed 's/^/  /'

  # Paths compiled into the test binaries (tests/CMakeLists.txt): the build
  # machine's checkout and castor binary. Where they do not exist here, link
  # them to this checkout and the bundled castor.
  local source_dir castor_binary
  source_dir="$(manifest source_dir)"
  castor_binary="$(manifest castor_binary)"
  if [[ -n "$source_dir" && ! -e "$source_dir" ]]; then
    if mkdir -p "$(dirname "$source_dir")" 2>/dev/null && ln -s "$ROOT" "$source_dir" 2>/dev/null
    then
      say "linked $source_dir -> $ROOT (the tests' CASTOR_SOURCE_DIR)"
    else
      say "warning: cannot create $source_dir; tests that read files under it will fail"
    fi
  fi
  if [[ -n "$castor_binary" && ! -e "$castor_binary" ]]; then
    if mkdir -p "$(dirname "$castor_binary")" 2>/dev/null \
        && ln -s "$BUNDLE/bin/castor" "$castor_binary" 2>/dev/null; then
      say "linked $castor_binary -> the bundled castor (the tests' CASTOR_BINARY)"
    else
      say "warning: cannot create $castor_binary; tests that run castor will fail"
    fi
  fi

  # --- the machine and castor -------------------------------------------------------
  local gpu_line have_gpu=0
  say
  say "== GPU"
  if gpu_line="$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total \
      --format=csv,noheader 2>&1)"; then
    have_gpu=1
  fi
  say "nvidia-smi: $gpu_line"
  local version
  version="$(LD_LIBRARY_PATH="$CASTOR_LD" timeout 60 "$BUNDLE/bin/castor" --version 2>&1)"
  say "castor --version (exit $?):"
  say "$version" | sed 's/^/  /'
  local bin missing
  for bin in "$BUNDLE"/bin/*; do
    missing="$(LD_LIBRARY_PATH="$CASTOR_LD" ldd "$bin" 2>&1 | grep -e 'not found' | sort -u)"
    if [[ -n "$missing" ]]; then
      say "warning: $(basename "$bin") cannot load:"
      say "$missing" | sed 's/^/  /'
    fi
  done

  # --- the tests -----------------------------------------------------------------------
  say
  say "== tests (budget ${TEST_BUDGET_S} s, at most ${TEST_TIMEOUT_S} s per binary)"
  local tests=() test name log rc left limit total passed skipped failed status
  local tests_started problems=0
  declare -gA T_STATUS=() T_PASSED=() T_FAILED=() T_SKIPPED=() T_SECONDS=() T_DETAIL=()
  shopt -s nullglob
  tests=("$BUNDLE"/bin/cuda_*_test)
  shopt -u nullglob
  TEST_NAMES=()
  if ((${#tests[@]} == 0)); then
    say "no cuda_*_test binary in the bundle"
    problems=1
  fi
  tests_started="$(date +%s)"
  for test in "${tests[@]}"; do
    name="$(basename "$test")"
    TEST_NAMES+=("$name")
    log="$OUT_DIR/logs/$name.log"
    left=$((TEST_BUDGET_S - ($(date +%s) - tests_started)))
    if ((left < 5)); then
      T_STATUS[$name]="NOT RUN"
      T_DETAIL[$name]="the test budget of ${TEST_BUDGET_S} s was spent"
      problems=1
      say "  $name: not run (test budget spent)"
      continue
    fi
    limit=$((left < TEST_TIMEOUT_S ? left : TEST_TIMEOUT_S))
    local t0
    t0="$(date +%s)"
    rm -f "$OUT_DIR/logs/$name.json"  # a killed binary writes none: no stale report
    LD_LIBRARY_PATH="$CASTOR_LD" timeout -k 5 "$limit" "$test" --gtest_brief=1 \
      --gtest_color=no --gtest_output="json:$OUT_DIR/logs/$name.json" >"$log" 2>&1
    rc=$?
    T_SECONDS[$name]=$(($(date +%s) - t0))
    total="$(sed -n 's/^\[==========\] \([0-9][0-9]*\) tests\{0,1\} from .* ran\..*/\1/p' "$log" \
      | tail -n 1)"
    passed="$(sed -n 's/^\[  PASSED  \] \([0-9][0-9]*\) tests\{0,1\}\..*/\1/p' "$log" | tail -n 1)"
    skipped="$(sed -n 's/^\[  SKIPPED \] \([0-9][0-9]*\) tests\{0,1\}[.,].*/\1/p' "$log" \
      | tail -n 1)"
    passed="${passed:-0}"
    skipped="${skipped:-0}"
    if [[ -n "$total" ]]; then
      failed=$((total - passed - skipped))
    else
      failed="$(grep -c '^\[  FAILED  \] [A-Za-z_]' "$log")"
    fi
    T_PASSED[$name]="$passed"
    T_SKIPPED[$name]="$skipped"
    T_FAILED[$name]="$failed"
    if ((rc == 124 || rc == 137)); then
      status="TIMEOUT"
      T_DETAIL[$name]="killed after ${limit} s"
    elif [[ -z "$total" ]] || ((rc > 128)) || { ((rc != 0)) && ((failed == 0)); }; then
      status="CRASH"
      T_DETAIL[$name]="exit $rc$( ((rc > 128)) && echo " (signal $((rc - 128)))"); last lines:"
      T_DETAIL[$name]+=$'\n'"$(tail -n 4 "$log" | sed 's/^/      /')"
    elif ((failed > 0)); then
      status="FAIL"
      T_DETAIL[$name]="failed tests:"$'\n'"$(grep '^\[  FAILED  \] [A-Za-z_]' "$log" \
        | sed 's/^\[  FAILED  \] //; s/ ([0-9]* ms)$//' | sort -u | head -n 12 | sed 's/^/      /')"
    elif ((passed == 0 && skipped > 0 && have_gpu)); then
      status="ALL SKIPPED"
      T_DETAIL[$name]="every test skipped on a machine with a GPU:"
      T_DETAIL[$name]+=$'\n'"      $(grep -m 1 -A 1 ': Skipped$' "$log" | tail -n 1)"
    else
      status="ok"
    fi
    T_STATUS[$name]="$status"
    [[ "$status" == ok ]] || problems=1
    say "  $name: $status (passed $passed, failed $failed, skipped $skipped," \
      "${T_SECONDS[$name]} s)"
    # One more run without --gtest_brief names the test that crashed (or the
    # one still running after 20 s, for a binary that timed out).
    left=$((TEST_BUDGET_S - ($(date +%s) - tests_started)))
    limit=0
    if [[ "$status" == CRASH ]] && ((left >= 20)); then
      limit=$((left < 30 ? left : 30))
    elif [[ "$status" == TIMEOUT ]] && ((left >= 40)); then
      limit=20
    fi
    if ((limit > 0)); then
      LD_LIBRARY_PATH="$CASTOR_LD" timeout -k 5 "$limit" "$test" --gtest_color=no \
        >"$OUT_DIR/logs/$name.verbose.log" 2>&1
      local last_run
      last_run="$(grep '^\[ RUN      \]' "$OUT_DIR/logs/$name.verbose.log" | tail -n 1)"
      if [[ -n "$last_run" ]]; then
        T_DETAIL[$name]+=$'\n'"      rerun without --gtest_brief ($name.verbose.log):"
        if [[ "$status" == CRASH ]]; then
          T_DETAIL[$name]+=" last started test: ${last_run#\[ RUN      \] }"
        else
          T_DETAIL[$name]+=" still running after ${limit} s: ${last_run#\[ RUN      \] }"
        fi
      fi
    fi
  done

  # --- the ONNX node conformance cases on CUDA -------------------------------------------
  # Every failure other than a missing CUDA kernel is a kernel that disagrees
  # with ONNX's reference outputs (the CPU backend passes all 302 cases).
  local conformance="not run (no conformance/onnx-node in the bundle)"
  local conformance_dir="$BUNDLE/conformance/onnx-node"
  if ((!have_gpu)); then
    conformance="not run (nvidia-smi sees no GPU)"
  elif [[ -d "$conformance_dir" ]]; then
    say
    say "== ONNX node conformance cases on cuda ($conformance_dir)"
    LD_LIBRARY_PATH="$CASTOR_LD" timeout -k 5 90 "$BUNDLE/bin/castor" conformance \
      "$conformance_dir" --backend cuda >"$OUT_DIR/logs/conformance.log" 2>&1
    local conformance_rc=$? wrong
    wrong="$(grep '^FAIL ' "$OUT_DIR/logs/conformance.log" | grep -vc ': missing kernel: ')"
    conformance="$(tail -n 1 "$OUT_DIR/logs/conformance.log") (exit $conformance_rc);"
    conformance+=" $wrong failing other than for a missing kernel (logs/conformance.log)"
    say "  $conformance"
    if ((wrong > 0)) || ((conformance_rc > 1)); then
      problems=1
    fi
  fi

  # --- the zoo: real exports trained on cuda against the cpu backend ---------------------
  local zoo="not run (no zoo/ in the bundle)"
  if ((!have_gpu)); then
    zoo="not run (nvidia-smi sees no GPU)"
  elif [[ -f "$BUNDLE/zoo/gpu_agreement.py" ]]; then
    say
    say "== zoo on cuda vs cpu (budget ${ZOO_BUDGET_S} s): $BUNDLE/zoo"
    mkdir -p "$WORK/wrapper"
    printf '#!/bin/bash\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$CASTOR_LD" "$BUNDLE/bin/castor" \
      >"$WORK/wrapper/castor"
    chmod +x "$WORK/wrapper/castor"
    timeout -k 5 "$ZOO_BUDGET_S" python3 "$BUNDLE/zoo/gpu_agreement.py" \
      --castor "$WORK/wrapper/castor" --timeout 60 \
      --expected-failures "$BUNDLE/zoo/expected_failures.txt" "$BUNDLE/zoo" \
      2>&1 | tee "$OUT_DIR/logs/zoo.log"
    local zoo_rc="${PIPESTATUS[0]}"
    zoo="$(tail -n 1 "$OUT_DIR/logs/zoo.log") (exit $zoo_rc; logs/zoo.log)"
    ((zoo_rc == 0)) || problems=1
  fi

  # --- the benchmark ---------------------------------------------------------------------
  local bench_rc="not run" node_bench_rc="" bench_script
  say
  if [[ -n "${GPU_CHECK_SKIP_BENCH:-}" ]]; then
    say "== benchmark skipped (GPU_CHECK_SKIP_BENCH)"
  else
    bench_script="$BUNDLE/bench/gpu_train_vs_torch.py"
    [[ -f "$bench_script" ]] || bench_script="$ROOT/bench/gpu_train_vs_torch.py"
    # castor through a wrapper that sets its library path; python keeps its own.
    mkdir -p "$WORK/wrapper"
    cat >"$WORK/wrapper/castor" <<EOF
#!/bin/sh
LD_LIBRARY_PATH='$CASTOR_LD' exec '$BUNDLE/bin/castor' "\$@"
EOF
    chmod +x "$WORK/wrapper/castor"
    local extra_args=()
    read -r -a extra_args <<<"${GPU_CHECK_BENCH_ARGS:-}"
    say "== benchmark (--quick, time budget ${BENCH_BUDGET_S} s): $bench_script"
    timeout -k 10 "$((BENCH_BUDGET_S + 15))" python3 "$bench_script" \
      --castor "$WORK/wrapper/castor" --models-dir "$BUNDLE/models" --quick \
      --time-budget "$BENCH_BUDGET_S" --json "$OUT_DIR/bench.json" --work-dir "$OUT_DIR/bench" \
      "${extra_args[@]}" 2>&1 | tee "$OUT_DIR/logs/bench.log"
    bench_rc="${PIPESTATUS[0]}"
    if [[ "$bench_rc" == 3 ]]; then
      problems=1
    fi
    # Steps that are not replayed (the first two of a run, an epoch's
    # smaller last batch, evaluation) run node by node: their speed, at a
    # batch where the host-side cost of each kernel call shows. Within the
    # suggested 540 s run limit: it gets what is left up to 475 s.
    local node_budget=$((475 - $(elapsed)))
    if ((node_budget > NODE_BENCH_BUDGET_S)); then node_budget=$NODE_BENCH_BUDGET_S; fi
    say
    if ((node_budget < 15)); then
      say "== node-by-node steps: not run (the check is past 460 s)"
    else
      say "== node-by-node steps (--cuda-graphs off, batch 16, time budget ${node_budget} s)"
      timeout -k 10 "$((node_budget + 15))" python3 "$bench_script" \
        --castor "$WORK/wrapper/castor" --models-dir "$BUNDLE/models" --models cnn,resnet \
        --policies float32,mixed_float16 --batch 16 --warmup 2 --steps 5 --cuda-graphs off \
        --time-budget "$node_budget" --json "$OUT_DIR/bench_node_by_node.json" \
        --work-dir "$OUT_DIR/bench_node_by_node" 2>&1 | tee "$OUT_DIR/logs/bench_node_by_node.log"
      node_bench_rc="${PIPESTATUS[0]}"
      if [[ "$node_bench_rc" == 3 ]]; then
        problems=1
      fi
    fi
  fi

  # --- summary ---------------------------------------------------------------------------
  say
  say "==================== castor GPU check summary ===================="
  say "GPU: $gpu_line"
  say "castor: $(head -n 2 <<<"$version" | tr '\n' ';' | sed 's/;$//; s/;/; /')"
  say "tests (${#TEST_NAMES[@]} binaries):"
  local sum_p=0 sum_f=0 sum_s=0
  printf '  %-36s %-11s %6s %6s %7s %5s\n' binary status passed failed skipped s
  for name in "${TEST_NAMES[@]}"; do
    printf '  %-36s %-11s %6s %6s %7s %5s\n' "$name" "${T_STATUS[$name]}" \
      "${T_PASSED[$name]:--}" "${T_FAILED[$name]:--}" "${T_SKIPPED[$name]:--}" \
      "${T_SECONDS[$name]:--}"
    sum_p=$((sum_p + ${T_PASSED[$name]:-0}))
    sum_f=$((sum_f + ${T_FAILED[$name]:-0}))
    sum_s=$((sum_s + ${T_SKIPPED[$name]:-0}))
  done
  printf '  %-36s %-11s %6s %6s %7s\n' total "" "$sum_p" "$sum_f" "$sum_s"
  for name in "${TEST_NAMES[@]}"; do
    if [[ -n "${T_DETAIL[$name]:-}" ]]; then
      say "  $name ${T_STATUS[$name]}: ${T_DETAIL[$name]}"
    fi
  done
  # The slowest tests, from the binaries' gtest JSON reports.
  python3 - "$OUT_DIR/logs" <<'EOF' 2>/dev/null
import glob, json, os, sys
times = []
for path in glob.glob(os.path.join(sys.argv[1], "*.json")):
    try:
        report = json.load(open(path))
    except ValueError:
        continue  # a binary killed while writing its report
    for suite in report.get("testsuites", []):
        for test in suite.get("testsuite", []):
            seconds = float(str(test.get("time", "0s")).rstrip("s") or 0)
            times.append((seconds, "%s.%s" % (suite["name"], test["name"])))
if times:
    print("slowest tests:")
    for seconds, name in sorted(times, reverse=True)[:6]:
        print("  %7.1f s  %s" % (seconds, name))
EOF
  say "conformance on cuda: $conformance"
  say "zoo on cuda vs cpu: $zoo"
  if [[ "$bench_rc" == "not run" ]]; then
    say "benchmark: not run"
  else
    say "benchmark (exit $bench_rc; bench.json, logs/bench.log):"
  fi
  if [[ "$bench_rc" == "not run" ]]; then
    :
  elif grep -q '^castor vs PyTorch training throughput' "$OUT_DIR/logs/bench.log" 2>/dev/null
  then
    sed -n '/^castor vs PyTorch training throughput/,$p' "$OUT_DIR/logs/bench.log" \
      | grep -v '^results: ' | sed 's/^/  /'
  else
    say "  no table (see logs/bench.log)"
    tail -n 5 "$OUT_DIR/logs/bench.log" 2>/dev/null | sed 's/^/  /'
  fi
  if [[ -n "${node_bench_rc:-}" ]]; then
    say "node-by-node steps (exit $node_bench_rc; bench_node_by_node.json):"
    if grep -q '^castor vs PyTorch training throughput' "$OUT_DIR/logs/bench_node_by_node.log"
    then
      sed -n '/^castor vs PyTorch training throughput/,$p' \
        "$OUT_DIR/logs/bench_node_by_node.log" | grep -v '^results: ' | sed 's/^/  /'
    else
      tail -n 5 "$OUT_DIR/logs/bench_node_by_node.log" 2>/dev/null | sed 's/^/  /'
    fi
  fi
  say "wall time: $(elapsed) s; files under $OUT_DIR"
  if ((problems)); then
    say "RESULT: FAILED (see above)"
    return 1
  fi
  say "RESULT: ok"
  return 0
}

mkdir -p "$OUT_DIR" 2>/dev/null
check "$@" 2>&1 | tee "$OUT_DIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
