"""Writes tests/data/optimizer_golden.json: weights after each of 5 steps of
torch.optim.SGD / Adam / AdamW (Debian's torch 1.13), optionally with
torch.nn.utils.clip_grad_norm_, from the same start and the same gradient
sequence, for tests/optimizer_test.cc to match.
Run: /usr/bin/python3 tests/data/generate_optimizer_golden.py
"""
import json
import math
import os

import torch

STEPS = 5
START = [[0.5, -1.25, 2.0], [0.75, -0.1, 1.5]]


def gradient(step):
    """A deterministic gradient for step k (0-based) with mixed signs and scales."""
    return [[math.sin(1.0 + step + 3 * r + c) * (1 + r) for c in range(3)] for r in range(2)]


CASES = [
    ("sgd", dict(lr=0.1), 0.0),
    ("sgd_momentum_wd", dict(lr=0.05, momentum=0.9, weight_decay=0.01), 0.0),
    ("sgd_nesterov", dict(lr=0.05, momentum=0.9, nesterov=True), 0.0),
    ("adam", dict(lr=1e-2), 0.0),
    ("adam_wd", dict(lr=1e-2, weight_decay=0.1), 0.0),
    ("adamw", dict(lr=1e-2, weight_decay=0.1), 0.0),
    ("adam_clip", dict(lr=1e-2), 0.5),
]


def run(name, kwargs, clip):
    weight = torch.nn.Parameter(torch.tensor(START, dtype=torch.float32))
    kind = name.split("_")[0]
    optimizer = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam,
                 "adamw": torch.optim.AdamW}[kind]([weight], **kwargs)
    trajectory = []
    for step in range(STEPS):
        optimizer.zero_grad()
        weight.grad = torch.tensor(gradient(step), dtype=torch.float32)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_([weight], clip)
        optimizer.step()
        trajectory.append(weight.detach().flatten().tolist())
    return {"optimizer": kind, "options": kwargs, "clip_norm": clip, "weights": trajectory}


def main():
    golden = {"start": [x for row in START for x in row],
              "gradients": [[x for row in gradient(k) for x in row] for k in range(STEPS)],
              "torch": torch.__version__,
              "cases": {name: run(name, kwargs, clip) for name, kwargs, clip in CASES}}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optimizer_golden.json")
    with open(path, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
