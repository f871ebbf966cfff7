"""Checks castor's LSTM / GRU / RNN (the unroll-recurrent pass) against
independent references, through `castor run`:
  1. PyTorch 1.13 (Debian's): nn.LSTM (1 layer; 2 layers bidirectional
     batch_first with h0/c0 fed), nn.GRU (2 layers, bidirectional; torch
     writes linear_before_reset=1), nn.RNN (tanh, relu) exported with
     torch.onnx.export (opset 17, training mode, no constant folding); castor's
     float32 outputs against torch's float64 run of the same weights.
  2. ONNX Runtime on hand-built single-op models for what torch never writes:
     peepholes, clip, input_forget, initial states, activations with
     alpha/beta, reverse direction, layout 1 (opset 14), GRU with
     linear_before_reset=0, sequence_lens (equal to the length; shorter ones,
     fed or constant, which castor masks), and opsets 7, 9 and 11
     (Unsqueeze/Clip with attributes).
  3. The ONNX backend node cases of the three ops (test_lstm_*, test_gru_*,
     test_rnn_seq_length, test_simple_rnn_*: 12 in onnx 1.12), which
     ../shared/conformance does not hold: generated here from Debian's onnx
     case definitions and run by `castor conformance` (all must pass).
Run with the virtual environment's interpreter (.venv/bin/python), which sees
Debian's torch and onnx and PyPI's onnxruntime:
  recurrent_reference_check.py CASTOR_BINARY WORK_DIR
Exit 0 when every case matched; one line per case either way.
"""
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import onnxruntime as ort
import torch

# float32 compute against a float64 (torch) or float32 (ORT) reference over a
# few steps of small random weights.
TOLERANCE = 2e-5


def run_castor(castor, model_path, feeds, work):
    args = [castor, "run", model_path, "--output-dir", os.path.join(work, "out")]
    for name, array in feeds.items():
        path = os.path.join(work, f"in_{name}.npy")
        np.save(path, array)
        args += ["--input", f"{name}={path}"]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"castor run exit {done.returncode}: {done.stderr.strip()}")
    outputs = []
    for out in onnx.load(model_path).graph.output:
        outputs.append(np.load(os.path.join(work, "out", out.name + ".npy")))
    return outputs


def compare(name, got, want):
    worst = 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return f"FAIL {name}: shape {g.shape} != reference {w.shape}"
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w))))
    status = "ok" if worst <= TOLERANCE else "FAIL"
    return f"{status} {name}: max abs error {worst:.2e} over {len(got)} outputs"


def torch_cases():
    torch.manual_seed(0)
    x_tm = torch.randn(5, 3, 4)  # [seq, batch, input]
    x_bf = torch.randn(3, 5, 4)  # batch_first
    h0 = torch.randn(4, 3, 6)
    c0 = torch.randn(4, 3, 6)
    return [
        ("torch_lstm_1layer", torch.nn.LSTM(4, 6), (x_tm,)),
        ("torch_lstm_2layer_bidirectional_batch_first_h0_c0",
         torch.nn.LSTM(4, 6, num_layers=2, batch_first=True, bidirectional=True),
         (x_bf, (h0, c0))),
        ("torch_gru_2layer_bidirectional", torch.nn.GRU(4, 6, num_layers=2, bidirectional=True),
         (x_tm,)),
        ("torch_gru_batch_first_h0", torch.nn.GRU(4, 6, batch_first=True), (x_bf, h0[:1])),
        ("torch_rnn_tanh", torch.nn.RNN(4, 6, num_layers=2), (x_tm,)),
        ("torch_rnn_relu_reverse_layer", torch.nn.RNN(4, 6, nonlinearity="relu",
                                                     bidirectional=True), (x_tm,)),
    ]


def flatten(outputs):
    flat = []
    for o in outputs if isinstance(outputs, tuple) else (outputs,):
        flat.extend(flatten(o) if isinstance(o, tuple) else [o])
    return flat


