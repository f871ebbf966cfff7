#!/usr/bin/env python3
"""GPU training throughput: `castor train --backend cuda` vs PyTorch eager.

Both runtimes train the same models, at the same batch size, with the same
optimizer (Adam, lr 1e-3, PyTorch's default betas and eps), on the same
synthetic data, on the same GPU, in the same run, under three precisions:

  policy          castor                          PyTorch
  float32         --policy float32                float32; TF32 off for matmul and cuDNN
                                                  (castor's float32 is true float32);
                                                  with --tf32 TF32 on for both
  mixed_float16   --policy mixed_float16          torch.autocast(float16) + GradScaler
                  (dynamic loss scaling)
  mixed_bfloat16  --policy mixed_bfloat16         torch.autocast(bfloat16), no scaler

Models: the four opset-17 sample models (mlp, cnn, resnet, transformer; input
[N,1,28,28] float32, 10 classes) and `big_transformer`, a GEMM-heavy encoder
defined here (d_model 1024, 16 heads, MLP 4096, 12 layers, 512 tokens of 64
features; input [N,1,512,64] float32, 10 classes; ~152M parameters). The
PyTorch modules of the sample models are the classes of models/generate.py,
built by its build() (the seeded weights the ONNX files were exported from),
so the first float32 loss must agree between the runtimes (checked). castor
trains big_transformer from an ONNX file exported from the very same torch
module with torch.onnx.export (TorchScript exporter, dynamo=False, first;
then the default exporter) into a temporary directory; if both fail, castor's
cells of that model read "n/a: export failed: <reason>".

castor: `castor train MODEL --backend cuda --policy P --data DATA.npz --batch B
--max-steps W+S --epochs E --no-shuffle --lr 1e-3 --optimizer adam --metrics
M.jsonl --cuda-graphs auto` (off with this script's --cuda-graphs off:
every step node by node; --tf32 with this script's --tf32), where DATA.npz
holds `x` (float32 images) and `y` (int64 labels; no test split, so castor
does not evaluate). samples/s is the median of the per-step lines after the
W warm-up steps (skipped steps left out), the steady state torch's timing
also measures; the summary line of the metrics file ({"summary": true, ...,
"samples_per_s": ..., "peak_device_memory_bytes": ...}) gives peak memory
and stands in for samples/s when no step line is left. The JSON keeps both
numbers.

PyTorch: model.train() (BatchNorm on batch statistics, as castor trains it),
one step = zero_grad, forward + cross-entropy (inside autocast for the mixed
policies), backward, optimizer step (through the GradScaler for float16); the
batch is copied from pinned host memory each step, as castor copies it. W
warm-up steps, then S timed steps between torch.cuda.synchronize() calls.
Peak memory is torch.cuda.max_memory_allocated() over the run (weights,
optimizer state, activations), reset before each run.

Printed: one table with castor and PyTorch samples/s, castor/PyTorch (> 1:
castor is faster), peak MiB of each, and castor mixed / castor float32. The
same numbers go to --json, rewritten after every run, so a run cut short
still leaves its rows.

--quick keeps the whole run under about 2.5 minutes on an H200 (fewer
steps, big_transformer at batch 4, a --time-budget of 140 s after which the
remaining runs are reported as not run). --device cpu runs castor with
--backend cpu and PyTorch on the CPU with tiny step counts and without
big_transformer: a check of this script's logic on a machine without a GPU.

Works with torch 1.13 (Debian's) and torch 2.x. Exit status: 0 when every run
that was attempted finished (n/a cells from an export failure or the time
budget included); 1 when a castor or PyTorch run failed or timed out, or the
script was interrupted (SIGTERM); 2 on a setup error; 3 when castor crashed
(killed by a signal).

  python3 bench/gpu_train_vs_torch.py --castor build/castor --quick --json /tmp/gpu.json
  /usr/bin/python3 bench/gpu_train_vs_torch.py --device cpu --quick   # logic check, no GPU
"""

import argparse
import contextlib
import copy
import datetime
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings

try:
    import numpy as np
except ImportError:  # reported in main()
    np = None
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # reported in main()
    torch = None

SAMPLE_MODELS = ["mlp", "cnn", "resnet", "transformer"]
BIG_MODEL = "big_transformer"
ALL_MODELS = SAMPLE_MODELS + [BIG_MODEL]
POLICIES = ["float32", "mixed_float16", "mixed_bfloat16"]
NUM_CLASSES = 10

