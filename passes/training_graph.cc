// BuildTrainingGraph (see training_graph.h): the forward-only evaluation
// graph, then BatchNormalization in training mode, Relu moved behind the
// MaxPool that reads it, the Casts around a BatchNormalization or a
// LayerNormalization between 16-bit neighbours folded into it, the Relu
// after a BatchNormalization applied by it, the erf GELU as one node, the
// loss, parameters, autodiff seeded with the loss scale, and 16-bit values
// re-widened for the backward pass instead of kept in float32.
#include "passes/training_graph.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/gradient_builder.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "graph/status.h"
#include "graph/user_regex.h"
#include "passes/autodiff.h"
#include "passes/pass_manager.h"

namespace castor {
namespace {

std::string Quoted(const std::string& name) { return absl::StrCat("'", name, "'"); }

// The loss, float32: computed from `output` (cast up if 16-bit). The
// cross-entropy is ONNX's SoftmaxCrossEntropyLoss, or castor's copy of it
// (com.castor) in a model whose opset predates it (below 12).
absl::StatusOr<Value*> AttachLoss(Model& model, Value* output, LossKind kind,
                                  std::optional<int64_t> ignore_index) {
  Graph& graph = *model.graph;
  Value* prediction = output;
  if (output->dtype() != DType::kFloat32) {
    CASTOR_ASSIGN_OR_RETURN(Node * cast,
                            graph.AddNode("Cast", {output}, {"castor.loss/prediction_float32"},
                                          "castor.loss/Cast"));
    cast->SetAttribute(Attribute::Int("to", DTypeToOnnx(DType::kFloat32)));
    prediction = cast->output(0);
  }
  const Dim batch = output->shape().rank() > 0 ? output->shape()[0] : Dim::Symbol("N");
  switch (kind) {
    case LossKind::kSoftmaxCrossEntropy: {
      if (output->shape().rank() < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cross-entropy loss needs logits [N, C, ...]; output ", Quoted(output->name()),
            " has shape ", output->shape().ToString()));
      }
      // Logits [N, C]: labels [N]. Logits [N, d1, ..., C] (class axis last,
      // as torch's [N, T, V] sequence logits): labels [N, d1, ...], the
      // logits transposed to ONNX's [N, C, d1, ...]; the mean is over every
      // position not ignored, as F.cross_entropy(logits.reshape(-1, C),
      // labels.reshape(-1)).
      const int rank = output->shape().rank();
      std::vector<Dim> label_dims = {batch};
      Value* scores = prediction;
      if (rank >= 3) {
        for (int axis = 1; axis + 1 < rank; ++axis) label_dims.push_back(output->shape()[axis]);
        std::vector<int64_t> perm = {0, rank - 1};
        for (int axis = 1; axis + 1 < rank; ++axis) perm.push_back(axis);
        CASTOR_ASSIGN_OR_RETURN(Node * transpose,
                                graph.AddNode("Transpose", {prediction},
                                              {"castor.loss/scores_class_axis_1"},
                                              "castor.loss/Transpose"));
        transpose->SetAttribute(Attribute::Ints("perm", perm));
        scores = transpose->output(0);
      }
      CASTOR_ASSIGN_OR_RETURN(
          Value * labels, graph.AddInput(kLabelsInput, DType::kInt64, Shape(label_dims)));
      std::string loss_domain;  // ai.onnx
      if (model.OpsetVersion("") < 12) {
        loss_domain = kCastorDomain;
        if (model.OpsetVersion(kCastorDomain) == 0) model.opset_imports.push_back({kCastorDomain, 1});
      }
      CASTOR_ASSIGN_OR_RETURN(
          Node * loss, graph.AddNode("SoftmaxCrossEntropyLoss", {scores, labels}, {kLossOutput},
                                     "castor.loss/SoftmaxCrossEntropyLoss", loss_domain));
      loss->SetAttribute(Attribute::String("reduction", "mean"));
      if (ignore_index.has_value()) {
        loss->SetAttribute(Attribute::Int("ignore_index", *ignore_index));
      }
      return loss->output(0);
    }
    case LossKind::kMeanSquaredError: {
      CASTOR_ASSIGN_OR_RETURN(Value * targets,
                              graph.AddInput(kLabelsInput, DType::kFloat32, output->shape()));
      CASTOR_ASSIGN_OR_RETURN(Node * diff, graph.AddNode("Sub", {prediction, targets},
                                                         {"castor.loss/error"}, "castor.loss/Sub"));
      CASTOR_ASSIGN_OR_RETURN(Node * square,
                              graph.AddNode("Mul", {diff->output(0), diff->output(0)},
                                            {"castor.loss/squared"}, "castor.loss/Mul"));
      CASTOR_ASSIGN_OR_RETURN(Node * mean, graph.AddNode("ReduceMean", {square->output(0)},
                                                         {kLossOutput}, "castor.loss/ReduceMean"));
      mean->SetAttribute(Attribute::Int("keepdims", 0));
      return mean->output(0);
    }
    case LossKind::kBinaryCrossEntropy: {
      // max(x, 0) - x * y + log(1 + exp(-|x|)): never exp of a positive
      // number, so no overflow for any logit (torch's formulation).
      CASTOR_ASSIGN_OR_RETURN(Value * targets,
                              graph.AddInput(kLabelsInput, DType::kFloat32, output->shape()));
      auto op = [&](const std::string& type, std::vector<Value*> inputs,
                    const std::string& name) -> absl::StatusOr<Value*> {
        CASTOR_ASSIGN_OR_RETURN(Node * node, graph.AddNode(type, std::move(inputs),
                                                           {"castor.loss/" + name},
                                                           "castor.loss/" + name));
        return node->output(0);
      };
      CASTOR_ASSIGN_OR_RETURN(Value * positive, op("Relu", {prediction}, "positive_part"));
      CASTOR_ASSIGN_OR_RETURN(Value * product, op("Mul", {prediction, targets}, "logit_target"));
      CASTOR_ASSIGN_OR_RETURN(Value * linear, op("Sub", {positive, product}, "linear_part"));
      CASTOR_ASSIGN_OR_RETURN(Value * magnitude, op("Abs", {prediction}, "magnitude"));
      CASTOR_ASSIGN_OR_RETURN(Value * negated, op("Neg", {magnitude}, "negated_magnitude"));
      CASTOR_ASSIGN_OR_RETURN(Value * exp, op("Exp", {negated}, "exp"));
      // A Constant node, not an initializer: an initializer would be a parameter.
      CASTOR_ASSIGN_OR_RETURN(Node * one_node, graph.AddNode("Constant", {}, {"castor.loss/one"},
                                                             "castor.loss/one"));
      one_node->SetAttribute(Attribute::TensorValue("value", Tensor::Scalar(1.0f)));
      Value* one = one_node->output(0);
      CASTOR_ASSIGN_OR_RETURN(Value * shifted, op("Add", {exp, one}, "one_plus_exp"));
      CASTOR_ASSIGN_OR_RETURN(Value * softplus, op("Log", {shifted}, "log_one_plus_exp"));
      CASTOR_ASSIGN_OR_RETURN(Value * elementwise, op("Add", {linear, softplus}, "elementwise"));
      CASTOR_ASSIGN_OR_RETURN(Node * mean, graph.AddNode("ReduceMean", {elementwise},
                                                         {kLossOutput}, "castor.loss/ReduceMean"));
      mean->SetAttribute(Attribute::Int("keepdims", 0));
      return mean->output(0);
    }
    case LossKind::kModelOutput: {
      if (output->dtype() != DType::kFloat32 && output->dtype() != DType::kFloat16 &&
          output->dtype() != DType::kBFloat16) {
        return absl::InvalidArgumentError(absl::StrCat("output ", Quoted(output->name()),
                                                       " is not a float loss"));
      }
      const Shape& shape = output->shape();
      bool scalar = shape.rank() >= 0;
      for (int axis = 0; scalar && axis < shape.rank(); ++axis) {
        scalar = shape[axis].is_static() && shape[axis].value() == 1;
      }
      if (!scalar) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--loss output: output ", Quoted(output->name()), " has shape ", shape.ToString(),
            "; the model's own loss must be a float scalar (name it with --output)"));
      }
      CASTOR_ASSIGN_OR_RETURN(Node * identity, graph.AddNode("Identity", {prediction},
                                                             {kLossOutput}, "castor.loss/Identity"));
      return identity->output(0);
    }
  }
  return absl::InternalError("unhandled loss kind");
}

