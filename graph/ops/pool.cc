// PLACEHOLDER: op family pool, being written.
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"

namespace castor {
void RegisterPoolOps(OpRegistry&) {}
}  // namespace castor
