#!/usr/bin/env python3
"""Inference time of castor's CPU backend vs ONNX Runtime on the sample models.

For each model (default: the four opset-17 sample models) this script draws
one random float32 input batch (every symbolic dim bound to --batch), writes
it as .npy, and times

  * castor: bench/inference_bench (Executor::Run on the CPU backend with
    --threads threads), which reads that .npy and writes its outputs;
  * ONNX Runtime: an InferenceSession on CPUExecutionProvider with
    intra_op_num_threads=--threads, inter_op_num_threads=1, default graph
    optimizations (ORT_ENABLE_ALL), on the same arrays;

each as the median of --runs timed runs. The runs are split into --rounds
rounds that alternate castor and ORT (each round starts with --warmup untimed
runs), so that load from other processes on a busy machine hits both. It
checks castor's outputs against ORT's (max |castor - ORT| / max |ORT| must be
at most --rtol) and prints a table with the ratio castor/ORT (< 1: castor is
faster). For models with a ratio above --profile-above it prints castor's
per-kernel profile (inference_bench --profile).

Exit status: 0 when everything ran and agreed (whatever the speed); 1 on a
mismatch or when castor failed on a model; 2 on a setup error (missing
binary, model or onnxruntime).

Run from the repository root with the venv interpreter that has onnxruntime:
  .venv/bin/python bench/inference_vs_ort.py --binary build-release/bench/inference_bench
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

SAMPLE_MODELS = ["cnn", "mlp", "resnet", "transformer"]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def default_threads():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def output_file_name(value_name):
    """Mirror of castor::tools::OutputFileName (tools/run_command.cc)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", value_name)
    if name in ("", ".", ".."):
        name = "_" + name
    return name


def concrete_shape(shape, batch):
    return [d if isinstance(d, int) and d >= 0 else batch for d in shape]


def make_inputs(session, batch, seed):
    rng = np.random.default_rng(seed)
    inputs = {}
    for arg in session.get_inputs():
        if arg.type != "tensor(float)":
            raise SystemExit(f"input '{arg.name}' has type {arg.type}; only float32 inputs "
                             "are generated")
        inputs[arg.name] = rng.standard_normal(concrete_shape(arg.shape, batch)).astype(np.float32)
    return inputs


def time_ort(session, inputs, warmup, runs):
    """`runs` times in ms after `warmup` untimed runs, and the last outputs."""
    outputs = None
    for _ in range(warmup):
        outputs = session.run(None, inputs)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        outputs = session.run(None, inputs)
        times.append((time.perf_counter() - start) * 1e3)
    return times, outputs