// Every BatchNormalization -> castor's BatchNormalizationTraining (domain
// com.castor, graph/ops/normalization.cc), PyTorch's train(): batch
// statistics for Y, and running statistics updated with the node's
// momentum, the running variance with the unbiased batch variance as
// PyTorch updates it (the ONNX op's spec takes the biased one). Whatever
// form the model holds it in: inference form (one output, as castor's
// sample models and Keras write it), the training form torch exports from
// opset 14 (training_mode 1, one or three outputs, the running-statistic
// outputs usually read by nobody) or below opset 14 (five outputs Y, mean,
// var, saved_mean, saved_var, no training_mode). castor's own op keeps the
// graph valid at every opset (ONNX has no training_mode below 14, and no
// unbiased update at all). The node is rebuilt with outputs of castor's
// naming, so the trainer finds each statistic's update, and where the
// statistics are float32 the batch mean for the gradient; readers of the
// old outputs read the new ones. Returns (initializer, updated value) pairs:
// the running statistics are state updated by the step, never parameters.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> SwitchBatchNormToTraining(
    Model& model) {
  std::vector<std::pair<std::string, std::string>> stats;
  Graph& graph = *model.graph;
  const std::vector<Node*> nodes = graph.nodes();
  const int64_t opset = model.OpsetVersion("");
  bool replaced = false;
  for (Node* node : nodes) {
    if (node->op_type() != "BatchNormalization" || !node->domain().empty()) continue;
    if (node->GetInt("spatial", 1) == 0) {
      return absl::UnimplementedError(absl::StrCat(
          "BatchNormalization node ", Quoted(node->name()), " (opset ", opset,
          ") has spatial=0 (statistics per activation, not per channel); castor trains "
          "per-channel BatchNormalization only (spatial=1, the default)"));
    }
    if (node->output(0)->is_graph_output()) {
      return absl::UnimplementedError(absl::StrCat(
          "BatchNormalization node ", Quoted(node->name()), " produces a graph output"));
    }
    // saved_mean / saved_var (opsets 7-13): the training node has no such
    // outputs, so nobody may read them.
    for (int i = 3; i < node->num_outputs(); ++i) {
      const Value* saved = node->output(i);
      if (saved != nullptr && (!saved->uses().empty() || saved->is_graph_output())) {
        return absl::UnimplementedError(absl::StrCat(
            "BatchNormalization node ", Quoted(node->name()), ": output ", i, " (",
            i == 3 ? "saved_mean" : "saved_var", ", ", Quoted(saved->name()),
            ") is read; castor's training graph computes Y and the running statistics only"));
      }
    }
    std::vector<std::string> outputs = {
        graph.UniqueName(absl::StrCat(node->output(0)->name(), "/training"))};
    for (int k : {3, 4}) {
      Value* state = node->input(k);
      if (state == nullptr || state->initializer() == nullptr || state->is_graph_input()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "BatchNormalization node ", Quoted(node->name()), ": running ",
            k == 3 ? "mean" : "variance", " (input ", k, ") must be an initializer to train"));
      }
      outputs.push_back(graph.UniqueName(absl::StrCat(state->name(), "/updated")));
      stats.emplace_back(state->name(), outputs.back());
    }
    // The batch mean, for the gradient (which would otherwise compute it
    // from X again, a pass over X): float32 statistics of a float32 or
    // 16-bit X only, whose kernels use the mean rounded to float32.
    if (node->input(3)->dtype() == DType::kFloat32 &&
        node->input(0)->dtype() != DType::kFloat64) {
      outputs.push_back(graph.UniqueName(absl::StrCat(node->output(0)->name(), "/batch_mean")));
    }
    // The same inputs, epsilon and momentum; Y and the two running statistics.
    CASTOR_ASSIGN_OR_RETURN(
        Node * training,
        graph.AddNode("BatchNormalizationTraining", node->inputs(), outputs,
                      graph.UniqueName(node->name() + "/training"), kCastorDomain));
    for (const Attribute& attribute : node->attributes()) {
      if (attribute.name == "epsilon" || attribute.name == "momentum") {
        training->SetAttribute(attribute);
      }
    }
    for (const auto& [key, value] : node->metadata()) training->SetMetadata(key, value);
    for (int i = 0; i < std::min(node->num_outputs(), 3); ++i) {
      if (node->output(i) == nullptr) continue;
      graph.ReplaceAllUsesWith(node->output(i), training->output(i));
    }
    CASTOR_RETURN_IF_ERROR(graph.RemoveNode(node));
    replaced = true;
  }
  if (replaced) {
    if (model.OpsetVersion(kCastorDomain) == 0) model.opset_imports.push_back({kCastorDomain, 1});
    CASTOR_RETURN_IF_ERROR(graph.TopologicalSort());
  }
  return stats;
}

