#!/usr/bin/env bash
# README command (1): set everything up and run castor's main job on the
# sample CNN (models/cnn_opset13.onnx, the Keras mixed-precision guide's
# Fashion-MNIST model): convert it to mixed_float16, show the rewritten graph
# and why its last layer stays float32, and run it on the CPU backend. It
# grows into train -> save checkpoint -> verify as those subcommands land.
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
echo "== castor run on 8 Fashion-MNIST test images"
/usr/bin/python3 - "$WORK/images.npy" <<'PY'
import gzip, os, sys
import numpy as np
root = "/usr/share/datasets/fashion-mnist"
name = next(n for n in ("t10k-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte")
            if os.path.exists(os.path.join(root, n)))
opener = gzip.open if name.endswith(".gz") else open
with opener(os.path.join(root, name), "rb") as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
np.save(sys.argv[1], images[:8].astype(np.float32) / 255.0)
PY
"$CASTOR" run "$WORK/cnn_mixed_float16.onnx" --input "input=$WORK/images.npy" --output-dir "$WORK/out"