def run_castor(args, model_path, input_files, output_dir, runs, profile=False):
    command = [args.binary, "--model", model_path, "--batch", str(args.batch),
               "--threads", str(args.threads), "--warmup", str(args.warmup),
               "--runs", str(runs), "--seed", str(args.seed)]
    for name, path in input_files.items():
        command += ["--input", f"{name}={path}"]
    if output_dir:
        command += ["--output-dir", output_dir]
    if profile:
        command += ["--profile"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        return None, f"exit {result.returncode}: {result.stderr.strip()}", result.stdout
    match = re.search(r"^RESULT (\{.*\})$", result.stdout, re.MULTILINE)
    if not match:
        return None, "no RESULT line in inference_bench output", result.stdout
    return json.loads(match.group(1)), None, result.stdout


def compare(session, castor_dir, ort_outputs, rtol):
    """Returns (max abs diff, max abs diff / max |ORT|, error text or None)."""
    worst_abs, worst_rel, error = 0.0, 0.0, None
    for arg, expected in zip(session.get_outputs(), ort_outputs):
        path = os.path.join(castor_dir, output_file_name(arg.name) + ".npy")
        if not os.path.exists(path):
            return worst_abs, worst_rel, f"castor wrote no output '{arg.name}' ({path})"
        actual = np.load(path)
        if actual.shape != expected.shape:
            return worst_abs, worst_rel, (f"output '{arg.name}': castor shape {actual.shape}, "
                                          f"ORT shape {expected.shape}")
        diff = float(np.max(np.abs(actual.astype(np.float64) - expected))) if expected.size else 0.0
        scale = float(np.max(np.abs(expected))) if expected.size else 0.0
        rel = diff / scale if scale > 0 else diff
        worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, rel)
        if not rel <= rtol:  # also catches NaN
            error = (f"output '{arg.name}': max |castor - ORT| = {diff:.3g}, "
                     f"{rel:.3g} of max |ORT| = {scale:.3g} (allowed {rtol:g})")
    return worst_abs, worst_rel, error


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default="build/bench/inference_bench",
                        help="the inference_bench binary (default: %(default)s)")
    parser.add_argument("--models-dir", default="models")
    parser.add_argument("--models", default=",".join(SAMPLE_MODELS),
                        help="comma-separated names; each is MODELS_DIR/<name>_opset<OPSET>.onnx")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=default_threads(),
                        help="threads for both runtimes (default: CPUs available, %(default)s)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30,
                        help="timed runs per runtime and model, split over --rounds")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternate castor and ORT this many times per model, each "
                             "round with its own warmup, so that load changes on a busy "
                             "machine hit both (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rtol", type=float, default=1e-3,
                        help="allowed max |castor - ORT| / max |ORT| (default: %(default)s)")
    parser.add_argument("--profile-above", type=float, default=1.5,
                        help="print castor's per-kernel profile for models with a ratio above "
                             "this (0: never; default %(default)s)")
    args = parser.parse_args()

    try:
        import onnxruntime as ort
    except ImportError:
        print("error: onnxruntime is not installed for this interpreter; run "
              ".venv/bin/python (tools/setup.sh creates .venv)", file=sys.stderr)
        return 2
    if not os.access(args.binary, os.X_OK):
        print(f"error: --binary {args.binary} is not an executable; build it with "
              "`ninja -C <build dir> inference_bench` (configure with "
              "-DCASTOR_BUILD_BENCHMARKS=ON)", file=sys.stderr)
        return 2

    print(f"castor CPU backend vs ONNX Runtime {ort.__version__} (CPUExecutionProvider)")
    print(f"CPU: {cpu_model()}; {default_threads()} CPUs available; threads used: {args.threads} "
          f"(ORT intra_op={args.threads}, inter_op=1)")
    runs_per_round = max(1, -(-args.runs // max(1, args.rounds)))
    print(f"batch {args.batch}, float32, median of {runs_per_round * max(1, args.rounds)} runs "
          f"per runtime: {max(1, args.rounds)} alternating rounds of {args.warmup} warmup + "
          f"{runs_per_round} timed runs; {datetime.date.today().isoformat()}")
    print()

    rows, failures, profiles = [], [], []
    with tempfile.TemporaryDirectory(prefix="castor-bench-") as tmp:
        for name in [m for m in args.models.split(",") if m]:
            model_path = os.path.join(args.models_dir, f"{name}_opset{args.opset}.onnx")
            if not os.path.exists(model_path):
                print(f"error: model {model_path} not found", file=sys.stderr)
                return 2
            options = ort.SessionOptions()
            options.intra_op_num_threads = args.threads
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
            inputs = make_inputs(session, args.batch, args.seed)
            model_dir = os.path.join(tmp, name)
            os.makedirs(model_dir)
            input_files = {}
            for i, (input_name, array) in enumerate(inputs.items()):
                input_files[input_name] = os.path.join(model_dir, f"input_{i}.npy")
                np.save(input_files[input_name], array)
            castor_out = os.path.join(model_dir, "castor_out")

            runs_per_round = max(1, -(-args.runs // max(1, args.rounds)))
            castor_times, ort_times, error, mismatch, diff = [], [], None, None, None
            for round_index in range(max(1, args.rounds)):
                out_dir = castor_out if round_index == 0 else None
                result, error, _ = run_castor(args, model_path, input_files, out_dir,
                                              runs_per_round)
                if error:
                    break
                castor_times += result["times_ms"]
                times, ort_outputs = time_ort(session, inputs, args.warmup, runs_per_round)
                ort_times += times
                if round_index == 0:
                    max_abs, rel, mismatch = compare(session, castor_out, ort_outputs, args.rtol)
                    diff = (max_abs, rel)
            if error:
                failures.append(f"{name}: castor failed: {error}")
                rows.append((name, None, None, None, None))
                continue
            if mismatch:
                failures.append(f"{name}: mismatch: {mismatch}")
            castor_ms = float(np.median(castor_times))
            ort_ms = float(np.median(ort_times))
            rows.append((name, castor_ms, ort_ms, castor_ms / ort_ms, diff))
            if args.profile_above > 0 and castor_ms / ort_ms > args.profile_above:
                _, perror, stdout = run_castor(args, model_path, input_files, None, args.runs,
                                               profile=True)
                text = stdout[stdout.find("profile ("):] if "profile (" in stdout else perror
                profiles.append((name, text))

    header = ("model", "castor ms/batch", "ORT ms/batch", "castor/ORT", "max abs diff (rel)")
    print("| " + " | ".join(header) + " |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, castor_ms, ort_ms, ratio, diff in rows:
        if castor_ms is None:
            print(f"| {name} | failed | | | |")
            continue
        print(f"| {name} | {castor_ms:.3f} | {ort_ms:.3f} | {ratio:.2f} | "
              f"{diff[0]:.2e} ({diff[1]:.1e}) |")
    for name, text in profiles:
        print(f"\ncastor profile of {name} (ratio above {args.profile_above}):")
        print(text.rstrip())
    if failures:
        print()
        for failure in failures:
            print(f"FAILED {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