// The model as it predicts (PyTorch's eval()): a BatchNormalization in
// training form normalises with its running statistics (training_mode 0,
// one output) and a Dropout passes its input through. Exporters write both
// in training form when asked for a training export; the evaluation graph
// must not use batch statistics or drop units.
absl::Status SwitchToInferenceMode(Graph& graph) {
  const std::vector<Node*> nodes = graph.nodes();
  for (Node* node : nodes) {
    if (!node->domain().empty()) continue;
    const bool batch_norm = node->op_type() == "BatchNormalization";
    if (!batch_norm && node->op_type() != "Dropout") continue;
    for (int i = 1; i < node->num_outputs(); ++i) {
      const Value* extra = node->output(i);
      if (extra != nullptr && (!extra->uses().empty() || extra->is_graph_output())) {
        return absl::UnimplementedError(absl::StrCat(
            node->op_type(), " node ", Quoted(node->name()), ": output ", i, " (",
            Quoted(extra->name()), ") is read, so the evaluation graph cannot drop it"));
      }
    }
    if (batch_norm && node->GetInt("training_mode", 0) == 0 && node->num_outputs() == 1) continue;
    std::vector<Value*> inputs = node->inputs();
    const std::string op_type = batch_norm ? "BatchNormalization" : "Identity";
    if (!batch_norm) inputs.resize(1);
    CASTOR_ASSIGN_OR_RETURN(
        Node * inference,
        graph.AddNode(op_type, inputs, {graph.UniqueName(node->output(0)->name() + "/eval")},
                      graph.UniqueName(node->name() + "/eval")));
    if (batch_norm) {
      for (const Attribute& attribute : node->attributes()) {
        if (attribute.name != "training_mode") inference->SetAttribute(attribute);
      }
    }
    for (const auto& [key, value] : node->metadata()) inference->SetMetadata(key, value);
    // The output keeps its name (the model output may be one of these).
    const std::string name = node->output(0)->name();
    graph.ReplaceAllUsesWith(node->output(0), inference->output(0));
    CASTOR_RETURN_IF_ERROR(graph.RemoveNode(node));
    CASTOR_RETURN_IF_ERROR(graph.RenameValue(inference->output(0), name));
  }
  return graph.TopologicalSort();
}

// Whether every window of `pool` covers at least one input element. castor
// gives a window that lies wholly in the padding (possible with dilations,
// or pads as large as the kernel) the lowest value, which a Relu behind
// the pool would turn into 0. Dilation 1 with every pad smaller than the
// kernel rules it out: SAME_* pads are, and ceil_mode drops windows that
// would start in the end padding.
bool EveryWindowCoversInput(const Node& pool) {
  const std::vector<int64_t> kernel = pool.GetInts("kernel_shape", {});
  if (kernel.empty()) return false;
  for (int64_t dilation : pool.GetInts("dilations", {})) {
    if (dilation != 1) return false;
  }
  const std::vector<int64_t> pads = pool.GetInts("pads", {});
  for (size_t i = 0; i < pads.size(); ++i) {
    if (pads[i] >= kernel[i % kernel.size()]) return false;
  }
  return true;
}

// MaxPool(Relu(x)) == Relu(MaxPool(x)): Relu does not decrease, so the
// window maximum of the clamped values is the clamped window maximum (and
// Relu maps -0 to +0, so even the sign of a zero maximum agrees). Pooling
// first runs Relu on the pooled, several times smaller tensor, and so its
// gradient too: ReluGrad then masks the pooled gradient, and MaxPoolGrad
// reads x instead of Relu(x). Values and gradients are the same bits:
// where x's window maximum is positive both forms pick the same (first)
// maximum; where it is not, both give +0. Applies where a Relu's output is
// read only by a MaxPool (ONNX's, or castor's training form) without an
// Indices output, whose output is not a graph output and none of whose
// windows is all padding. Returns the number of pairs swapped.
absl::StatusOr<int> PoolBeforeRelu(Graph& graph) {
  int swapped = 0;
  for (Node* relu : std::vector<Node*>(graph.nodes())) {
    if (relu->op_type() != "Relu" || !relu->domain().empty()) continue;
    Value* x = relu->input(0);
    Value* y = relu->output(0);
    if (x == nullptr || y->is_graph_output() || y->uses().size() != 1) continue;
    Node* pool = y->uses()[0].node;
    const bool max_pool = pool->op_type() == "MaxPool" &&
                          (pool->domain().empty() || pool->domain() == kCastorDomain);
    if (!max_pool || y->uses()[0].index != 0 ||
        pool->num_outputs() != 1 || !EveryWindowCoversInput(*pool)) {
      continue;
    }
    Value* pooled = pool->output(0);
    if (pooled->is_graph_output()) continue;
    const std::vector<Use> readers = pooled->uses();
    if (std::any_of(readers.begin(), readers.end(), [](const Use& use) { return use.index < 0; })) {
      continue;
    }
    pool->SetInput(0, x);
    relu->SetInput(0, pooled);
    y->set_shape(pooled->shape());
    for (const Use& use : readers) use.node->SetInput(use.index, y);
    ++swapped;
  }
  if (swapped > 0) CASTOR_RETURN_IF_ERROR(graph.TopologicalSort());
  return swapped;
}

bool IsOnnxCast(const Node* node) {
  return node != nullptr && node->op_type() == "Cast" && node->domain().empty();
}

// The 16-bit value `node` computes on in float32 between 16-bit
// neighbours: its X (input 0) is a Cast of that value to float32, and its
// Y (output 0, not a graph output) is read only by Casts back to that type
// (none a graph output). nullptr where the node is not so placed.
Value* SixteenBitNeighbourOf(const Node* node) {
  const Value* x = node->input(0);
  const Value* y = node->output(0);
  const Node* widen = x != nullptr ? x->producer() : nullptr;
  if (!IsOnnxCast(widen) || x->dtype() != DType::kFloat32 || y->is_graph_output()) return nullptr;
  Value* x16 = widen->input(0);
  const DType low = x16->dtype();
  if (low != DType::kBFloat16 && low != DType::kFloat16) return nullptr;
  const std::vector<Use>& readers = y->uses();
  const bool narrowed_only =
      !readers.empty() && std::all_of(readers.begin(), readers.end(), [&](const Use& use) {
        return use.index >= 0 && IsOnnxCast(use.node) && use.node->output(0)->dtype() == low &&
               !use.node->output(0)->is_graph_output();
      });
  return narrowed_only ? x16 : nullptr;
}

// Has `node` read `x16` (SixteenBitNeighbourOf) and write Y in its type:
// the narrowing Casts after it go, and the widening one before it where
// nothing else reads it.
absl::Status FoldNeighbourCasts(Graph& graph, Node* node, Value* x16) {
  Value* x = node->input(0);
  Value* y = node->output(0);
  Node* widen = x->producer();
  node->SetInput(0, x16);
  y->set_dtype(x16->dtype());
  for (const Use& use : std::vector<Use>(y->uses())) {
    Node* narrow = use.node;
    graph.ReplaceAllUsesWith(narrow->output(0), y);
    CASTOR_RETURN_IF_ERROR(graph.RemoveNode(narrow));
  }
  if (x->uses().empty() && !x->is_graph_output()) {
    CASTOR_RETURN_IF_ERROR(graph.RemoveNode(widen));
  }
  return absl::OkStatus();
}

