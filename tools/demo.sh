#!/usr/bin/env bash
# README command (1): set everything up and run castor's main job on the
# sample CNN (models/cnn_opset13.onnx, the Keras mixed-precision guide's
# Fashion-MNIST model): convert it to mixed_float16, show the rewritten graph
# and why its last layer stays float32, then train it in mixed_bfloat16
# (on the GPU when one is usable, else the CPU: --backend auto) with
# checkpoints, and verify that the last checkpoint
# records the mixed_bfloat16 policy, is intact and holds float32 weights.
set -euo pipefail

cd "$(dirname "$0")/.."
bash tools/setup.sh
BUILD_DIR="${CASTOR_BUILD_DIR:-build}"
CASTOR="$BUILD_DIR/castor"
WORK="$BUILD_DIR/demo"
mkdir -p "$WORK"

echo
echo "== castor convert models/cnn_opset13.onnx -o $WORK/cnn_mixed_float16.onnx --policy mixed_float16"
"$CASTOR" convert models/cnn_opset13.onnx -o "$WORK/cnn_mixed_float16.onnx" --policy mixed_float16

echo
echo "== castor inspect $WORK/cnn_mixed_float16.onnx"
"$CASTOR" inspect "$WORK/cnn_mixed_float16.onnx"

echo
echo "== castor inspect $WORK/cnn_mixed_float16.onnx --why /fc2/Gemm"
"$CASTOR" inspect "$WORK/cnn_mixed_float16.onnx" --why /fc2/Gemm

echo
echo "== castor train: the sample CNN on Fashion-MNIST, mixed_bfloat16, one epoch (469 steps of 128)"
rm -rf "$WORK/checkpoints"
"$CASTOR" train models/cnn_opset17.onnx --data fashion-mnist --policy mixed_bfloat16 \
  --epochs 1 --metrics "$WORK/metrics.jsonl" --checkpoint-dir "$WORK/checkpoints" --save-every 150

# The newest checkpoint: the one written at the end (the glob sorts the
# zero-padded step numbers in order).
shopt -s nullglob
CHECKPOINTS=("$WORK"/checkpoints/ckpt-*.onnx)
if ((${#CHECKPOINTS[@]} == 0)); then
  echo "demo: castor train wrote no checkpoint to $WORK/checkpoints" >&2
  exit 1
fi
LAST="${CHECKPOINTS[-1]}"
echo
echo "== castor verify $LAST --policy mixed_bfloat16"
"$CASTOR" verify "$LAST" --policy mixed_bfloat16
