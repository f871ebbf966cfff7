"""castor's autocast pass against onnxconverter-common's float16 converter.

For every sample model (MODELS_DIR/*.onnx) this converts the float32 model
  * with `castor convert MODEL -o OUT --policy mixed_float16`, and
  * with onnxconverter-common's
      float16.convert_float_to_float16(model, keep_io_types=True,
                                       op_block_list=..., node_block_list=...)
then counts the Cast nodes each inserted, runs both results through
onnx.checker (full_check) and ONNX Runtime (CPU execution provider) on the same
random inputs as the float32 model, and prints a side-by-side markdown table.

Run with the virtual environment's interpreter (onnxruntime and
onnxconverter-common from PyPI, Debian's onnx):
  .venv/bin/python bench/compare_converters.py CASTOR_BINARY MODELS_DIR [WORK_DIR]
      [--criterion non-weight|activation|total]

How the two converters are made comparable
------------------------------------------
Both keep graph inputs and outputs float32 (castor's default keep_io_types,
occ's keep_io_types=True) and compute the rest in float16. What stays float32:
  * op_block_list = castor's deny list, read from the resolved policy that
    `castor convert --save-policy FILE` writes (op_lists.deny, default-domain
    entries; the same list as graph/ops/autocast_table.cc). It replaces occ's
    DEFAULT_OP_BLOCK_LIST (ai.onnx-ml ops, Range, CumSum, Min, Max, Resize,
    TopK, ...): none of those ops occur in the sample models except Range and
    CumSum, which castor's deny list has too.
  * node_block_list = the nodes castor forced to float32 by a contextual rule
    rather than by their op's list, read from castor's own record
    (`castor inspect OUT --format json`, each node's autocast "why"):
    rule 2a (a Sqrt feeding a normalisation Div/Reciprocal), rule 2b (unknown
    ops, subgraphs) and rule 4 (the producer of a graph output stays float32,
    the Keras float32 final layer), plus nodes whose op has no float16 kernel
    type at the model's opset. So occ blocks exactly the nodes castor keeps in
    float32 for a reason other than float32 promotion.
What is NOT equalised, because it is each converter's algorithm:
  * castor's follow ops (Add, Mul, Relu, Reshape, ...) compute float32 when a
    computed input is float32 (PyTorch-style promotion); occ runs every
    unblocked node in float16 and casts around each blocked node separately
    (one Cast per blocked input per node, one per output).
  * Weights: castor is a training engine and keeps float32 master weights; an
    initializer a 16-bit node reads gets ONE shared Cast (rule 5). occ rewrites
    initializers (and Constant tensors) to float16 storage, which needs no
    Cast. So castor's weight/Constant Casts have no counterpart in occ; the
    table splits every count into weight+constant Casts and activation Casts
    (Casts of computed values and graph inputs), and the comparable number is
    the activation count.

A second occ run ("occ B") leaves the graph-output producer out of
node_block_list: with it blocked, occ 1.16 retypes the graph output itself to
float16 and casts the producer's float32 result to it (so keep_io_types does
not hold); unblocked, occ runs the final layer in float16 and casts the output
back to float32. Both are shown.

Exit status: 1 if castor inserts more Casts than occ (with castor's block
lists) on any model. Counted (--criterion): non-weight (the default) leaves
out castor's one Cast per float32 master weight, which occ has no counterpart
for because it converts the stored weights (so castor's Constant and
activation Casts are compared with all of occ's); activation compares only
Casts of computed values and graph inputs; total counts every Cast. 1 also if
a castor result fails onnx.checker, keeps a graph output 16-bit, or fails in
ONNX Runtime. occ failures are reported in the notes, not counted. Lines
starting "MORE CASTS" name every model where castor's total or activation
count is higher, split
by kind, whatever the criterion.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import warnings
from collections import Counter

import numpy as np
import onnx
import onnx.checker
import onnxruntime as ort
from onnxconverter_common import float16

BATCH = 16
SEED = 1234


def cast_summary(model):
    """Counter of a model's Cast nodes by what they read ("weight": an initializer,
    "constant": a Constant node's output, "activation": a computed value or a graph
    input), and notes on Casts that look wrong."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    constants = {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    producers = {o: n for n in graph.node for o in n.output}
    consumed = Counter(i for n in graph.node for i in n.input)
    outputs = {o.name for o in graph.output}
    counts = Counter(weight=0, constant=0, activation=0)
    orphans, chains, wrong_output = [], [], []
    output_types = {o.name: o.type.tensor_type.elem_type for o in graph.output}
    sources = Counter()
    for node in graph.node:
        if node.op_type != "Cast":
            continue
        source = node.input[0]
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        sources[(source, to)] += 1
        if source in initializers:
            counts["weight"] += 1
        elif source in constants:
            counts["constant"] += 1
        else:
            counts["activation"] += 1
        if output_types.get(node.output[0], onnx.TensorProto.FLOAT) != onnx.TensorProto.FLOAT:
            wrong_output.append(node.name)
        if not consumed[node.output[0]] and node.output[0] not in outputs:
            orphans.append(node.name)
        producer = producers.get(source)
        if producer is not None and producer.op_type == "Cast":
            chains.append(f"{producer.name}->{node.name}")
    notes = []
    if orphans:
        notes.append(f"{len(orphans)} orphan Cast(s) (output unused): {', '.join(orphans[:3])}")
    if chains:
        notes.append(f"{len(chains)} Cast->Cast chain(s): {', '.join(chains[:2])}")
    duplicates = sum(c - 1 for c in sources.values() if c > 1)
    if duplicates:
        notes.append(f"{duplicates} duplicate Cast(s) (same source and type cast again)")
    if wrong_output:
        notes.append(f"Cast {', '.join(wrong_output)} makes a graph output 16-bit")
    return counts, notes