// Cast(x16 -> float32) -> BatchNormalizationTraining -> Cast(-> the same
// 16-bit type), the form autocast gives a BatchNormalization kept float32
// between 16-bit neighbours (a Conv before it, a Relu after): the node
// reads x16 and writes Y in that type instead, and the Casts go. The
// kernels compute in float32 all the same (CPU: each feature widened,
// backend/cpu/normalization.cc; CUDA: a 16-bit X with float32 parameters)
// and round Y once, so the values are the bits of the Casts; what goes are
// two float32 copies of the tensor forward, and their gradients' two
// backward. Applies where X comes from a widening Cast of a 16-bit value
// and Y (not a graph output) is read only by Casts to that type; the
// running statistics stay float32. Returns the number of nodes folded.
absl::StatusOr<int> FoldBatchNormCasts(Graph& graph) {
  // The BatchNormalizations first: the loop removes Casts, so a copy of the
  // node list would hold freed nodes.
  std::vector<Node*> batch_norms;
  for (Node* node : graph.nodes()) {
    if (node->op_type() == "BatchNormalizationTraining" && node->domain() == kCastorDomain) {
      batch_norms.push_back(node);
    }
  }
  int folded = 0;
  for (Node* bn : batch_norms) {
    Value* x16 = SixteenBitNeighbourOf(bn);
    if (x16 == nullptr) continue;
    CASTOR_RETURN_IF_ERROR(FoldNeighbourCasts(graph, bn, x16));
    ++folded;
  }
  return folded;
}

// Cast(x16 -> float32) -> LayerNormalization (float32 Scale, B) -> Cast(->
// the same 16-bit type), the form autocast gives a LayerNormalization
// (kept float32, DESIGN.md rule 2) between 16-bit neighbours (a
// transformer's residual Add before it, the attention's or MLP's MatMuls
// after it): the node becomes castor's LayerNormalization (com.castor,
// graph/ops/normalization.cc), which reads x16 and writes Y in that type
// with the float32 Scale and B, and the Casts go. The kernels compute in
// float32 all the same and round Y once, and the gradient
// (LayerNormalizationGrad) reads X, never Y, widened exactly as the Cast
// did, writing dX rounded once as the Cast's gradient did: the values are
// the bits of the Casts. What goes are two float32 copies of the tensor
// forward (and the widened X again for the backward pass) and the Casts
// of their gradients. Applies where X comes from a widening Cast of a
// 16-bit value, Y (not a graph output) is read only by Casts to that type,
// Scale and B are float32 and the statistics outputs are not read. Returns
// the number of nodes folded.
absl::StatusOr<int> FoldLayerNormCasts(Model& model) {
  Graph& graph = *model.graph;
  std::vector<Node*> layer_norms;
  for (Node* node : graph.nodes()) {
    if (node->op_type() == "LayerNormalization" && node->domain().empty()) {
      layer_norms.push_back(node);
    }
  }
  int folded = 0;
  for (Node* ln : layer_norms) {
    bool float32_parameters = true;
    for (int i = 1; i < ln->num_inputs(); ++i) {
      const Value* parameter = ln->input(i);
      if (parameter != nullptr && parameter->dtype() != DType::kFloat32) {
        float32_parameters = false;
      }
    }
    bool statistics_read = false;
    for (int i = 1; i < ln->num_outputs(); ++i) {
      const Value* statistic = ln->output(i);
      if (statistic != nullptr && (!statistic->uses().empty() || statistic->is_graph_output())) {
        statistics_read = true;
      }
    }
    Value* x16 = SixteenBitNeighbourOf(ln);
    if (!float32_parameters || statistics_read || x16 == nullptr) continue;
    ln->set_domain(kCastorDomain);
    CASTOR_RETURN_IF_ERROR(FoldNeighbourCasts(graph, ln, x16));
    ++folded;
  }
  if (folded > 0 && model.OpsetVersion(kCastorDomain) == 0) {
    model.opset_imports.push_back({kCastorDomain, 1});
  }
  return folded;
}

// BatchNormalizationTraining -> Relu: the node applies the Relu itself as
// it writes Y (attribute relu = 1), one pass over the tensor less forward.
// The values are the bits of the pair: Relu(round(v)) is round(Relu(v))
// for every float32 v (rounding keeps signs, zeros and NaNs), and the
// gradient is ReluGrad's on the fused output, as the Relu's was, applied by
// BatchNormalizationGrad as it reads dY (its relu_output input:
// gradient_rules.cc), one pass less backward. Applies where Y (not a graph
// output) is read only by one Relu; runs after fold-batchnorm-casts, which
// leaves the Relu reading Y itself between 16-bit neighbours. Returns the
// number of Relus fused.
absl::StatusOr<int> FuseBatchNormRelu(Graph& graph) {
  std::vector<Node*> batch_norms;
  for (Node* node : graph.nodes()) {
    if (node->op_type() == "BatchNormalizationTraining" && node->domain() == kCastorDomain &&
        node->GetInt("relu", 0) == 0) {
      batch_norms.push_back(node);
    }
  }
  int fused = 0;
  for (Node* bn : batch_norms) {
    Value* y = bn->output(0);
    if (y->is_graph_output() || y->uses().size() != 1) continue;
    const Use use = y->uses()[0];
    Node* relu = use.node;
    if (relu->op_type() != "Relu" || !relu->domain().empty() || use.index != 0) continue;
    Value* activated = relu->output(0);
    if (activated->is_graph_output()) continue;
    bn->SetAttribute(Attribute::Int("relu", 1));
    graph.ReplaceAllUsesWith(activated, y);
    CASTOR_RETURN_IF_ERROR(graph.RemoveNode(relu));
    ++fused;
  }
  return fused;
}

// The scalar a value holds when it is a one-element initializer or Constant
// (Constant's `value` tensor), seen through Casts (autocast casts a
// constant to the dtype its reader computes in), with the dtype it is
// stored in; nullopt otherwise.
struct StoredScalar {
  double value = 0;
  DType dtype = DType::kUndefined;
};
std::optional<StoredScalar> ScalarOf(const Value* value) {
  for (int depth = 0; value != nullptr && depth < 4; ++depth) {
    if (const Tensor* init = value->initializer(); init != nullptr) {
      if (init->num_elements() != 1) return std::nullopt;
      return StoredScalar{init->GetDouble(0), init->dtype()};
    }
    const Node* producer = value->producer();
    if (producer == nullptr || !producer->domain().empty()) return std::nullopt;
    if (producer->op_type() == "Constant") {
      const Attribute* tensor = producer->attribute("value");
      if (tensor == nullptr || tensor->kind != AttrKind::kTensor ||
          tensor->t.num_elements() != 1) {
        return std::nullopt;
      }
      return StoredScalar{tensor->t.GetDouble(0), tensor->t.dtype()};
    }
    if (producer->op_type() != "Cast") return std::nullopt;
    value = producer->input(0);
  }
  return std::nullopt;
}

// Whether `value` holds `expected` as its dtype stores it: to within half a
// unit in the last place (1.4142135381698608, sqrt(2) in float32, as
// exporters write it).
bool IsScalar(const Value* value, double expected) {
  const std::optional<StoredScalar> scalar = ScalarOf(value);
  if (!scalar.has_value()) return false;
  double half_ulp = 0;
  switch (scalar->dtype) {
    case DType::kFloat64: half_ulp = std::ldexp(1.0, -53); break;
    case DType::kFloat32: half_ulp = std::ldexp(1.0, -24); break;
    case DType::kFloat16: half_ulp = std::ldexp(1.0, -11); break;
    case DType::kBFloat16: half_ulp = std::ldexp(1.0, -8); break;
    default: return false;
  }
  return std::abs(scalar->value - expected) <= half_ulp * std::abs(expected);
}

