#!/usr/bin/python3
"""Training speed of `castor train` vs PyTorch CPU on the sample models.

For each model (default: the four opset-17 sample models, cnn, mlp, resnet,
transformer) this script measures training samples/s at the same batch size
(--batch, default 128), with the same optimizer (Adam, lr 1e-3, PyTorch's
default betas/eps), the same initial weights and the same data:

  * castor: `castor train MODEL --policy P --optimizer adam --lr 1e-3
    --batch B --max-steps W+S --no-shuffle --threads T --metrics F` for the
    policies float32, mixed_bfloat16 and mixed_float16. It reads
    samples_per_s (batch / wall time of one Trainer::Step) from the per-step
    JSONL lines, drops the first W (--warmup) steps and any step skipped by
    loss scaling, and takes the median. Each castor run starts once this
    script's own process has gone idle (PyTorch's BLAS and OpenMP threads
    spin for a while after a PyTorch row, on the same vCPUs).
  * PyTorch: the nn.Module from models/generate.py, built with its
    build(name, cls) (the same seeded initial weights the ONNX file was
    exported from), in train() mode (BatchNorm with batch statistics, as
    castor trains it), torch.set_num_threads(T), torch.optim.Adam(lr=1e-3),
    F.cross_entropy on the logits. One step is zero_grad + forward + loss +
    backward + optimizer.step, timed with time.perf_counter(); median over S
    steps after W warmup steps. Two rows: float32, and bfloat16 autocast
    (forward and loss inside torch.autocast('cpu', dtype=torch.bfloat16),
    backward and step outside, the usual recipe).

OpenBLAS: torch's GEMMs go through Debian's OpenBLAS too. Unless
--torch-own-blas-core is given (or OPENBLAS_CORETYPE is already set), the
script sets OPENBLAS_CORETYPE to the kernel set `castor --version` reports
before importing torch, so both runtimes use the same GEMM kernels (castor
replaces OpenBLAS's generic fallback on CPUs it does not know).

Data: Fashion-MNIST's training split, read from the IDX files in --data-dir
(default /usr/share/datasets/fashion-mnist) by both sides, pixels / 255 as
float32, batches in file order (castor --no-shuffle). castor gets only the
training files, so it does not evaluate on the test split at the end. Step k
of both runtimes sees the same batch, so the first step's loss (before any
update) must agree; the script prints both and warns when the float32 ones
differ by more than 1e-3 relative.

--baseline-env VAR=VALUE (repeatable) adds a castor mixed_bfloat16 run
with VAR=VALUE in its environment (e.g. CASTOR_AVX512BF16=off: the widened
GEMMs) right after the plain one, and a before/after table.

--rounds N measures every row N times (the rows of a model alternating, as
in one round) and keeps each row's median round: on a shared VM whose
neighbours come and go, the ratios of one round can be off by 20%. With
N > 1 a second table gives each row's best round (its highest samples/s):
noise only ever slows a run down, and on a VM whose two vCPUs the host
sometimes places far apart (a whole process then runs up to 1.8x slower,
the same for castor and torch) the median of five rounds can land in
either mode for either row; the best round is what each runtime does
unhindered (Python's timeit takes the minimum for the same reason).
A third table divides rows of the same round (castor mixed_bfloat16
and torch bf16 autocast run one after the other) and takes the median of
those ratios: both sides of each saw the same phase of the machine, where
the best rounds of two rows may come from different phases.

Ratios are castor samples/s divided by PyTorch samples/s: > 1 means castor
is faster. The mixed_float16 ratio is against PyTorch's bfloat16 autocast
(PyTorch has no float16 autocast on the CPU); the table also gives castor
mixed_bfloat16 over castor float32, and the goals line checks issue #29's
targets.

The script measures; it never fails on speed. Exit status: 0 when every run
finished; 1 when a castor or torch run failed; 2 on a setup error (missing
binary, model, data or torch).

Run from the repository root with Debian's interpreter (torch 1.13):
  /usr/bin/python3 bench/train_vs_torch.py --castor build/castor --json /tmp/train.json
"""

import argparse
import datetime
import gzip
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:  # reported in main(): run with /usr/bin/python3
    np = None

SAMPLE_MODELS = ["cnn", "mlp", "resnet", "transformer"]
CASTOR_POLICIES = ["float32", "mixed_bfloat16", "mixed_float16"]
TORCH_ROWS = ["float32", "bf16_autocast"]

