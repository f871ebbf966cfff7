#!/usr/bin/python3
"""Data-parallel scaling of `castor train` on the CPU (Gloo over loopback).

For each sample model (default: cnn, mlp, resnet, transformer at opset 17)
this script trains the same global batch (--batch, default 128) on the same
data (Fashion-MNIST's training split in file order, --no-shuffle) three ways:

  * 1 rank, 1 thread:   `castor train ... --threads 1`
  * 2 ranks, 1 thread each: `castor train ... --nproc 2 --threads 1`
    (each rank trains 64 rows; gradients averaged by Gloo's allreduce in
    buckets overlapping the backward pass, --bucket-mb's default)
  * the same with `--bucket-mb 0`: one allreduce after the backward pass
  * 1 rank, 2 threads:  `castor train ... --threads 2` (the same two cores
    used by castor's own intra-op threads, for comparison)

and prints, per model, the bytes all-reduced per step (the loss and every
gradient as float32) and the buckets, the allreduce time per step as rank 0
measured it (median, and minimum: the median includes waiting for the
slower rank, the minimum is closest to the transfer itself), the part of it
the step waited for after its backward pass (median; the rest overlapped
the backward pass), and the median step time of each run. Speedup = 1-rank
step time / 2-rank step time; efficiency = speedup / 2.

  /usr/bin/python3 bench/ddp_scaling.py [--castor build/castor]
      [--models cnn,mlp,resnet,transformer] [--batch 128] [--steps S]
      [--warmup 3] [--policy float32] [--json OUT]

Needs a castor built with Gloo (libgloo-dev). Exit 0 when every run
finished, 1 when one failed, 2 on a setup error; speed never fails it.
bench/README.md ("Data-parallel scaling") has results and an analysis of
what the measured bytes mean on 8 GPUs and on several hosts.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# The sample models, their default step counts, the CPU's name and the
# IDX files: as train_vs_torch.py has them (it loads no torch on import).
from train_vs_torch import DEFAULT_STEPS, SAMPLE_MODELS, cpu_model, find_idx

RUNS = [  # (name, ranks, threads per rank, extra flags)
    ("1 rank x 1 thread", 1, 1, []),
    ("2 ranks x 1 thread", 2, 1, []),
    ("2 ranks, one allreduce", 2, 1, ["--bucket-mb", "0"]),
    ("1 rank x 2 threads", 1, 2, []),
]


def run(binary, model_path, data_spec, policy, batch, warmup, steps, ranks, threads, extra,
        work_dir):
    """One `castor train`; its median step time and allreduce figures."""
    metrics = os.path.join(work_dir, "%s_%dx%d%s.jsonl" % (
        os.path.basename(model_path).split(".")[0], ranks, threads, "".join(extra)))
    cmd = [binary, "train", model_path, "--data", data_spec, "--policy", policy,
           "--optimizer", "adam", "--lr", "0.001", "--batch", str(batch),
           "--max-steps", str(warmup + steps), "--no-shuffle", "--threads", str(threads),
           "--metrics", metrics]
    if ranks > 1:
        cmd += ["--nproc", str(ranks)]
    cmd += extra
    started = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {"error": "exit %d: %s" % (proc.returncode, proc.stdout.strip()[-2000:]),
                "command": " ".join(cmd)}
    steps_seen = []
    with open(metrics) as f:
        for line in f:
            record = json.loads(line)
            if "step" in record and "samples_per_s" in record and "summary" not in record:
                steps_seen.append(record)
    timed = [r for r in steps_seen[warmup:] if not r["skipped"]]
    if not timed:
        return {"error": "no timed steps in %s" % metrics, "command": " ".join(cmd)}
    result = {
        "step_ms": statistics.median(1000.0 * batch / r["samples_per_s"] for r in timed),
        "timed_steps": len(timed),
        "last_loss": steps_seen[-1]["loss"],
        "process_wall_s": wall,
        "command": " ".join(cmd),
    }
    if ranks > 1:
        if not all("allreduce_bytes" in r for r in timed):
            return {"error": "%s: steps without allreduce_bytes (a castor without Gloo?)"
                    % metrics, "command": " ".join(cmd)}
        result["allreduce_bytes"] = timed[-1]["allreduce_bytes"]
        result["allreduce_ms_median"] = statistics.median(r["allreduce_ms"] for r in timed)
        result["allreduce_ms_min"] = min(r["allreduce_ms"] for r in timed)
        result["allreduce_wait_ms_median"] = statistics.median(
            r["allreduce_wait_ms"] for r in timed)
        result["allreduce_buckets"] = timed[-1]["allreduce_buckets"]
    return result


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--castor", default=None,
                        help="castor binary (default build/castor)")
    parser.add_argument("--models", default=",".join(SAMPLE_MODELS))
    parser.add_argument("--models-dir", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "models"))
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--policy", default="float32")
    parser.add_argument("--batch", type=int, default=128, help="the global batch")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per run (default: cnn 30, mlp 50, resnet 10, "
                             "transformer 20)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args()

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    binary = args.castor or os.path.join(root, "build", "castor")
    if not os.access(binary, os.X_OK):
        print("error: %s: no castor binary (build first, or --castor PATH)" % binary,
              file=sys.stderr)
        return 2
    if args.batch % 2 != 0:
        print("error: --batch %d: the global batch must split over 2 ranks" % args.batch,
              file=sys.stderr)
        return 2
    models = [m for m in args.models.split(",") if m]
    for m in models:
        path = os.path.join(args.models_dir, "%s_opset%d.onnx" % (m, args.opset))
        if m not in SAMPLE_MODELS or not os.path.exists(path):
            print("error: %s: not a sample model (%s)" % (m, path), file=sys.stderr)
            return 2
    try:
        data_spec = "%s,%s" % (find_idx(args.data_dir, "train-images-idx3-ubyte"),
                               find_idx(args.data_dir, "train-labels-idx1-ubyte"))
    except OSError as e:
        print("error: %s" % e, file=sys.stderr)
        return 2

    print("castor %s, policy %s, global batch %d, Adam lr 1e-3, Fashion-MNIST in file order"
          % (binary, args.policy, args.batch))
    print("%s, %d CPUs, load average %.1f at start" % (
        cpu_model(), os.cpu_count(), os.getloadavg()[0]))
    results = {}
    failed = False
    with tempfile.TemporaryDirectory(prefix="castor-ddp-") as work_dir:
        for m in models:
            path = os.path.join(args.models_dir, "%s_opset%d.onnx" % (m, args.opset))
            steps = args.steps or DEFAULT_STEPS[m]
            results[m] = {}
            for name, ranks, threads, extra in RUNS:
                r = run(binary, path, data_spec, args.policy, args.batch, args.warmup, steps,
                        ranks, threads, extra, work_dir)
                results[m][name] = r
                if "error" in r:
                    failed = True
                    print("%s, %s: %s\n  %s" % (m, name, r["error"], r["command"]),
                          file=sys.stderr)
                else:
                    print("  %s, %s: %.1f ms per step" % (m, name, r["step_ms"]), flush=True)

    print()
    print("| model | MiB all-reduced per step (buckets) | allreduce ms (median / min) "
          "| after the backward pass ms | 1 rank x 1 thread ms | 2 ranks x 1 thread ms "
          "| speedup | efficiency | 2 ranks, one allreduce ms | 1 rank x 2 threads ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in models:
        one, two, single_allreduce, threaded = (results[m].get(run[0], {}) for run in RUNS)
        if any("error" in r for r in (one, two, single_allreduce, threaded)):
            print("| %s | (a run failed) |||||||||" % m)
            continue
        speedup = one["step_ms"] / two["step_ms"]
        print("| %s | %.2f (%d) | %.2f / %.2f | %.2f | %.1f | %.1f | %.2f | %.0f%% | %.1f | %.1f |"
              % (m, two["allreduce_bytes"] / 1048576.0, two["allreduce_buckets"],
                 two["allreduce_ms_median"], two["allreduce_ms_min"],
                 two["allreduce_wait_ms_median"], one["step_ms"], two["step_ms"], speedup,
                 100 * speedup / 2, single_allreduce["step_ms"], threaded["step_ms"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "policy": args.policy, "batch": args.batch,
                       "results": results}, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