// A default-domain node of `op_type` with two inputs, one of them `value`:
// the other one, or nullptr.
Value* OtherOperand(const Node* node, const char* op_type, const Value* value) {
  if (node == nullptr || node->op_type() != op_type || !node->domain().empty() ||
      node->num_inputs() != 2 || node->num_outputs() != 1) {
    return nullptr;
  }
  if (node->input(0) == value) return node->input(1);
  if (node->input(1) == value) return node->input(0);
  return nullptr;
}

// The single reader of `value` (none when it has several, is a graph output,
// or is read as a subgraph's implicit input).
Node* OnlyReader(const Value* value) {
  if (value == nullptr || value->is_graph_output() || value->uses().size() != 1 ||
      value->uses()[0].index < 0) {
    return nullptr;
  }
  return value->uses()[0].node;
}

// Exact GELU as exporters write it before ONNX's Gelu (opset 20), from
// PyTorch's nn.GELU and HuggingFace's gelu alike:
//   Erf(X / sqrt(2)) (or X * (1 / sqrt(2))), + 1, then * X and * 0.5 in
//   either order (and either operand order)
// becomes castor's Gelu (com.castor, graph/ops/elementwise.cc): one node
// forward and one GeluGrad backward, computing in float32 and rounding
// once, where the chain took five nodes forward and a dozen backward, each
// a pass over the tensor rounding to its dtype. The chain's nodes must
// share X's float dtype, and its intermediate values have no other reader
// (and are no graph output). Returns the number of chains fused.
absl::StatusOr<int> FuseGelu(Model& model) {
  Graph& graph = *model.graph;
  struct Chain {
    Value* x = nullptr;
    std::vector<Node*> nodes;  // in order; the last one's output is the GELU
  };
  std::vector<Chain> chains;
  for (Node* erf : graph.nodes()) {
    if (erf->op_type() != "Erf" || !erf->domain().empty() || erf->num_inputs() != 1) continue;
    Node* scale = erf->input(0) != nullptr ? erf->input(0)->producer() : nullptr;
    if (scale == nullptr || !scale->domain().empty() || scale->num_inputs() != 2 ||
        OnlyReader(scale->output(0)) != erf) {
      continue;
    }
    Value* x = nullptr;
    if (scale->op_type() == "Div" && IsScalar(scale->input(1), std::sqrt(2.0))) {
      x = scale->input(0);
    } else if (scale->op_type() == "Mul") {
      for (int i : {0, 1}) {
        if (IsScalar(scale->input(1 - i), std::sqrt(0.5))) x = scale->input(i);
      }
    }
    if (x == nullptr || !IsFloatingPoint(x->dtype())) continue;
    Node* plus_one = OnlyReader(erf->output(0));
    Value* one = OtherOperand(plus_one, "Add", erf->output(0));
    if (one == nullptr || !IsScalar(one, 1.0)) continue;
    // (X * (1 + erf)) * 0.5, or (X * 0.5) * (1 + erf).
    Node* first = OnlyReader(plus_one->output(0));
    Value* first_other = OtherOperand(first, "Mul", plus_one->output(0));
    if (first_other == nullptr) continue;
    std::vector<Node*> nodes = {scale, erf, plus_one};
    if (first_other == x) {
      Node* last = OnlyReader(first->output(0));
      Value* half = OtherOperand(last, "Mul", first->output(0));
      if (half == nullptr || !IsScalar(half, 0.5)) continue;
      nodes.push_back(first);
      nodes.push_back(last);
    } else {
      Node* halving = first_other->producer();
      Value* half = OtherOperand(halving, "Mul", x);
      if (half == nullptr || !IsScalar(half, 0.5) || OnlyReader(first_other) != first) continue;
      nodes.push_back(halving);
      nodes.push_back(first);
    }
    const bool same_dtype = std::all_of(nodes.begin(), nodes.end(), [&](const Node* node) {
      return node->output(0)->dtype() == x->dtype();
    });
    if (!same_dtype) continue;
    chains.push_back(Chain{x, std::move(nodes)});
  }
  if (chains.empty()) return 0;
  if (model.OpsetVersion(kCastorDomain) == 0) model.opset_imports.push_back({kCastorDomain, 1});
  for (size_t c = 0; c < chains.size(); ++c) {
    Chain& chain = chains[c];
    Value* gelu = chain.nodes.back()->output(0);
    const std::string name = gelu->name();
    const std::string& erf_name = chain.nodes[1]->name();
    const size_t slash = erf_name.rfind('/');
    const std::string node_name = graph.UniqueName(
        slash == std::string::npos ? erf_name + "_gelu" : erf_name.substr(0, slash) + "/Gelu");
    CASTOR_ASSIGN_OR_RETURN(
        Node * fused, graph.AddNode("Gelu", {chain.x}, {graph.UniqueName(name + "/fused")},
                                    node_name, kCastorDomain));
    fused->SetAttribute(Attribute::String("approximate", "none"));
    fused->output(0)->set_dtype(gelu->dtype());
    fused->output(0)->set_shape(gelu->shape());
    graph.ReplaceAllUsesWith(gelu, fused->output(0));
    // A later chain may be a GELU of this one (its X is this output).
    for (size_t later = c + 1; later < chains.size(); ++later) {
      if (chains[later].x == gelu) chains[later].x = fused->output(0);
    }
    for (auto it = chain.nodes.rbegin(); it != chain.nodes.rend(); ++it) {
      CASTOR_RETURN_IF_ERROR(graph.RemoveNode(*it));
    }
    if (graph.FindValue(name) == nullptr) {
      CASTOR_RETURN_IF_ERROR(graph.RenameValue(fused->output(0), name));
    }
  }
  CASTOR_RETURN_IF_ERROR(graph.TopologicalSort());
  return static_cast<int>(chains.size());
}

