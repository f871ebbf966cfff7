#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/README.md).

    /usr/bin/python3 tests/fuzz/make_corpus.py CASTOR_BINARY [SHARED_DIR]

Deterministic (fixed seeds); replaces tests/fuzz/corpus/<target>/seed-*
and leaves other files (findings: crash-*, regression-*) alone. Models come
from models/, tests/data/ and the ONNX conformance cases in SHARED_DIR
(../shared by default); checkpoints from a short `castor train` of a tiny
model; policies from `castor convert --save-policy`. Keep the corpus under
2 MB in all.
"""
import gzip
import io
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "corpus"

# One or two conformance cases per op family (small files, broad spread).
CONFORMANCE = """abs adam add averagepool_2d_pads basic_conv_with_padding batchnorm_example
cast_FLOAT_to_BFLOAT16 cast_FLOAT_to_FLOAT16 clip concat_2d_axis_1 constant
conv_with_strides_padding convtranspose_group_2 div_bcast dropout_default_mask equal_bcast erf
exp expand_dim_changed flatten_negative_axis1 gather_negative_indices gelu_default_2
gemm_all_attributes globalaveragepool identity layer_normalization_4d_axis1 leakyrelu
log_example logsoftmax_axis_1 matmul_4d_1d max_int64 maxpool_2d_ceil
maxpool_with_argmax_2d_precomputed_strides min_two_inputs momentum mul_bcast neg
nesterov_momentum nllloss_NCd1d2_with_weight_reduction_sum pow_types_float32_int32
reciprocal reduce_max_empty_set reduce_mean_keepdims_example reduce_sum_empty_axes_input_noop_example
relu reshape_allowzero_reordered reshape_negative_dim sce_mean slice softmax_axis_1 batchnorm_epsilon_training_mode
convtranspose_output_shape sqrt squeeze sub sum_example tanh training_dropout transpose_default
unsqueeze_axis_0 where_example""".split()


def clean(target):
    directory = CORPUS / target
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("seed-*"):
        old.unlink()
    return directory


def write(directory, name, data):
    (directory / ("seed-" + name)).write_bytes(data)


def tiny_models():
    """Small hand-made models: a Gemm classifier (the checkpoint's), a Conv net."""
    rng = np.random.default_rng(0)
    gemm = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc", transB=1),
         helper.make_node("Relu", ["h"], ["logits"], name="relu")],
        "tiny_gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(rng.standard_normal((3, 16)).astype(np.float32), "w"),
         numpy_helper.from_array(np.zeros(3, np.float32), "b")])
    conv = helper.make_graph(
        [helper.make_node("Conv", ["x", "k"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"], name="bn"),
         helper.make_node("MaxPool", ["n"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
         helper.make_node("MatMul", ["f", "w"], ["m"], name="fc"),
         helper.make_node("Softmax", ["m"], ["logits"], name="softmax", axis=-1)],
        "tiny_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 4, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(rng.standard_normal((2, 1, 3, 3)).astype(np.float32), "k"),
         numpy_helper.from_array(np.ones(2, np.float32), "g"),
         numpy_helper.from_array(np.zeros(2, np.float32), "beta"),
         numpy_helper.from_array(np.zeros(2, np.float32), "mean"),
         numpy_helper.from_array(np.ones(2, np.float32), "var"),
         numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w")])
    return {name: helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                    ir_version=8)
            for name, graph in (("tiny_gemm", gemm), ("tiny_conv", conv))}


def hostile_models():
    """Models the reader must refuse (issue #30): sizes, paths, versions."""
    def model_with(initializer, ir_version=8, dims_input=("N", 16)):
        graph = helper.make_graph(
            [helper.make_node("Add", ["x", "w"], ["y"], name="add")], "hostile",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims_input))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [initializer])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                 ir_version=ir_version)

    def external(location, offset=0, length=64, dims=(16,)):
        tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(dims))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        return tensor

    out = {}
    out["external_ok"] = model_with(external("weights.bin", 64, 64))
    out["external_symlink_escape"] = model_with(external("up/secret.bin"))
    out["external_dotdot"] = model_with(external("../secret.bin"))
    out["external_absolute"] = model_with(external("/etc/hostname", 0, 4, (1,)))
    out["external_huge_length"] = model_with(external("weights.bin", 0, 1 << 62, (1 << 60,)))
    big = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 40], raw_data=b"\0" * 40)
    out["raw_dims_2p40"] = model_with(big)
    strings = TensorProto(name="w", data_type=TensorProto.STRING, dims=[1 << 40],
                          string_data=[b"a", b"b"])
    out["string_dims_2p40"] = model_with(strings)
    overflow = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 62, 8],
                           float_data=[0.0] * 4)
    out["dims_overflow"] = model_with(overflow)
    ok = numpy_helper.from_array(np.ones(16, np.float32), "w")
    out["ir_version_99"] = model_with(ok, ir_version=99)
    out["negative_dim"] = model_with(ok, dims_input=(-3, 16))
    return out


