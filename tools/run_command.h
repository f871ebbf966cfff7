// `castor run MODEL --input NAME=FILE ...`: inference on the CPU backend.
// Loads and checks the model (as `castor inspect` does), reads each input
// from a .npy or ONNX TensorProto .pb file, runs the executor, prints one
// summary line per graph output plus the plan's memory statistics, and with
// --output-dir writes each output as DIR/<output name>.npy (atomically).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/tensor.h"

namespace castor::tools {

// "logits  float32[2,10]  min=-1.2 max=3.4 mean=0.25" (NaNs are counted and
// left out of min/max/mean).
std::string SummarizeTensor(const std::string& name, const Tensor& tensor);

// Splits "NAME=FILE" (the name may not be empty; the file may contain '=').
absl::StatusOr<std::pair<std::string, std::string>> ParseInputFlag(const std::string& flag);

// A file name for an output value: characters other than letters, digits,
// '.', '_' and '-' become '_'.
std::string OutputFileName(const std::string& value_name);

int RunRun(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace castor::tools