def float16_nodes(model):
    """Non-Cast nodes with a float16 output after ONNX shape inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - the count is informative only
        return None
    elem = {v.name: v.type.tensor_type.elem_type
            for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    return sum(1 for n in inferred.graph.node if n.op_type != "Cast"
               and any(elem.get(o) == onnx.TensorProto.FLOAT16 for o in n.output))


def check_and_run(path, model, feeds, expected, options):
    """(max abs error or None, notes): onnx.checker, output dtypes, ORT CPU run."""
    notes = []
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        notes.append(f"onnx.checker: {str(e).splitlines()[0][:120]}")
    wrong = [o.name for o in model.graph.output
             if o.type.tensor_type.elem_type != onnx.TensorProto.FLOAT]
    if wrong:
        notes.append(f"graph output(s) not float32: {', '.join(wrong)}")
    try:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        notes.append(f"ORT load failure: {str(e).splitlines()[0][:160]}")
        return None, notes
    try:
        actual = session.run(None, feeds)
    except Exception as e:  # noqa: BLE001
        notes.append(f"ORT run failure: {str(e).splitlines()[0][:160]}")
        return None, notes
    worst = 0.0
    for want, got in zip(expected, actual):
        worst = max(worst, float(np.abs(want.astype(np.float64) - got.astype(np.float64)).max()))
    return worst, notes


def castor_convert(castor, path, out, policy_path):
    subprocess.run([castor, "convert", path, "-o", out, "--policy", "mixed_float16",
                    "--save-policy", policy_path], check=True, stdout=subprocess.DEVNULL)
    with open(policy_path) as f:
        policy = json.load(f)
    report = json.loads(subprocess.run([castor, "inspect", out, "--format", "json"], check=True,
                                       capture_output=True, text=True).stdout)
    return policy, report


def forced_float32_nodes(report):
    """Nodes castor kept float32 by a contextual rule (2a, 2b, 4) or opset refusal."""
    names = []
    for node in report["nodes"]:
        why = node.get("autocast", {}).get("why", "")
        if node.get("autocast", {}).get("inserted_cast"):
            continue
        if (why.startswith(("rule 2a", "rule 2b", "rule 4")) or "does not accept" in why):
            names.append(node["name"])
    return names


def fmt_err(err):
    return "n/a" if err is None else f"{err:.2e}"


def fmt_casts(counts, original_casts):
    """"total (weight / constant / activation)" of inserted Casts, or n/a."""
    if counts is None:
        return "n/a"
    total = sum(counts.values()) - original_casts
    return f"{total} ({counts['weight']} / {counts['constant']} / {counts['activation']})"


def occ_convert(path, out, deny_ops, blocked_nodes, feeds, expected, options):
    """onnxconverter-common's float16 conversion with these block lists, checked and run:
    (Cast counts or None, max abs error or None, notes, float16 node count or None)."""
    try:
        with warnings.catch_warnings():
            # occ warns for every weight it clamps to [1e-7, 1e4]; not a result.
            warnings.simplefilter("ignore", UserWarning)
            model = float16.convert_float_to_float16(
                onnx.load(path), keep_io_types=True, op_block_list=deny_ops,
                node_block_list=blocked_nodes)
        onnx.save(model, out)
    except Exception as e:  # noqa: BLE001 - a converter failure is a result
        return None, None, [f"conversion failure: {type(e).__name__}: {str(e)[:160]}"], None
    counts, notes = cast_summary(model)
    err, run_notes = check_and_run(out, model, feeds, expected, options)
    return counts, err, notes + run_notes, float16_nodes(model)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("castor", help="the castor binary")
    parser.add_argument("models_dir", help="folder of float32 .onnx models")
    parser.add_argument("work_dir", nargs="?", default="compare_converters_out",
                        help="where converted models are written")
    parser.add_argument("--criterion", choices=("non-weight", "total", "activation"),
                        default="non-weight",
                        help="which Cast count decides the exit status (see the docstring)")
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    rng = np.random.default_rng(SEED)

    rows, details, failures, more_casts = [], [], [], []
    for path in sorted(glob.glob(os.path.join(args.models_dir, "*.onnx"))):
        stem = os.path.splitext(os.path.basename(path))[0]
        original = onnx.load(path)
        original_casts = sum(1 for n in original.graph.node if n.op_type == "Cast")
        model_ops = {n.op_type for n in original.graph.node if n.domain in ("", "ai.onnx")}
        reference = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        feeds = {i.name: rng.random([BATCH if not isinstance(d, int) else d for d in i.shape],
                                    dtype=np.float32)
                 for i in reference.get_inputs()}
        expected = reference.run(None, feeds)

        # castor
        castor_out = os.path.join(args.work_dir, f"{stem}_castor.onnx")
        policy, report = castor_convert(args.castor, path, castor_out,
                                        os.path.join(args.work_dir, f"{stem}_policy.json"))
        castor_model = onnx.load(castor_out)
        c_counts, c_notes = cast_summary(castor_model)
        c_total = sum(c_counts.values()) - original_casts
        recorded = report.get("summary", {}).get("autocast", {}).get("inserted_casts")
        if recorded is not None and recorded != c_total:
            c_notes.append(f"castor inspect says {recorded} inserted Casts, graph has {c_total}")
        c_err, run_notes = check_and_run(castor_out, castor_model, feeds, expected, options)
        c_notes += run_notes
        c_lowp = float16_nodes(castor_model)
        if c_err is None or run_notes or any("graph output" in n for n in c_notes):
            failures.append(f"{stem}: castor result failed a check: {'; '.join(c_notes)}")

        # onnxconverter-common with castor's block lists (A), and without the
        # graph-output producer (B: occ's own keep_io_types handling of outputs).
        deny_ops = sorted(op for op in policy["op_lists"]["deny"] if ":" not in op)
        blocked_nodes = forced_float32_nodes(report)
        output_producers = {n.name for n in original.graph.node
                            if set(n.output) & {o.name for o in original.graph.output}}
        o_counts, o_err, o_notes, o_lowp = occ_convert(
            path, os.path.join(args.work_dir, f"{stem}_occ.onnx"), deny_ops, blocked_nodes,
            feeds, expected, options)
        b_counts, b_err, b_notes, _ = occ_convert(
            path, os.path.join(args.work_dir, f"{stem}_occ_outputs_unblocked.onnx"), deny_ops,
            [n for n in blocked_nodes if n not in output_producers], feeds, expected, options)

        if o_counts is not None:
            o_total = sum(o_counts.values()) - original_casts
            key = "activation"
            castor_count, occ_count = {
                "activation": (c_counts[key], o_counts[key]),
                "non-weight": (c_total - c_counts["weight"], o_total - o_counts["weight"]),
                "total": (c_total, o_total),
            }[args.criterion]
            if c_total > o_total or c_counts[key] > o_counts[key]:
                more_casts.append(
                    f"{stem}: castor {c_total} Casts ({c_counts['weight']} weight, "
                    f"{c_counts['constant']} constant, {c_counts[key]} activation), "
                    f"onnxconverter-common {o_total} ({o_counts['weight']} weight, "
                    f"{o_counts['constant']} constant, {o_counts[key]} activation)")
            if castor_count > occ_count:
                failures.append(f"{stem}: castor inserts {castor_count} {args.criterion} Casts, "
                                f"onnxconverter-common {occ_count}")
        notes = ([f"castor: {n}" for n in c_notes] + [f"occ: {n}" for n in o_notes]
                 + [f"occ (outputs unblocked): {n}" for n in b_notes])
        rows.append((stem, fmt_casts(c_counts, original_casts),
                     fmt_casts(o_counts, original_casts), fmt_casts(b_counts, original_casts),
                     fmt_err(c_err), fmt_err(o_err), fmt_err(b_err), f"{c_lowp} / {o_lowp}",
                     "; ".join(notes) or "-"))
        details.append((stem, sorted(model_ops & set(deny_ops)), blocked_nodes))

    print("Casts inserted: total (weight / constant / activation). occ = onnxconverter-common "
          "with castor's block lists; occ B = the same without the graph-output producer in "
          "node_block_list.\n")
    print("| model | castor casts | occ casts | occ B casts | castor max err | occ max err "
          "| occ B max err | float16 nodes castor / occ | notes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print("Block lists given to onnxconverter-common (castor's deny ops present in the model; "
          "nodes castor forces to float32):")
    for stem, ops, nodes in details:
        print(f"  {stem}: op_block_list & model ops = {ops or '[]'}; node_block_list = {nodes}")
    print()
    print(f"max err = max |output - ORT float32 output| over every output; batch {BATCH}, "
          f"inputs uniform [0,1), seed {SEED}; exit criterion: {args.criterion} Casts")
    for line in more_casts:
        print(f"MORE CASTS {line}")
    for failure in failures:
        print(f"FAIL {failure}")
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