// A widening Cast (float16/bfloat16 -> float32: exact) in the forward pass
// whose float32 output a backward node reads keeps that float32 copy alive
// from its forward use to its backward one: a BatchNormalization kept
// float32 behind a 16-bit Conv, whose gradient reads X. The backward
// readers read a second Cast of the same 16-bit value instead, placed just
// before the first of them, so what stays alive across the step is the
// 16-bit value (half the bytes), and the values read are the same. Nodes
// from `first_backward` on (in graph order) are the backward ones. Returns
// the number of Casts added.
absl::StatusOr<int> RecastWidenedValuesForBackward(Graph& graph, int first_backward) {
  const std::vector<Node*> order = graph.nodes();
  absl::flat_hash_map<const Node*, int> position;
  for (int i = 0; i < static_cast<int>(order.size()); ++i) position[order[i]] = i;
  std::multimap<int, Node*> insert_before;  // position of the first backward reader -> Cast
  for (int i = 0; i < first_backward; ++i) {
    Node* cast = order[i];
    if (cast->op_type() != "Cast" || !cast->domain().empty()) continue;
    Value* narrow = cast->input(0);
    Value* wide = cast->output(0);
    if (narrow == nullptr || wide->dtype() != DType::kFloat32 ||
        (narrow->dtype() != DType::kFloat16 && narrow->dtype() != DType::kBFloat16) ||
        wide->is_graph_output()) {
      continue;
    }
    std::vector<Use> backward_uses;
    int first = static_cast<int>(order.size());
    bool implicit = false;
    for (const Use& use : wide->uses()) {
      implicit |= use.index < 0;
      const int at = position.at(use.node);
      if (at < first_backward) continue;
      backward_uses.push_back(use);
      first = std::min(first, at);
    }
    if (backward_uses.empty() || implicit) continue;
    CASTOR_ASSIGN_OR_RETURN(Node * recast,
                            graph.AddNode("Cast", {narrow},
                                          {graph.UniqueName(wide->name() + "/recast")},
                                          graph.UniqueName(cast->name() + "/recast")));
    for (const Attribute& attribute : cast->attributes()) recast->SetAttribute(attribute);
    for (const Use& use : backward_uses) use.node->SetInput(use.index, recast->output(0));
    insert_before.emplace(first, recast);
  }
  if (insert_before.empty()) return 0;
  std::vector<Node*> new_order;
  new_order.reserve(order.size() + insert_before.size());
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    auto [begin, end] = insert_before.equal_range(i);
    for (auto it = begin; it != end; ++it) new_order.push_back(it->second);
    new_order.push_back(order[i]);
  }
  CASTOR_RETURN_IF_ERROR(graph.ReorderNodes(std::move(new_order)));
  return static_cast<int>(insert_before.size());
}

// The model forward only with the loss attached: outputs loss, model output.
absl::StatusOr<std::shared_ptr<const Model>> BuildEvaluationGraph(const Model& model,
                                                                   const std::string& output,
                                                                   LossKind loss_kind,
                                                                   std::optional<int64_t> ignore_index,
                                                                   bool pool_before_relu) {
  CASTOR_ASSIGN_OR_RETURN(Model evaluation, CloneModel(model));
  Graph& graph = *evaluation.graph;
  CASTOR_RETURN_IF_ERROR(SwitchToInferenceMode(graph));
  CASTOR_RETURN_IF_ERROR(InferTypes(evaluation));
  if (pool_before_relu) CASTOR_RETURN_IF_ERROR(PoolBeforeRelu(graph).status());
  Value* prediction = graph.FindValue(output);
  CASTOR_ASSIGN_OR_RETURN(Value * loss, AttachLoss(evaluation, prediction, loss_kind, ignore_index));
  graph.ClearOutputs();
  graph.AddOutput(loss);
  graph.AddOutput(prediction);
  CASTOR_RETURN_IF_ERROR(InferTypes(evaluation));
  return std::make_shared<const Model>(std::move(evaluation));
}

}  // namespace

absl::StatusOr<LossKind> ParseLossKind(const std::string& name) {
  if (name == "cross-entropy" || name == "softmax-cross-entropy" || name == "sce") {
    return LossKind::kSoftmaxCrossEntropy;
  }
  if (name == "mse") return LossKind::kMeanSquaredError;
  if (name == "bce") return LossKind::kBinaryCrossEntropy;
  if (name == "output") return LossKind::kModelOutput;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown loss '", name, "'; expected cross-entropy, mse, bce or output"));
}

namespace {

// What the training passes hand on to one another.
struct TrainingPassState {
  TrainingGraphOptions options;
  TrainingGraph* result = nullptr;
  std::string loss;        // the loss value
  int first_backward = 0;  // the first node autodiff added
};

using State = std::shared_ptr<TrainingPassState>;

// The model output the loss is attached to, and the evaluation graph.
absl::Status EvaluationGraphStep(Model& model, TrainingPassState& state) {
  Graph& graph = *model.graph;
  Value* output = nullptr;
  std::vector<std::string> output_names;
  for (Value* candidate : graph.outputs()) {
    output_names.push_back(candidate->name());
    if (candidate->name() == state.options.output) output = candidate;
  }
  if (output == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--output ", Quoted(state.options.output),
                                                   " is not a model output; the outputs are: ",
                                                   absl::StrJoin(output_names, ", ")));
  }
  TrainingGraph& result = *state.result;
  result.model_output = output->name();
  result.loss = state.options.loss;
  result.ignore_index = state.options.ignore_index;
  CASTOR_ASSIGN_OR_RETURN(result.evaluation,
                          BuildEvaluationGraph(model, output->name(), state.options.loss,
                                               state.options.ignore_index,
                                               state.options.pool_before_relu));
  return absl::OkStatus();
}

absl::Status BatchNormTrainingStep(Model& model, TrainingPassState& state) {
  CASTOR_ASSIGN_OR_RETURN(state.result->running_stats, SwitchBatchNormToTraining(model));
  // The new statistics outputs get their types (the final inference of
  // attach-loss would give them the same).
  if (!state.result->running_stats.empty()) CASTOR_RETURN_IF_ERROR(InferTypes(model));
  return absl::OkStatus();
}

// Whether a Dropout draws in the training graph: opset 12 or later with a
// training_mode input that holds true (an initializer, graph input or not,
// or a Constant). A training_mode only the run knows is refused by name.
absl::StatusOr<bool> DropoutDraws(const Node& node, int64_t opset) {
  if (opset < 12 || node.input(2) == nullptr) return false;
  const Value* mode = node.input(2);
  const Tensor* value = mode->initializer();
  if (value == nullptr && mode->producer() != nullptr &&
      mode->producer()->op_type() == "Constant" && mode->producer()->domain().empty()) {
    const Attribute* attribute = mode->producer()->attribute("value");
    if (attribute != nullptr && attribute->kind == AttrKind::kTensor) value = &attribute->t;
  }
  if (value == nullptr || value->num_elements() != 1) {
    return absl::UnimplementedError(absl::StrCat(
        "Dropout node ", Quoted(node.name()), ": training_mode (", Quoted(mode->name()),
        ") is not a constant scalar; castor's training graph needs to know whether it draws"));
  }
  return value->GetInt64(0) != 0;
}

