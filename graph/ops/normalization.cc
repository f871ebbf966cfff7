// PLACEHOLDER: op family normalization, being written.
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"

namespace castor {
void RegisterNormalizationOps(OpRegistry&) {}
}  // namespace castor
