// A model as plain text, one line per input, initializer, node and output,
// in graph order: what the pass manager dumps after each pass
// (pass_manager.h) and what the golden pass dumps hold
// (tests/golden/passes/). Stable across runs and machines; meant for
// reading and diffing, not for loading back (the ONNX file is that).
//
//   input  x: float32[N,784]
//   init   fc1.weight: float32[128,784]
//   node   /fc1/Gemm = Gemm(x, fc1.weight, fc1.bias) -> /fc1/Gemm_output_0: float16[N,128]
//            transB=1  [float16]
//   output logits: float32[N,10]
#pragma once

#include <string>

#include "graph/graph.h"

namespace castor {

std::string GraphToText(const Model& model);

}  // namespace castor
