#!/usr/bin/env bash
# README command (1): set everything up and run castor's main job on the
# sample CNN (models/cnn_opset13.onnx, the Keras mixed-precision guide's
# Fashion-MNIST model). Today the main job is `castor inspect`; it grows into
# train -> save checkpoint -> verify as those subcommands land.
set -euo pipefail

cd "$(dirname "$0")/.."
bash tools/setup.sh
BUILD_DIR="${CASTOR_BUILD_DIR:-build}"

echo
echo "== castor inspect models/cnn_opset13.onnx"
"$BUILD_DIR/castor" inspect models/cnn_opset13.onnx
