#!/usr/bin/python3
"""Activation memory of a `castor train` step under each policy, against float32.

DESIGN.md asks mixed precision to hold 30-50% less activation memory than
float32. For each sample model (default: the four opset-17 ones) and policy
(float32, mixed_bfloat16, mixed_float16) this runs

    castor train MODEL --policy P --batch B --max-steps 2 --no-shuffle
        --backend BACKEND --metrics F

on Fashion-MNIST's training files and reads the summary object (the last
--metrics line):
  * peak_activation_bytes: the executor's largest total of live activation
    buffers in the step (exact tensor sizes; the same plan on every backend);
  * peak_resident_bytes: the process's peak resident set (data set,
    libraries, weights, kernel scratch as well);
  * peak_device_memory_bytes on CUDA (the device pool's peak).
It prints one table; the ratio column is each policy's activation peak over
float32's for the same model (< 1: less memory). Two steps suffice: the plan,
and so the peak, is the same every step of a batch shape.

The script measures; it never fails on the numbers. Exit status: 0 when every
run finished; 1 when a castor run failed; 2 on a setup error.

Run from the repository root:
  /usr/bin/python3 bench/activation_memory.py --castor build/castor
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

SAMPLE_MODELS = ["cnn", "mlp", "resnet", "transformer"]
POLICIES = ["float32", "mixed_bfloat16", "mixed_float16"]


def run_castor(castor, model_path, policy, args, metrics_path):
    command = [castor, "train", model_path, "--policy", policy, "--batch", str(args.batch),
               "--max-steps", "2", "--no-shuffle", "--backend", args.backend,
               "--threads", str(args.threads), "--metrics", metrics_path,
               "--data", ",".join(os.path.join(args.data_dir, name) for name in
                                  ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"))]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        return None, result.stderr.strip().splitlines()[-1:] or ["(no output)"]
    with open(metrics_path) as metrics:
        lines = [json.loads(line) for line in metrics if line.strip()]
    summaries = [line for line in lines if line.get("summary")]
    if not summaries:
        return None, ["no summary line in " + metrics_path]
    return summaries[-1], []


def mib(value):
    return "" if value is None else "%.1f" % (value / 1048576.0)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--castor", default=os.path.join(root, "build", "castor"),
                        help="the castor binary (default: build/castor)")
    parser.add_argument("--models", default=",".join(SAMPLE_MODELS),
                        help="comma-separated sample model names (default: all four)")
    parser.add_argument("--models-dir", default=os.path.join(root, "models"))
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--backend", choices=["cpu", "cuda", "auto"], default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()

    if not os.access(args.castor, os.X_OK):
        print("activation_memory.py: no castor binary at %s (build it, or pass --castor)"
              % args.castor, file=sys.stderr)
        return 2
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        if not os.path.exists(os.path.join(args.data_dir, name)):
            print("activation_memory.py: %s has no %s (Debian package dataset-fashion-mnist)"
                  % (args.data_dir, name), file=sys.stderr)
            return 2

    rows, failed = [], 0
    with tempfile.TemporaryDirectory() as work:
        for model in args.models.split(","):
            model_path = os.path.join(args.models_dir, "%s_opset%d.onnx" % (model, args.opset))
            if not os.path.exists(model_path):
                print("activation_memory.py: no model %s" % model_path, file=sys.stderr)
                return 2
            float32_peak = None
            for policy in POLICIES:
                summary, errors = run_castor(args.castor, model_path, policy, args,
                                             os.path.join(work, "%s_%s.jsonl" % (model, policy)))
                if summary is None:
                    failed += 1
                    print("FAILED %s %s: %s" % (model, policy, " ".join(errors)), file=sys.stderr)
                    continue
                peak = summary["peak_activation_bytes"]
                if policy == "float32":
                    float32_peak = peak
                rows.append({
                    "model": model, "policy": policy, "backend": summary.get("backend"),
                    "peak_activation_bytes": peak,
                    "vs_float32": peak / float32_peak if float32_peak else None,
                    "peak_resident_bytes": summary.get("peak_resident_bytes"),
                    "peak_device_memory_bytes": summary.get("peak_device_memory_bytes"),
                })
                print("%-12s %-15s activations %8s MiB" % (model, policy, mib(peak)),
                      file=sys.stderr, flush=True)

    device = any(row["peak_device_memory_bytes"] is not None for row in rows)
    print("| model | policy | activations MiB | / float32 | process resident MiB%s |"
          % (" | device peak MiB" if device else ""))
    print("| --- | --- | ---: | ---: | ---:%s |" % (" | ---:" if device else ""))
    for row in rows:
        ratio = "" if row["vs_float32"] is None else "%.2f" % row["vs_float32"]
        print("| %s | %s | %s | %s | %s%s |" % (
            row["model"], row["policy"], mib(row["peak_activation_bytes"]), ratio,
            mib(row["peak_resident_bytes"]),
            (" | " + mib(row["peak_device_memory_bytes"])) if device else ""))
    print("\nbatch %d, backend %s, castor %s" % (args.batch, args.backend, args.castor))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"batch": args.batch, "backend": args.backend, "rows": rows}, out, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