def models(shared):
    onnx_dir = clean("onnx_model")
    pipeline_dir = clean("model_pipeline")
    sources = {}
    for name in CONFORMANCE:
        path = shared / "conformance" / "onnx-node" / ("test_" + name) / "model.onnx"
        if path.exists():
            sources["conformance_" + name] = path.read_bytes()
        else:
            print("make_corpus: no conformance case", name, file=sys.stderr)
    for path in sorted((ROOT / "tests" / "data").glob("*.onnx")):
        sources["data_" + path.stem] = path.read_bytes()
    for name, model in tiny_models().items():
        sources[name] = model.SerializeToString()
    for name, data in sources.items():
        write(onnx_dir, name + ".onnx", data)
        write(pipeline_dir, name + ".onnx", data)
    for name, model in hostile_models().items():
        write(onnx_dir, name + ".onnx", model.SerializeToString())
    # One real exported network each (the smallest sample models).
    write(pipeline_dir, "resnet_opset17.onnx", (ROOT / "models" / "resnet_opset17.onnx").read_bytes())
    write(onnx_dir, "resnet_opset13.onnx", (ROOT / "models" / "resnet_opset13.onnx").read_bytes())


def npy_bytes(array, version=None):
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array)
    else:
        np.lib.format.write_array(buffer, array, version=version)
    return buffer.getvalue()


def npy_header(header, version=(1, 0)):
    text = header.encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY" + bytes(version) + struct.pack("<H", len(text)) + text


def npy():
    directory = clean("npy")
    rng = np.random.default_rng(1)
    for dtype in ("<f4", "<f8", "<f2", "<i8", "<i4", "<i2", "|i1", "<u8", "<u4", "<u2", "|u1", "|b1"):
        array = (rng.standard_normal((2, 3)) * 10).astype(dtype)
        write(directory, "dtype_" + dtype.strip("<|") + ".npy", npy_bytes(array))
    write(directory, "images_u8_rank3.npy", npy_bytes(rng.integers(0, 255, (3, 4, 4), np.uint8)))
    write(directory, "scalar.npy", npy_bytes(np.float32(2.5)))
    write(directory, "empty.npy", npy_bytes(np.zeros((0, 5), np.float32)))
    write(directory, "version2.npy", npy_bytes(np.arange(6, dtype=np.int64), (2, 0)))
    write(directory, "version3.npy", npy_bytes(np.arange(6, dtype=np.float32), (3, 0)))
    write(directory, "fortran.npy", npy_bytes(np.asfortranarray(np.ones((2, 3), np.float32))))
    write(directory, "bigendian.npy", npy_bytes(np.ones(4, ">f4")))
    # Issue #30: a header-only file whose shape overflows to 0 bytes, and a
    # 20-digit dimension.
    write(directory, "shape_overflow.npy",
          npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 1, 28, 28), }"))
    write(directory, "dim_20_digits.npy",
          npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (12345678901234567890,), }"))


def npz_bytes(arrays, compressed, zip64=False):
    buffer = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, array in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=zip64) as member:
                member.write(npy_bytes(array))
    return buffer.getvalue()


def npz():
    directory = clean("npz")
    rng = np.random.default_rng(2)
    keras = {"x_train": rng.integers(0, 255, (4, 4, 4), np.uint8),
             "y_train": rng.integers(0, 3, 4, np.uint8),
             "x_test": rng.integers(0, 255, (2, 4, 4), np.uint8),
             "y_test": rng.integers(0, 3, 2, np.uint8)}
    write(directory, "keras_stored.npz", npz_bytes(keras, False))
    write(directory, "keras_deflated.npz", npz_bytes(keras, True))
    write(directory, "keras_zip64.npz", npz_bytes(keras, False, zip64=True))
    xy = {"x": rng.standard_normal((3, 16)).astype(np.float32), "y": np.arange(3, dtype=np.int64)}
    write(directory, "x_y_deflated.npz", npz_bytes(xy, True))
    named = {"images": rng.standard_normal((2, 1, 4, 4)).astype(np.float16),
             "labels": np.array([[0, 1], [1, 0]], np.int32)}
    write(directory, "images_labels.npz", npz_bytes(named, False))


