"""Writes tests/data/torch_sgd_golden.json: PyTorch's per-step training losses
and weight checksums for castor's sample models, which
tests/torch_agreement_test.cc reproduces step by step with castor's Trainer.

Run with Debian's interpreter (torch 1.13, onnx 1.12), from anywhere:

    /usr/bin/python3 tests/data/generate_torch_sgd_golden.py

Setup, identical on both sides:
  - weights: the float32 initializers of models/<model>_opset17.onnx loaded
    into the PyTorch module of models/generate.py (names map one to one);
  - data: the first STEPS batches of BATCH Fashion-MNIST training images in
    file order (no shuffle) from /usr/share/datasets/fashion-mnist (Debian's
    dataset-fashion-mnist), pixels uint8 / 255 in float32, [B,1,28,28],
    labels int64;
  - loss: cross-entropy, mean over the batch, on `logits`;
  - torch.optim.SGD with lr LR, plain and with momentum 0.9; the module in
    train() mode (the ResNet's BatchNorm normalises with batch statistics and
    updates its running statistics, as castor's training graph does).
The loss recorded for step k is loss.item() of the forward pass before the
k-th optimizer.step(). Checksums of every parameter (and BatchNorm running
statistic) after the first step (the update is then -lr times the gradient)
and after the last are float64 sums over the float32 values:
sum and sum of squares of the weights, and of their change from the start
(the update, which is what a wrong learning rate or gradient shows in).

BatchNorm running statistics follow two definitions. PyTorch updates the
running variance with the unbiased batch variance (divided by n - 1, n = batch
x height x width); the ONNX BatchNormalization spec, which castor implements,
uses the biased one (divided by n) and momentum 0.9 as a float attribute.
`running_stats` holds PyTorch's values; `running_stats_onnx` the same
training run's statistics under the ONNX definition (computed here from the
inputs PyTorch's BatchNorm layers saw), which castor must match.

Deterministic: one thread, deterministic algorithms, no randomness at all,
so a rerun writes a byte-identical file.

Each case also holds `losses_float64`: the same training run in float64 (from
the same float32 weights and images). Where the model amplifies rounding (the
ResNet: BatchNorm with lr 0.05), PyTorch's own float32 losses drift from it by
up to ~6e-5 relative within 8 steps, which bounds how closely any float32
implementation can follow PyTorch's float32 trajectory.
"""
import gzip
import json
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "models"))
import generate  # noqa: E402  (models/generate.py: the module definitions)

DATA_DIR = "/usr/share/datasets/fashion-mnist"
STEPS = 8
BATCH = 32
LR = 0.05
MODELS = [("mlp", generate.MLP), ("cnn", generate.CNN), ("resnet", generate.ResNet)]
# Checksums are taken after the first step (the update is then -lr times
# the gradient at the ONNX file's weights) and after the last.
CHECKSUM_STEPS = (1, STEPS)
OPTIMIZERS = [("sgd", dict(lr=LR)), ("sgd_momentum", dict(lr=LR, momentum=0.9))]


