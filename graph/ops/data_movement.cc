// PLACEHOLDER: op family data_movement, being written.
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"

namespace castor {
void RegisterDataMovementOps(OpRegistry&) {}
}  // namespace castor