def idx_bytes(magic, dims, payload):
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload


def idx():
    directory = clean("idx")
    rng = np.random.default_rng(3)
    images = idx_bytes(0x803, (3, 4, 4), rng.integers(0, 255, 48, np.uint8).tobytes())
    labels = idx_bytes(0x801, (3,), bytes([0, 7, 9]))
    write(directory, "images.idx", images)
    write(directory, "labels.idx", labels)
    write(directory, "images.idx.gz", gzip.compress(images, mtime=0))
    write(directory, "labels.idx.gz", gzip.compress(labels, mtime=0))
    # Issue #30: a gzip label file claiming 2^32-1 labels.
    write(directory, "labels_claim_2p32.idx.gz",
          gzip.compress(idx_bytes(0x801, (0xFFFFFFFF,), bytes(16)), mtime=0))
    write(directory, "images_dims_overflow.idx", idx_bytes(0x803, (0xFFFFFFFF, 0xFFFF, 0xFFFF), bytes(8)))


def run(castor, *args):
    result = subprocess.run([castor, *args], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("make_corpus: castor %s failed (%d): %s" % (" ".join(args), result.returncode,
                                                             result.stderr))


def checkpoints_and_policies(castor):
    checkpoint_dir = clean("checkpoint")
    policy_dir = clean("policy_json")
    rng = np.random.default_rng(4)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        model = tmp / "tiny_gemm.onnx"
        model.write_bytes(tiny_models()["tiny_gemm"].SerializeToString())
        np.save(tmp / "x.npy", rng.standard_normal((8, 16)).astype(np.float32))
        np.save(tmp / "y.npy", rng.integers(0, 3, 8).astype(np.int64))
        data = "%s,%s" % (tmp / "x.npy", tmp / "y.npy")
        for policy, optimizer in (("mixed_float16", "adam"), ("mixed_bfloat16", "sgd"),
                                  ("float32", "adamw")):
            out = tmp / ("ckpt-" + policy)
            extra = ["--momentum", "0.9"] if optimizer == "sgd" else []
            run(castor, "train", str(model), "--data", data, "--policy", policy, "--batch", "4",
                "--epochs", "1", "--optimizer", optimizer, "--checkpoint-dir", str(out),
                "--threads", "1", *extra)
            newest = sorted(out.glob("ckpt-*.onnx"))[-1]
            write(checkpoint_dir, "%s_%s.onnx" % (policy, optimizer), newest.read_bytes())
        for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
            saved = tmp / (policy + ".json")
            run(castor, "convert", str(model), "-o", str(tmp / "converted.onnx"), "--policy", policy,
                "--save-policy", str(saved))
            write(policy_dir, policy + ".json", saved.read_bytes())
    write(policy_dir, "custom.json", b"""{
  "format": "castor.policy/1",
  "name": "custom",
  "compute_dtype": "bfloat16",
  "keep_io_types": false,
  "op_overrides": {"Softmax": "allow", "com.castor:DropoutTraining": "deny"},
  "node_overrides": [{"name": "fc2", "category": "deny"},
                     {"regex": "encoder/.*/attn.*", "category": "fp32"}],
  "pins": [{"op": "Resize", "input": 2}]
}
""")
    write(policy_dir, "name_only.json", b'{"name": "mixed_float16"}')
    write(policy_dir, "json_edge_cases.json",
          b'{"name": "x\\u00e9\\ud83d\\ude00", "compute_dtype": "float16", '
          b'"pins": [{"op": "Conv", "input": 1e300}], "n": [-0, 1.5e-308, 123456789012345678901234]}')


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    castor = sys.argv[1]
    shared = pathlib.Path(sys.argv[2]) if len(sys.argv) == 3 else ROOT.parent / "shared"
    models(shared)
    npy()
    npz()
    idx()
    checkpoints_and_policies(castor)
    total = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    print("make_corpus: %d files, %d bytes" % (sum(1 for p in CORPUS.rglob("*") if p.is_file()), total))


if __name__ == "__main__":
    main()
