// `castor train --profile`: where a training step's time goes, from the
// executor's per-node kernel times (ExecutorOptions::time_kernels). Two
// tables: by op (op type, its domain when not ONNX's, and the dtype of the
// node's first output, so a bfloat16 MatMul and a float32 one are separate
// rows), and the slowest nodes; each with milliseconds per step and its
// share of the kernels' time, which the heading compares with the mean
// step's wall time (the rest is the optimizer, loss scaling, feeding the
// batch and waits).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/executor.h"

namespace castor {

// The tables for `times` (the training graph's nodes, in run order) of a
// run whose steps took `mean_step_ms` each on average; `top_nodes` rows of
// slowest nodes. Nodes that never ran are left out; "" when none ran.
std::string RenderKernelProfile(const std::vector<KernelTime>& times, double mean_step_ms,
                                int top_nodes = 15);

}  // namespace castor
