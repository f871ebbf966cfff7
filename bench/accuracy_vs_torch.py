#!/usr/bin/python3
"""One-epoch test accuracy of `castor train` against PyTorch on the same data order.

For a sample model (cnn or mlp), trains one epoch of Fashion-MNIST with Adam
(lr 1e-3, batch 128) in castor under each policy, and in PyTorch 1.13 (float32,
Debian's, run with /usr/bin/python3) from the same initial weights
(models/generate.py's build()) on castor's own shuffle order: epoch 0 of
`--seed S` is a Fisher-Yates shuffle driven by std::mt19937_64(S)
(training/dataset.cc, BatchIterator::EpochOrder), re-implemented here. So the
float32 rows differ only by floating-point rounding, and the mixed rows show
what the policy costs.

    /usr/bin/python3 bench/accuracy_vs_torch.py --model cnn --seeds 0,3

Prints one line per (seed, run) and a table. Takes about 1-2 minutes per
castor run and per PyTorch run on 2 cores (mixed_float16 is slower).
"""

import argparse
import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "/usr/share/datasets/fashion-mnist"
MASK64 = (1 << 64) - 1


class MersenneTwister64:
    """std::mt19937_64."""

    def __init__(self, seed):
        self.state = [seed & MASK64]
        for i in range(1, 312):
            previous = self.state[-1]
            self.state.append((6364136223846793005 * (previous ^ (previous >> 62)) + i) & MASK64)
        self.index = 312

    def __call__(self):
        if self.index >= 312:
            for k in range(312):
                x = (self.state[k] & 0xFFFFFFFF80000000) | (self.state[(k + 1) % 312] & 0x7FFFFFFF)
                shifted = x >> 1
                if x & 1:
                    shifted ^= 0xB5026F5AA96619E9
                self.state[k] = self.state[(k + 156) % 312] ^ shifted
            self.index = 0
        y = self.state[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK64


def castor_epoch_order(size, seed, epoch=0):
    """BatchIterator::EpochOrder: unbiased Fisher-Yates from the back."""
    engine = MersenneTwister64(seed + epoch)
    order = list(range(size))
    for i in range(size, 1, -1):
        threshold = ((1 << 64) - i) % i
        while True:
            value = engine()
            if value >= threshold:
                break
        j = value % i
        order[i - 1], order[j] = order[j], order[i - 1]
    return np.array(order)


def read_idx(path):
    data = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(data[3])]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def idx_file(stem):
    for name in (stem + ".gz", stem):
        if os.path.exists(os.path.join(DATA, name)):
            return os.path.join(DATA, name)
    sys.exit(f"accuracy_vs_torch: {DATA}/{stem}[.gz] is missing (Debian's dataset-fashion-mnist)")


def torch_accuracy(model_name, seed, threads):
    spec = importlib.util.spec_from_file_location("generate", os.path.join(ROOT, "models", "generate.py"))
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    torch.set_num_threads(threads)
    images = lambda stem: torch.tensor(read_idx(idx_file(stem)), dtype=torch.float32).div(255).unsqueeze(1)
    labels = lambda stem: torch.tensor(read_idx(idx_file(stem)).astype(np.int64))
    train_x, train_y = images("train-images-idx3-ubyte"), labels("train-labels-idx1-ubyte")
    test_x, test_y = images("t10k-images-idx3-ubyte"), labels("t10k-labels-idx1-ubyte")
    model = generate.build(model_name, {"cnn": generate.CNN, "mlp": generate.MLP}[model_name])
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    order = torch.tensor(castor_epoch_order(len(train_x), seed))
    for start in range(0, len(train_x), 128):
        batch = order[start:start + 128]
        optimizer.zero_grad()
        F.cross_entropy(model(train_x[batch]), train_y[batch]).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        return (model(test_x).argmax(1) == test_y).float().mean().item()


def castor_accuracy(castor, model_name, policy, seed, threads):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        subprocess.run([castor, "train", os.path.join(ROOT, "models", f"{model_name}_opset17.onnx"),
                        "--data", "fashion-mnist", "--policy", policy, "--optimizer", "adam",
                        "--lr", "1e-3", "--batch", "128", "--epochs", "1", "--seed", str(seed),
                        "--threads", str(threads), "--metrics", metrics],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        evaluations = [json.loads(line) for line in open(metrics) if "test_accuracy" in line]
        return evaluations[-1]["test_accuracy"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    parser.add_argument("--seeds", default="0", help="comma-separated shuffle seeds")
    parser.add_argument("--policies", default="float32,mixed_bfloat16,mixed_float16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--castor", default=os.path.join(ROOT, "build", "castor"))
    parser.add_argument("--no-torch", action="store_true", help="castor runs only")
    args = parser.parse_args()
    if not os.path.exists(args.castor):
        sys.exit(f"accuracy_vs_torch: no castor binary at {args.castor} (build first or pass --castor)")
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        row = {"seed": seed}
        if not args.no_torch:
            row["torch float32"] = torch_accuracy(args.model, seed, args.threads)
            print(f"seed {seed} torch float32: {100 * row['torch float32']:.2f}%", flush=True)
        for policy in args.policies.split(","):
            row[policy] = castor_accuracy(args.castor, args.model, policy, seed, args.threads)
            print(f"seed {seed} castor {policy}: {100 * row[policy]:.2f}%", flush=True)
        rows.append(row)
    columns = [key for key in rows[0] if key != "seed"]
    print(f"\n{args.model}, 1 epoch, Adam 1e-3, batch 128, test accuracy (%)")
    print("| seed | " + " | ".join(columns) + " |")
    print("| ---: | " + " | ".join("---:" for _ in columns) + " |")
    for row in rows:
        print(f"| {row['seed']} | " + " | ".join(f"{100 * row[c]:.2f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
