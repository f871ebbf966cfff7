// PLACEHOLDER: op family training, being written.
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"

namespace castor {
void RegisterTrainingOps(OpRegistry&) {}
}  // namespace castor
