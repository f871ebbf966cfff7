// The autocast op lists: the default category of every registered op, in
// one table (DESIGN.md "The autocast pass"). A Policy starts from these and
// may override them per op or per node.
//
// Mapping from the lists people know:
//   PyTorch autocast (torch/csrc/autocast_mode.cpp): `lower_precision_fp`
//     ops -> allow; `fp32` ops -> deny; `promote` ops and everything not
//     listed (runs in its inputs' type) -> follow.
//   TensorFlow grappler (auto_mixed_precision_lists.h): AllowList -> allow;
//     DenyList -> deny; InferList and ClearList -> follow.
// Where the two disagree we take the safer (float32) side for ops that sum
// many terms, and follow for ops that are exact or elementwise.
#include <string>

#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"

namespace castor {
namespace {

struct Entry {
  const char* domain;
  const char* op_type;
  AutocastCategory category;
  const char* source;
  unsigned traits = 0;  // kExact | kOutputInInputDType
};

constexpr AutocastCategory kAllow = AutocastCategory::kAllow;
constexpr AutocastCategory kDeny = AutocastCategory::kDeny;
constexpr AutocastCategory kFollow = AutocastCategory::kFollow;
constexpr AutocastCategory kNone = AutocastCategory::kNone;
// Follow ops that commute with rounding to 16 bits (OpDef::autocast_exact):
// sign, clamping and data movement that keeps or grows the data, and
// MaxPool, whose gradient reads X anyway (a 16-bit X halves what a step
// keeps). Selections that shrink their input (Slice, Gather, ReduceMax/Min,
// GlobalMaxPool) are not marked: rule 3b would cast their whole input, and
// their gradients would keep that 16-bit copy alive.
constexpr unsigned kExact = 1;
// Deny ops that compute in float32 and hand their output on in the dtype
// their input arrived in (OpDef::autocast_output_in_input_dtype).
constexpr unsigned kOutputInInputDType = 2;

constexpr Entry kTable[] = {
    // --- allow: tensor-core work -------------------------------------------
    {"", "MatMul", kAllow, "PyTorch matmul/bmm: lower_precision_fp; TF MatMul/BatchMatMul: allow"},
    {"", "Gemm", kAllow, "PyTorch linear/addmm: lower_precision_fp; TF MatMul: allow"},
    {"", "Einsum", kAllow,
     "PyTorch einsum: lower_precision_fp (CUDA autocast; runs as bmm); TF Einsum: allow"},
    {"", "Conv", kAllow, "PyTorch conv1d/2d/3d: lower_precision_fp; TF Conv2D/Conv3D: allow"},
    {"", "ConvTranspose", kAllow,
     "PyTorch conv_transpose*: lower_precision_fp; TF Conv2DBackpropInput: allow"},
    {"com.castor", "Conv", kAllow,
     "castor's training form of Conv at any opset (allow like it; PyTorch conv*: "
     "lower_precision_fp)"},
    {"com.castor", "ConvTranspose", kAllow,
     "castor's training form of ConvTranspose at any opset (allow like it; PyTorch "
     "conv_transpose*: lower_precision_fp)"},
    // The recurrent layers never reach autocast: the unroll-recurrent pass
    // rewrites them into MatMul, Add, Sigmoid, ... first (their categories
    // then apply); the entries say what the layers are for `castor inspect`.
    {"", "LSTM", kAllow, "PyTorch lstm_cell: lower_precision_fp (unrolled before autocast)"},
    {"", "GRU", kAllow, "PyTorch gru_cell: lower_precision_fp (unrolled before autocast)"},
    {"", "RNN", kAllow,
     "PyTorch rnn_tanh_cell/rnn_relu_cell: lower_precision_fp (unrolled before autocast)"},

    // --- deny: numerically sensitive, kept float32 ---------------------------
    {"", "Exp", kDeny, "PyTorch exp: fp32; TF Exp: deny"},
    {"", "Tan", kDeny, "PyTorch tan: fp32"},
    {"", "Asin", kDeny, "PyTorch asin: fp32"},
    {"", "Acos", kDeny, "PyTorch acos: fp32"},
    {"", "Sinh", kDeny, "PyTorch sinh: fp32"},
    {"", "Cosh", kDeny, "PyTorch cosh: fp32"},
    {"", "Log", kDeny, "PyTorch log: fp32; TF Log: deny"},
    {"", "Pow", kDeny, "PyTorch pow: fp32; TF Pow: deny"},
    {"", "Reciprocal", kDeny, "PyTorch reciprocal: fp32"},
    {"", "Softplus", kDeny, "PyTorch softplus: fp32"},
    {"", "Softmax", kDeny, "PyTorch softmax: fp32; TF Softmax: deny"},
    {"", "LogSoftmax", kDeny, "PyTorch log_softmax: fp32; TF LogSoftmax: deny"},
    {"", "ReduceSum", kDeny, "PyTorch sum: fp32; TF Sum: deny (long sum)"},
    {"", "ReduceMean", kDeny, "PyTorch mean via sum: fp32; TF Mean: deny (long sum)"},
    {"", "ReduceL1", kDeny, "PyTorch norm: fp32 (long sum)"},
    {"", "ReduceL2", kDeny, "PyTorch norm: fp32; TF L2Loss: deny (long sum)"},
    {"", "ReduceSumSquare", kDeny, "PyTorch norm: fp32 (long sum of squares)"},
    {"", "ReduceLogSumExp", kDeny, "PyTorch logsumexp: fp32"},
    {"", "ReduceProd", kDeny, "PyTorch prod: fp32"},
    {"", "CumSum", kDeny, "PyTorch cumsum: fp32 (long sum)"},
    {"", "LayerNormalization", kDeny, "PyTorch layer_norm: fp32"},
    {"com.castor", "LayerNormalization", kDeny,
     "castor's training form of LayerNormalization with float32 Scale and B around a 16-bit X "
     "(deny like it: it computes in float32)"},
    {"", "InstanceNormalization", kDeny,
     "PyTorch group_norm: fp32 (torch.onnx exports nn.GroupNorm as InstanceNormalization); "
     "instance_norm is unlisted but its statistics are float32 (cudnn batch_norm), DESIGN.md "
     "rule 2"},
    {"", "BatchNormalization", kDeny,
     "DESIGN.md rule 2: computes in float32 with float32 statistics and parameters; its "
     "output goes on in its input's dtype, as PyTorch's batch_norm and Keras's "
     "BatchNormalization return it",
     kOutputInInputDType},
    {"com.castor", "BatchNormalizationTraining", kDeny,
     "castor's training form of BatchNormalization (deny like it, DESIGN.md rule 2)",
     kOutputInInputDType},
    {"", "SoftmaxCrossEntropyLoss", kDeny, "PyTorch cross_entropy: fp32; TF "
     "SoftmaxCrossEntropyWithLogits: deny"},
    {"com.castor", "SoftmaxCrossEntropyLoss", kDeny,
     "castor's copy of SoftmaxCrossEntropyLoss for models below opset 12 (deny like it)"},
    {"", "NegativeLogLikelihoodLoss", kDeny, "PyTorch nll_loss: fp32"},
    {"", "Range", kDeny, "index arithmetic: float16 cannot count past 2048"},
    {kTrainingDomain, "Adam", kDeny, "optimizer on float32 master weights"},
    {kTrainingDomain, "Adagrad", kDeny, "optimizer on float32 master weights"},
    {kTrainingDomain, "Momentum", kDeny, "optimizer on float32 master weights"},
    {"", "If", kDeny, "subgraph op: bodies stay float32 (rule 2b); deny casts its float inputs"},
    {"", "Loop", kDeny, "subgraph op: body stays float32 (rule 2b); deny casts v_initial"},

    // --- follow: elementwise, pooling, data movement -------------------------
    {"", "Add", kFollow, "PyTorch add: promote; TF AddV2: infer"},
    {"", "Sub", kFollow, "PyTorch sub: promote; TF Sub: infer"},
    {"", "Mul", kFollow, "PyTorch mul: promote; TF Mul: infer"},
    {"", "Div", kFollow, "PyTorch div: promote; TF RealDiv: infer"},
    {"", "Sum", kFollow, "PyTorch stack/add: promote; TF AddN: infer"},
    {"", "Max", kFollow, "PyTorch maximum: promote; TF Maximum: infer"},
    {"", "Min", kFollow, "PyTorch minimum: promote; TF Minimum: infer"},
    {"", "Where", kFollow, "PyTorch where: promote; TF Select: infer"},
    {"", "Equal", kFollow, "PyTorch eq: promote; TF Equal: infer"},
    {"", "Less", kFollow, "PyTorch lt: not listed, runs in input type (as Equal)"},
    {"", "Greater", kFollow, "PyTorch gt: not listed, runs in input type (as Equal)"},
    {"", "LessOrEqual", kFollow, "PyTorch le: not listed, runs in input type (as Equal)"},
    {"", "GreaterOrEqual", kFollow, "PyTorch ge: not listed, runs in input type (as Equal)"},
    {"", "IsNaN", kFollow, "PyTorch isnan: not listed, runs in input type"},
    {"", "IsInf", kFollow, "PyTorch isinf: not listed, runs in input type"},
    {"", "Mod", kFollow, "PyTorch remainder/fmod: not listed, runs in input type"},
    {"", "Abs", kFollow, "TF Abs: infer", kExact},
    {"", "Neg", kFollow, "TF Neg: infer", kExact},
    {"", "Sign", kFollow, "PyTorch sign: not listed, runs in input type", kExact},
    {"", "Floor", kFollow, "PyTorch floor: not listed, runs in input type"},
    {"", "Ceil", kFollow, "PyTorch ceil: not listed, runs in input type"},
    {"", "Round", kFollow, "PyTorch round: not listed, runs in input type"},
    {"", "Relu", kFollow, "TF Relu: clear", kExact},
    {"", "LeakyRelu", kFollow, "TF LeakyRelu: infer"},
    {"", "HardSigmoid", kFollow, "PyTorch hardsigmoid: not listed, runs in input type"},
    {"", "HardSwish", kFollow, "PyTorch hardswish: not listed, runs in input type"},
    {"", "Elu", kFollow, "PyTorch elu: not listed, runs in input type"},
    {"", "Selu", kFollow, "PyTorch selu: not listed, runs in input type"},
    {"", "Celu", kFollow, "PyTorch celu: not listed, runs in input type"},
    {"", "Softsign", kFollow, "PyTorch softsign: not listed, runs in input type"},
    {"", "Sin", kFollow, "PyTorch sin: not listed, runs in input type"},
    {"", "Cos", kFollow, "PyTorch cos: not listed, runs in input type"},
    {"", "Atan", kFollow, "PyTorch atan: not listed, runs in input type"},
    {"", "Asinh", kFollow, "PyTorch asinh: not listed, runs in input type"},
    {"", "Acosh", kFollow, "PyTorch acosh: not listed, runs in input type"},
    {"", "Atanh", kFollow, "PyTorch atanh: not listed, runs in input type"},
    {"", "ThresholdedRelu", kFollow, "PyTorch threshold: not listed, runs in input type"},
    {"", "Mish", kFollow, "PyTorch mish: not listed, runs in input type"},
    {"", "PRelu", kFollow, "PyTorch prelu: not listed, runs in input type"},
    {"", "Clip", kFollow, "TF ClipByValue: infer", kExact},
    {"", "Sigmoid", kFollow, "TF Sigmoid: infer"},
    {"", "Tanh", kFollow, "TF Tanh: infer"},
    {"", "Erf", kFollow, "TF Erf: infer (bounded output)"},
    {"", "Gelu", kFollow, "PyTorch gelu: runs in input type; TF Gelu: infer"},
    {"com.castor", "Gelu", kFollow, "castor's form of Gelu at any opset (follow like it)"},
    {"", "Sqrt", kFollow,
     "TF Sqrt: infer; the pass keeps a Sqrt that feeds a normalisation float32"},
    {"", "MaxPool", kFollow, "TF MaxPool: clear", kExact},
    {"", "AveragePool", kFollow, "TF AvgPool: infer"},
    {"", "GlobalAveragePool", kFollow, "TF Mean over spatial dims of pooled maps: infer"},
    {"", "GlobalMaxPool", kFollow, "TF Max: clear"},
    {"com.castor", "MaxPool", kFollow,
     "castor's training form of MaxPool at any opset (follow like it; TF MaxPool: clear)", kExact},
    {"com.castor", "AveragePool", kFollow,
     "castor's training form of AveragePool at any opset (follow like it; TF AvgPool: infer)"},
    {"com.castor", "GlobalAveragePool", kFollow,
     "castor's training form of GlobalAveragePool at any opset (follow like it)"},
    {"", "ReduceMax", kFollow, "TF Max: clear (no accumulation)"},
    {"", "ReduceMin", kFollow, "TF Min: clear (no accumulation)"},
    {"", "ArgMax", kFollow, "TF ArgMax: clear"},
    {"", "ArgMin", kFollow, "TF ArgMin: clear"},
    {"", "Reshape", kFollow, "TF Reshape: clear", kExact},
    {"", "Flatten", kFollow, "TF Reshape: clear", kExact},
    {"", "Squeeze", kFollow, "TF Squeeze: clear", kExact},
    {"", "Unsqueeze", kFollow, "TF ExpandDims: clear", kExact},
    {"", "Transpose", kFollow, "TF Transpose: clear", kExact},
    {"", "Expand", kFollow, "TF BroadcastTo: clear", kExact},
    {"", "Concat", kFollow, "TF ConcatV2: clear", kExact},
    {"", "Split", kFollow, "TF Split: clear", kExact},
    {"", "Slice", kFollow, "TF Slice: clear"},
    {"", "Gather", kFollow, "TF GatherV2: clear"},
    {"", "GatherND", kFollow, "TF GatherNd: clear (a selection: not exact, as Gather)"},
    {"", "ScatterND", kFollow, "TF ScatterNd/TensorScatterUpdate: clear", kExact},
    {"", "GatherElements", kFollow,
     "PyTorch gather: runs in input type (a selection: not exact, as Gather)"},
    {"", "ScatterElements", kFollow, "PyTorch scatter/scatter_add: runs in input type", kExact},
    {"", "DepthToSpace", kFollow, "TF DepthToSpace: clear", kExact},
    {"", "SpaceToDepth", kFollow, "TF SpaceToDepth: clear", kExact},
    {"", "Trilu", kFollow, "PyTorch triu/tril: runs in input type; TF MatrixBandPart: clear",
     kExact},
    {"", "Pad", kFollow, "TF Pad: clear", kExact},
    {"", "Resize", kFollow,
     "PyTorch upsample_*: runs in input type; TF ResizeBilinear/NearestNeighbor: infer"},
    {"", "Tile", kFollow, "TF Tile: clear", kExact},
    {"", "Identity", kFollow, "TF Identity: clear", kExact},
    {"", "Dropout", kFollow, "PyTorch dropout: runs in input type"},
    {"com.castor", "DropoutTraining", kFollow,
     "castor's training form of Dropout (follow like it; PyTorch dropout: runs in input type)"},

    // --- none: not a float computation ---------------------------------------
    {"", "Shape", kNone, "produces int64 dims"},
    {"", "Size", kNone, "produces an int64 count"},
    {"", "Cast", kNone, "Casts in the model are respected as written"},
    {"", "Constant", kNone, "a constant is cast where used, like a weight"},
    {"", "ConstantOfShape", kNone, "its dtype is an attribute"},
    {"", "And", kNone, "boolean logic"},
    {"", "Or", kNone, "boolean logic"},
    {"", "Xor", kNone, "boolean logic"},
    {"", "Not", kNone, "boolean logic"},

    // --- castor's gradient ops (graph/ops/gradient_ops.cc) -------------------
    {"com.castor", "ConvGrad", kFollow, "castor gradient op"},
    {"com.castor", "MaxPoolGrad", kFollow, "castor gradient op"},
    {"com.castor", "AveragePoolGrad", kFollow, "castor gradient op"},
    {"com.castor", "GlobalAveragePoolGrad", kFollow, "castor gradient op"},
    {"com.castor", "ReluGrad", kFollow, "castor gradient op"},
    {"com.castor", "GeluGrad", kFollow, "castor gradient op (computes in float32, like Gelu)"},
    {"com.castor", "ReduceToShapeOf", kFollow, "castor gradient op"},
    {"com.castor", "GatherGrad", kFollow, "castor gradient op"},
    {"com.castor", "GatherNDGrad", kFollow, "castor gradient op"},
    {"com.castor", "GatherElementsGrad", kFollow, "castor gradient op"},
    {"com.castor", "ResizeGrad", kFollow, "castor gradient op"},
    {"com.castor", "BatchNormalizationGrad", kDeny, "castor gradient op (deny like BatchNormalization)"},
    {"com.castor", "LayerNormalizationGrad", kDeny, "castor gradient op (deny like LayerNormalization)"},
    {"com.castor", "InstanceNormalizationGrad", kDeny,
     "castor gradient op (deny like InstanceNormalization)"},
    {"com.castor", "SoftmaxGrad", kDeny, "castor gradient op (deny like Softmax)"},
    {"com.castor", "LogSoftmaxGrad", kDeny, "castor gradient op (deny like LogSoftmax)"},
    {"com.castor", "SoftmaxCrossEntropyLossGrad", kDeny,
     "castor gradient op (deny like SoftmaxCrossEntropyLoss)"},
};

}  // namespace

void AssignAutocastCategories(OpRegistry& registry) {
  for (const Entry& e : kTable) {
    registry.SetAutocastCategory(e.domain, e.op_type, e.category, e.source,
                                 (e.traits & kExact) != 0,
                                 (e.traits & kOutputInInputDType) != 0);
  }
}

}  // namespace castor