def check_torch(castor, work):
    lines = []
    for name, module, args in torch_cases():
        path = os.path.join(work, name + ".onnx")
        flat_args = flatten(args)
        input_names = [f"in{i}" for i in range(len(flat_args))]
        torch.onnx.export(module, args, path, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, opset_version=17, input_names=input_names)
        with torch.no_grad():
            reference = [t.numpy() for t in flatten(module.double()(*[
                a.double() if isinstance(a, torch.Tensor) else tuple(t.double() for t in a)
                for a in args]))]
        feeds = {n: a.numpy() for n, a in zip(input_names, flat_args)}
        try:
            got = run_castor(castor, path, feeds, work)
            lines.append(compare(name, got, reference))
        except RuntimeError as error:
            lines.append(f"FAIL {name}: {error}")
    return lines


def random(rng, *shape):
    return rng.uniform(-0.5, 0.5, size=shape).astype(np.float32)


def op_model(op, inputs, attributes, outputs, opset):
    """One recurrent node; `inputs` maps ONNX input slots to (name, array,
    fed): fed arrays are graph inputs, the others initializers."""
    slots = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    node_inputs, graph_inputs, initializers, feeds = [], [], [], {}
    for slot in slots:
        if slot not in inputs:
            node_inputs.append("")
            continue
        array, fed = inputs[slot]
        node_inputs.append(slot)
        if fed:
            elem = TensorProto.INT32 if array.dtype == np.int32 else TensorProto.FLOAT
            graph_inputs.append(helper.make_tensor_value_info(slot, elem, array.shape))
            feeds[slot] = array
        else:
            initializers.append(numpy_helper.from_array(array, slot))
    while node_inputs and node_inputs[-1] == "":
        node_inputs.pop()
    node = helper.make_node(op, node_inputs, outputs, name=f"{op.lower()}_node", **attributes)
    graph = helper.make_graph([node], op.lower(), graph_inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                               for o in outputs if o], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model, feeds


