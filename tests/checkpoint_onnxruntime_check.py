"""Checks castor checkpoints and `castor export` with the ONNX ecosystem (issue:
checkpoints).

Makes checkpoints with `castor train --checkpoint-dir` on a small random
dataset (mlp in mixed_float16, resnet with BatchNormalization and cnn in
mixed_bfloat16, cnn in float32; 3 steps each, a checkpoint every step, the
newest 2 kept), then for each of them and for every CKPT given on the command
line (e.g. one with external data):
  1. onnx.checker (full_check, by path so external data resolves) accepts the
     checkpoint, which carries training_info (the moments) and the
     castor.checkpoint.* record; `castor verify --json` then says "verified"
     (onnx 1.12's full_check by path writes inferred value_info back into the
     file, which the checkpoint's digest leaves out on purpose);
  2. ONNX Runtime runs the checkpoint itself; its outputs match `castor run`
     of the checkpoint (both float32, different kernels: 1e-5 relative);
  3. `castor export CKPT -o float32.onnx`: onnx.checker accepts it, it has
     neither training_info nor the record, and ORT's outputs on it equal ORT's
     on the checkpoint bit for bit (and castor's on both, bit for bit);
  4. `castor export CKPT --policy recorded`: onnx.checker accepts it; ORT runs
     it when the policy computes in float16 or float32 (ORT's CPU provider has
     no bfloat16 Gemm/Conv kernels, so castor runs the bfloat16 model) and its
     outputs match the float32 run within the compute dtype's tolerance.
Run with the virtual environment's interpreter (.venv/bin/python), which sees
Debian's onnx and PyPI's onnxruntime:
  checkpoint_onnxruntime_check.py CASTOR_BINARY MODELS_DIR WORK_DIR [CKPT ...]
Exit 0 when every check passed; one line per checkpoint either way.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnx.checker
import onnxruntime as ort

# Relative to the largest |output|: float32 against float32 with other kernels,
# and the mixed policies as in autocast_onnxruntime_check.py.
TOLERANCE = {"float32": 1e-5, "float16": 2e-2, "bfloat16": 6e-2}
BATCH = 16
# (At opset 17 ONNX's Conv takes no bfloat16, so the resnet stays float32 under
# mixed_bfloat16; the cnn's Gemms compute in bfloat16.)
CASES = [("mlp_opset17", "mixed_float16"), ("resnet_opset17", "mixed_bfloat16"),
         ("cnn_opset17", "mixed_bfloat16"), ("cnn_opset13", "float32")]


def run(args):
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result.stdout


def ort_outputs(path, feeds):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def castor_outputs(castor, path, feed_files, out_dir, output_names):
    shutil.rmtree(out_dir, ignore_errors=True)
    args = [castor, "run", path, "--output-dir", out_dir]
    for name, file in feed_files.items():
        args += ["--input", f"{name}={file}"]
    run(args)
    return [np.load(os.path.join(out_dir, f"{name}.npy")) for name in output_names]


def worst_error(expected, actual):
    worst = 0.0
    for want, got in zip(expected, actual):
        scale = max(1.0, float(np.abs(want).max()))
        worst = max(worst, float(np.abs(want.astype(np.float64) - got).max()) / scale)
    return worst


def make_checkpoints(castor, models_dir, work, rng):
    """Trains each case for 3 steps; returns the newest checkpoint of each."""
    images = rng.random((64, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, size=64).astype(np.int64)
    np.save(os.path.join(work, "images.npy"), images)
    np.save(os.path.join(work, "labels.npy"), labels)
    data = f"{os.path.join(work, 'images.npy')},{os.path.join(work, 'labels.npy')}"
    checkpoints = []
    for model, policy in CASES:
        directory = os.path.join(work, f"{model}_{policy}")
        shutil.rmtree(directory, ignore_errors=True)
        run([castor, "train", os.path.join(models_dir, model + ".onnx"), "--data", data,
             "--policy", policy, "--batch", str(BATCH), "--max-steps", "3",
             "--checkpoint-dir", directory, "--save-every", "1", "--keep", "2"])
        files = sorted(glob.glob(os.path.join(directory, "ckpt-*.onnx")))
        if len(files) != 2:
            raise RuntimeError(f"{directory}: expected the newest 2 checkpoints, found {files}")
        checkpoints.append(files[-1])
    return checkpoints


def check(castor, path, work, rng):
    problems = []
    name = os.path.splitext(os.path.basename(path))[0]
    stem = f"{os.path.basename(os.path.dirname(path))}_{name}"
    onnx.checker.check_model(path, full_check=True)
    proto = onnx.load(path, load_external_data=False)
    record = {p.key: p.value for p in proto.metadata_props}
    moments = sum(len(t.algorithm.initializer) for t in proto.training_info)
    if "castor.checkpoint.format" not in record:
        problems.append("no castor.checkpoint.format metadata")
    report = json.loads(subprocess.run([castor, "verify", path, "--json"], capture_output=True,
                                       text=True).stdout)
    if report.get("status") != "verified":
        problems.append(f"castor verify: {report.get('status')}: {report.get('problems')}"
                        f"{report.get('error', '')}")
    compute = report.get("policy", {}).get("compute_dtype", "float32")

    feeds = {}
    feed_files = {}
    for inp in proto.graph.input:
        if inp.name in {i.name for i in proto.graph.initializer}:
            continue
        dims = [d.dim_value if d.dim_value > 0 else BATCH for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = rng.random(dims, dtype=np.float32)
        feed_files[inp.name] = os.path.join(work, f"{stem}_{inp.name}.npy")
        np.save(feed_files[inp.name], feeds[inp.name])
    output_names = [o.name for o in proto.graph.output]

    # 2. the checkpoint itself in ORT and in castor.
    ort_ckpt = ort_outputs(path, feeds)
    castor_ckpt = castor_outputs(castor, path, feed_files, os.path.join(work, f"{stem}_ckpt_out"),
                                 output_names)
    ckpt_error = worst_error(ort_ckpt, castor_ckpt)
    if ckpt_error > TOLERANCE["float32"]:
        problems.append(f"checkpoint: castor and ORT differ by {ckpt_error:.3g}")

    # 3. the float32 export.
    exported = os.path.join(work, f"{stem}_float32.onnx")
    run([castor, "export", path, "-o", exported])
    onnx.checker.check_model(exported, full_check=True)
    exported_proto = onnx.load(exported)
    if len(exported_proto.training_info) != 0:
        problems.append("the float32 export has training_info")
    if any(p.key.startswith("castor.checkpoint.") for p in exported_proto.metadata_props):
        problems.append("the float32 export has castor.checkpoint.* metadata")
    ort_exported = ort_outputs(exported, feeds)
    if not all(np.array_equal(a, b) for a, b in zip(ort_ckpt, ort_exported)):
        problems.append("ORT: the float32 export's outputs differ from the checkpoint's")
    castor_exported = castor_outputs(castor, exported, feed_files,
                                     os.path.join(work, f"{stem}_float32_out"), output_names)
    if not all(np.array_equal(a, b) for a, b in zip(castor_ckpt, castor_exported)):
        problems.append("castor: the float32 export's outputs differ from the checkpoint's")

    # 4. the export converted under the recorded policy.
    converted = os.path.join(work, f"{stem}_recorded.onnx")
    run([castor, "export", path, "-o", converted, "--policy", "recorded"])
    onnx.checker.check_model(converted, full_check=True)
    if compute == "bfloat16":
        converted_out = castor_outputs(castor, converted, feed_files,
                                       os.path.join(work, f"{stem}_recorded_out"), output_names)
        runner = "castor"
    else:
        converted_out = ort_outputs(converted, feeds)
        runner = "ORT"
    converted_error = worst_error(ort_ckpt, converted_out)
    if converted_error > TOLERANCE[compute]:
        problems.append(f"the {compute} export ({runner}) differs from float32 by "
                        f"{converted_error:.3g}, tolerance {TOLERANCE[compute]}")

    external = " external data" if report.get("external_data_file") else ""
    status = "ok" if not problems else "FAIL"
    print(f"{status:4} {stem:40} {report.get('policy', {}).get('name', '?'):15} "
          f"step={report.get('state', {}).get('step', '?')} moments={moments}{external} "
          f"ckpt ORT-vs-castor={ckpt_error:.1e} {compute} export ({runner}) "
          f"err={converted_error:.1e}")
    for problem in problems:
        print(f"     {problem}")
    return not problems


def main():
    castor, models_dir, work = sys.argv[1:4]
    extra = sys.argv[4:]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(4321)
    checkpoints = make_checkpoints(castor, models_dir, work, rng) + extra
    failures = sum(0 if check(castor, path, work, rng) else 1 for path in checkpoints)
    print(f"{failures} failed of {len(checkpoints)} checkpoints")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
