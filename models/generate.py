#!/usr/bin/python3
"""Generate castor's sample ONNX models (models/<name>_opset<13|17>.onnx).

These small, deterministic models are the fixtures that castor's importer,
op registry, autocast pass, training passes, backends and tests run on:

  cnn          the Keras mixed-precision guide's Fashion-MNIST CNN
  mlp          a 784-512-512-10 multilayer perceptron
  resnet       a small ResNet with (inference-mode) BatchNormalization
  transformer  a 2-layer pre-LayerNorm transformer encoder classifier,
               attention written by hand with MatMul/Transpose/Reshape/Softmax

Every model takes `input` [N,1,28,28] float32 and returns `logits` [N,10]
float32, with a dynamic batch dimension named `N`. Each is exported at opset 13
and at opset 17 (at 17, torch 1.13 emits LayerNormalization as one node).

Run with Debian's interpreter, which has torch 1.13 and onnx 1.12:

    /usr/bin/python3 models/generate.py

It writes into the folder this script lives in. Weights come from
torch.manual_seed, so running it twice yields byte-identical files. After
export it checks each model with onnx.checker, runs it with a small reference
interpreter (torch ops, one per ONNX node) at batch 1 and 5 against the
PyTorch module, and prints node counts, op histograms and parameter counts.
"""

import collections
import io
import math
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
import torch
import torch.nn as nn
import torch.nn.functional as F

OUT_DIR = os.path.dirname(os.path.abspath(__file__))
OPSETS = (13, 17)
SEED = 20240601


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------