# big_transformer: the GEMM-heavy model (defined below, exported for castor).
BIG_DIM = 1024
BIG_HEADS = 16
BIG_HIDDEN = 4096
BIG_LAYERS = 12
BIG_TOKENS = 512
BIG_FEATURES = 64

# Step counts, batch sizes and per-run timeouts by mode. "small" is the four
# sample models, "big" is big_transformer. Distinct batches: the data set is
# this many batches long and both runtimes cycle through it in order.
SETTINGS = {
    # mode: (small batch, warmup, steps, timeout s), (big batch, warmup, steps, timeout s)
    "cuda": ((512, 10, 100, 300), (16, 3, 20, 600)),
    "cuda_quick": ((256, 3, 15, 30), (4, 2, 5, 90)),
    "cpu": ((32, 2, 5, 300), None),
    "cpu_quick": ((16, 1, 2, 120), None),
}
DISTINCT_BATCHES = 4
QUICK_TIME_BUDGET_S = 140


class Interrupted(Exception):
    """SIGTERM (for example from `timeout`): finish the report and stop."""


def _on_sigterm(signum, frame):
    raise Interrupted("interrupted by signal %d" % signum)


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------

def load_generate_module(paths):
    """models/generate.py as a module: the sample models' torch definitions.

    Importing it has no side effects (its main() only runs as a script), but
    it imports `onnx` (and onnx.numpy_helper) at the top for its export and
    check code, which the model classes do not use. Where onnx is not
    installed (the GPU machine has only torch and onnxruntime), a placeholder
    module stands in during the import and is removed right after, so that
    torch.onnx never sees it.
    """
    path = next((p for p in paths if os.path.exists(p)), None)
    if path is None:
        raise FileNotFoundError("models/generate.py not found (looked in %s)" % ", ".join(paths))
    placeholders = []
    try:
        importlib.import_module("onnx")
    except ImportError:
        stub = types.ModuleType("onnx")
        stub.numpy_helper = types.ModuleType("onnx.numpy_helper")
        sys.modules["onnx"] = stub
        sys.modules["onnx.numpy_helper"] = stub.numpy_helper
        placeholders = ["onnx", "onnx.numpy_helper"]
    try:
        spec = importlib.util.spec_from_file_location("castor_sample_models", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name in placeholders:
            sys.modules.pop(name, None)
    return module, path


def define_big_transformer():
    """The GEMM-heavy encoder classifier, written like generate.py's
    Transformer (hand-written attention from MatMul/Transpose/Reshape/Softmax,
    exact GELU, pre-LayerNorm) but with BIG_TOKENS tokens: generate.py's
    attention hard-codes its 28 tokens, so it is defined here."""

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = BIG_DIM // BIG_HEADS
            self.scale = 1.0 / math.sqrt(self.head_dim)
            self.q = nn.Linear(BIG_DIM, BIG_DIM)
            self.k = nn.Linear(BIG_DIM, BIG_DIM)
            self.v = nn.Linear(BIG_DIM, BIG_DIM)
            self.out = nn.Linear(BIG_DIM, BIG_DIM)

        def split(self, t):
            # [N,T,D] -> [N,H,T,Dh]; -1 keeps the batch dimension dynamic.
            return t.reshape(-1, BIG_TOKENS, BIG_HEADS, self.head_dim).transpose(1, 2)

        def forward(self, x):
            q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
            attn = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * self.scale, dim=-1)
            y = torch.matmul(attn, v).transpose(1, 2).reshape(-1, BIG_TOKENS, BIG_DIM)
            return self.out(y)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(BIG_DIM)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(BIG_DIM)
            self.fc1 = nn.Linear(BIG_DIM, BIG_HIDDEN)
            self.gelu = nn.GELU()
            self.fc2 = nn.Linear(BIG_HIDDEN, BIG_DIM)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.fc2(self.gelu(self.fc1(self.ln2(x))))

    class BigTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(BIG_FEATURES, BIG_DIM)
            self.pos = nn.Parameter(torch.randn(1, BIG_TOKENS, BIG_DIM) * 0.02)
            self.layers = nn.ModuleList([Layer() for _ in range(BIG_LAYERS)])
            self.ln = nn.LayerNorm(BIG_DIM)
            self.head = nn.Linear(BIG_DIM, NUM_CLASSES)

        def forward(self, x):
            x = x.reshape(-1, BIG_TOKENS, BIG_FEATURES)   # [N,1,T,F] -> [N,T,F]
            x = self.embed(x) + self.pos
            for layer in self.layers:
                x = layer(x)
            return self.head(self.ln(x).mean(dim=1))

    return BigTransformer