def ort_cases():
    rng = np.random.default_rng(1)
    seq, batch, inp, hid = 4, 3, 5, 3
    x = random(rng, seq, batch, inp)
    x_batch_major = np.ascontiguousarray(x.transpose(1, 0, 2))
    full_lens = np.full((batch,), seq, dtype=np.int32)
    cases = []

    def weights(gates, dirs):
        return {"W": (random(rng, dirs, gates * hid, inp), False),
                "R": (random(rng, dirs, gates * hid, hid), False),
                "B": (random(rng, dirs, 2 * gates * hid), False)}

    lstm = dict(weights(4, 1), X=(x, True), initial_h=(random(rng, 1, batch, hid), True),
                initial_c=(random(rng, 1, batch, hid), True), P=(random(rng, 1, 3 * hid), False))
    cases.append(("ort_lstm_peepholes_initial_state", "LSTM", lstm,
                  dict(hidden_size=hid), ["Y", "Y_h", "Y_c"], 17))
    cases.append(("ort_lstm_clip_input_forget", "LSTM", dict(lstm),
                  dict(hidden_size=hid, clip=0.3, input_forget=1), ["Y", "Y_h", "Y_c"], 17))
    lstm_bi = dict(weights(4, 2), X=(x, True), sequence_lens=(full_lens, False))
    cases.append(("ort_lstm_bidirectional_sequence_lens_full", "LSTM", lstm_bi,
                  dict(hidden_size=hid, direction="bidirectional"), ["Y", "Y_h", "Y_c"], 17))
    lstm_rev = dict(weights(4, 1), X=(x_batch_major, True),
                    initial_h=(random(rng, batch, 1, hid), True))
    cases.append(("ort_lstm_reverse_layout1", "LSTM", lstm_rev,
                  dict(hidden_size=hid, direction="reverse", layout=1), ["Y", "", "Y_c"], 14))
    cases.append(("ort_lstm_opset7_clip", "LSTM", dict(weights(4, 1), X=(x, True)),
                  dict(hidden_size=hid, clip=0.2), ["Y", "Y_h"], 7))
    cases.append(("ort_lstm_activations_alpha_beta", "LSTM", dict(weights(4, 1), X=(x, True)),
                  dict(hidden_size=hid, activations=["HardSigmoid", "LeakyRelu", "Softsign"],
                       activation_alpha=[0.3, 0.05], activation_beta=[0.6]), ["Y", "Y_h"], 17))
    gru_init = (random(rng, 2, batch, hid), True)
    cases.append(("ort_gru_linear_before_reset_0_bidirectional", "GRU",
                  dict(weights(3, 2), X=(x, True), initial_h=gru_init),
                  dict(hidden_size=hid, direction="bidirectional"), ["Y", "Y_h"], 17))
    cases.append(("ort_gru_linear_before_reset_0_no_initial", "GRU",
                  dict(weights(3, 1), X=(x, True)), dict(hidden_size=hid), ["Y", "Y_h"], 11))
    cases.append(("ort_gru_linear_before_reset_1_clip", "GRU",
                  dict(weights(3, 1), X=(x, True), initial_h=(random(rng, 1, batch, hid), True)),
                  dict(hidden_size=hid, linear_before_reset=1, clip=0.4), ["Y", "Y_h"], 11))
    cases.append(("ort_gru_relu_tanh_layout1_reverse", "GRU",
                  dict(weights(3, 1), X=(x_batch_major, True)),
                  dict(hidden_size=hid, activations=["Sigmoid", "Relu"], direction="reverse",
                       layout=1), ["Y", "Y_h"], 14))
    cases.append(("ort_rnn_reverse_sequence_lens_full", "RNN",
                  dict(weights(1, 1), X=(x, True), sequence_lens=(full_lens, False),
                       initial_h=(random(rng, 1, batch, hid), True)),
                  dict(hidden_size=hid, direction="reverse"), ["Y", "Y_h"], 7))
    cases.append(("ort_rnn_bidirectional_elu_no_bias", "RNN",
                  {"W": (random(rng, 2, hid, inp), False), "R": (random(rng, 2, hid, hid), False),
                   "X": (x, True)},
                  dict(hidden_size=hid, direction="bidirectional", activations=["Elu", "Tanh"],
                       activation_alpha=[0.7]), ["Y", "Y_h"], 17))
    # sequence_lens shorter than the sequence: masked steps keep the state
    # and write zeros to Y (fed at run time, or a constant; both directions).
    short_lens = np.array([4, 2, 0], dtype=np.int32)
    cases.append(("ort_lstm_bidirectional_sequence_lens_fed", "LSTM",
                  dict(weights(4, 2), X=(x, True), sequence_lens=(short_lens, True),
                       initial_h=(random(rng, 2, batch, hid), True),
                       initial_c=(random(rng, 2, batch, hid), True)),
                  dict(hidden_size=hid, direction="bidirectional"), ["Y", "Y_h", "Y_c"], 17))
    cases.append(("ort_gru_reverse_sequence_lens_constant", "GRU",
                  dict(weights(3, 1), X=(x, True), sequence_lens=(np.array([1, 3, 4], np.int32), False)),
                  dict(hidden_size=hid, direction="reverse", linear_before_reset=1),
                  ["Y", "Y_h"], 11))
    cases.append(("ort_rnn_sequence_lens_fed", "RNN",
                  dict(weights(1, 1), X=(x, True), sequence_lens=(np.array([3, 4, 1], np.int32), True)),
                  dict(hidden_size=hid), ["Y", "Y_h"], 9))
    return cases