// Every Dropout that draws becomes castor's DropoutTraining (com.castor,
// graph/ops/misc.cc) reading the RNG state castor.rng as its input 2: the
// same data and ratio, the node's name (its masks' stream) and output
// names, and always a mask output (castor's naming where the model has
// none), the one its gradient reads. ONNX's Dropout keeps ONNX's inputs.
absl::Status DropoutRngStep(Model& model, TrainingPassState& state) {
  const int64_t opset = model.OpsetVersion("");
  if (opset < 12) return absl::OkStatus();
  Graph& graph = *model.graph;
  Value* rng = nullptr;
  int dropouts = 0;
  const std::vector<Node*> nodes = graph.nodes();
  for (Node* node : nodes) {
    if (!node->domain().empty() || node->op_type() != "Dropout") continue;
    CASTOR_ASSIGN_OR_RETURN(const bool draws, DropoutDraws(*node, opset));
    if (!draws) continue;
    if (rng == nullptr) {
      CASTOR_ASSIGN_OR_RETURN(rng, graph.AddInput(kRngStateInput, DType::kInt64, Shape({Dim(2)})));
      Tensor initial(DType::kInt64, {2});
      initial.data<int64_t>()[0] = 0;
      initial.data<int64_t>()[1] = 0;
      graph.SetInitializerOfInput(rng, std::move(initial));
    }
    const std::string name = node->name();
    std::vector<std::string> output_names;
    std::vector<std::string> final_names;
    for (int i = 0; i < 2; ++i) {
      const Value* old = node->output(i);
      final_names.push_back(old != nullptr ? old->name()
                                           : graph.UniqueName(node->output(0)->name() + "/mask"));
      output_names.push_back(graph.UniqueName(final_names.back() + "/training"));
    }
    CASTOR_ASSIGN_OR_RETURN(
        Node * training,
        graph.AddNode("DropoutTraining", {node->input(0), node->input(1), rng}, output_names,
                      graph.UniqueName(name + "/training"), kCastorDomain));
    for (const auto& [key, value] : node->metadata()) training->SetMetadata(key, value);
    for (int i = 0; i < node->num_outputs(); ++i) {
      if (node->output(i) == nullptr) continue;
      graph.ReplaceAllUsesWith(node->output(i), training->output(i));
    }
    CASTOR_RETURN_IF_ERROR(graph.RemoveNode(node));
    // The model's names again: the node's name keys its masks.
    training->set_name(name);
    for (int i = 0; i < 2; ++i) {
      CASTOR_RETURN_IF_ERROR(graph.RenameValue(training->output(i), final_names[i]));
    }
    ++dropouts;
  }
  state.result->rng_dropouts = dropouts;
  if (dropouts > 0) {
    if (model.OpsetVersion(kCastorDomain) == 0) model.opset_imports.push_back({kCastorDomain, 1});
    CASTOR_RETURN_IF_ERROR(graph.TopologicalSort());
    CASTOR_RETURN_IF_ERROR(InferTypes(model));
  }
  return absl::OkStatus();
}

// The loss, the loss scale the backward pass is seeded with, and the RNG
// state of every Dropout that draws.
absl::Status AttachLossStep(Model& model, TrainingPassState& state) {
  CASTOR_RETURN_IF_ERROR(DropoutRngStep(model, state));
  Graph& graph = *model.graph;
  Value* output = graph.FindValue(state.result->model_output);
  CASTOR_ASSIGN_OR_RETURN(Value * loss, AttachLoss(model, output, state.options.loss,
                                                   state.options.ignore_index));
  state.loss = loss->name();
  CASTOR_ASSIGN_OR_RETURN(Value * scale,
                          graph.AddInput(kLossScaleInput, DType::kFloat32, Shape::Scalar()));
  graph.SetInitializerOfInput(scale, Tensor::Scalar(1.0f));
  return InferTypes(model);
}

// Fine-tuning: takes the parameters `options.freeze` matches, or
// `options.train_only` does not, out of `request` into `frozen`. Only
// initializers that would train count (a Dropout ratio, a weight with no
// path to the loss is no parameter, frozen or not): with a pattern given,
// autodiff runs once on a copy to learn which those are.
absl::Status LeaveOutFrozen(const Model& model, const TrainingGraphOptions& options,
                            AutodiffRequest& request, std::vector<std::string>& frozen) {
  if (options.freeze.empty() && options.train_only.empty()) return absl::OkStatus();
  auto compile = [](const std::string& flag,
                    const std::string& pattern) -> absl::StatusOr<std::optional<std::regex>> {
    if (pattern.empty()) return std::optional<std::regex>();
    absl::StatusOr<std::regex> regex = CompileUserRegex(pattern);
    if (!regex.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", Quoted(pattern),
                                                     " is not a valid regular expression: ",
                                                     regex.status().message()));
    }
    return std::optional<std::regex>(*std::move(regex));
  };
  CASTOR_ASSIGN_OR_RETURN(const std::optional<std::regex> freeze,
                          compile("--freeze", options.freeze));
  CASTOR_ASSIGN_OR_RETURN(const std::optional<std::regex> train_only,
                          compile("--train-only", options.train_only));
  std::vector<std::string> trainable;  // what would train without the patterns
  {
    CASTOR_ASSIGN_OR_RETURN(Model copy, CloneModel(model));
    CASTOR_RETURN_IF_ERROR(InferTypes(copy));  // a clone carries no inferred types
    CASTOR_ASSIGN_OR_RETURN(AutodiffResult all, BuildGradients(copy, request));
    for (const auto& [parameter, gradient] : all.gradients) trainable.push_back(parameter);
  }
  auto examples = [&]() {
    std::vector<std::string> some(trainable.begin(),
                                  trainable.begin() + std::min<size_t>(trainable.size(), 8));
    return absl::StrCat(absl::StrJoin(some, ", "), trainable.size() > some.size() ? ", ..." : "");
  };
  int freeze_matches = 0, train_only_matches = 0;
  absl::flat_hash_set<std::string> fixed;
  for (const std::string& name : trainable) {
    const bool frozen_by_freeze = freeze.has_value() && std::regex_search(name, *freeze);
    const bool kept_by_train_only = train_only.has_value() && std::regex_search(name, *train_only);
    freeze_matches += frozen_by_freeze;
    train_only_matches += kept_by_train_only;
    if (frozen_by_freeze || (train_only.has_value() && !kept_by_train_only)) fixed.insert(name);
  }
  for (const auto& [flag, pattern, matches] :
       {std::tuple{"--freeze", &options.freeze, freeze_matches},
        std::tuple{"--train-only", &options.train_only, train_only_matches}}) {
    if (!pattern->empty() && matches == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " ", Quoted(*pattern), " matches none of the model's ", trainable.size(),
          " parameters (", examples(), "); the pattern is searched for in each name"));
    }
  }
  if (fixed.size() == trainable.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--freeze ", Quoted(options.freeze), " / --train-only ", Quoted(options.train_only),
        " leave none of the model's ", trainable.size(), " parameters to train"));
  }
  std::vector<std::string> kept;
  for (const std::string& name : request.parameters) {
    if (fixed.contains(name)) {
      frozen.push_back(name);
    } else {
      kept.push_back(name);
    }
  }
  request.parameters = std::move(kept);
  return absl::OkStatus();
}

