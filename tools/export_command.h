// `castor export CKPT -o model.onnx [--policy P | --policy-file F | --policy
// recorded]`: the inference model of a checkpoint. Reads and checks the
// checkpoint (a corrupt one is refused with exit 2, an inconsistent one with
// exit 1), drops the training state (training_info and the
// castor.checkpoint.* record), and writes the float32 graph with the trained
// weights, or, with a policy, the model autocast converts under it (as
// `castor convert` would). The output is written atomically and runs in ONNX
// Runtime.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace castor::tools {

int RunExport(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace castor::tools