def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        data = f.read()
    assert int.from_bytes(data[:4], "big") == magic, path
    rank = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load_batches():
    count = STEPS * BATCH
    pixels = read_idx(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz"), 0x803)[:count]
    labels = read_idx(os.path.join(DATA_DIR, "train-labels-idx1-ubyte.gz"), 0x801)[:count]
    # Exactly castor's conversion (training/dataset.cc): float32(v) / 255.0f.
    images = pixels.astype(np.float32).reshape(count, 1, 28, 28) / np.float32(255.0)
    labels = labels.astype(np.int64)
    return [(torch.from_numpy(images[k * BATCH:(k + 1) * BATCH].copy()),
             torch.from_numpy(labels[k * BATCH:(k + 1) * BATCH].copy()))
            for k in range(STEPS)]


def load_module(name, cls):
    """The PyTorch module holding the ONNX file's initializers exactly."""
    proto = onnx.load(os.path.join(ROOT, "models", "%s_opset17.onnx" % name))
    initializers = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    module = cls()
    state = module.state_dict()
    loaded = set()
    for key, tensor in state.items():
        if key.endswith("num_batches_tracked"):
            tensor.zero_()
            continue
        value = initializers[key]
        assert value.dtype == np.float32 and tuple(value.shape) == tuple(tensor.shape), key
        tensor.copy_(torch.from_numpy(value.copy()))
        loaded.add(key)
    unused = set(initializers) - loaded
    assert not unused, "initializers without a module entry: %s" % sorted(unused)
    module.load_state_dict(state)
    return module


def checksums(tensor, start):
    w = tensor.detach().to(torch.float64)
    d = w - start.to(torch.float64)
    return {"sum": float(w.sum()), "sum_sq": float((w * w).sum()),
            "delta_sum": float(d.sum()), "delta_sum_sq": float((d * d).sum())}


def track_onnx_running_stats(module):
    """Keeps, per BatchNorm layer, the running statistics the ONNX definition
    gives for the inputs the layer sees in training: running = running *
    momentum + batch * (1 - momentum), momentum the model's float32 0.9, the
    batch variance biased; computed in float64, stored as float32 (as castor's
    CPU kernel does)."""
    momentum = float(np.float32(0.9))
    stats = {}

    def hook(layer_name):
        def update(layer, inputs):
            if not layer.training:
                return
            x = inputs[0].detach().to(torch.float64)
            mean = x.mean(dim=(0, 2, 3))
            var = ((x - mean[None, :, None, None]) ** 2).mean(dim=(0, 2, 3))
            old_mean, old_var = stats[layer_name]
            stats[layer_name] = (
                (old_mean.to(torch.float64) * momentum + mean * (1 - momentum)).float(),
                (old_var.to(torch.float64) * momentum + var * (1 - momentum)).float())
        return update

    for layer_name, layer in module.named_modules():
        if isinstance(layer, torch.nn.BatchNorm2d):
            stats[layer_name] = (layer.running_mean.detach().clone(),
                                 layer.running_var.detach().clone())
            layer.register_forward_pre_hook(hook(layer_name))
    return stats


def snapshot(module, start, onnx_stats, step):
    """Checksums of the parameters and BatchNorm statistics after `step`."""
    parameter_names = {n for n, _ in module.named_parameters()}
    weights, running_stats = {}, {}
    for key, tensor in module.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue
        target = weights if key in parameter_names else running_stats
        target[key] = checksums(tensor, start[key])
    running_stats_onnx = {}
    for layer_name, (mean, var) in onnx_stats.items():
        for stat, tensor in (("running_mean", mean), ("running_var", var)):
            key = "%s.%s" % (layer_name, stat)
            running_stats_onnx[key] = checksums(tensor, start[key])
    assert set(running_stats_onnx) == set(running_stats)
    return {"step": step, "weights": weights, "running_stats": running_stats,
            "running_stats_onnx": running_stats_onnx}


def train(name, cls, kwargs, batches, dtype):
    """Trains a fresh copy of the model in `dtype`; returns the per-step
    losses and the checksums after CHECKSUM_STEPS."""
    module = load_module(name, cls).to(dtype)
    module.train()
    start = {k: v.detach().clone() for k, v in module.state_dict().items()}
    onnx_stats = track_onnx_running_stats(module)
    optimizer = torch.optim.SGD(module.parameters(), **kwargs)
    losses, snapshots = [], []
    for step, (images, labels) in enumerate(batches, start=1):
        optimizer.zero_grad()
        loss = F.cross_entropy(module(images.to(dtype)), labels)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        if step in CHECKSUM_STEPS:
            snapshots.append(snapshot(module, start, onnx_stats, step))
    return losses, snapshots


def run(name, cls, kwargs, batches):
    losses, snapshots = train(name, cls, kwargs, batches, torch.float32)
    # The same run in float64 from the same float32 start and images: the
    # trajectory float32 rounding wanders around (for the reader; the test
    # checks castor against it too).
    losses_float64, _ = train(name, cls, kwargs, batches, torch.float64)
    return {"model": "models/%s_opset17.onnx" % name, "optimizer": "sgd",
            "options": kwargs, "losses": losses, "losses_float64": losses_float64,
            "checksums": snapshots}


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    batches = load_batches()
    golden = {
        "torch": torch.__version__,
        "data": DATA_DIR + " train, file order",
        "steps": STEPS,
        "batch_size": BATCH,
        # Per batch: the float64 sum of its float32 pixels and its labels, so
        # the test can check it reads the same data.
        "batches": [{"pixel_sum": float(images.to(torch.float64).sum()),
                     "labels": labels.tolist()} for images, labels in batches],
        "cases": {},
    }
    for name, cls in MODELS:
        for optimizer, kwargs in OPTIMIZERS:
            golden["cases"]["%s_%s" % (name, optimizer)] = run(name, cls, kwargs, batches)
    path = os.path.join(HERE, "torch_sgd_golden.json")
    with open(path, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    for case, result in golden["cases"].items():
        drift = max(abs(a - b) / abs(b)
                    for a, b in zip(result["losses"], result["losses_float64"]))
        print("%-20s %s  (float32 vs float64: %.2g)"
              % (case, " ".join("%.6f" % x for x in result["losses"]), drift))


if __name__ == "__main__":
    main()