# Timed steps per model when --steps is not given: enough for a stable
# median on a noisy 2-vCPU VM (with 10 ResNet steps, a row's median moved
# by 15% between rounds; the ResNet's and the transformer's rows now take
# 25-120 ms per step there), few enough that the default run stays under
# about 5 minutes.
DEFAULT_STEPS = {"cnn": 30, "mlp": 50, "resnet": 40, "transformer": 40}
DEFAULT_WARMUP = 3


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def torch_cpu_capability(torch):
    """The vector ISA PyTorch's own kernels use (AVX2, AVX512, ...)."""
    match = re.search(r"CPU capability usage: (\S+)", torch.__config__.show())
    return match.group(1) if match else "unknown"


def read_idx(path):
    """An IDX file (gzip or not) as a NumPy array (uint8 data only)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError("%s: not an IDX file of uint8 (magic %r)" % (path, raw[:4]))
    rank = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank)
    if data.size != int(np.prod(dims)):
        raise ValueError("%s: header says %s, file holds %d bytes of data"
                         % (path, dims, data.size))
    return data.reshape(dims)


def find_idx(data_dir, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError("%s: no %s[.gz]" % (data_dir, stem))


def load_generate_module(path):
    """models/generate.py as a module (its main() does not run on import)."""
    spec = importlib.util.spec_from_file_location("castor_sample_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------
# castor
# --------------------------------------------------------------------------

def wait_until_this_process_idles(window_s=0.05, idle_cpu_s=0.005, limit_s=3.0):
    """Waits until this process (PyTorch's threads) used under `idle_cpu_s`
    of CPU in a `window_s` window, at most `limit_s`; returns the seconds
    waited. After a PyTorch row its BLAS and OpenMP threads spin for up to
    a few hundred milliseconds (measured: ~0.1 s of CPU in the 0.25 s after
    the MLP's last step, with either OMP_WAIT_POLICY), long enough to share
    the 2 vCPUs with the whole of a short castor run (the MLP's 53 steps
    take ~0.1 s) and halve it."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        before = time.process_time()
        time.sleep(window_s)
        if time.process_time() - before < idle_cpu_s:
            break
    return time.perf_counter() - started


def run_castor(binary, model_path, data_spec, policy, batch, warmup, steps, threads,
               work_dir, extra_env=None):
    """Runs castor train (with `extra_env` added to the environment, if
    given); returns a dict with the median samples/s etc."""
    metrics_path = os.path.join(work_dir, "%s_%s%s.jsonl" % (
        os.path.basename(model_path).split(".")[0], policy, "_baseline" if extra_env else ""))
    cmd = [binary, "train", model_path, "--data", data_spec, "--policy", policy,
           "--optimizer", "adam", "--lr", "0.001", "--batch", str(batch),
           "--max-steps", str(warmup + steps), "--no-shuffle",
           "--threads", str(threads), "--metrics", metrics_path]
    wait_until_this_process_idles()
    started = time.perf_counter()
    env = dict(os.environ, **extra_env) if extra_env else None
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {"error": "exit %d: %s" % (proc.returncode, proc.stdout.strip()[-2000:]),
                "command": " ".join(cmd)}
    records = []
    with open(metrics_path) as f:
        for line in f:
            record = json.loads(line)
            if "samples_per_s" in record and "step" in record:  # not the summary line
                records.append(record)
    timed = [r for r in records[warmup:] if not r["skipped"]]
    skipped = sum(1 for r in records[warmup:] if r["skipped"])
    if not timed:
        return {"error": "no timed, non-skipped steps in %s" % metrics_path,
                "command": " ".join(cmd)}
    rates = [r["samples_per_s"] for r in timed]
    return {
        "samples_per_s": statistics.median(rates),
        "step_ms": 1000.0 * batch / statistics.median(rates),
        "timed_steps": len(timed),
        "skipped_steps": skipped,
        "first_loss": records[0]["loss"],
        "last_loss": records[-1]["loss"],
        "process_wall_s": wall,
        "command": " ".join(cmd),
    }


# --------------------------------------------------------------------------
# PyTorch
# --------------------------------------------------------------------------

def run_torch(torch, gen, name, images, labels, row, batch, warmup, steps):
    import torch.nn.functional as F
    classes = dict((n, cls) for n, cls, _ in gen.MODELS)
    model = gen.build(name, classes[name])  # seeded: the ONNX file's weights
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    use_autocast = row == "bf16_autocast"
    batches_per_epoch = images.shape[0] // batch
    times, losses = [], []
    started = time.perf_counter()
    for step in range(warmup + steps):
        k = step % batches_per_epoch
        x = images[k * batch:(k + 1) * batch]
        y = labels[k * batch:(k + 1) * batch]
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_autocast):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    timed = times[warmup:]
    step_s = statistics.median(timed)
    return {
        "samples_per_s": batch / step_s,
        "step_ms": 1000.0 * step_s,
        "timed_steps": len(timed),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "process_wall_s": time.perf_counter() - started,
    }


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------

def ratio(a, b):
    if a is None or b is None or "error" in a or "error" in b:
        return None
    return a["samples_per_s"] / b["samples_per_s"]


def fmt_rate(r):
    if r is None:
        return "-"
    if "error" in r:
        return "FAILED"
    return "%.0f" % r["samples_per_s"]


def fmt_ratio(x):
    return "-" if x is None else "%.2f" % x


def castor_blas_core(binary):
    """The OpenBLAS kernel set castor runs ("SkylakeX", ...) per `castor --version`, or None."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"OpenBLAS (\w+) kernels", out)
    return match.group(1) if match else None


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--castor", default=None,
                        help="castor binary (default: build/castor, else build/tools/castor)")
    parser.add_argument("--models", default=",".join(SAMPLE_MODELS),
                        help="comma-separated sample model names (default: all four)")
    parser.add_argument("--models-dir", default=os.path.join(root, "models"))
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist",
                        help="directory with Fashion-MNIST's train-*-idx*-ubyte[.gz]")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per run (default: %s)" % ", ".join(
                            "%s %d" % kv for kv in DEFAULT_STEPS.items()))
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                        help="untimed steps before the timed ones (default %d)" % DEFAULT_WARMUP)
    parser.add_argument("--threads", type=int, default=2,
                        help="threads for both runtimes (default 2)")
    parser.add_argument("--omp-passive", action="store_true",
                        help="set OMP_WAIT_POLICY=PASSIVE for PyTorch (idle OpenMP threads "
                             "sleep instead of spinning; see bench/README.md)")
    parser.add_argument("--torch-own-blas-core", action="store_true",
                        help="let PyTorch's OpenBLAS pick its kernels itself instead of "
                             "using castor's (see bench/README.md)")
    parser.add_argument("--baseline-env", action="append", default=[], metavar="VAR=VALUE",
                        help="also run castor mixed_bfloat16 with VAR=VALUE in its environment "
                             "(repeatable; e.g. CASTOR_AVX512BF16=off for the widened GEMMs), "
                             "right after the plain mixed_bfloat16 run, and print it as the "
                             "'before' column of a before/after table")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every row this many times, alternating, and keep each "
                             "row's median round (default 1; 3 on a busy or shared machine)")
    parser.add_argument("--json", default=None, help="write every number to this file")
    args = parser.parse_args()
    baseline_env = {}
    for item in args.baseline_env:
        if "=" not in item:
            print("error: --baseline-env %s: expected VAR=VALUE" % item, file=sys.stderr)
            return 2
        var, value = item.split("=", 1)
        baseline_env[var] = value

    binary = args.castor
    if binary is None:
        for candidate in ("build/castor", "build/tools/castor"):
            if os.path.exists(os.path.join(root, candidate)):
                binary = os.path.join(root, candidate)
                break
    if binary is None or not os.access(binary, os.X_OK):
        print("error: castor binary not found (%s); build it or pass --castor"
              % (binary or "build/castor"), file=sys.stderr)
        return 2

    if args.omp_passive:
        # libgomp reads this once, when torch loads it.
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    castor_blas = castor_blas_core(binary)
    if not args.torch_own_blas_core and castor_blas and "OPENBLAS_CORETYPE" not in os.environ:
        # OpenBLAS reads this once, when torch loads it: torch's GEMMs then
        # run on the same OpenBLAS kernels as castor's.
        os.environ["OPENBLAS_CORETYPE"] = castor_blas
    try:
        import torch
    except ImportError:
        torch = None
    if np is None or torch is None:
        print("error: %s cannot import %s; run with /usr/bin/python3 (Debian's torch 1.13)"
              % (sys.executable, "numpy" if np is None else "torch"), file=sys.stderr)
        return 2
    models = [m for m in args.models.split(",") if m]
    for m in models:
        path = os.path.join(args.models_dir, "%s_opset%d.onnx" % (m, args.opset))
        if m not in SAMPLE_MODELS or not os.path.exists(path):
            print("error: %s: not a sample model (%s)" % (m, path), file=sys.stderr)
            return 2
    try:
        train_images_path = find_idx(args.data_dir, "train-images-idx3-ubyte")
        train_labels_path = find_idx(args.data_dir, "train-labels-idx1-ubyte")
        images_u8 = read_idx(train_images_path)
        labels_u8 = read_idx(train_labels_path)
    except (OSError, ValueError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 2
    # Exactly castor's conversion: float32(v) / 255.0f.
    images = torch.from_numpy(
        (images_u8.astype(np.float32) / np.float32(255.0)).reshape(-1, 1, 28, 28))
    labels = torch.from_numpy(labels_u8.astype(np.int64))
    data_spec = "%s,%s" % (train_images_path, train_labels_path)  # no test split: no eval
    gen = load_generate_module(os.path.join(args.models_dir, "generate.py"))
    torch.set_num_threads(args.threads)

    print("castor %s vs PyTorch %s (CPU capability %s), %d threads, batch %d, Adam lr 1e-3, "
          "Fashion-MNIST train split in file order" % (
              binary, torch.__version__, torch_cpu_capability(torch), args.threads, args.batch))
    print("%s, %d CPUs, load average %.1f at start, OMP_WAIT_POLICY %s" % (
        cpu_model(), os.cpu_count(), load_average(),
        os.environ.get("OMP_WAIT_POLICY", "unset")))
    print("OpenBLAS kernels: castor %s, PyTorch %s" % (
        castor_blas or "unknown", os.environ.get("OPENBLAS_CORETYPE", "OpenBLAS's own choice")))
    results = {}
    failed = False
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="train_vs_torch_") as work_dir:
        # Run a private copy, so that a rebuild of the binary during the
        # run (a shared build directory) cannot switch binaries halfway
        # (with its CUDA backend module, which castor loads from beside
        # itself, when the build has one).
        binary_copy = os.path.join(work_dir, "castor")
        shutil.copy2(binary, binary_copy)
        module = os.path.join(os.path.dirname(os.path.abspath(binary)), "libcastor_cuda.so")
        if os.path.exists(module):
            shutil.copy2(module, os.path.join(work_dir, "libcastor_cuda.so"))
        for name in models:
            steps = args.steps if args.steps is not None else DEFAULT_STEPS[name]
            model_path = os.path.join(args.models_dir, "%s_opset%d.onnx" % (name, args.opset))
            entry = {"steps": steps, "warmup": args.warmup, "load_before": load_average()}
            # Alternate the runtimes so that load from other processes hits both.
            order = [("castor", "float32"), ("torch", "float32"),
                     ("castor", "mixed_bfloat16"), ("torch", "bf16_autocast"),
                     ("castor", "mixed_float16")]
            if baseline_env:
                order.insert(3, ("castor", "mixed_bfloat16_baseline"))
            # --rounds: the whole sequence again; each row keeps the round
            # with its median rate (a VM's neighbours come and go).
            rounds = {}
            for _ in range(args.rounds):
                for runtime, row in order:
                    if runtime == "castor":
                        baseline = row.endswith("_baseline")
                        r = run_castor(binary_copy, model_path, data_spec,
                                       row[:-len("_baseline")] if baseline else row, args.batch,
                                       args.warmup, steps, args.threads, work_dir,
                                       baseline_env if baseline else None)
                        if "command" in r:
                            r["command"] = r["command"].replace(binary_copy, binary, 1)
                    else:
                        try:
                            r = run_torch(torch, gen, name, images, labels, row, args.batch,
                                          args.warmup, steps)
                        except Exception as e:  # report and go on with the other rows
                            r = {"error": "%s: %s" % (type(e).__name__, e)}
                    rounds.setdefault("%s_%s" % (runtime, row), []).append(r)
                    if "error" in r:
                        failed = True
                        print("  %s %s %s: FAILED: %s" % (name, runtime, row, r["error"]),
                              file=sys.stderr)
                    else:
                        print("  %-11s %-6s %-14s %8.1f samples/s  %8.1f ms/step  "
                              "(%d steps, first loss %.5f%s)" % (
                                  name, runtime, row, r["samples_per_s"], r["step_ms"],
                                  r["timed_steps"], r["first_loss"],
                                  ", %d skipped" % r["skipped_steps"]
                                  if r.get("skipped_steps") else ""), flush=True)
            for key, runs in rounds.items():
                failures = [r for r in runs if "error" in r]
                if failures:
                    entry[key] = failures[0]
                    continue
                runs = sorted(runs, key=lambda r: r["samples_per_s"])
                entry[key] = dict(runs[len(runs) // 2],
                                  rounds_samples_per_s=[r["samples_per_s"] for r in runs],
                                  best_samples_per_s=runs[-1]["samples_per_s"])
            # Per round, the ratio of two rows measured minutes apart at most
            # (a round runs its rows back to back), then the median of those:
            # both sides of each ratio saw the same phase of the machine.
            def paired_median(a_key, b_key):
                a, b = rounds.get(a_key, []), rounds.get(b_key, [])
                if not a or len(a) != len(b) or any("error" in r for r in a + b):
                    return None
                return statistics.median(
                    x["samples_per_s"] / y["samples_per_s"] for x, y in zip(a, b))

            entry["paired_ratio_float32"] = paired_median("castor_float32", "torch_float32")
            entry["paired_ratio_mixed_bfloat16_vs_torch_bf16"] = paired_median(
                "castor_mixed_bfloat16", "torch_bf16_autocast")
            entry["paired_ratio_mixed_bfloat16_vs_castor_float32"] = paired_median(
                "castor_mixed_bfloat16", "castor_float32")
            entry["load_after"] = load_average()
            entry["ratio_float32"] = ratio(entry["castor_float32"], entry["torch_float32"])
            entry["ratio_mixed_bfloat16_vs_torch_bf16"] = ratio(
                entry["castor_mixed_bfloat16"], entry["torch_bf16_autocast"])
            entry["ratio_mixed_float16_vs_torch_bf16"] = ratio(
                entry["castor_mixed_float16"], entry["torch_bf16_autocast"])
            entry["ratio_mixed_bfloat16_vs_castor_float32"] = ratio(
                entry["castor_mixed_bfloat16"], entry["castor_float32"])
            cf, tf = entry["castor_float32"], entry["torch_float32"]
            if "error" not in cf and "error" not in tf:
                rel = abs(cf["first_loss"] - tf["first_loss"]) / abs(tf["first_loss"])
                entry["first_loss_rel_diff_float32"] = rel
                if rel > 1e-3:
                    print("  warning: %s: first-step float32 loss castor %.6f vs torch %.6f "
                          "(rel diff %.2e): the runs do not start from the same model/data"
                          % (name, cf["first_loss"], tf["first_loss"], rel), file=sys.stderr)
            results[name] = entry
    total_s = time.perf_counter() - started

    print()
    print("samples/s (median); ratio = castor / torch, > 1 means castor is faster; the "
          "mixed ratios are against torch's bf16 autocast")
    print()
    print("| model | castor f32 | torch f32 | ratio | castor mixed_bf16 | torch bf16 autocast "
          "| ratio | mixed_bf16 / castor f32 | castor mixed_f16 | ratio vs torch bf16 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in models:
        e = results[name]
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name, fmt_rate(e["castor_float32"]), fmt_rate(e["torch_float32"]),
            fmt_ratio(e["ratio_float32"]), fmt_rate(e["castor_mixed_bfloat16"]),
            fmt_rate(e["torch_bf16_autocast"]),
            fmt_ratio(e["ratio_mixed_bfloat16_vs_torch_bf16"]),
            fmt_ratio(e["ratio_mixed_bfloat16_vs_castor_float32"]),
            fmt_rate(e["castor_mixed_float16"]),
            fmt_ratio(e["ratio_mixed_float16_vs_torch_bf16"])))
    print()
    if baseline_env:
        label = " ".join("%s=%s" % kv for kv in sorted(baseline_env.items()))
        print("castor mixed_bfloat16 before (%s) and after, same run; ratios over castor "
              "float32 and torch bf16 autocast" % label)
        print()
        print("| model | castor f32 | mixed_bf16 before | mixed_bf16 after | after / before | "
              "before / f32 | after / f32 | before / torch bf16 | after / torch bf16 |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name in models:
            e = results[name]
            before, after = e["castor_mixed_bfloat16_baseline"], e["castor_mixed_bfloat16"]
            f32, tbf = e["castor_float32"], e["torch_bf16_autocast"]
            print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, fmt_rate(f32), fmt_rate(before), fmt_rate(after),
                fmt_ratio(ratio(after, before)), fmt_ratio(ratio(before, f32)),
                fmt_ratio(ratio(after, f32)), fmt_ratio(ratio(before, tbf)),
                fmt_ratio(ratio(after, tbf))))
        print()
    def best(row):
        if row is None or "error" in row:
            return None
        return {"samples_per_s": row.get("best_samples_per_s", row["samples_per_s"])}

    if args.rounds > 1:
        print("samples/s (best of %d rounds); ratios as above" % args.rounds)
        print()
        print("| model | castor f32 | torch f32 | ratio | castor mixed_bf16 | torch bf16 autocast "
              "| ratio | mixed_bf16 / castor f32 |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name in models:
            e = results[name]
            cf, tf = best(e["castor_float32"]), best(e["torch_float32"])
            cb, tb = best(e["castor_mixed_bfloat16"]), best(e["torch_bf16_autocast"])
            e["best_ratio_float32"] = ratio(cf, tf)
            e["best_ratio_mixed_bfloat16_vs_torch_bf16"] = ratio(cb, tb)
            e["best_ratio_mixed_bfloat16_vs_castor_float32"] = ratio(cb, cf)
            print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, fmt_rate(cf), fmt_rate(tf), fmt_ratio(e["best_ratio_float32"]),
                fmt_rate(cb), fmt_rate(tb),
                fmt_ratio(e["best_ratio_mixed_bfloat16_vs_torch_bf16"]),
                fmt_ratio(e["best_ratio_mixed_bfloat16_vs_castor_float32"])))
        print()
        print("ratios of rows measured in the same round, median over the %d rounds"
              % args.rounds)
        print()
        print("| model | castor f32 / torch f32 | mixed_bf16 / torch bf16 autocast "
              "| mixed_bf16 / castor f32 |")
        print("| --- | ---: | ---: | ---: |")
        for name in models:
            e = results[name]
            print("| %s | %s | %s | %s |" % (
                name, fmt_ratio(e["paired_ratio_float32"]),
                fmt_ratio(e["paired_ratio_mixed_bfloat16_vs_torch_bf16"]),
                fmt_ratio(e["paired_ratio_mixed_bfloat16_vs_castor_float32"])))
        print()

    def goal_lines(prefix):
        lines = []
        for name in models:
            e = results[name]
            notes = []
            for key, label, goal in (
                    ("ratio_float32", "float32 / torch float32", 1.0),
                    ("ratio_mixed_bfloat16_vs_torch_bf16",
                     "mixed_bfloat16 / torch bf16 autocast", 1.2),
                    ("ratio_mixed_bfloat16_vs_castor_float32", "mixed_bfloat16 / castor float32",
                     1.3)):
                value = e.get(prefix + key)
                if value is None:
                    notes.append("%s not measured" % label)
                elif value < goal:
                    notes.append("%s %.2f < %g" % (label, value, goal))
            lines.append("%s: %s" % (name, "; ".join(notes) if notes else "all goals met"))
        return lines

    print("goals (issue #29, on a CPU with AVX512-BF16 or AMX: castor float32 >= torch float32; "
          "castor mixed_bfloat16 >= 1.2x torch bf16 autocast and >= 1.3x castor float32):")
    for line in goal_lines(""):
        print("  median rounds: " + line if args.rounds > 1 else "  " + line)
    if args.rounds > 1:
        for line in goal_lines("best_"):
            print("  best rounds:   " + line)
        for line in goal_lines("paired_"):
            print("  paired rounds: " + line)
    print("total %.0f s, load average %.1f at the end" % (total_s, load_average()))

    if args.json:
        report = {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "castor": binary,
            "torch": torch.__version__,
            "torch_cpu_capability": torch_cpu_capability(torch),
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
            "openblas_core_castor": castor_blas,
            "openblas_core_torch": os.environ.get("OPENBLAS_CORETYPE", "own choice"),
            "batch": args.batch,
            "optimizer": "adam lr 1e-3",
            "data": data_spec,
            "total_s": total_s,
            "baseline_env": baseline_env,
            "models": results,
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