def export_onnx(model, path, opset, input_shape):
    """Exports `model` (eval mode) to `path`, like models/generate.py does;
    returns (exporter description, None) or (None, reason)."""
    model.eval()
    dummy = torch.zeros(2, *input_shape)
    common = dict(export_params=True, opset_version=opset, do_constant_folding=True,
                  input_names=["input"], output_names=["logits"],
                  dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
    training_mode = getattr(getattr(torch.onnx, "TrainingMode", None), "PRESERVE", None)
    torchscript = dict(common, dynamo=False)
    if training_mode is not None:
        torchscript["training"] = training_mode  # as generate.py
    attempts = [
        # torch 2.x: the TorchScript exporter.
        ("torch.onnx.export(dynamo=False)", torchscript),
        # torch 1.13 (no dynamo argument) or the default (dynamo) exporter of
        # torch 2.x, with the weights inside the file.
        ("torch.onnx.export (default exporter)", dict(common, external_data=False)),
        ("torch.onnx.export (default exporter)", dict(common)),
    ]
    reasons = []
    for label, kwargs in attempts:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(model, (dummy,), path, **kwargs)
            if os.path.exists(path) and os.path.getsize(path) > 0:
                return label, None
            reasons.append("%s wrote no file" % label)
        except TypeError as e:  # an argument this torch does not take: next attempt
            reasons.append("%s: %s" % (label, one_line(e)))
        except Exception as e:  # noqa: BLE001 -- any exporter failure is reported
            reasons.append("%s: %s: %s" % (label, type(e).__name__, one_line(e)))
    return None, "; ".join(reasons)


def build_models(gen, names):
    """{name: (float32 torch module on the CPU, input shape without N)}."""
    classes = dict((n, cls) for n, cls, _ in gen.MODELS)
    models = {}
    for name in names:
        if name == BIG_MODEL:
            # generate.build seeds the generator from the name and gives every
            # LayerNorm distinct weights (equal initializers would be merged
            # by the exporter, tying parameters that train separately).
            models[name] = (gen.build(name, define_big_transformer()),
                            (1, BIG_TOKENS, BIG_FEATURES))
        else:
            models[name] = (gen.build(name, classes[name]), (1, 28, 28))
    return models


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

def make_data(name, input_shape, batch, work_dir):
    """Synthetic float32 inputs in [0, 1) and int64 labels, DISTINCT_BATCHES
    batches long, as arrays and as an .npz castor reads (x, y)."""
    rng = np.random.default_rng(sum(map(ord, name)))
    count = batch * DISTINCT_BATCHES
    x = rng.random((count,) + tuple(input_shape), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, size=count, dtype=np.int64)
    path = os.path.join(work_dir, "%s_b%d.npz" % (name, batch))
    np.savez(path, x=x, y=y)
    return x, y, path


# --------------------------------------------------------------------------
# castor
# --------------------------------------------------------------------------

def one_line(e, limit=300):
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + "..."


def castor_version(binary):
    try:
        proc = subprocess.run([binary, "--version"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=60)
        return proc.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return "castor --version failed: %s" % one_line(e)


def read_metrics(path):
    """(per-step records, summary record or None) of a castor metrics file."""
    steps, summary = [], None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line of a killed run
            if record.get("summary"):
                summary = record
            elif "step" in record and "samples_per_s" in record:
                steps.append(record)
    return steps, summary


def run_castor(binary, backend, model_path, data_path, policy, batch, warmup, steps,
               timeout_s, work_dir, tag, cuda_graphs="auto", tf32=False):
    metrics_path = os.path.join(work_dir, "castor_%s.jsonl" % tag)
    log_path = os.path.join(work_dir, "castor_%s.log" % tag)
    total = warmup + steps
    cmd = [binary, "train", model_path, "--backend", backend, "--policy", policy,
           "--data", data_path, "--batch", str(batch), "--max-steps", str(total),
           "--epochs", str(-(-total // DISTINCT_BATCHES)), "--no-shuffle",
           "--lr", "1e-3", "--optimizer", "adam", "--metrics", metrics_path]
    if backend == "cpu":
        cmd += ["--threads", str(torch.get_num_threads())]  # as many as PyTorch uses
    else:
        cmd += ["--cuda-graphs", cuda_graphs] + (["--tf32"] if tf32 else [])
    result = {"command": " ".join(cmd), "log": log_path}
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout_s)
        output, rc = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as e:
        output = e.output.decode(errors="replace") if isinstance(e.output, bytes) else (
            e.output or "")
        rc = None
    result["process_wall_s"] = time.perf_counter() - started
    with open(log_path, "w") as f:
        f.write("$ %s\n%s" % (" ".join(cmd), output))
    if rc is None:
        result["error"] = "timeout after %.0f s" % timeout_s
        return result
    if rc != 0:
        tail = one_line(" | ".join(output.strip().splitlines()[-3:]))
        if rc < 0:
            result["crashed"] = True
            result["error"] = "crashed (signal %d)%s" % (-rc, ": " + tail if tail else "")
        else:
            result["error"] = "exit %d%s" % (rc, ": " + tail if tail else "")
        return result
    if not os.path.exists(metrics_path):
        result["error"] = "no metrics file %s" % metrics_path
        return result
    records, summary = read_metrics(metrics_path)
    timed = [r for r in records[warmup:] if not r.get("skipped")]
    if records:
        result["first_loss"] = records[0].get("loss")
        result["last_loss"] = records[-1].get("loss")
    result["skipped_steps"] = sum(1 for r in records if r.get("skipped"))
    if timed:
        result["steady_samples_per_s"] = statistics.median(r["samples_per_s"] for r in timed)
    if summary is not None:
        result["summary"] = summary
        if "skipped" in summary:
            result["skipped_steps"] = summary["skipped"]
        if "replayed_steps" in summary:
            result["replayed_steps"] = summary["replayed_steps"]
    # Steady state, like torch's timing: the median step after the warm-up
    # (the summary's mean includes planning and first allocations).
    if "steady_samples_per_s" in result:
        result["samples_per_s"] = result["steady_samples_per_s"]
        result["samples_per_s_source"] = "median of per-step lines after %d warm-up" % warmup
    elif summary is not None:
        result["samples_per_s"] = summary.get("samples_per_s")
        result["samples_per_s_source"] = "summary line (all steps)"
    if result.get("samples_per_s") is None:
        result["error"] = "no samples_per_s in %s (%d step lines)" % (metrics_path, len(records))
        return result
    peak = summary.get("peak_device_memory_bytes") if summary else None
    if peak:
        result["peak_mib"] = peak / 1048576.0
        result["peak_source"] = "peak_device_memory_bytes"
    else:
        activations = summary.get("peak_activation_bytes") if summary else None
        if activations:
            result["peak_mib"] = activations / 1048576.0
        else:
            match = re.search(r"peak memory\s+([0-9.]+) MiB of activations", output)
            result["peak_mib"] = float(match.group(1)) if match else None
        if result["peak_mib"] is not None:
            result["peak_source"] = "no device memory figure in the metrics"
    return result


# --------------------------------------------------------------------------
# PyTorch
# --------------------------------------------------------------------------

def amp_dtype_of(policy):
    return {"float32": None, "mixed_float16": torch.float16,
            "mixed_bfloat16": torch.bfloat16}[policy]


def autocast_works(device, dtype):
    """Whether torch.autocast(device, dtype) really computes in dtype (torch
    1.13's CPU autocast has no float16: it warns and does nothing)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = torch.ones(4, 4, device=device)
            with torch.autocast(device_type=device, dtype=dtype):
                return torch.mm(a, a).dtype == dtype
    except Exception:  # noqa: BLE001
        return False


def make_grad_scaler(device):
    """torch.amp.GradScaler(device) (torch >= 2.3), else torch.cuda.amp's; None
    where this torch has no scaler for the device (the CPU in torch 1.13)."""
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        try:
            return amp.GradScaler(device)
        except (TypeError, RuntimeError):
            pass
    if device == "cuda":
        return torch.cuda.amp.GradScaler()
    return None


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run_torch(base_model, x, y, policy, batch, warmup, steps, device):
    amp_dtype = amp_dtype_of(policy)
    result = {}
    if amp_dtype is not None and not autocast_works(device, amp_dtype):
        result["error"] = "n/a: torch %s has no %s autocast on %s" % (
            torch.__version__, str(amp_dtype).replace("torch.", ""), device)
        result["not_applicable"] = True
        return result
    dev = torch.device(device)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    model = copy.deepcopy(base_model).to(dev)
    model.train()  # BatchNorm on batch statistics, as castor trains it
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = make_grad_scaler(device) if amp_dtype is torch.float16 else None
    result["grad_scaler"] = scaler is not None
    pin = device == "cuda"
    xs = [torch.from_numpy(x[k * batch:(k + 1) * batch]) for k in range(DISTINCT_BATCHES)]
    ys = [torch.from_numpy(y[k * batch:(k + 1) * batch]) for k in range(DISTINCT_BATCHES)]
    if pin:
        xs = [t.pin_memory() for t in xs]
        ys = [t.pin_memory() for t in ys]

    def step(k):
        xb = xs[k % DISTINCT_BATCHES].to(dev, non_blocking=True)
        yb = ys[k % DISTINCT_BATCHES].to(dev, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        context = (torch.autocast(device_type=device, dtype=amp_dtype)
                   if amp_dtype is not None else contextlib.nullcontext())
        with context:
            loss = F.cross_entropy(model(xb), yb)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        return loss

    started = time.perf_counter()
    first_loss = float(step(0))
    for k in range(1, warmup):
        step(k)
    synchronize(device)
    t0 = time.perf_counter()
    loss = None
    for k in range(warmup, warmup + steps):
        loss = step(k)
    synchronize(device)
    elapsed = time.perf_counter() - t0
    result.update({
        "samples_per_s": batch * steps / elapsed,
        "step_ms": 1000.0 * elapsed / steps,
        "first_loss": first_loss,
        "last_loss": float(loss) if loss is not None else None,
        "process_wall_s": time.perf_counter() - started,
    })
    if device == "cuda":
        result["peak_mib"] = torch.cuda.max_memory_allocated(dev) / 1048576.0
    else:
        result["peak_mib"] = None
    return result


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------

def progress_line(policy, side, r):
    if "error" in r:
        return "  %-14s %-6s %s" % (policy, side, r["error"])
    first = r.get("first_loss")
    return "  %-14s %-6s %10.1f samples/s  peak %s MiB  first loss %s%s%s" % (
        policy, side, r["samples_per_s"],
        "-" if r.get("peak_mib") is None else "%.0f" % r["peak_mib"],
        "-" if first is None else "%.5f" % first,
        "  %d steps replayed as a CUDA graph" % r["replayed_steps"]
        if r.get("replayed_steps") is not None else "",
        "  (%s)" % r["samples_per_s_source"] if r.get("samples_per_s_source") else "")


def cell_rate(r):
    if r is None:
        return "-"
    if r.get("samples_per_s") is not None and "error" not in r:
        return "%.1f" % r["samples_per_s"]
    return "n/a"


def cell_number(v, fmt="%.2f"):
    return "-" if v is None else fmt % v


def safe_ratio(a, b):
    try:
        if a is None or b is None or "error" in a or "error" in b:
            return None
        return a["samples_per_s"] / b["samples_per_s"]
    except (TypeError, ZeroDivisionError, KeyError):
        return None


def format_table(rows):
    header = ["model", "policy", "batch", "castor samples/s", "torch samples/s", "castor/torch",
              "castor peak MiB", "torch peak MiB", "castor mixed/f32"]
    lines = []
    for row in rows:
        c, t = row.get("castor"), row.get("torch")
        lines.append([
            row["model"], row["policy"], str(row["batch"]), cell_rate(c), cell_rate(t),
            cell_number(row.get("ratio_castor_torch")),
            cell_number(c.get("peak_mib") if c and "error" not in c else None, "%.0f"),
            cell_number(t.get("peak_mib") if t and "error" not in t else None, "%.0f"),
            cell_number(row.get("ratio_castor_mixed_vs_float32")),
        ])
    widths = [max(len(header[i]), *(len(l[i]) for l in lines)) if lines else len(header[i])
              for i in range(len(header))]
    out = []
    for i, cells in enumerate([header] + lines):
        out.append("  ".join(cell.ljust(widths[j]) if j < 2 else cell.rjust(widths[j])
                             for j, cell in enumerate(cells)).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def row_notes(row):
    notes = []
    c = row.get("castor")
    if c and "error" not in c:
        steady = c.get("steady_samples_per_s")
        overall = (c.get("summary") or {}).get("samples_per_s")
        if steady and overall and abs(steady - overall) > 0.15 * steady:
            notes.append("%s %s castor: %.1f samples/s over all steps (summary line) vs %.1f "
                         "after warm-up (the table's)"
                         % (row["model"], row["policy"], overall, steady))
        if c.get("skipped_steps"):
            notes.append("%s %s castor: %d steps skipped by loss scaling"
                         % (row["model"], row["policy"], c["skipped_steps"]))
    return notes


def all_notes(rows, general):
    notes = list(general)
    partial = ["%s %s" % (r["model"], r["policy"]) for r in rows
               if "error" not in r.get("castor", {"error": 1})
               and r["castor"].get("peak_mib") is not None
               and r["castor"].get("peak_source") != "peak_device_memory_bytes"]
    if partial:
        notes.append("castor peak MiB counts activations only (the metrics file has no "
                     "peak_device_memory_bytes) for: %s" % ", ".join(partial))
    not_run = ["%s %s %s" % (r["model"], r["policy"], side) for r in rows
               for side in ("castor", "torch")
               if r.get(side, {}).get("error", "").startswith("not run")]
    if not_run:
        notes.append("not run (time budget spent or run interrupted): %s" % ", ".join(not_run))
    # Failures, one line per distinct message (the same error on every row
    # of a broken backend reads once).
    errors = {}
    for r in rows:
        for side in ("castor", "torch"):
            message = r.get(side, {}).get("error")
            if message and not message.startswith("not run"):
                errors.setdefault((side, message), []).append("%s %s" % (r["model"], r["policy"]))
    for (side, message), where in errors.items():
        notes.append("%s, %s: %s" % (side, ", ".join(where), message))
    for row in rows:
        notes.extend(row_notes(row))
    return notes


class Report:
    """The rows so far, printed as one table and rewritten to --json after
    every run."""

    def __init__(self, json_path, meta):
        self.json_path = json_path
        self.meta = meta
        self.rows = []
        self.notes = []
        self.started = time.perf_counter()

    def write(self, complete):
        if not self.json_path:
            return
        report = dict(self.meta, complete=complete,
                      total_s=time.perf_counter() - self.started,
                      rows=self.rows, notes=all_notes(self.rows, self.notes))
        tmp = self.json_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, self.json_path)

    def print_table(self):
        print()
        print("castor vs PyTorch training throughput, %s, %s"
              % (self.meta.get("device_name"), self.meta.get("mode")))
        print("castor/torch > 1: castor is faster; castor mixed/f32: castor's samples/s under the "
              "policy over its float32 samples/s")
        print()
        print(format_table(self.rows))
        notes = all_notes(self.rows, self.notes)
        if notes:
            print()
            print("notes:")
            for note in notes:
                print("  " + note)
        print("total %.0f s" % (time.perf_counter() - self.started))


def fill_ratios(rows_of_model):
    by_policy = dict((r["policy"], r) for r in rows_of_model)
    for row in rows_of_model:
        row["ratio_castor_torch"] = safe_ratio(row.get("castor"), row.get("torch"))
        f32 = by_policy.get("float32")
        row["ratio_castor_mixed_vs_float32"] = (
            safe_ratio(row.get("castor"), f32.get("castor")) if f32 is not None else None)


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--castor", default=None,
                        help="castor binary (default: build/castor under the repository root)")
    parser.add_argument("--models-dir", default=os.path.join(root, "models"),
                        help="folder of <model>_opset<N>.onnx (and generate.py)")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--models", default=None,
                        help="comma-separated, from %s (default: all; cpu: the sample models)"
                        % ",".join(ALL_MODELS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (castor --backend cuda), or cpu to check this script's logic")
    parser.add_argument("--quick", action="store_true",
                        help="fewer steps and a time budget (about 2.5 minutes on an H200)")
    parser.add_argument("--batch", type=int, default=None, help="batch of the sample models")
    parser.add_argument("--big-batch", type=int, default=None, help="batch of big_transformer")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (all models)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (all models)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds; runs that would start later are reported as not run "
                             "(default: %d with --quick, else none)" % QUICK_TIME_BUDGET_S)
    parser.add_argument("--cuda-graphs", choices=["auto", "off"], default="auto",
                        help="castor train --cuda-graphs: off runs every castor step node by "
                             "node (the speed of steps that are not replayed)")
    parser.add_argument("--tf32", action="store_true",
                        help="float32 on TF32 tensor cores on both sides (castor train --tf32; "
                             "torch's matmul and cuDNN allow_tf32); default: off on both")
    parser.add_argument("--work-dir", default=None,
                        help="keep castor's metrics and logs here (default: a temporary folder)")
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args()

    if np is None or torch is None:
        print("error: %s cannot import %s" % (sys.executable, "numpy" if np is None else "torch"),
              file=sys.stderr)
        return 2
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("error: torch %s sees no CUDA device (use --device cpu to check the script)"
              % torch.__version__, file=sys.stderr)
        return 2
    binary = args.castor or os.path.join(root, "build", "castor")
    if not os.access(binary, os.X_OK):
        print("error: castor binary %s not found or not executable; pass --castor" % binary,
              file=sys.stderr)
        return 2
    binary = os.path.abspath(binary)
    mode = device + ("_quick" if args.quick else "")
    small_settings, big_settings = SETTINGS[mode]
    default_models = ALL_MODELS if device == "cuda" else SAMPLE_MODELS
    models = [m for m in (args.models.split(",") if args.models else default_models) if m]
    policies = [p for p in args.policies.split(",") if p]
    for m in models:
        if m not in ALL_MODELS:
            print("error: unknown model %s (choose from %s)" % (m, ",".join(ALL_MODELS)),
                  file=sys.stderr)
            return 2
        if m != BIG_MODEL and not os.path.exists(
                os.path.join(args.models_dir, "%s_opset%d.onnx" % (m, args.opset))):
            print("error: %s: no %s_opset%d.onnx in %s" % (m, m, args.opset, args.models_dir),
                  file=sys.stderr)
            return 2
    for p in policies:
        if p not in POLICIES:
            print("error: unknown policy %s (choose from %s)" % (p, ",".join(POLICIES)),
                  file=sys.stderr)
            return 2
    if BIG_MODEL in models and big_settings is None:
        print("note: %s is skipped with --device cpu" % BIG_MODEL)
        models.remove(BIG_MODEL)
    try:
        gen, gen_path = load_generate_module([
            os.path.join(args.models_dir, "generate.py"),
            os.path.join(root, "models", "generate.py")])
    except Exception as e:  # noqa: BLE001
        print("error: cannot load the model definitions: %s: %s" % (type(e).__name__, e),
              file=sys.stderr)
        return 2
    budget = args.time_budget if args.time_budget is not None else (
        QUICK_TIME_BUDGET_S if args.quick else None)

    if device == "cuda":
        # Both sides alike: castor's float32 is true float32 unless --tf32.
        for backend_flags in (torch.backends.cuda.matmul, torch.backends.cudnn):
            try:
                backend_flags.allow_tf32 = args.tf32
            except (AttributeError, RuntimeError) as e:
                print("warning: cannot set allow_tf32 in %s: %s" % (backend_flags, e))
        device_name = torch.cuda.get_device_name(0)
    else:
        device_name = "CPU (%d threads)" % torch.get_num_threads()
    version = castor_version(binary)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "mode": mode + (", time budget %.0f s" % budget if budget else "") + (
            ", castor --cuda-graphs off" if args.cuda_graphs == "off" else "") + (
            ", TF32 on both sides" if args.tf32 and device == "cuda" else ""),
        "device": device,
        "device_name": device_name,
        "castor": binary,
        "castor_version": version,
        "torch": torch.__version__,
        "torch_cuda": getattr(torch.version, "cuda", None),
        "cudnn": torch.backends.cudnn.version() if device == "cuda" else None,
        "tf32": args.tf32 and device == "cuda",
        "model_definitions": gen_path,
        "optimizer": "adam lr 1e-3",
        "policies": policies,
    }
    print("castor %s" % binary)
    print("  " + version.replace("\n", "\n  "))
    print("torch %s (CUDA %s), device %s, mode %s" % (
        torch.__version__, meta["torch_cuda"], device_name, meta["mode"]), flush=True)

    previous_handler = signal.signal(signal.SIGTERM, _on_sigterm)
    report = Report(args.json, meta)
    failed = crashed = False
    interrupted = None
    scratch = tempfile.mkdtemp(prefix="gpu_train_vs_torch_")
    work_dir = args.work_dir or scratch
    os.makedirs(work_dir, exist_ok=True)
    backend = "cuda" if device == "cuda" else "cpu"

    def remaining():
        return None if budget is None else budget - (time.perf_counter() - report.started)

    # Every row up front, so that a run cut short lists what did not run.
    plan = []
    for name in models:
        is_big = name == BIG_MODEL
        batch, warmup, steps, run_timeout = big_settings if is_big else small_settings
        if is_big and args.big_batch:
            batch = args.big_batch
        if not is_big and args.batch:
            batch = args.batch
        # At least one warm-up step: the first step (plans, allocations,
        # library initialisation) is never timed.
        warmup = max(1, args.warmup if args.warmup is not None else warmup)
        steps = max(1, args.steps if args.steps is not None else steps)
        rows = [{"model": name, "policy": p, "batch": batch, "warmup": warmup,
                 "steps": steps} for p in policies]
        report.rows.extend(rows)
        plan.append((name, is_big, batch, warmup, steps, run_timeout, rows))

    try:
        built = {}
        for name, is_big, batch, warmup, steps, run_timeout, rows in plan:
            left = remaining()
            if left is not None and left < (30 if is_big else 5):
                for row in rows:
                    row["castor"] = row["torch"] = {"error": "not run: time budget spent"}
                fill_ratios(rows)
                report.write(False)
                continue
            try:
                # The torch module (and, for big_transformer, castor's ONNX file).
                t0 = time.perf_counter()
                built[name] = build_models(gen, [name])[name]
                base_model, input_shape = built[name]
                model_info = {"parameters": parameter_count(base_model)}
                castor_model_error = None
                if is_big:
                    model_path = os.path.join(scratch, "%s_opset%d.onnx" % (name, args.opset))
                    exporter, reason = export_onnx(base_model, model_path, args.opset, input_shape)
                    if exporter is None:
                        castor_model_error = "n/a: export failed: %s" % reason
                    else:
                        model_info.update(exporter=exporter,
                                          onnx_mib=os.path.getsize(model_path) / 1048576.0)
                else:
                    model_path = os.path.join(args.models_dir,
                                              "%s_opset%d.onnx" % (name, args.opset))
                model_info["setup_s"] = time.perf_counter() - t0
                x, y, data_path = make_data(name, input_shape, batch, scratch)
                print("%s: %s parameters, batch %d, %d warm-up + %d timed steps%s" % (
                    name, "{:,}".format(model_info["parameters"]), batch, warmup, steps,
                    ", exported by %s in %.0f s (%.0f MiB)" % (
                        model_info["exporter"], model_info["setup_s"], model_info["onnx_mib"])
                    if "exporter" in model_info else ""), flush=True)
                if castor_model_error:
                    print("  castor: %s" % castor_model_error, flush=True)
                for row in rows:
                    row["model_info"] = model_info
                    policy = row["policy"]
                    for side in ("castor", "torch"):
                        left = remaining()
                        if left is not None and left < 3:
                            row[side] = {"error": "not run: time budget spent"}
                            continue
                        if side == "castor":
                            if castor_model_error:
                                r = {"error": castor_model_error, "not_applicable": True}
                            else:
                                timeout_s = (run_timeout if left is None
                                             else max(1.0, min(run_timeout, left)))
                                r = run_castor(binary, backend, model_path, data_path, policy,
                                               batch, warmup, steps, timeout_s, work_dir,
                                               "%s_%s" % (name, policy), args.cuda_graphs,
                                               args.tf32)
                                crashed = crashed or bool(r.get("crashed"))
                        else:
                            try:
                                r = run_torch(base_model, x, y, policy, batch, warmup, steps,
                                              device)
                            except Interrupted:
                                raise
                            except Exception as e:  # noqa: BLE001 -- report, go on
                                r = {"error": "%s: %s" % (type(e).__name__, one_line(e))}
                                if device == "cuda":
                                    torch.cuda.empty_cache()
                        row[side] = r
                        if "error" in r and not r.get("not_applicable"):
                            failed = True
                        print(progress_line(policy, side, r), flush=True)
                    fill_ratios(rows)
                    report.write(False)
                f32 = next((r for r in rows if r["policy"] == "float32"), None)
                if f32 and "error" not in f32.get("castor", {"error": 1}) and \
                        "error" not in f32.get("torch", {"error": 1}) and \
                        f32["castor"].get("first_loss") is not None:
                    a, b = f32["castor"]["first_loss"], f32["torch"]["first_loss"]
                    rel = abs(a - b) / max(abs(b), 1e-12)
                    f32["first_loss_rel_diff"] = rel
                    if rel > 1e-3:
                        report.notes.append(
                            "%s: first float32 loss castor %.6f vs torch %.6f (rel diff %.1e): the "
                            "runtimes do not start from the same model or data" % (name, a, b, rel))
            except Interrupted:
                raise
            except Exception as e:  # noqa: BLE001 -- a model that cannot be set up
                reason = "setup failed: %s: %s" % (type(e).__name__, one_line(e))
                print("  %s: %s" % (name, reason), flush=True)
                for row in rows:
                    for side in ("castor", "torch"):
                        row.setdefault(side, {"error": reason})
                failed = True
            built.pop(name, None)
            if device == "cuda":
                torch.cuda.empty_cache()
    except Interrupted as e:
        interrupted = str(e)
        report.notes.append("run %s; the rows without numbers did not run" % interrupted)
        failed = True
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        for row in report.rows:
            for side in ("castor", "torch"):
                row.setdefault(side, {"error": "not run"})
        by_model = {}
        for row in report.rows:
            by_model.setdefault(row["model"], []).append(row)
        for rows in by_model.values():
            fill_ratios(rows)
        report.write(interrupted is None)
        # The data, the exported ONNX file and (without --work-dir) the logs.
        shutil.rmtree(scratch, ignore_errors=True)

    report.print_table()
    if args.json:
        print("results: %s" % args.json)
    if crashed:
        return 3
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
