// PLACEHOLDER: op family elementwise, being written.
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"

namespace castor {
void RegisterElementwiseOps(OpRegistry&) {}
}  // namespace castor
