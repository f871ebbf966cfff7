#!/usr/bin/python3
"""Writes the control-flow test models tests/control_flow_test.cc loads.

Run with Debian's python (onnx 1.12): /usr/bin/python3 generate_subgraph_models.py
It writes, next to this script:
  if_model.onnx    x -> MatMul -> Relu (r); If(flag) whose branches read the
                   outer values r and shift: then r + shift, else r * shift;
                   -> MatMul -> Add(bias) -> y
  loop_model.onnx  x -> MatMul (h) -> Relu (r); Loop(M=3, cond=true, v=h)
                   whose body reads the outer values r and half:
                   v_next = (v + r) * half, also emitted as a scan output;
                   final v -> MatMul -> Add(bias) -> y; the scan output -> steps
Both are float32, opset 17, IR version 8, and pass
onnx.checker.check_model(full_check=True). The weights are fixed numbers
(no randomness), so the files are reproducible byte for byte.
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
HERE = os.path.dirname(os.path.abspath(__file__))


def weight(name, shape, scale):
    count = int(np.prod(shape))
    values = (np.arange(count, dtype=np.float32) - count / 2) * scale
    return numpy_helper.from_array(values.reshape(shape).astype(np.float32), name)


def float_info(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def save(graph, filename):
    model = helper.make_model(graph, producer_name="castor-tests",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    path = os.path.join(HERE, filename)
    onnx.save(model, path)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def if_model():
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["r", "shift"], ["then_out"], name="then_add")],
        "then_branch", [], [float_info("then_out", [2, 4])])
    else_branch = helper.make_graph(
        [helper.make_node("Mul", ["r", "shift"], ["else_out"], name="else_mul")],
        "else_branch", [], [float_info("else_out", [2, 4])])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="matmul_before"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("If", ["flag"], ["chosen"], name="if_node",
                         then_branch=then_branch, else_branch=else_branch),
        helper.make_node("MatMul", ["chosen", "w2"], ["z"], name="matmul_after"),
        helper.make_node("Add", ["z", "bias"], ["y"], name="add_bias"),
    ]
    graph = helper.make_graph(
        nodes, "if_model",
        [float_info("x", [2, 4]), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [float_info("y", [2, 3])],
        initializer=[weight("w1", [4, 4], 0.125), weight("shift", [4], 0.5),
                     weight("w2", [4, 3], 0.25), weight("bias", [3], 1.0)])
    save(graph, "if_model.onnx")


def loop_model():
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
            helper.make_node("Add", ["v_in", "r"], ["sum"], name="body_add"),
            helper.make_node("Mul", ["sum", "half"], ["v_out"], name="body_mul"),
            helper.make_node("Identity", ["v_out"], ["scan_out"], name="body_scan"),
        ],
        "loop_body",
        [helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         float_info("v_in", [2, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         float_info("v_out", [2, 4]), float_info("scan_out", [2, 4])])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="matmul_before"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Loop", ["trip_count", "keep_going", "h"], ["v_final", "steps"],
                         name="loop_node", body=body),
        helper.make_node("MatMul", ["v_final", "w2"], ["z"], name="matmul_after"),
        helper.make_node("Add", ["z", "bias"], ["y"], name="add_bias"),
    ]
    graph = helper.make_graph(
        nodes, "loop_model",
        [float_info("x", [2, 4])],
        [float_info("y", [2, 3]), float_info("steps", [None, 2, 4])],
        initializer=[weight("w1", [4, 4], 0.125),
                     numpy_helper.from_array(np.array(3, dtype=np.int64), "trip_count"),
                     numpy_helper.from_array(np.array(True), "keep_going"),
                     numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"),
                     weight("w2", [4, 3], 0.25), weight("bias", [3], 1.0)])
    save(graph, "loop_model.onnx")


if __name__ == "__main__":
    if_model()
    loop_model()
