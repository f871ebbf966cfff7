// Registers every op family with the registry (see all_ops.h).
#include "graph/ops/all_ops.h"

#include "graph/op_registry.h"

namespace castor {

void RegisterAllOps(OpRegistry& registry) {
  RegisterElementwiseOps(registry);
  RegisterMatMulOps(registry);
  RegisterEinsumOps(registry);
  RegisterConvOps(registry);
  RegisterPoolOps(registry);
  RegisterNormalizationOps(registry);
  RegisterSoftmaxOps(registry);
  RegisterLossOps(registry);
  RegisterTrainingOps(registry);
  RegisterReduceOps(registry);
  RegisterShapeOps(registry);
  RegisterDataMovementOps(registry);
  RegisterResizeOps(registry);
  RegisterMiscOps(registry);
  RegisterControlFlowOps(registry);
  RegisterRecurrentOps(registry);
  RegisterGradientOps(registry);
  AssignAutocastCategories(registry);
  AssignGradientRules(registry);
}

}  // namespace castor
