// `castor train MODEL --data ...`: converts the model under a policy, builds
// its training graph, and trains it on the CPU backend with dynamic loss
// scaling: a live progress line (plain periodic lines when stderr is not a
// terminal), JSONL metrics per step and per evaluation, an evaluation on
// the test split per epoch, and a closing summary (policy, compute dtype,
// dtype of every weight, skipped steps, final loss scale, peak memory,
// step time, test accuracy).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace castor::tools {

int RunTrain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace castor::tools
