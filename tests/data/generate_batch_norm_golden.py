#!/usr/bin/python3
"""BatchNorm running statistics as PyTorch updates them: the golden for
tests/batch_norm_training_test.cc (run with Debian's torch 1.13).

A small model (Conv -> BatchNorm2d(momentum 0.3) -> ReLU -> Conv ->
BatchNorm2d(default momentum 0.1) -> Flatten -> Linear) in train() mode,
exported as torch.onnx.export(..., training=TrainingMode.TRAINING,
do_constant_folding=False) at opset 13 (BatchNormalization with five
outputs, no training_mode) and opset 17 (training_mode=1), then trained by
torch.optim.SGD (lr 0.1) for 3 steps on 3 batches of 3 images 2x2 (from
the running statistics the exports hold: a training-mode export runs the
model once, which updates them): few
values per channel (12), so the unbiased batch variance PyTorch's running
variance takes (x 12/11) is far from the biased one the ONNX spec's
definition takes. Writes, next to this script:

  batch_norm_opset13.onnx, batch_norm_opset17.onnx   the exports
  batch_norm_golden.json   the batches, torch's per-step losses and its
                           running statistics after the 3 steps (by ONNX
                           initializer name), and the same run's running
                           statistics under the ONNX definition (biased
                           variance), to show how far apart the two are.

Deterministic: one thread, no randomness beyond the seeded initialisation.
"""

import copy
import json
import os
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 1206
BATCH, STEPS, LR = 3, 3, 0.1


def build():
    torch.manual_seed(SEED)
    return nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3, momentum=0.3), nn.ReLU(),
        nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 5))


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = build().train()
    rng = np.random.default_rng(SEED)
    xs = rng.standard_normal((STEPS, BATCH, 2, 2, 2)).astype(np.float32)
    ys = rng.integers(0, 5, size=(STEPS, BATCH)).astype(np.int64)
    for opset in (13, 17):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(copy.deepcopy(model), torch.from_numpy(xs[0]),
                              os.path.join(HERE, "batch_norm_opset%d.onnx" % opset),
                              training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False, opset_version=opset,
                              input_names=["x"], output_names=["logits"])

    # Exporting in training mode runs the model once (on xs[0]), which moves
    # the exported copy's running statistics: the files hold those. The
    # reference starts from the same values.
    import onnx
    from onnx import numpy_helper
    exported = {}
    for opset in (13, 17):
        m = onnx.load(os.path.join(HERE, "batch_norm_opset%d.onnx" % opset))
        exported[opset] = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, tensor in buffers.items():
            if name.endswith("running_mean") or name.endswith("running_var"):
                assert np.array_equal(exported[13][name], exported[17][name]), name
                tensor.copy_(torch.from_numpy(exported[17][name].copy()))

    # The ONNX definition's statistics, from the inputs each layer sees.
    bns = {name: m for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    onnx_stats = {name: (m.running_mean.double().clone(), m.running_var.double().clone())
                  for name, m in bns.items()}

    def track(name):
        def hook(module, inputs, output):
            x = inputs[0].detach().double()
            mean = x.mean(dim=(0, 2, 3))
            var = x.var(dim=(0, 2, 3), unbiased=False)
            keep = 1.0 - module.momentum
            m, v = onnx_stats[name]
            onnx_stats[name] = (m * keep + mean * (1 - keep), v * keep + var * (1 - keep))
        return hook

    for name, m in bns.items():
        m.register_forward_hook(track(name))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for k in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(torch.from_numpy(xs[k])), torch.from_numpy(ys[k]))
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    torch_stats, onnx_def = {}, {}
    for name, m in bns.items():
        torch_stats[name + ".running_mean"] = m.running_mean.tolist()
        torch_stats[name + ".running_var"] = m.running_var.tolist()
        onnx_def[name + ".running_mean"] = onnx_stats[name][0].float().tolist()
        onnx_def[name + ".running_var"] = onnx_stats[name][1].float().tolist()
    golden = {
        "torch": torch.__version__, "lr": LR, "batch": BATCH, "steps": STEPS,
        "x": xs.tolist(), "y": ys.tolist(), "losses": losses,
        "running_stats": torch_stats, "running_stats_onnx_definition": onnx_def,
    }
    with open(os.path.join(HERE, "batch_norm_golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    for name in torch_stats:
        a, b = np.array(torch_stats[name]), np.array(onnx_def[name])
        print("%-18s torch vs ONNX definition: max |diff| %.3g (max |value| %.3g)"
              % (name, np.abs(a - b).max(), np.abs(a).max()))


if __name__ == "__main__":
    main()