class CNN(nn.Module):
    """Keras mixed-precision guide CNN: Conv(32,3x3) ReLU MaxPool Flatten
    Dense(128) ReLU Dense(10)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 32, 3)
        self.pool = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(32 * 13 * 13, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv(x)))
        x = self.flatten(x)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 10)

    def forward(self, x):
        x = self.flatten(x)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        skip = x if self.proj is None else self.proj(x)
        return F.relu(y + skip)


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem_conv = nn.Conv2d(1, 16, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(16)
        self.block1 = BasicBlock(16, 16, 1)
        self.block2 = BasicBlock(16, 32, 2)   # 28x28 -> 14x14, 1x1 projection
        self.block3 = BasicBlock(32, 32, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.stem_bn(self.stem_conv(x)))
        x = self.block3(self.block2(self.block1(x)))
        return self.fc(self.flatten(self.pool(x)))


class SelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def split(self, t):
        # [N,T,D] -> [N,H,T,Dh]; -1 keeps the batch dimension dynamic.
        t = t.reshape(-1, TOKENS, self.heads, self.head_dim)
        return t.transpose(1, 2)

    def forward(self, x):
        q = self.split(self.q(x))
        k = self.split(self.k(x))
        v = self.split(self.v(x))
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scale
        attn = torch.softmax(scores, dim=-1)
        y = torch.matmul(attn, v)                       # [N,H,T,Dh]
        y = y.transpose(1, 2).reshape(-1, TOKENS, self.heads * self.head_dim)
        return self.out(y)


class EncoderLayer(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.gelu = nn.GELU()            # exact GELU: exports via Erf
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.fc2(self.gelu(self.fc1(self.ln2(x))))
        return x


TOKENS = 28
FEATURES = 28


class Transformer(nn.Module):
    def __init__(self, dim=64, heads=4, hidden=128, layers=2):
        super().__init__()
        self.embed = nn.Linear(FEATURES, dim)
        self.pos = nn.Parameter(torch.randn(1, TOKENS, dim) * 0.02)
        self.layers = nn.ModuleList(
            [EncoderLayer(dim, heads, hidden) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = x.reshape(-1, TOKENS, FEATURES)   # 28 rows as 28 tokens
        x = self.embed(x) + self.pos
        for layer in self.layers:
            x = layer(x)
        x = self.ln(x).mean(dim=1)
        return self.head(x)


MODELS = [
    ("cnn", CNN,
     "Keras mixed-precision guide CNN for Fashion-MNIST: Conv2d(1->32, 3x3, "
     "no padding) -> ReLU -> MaxPool 2x2 -> Flatten -> Linear(5408->128) -> "
     "ReLU -> Linear(128->10). Input [N,1,28,28] float32, output logits [N,10]."),
    ("mlp", MLP,
     "MLP: Flatten -> Linear(784->512) -> ReLU -> Linear(512->512) -> ReLU -> "
     "Linear(512->10). Input [N,1,28,28] float32, output logits [N,10]."),
    ("resnet", ResNet,
     "Small ResNet: Conv3x3(16) + BN + ReLU stem, 3 basic residual blocks "
     "(16, 16->32 stride 2 with 1x1 conv+BN projection, 32), GlobalAveragePool, "
     "Flatten, Linear(32->10). BatchNormalization in inference mode (running "
     "stats are initializers). Input [N,1,28,28] float32, output logits [N,10]."),
    ("transformer", Transformer,
     "Tiny transformer encoder classifier: the 28x28 image as 28 tokens of 28 "
     "features -> Linear(28->64) + learned positional embedding -> 2 x "
     "(pre-LayerNorm 4-head self-attention from MatMul/Transpose/Reshape/"
     "Softmax with scale multiply, residual; LayerNorm, MLP 64->128 GELU(erf) "
     "->64, residual) -> LayerNorm -> mean over tokens -> Linear(64->10). "
     "Input [N,1,28,28] float32, output logits [N,10]."),
]


def build(name, cls):
    # Seed per model so each model's weights do not depend on the others.
    torch.manual_seed(SEED + sum(map(ord, name)))
    model = cls()
    # Give BatchNorm and LayerNorm non-trivial, distinct affine parameters
    # and running statistics (deterministic, from the seeded generator):
    # inference BN is then not an identity, and no two initializers are
    # equal -- the exporter merges equal initializers (e.g. every LayerNorm
    # weight of ones) into one tensor read through Identity nodes, which
    # would tie parameters that train separately.
    for m in model.modules():
        with torch.no_grad():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features) * 0.5 + 0.75)
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                m.weight.copy_(1.0 + torch.randn(m.weight.shape) * 0.05)
                m.bias.copy_(torch.randn(m.bias.shape) * 0.02)
    model.eval()
    return model


def export(model, name, opset, doc):
    # Inference-mode export. TrainingMode.EVAL would also run torch's eval
    # peephole pass, which folds every BatchNormalization into the Conv before
    # it, so the ResNet would carry no BatchNormalization node. PRESERVE with
    # the module already in eval() mode exports the same inference graph
    # (BatchNormalization with training_mode=0, running stats as
    # initializers) without that fusion. For the models without BatchNorm
    # the two modes give the same graph.
    assert not model.training
    dummy = torch.zeros(2, 1, 28, 28)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # The constant-folding advice warning is for models in training mode.
        warnings.filterwarnings("ignore", message=".*constant folding.*")
        torch.onnx.export(
            model, dummy, buf,
            export_params=True,
            opset_version=opset,
            do_constant_folding=True,
            training=torch.onnx.TrainingMode.PRESERVE,
            keep_initializers_as_inputs=False,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
        )
    proto = onnx.load_from_string(buf.getvalue())
    proto.doc_string = doc
    del proto.metadata_props[:]
    entry = proto.metadata_props.add()
    entry.key = "castor.sample"
    entry.value = name
    return proto


# --------------------------------------------------------------------------
# Reference interpreter: one torch op per ONNX node, for the op set these
# models use. Used only to check the exported graphs compute what the
# PyTorch modules compute, at more than one batch size.
# --------------------------------------------------------------------------

def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def run_onnx(proto, x):
    env = {}
    for init in proto.graph.initializer:
        env[init.name] = torch.from_numpy(numpy_helper.to_array(init).copy())
    env[proto.graph.input[0].name] = x
    for node in proto.graph.node:
        a = _attrs(node)
        ins = [env[i] if i else None for i in node.input]
        op = node.op_type
        if op == "Constant":
            out = torch.from_numpy(numpy_helper.to_array(a["value"]).copy())
        elif op == "Conv":
            pads = a.get("pads", [0, 0, 0, 0])
            assert pads[0] == pads[2] and pads[1] == pads[3]
            out = F.conv2d(ins[0], ins[1], ins[2] if len(ins) > 2 else None,
                           stride=a.get("strides", [1, 1]),
                           padding=pads[:2], dilation=a.get("dilations", [1, 1]),
                           groups=a.get("group", 1))
        elif op == "BatchNormalization":
            out = F.batch_norm(ins[0], ins[3], ins[4], ins[1], ins[2],
                               training=False, eps=a.get("epsilon", 1e-5))
        elif op == "Identity":
            out = ins[0]
        elif op == "Relu":
            out = torch.relu(ins[0])
        elif op == "MaxPool":
            pads = a.get("pads", [0, 0, 0, 0])
            out = F.max_pool2d(ins[0], a["kernel_shape"],
                               stride=a.get("strides", [1, 1]), padding=pads[:2],
                               ceil_mode=bool(a.get("ceil_mode", 0)))
        elif op == "GlobalAveragePool":
            out = ins[0].mean(dim=(2, 3), keepdim=True)
        elif op == "Flatten":
            axis = a.get("axis", 1)
            out = ins[0].reshape(int(np.prod(ins[0].shape[:axis])), -1)
        elif op == "Gemm":
            A, B = ins[0], ins[1]
            if a.get("transA", 0):
                A = A.t()
            if a.get("transB", 0):
                B = B.t()
            out = a.get("alpha", 1.0) * (A @ B)
            if len(ins) > 2 and ins[2] is not None:
                out = out + a.get("beta", 1.0) * ins[2]
        elif op == "MatMul":
            out = torch.matmul(ins[0], ins[1])
        elif op == "Add":
            out = ins[0] + ins[1]
        elif op == "Sub":
            out = ins[0] - ins[1]
        elif op == "Mul":
            out = ins[0] * ins[1]
        elif op == "Div":
            out = ins[0] / ins[1]
        elif op == "Pow":
            out = torch.pow(ins[0], ins[1])
        elif op == "Sqrt":
            out = torch.sqrt(ins[0])
        elif op == "Erf":
            out = torch.erf(ins[0])
        elif op == "Tanh":
            out = torch.tanh(ins[0])
        elif op == "Softmax":
            out = torch.softmax(ins[0], dim=a.get("axis", -1))
        elif op == "Transpose":
            out = ins[0].permute(*a["perm"])
        elif op == "Reshape":
            shape = [int(s) for s in ins[1].tolist()]
            if not a.get("allowzero", 0):
                shape = [ins[0].shape[i] if s == 0 else s
                         for i, s in enumerate(shape)]
            out = ins[0].reshape(shape)
        elif op == "ReduceMean":
            axes = a.get("axes")
            if axes is None and len(ins) > 1:
                axes = ins[1].tolist()
            out = ins[0].mean(dim=tuple(axes), keepdim=bool(a.get("keepdims", 1)))
        elif op == "LayerNormalization":
            axis = a.get("axis", -1)
            axis = axis if axis >= 0 else ins[0].dim() + axis
            out = F.layer_norm(ins[0], ins[0].shape[axis:], ins[1],
                               ins[2] if len(ins) > 2 else None,
                               eps=a.get("epsilon", 1e-5))
        elif op == "Shape":
            out = torch.tensor(ins[0].shape, dtype=torch.int64)
        elif op == "Gather":
            out = torch.index_select(ins[0], a.get("axis", 0),
                                     ins[1].reshape(-1)).reshape(
                                         ins[1].shape + ins[0].shape[1:])
        elif op == "Unsqueeze":
            out = ins[0]
            for ax in sorted(ins[1].tolist()):
                out = out.unsqueeze(ax)
        elif op == "Concat":
            out = torch.cat(ins, dim=a["axis"])
        elif op == "Cast":
            raise NotImplementedError("Cast")
        else:
            raise NotImplementedError(op)
        if len(node.output) > 1:
            # Only the first output of multi-output ops (e.g. the optional
            # mean/inv_std of LayerNormalization) is supported.
            assert all(not o for o in node.output[1:]) or op == "LayerNormalization"
        env[node.output[0]] = out
    return env[proto.graph.output[0].name]


# --------------------------------------------------------------------------
# Checks and report
# --------------------------------------------------------------------------

def check(proto, path, opset):
    try:
        onnx.checker.check_model(proto, full_check=True)
        return "full_check ok"
    except Exception as e:  # onnx 1.12 limitations: fall back, say why
        msg = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        onnx.checker.check_model(proto)
        return "full_check failed (%s); plain check ok" % msg


def dynamic_batch_ok(proto):
    for vi in list(proto.graph.input) + list(proto.graph.output):
        dim0 = vi.type.tensor_type.shape.dim[0]
        if dim0.dim_param != "N":
            return False
    return True


def initializer_elements(proto):
    return sum(int(np.prod(i.dims)) for i in proto.graph.initializer)


def main():
    torch.set_num_threads(1)
    os.makedirs(OUT_DIR, exist_ok=True)
    all_ops = collections.Counter()
    failures = []
    for name, cls, doc in MODELS:
        model = build(name, cls)
        n_params = sum(p.numel() for p in model.parameters())
        n_buffers = sum(b.numel() for n, b in model.named_buffers()
                        if not n.endswith("num_batches_tracked"))
        for opset in OPSETS:
            proto = export(model, name, opset, doc)
            path = os.path.join(OUT_DIR, "%s_opset%d.onnx" % (name, opset))
            with open(path, "wb") as f:
                f.write(proto.SerializeToString())
            reloaded = onnx.load(path)
            status = check(reloaded, path, opset)
            hist = collections.Counter(n.op_type for n in reloaded.graph.node)
            all_ops.update(hist)
            # Numeric check vs PyTorch at batch 1 and 5.
            errs = []
            gen = torch.Generator().manual_seed(7)
            for batch in (1, 5):
                x = torch.randn(batch, 1, 28, 28, generator=gen)
                with torch.no_grad():
                    ref = model(x)
                    got = run_onnx(reloaded, x)
                if tuple(got.shape) != (batch, 10):
                    failures.append("%s: batch %d gave shape %s"
                                    % (path, batch, tuple(got.shape)))
                errs.append(float((got - ref).abs().max()))
            if max(errs) > 1e-4:
                failures.append("%s: max abs diff %g vs torch" % (path, max(errs)))
            if hist.get("Identity"):
                failures.append("%s: Identity nodes (merged initializers tie "
                                "parameters)" % path)
            if not dynamic_batch_ok(reloaded):
                failures.append("%s: batch dim of input/output is not 'N'" % path)
            imports = ",".join("%s:%d" % (o.domain or "ai.onnx", o.version)
                               for o in reloaded.opset_import)
            print("%s" % os.path.relpath(path, os.getcwd()))
            print("  opset_import %s  ir_version %d  producer %s %s"
                  % (imports, reloaded.ir_version, reloaded.producer_name,
                     reloaded.producer_version))
            print("  size %d bytes  nodes %d  params %d (+%d BN running stats)"
                  "  initializer elements %d"
                  % (os.path.getsize(path), len(reloaded.graph.node), n_params,
                     n_buffers, initializer_elements(reloaded)))
            print("  check: %s" % status)
            print("  max |onnx - torch| at batch 1, 5: %.3g, %.3g" % tuple(errs))
            print("  ops: " + ", ".join("%s x%d" % (k, v)
                                        for k, v in sorted(hist.items())))
    print()
    print("union of op types (%d): %s" % (len(all_ops), ", ".join(sorted(all_ops))))
    if failures:
        print()
        for f in failures:
            print("FAIL: " + f)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
