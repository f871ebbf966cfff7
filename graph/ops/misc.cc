// PLACEHOLDER: op family misc, being written.
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"

namespace castor {
void RegisterMiscOps(OpRegistry&) {}
}  // namespace castor
