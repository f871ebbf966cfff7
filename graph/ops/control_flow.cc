// If and Loop: the ops whose attributes hold subgraphs (bodies). castor keeps
// each body as a serialized GraphProto (graph/attribute.h) and the outer
// values it reads as the node's implicit inputs (graph/graph.h). To type the
// node's outputs, a body is imported as a standalone model whose graph
// inputs are the body's own inputs (typed from the node's inputs) followed
// by the outer values it reads (typed from the outer graph), and castor's
// whole-graph inference runs over it: so body types are inferred, and a
// body's declared types are checked, exactly as in a main graph. Nested
// bodies recurse through the same rules.
//
// Opset history: If and Loop exist from opset 1; later versions relax
// branch-shape rules (If-11), widen the element types and add sequence and
// optional values, which castor's import refuses with its own message
// (tensor types only), so one definition covers every supported opset.
#include <algorithm>
#include <climits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "graph/onnx_io.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/shape_inference.h"
#include "graph/status.h"

namespace castor {
namespace {

// A value's type as a body sees it or produces it.
struct BodyType {
  DType dtype = DType::kUndefined;
  Shape shape;
};

// The most specific shape that both `a` and `b` fit: equal dims are kept,
// differing dims become unknown, differing ranks give an unknown rank.
Shape JoinShapes(const Shape& a, const Shape& b) {
  if (a == b) return a;
  if (!a.rank_known() || !b.rank_known() || a.rank() != b.rank()) return Shape::Unknown();
  std::vector<Dim> dims;
  for (int i = 0; i < a.rank(); ++i) dims.push_back(a[i] == b[i] ? a[i] : Dim::Unknown());
  return Shape(std::move(dims));
}

// True when every tensor of shape `inner` also fits `outer`.
bool ShapeCovers(const Shape& outer, const Shape& inner) {
  if (!outer.rank_known()) return true;
  if (!inner.rank_known() || inner.rank() != outer.rank()) return false;
  for (int i = 0; i < outer.rank(); ++i) {
    if (!outer[i].is_unknown() && outer[i] != inner[i]) return false;
  }
  return true;
}

// Checks input `i` (when given and its shape is static) holds one element.
absl::Status RequireSingleElement(const InferenceContext& ctx, int i, const char* what) {
  if (!ctx.has_input(i)) return absl::OkStatus();
  const std::optional<int64_t> elements = ctx.input_shape(i).NumElements();
  if (elements.has_value() && *elements != 1) {
    return ctx.Error(absl::StrCat("input ", i, " (", what, ") must hold a single element; got "
                                  "shape ",
                                  ctx.input_shape(i).ToString()));
  }
  return absl::OkStatus();
}

// A small integer constant (an initializer that is not an overridable input,
// or a Constant's value): copied into a body model so shape values (a
// Reshape target read from outside the body) stay known there.
const Tensor* SmallIntegerConstant(const Value& value) {
  const Tensor* tensor = nullptr;
  if (value.initializer() && !value.is_graph_input()) {
    tensor = value.initializer();
  } else if (const Node* producer = value.producer();
             producer && producer->op_type() == "Constant" && producer->domain().empty()) {
    const Attribute* attribute = producer->attribute("value");
    if (attribute && attribute->kind == AttrKind::kTensor) tensor = &attribute->t;
  }
  constexpr int64_t kMaxCopiedElements = 64;
  if (tensor == nullptr ||
      (tensor->dtype() != DType::kInt64 && tensor->dtype() != DType::kInt32) ||
      tensor->num_elements() > kMaxCopiedElements) {
    return nullptr;
  }
  return tensor;
}

// "<Op> node '<name>': attribute '<attr>': <message>", keeping the code.
absl::Status BodyError(const InferenceContext& ctx, const std::string& attribute,
                       const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(ctx.node().op_type(), " node '", ctx.node().name(),
                                   "': attribute '", attribute, "': ",
                                   std::string(status.message())));
}

// The graph held by attribute `name`, parsed.
absl::StatusOr<onnx::GraphProto> ParseBody(const InferenceContext& ctx, const std::string& name) {
  const Attribute* attribute = ctx.node().attribute(name);
  if (attribute == nullptr) return ctx.Error(absl::StrCat("attribute '", name, "' is required"));
  if (attribute->kind != AttrKind::kGraph || attribute->serialized.size() != 1) {
    return ctx.Error(absl::StrCat("attribute '", name, "' must be a graph; got a ",
                                  AttrKindName(attribute->kind)));
  }
  onnx::GraphProto body;
  if (!body.ParseFromString(attribute->serialized[0])) {
    return ctx.Error(absl::StrCat("attribute '", name, "' is not a valid serialized GraphProto"));
  }
  return body;
}

// Infers the types of `body`'s outputs. `formal_inputs` type the body's own
// inputs, in order (kUndefined / unknown rank: take what the body declares;
// a declared dtype must agree and a declared shape must be compatible).
absl::StatusOr<std::vector<BodyType>> InferBody(const InferenceContext& ctx,
                                                const std::string& attribute,
                                                const onnx::GraphProto& body,
                                                const std::vector<BodyType>& formal_inputs) {
  onnx::ModelProto proto;
  proto.set_ir_version(8);  // import does not depend on it
  onnx::OperatorSetIdProto* onnx_opset = proto.add_opset_import();
  onnx_opset->set_version(ctx.opset());
  onnx::OperatorSetIdProto* training_opset = proto.add_opset_import();
  training_opset->set_domain(kTrainingDomain);
  training_opset->set_version(1);
  onnx::GraphProto* graph = proto.mutable_graph();
  *graph = body;

  // The outer values the body reads become inputs of the body model (small
  // integer constants become initializers, so their values stay known).
  absl::flat_hash_set<std::string> defined;
  for (const onnx::ValueInfoProto& input : body.input()) defined.insert(input.name());
  for (const onnx::TensorProto& init : body.initializer()) defined.insert(init.name());
  for (const onnx::NodeProto& node : body.node()) {
    for (const std::string& output : node.output()) defined.insert(output);
  }
  std::vector<const Value*> outer_values;
  for (const Value* value : ctx.node().implicit_inputs()) {
    if (defined.contains(value->name())) continue;
    if (const Tensor* constant = SmallIntegerConstant(*value)) {
      *graph->add_initializer() = TensorToProto(*constant, value->name());
      continue;
    }
    graph->add_input()->set_name(value->name());  // typed below
    outer_values.push_back(value);
  }

  absl::StatusOr<Model> model = ImportModel(proto, "", "the body");
  if (!model.ok()) return BodyError(ctx, attribute, model.status());
  Graph& body_graph = *model->graph;
  for (size_t k = 0; k < formal_inputs.size(); ++k) {
    Value* input = body_graph.inputs()[k];
    const BodyType& given = formal_inputs[k];
    const std::string what = absl::StrCat("body input ", k, " '", input->name(), "'");
    if (given.dtype != DType::kUndefined) {
      if (input->dtype() != DType::kUndefined && input->dtype() != given.dtype) {
        return ctx.Error(absl::StrCat("attribute '", attribute, "': ", what, " is declared ",
                                      DTypeName(input->dtype()), " but the node gives it ",
                                      DTypeName(given.dtype)));
      }
      input->set_dtype(given.dtype);
    }
    Shape merged;
    absl::Status shape_ok = MergeShape(input->shape(), given.shape, what, &merged);
    if (!shape_ok.ok()) return BodyError(ctx, attribute, shape_ok);
    input->set_shape(std::move(merged));
  }
  for (const Value* outer : outer_values) {
    Value* input = body_graph.FindValue(outer->name());
    input->set_dtype(outer->dtype());
    input->set_shape(outer->shape());
  }

  absl::Status inferred = InferTypes(*model);
  if (!inferred.ok()) return BodyError(ctx, attribute, inferred);
  std::vector<BodyType> outputs;
  for (const Value* output : body_graph.outputs()) {
    if (output->dtype() == DType::kUndefined) {
      return ctx.Error(absl::StrCat("attribute '", attribute, "': body output '",
                                    output->name(), "' has no dtype (declare its type)"));
    }
    outputs.push_back(BodyType{output->dtype(), output->shape()});
  }
  return outputs;
}

// ---- If ----------------------------------------------------------------------

absl::Status InferIf(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, {DType::kBool}));
  CASTOR_RETURN_IF_ERROR(RequireSingleElement(ctx, 0, "cond"));
  CASTOR_ASSIGN_OR_RETURN(const onnx::GraphProto then_branch, ParseBody(ctx, "then_branch"));
  CASTOR_ASSIGN_OR_RETURN(const onnx::GraphProto else_branch, ParseBody(ctx, "else_branch"));
  for (const onnx::GraphProto* branch : {&then_branch, &else_branch}) {
    if (branch->input_size() != 0) {
      return ctx.Error(absl::StrCat("attribute '",
                                    branch == &then_branch ? "then_branch" : "else_branch",
                                    "' declares ", branch->input_size(),
                                    " input(s); If branches take none (they read outer values "
                                    "by name)"));
    }
  }
  if (then_branch.output_size() != else_branch.output_size()) {
    return ctx.Error(absl::StrCat("then_branch has ", then_branch.output_size(),
                                  " output(s) but else_branch has ", else_branch.output_size(),
                                  "; both must give one per If output"));
  }
  // Trailing omitted ("") node outputs are dropped at import, so the node
  // may have fewer outputs than its branches, never more.
  if (ctx.num_outputs() > then_branch.output_size()) {
    return ctx.Error(absl::StrCat("the node has ", ctx.num_outputs(),
                                  " outputs but its branches give ", then_branch.output_size()));
  }
  CASTOR_ASSIGN_OR_RETURN(const std::vector<BodyType> then_types,
                          InferBody(ctx, "then_branch", then_branch, {}));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<BodyType> else_types,
                          InferBody(ctx, "else_branch", else_branch, {}));
  for (int i = 0; i < ctx.num_outputs(); ++i) {
    const BodyType& then_type = then_types[i];
    const BodyType& else_type = else_types[i];
    if (then_type.dtype != else_type.dtype) {
      return ctx.Error(absl::StrCat(
          "output ", i, ": then_branch output '", then_branch.output(i).name(), "' is ",
          DTypeName(then_type.dtype), " but else_branch output '", else_branch.output(i).name(),
          "' is ", DTypeName(else_type.dtype), "; the branches must agree on each dtype"));
    }
    ctx.SetOutput(i, then_type.dtype, JoinShapes(then_type.shape, else_type.shape));
  }
  return absl::OkStatus();
}

