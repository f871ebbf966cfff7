"""Checks `castor convert` output with the ONNX ecosystem (issue: autocast).

For every sample model (models/*.onnx) and both mixed policies:
  1. castor convert writes the model; onnx.checker (full_check) accepts it and
     ONNX shape inference (strict) agrees with every type castor declared;
  2. mixed_float16: ONNX Runtime runs it on random inputs and its outputs match
     ONNX Runtime's float32 run of the original within float16 tolerance;
  3. mixed_bfloat16: ONNX Runtime's CPU provider has no bfloat16 MatMul/Add/Relu
     kernels, so ORT is not asked to run it; castor's CPU backend runs it
     (`castor run`) and its outputs match ORT's float32 run within bfloat16
     tolerance.
Run with the virtual environment's interpreter (.venv/bin/python), which sees
Debian's onnx and PyPI's onnxruntime:
  autocast_onnxruntime_check.py CASTOR_BINARY MODELS_DIR WORK_DIR
Exit 0 when every check passed; one line per model and policy either way.
"""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnx.checker
import onnx.shape_inference
import onnxruntime as ort

# Error bound relative to the largest reference magnitude: float16 keeps 11
# significant bits, bfloat16 8; a few roundings through a model of depth <= 12
# stay well inside these.
TOLERANCE = {"mixed_float16": 2e-2, "mixed_bfloat16": 6e-2}
BATCH = 16


FLOAT_NAMES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
               onnx.TensorProto.BFLOAT16: "bfloat16"}
FLOAT_TYPES = set(FLOAT_NAMES)


def castor_records(castor, path):
    """Node name -> the dtype castor recorded for it, as `castor inspect --format json`
    reports it (onnx 1.12's NodeProto cannot read node metadata_props itself)."""
    report = json.loads(subprocess.run([castor, "inspect", path, "--format", "json"], check=True,
                                       capture_output=True, text=True).stdout)
    return {n["name"]: n["compute_dtype"] for n in report["nodes"] if "autocast" in n}


def check_types(converted, records):
    """ONNX's own strict type inference must agree with castor's record: every float
    output of a node castor painted has the dtype castor recorded for the node.
    Returns (problems, number of values inferred 16-bit)."""
    inferred = onnx.shape_inference.infer_shapes(converted, check_type=True, strict_mode=True)
    elem = {v.name: v.type.tensor_type.elem_type
            for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    problems, lowp_values = [], 0
    for node in inferred.graph.node:
        record = records.get(node.name)
        for name in node.output:
            if elem.get(name) in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
                lowp_values += 1
            if record is None or elem.get(name) not in FLOAT_TYPES:
                continue
            dtype = FLOAT_NAMES[elem[name]]
            if dtype != record:
                problems.append(f"node {node.name}: castor says {record}, onnx infers "
                                f"{dtype} for output {name}")
    return problems, lowp_values


def random_feeds(session, rng):
    feeds = {}
    for inp in session.get_inputs():
        shape = [BATCH if not isinstance(d, int) else d for d in inp.shape]
        feeds[inp.name] = rng.random(shape, dtype=np.float32)
    return feeds


def main():
    castor, models_dir, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(1234)
    failures = 0
    ort_options = ort.SessionOptions()
    ort_options.intra_op_num_threads = 2
    for path in sorted(glob.glob(os.path.join(models_dir, "*.onnx"))):
        stem = os.path.splitext(os.path.basename(path))[0]
        reference = ort.InferenceSession(path, ort_options, providers=["CPUExecutionProvider"])
        feeds = random_feeds(reference, rng)
        expected = reference.run(None, feeds)
        for policy in ("mixed_float16", "mixed_bfloat16"):
            out = os.path.join(work, f"{stem}_{policy}.onnx")
            subprocess.run([castor, "convert", path, "-o", out, "--policy", policy],
                           check=True, stdout=subprocess.DEVNULL)
            converted = onnx.load(out)
            onnx.checker.check_model(converted, full_check=True)
            records = castor_records(castor, out)
            problems, lowp_values = check_types(converted, records)
            if not records:
                problems.append("castor inspect shows no autocast record")
            casts = sum(1 for n in converted.graph.node if n.op_type == "Cast")
            lowp = "float16" if policy == "mixed_float16" else "bfloat16"
            outputs_fp32 = all(o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
                               for o in converted.graph.output)
            if not outputs_fp32:
                problems.append("a graph output is not float32")
            if policy == "mixed_float16":
                session = ort.InferenceSession(out, ort_options, providers=["CPUExecutionProvider"])
                actual = session.run(None, feeds)
                runner = "onnxruntime"
            else:
                feed_dir = os.path.join(work, f"{stem}_feeds")
                os.makedirs(feed_dir, exist_ok=True)
                args = [castor, "run", out, "--output-dir", os.path.join(work, f"{stem}_{policy}_out")]
                for name, value in feeds.items():
                    np.save(os.path.join(feed_dir, f"{name}.npy"), value)
                    args += ["--input", f"{name}={os.path.join(feed_dir, name + '.npy')}"]
                subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
                actual = [np.load(os.path.join(work, f"{stem}_{policy}_out", f"{o.name}.npy"))
                          for o in converted.graph.output]
                runner = "castor cpu"
            worst = 0.0
            for want, got in zip(expected, actual):
                scale = max(1.0, float(np.abs(want).max()))
                worst = max(worst, float(np.abs(want.astype(np.float64) - got).max()) / scale)
            if worst > TOLERANCE[policy]:
                problems.append(f"outputs differ from float32 by {worst:.3g} (relative to max "
                                f"|output|), tolerance {TOLERANCE[policy]}")
            status = "ok" if not problems else "FAIL"
            print(f"{status:4} {stem:20} {policy:15} casts={casts:3} "
                  f"{lowp} values={lowp_values:3} run by {runner:11} max rel err={worst:.2e}")
            for problem in problems:
                print(f"     {problem}")
            failures += bool(problems)
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
