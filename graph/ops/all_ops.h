// The list of op families: each graph/ops/<family>.cc defines one
// Register<Family>Ops function; RegisterAllOps calls them all.
#pragma once

namespace castor {

class OpRegistry;

void RegisterElementwiseOps(OpRegistry& registry);   // elementwise.cc
void RegisterMatMulOps(OpRegistry& registry);        // matmul.cc
void RegisterEinsumOps(OpRegistry& registry);        // einsum.cc
void RegisterConvOps(OpRegistry& registry);          // conv.cc
void RegisterPoolOps(OpRegistry& registry);          // pool.cc
void RegisterNormalizationOps(OpRegistry& registry); // normalization.cc
void RegisterSoftmaxOps(OpRegistry& registry);       // softmax.cc
void RegisterLossOps(OpRegistry& registry);          // losses.cc
void RegisterTrainingOps(OpRegistry& registry);      // training.cc (ai.onnx.preview.training)
void RegisterReduceOps(OpRegistry& registry);        // reduce.cc
void RegisterShapeOps(OpRegistry& registry);         // shape_ops.cc
void RegisterDataMovementOps(OpRegistry& registry);  // data_movement.cc
void RegisterResizeOps(OpRegistry& registry);        // resize.cc
void RegisterMiscOps(OpRegistry& registry);          // misc.cc (Cast, Constant, Identity, Dropout)
void RegisterControlFlowOps(OpRegistry& registry);   // control_flow.cc (If, Loop)
void RegisterRecurrentOps(OpRegistry& registry);     // recurrent.cc (LSTM, GRU, RNN)
void RegisterGradientOps(OpRegistry& registry);     // gradient_ops.cc (com.castor)

// The default autocast category of every op (autocast_table.cc), applied
// after all families are registered.
void AssignAutocastCategories(OpRegistry& registry);
// The gradient rules and no-gradient reasons (gradient_rules.cc).
void AssignGradientRules(OpRegistry& registry);

void RegisterAllOps(OpRegistry& registry);

}  // namespace castor