// ---- Loop --------------------------------------------------------------------

// Inputs: M (int64 trip count, optional), cond (bool, optional), then the N
// initial loop-carried values. Body: (iteration_num, cond, N carried) ->
// (cond, N carried, K scan outputs). Node outputs: N final carried values,
// then K scan outputs with a leading iteration dim.
absl::Status InferLoop(InferenceContext& ctx) {
  if (ctx.has_input(0)) {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, {DType::kInt64}));
    CASTOR_RETURN_IF_ERROR(RequireSingleElement(ctx, 0, "M, the trip count"));
  }
  if (ctx.has_input(1)) {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kBool}));
    CASTOR_RETURN_IF_ERROR(RequireSingleElement(ctx, 1, "cond"));
  }
  const int num_carried = std::max(0, ctx.num_inputs() - 2);
  for (int i = 2; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) {
      return ctx.Error(absl::StrCat("loop-carried input ", i, " is missing; only M and cond "
                                    "may be omitted"));
    }
  }
  CASTOR_ASSIGN_OR_RETURN(const onnx::GraphProto body, ParseBody(ctx, "body"));
  if (body.input_size() != num_carried + 2) {
    return ctx.Error(absl::StrCat(
        "attribute 'body' has ", body.input_size(), " input(s); expected ", num_carried + 2,
        " (iteration_num, cond, then one per loop-carried value: the node has ", num_carried,
        ")"));
  }
  if (body.output_size() < num_carried + 1) {
    return ctx.Error(absl::StrCat(
        "attribute 'body' has ", body.output_size(), " output(s); expected at least ",
        num_carried + 1, " (cond, then one per loop-carried value: the node has ", num_carried,
        "; then any scan outputs)"));
  }
  const int num_scan = body.output_size() - 1 - num_carried;
  if (ctx.num_outputs() > num_carried + num_scan) {
    return ctx.Error(absl::StrCat("the node has ", ctx.num_outputs(), " outputs but its body "
                                  "gives ",
                                  num_carried, " loop-carried value(s) and ", num_scan,
                                  " scan output(s)"));
  }

  // The body's inputs. A carried value's shape may change between
  // iterations: the body is inferred again with the shapes widened to cover
  // what it returned until they settle, finally with unknown ranks.
  std::vector<BodyType> formal(2 + num_carried);
  formal[0] = BodyType{DType::kInt64, Shape::Unknown()};
  formal[1] = BodyType{DType::kBool, ctx.has_input(1) ? ctx.input_shape(1) : Shape::Unknown()};
  for (int i = 0; i < num_carried; ++i) {
    formal[2 + i] = BodyType{ctx.input_dtype(2 + i), ctx.input_shape(2 + i)};
  }
  constexpr int kMaxPasses = 4;
  std::vector<BodyType> results;
  for (int pass = 0; pass < kMaxPasses; ++pass) {
    CASTOR_ASSIGN_OR_RETURN(results, InferBody(ctx, "body", body, formal));
    if (results[0].dtype != DType::kBool) {
      return ctx.Error(absl::StrCat("body output 0 '", body.output(0).name(),
                                    "' (the loop condition) is ", DTypeName(results[0].dtype),
                                    "; expected bool"));
    }
    bool settled = true;
    for (int i = 0; i < num_carried; ++i) {
      const BodyType& result = results[1 + i];
      BodyType& carried = formal[2 + i];
      if (result.dtype != carried.dtype) {
        return ctx.Error(absl::StrCat(
            "body output ", 1 + i, " '", body.output(1 + i).name(), "' is ",
            DTypeName(result.dtype), " but loop-carried input ", 2 + i, " '",
            ctx.node().input(2 + i)->name(), "' is ", DTypeName(carried.dtype),
            "; a loop-carried value keeps its dtype"));
      }
      if (!ShapeCovers(carried.shape, result.shape)) {
        settled = false;
        carried.shape =
            pass + 2 < kMaxPasses ? JoinShapes(carried.shape, result.shape) : Shape::Unknown();
      }
    }
    if (settled) break;
  }
  for (int i = 0; i < ctx.num_outputs(); ++i) {
    const BodyType& result = results[1 + i];
    if (i < num_carried) {
      // The final value is the initial one (no iteration) or a body result.
      ctx.SetOutput(i, result.dtype, JoinShapes(ctx.input_shape(2 + i), result.shape));
    } else if (result.shape.rank_known()) {
      std::vector<Dim> dims = {Dim::Unknown()};
      dims.insert(dims.end(), result.shape.dims().begin(), result.shape.dims().end());
      ctx.SetOutput(i, result.dtype, Shape(std::move(dims)));
    } else {
      ctx.SetOutput(i, result.dtype, Shape::Unknown());
    }
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterControlFlowOps(OpRegistry& registry) {
  OpDef if_def = ops::MakeDef("If", 1, 1, 1,
                              {{"then_branch", AttrKind::kGraph, /*required=*/true},
                               {"else_branch", AttrKind::kGraph, /*required=*/true}},
                              InferIf,
                              "Runs then_branch or else_branch by a bool condition; outputs are "
                              "the chosen branch's outputs.");
  if_def.max_outputs = INT_MAX;
  registry.Register(std::move(if_def));
  // M and cond are optional but positional (""), so no input is required.
  OpDef loop_def = ops::MakeDef("Loop", 1, 0, INT_MAX,
                                {{"body", AttrKind::kGraph, /*required=*/true}}, InferLoop,
                                "Runs body while cond holds and fewer than M iterations ran; "
                                "outputs the final loop-carried values, then the scan outputs "
                                "stacked per iteration.");
  loop_def.max_outputs = INT_MAX;
  registry.Register(std::move(loop_def));
}

}  // namespace castor
