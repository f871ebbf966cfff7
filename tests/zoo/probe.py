#!/usr/bin/python3
"""Triage aid: what would castor hit after today's known blockers?

castor stops at the first error, so one blocker (training-mode
BatchNormalization, Dropout) hides every later one. This script rewrites a
zoo model to step around chosen blockers, WITHOUT changing what it computes
in training, and runs `castor train` on the rewrite (float32, 4 steps,
checkpoint) so compare.py's checks can run on it too:

  dropout  Dropout nodes whose ratio is a constant 0 (generate.py sets every
           p to 0) are removed: output 0 is rewired to input 0. The mask
           output must be unused.
  bn       BatchNormalization with training_mode=1 and three outputs becomes
           the one-output form (training_mode removed): castor trains that
           with batch statistics, as PyTorch's train() mode does; the
           running-statistics outputs must be unused (torch's export leaves
           them dangling).

The rewrites are a diagnosis, never a fix: users' files keep these nodes, and
castor must take them as they are (DESIGN.md: "never a reason to refuse a
user's model").

With --static it only lists, per model, every op type on the
differentiable path (from a float initializer to the output) that castor's
graph/ops/gradient_rules.cc has no rule for: all the missing gradients at
once, where castor reports the first.

Usage:
  /usr/bin/python3 tests/zoo/probe.py --static --castor build/castor OUT
  /usr/bin/python3 tests/zoo/probe.py --castor build/castor OUT [--models a,b]
      [--rewrite dropout,bn] [--policies float32]
It writes OUT/probe/<name>.onnx (+ a copy of the reference pointing at it)
and then runs compare.py on OUT/probe.
"""

import argparse
import glob
import json
import os
import shutil
import sys

import onnx
from onnx import numpy_helper


def constant_values(graph):
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(a.t)
    return values


def rewrite(model, kinds):
    graph = model.graph
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    consts = constant_values(graph)
    rename, keep, counts = {}, [], {"dropout": 0, "bn": 0}
    for node in graph.node:
        if ("dropout" in kinds and node.op_type == "Dropout"
                and (len(node.output) < 2 or node.output[1] not in used)):
            ratio = consts.get(node.input[1]) if len(node.input) > 1 and node.input[1] else 0.5
            if ratio is not None and float(ratio) == 0.0:
                rename[node.output[0]] = node.input[0]
                counts["dropout"] += 1
                continue
        if "bn" in kinds and node.op_type == "BatchNormalization":
            attrs = {a.name: a for a in node.attribute}
            if "training_mode" in attrs and attrs["training_mode"].i == 1 \
                    and all(o not in used for o in node.output[1:]):
                new_attrs = [a for a in node.attribute if a.name != "training_mode"]
                del node.attribute[:]
                node.attribute.extend(new_attrs)
                del node.output[1:]
                counts["bn"] += 1
        keep.append(node)

    def resolve(name):
        while name in rename:
            name = rename[name]
        return name

    for node in keep:
        for i, name in enumerate(node.input):
            node.input[i] = resolve(name)
    for out in graph.output:
        if out.name in rename:  # a graph output must keep its name: Identity
            keep.append(onnx.helper.make_node("Identity", [resolve(out.name)], [out.name]))
    del graph.node[:]
    graph.node.extend(keep)
    return counts


def gradient_ops(source_dir):
    """Op types with a gradient rule or an explicit 'no gradient', read from
    castor's graph/ops/gradient_rules.cc (its kRules / kNoGradient tables)."""
    import re
    with open(os.path.join(source_dir, "graph", "ops", "gradient_rules.cc")) as f:
        text = f.read()
    rules = set(re.findall(r'\{"(\w+)",\s*\w+\}', text))
    none = set(re.findall(r'\{(?:""|kTrainingDomain),\s*"(\w+)",', text))
    return rules, none


def differentiable_ops(model):
    """{op type: count} of the nodes on a path from a float initializer to a
    graph output: the nodes autodiff must differentiate."""
    graph = model.graph
    float_inits = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    reach = set(float_inits)
    forward = set()
    for i, node in enumerate(graph.node):  # exported graphs are topologically sorted
        if any(x in reach for x in node.input):
            forward.add(i)
            reach.update(node.output)
    needed = {o.name for o in graph.output}
    counts = {}
    for i in reversed(range(len(graph.node))):
        node = graph.node[i]
        if any(o in needed for o in node.output):
            needed.update(node.input)
            if i in forward:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def static_gaps(out_dir, names, source_dir):
    """Per model: the op types on the differentiable path that castor has no
    gradient rule for (all of them, not only the first castor stops at)."""
    rules, none = gradient_ops(source_dir)
    result = {}
    for name in names:
        model = onnx.load(os.path.join(out_dir, name + ".onnx"), load_external_data=False)
        counts = differentiable_ops(model)
        result[name] = {op: n for op, n in sorted(counts.items())
                        if op not in rules and op not in none}
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--castor", required=True)
    ap.add_argument("--models", default="")
    ap.add_argument("--rewrite", default="dropout,bn")
    ap.add_argument("--policies", default="float32")
    ap.add_argument("--json", default="")
    ap.add_argument("--static", action="store_true",
                    help="only list, per model, the op types on the differentiable path "
                         "without a gradient rule in castor's source (--source)")
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), help="castor's source tree (for --static)")
    args = ap.parse_args(argv)
    if args.static:
        names = args.models.split(",") if args.models else [
            os.path.basename(p)[:-len(".ref.json")]
            for p in sorted(glob.glob(os.path.join(args.out, "*.ref.json")))]
        gaps = static_gaps(args.out, names, args.source)
        for name, ops in gaps.items():
            print("%-20s %s" % (name, ", ".join("%s x%d" % kv for kv in ops.items()) or "-"))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(gaps, f, indent=1)
        return 0
    kinds = set(args.rewrite.split(","))
    probe_dir = os.path.join(args.out, "probe")
    os.makedirs(probe_dir, exist_ok=True)
    names = args.models.split(",") if args.models else [
        os.path.basename(p)[:-len(".ref.json")]
        for p in sorted(glob.glob(os.path.join(args.out, "*.ref.json")))]
    for name in names:
        with open(os.path.join(args.out, name + ".ref.json")) as f:
            ref = json.load(f)
        model = onnx.load(os.path.join(args.out, ref["onnx"]))
        counts = rewrite(model, kinds)
        onnx.checker.check_model(model)
        onnx.save(model, os.path.join(probe_dir, ref["onnx"]))
        for key in ("data", "updates"):
            dst = os.path.join(probe_dir, ref[key])
            if not os.path.exists(dst):
                os.symlink(os.path.abspath(os.path.join(args.out, ref[key])), dst)
        with open(os.path.join(probe_dir, name + ".ref.json"), "w") as f:
            json.dump(ref, f)
        print("%-20s rewrote %d Dropout, %d BatchNormalization" % (name, counts["dropout"],
                                                                  counts["bn"]), flush=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import compare
    cargs = [probe_dir, "--castor", args.castor, "--models", ",".join(names),
             "--policies", args.policies]
    if args.json:
        cargs += ["--json", args.json]
    return compare.main(cargs)


if __name__ == "__main__":
    sys.exit(main())
