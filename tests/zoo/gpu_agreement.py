#!/usr/bin/env python3
"""The zoo on the CUDA backend against the CPU backend (issue #28 item 7).

For every model of a zoo directory (the .onnx files generate.py wrote, each
with its .ref.json and data): `castor train` float32 for --steps steps on
--backend cpu and on --backend cuda with the same flags (SGD, lr and batch
of the reference, --no-shuffle, TF32 off), and the losses compared step by
step; then mixed_float16 and mixed_bfloat16 on cuda, every loss finite.

Tolerances: step 1 (a forward pass of the same weights) within the
reference's loss_tol[0] (1e-5 relative, or twice float32's reach on that
model: PyTorch float32's own error, or the loss's move under a one-ulp nudge); later steps within loss_tol[k] (ten times PyTorch float32's
own spread at step k: float32 against float64, and runs from weights nudged
by one ulp), since the two backends sum in different orders and BatchNorm
networks at batch 16 amplify that as they amplify a one-ulp nudge.

Runs on the GPU machine (tools/gpu_check.sh, with the zoo that
tools/make_gpu_bundle.sh packs) or anywhere with a GPU; needs numpy only.
Exit 0 when every model agrees, 1 when one does not, 2 on bad arguments.

  python3 tests/zoo/gpu_agreement.py --castor build/castor build/tests/zoo
"""

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile

POLICIES = ["mixed_float16", "mixed_bfloat16"]


def train(castor, zoo, ref, backend, policy, steps, work, timeout):
    """castor train's per-step losses, or an error string."""
    metrics = os.path.join(work, "%s_%s_%s.jsonl" % (ref["model"], backend, policy))
    cmd = [castor, "train", os.path.join(zoo, ref["onnx"]),
           "--data", os.path.join(zoo, ref["data"]), "--policy", policy,
           "--optimizer", "sgd", "--lr", repr(ref["lr"]), "--batch", str(ref["batch"]),
           "--no-shuffle", "--max-steps", str(steps), "--epochs", str(steps),
           "--metrics", metrics, "--backend", backend]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timed out after %d s" % timeout
    if proc.returncode != 0:
        lines = [l for l in proc.stderr.splitlines() if "error" in l] or \
            proc.stderr.splitlines()[-1:] or ["(no message)"]
        return "exit %d: %s" % (proc.returncode, lines[0])
    losses = []
    with open(metrics) as f:
        for line in f:
            obj = json.loads(line)
            if "loss" in obj and "step" in obj and not obj.get("summary"):
                losses.append(obj["loss"])
    return losses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("zoo", help="a directory generate.py (or make_gpu_bundle.sh) wrote")
    ap.add_argument("--castor", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per castor run")
    ap.add_argument("--expected-failures", default="",
                    help="'model: reason' lines (tests/zoo/expected_failures.txt): such a "
                         "model is reported, not failed, when castor cannot import it")
    args = ap.parse_args(argv)
    refs = []
    for path in sorted(glob.glob(os.path.join(args.zoo, "*.ref.json"))):
        with open(path) as f:
            ref = json.load(f)
        if os.path.exists(os.path.join(args.zoo, ref["onnx"])):
            refs.append(ref)
    if not refs:
        print("gpu_agreement: no model (.ref.json + .onnx) in %s" % args.zoo, file=sys.stderr)
        return 2
    expected = set()
    if args.expected_failures and os.path.exists(args.expected_failures):
        with open(args.expected_failures) as f:
            expected = {l.split(":", 1)[0].strip() for l in f
                        if l.strip() and not l.startswith("#")}
    work = tempfile.mkdtemp(prefix="castor_zoo_gpu_")
    failed = 0
    print("%-20s %-6s %-34s %s" % ("model", "result", "float32 cuda vs cpu (worst /tol)",
                                    "mixed on cuda"))
    for ref in refs:
        name = ref["model"]
        cpu = train(args.castor, args.zoo, ref, "cpu", "float32", args.steps, work, args.timeout)
        if isinstance(cpu, str):
            verdict = "listed" if name in expected else "FAIL"
            failed += verdict == "FAIL"
            print("%-20s %-6s cpu: %s" % (name, verdict, cpu))
            continue
        cuda = train(args.castor, args.zoo, ref, "cuda", "float32", args.steps, work,
                     args.timeout)
        problems, worst = [], 0.0
        if isinstance(cuda, str):
            problems.append("cuda float32: " + cuda)
        else:
            tol = ref["loss_tol"]
            for k in range(min(len(cpu), len(cuda))):
                band = tol[min(k, len(tol) - 1)]
                diff = abs(cuda[k] - cpu[k])
                worst = max(worst, diff / band if band > 0 else math.inf)
                if not diff <= band:
                    problems.append("step %d: cuda %.9g, cpu %.9g, |diff| %.3g > %.3g"
                                    % (k + 1, cuda[k], cpu[k], diff, band))
            if len(cuda) != len(cpu):
                problems.append("cuda ran %d steps, cpu %d" % (len(cuda), len(cpu)))
        mixed = []
        for policy in POLICIES:
            losses = train(args.castor, args.zoo, ref, "cuda", policy, args.steps, work,
                           args.timeout)
            if isinstance(losses, str):
                problems.append("cuda %s: %s" % (policy, losses))
                mixed.append(policy[6:] + " error")
            elif not all(math.isfinite(l) for l in losses):
                problems.append("cuda %s: a loss is not finite: %s" % (policy, losses))
                mixed.append(policy[6:] + " non-finite")
            else:
                mixed.append(policy[6:] + " ok")
        failed += bool(problems)
        print("%-20s %-6s %-34s %s" % (name, "FAIL" if problems else "ok",
                                        "%.2f" % worst if not isinstance(cuda, str) else "-",
                                        ", ".join(mixed)))
        for p in problems:
            print("    " + p)
    print("%d of %d models agree" % (len(refs) - failed, len(refs)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