def ort_reference(op, inputs, attributes, outputs, opset, work, name):
    """ONNX Runtime's outputs; ORT has no layout 1, so a layout-1 case is
    run as its layout-0 twin (X and the states transposed) and the outputs
    transposed back."""
    batch_major = attributes.get("layout", 0) == 1
    if batch_major:
        inputs = {slot: ((array.transpose(1, 0, 2).copy(), fed)
                         if slot in ("X", "initial_h", "initial_c") else (array, fed))
                  for slot, (array, fed) in inputs.items()}
        attributes = {k: v for k, v in attributes.items() if k != "layout"}
    model, feeds = op_model(op, inputs, attributes, outputs, opset)
    path = os.path.join(work, name + "_ort.onnx")
    onnx.save(model, path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    reference = [r.astype(np.float64) for r in session.run(None, feeds)]
    if batch_major:  # Y [seq, D, batch, H] -> [batch, seq, D, H]; states [D, batch, H] -> [batch, D, H]
        reference = [r.transpose(2, 0, 1, 3) if r.ndim == 4 else r.transpose(1, 0, 2)
                     for r in reference]
    return reference


def check_ort(castor, work):
    lines = []
    for name, op, inputs, attributes, outputs, opset in ort_cases():
        model, feeds = op_model(op, inputs, attributes, outputs, opset)
        path = os.path.join(work, name + ".onnx")
        onnx.save(model, path)
        reference = ort_reference(op, inputs, attributes, outputs, opset, work, name)
        try:
            got = run_castor(castor, path, feeds, work)
            lines.append(compare(name, got, reference))
        except RuntimeError as error:
            lines.append(f"FAIL {name}: {error}")
    return lines


# Generates onnx's node cases of op type argv[2] into argv[1], one process
# per op type (onnx collects its cases once per process) (run by Debian's
# interpreter: onnx 1.12's case modules need its protobuf, which takes a
# bool for an int attribute, and the NumPy aliases it still uses).
GENERATE_CASES = """
import argparse, contextlib, io, sys, warnings
import numpy as np
for alias, value in (("float", float), ("int", int), ("bool", bool), ("object", object)):
    try:
        getattr(np, alias)
    except AttributeError:
        setattr(np, alias, value)
from onnx.backend.test import cmd_tools
with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
    warnings.simplefilter("ignore")
    cmd_tools.generate_data(argparse.Namespace(output=sys.argv[1], op_type=sys.argv[2]))
"""


def check_onnx_node_cases(castor, work):
    """Writes onnx's own LSTM/GRU/RNN node cases and runs castor conformance."""
    out = os.path.join(work, "onnx_cases")
    for op in ("LSTM", "GRU", "RNN"):
        done = subprocess.run(["/usr/bin/python3", "-c", GENERATE_CASES, out, op],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return [f"FAIL onnx_node_cases: generating {op}'s failed: {done.stderr.strip()[-600:]}"]
    cases = os.path.join(work, "onnx_recurrent_cases")
    os.makedirs(cases, exist_ok=True)
    names = sorted(n for n in os.listdir(os.path.join(out, "node"))
                   if any(k in n for k in ("lstm", "gru", "rnn")))
    for name in names:
        target = os.path.join(cases, name)
        if not os.path.exists(target):
            os.symlink(os.path.join(out, "node", name), target)
    expected = os.path.join(work, "no_expected_failures.txt")
    open(expected, "w").close()
    done = subprocess.run([castor, "conformance", cases, "--expected-failures", expected],
                          capture_output=True, text=True)
    summary = (done.stdout.strip().splitlines() or [""])[-1]
    status = "ok" if done.returncode == 0 and names else "FAIL"
    detail = "" if status == "ok" else " " + done.stdout + done.stderr
    return [f"{status} onnx_node_cases ({len(names)}: {', '.join(names)}): {summary}{detail}"]


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    castor, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    lines = check_torch(castor, work) + check_ort(castor, work) + check_onnx_node_cases(castor, work)
    print("\n".join(lines))
    failed = [line for line in lines if not line.startswith("ok")]
    print(f"{len(lines) - len(failed)} of {len(lines)} cases match")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