// The gradient of every float32 parameter (BatchNormalization statistics
// excepted, and those fine-tuning freezes), float32 values re-widened for
// the backward pass.
absl::Status AutodiffStep(Model& model, TrainingPassState& state) {
  Graph& graph = *model.graph;
  TrainingGraph& result = *state.result;
  absl::flat_hash_set<std::string> state_names;
  for (const auto& [stat, updated] : result.running_stats) state_names.insert(stat);
  AutodiffRequest request;
  request.loss = state.loss;
  request.loss_seed = kLossScaleInput;
  request.skip_unreached = true;  // settings and unused branches are no parameters
  for (const Value* initializer : graph.initializers()) {
    if (initializer->dtype() != DType::kFloat32 || initializer->is_graph_input() ||
        initializer->uses().empty() || state_names.contains(initializer->name())) {
      continue;
    }
    request.parameters.push_back(initializer->name());
  }
  if (request.parameters.empty()) {
    return absl::InvalidArgumentError("the model has no float32 initializers to train");
  }
  CASTOR_RETURN_IF_ERROR(LeaveOutFrozen(model, state.options, request, result.frozen));
  const int first_backward = graph.num_nodes();
  CASTOR_ASSIGN_OR_RETURN(AutodiffResult gradients, BuildGradients(model, request));
  if (gradients.gradients.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "none of the model's float32 initializers has a differentiable path to the loss (",
        absl::StrJoin(gradients.unreached, ", "), ")"));
  }
  result.gradients = gradients.gradients;
  result.backward_nodes = gradients.backward_nodes;
  CASTOR_ASSIGN_OR_RETURN(result.backward_recasts,
                          RecastWidenedValuesForBackward(graph, first_backward));
  result.backward_nodes += result.backward_recasts;
  if (result.backward_recasts > 0) CASTOR_RETURN_IF_ERROR(InferTypes(model));
  return absl::OkStatus();
}

// The step's outputs: loss, model output, one buffer per gradient, the new
// BatchNormalization statistics.
absl::Status StepOutputsStep(Model& model, TrainingPassState& state) {
  Graph& graph = *model.graph;
  TrainingGraph& result = *state.result;
  Value* loss = graph.FindValue(state.loss);
  Value* output = graph.FindValue(result.model_output);
  graph.ClearOutputs();
  graph.AddOutput(loss);
  graph.AddOutput(output);
  // Each gradient output gets a buffer of its own: the trainer unscales the
  // gradients in place, so one value serving two parameters (Add(b1, b2)
  // passes its gradient to both), an output already listed, or a graph
  // input or initializer (the loss-scale seed itself) is copied first.
  absl::flat_hash_set<const Value*> taken = {loss, output};
  bool copied = false;
  for (auto& [parameter, gradient] : result.gradients) {
    Value* value = graph.FindValue(gradient);
    if (taken.contains(value) || value->is_graph_input() || value->initializer() != nullptr) {
      CASTOR_ASSIGN_OR_RETURN(
          Node * copy, graph.AddNode("Identity", {value}, {parameter + "/grad/own"},
                                     parameter + "/grad/own_copy"));
      value = copy->output(0);
      gradient = value->name();
      copied = true;
    }
    taken.insert(value);
    graph.AddOutput(value);
  }
  for (const auto& [stat, updated] : result.running_stats) {
    graph.AddOutput(graph.FindValue(updated));
  }
  if (copied) CASTOR_RETURN_IF_ERROR(InferTypes(model));
  return absl::OkStatus();
}

void AddStep(PassManager& manager, const State& state, const char* name, const char* description,
             absl::Status (*step)(Model&, TrainingPassState&)) {
  manager.Add(std::make_unique<FunctionPass>(
      name, description,
      [state, step](Model& model, PassContext&) { return step(model, *state); }));
}

// A rewrite that returns how many places it changed, as a pass that
// records the count in the result's `count`.
void AddCountedRewrite(PassManager& manager, const State& state, const char* name,
                       const char* description, int TrainingGraph::*count,
                       std::function<absl::StatusOr<int>(Model&)> rewrite) {
  manager.Add(std::make_unique<FunctionPass>(
      name, description,
      [state, count, rewrite = std::move(rewrite)](Model& model, PassContext&) -> absl::Status {
        CASTOR_ASSIGN_OR_RETURN(state->result->*count, rewrite(model));
        return absl::OkStatus();
      }));
}

}  // namespace

void AddTrainingPasses(PassManager& manager, const TrainingGraphOptions& options,
                       TrainingGraph* result) {
  auto state = std::make_shared<TrainingPassState>();
  state->options = options;
  state->result = result;
  AddStep(manager, state, "evaluation-graph",
          "builds the forward-only evaluation graph (loss attached, BatchNormalization on its "
          "running statistics) beside the model; the model is unchanged",
          EvaluationGraphStep);
  AddStep(manager, state, "batchnorm-training",
          "replaces every BatchNormalization (any opset, any form) by castor's "
          "BatchNormalizationTraining (com.castor): batch statistics, running-statistic "
          "outputs updated with the node's momentum, the variance unbiased as PyTorch's",
          BatchNormTrainingStep);
  if (options.pool_before_relu) {
    AddCountedRewrite(manager, state, "pool-before-relu",
                      "runs a Relu read only by a MaxPool after it, on the pooled tensor",
                      &TrainingGraph::pooled_relus,
                      [](Model& model) { return PoolBeforeRelu(*model.graph); });
  }
  if (options.fold_batchnorm_casts) {
    AddCountedRewrite(
        manager, state, "fold-batchnorm-casts",
        "folds the Casts from 16-bit to float32 and back around a BatchNormalization into it "
        "(it reads and writes the 16-bit values, computing in float32 as before)",
        &TrainingGraph::folded_batchnorm_casts,
        [](Model& model) { return FoldBatchNormCasts(*model.graph); });
  }
  if (options.fold_layernorm_casts) {
    AddCountedRewrite(
        manager, state, "fold-layernorm-casts",
        "folds the Casts from 16-bit to float32 and back around a LayerNormalization into it "
        "(castor's LayerNormalization reads and writes the 16-bit values with float32 Scale and "
        "B, computing in float32 as before)",
        &TrainingGraph::folded_layernorm_casts, FoldLayerNormCasts);
  }
  if (options.fuse_batchnorm_relu) {
    AddCountedRewrite(
        manager, state, "fuse-batchnorm-relu",
        "has a BatchNormalization apply the Relu that alone reads its output as it writes it "
        "(the same values, one pass over the tensor less)",
        &TrainingGraph::fused_batchnorm_relus,
        [](Model& model) { return FuseBatchNormRelu(*model.graph); });
  }
  if (options.fuse_gelu) {
    AddCountedRewrite(
        manager, state, "fuse-gelu",
        "runs the erf form of GELU that exporters write before opset 20 (Div, Erf, Add, two "
        "Muls) as castor's Gelu: one node forward and one GeluGrad backward, in float32",
        &TrainingGraph::fused_gelus, FuseGelu);
  }
  AddStep(manager, state, "attach-loss",
          "attaches the loss to the model output and adds the loss-scale input",
          AttachLossStep);
  AddStep(manager, state, "autodiff",
          "builds the backward graph seeded with the loss scale; float32 values widened from "
          "16-bit ones are widened again for their backward readers",
          AutodiffStep);
  AddStep(manager, state, "step-outputs",
          "makes the outputs the step kernels read: loss, model output, one buffer per "
          "parameter gradient, the new BatchNormalization statistics",
          StepOutputsStep);
}

absl::StatusOr<TrainingGraph> BuildTrainingGraph(Model& model,
                                                 const TrainingGraphOptions& options,
                                                 const PassManagerOptions& manager_options) {
  TrainingGraph result;
  PassManager manager(manager_options);
  AddTrainingPasses(manager, options, &result);
  PassContext context;
  CASTOR_RETURN_IF_ERROR(manager.Run(model, context));
  return result;
}

}  // namespace castor
