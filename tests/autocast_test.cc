// Tests for passes/autocast.h: one structure test per rule of the pass on
// small hand-built graphs (allow, deny, follow painting and promotion, the
// contextual float32 rules, shared weight and activation Casts, model Casts
// respected, opset refusals, pins and overrides), the policy record
// (idempotence, refusal naming both policies, restart from float32,
// StripAutocast), provenance surviving an export/import, and the structural
// invariants (no Cast to the same type, no chain, no orphan, one Cast per
// value and dtype, float32 masters and outputs) on every sample model under
// both mixed policies.
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"
#include "passes/autocast.h"
#include "passes/verifier.h"

namespace castor {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

template <typename T>
T ValueOrDie(absl::StatusOr<T> result) {
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) std::abort();
  return *std::move(result);
}

Policy BuiltinPolicy(const std::string& name) { return ValueOrDie(Policy::Builtin(name)); }

// Builds small float32 models: inputs, weights (initializers), Constant
// nodes, op nodes and outputs by value name.
class ModelBuilder {
 public:
  explicit ModelBuilder(int64_t opset = 17) { model_.opset_imports = {{"", opset}}; }

  ModelBuilder& Input(const std::string& name, std::vector<int64_t> dims) {
    ValueOrDie(graph().AddInput(name, DType::kFloat32, Shape::FromDims(dims)));
    return *this;
  }
  ModelBuilder& Weight(const std::string& name, std::vector<int64_t> dims) {
    Tensor tensor(DType::kFloat32, dims);
    for (int64_t i = 0; i < tensor.num_elements(); ++i) tensor.data<float>()[i] = 0.01f * i;
    ValueOrDie(graph().AddInitializer(name, std::move(tensor)));
    return *this;
  }
  ModelBuilder& Constant(const std::string& name, float value) {
    Node* node = ValueOrDie(graph().AddNode("Constant", {}, {name}, name + "_node"));
    node->SetAttribute(Attribute::TensorValue("value", Tensor::Scalar(value)));
    return *this;
  }
  ModelBuilder& Op(const std::string& op_type, const std::vector<std::string>& inputs,
                   const std::string& output, std::vector<Attribute> attributes = {}) {
    std::vector<Value*> values;
    for (const std::string& name : inputs) {
      Value* value = graph().FindValue(name);
      EXPECT_NE(value, nullptr) << name;
      values.push_back(value);
    }
    Node* node = ValueOrDie(graph().AddNode(op_type, values, {output}, output));
    for (Attribute& attribute : attributes) node->SetAttribute(std::move(attribute));
    return *this;
  }
  ModelBuilder& Output(const std::string& name) {
    graph().AddOutput(graph().FindValue(name));
    return *this;
  }
  Model Build() {
    absl::Status inferred = InferTypes(model_);
    EXPECT_TRUE(inferred.ok()) << inferred;
    return std::move(model_);
  }

 private:
  Graph& graph() { return *model_.graph; }
  Model model_;
};

const Node& NodeNamed(const Model& model, const std::string& name) {
  for (const Node* node : model.graph->nodes()) {
    if (node->name() == name) return *node;
  }
  ADD_FAILURE() << "no node " << name;
  std::abort();
}

std::string RecordedDType(const Model& model, const std::string& node) {
  return ReadAutocastRecord(NodeNamed(model, node)).dtype;
}

std::vector<const Node*> InsertedCasts(const Model& model) {
  std::vector<const Node*> casts;
  for (const Node* node : model.graph->nodes()) {
    if (!ReadAutocastRecord(*node).inserted_cast.empty()) casts.push_back(node);
  }
  return casts;
}

// "source->dtype" for every inserted Cast, in graph order.
std::vector<std::string> CastSummary(const Model& model) {
  std::vector<std::string> summary;
  for (const Node* cast : InsertedCasts(model)) {
    summary.push_back(absl::StrCat(cast->input(0)->name(), "->",
                                   DTypeName(cast->output(0)->dtype())));
  }
  return summary;
}

AutocastReport Convert(Model& model, const std::string& policy_name,
                       const AutocastOptions& options = {}) {
  AutocastReport report = ValueOrDie(RunAutocast(model, BuiltinPolicy(policy_name), options));
  absl::Status verified = VerifyModel(model);
  EXPECT_TRUE(verified.ok()) << verified;
  return report;
}

std::string Serialized(const Model& model) {
  return ValueOrDie(ExportModel(model)).SerializeAsString();
}

Model RoundTrip(const Model& model) {
  onnx::ModelProto proto;
  EXPECT_TRUE(proto.ParseFromString(Serialized(model)));
  Model imported = ValueOrDie(ImportModel(proto, "", "round trip"));
  EXPECT_TRUE(InferTypes(imported).ok());
  return imported;
}

// The structural invariants every converted model keeps; one message per
// violation.
std::vector<std::string> InvariantViolations(const Model& model) {
  std::vector<std::string> violations;
  std::set<std::pair<const Value*, DType>> cast_keys;
  for (const Node* node : model.graph->nodes()) {
    if (node->op_type() != "Cast") continue;
    const Value* in = node->input(0);
    const Value* out = node->output(0);
    if (in->dtype() == out->dtype()) {
      violations.push_back(absl::StrCat("Cast ", node->name(), " to its own type"));
    }
    if (out->uses().empty() && !out->is_graph_output()) {
      violations.push_back(absl::StrCat("orphan Cast ", node->name()));
    }
    const bool inserted = !ReadAutocastRecord(*node).inserted_cast.empty();
    if (inserted && in->producer() && in->producer()->op_type() == "Cast") {
      violations.push_back(absl::StrCat("Cast chain: ", in->producer()->name(), " -> ",
                                        node->name()));
    }
    if (!cast_keys.insert({in, out->dtype()}).second) {
      violations.push_back(absl::StrCat("second Cast of ", in->name(), " to ",
                                        DTypeName(out->dtype())));
    }
    if (inserted && ReadAutocastRecord(*node).why.empty()) {
      violations.push_back(absl::StrCat("inserted Cast ", node->name(), " without a reason"));
    }
  }
  for (const Value* weight : model.graph->initializers()) {
    if (IsFloatingPoint(weight->dtype()) && weight->dtype() != DType::kFloat32) {
      violations.push_back(absl::StrCat("weight ", weight->name(), " is not float32"));
    }
  }
  for (const Value* output : model.graph->outputs()) {
    if (IsFloatingPoint(output->dtype()) && output->dtype() != DType::kFloat32) {
      violations.push_back(absl::StrCat("graph output ", output->name(), " is not float32"));
    }
  }
  return violations;
}

// x -> MatMul(w) -> Relu -> MatMul(w2) -> Softmax -> MatMul(w3) -> out.
Model MlpWithSoftmax() {
  return ModelBuilder()
      .Input("x", {4, 8})
      .Weight("w", {8, 8})
      .Weight("w2", {8, 8})
      .Weight("w3", {8, 8})
      .Op("MatMul", {"x", "w"}, "mm1")
      .Op("Relu", {"mm1"}, "relu")
      .Op("MatMul", {"relu", "w2"}, "mm2")
      .Op("Softmax", {"mm2"}, "softmax")
      .Op("MatMul", {"softmax", "w3"}, "out")
      .Output("out")
      .Build();
}

// ---- rules 1-3: allow, deny, follow ----------------------------------------

TEST(AutocastRulesTest, AllowOpsComputeInFloat16AndDenyOpsInFloat32) {
  Model model = MlpWithSoftmax();
  const AutocastReport report = Convert(model, "mixed_float16");
  EXPECT_EQ(RecordedDType(model, "mm1"), "float16");
  EXPECT_EQ(RecordedDType(model, "relu"), "float16");  // follows mm1, no Cast between
  EXPECT_EQ(RecordedDType(model, "mm2"), "float16");
  EXPECT_EQ(RecordedDType(model, "softmax"), "float32");
  EXPECT_EQ(RecordedDType(model, "out"), "float32");  // rule 4: produces the graph output
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "softmax")).why,
              HasSubstr("rule 2 (deny): op list: deny list: Softmax"));
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "out")).why, HasSubstr("rule 4"));
  EXPECT_THAT(CastSummary(model),
              ElementsAre("x->float16", "w->float16", "w2->float16", "mm2->float32"));
  EXPECT_EQ(report.weight_casts, 2);
  EXPECT_EQ(report.activation_casts, 2);
  EXPECT_EQ(report.constant_casts, 0);
  EXPECT_EQ(report.nodes_per_dtype.at("float16"), 3);
  EXPECT_EQ(report.nodes_per_dtype.at("float32"), 2);
  // Masters stay float32: 3 weights of 64 floats, two of them computed 16-bit.
  EXPECT_EQ(report.weight_bytes_stored, 3 * 64 * 4);
  EXPECT_EQ(report.weight_bytes_computed, 2 * 64 * 2 + 64 * 4);
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

TEST(AutocastRulesTest, Float32PolicyChangesNoDtypeAndInsertsNothing) {
  Model model = MlpWithSoftmax();
  const AutocastReport report = Convert(model, "float32");
  EXPECT_EQ(report.casts_inserted(), 0);
  for (const Node* node : model.graph->nodes()) {
    EXPECT_EQ(ReadAutocastRecord(*node).dtype, "float32") << node->name();
  }
  EXPECT_EQ(*model.FindMetadata(kPolicyNameKey), "float32");
}

TEST(AutocastRulesTest, EachWeightGetsOneCastSharedByAllItsReaders) {
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Op("MatMul", {"x", "w"}, "a")
                    .Op("MatMul", {"a", "w"}, "b")
                    .Op("MatMul", {"b", "w"}, "c")
                    .Op("Softmax", {"c"}, "out")
                    .Output("out")
                    .Build();
  Convert(model, "mixed_float16");
  EXPECT_THAT(CastSummary(model), ElementsAre("x->float16", "w->float16", "c->float32"));
  const Value* w = model.graph->FindValue("w");
  ASSERT_NE(w->initializer(), nullptr);
  EXPECT_EQ(w->dtype(), DType::kFloat32);
  ASSERT_EQ(w->uses().size(), 1u);  // only the Cast reads the master
  EXPECT_EQ(w->uses()[0].node->output(0)->uses().size(), 3u);
  EXPECT_EQ(ReadAutocastRecord(*w->uses()[0].node).inserted_cast, "weight");
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

TEST(AutocastRulesTest, OneCastPerValueAndDtypeSharedByAllConsumers) {
  // One float16 value read by three float32 (deny) consumers: one Cast.
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Op("MatMul", {"x", "w"}, "h")
                    .Op("Exp", {"h"}, "e")
                    .Op("Softmax", {"h"}, "s")
                    .Op("Log", {"h"}, "l")
                    .Op("Sum", {"e", "s", "l"}, "out")
                    .Output("out")
                    .Build();
  Convert(model, "mixed_float16");
  EXPECT_THAT(CastSummary(model), ElementsAre("x->float16", "w->float16", "h->float32"));
  const Node& cast = *model.graph->FindValue("h")->uses()[0].node;
  EXPECT_EQ(cast.output(0)->uses().size(), 3u);
  // Placed just before its first reader.
  const auto& nodes = model.graph->nodes();
  const auto cast_at = std::find(nodes.begin(), nodes.end(), &cast) - nodes.begin();
  EXPECT_EQ(nodes[cast_at + 1]->name(), "e");
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

TEST(AutocastRulesTest, FollowChainsBetweenAllowOpsStayLowPrecisionWithoutCasts) {
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Weight("b", {8})
                    .Op("MatMul", {"x", "w"}, "mm1")
                    .Op("Add", {"mm1", "b"}, "biased")  // weight does not vote
                    .Op("Relu", {"biased"}, "relu")
                    .Op("Transpose", {"relu"}, "t")
                    .Op("Transpose", {"t"}, "tt")
                    .Op("MatMul", {"tt", "w"}, "mm2")
                    .Op("Softmax", {"mm2"}, "out")
                    .Output("out")
                    .Build();
  Convert(model, "mixed_bfloat16");
  for (const char* node : {"mm1", "biased", "relu", "t", "tt", "mm2"}) {
    EXPECT_EQ(RecordedDType(model, node), "bfloat16") << node;
  }
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "relu")).why,
              HasSubstr("rule 3 (follow): op list: follow list: Relu"));
  EXPECT_THAT(CastSummary(model), ElementsAre("x->bfloat16", "w->bfloat16", "b->bfloat16",
                                              "mm2->float32"));
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

TEST(AutocastRulesTest, FollowOpWithDisagreeingInputsPromotesToFloat32) {
  // Add(float16 MatMul output, float32 graph input) runs in float32, as
  // PyTorch promotes; the MatMul output is cast up once.
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Input("skip", {4, 8})
                    .Weight("w", {8, 8})
                    .Op("MatMul", {"x", "w"}, "mm")
                    .Op("Add", {"mm", "skip"}, "sum")
                    .Op("Relu", {"sum"}, "relu")
                    .Op("MatMul", {"relu", "w"}, "out")
                    .Output("out")
                    .Build();
  Convert(model, "mixed_float16");
  EXPECT_EQ(RecordedDType(model, "mm"), "float16");
  EXPECT_EQ(RecordedDType(model, "sum"), "float32");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "sum")).why,
              HasSubstr("input 'skip' is float32, so the inputs do not all agree"));
  EXPECT_EQ(RecordedDType(model, "relu"), "float32");  // follows the float32 Add
  EXPECT_THAT(CastSummary(model), ElementsAre("x->float16", "w->float16", "mm->float32"));
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

// BatchNormalization (deny) computes in float32 but hands its output on in
// the dtype its input came in (OpDef::autocast_output_in_input_dtype), as
// PyTorch's batch_norm and Keras's BatchNormalization do: after a float16
// Conv, the residual Add and Relu that read it compute in float16 and read
// it through one Cast; after a float32 graph input it stays a float32 vote
// (the Add promotes).
TEST(AutocastRulesTest, BatchNormHandsItsOutputOnInTheDtypeItsInputCameIn) {
  auto build = [](bool after_conv) {
    ModelBuilder builder;
    builder.Input("x", {2, 3, 4, 4})
        .Weight("w", {3, 3, 1, 1})
        .Weight("scale", {3})
        .Weight("bias", {3})
        .Weight("mean", {3})
        .Weight("var", {3})
        .Op("Conv", {"x", "w"}, "conv");
    builder.Op("BatchNormalization", {after_conv ? "conv" : "x", "scale", "bias", "mean", "var"},
               "bn")
        .Op("Add", {"bn", "conv"}, "sum")
        .Op("Relu", {"sum"}, "relu")
        .Op("Conv", {"relu", "w"}, "out")
        .Output("out");
    return builder.Build();
  };
  Model model = build(/*after_conv=*/true);
  Convert(model, "mixed_float16");
  EXPECT_EQ(RecordedDType(model, "bn"), "float32");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "bn")).why,
              HasSubstr("its input came in float16, so its output counts as float16"));
  EXPECT_EQ(RecordedDType(model, "sum"), "float16");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "sum")).why,
              HasSubstr("counting 'bn' (BatchNormalization computes in float32 and hands its "
                        "output on in float16"));
  EXPECT_EQ(RecordedDType(model, "relu"), "float16");
  // (The last Conv makes the graph output: float32, rule 4.)
  EXPECT_THAT(CastSummary(model), ElementsAre("x->float16", "w->float16", "conv->float32",
                                              "bn->float16", "relu->float32"));
  EXPECT_THAT(InvariantViolations(model), IsEmpty());

  Model from_input = build(/*after_conv=*/false);
  Convert(from_input, "mixed_float16");
  EXPECT_EQ(RecordedDType(from_input, "bn"), "float32");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(from_input, "bn")).why, Not(HasSubstr("came in")));
  EXPECT_EQ(RecordedDType(from_input, "sum"), "float32");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(from_input, "sum")).why,
              HasSubstr("input 'bn' is float32, so the inputs do not all agree"));
}

// Exp (deny) -> Relu -> MaxPool -> Flatten -> MatMul (allow) -> Softmax.
Model DenyThenExactChainThenMatMul() {
  return ModelBuilder()
      .Input("x", {2, 3, 4, 4})
      .Weight("w", {12, 5})
      .Op("Exp", {"x"}, "e")
      .Op("Relu", {"e"}, "relu")
      .Op("MaxPool", {"relu"}, "pool", {Attribute::Ints("kernel_shape", {2, 2}),
                                        Attribute::Ints("strides", {2, 2})})
      .Op("Flatten", {"pool"}, "flat")
      .Op("MatMul", {"flat", "w"}, "mm")
      .Op("Softmax", {"mm"}, "out")
      .Output("out")
      .Build();
}

TEST(AutocastRulesTest, ExactFollowChainBeforeA16BitReaderTakesItsDtype) {
  // Rule 3b: Relu, MaxPool and Flatten read float32 Exp, but they are exact
  // and feed only the float16 MatMul, so they run in float16 and the one
  // Cast moves from Flatten's output to Exp's: still three Casts.
  Model model = DenyThenExactChainThenMatMul();
  Convert(model, "mixed_float16");
  EXPECT_EQ(RecordedDType(model, "e"), "float32");
  for (const char* node : {"relu", "pool", "flat", "mm"}) {
    EXPECT_EQ(RecordedDType(model, node), "float16") << node;
  }
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "relu")).why,
              HasSubstr("rule 3 (follow, exact): op list: follow list: Relu (TF Relu: clear); "
                        "its input 'e' is float32, but all 1 reader(s) of its output compute "
                        "in float16"));
  // pool and flat read relu's and pool's float16 outputs in the end.
  for (const char* node : {"pool", "flat"}) {
    EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, node)).why,
                HasSubstr("; its computed float input is float16 (the chain before its float16 "
                          "reader(s) turned float16 by rule 3b)"))
        << node;
  }
  EXPECT_THAT(CastSummary(model), ElementsAre("e->float16", "w->float16", "mm->float32"));
  EXPECT_THAT(InvariantViolations(model), IsEmpty());

  // MaxPool takes bfloat16 only from opset 22: it stays float32, and so
  // does Relu, whose reader it is; Flatten still moves the Cast up.
  Model bf16 = DenyThenExactChainThenMatMul();
  Convert(bf16, "mixed_bfloat16");
  EXPECT_EQ(RecordedDType(bf16, "relu"), "float32");
  EXPECT_EQ(RecordedDType(bf16, "pool"), "float32");
  EXPECT_EQ(RecordedDType(bf16, "flat"), "bfloat16");
  EXPECT_THAT(CastSummary(bf16), ElementsAre("pool->bfloat16", "w->bfloat16", "mm->float32"));
  EXPECT_THAT(InvariantViolations(bf16), IsEmpty());
}

TEST(AutocastRulesTest, FollowOpStaysFloat32UnlessExactWithOneInputAndOnly16BitReaders) {
  // sig: Sigmoid is not exact (rounding its input first changes the result).
  // relu: exact, but the float32 Add reads it too.
  // cat: exact, but a second float input would need a Cast of its own.
  // row: Gather shrinks its input, so it is not marked exact (rule 3b would
  // cast the whole input and GatherGrad would keep that copy).
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Weight("w2", {16, 8})
                    .Op("Exp", {"x"}, "e")
                    .Op("Sigmoid", {"e"}, "sig")
                    .Op("MatMul", {"sig", "w"}, "mm1")
                    .Op("Relu", {"e"}, "relu")
                    .Op("MatMul", {"relu", "w"}, "mm2")
                    .Op("Add", {"relu", "mm2"}, "sum")
                    .Op("Concat", {"e", "sum"}, "cat", {Attribute::Int("axis", 1)})
                    .Op("MatMul", {"cat", "w2"}, "mm3")
                    .Op("Add", {"mm1", "mm3"}, "both")
                    .Constant("first", 0.0f)
                    .Op("Cast", {"first"}, "index", {Attribute::Int("to", 7)})
                    .Op("Gather", {"e", "index"}, "row")
                    .Op("MatMul", {"row", "w"}, "mm4")
                    .Op("Softmax", {"both"}, "out")
                    .Output("out")
                    .Op("Softmax", {"mm4"}, "out2")
                    .Output("out2")
                    .Build();
  Convert(model, "mixed_float16");
  EXPECT_EQ(RecordedDType(model, "mm4"), "float16");
  for (const char* node : {"e", "sig", "relu", "sum", "cat", "row", "out"}) {
    EXPECT_EQ(RecordedDType(model, node), "float32") << node;
  }
  for (const char* node : {"mm1", "mm2", "mm3", "both"}) {
    EXPECT_EQ(RecordedDType(model, node), "float16") << node;
  }
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "relu")).why,
              HasSubstr("rule 3 (follow): op list: follow list: Relu (TF Relu: clear); input "
                        "'e' is float32"));
  EXPECT_THAT(CastSummary(model),
              ElementsAre("sig->float16", "w->float16", "relu->float16", "mm2->float32",
                          "cat->float16", "w2->float16", "row->float16", "both->float32",
                          "mm4->float32"));
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

TEST(AutocastRulesTest, ExactFollowOpKeepsFloat32ForGraphOutputsAndPinnedReaders) {
  // Exp (deny) -> Relu "relu" -> MatMul "mm" (float16) -> Softmax; relu is
  // exact and its reader is float16, yet it stays float32 when ...
  auto build = [](bool relu_is_output) {
    ModelBuilder builder;
    builder.Input("x", {8, 4})
        .Weight("w", {8, 8})
        .Op("Exp", {"x"}, "e")
        .Op("Relu", {"e"}, "relu")
        .Op("MatMul", {"w", "relu"}, "mm")
        .Op("Softmax", {"mm"}, "out")
        .Output("out");
    if (relu_is_output) builder.Output("relu");
    return builder.Build();
  };
  // ... nothing else holds it: float16 (the baseline of the cases below).
  Model free = build(false);
  Convert(free, "mixed_float16");
  EXPECT_EQ(RecordedDType(free, "relu"), "float16");

  // ... it produces a graph output (rule 4 forces it float32) ...
  Model output = build(true);
  Convert(output, "mixed_float16");
  EXPECT_EQ(RecordedDType(output, "relu"), "float32");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(output, "relu")).why, HasSubstr("rule 4"));

  // ... or, with graph outputs lowered, it would change a graph output's
  // dtype that rule 3 did not choose ...
  Policy lowered = BuiltinPolicy("mixed_float16");
  lowered.set_keep_io_types(false);
  Model lowered_output = build(true);
  ValueOrDie(RunAutocast(lowered_output, lowered));
  EXPECT_EQ(RecordedDType(lowered_output, "relu"), "float32");
  EXPECT_EQ(lowered_output.graph->FindValue("relu")->dtype(), DType::kFloat32);

  // ... or its float16 reader reads it at a float32 pin: Pow (made follow)
  // with its exponent pinned, its base a float16 MatMul output.
  Policy pinned = BuiltinPolicy("mixed_float16");
  ASSERT_TRUE(pinned.OverrideOp("Pow", AutocastCategory::kFollow).ok());
  ASSERT_TRUE(pinned.PinInput("Pow", 1).ok());
  Model pinned_reader = ModelBuilder()
                            .Input("x", {8, 8})
                            .Weight("w", {8, 8})
                            .Op("MatMul", {"w", "x"}, "mm")
                            .Op("Exp", {"x"}, "e")
                            .Op("Relu", {"e"}, "relu")
                            .Op("Pow", {"mm", "relu"}, "power")
                            .Op("Softmax", {"power"}, "out")
                            .Output("out")
                            .Build();
  ValueOrDie(RunAutocast(pinned_reader, pinned));
  EXPECT_EQ(RecordedDType(pinned_reader, "power"), "float16");
  EXPECT_EQ(RecordedDType(pinned_reader, "relu"), "float32");
  EXPECT_THAT(CastSummary(pinned_reader),
              ElementsAre("w->float16", "x->float16", "power->float32"));
  EXPECT_THAT(InvariantViolations(pinned_reader), IsEmpty());
}

TEST(AutocastRulesTest, FollowOpReadingOnlyWeightsAndConstantsStaysFloat32) {
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Constant("two", 2.0f)
                    .Op("Mul", {"w", "two"}, "w2")  // no computed input to follow
                    .Op("MatMul", {"x", "w2"}, "mm")
                    .Op("Softmax", {"mm"}, "out")
                    .Output("out")
                    .Build();
  Convert(model, "mixed_float16");
  EXPECT_EQ(RecordedDType(model, "w2"), "float32");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "w2")).why,
              HasSubstr("no computed float input to follow"));
  EXPECT_EQ(RecordedDType(model, "mm"), "float16");
  EXPECT_THAT(CastSummary(model), ElementsAre("x->float16", "w2->float16", "mm->float32"));
}

TEST(AutocastRulesTest, ConstantsAreCastLikeWeightsAndDoNotVote) {
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Constant("scale", 0.25f)
                    .Op("MatMul", {"x", "w"}, "mm")
                    .Op("Mul", {"mm", "scale"}, "scaled")
                    .Op("MatMul", {"scaled", "w"}, "mm2")
                    .Op("Softmax", {"mm2"}, "out")
                    .Output("out")
                    .Build();
  const AutocastReport report = Convert(model, "mixed_float16");
  EXPECT_EQ(RecordedDType(model, "scaled"), "float16");
  // Read only in float16: stored in float16, no Cast; its float32 value is
  // recorded, and StripAutocast restores it exactly.
  EXPECT_EQ(report.constant_casts, 0);
  EXPECT_EQ(report.constants_lowered, 1);
  EXPECT_EQ(model.graph->FindValue("scale")->dtype(), DType::kFloat16);
  EXPECT_EQ(RecordedDType(model, "scale_node"), "float16");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "scale_node")).why,
              HasSubstr("is read only in float16, so it is stored in float16"));
  EXPECT_THAT(CastSummary(model), ElementsAre("x->float16", "w->float16", "mm2->float32"));
  ASSERT_TRUE(StripAutocast(model).ok());
  EXPECT_EQ(model.graph->FindValue("scale")->dtype(), DType::kFloat32);
  EXPECT_EQ(NodeNamed(model, "scale_node").attribute("value")->t.data<float>()[0], 0.25f);
}

TEST(AutocastRulesTest, ConstantReadInTwoDtypesIsCastNotLowered) {
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Constant("scale", 0.1f)
                    .Op("MatMul", {"x", "w"}, "mm")
                    .Op("Mul", {"mm", "scale"}, "scaled")      // float16
                    .Op("Softmax", {"scaled"}, "soft")
                    .Op("Mul", {"soft", "scale"}, "out")        // float32
                    .Output("out")
                    .Build();
  const AutocastReport report = Convert(model, "mixed_float16");
  EXPECT_EQ(report.constant_casts, 1);
  EXPECT_EQ(report.constants_lowered, 0);
  EXPECT_EQ(model.graph->FindValue("scale")->dtype(), DType::kFloat32);
  int constant_casts = 0;
  for (const Use& use : model.graph->FindValue("scale")->uses()) {
    if (ReadAutocastRecord(*use.node).inserted_cast == "constant") ++constant_casts;
  }
  EXPECT_EQ(constant_casts, 1);
}

// ---- contextual rules 2a-2c and rule 4 --------------------------------------

TEST(AutocastRulesTest, SqrtFeedingADivisorIsANormalisationAndStaysFloat32) {
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Op("MatMul", {"x", "w"}, "mm")
                    .Op("Relu", {"mm"}, "r")
                    .Op("Sqrt", {"r"}, "root")
                    .Op("Div", {"mm", "root"}, "normed")
                    .Op("Sqrt", {"r"}, "root_plain")  // feeds no divisor: follows
                    .Op("Add", {"normed", "root_plain"}, "sum")
                    .Op("Softmax", {"sum"}, "out")
                    .Output("out")
                    .Build();
  Convert(model, "mixed_float16");
  EXPECT_EQ(RecordedDType(model, "root"), "float32");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "root")).why,
              HasSubstr("rule 2a (deny): Sqrt feeding a normalisation (Div node 'normed')"));
  EXPECT_EQ(RecordedDType(model, "root_plain"), "float16");
  EXPECT_EQ(RecordedDType(model, "normed"), "float32");  // its divisor is float32
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

TEST(AutocastRulesTest, OutputProducerStaysFloat32UnlessIoTypesAreNotKept) {
  Model kept = MlpWithSoftmax();
  Convert(kept, "mixed_float16");
  EXPECT_EQ(RecordedDType(kept, "out"), "float32");
  EXPECT_EQ(kept.graph->outputs()[0]->dtype(), DType::kFloat32);
  EXPECT_EQ(kept.graph->inputs()[0]->dtype(), DType::kFloat32);

  Model lowered = MlpWithSoftmax();
  Policy policy = BuiltinPolicy("mixed_float16");
  policy.set_keep_io_types(false);
  ValueOrDie(RunAutocast(lowered, policy));
  EXPECT_EQ(RecordedDType(lowered, "out"), "float16");
  EXPECT_EQ(lowered.graph->outputs()[0]->dtype(), DType::kFloat16);
  EXPECT_EQ(lowered.graph->inputs()[0]->dtype(), DType::kFloat16);
  EXPECT_EQ(*lowered.FindMetadata(kLoweredInputsKey), "x");
  EXPECT_THAT(CastSummary(lowered), ElementsAre("w->float16", "w2->float16", "mm2->float32",
                                                "softmax->float16", "w3->float16"));
}

TEST(AutocastRulesTest, OpRefusingTheDtypeAtTheModelsOpsetStaysFloat32WithANote) {
  // Conv accepts bfloat16 only from opset 22; castor's models are opset <= 17.
  Model model = ModelBuilder(17)
                    .Input("x", {1, 2, 6, 6})
                    .Weight("k", {3, 2, 3, 3})
                    .Op("Conv", {"x", "k"}, "conv")
                    .Op("Relu", {"conv"}, "out")
                    .Output("out")
                    .Build();
  const AutocastReport report = Convert(model, "mixed_bfloat16");
  EXPECT_EQ(RecordedDType(model, "conv"), "float32");
  // The converted file keeps ONNX Conv in float32; castor's training graph
  // runs it in bfloat16 as com.castor Conv (autocast_training_test.cc).
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "conv")).why,
              HasSubstr("ONNX Conv does not accept bfloat16 at opset 17"));
  EXPECT_THAT(report.notes, ElementsAre(HasSubstr("1 Conv node stays float32 in this file (Conv "
                                                  "accepts bfloat16 only from opset 22; the "
                                                  "model is opset 17)")));
  EXPECT_EQ(report.casts_inserted(), 0);

  Model float16 = ModelBuilder(17)
                      .Input("x", {1, 2, 6, 6})
                      .Weight("k", {3, 2, 3, 3})
                      .Op("Conv", {"x", "k"}, "conv")
                      .Op("Relu", {"conv"}, "out")
                      .Output("out")
                      .Build();
  Convert(float16, "mixed_float16");
  EXPECT_EQ(RecordedDType(float16, "conv"), "float16");
}

TEST(AutocastRulesTest, OpRefusingTheDtypeAfterA16BitProducerStaysFloat32) {
  // mobilenet_v3's classifier: a bfloat16 MatMul feeds HardSwish, which
  // takes bfloat16 only from opset 22. HardSwish must stay float32 (the
  // MatMul's output is cast back), not be painted bfloat16 because the
  // probe saw the MatMul's output already bfloat16 and took the refusal
  // for one float32 inputs share.
  Model model = ModelBuilder(17)
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Op("MatMul", {"x", "w"}, "mm")
                    .Op("HardSwish", {"mm"}, "hs")
                    .Op("MatMul", {"hs", "w"}, "mm2")
                    .Op("Relu", {"mm2"}, "out")
                    .Output("out")
                    .Build();
  const AutocastReport report = Convert(model, "mixed_bfloat16");
  EXPECT_EQ(RecordedDType(model, "mm"), "bfloat16");
  EXPECT_EQ(RecordedDType(model, "hs"), "float32");
  EXPECT_EQ(RecordedDType(model, "mm2"), "bfloat16");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "hs")).why,
              HasSubstr("but the op does not accept bfloat16 at opset 17"));
  EXPECT_THAT(report.notes, ElementsAre(HasSubstr("1 HardSwish node stays float32")));
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

// A setting input (OpDef::setting_inputs) keeps float32 whatever its node
// computes in: Resize takes its scales only in float32, so a Resize reading
// a 16-bit activation runs in 16 bits with float32 scales (before, the
// scales' Cast made the node refuse 16 bits and the whole Resize stayed
// float32).
TEST(AutocastRulesTest, SettingInputsStayFloat32) {
  Model model;
  model.opset_imports = {{"", 17}};
  Graph& graph = *model.graph;
  Value* x = ValueOrDie(graph.AddInput("x", DType::kFloat32, Shape({1, 2, 4, 4})));
  Value* w = ValueOrDie(graph.AddInitializer("w", Tensor(DType::kFloat32, {2, 2, 1, 1})));
  Value* scales = ValueOrDie(graph.AddInitializer(
      "scales", Tensor::FromVector<float>(DType::kFloat32, {4}, {1, 1, 2, 2})));
  Node* conv = ValueOrDie(graph.AddNode("Conv", {x, w}, {"conv"}, "conv"));
  Node* resize = ValueOrDie(
      graph.AddNode("Resize", {conv->output(0), nullptr, scales}, {"up"}, "up"));
  resize->SetAttribute(Attribute::String("mode", "nearest"));
  Node* relu = ValueOrDie(graph.AddNode("Relu", {resize->output(0)}, {"r"}, "r"));
  Node* conv2 = ValueOrDie(graph.AddNode("Conv", {relu->output(0), w}, {"out"}, "out"));
  graph.AddOutput(conv2->output(0));
  ASSERT_TRUE(InferTypes(model).ok());
  Convert(model, "mixed_float16");
  EXPECT_EQ(RecordedDType(model, "conv"), "float16");
  EXPECT_EQ(RecordedDType(model, "up"), "float16");
  EXPECT_EQ(NodeNamed(model, "up").input(2)->name(), "scales");  // no Cast
  EXPECT_EQ(NodeNamed(model, "up").input(2)->dtype(), DType::kFloat32);
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

TEST(AutocastRulesTest, UnknownOpsStayFloat32AndAreNoted) {
  Model model;
  model.opset_imports = {{"", 17}, {"com.example", 1}};
  Graph& graph = *model.graph;
  Value* x = ValueOrDie(graph.AddInput("x", DType::kFloat32, Shape({4, 8})));
  ValueOrDie(graph.AddInitializer("w", Tensor(DType::kFloat32, {8, 8})));
  Node* mm = ValueOrDie(graph.AddNode("MatMul", {x, graph.FindValue("w")}, {"mm"}, "mm"));
  Node* custom = ValueOrDie(graph.AddNode("Mystery", {mm->output(0)}, {"m"}, "mystery",
                                          "com.example"));
  Node* relu = ValueOrDie(graph.AddNode("Relu", {custom->output(0)}, {"out"}, "out"));
  graph.AddOutput(relu->output(0));
  custom->output(0)->set_dtype(DType::kFloat32);  // as a value_info would declare it
  custom->output(0)->set_shape(Shape({4, 8}));
  InferenceOptions inference;
  inference.allow_unknown_ops = true;
  absl::Status inferred = InferTypes(model, inference);
  ASSERT_TRUE(inferred.ok()) << inferred;

  const AutocastReport report = ValueOrDie(RunAutocast(model, BuiltinPolicy("mixed_float16")));
  EXPECT_EQ(RecordedDType(model, "mystery"), "float32");
  EXPECT_EQ(RecordedDType(model, "mm"), "float16");
  EXPECT_THAT(report.notes,
              ElementsAre(HasSubstr("com.example:Mystery node 'mystery': unknown op")));
  EXPECT_EQ(custom->input(0)->dtype(), DType::kFloat32);  // reads a Cast back to float32
}

// ---- overrides and pins ------------------------------------------------------

TEST(AutocastRulesTest, NodeAndOpOverridesDecide) {
  Model model = MlpWithSoftmax();
  Policy policy = BuiltinPolicy("mixed_float16");
  NodeOverride keep_mm1;
  keep_mm1.regex = "mm[1]";
  keep_mm1.category = AutocastCategory::kDeny;
  ASSERT_TRUE(policy.OverrideNode(keep_mm1).ok());
  ASSERT_TRUE(policy.OverrideOp("Softmax", AutocastCategory::kAllow).ok());
  ValueOrDie(RunAutocast(model, policy));
  EXPECT_EQ(RecordedDType(model, "mm1"), "float32");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "mm1")).why,
              HasSubstr("node override: node regex \"mm[1]\" -> deny"));
  // relu reads float32 mm1, but its one reader mm2 is float16 and Relu is
  // exact (rule 3b): the Cast moves from its output to its input.
  EXPECT_EQ(RecordedDType(model, "relu"), "float16");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "relu")).why,
              HasSubstr("rule 3 (follow, exact)"));
  EXPECT_EQ(RecordedDType(model, "mm2"), "float16");
  EXPECT_EQ(RecordedDType(model, "softmax"), "float16");
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(model, "softmax")).why,
              HasSubstr("op override: op_overrides Softmax -> allow"));
  EXPECT_THAT(CastSummary(model), ElementsAre("mm1->float16", "w2->float16", "softmax->float32"));
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

TEST(AutocastRulesTest, PinnedInputStaysFloat32) {
  // Pow's exponent has its own type constraint: pinned, it stays float32
  // while the base is float16; unpinned, the constant is cast down.
  auto build = [] {
    return ModelBuilder()
        .Input("x", {4, 8})
        .Weight("w", {8, 8})
        .Constant("two", 2.0f)
        .Op("MatMul", {"x", "w"}, "mm")
        .Op("Pow", {"mm", "two"}, "squared")
        .Op("MatMul", {"squared", "w"}, "mm2")
        .Op("Softmax", {"mm2"}, "out")
        .Output("out")
        .Build();
  };
  Policy policy = BuiltinPolicy("mixed_float16");
  ASSERT_TRUE(policy.OverrideOp("Pow", AutocastCategory::kFollow).ok());
  Model unpinned = build();
  ValueOrDie(RunAutocast(unpinned, policy));
  EXPECT_EQ(RecordedDType(unpinned, "squared"), "float16");
  EXPECT_THAT(CastSummary(unpinned), ElementsAre("x->float16", "w->float16", "mm2->float32"));
  EXPECT_EQ(unpinned.graph->FindValue("two")->dtype(), DType::kFloat16);  // stored 16-bit

  ASSERT_TRUE(policy.PinInput("Pow", 1).ok());
  Model pinned = build();
  ValueOrDie(RunAutocast(pinned, policy));
  EXPECT_EQ(RecordedDType(pinned, "squared"), "float16");
  EXPECT_EQ(NodeNamed(pinned, "squared").input(1)->name(), "two");
  EXPECT_EQ(NodeNamed(pinned, "squared").input(1)->dtype(), DType::kFloat32);
  EXPECT_THAT(CastSummary(pinned), ElementsAre("x->float16", "w->float16", "mm2->float32"));
  EXPECT_THAT(InvariantViolations(pinned), IsEmpty());
}

// ---- model Casts --------------------------------------------------------------

TEST(AutocastRulesTest, ModelCastsAreRespectedAndNeverChained) {
  // The model already computes mm in float16 and widens it exactly; a
  // float16 reader takes the Cast's input instead of casting back.
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Op("Cast", {"x"}, "x16", {Attribute::Int("to", 10)})
                    .Op("Cast", {"w"}, "w16", {Attribute::Int("to", 10)})
                    .Op("MatMul", {"x16", "w16"}, "mm16")
                    .Op("Cast", {"mm16"}, "mm32", {Attribute::Int("to", 1)})
                    .Op("MatMul", {"mm32", "w"}, "mm2")
                    .Op("Softmax", {"mm2"}, "out")
                    .Output("out")
                    .Build();
  const AutocastReport report = Convert(model, "mixed_float16");
  EXPECT_EQ(NodeNamed(model, "mm2").input(0)->name(), "mm16");  // not Cast(mm32)
  EXPECT_EQ(NodeNamed(model, "mm2").input(1)->name(), "w16");    // the model's Cast of w
  EXPECT_THAT(CastSummary(model), ElementsAre("mm2->float32"));
  EXPECT_EQ(NodeNamed(model, "x16").op_type(), "Cast");  // the model's Casts stay
  EXPECT_EQ(model.graph->FindValue("mm32"), nullptr);    // but not one left unread
  EXPECT_THAT(report.notes, ElementsAre(HasSubstr("model Cast 'mm32' is no longer read")));
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

TEST(AutocastRulesTest, ModelCastDuplicatingCastorsCastIsShared) {
  // castor casts w for mm1 first; the model's own later Cast of w to
  // float16 would be a second Cast of (w, float16): its reader shares castor's.
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Op("MatMul", {"x", "w"}, "mm1")
                    .Op("Cast", {"w"}, "w16", {Attribute::Int("to", 10)})
                    .Op("Cast", {"mm1"}, "mm1_32", {Attribute::Int("to", 1)})
                    .Op("Cast", {"mm1_32"}, "mm1_16", {Attribute::Int("to", 10)})
                    .Op("MatMul", {"mm1_16", "w16"}, "mm2")
                    .Op("Softmax", {"mm2"}, "out")
                    .Output("out")
                    .Build();
  const AutocastReport report = Convert(model, "mixed_float16");
  EXPECT_EQ(model.graph->FindValue("w16"), nullptr);
  EXPECT_EQ(NodeNamed(model, "mm2").input(1)->name(), "w_to_float16");
  EXPECT_THAT(report.notes, ::testing::Contains(HasSubstr("model Cast 'w16' duplicated castor's "
                                                          "Cast of 'w' to float16")));
  // The model computed `out` in float16; Softmax is on the deny list.
  EXPECT_EQ(model.graph->outputs()[0]->dtype(), DType::kFloat32);
  EXPECT_THAT(report.notes, ::testing::Contains(HasSubstr("graph output 'out' was float16 in the "
                                                          "model and is now float32")));
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

TEST(AutocastRulesTest, ModelCastThatBecomesANoOpIsRemovedAndNoted) {
  Model model = ModelBuilder()
                    .Input("x", {4, 8})
                    .Weight("w", {8, 8})
                    .Op("MatMul", {"x", "w"}, "mm")
                    .Op("Relu", {"mm"}, "r")
                    .Op("Cast", {"r"}, "r16", {Attribute::Int("to", 10)})
                    .Op("Cast", {"r16"}, "r32", {Attribute::Int("to", 1)})
                    .Op("Softmax", {"r32"}, "out")
                    .Output("out")
                    .Build();
  const AutocastReport report = Convert(model, "mixed_float16");
  EXPECT_THAT(report.notes, ElementsAre(HasSubstr("model Cast 'r16' to float16 became a no-op")));
  EXPECT_EQ(model.graph->FindValue("r16"), nullptr);
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
}

// ---- the policy record ---------------------------------------------------------

TEST(AutocastRecordTest, ConvertingTwiceUnderThePolicyChangesNothing) {
  Model model = MlpWithSoftmax();
  Convert(model, "mixed_float16");
  const std::string once = Serialized(model);
  const AutocastReport again = Convert(model, "mixed_float16");
  EXPECT_TRUE(again.unchanged);
  EXPECT_EQ(again.casts_inserted(), 0);
  EXPECT_TRUE(Serialized(model) == once);

  // The same after a save and load: the record lives in the file.
  Model loaded = RoundTrip(model);
  EXPECT_TRUE(Convert(loaded, "mixed_float16").unchanged);
  EXPECT_TRUE(Serialized(loaded) == once);
}

TEST(AutocastRecordTest, OutputIsDeterministic) {
  Model a = MlpWithSoftmax();
  Model b = MlpWithSoftmax();
  Convert(a, "mixed_bfloat16");
  Convert(b, "mixed_bfloat16");
  EXPECT_TRUE(Serialized(a) == Serialized(b));
}

TEST(AutocastRecordTest, ModelRecordsPolicyNameDigestAndJson) {
  Model model = MlpWithSoftmax();
  Convert(model, "mixed_bfloat16");
  const Policy policy = BuiltinPolicy("mixed_bfloat16");
  Model loaded = RoundTrip(model);
  EXPECT_EQ(*loaded.FindMetadata(kPolicyNameKey), "mixed_bfloat16");
  EXPECT_EQ(*loaded.FindMetadata(kPolicyDigestKey), policy.Digest());
  EXPECT_EQ(*loaded.FindMetadata(kComputeDTypeKey), "bfloat16");
  const Policy recorded = ValueOrDie(
      Policy::FromJson(ValueOrDie(Json::Parse(*loaded.FindMetadata(kPolicyJsonKey))), "model"));
  EXPECT_EQ(recorded.Digest(), policy.Digest());
  // Provenance survives the save and load, on nodes and inserted Casts.
  EXPECT_THAT(ReadAutocastRecord(NodeNamed(loaded, "softmax")).why, HasSubstr("rule 2 (deny)"));
  const std::vector<const Node*> casts = InsertedCasts(loaded);
  ASSERT_EQ(casts.size(), 4u);
  EXPECT_EQ(ReadAutocastRecord(*casts[1]).inserted_cast, "weight");
  EXPECT_THAT(ReadAutocastRecord(*casts[1]).why, HasSubstr("rule 5: weight 'w'"));
  EXPECT_THAT(casts[1]->doc_string(), HasSubstr("inserted by castor autocast: rule 5"));
}

// A file converted under an earlier definition of the same policy (its
// name, another digest: an older castor's op lists) is converted again
// from its float32 graph, with a note naming both digests.
TEST(AutocastRecordTest, AnEarlierDefinitionOfThePolicyIsConvertedAgain) {
  Model model = MlpWithSoftmax();
  Convert(model, "mixed_float16");
  model.SetMetadata(kPolicyDigestKey, "sha256:0123");
  const AutocastReport report = Convert(model, "mixed_float16");
  EXPECT_FALSE(report.unchanged);
  EXPECT_EQ(report.casts_removed, 4);
  ASSERT_FALSE(report.notes.empty());
  EXPECT_THAT(report.notes[0], HasSubstr("earlier definition of policy 'mixed_float16' "
                                         "(sha256:0123; this castor's is sha256:"));
  Model fresh = MlpWithSoftmax();
  Convert(fresh, "mixed_float16");
  EXPECT_TRUE(Serialized(model) == Serialized(fresh));
}

TEST(AutocastRecordTest, AnotherPolicyIsRefusedNamingBothUnlessRestarted) {
  Model model = MlpWithSoftmax();
  Convert(model, "mixed_float16");
  const std::string float16_form = Serialized(model);
  absl::StatusOr<AutocastReport> refused =
      RunAutocast(model, BuiltinPolicy("mixed_bfloat16"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("'mixed_float16'"));
  EXPECT_THAT(refused.status().message(), HasSubstr("'mixed_bfloat16'"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--restart-from-float32"));
  EXPECT_TRUE(Serialized(model) == float16_form);  // a refusal changes nothing

  AutocastOptions restart;
  restart.restart_from_float32 = true;
  const AutocastReport report = Convert(model, "mixed_bfloat16", restart);
  EXPECT_EQ(report.casts_removed, 4);
  Model fresh = MlpWithSoftmax();
  Convert(fresh, "mixed_bfloat16");
  EXPECT_TRUE(Serialized(model) == Serialized(fresh));
}

TEST(AutocastRecordTest, StripAutocastGivesTheFloat32GraphBack) {
  const std::string original = Serialized(MlpWithSoftmax());
  Model model = MlpWithSoftmax();
  Convert(model, "mixed_float16");
  EXPECT_EQ(ValueOrDie(StripAutocast(model)), 4);
  EXPECT_EQ(model.FindMetadata(kPolicyNameKey), nullptr);
  EXPECT_TRUE(Serialized(model) == original);
}

// ---- every sample model ----------------------------------------------------------

struct SampleCase {
  std::string model;
  std::string policy;
};

class AutocastSampleTest : public ::testing::TestWithParam<SampleCase> {};

TEST_P(AutocastSampleTest, InvariantsIdempotenceAndRecords) {
  const fs::path path = fs::path(CASTOR_SOURCE_DIR) / "models" / (GetParam().model + ".onnx");
  Model model = ValueOrDie(LoadModel(path.string()));
  ASSERT_TRUE(InferTypes(model).ok());
  const int original_nodes = model.graph->num_nodes();
  const AutocastReport report = Convert(model, GetParam().policy);
  EXPECT_THAT(InvariantViolations(model), IsEmpty());
  EXPECT_EQ(model.graph->num_nodes(), original_nodes + report.casts_inserted());
  EXPECT_EQ(static_cast<int>(InsertedCasts(model).size()), report.casts_inserted());
  int recorded = 0;
  for (const Node* node : model.graph->nodes()) {
    if (!ReadAutocastRecord(*node).dtype.empty()) ++recorded;
    // Every float computation is recorded with a reason.
    if (!ReadAutocastRecord(*node).dtype.empty()) {
      EXPECT_FALSE(ReadAutocastRecord(*node).why.empty()) << node->name();
    }
  }
  int counted = 0;
  for (const auto& [dtype, count] : report.nodes_per_dtype) {
    if (dtype != "none") counted += count;
  }
  // Lowered Constants carry a record too (counted under "none").
  EXPECT_EQ(recorded, counted + report.casts_inserted() + report.constants_lowered);

  Model loaded = RoundTrip(model);
  const std::string once = Serialized(loaded);
  EXPECT_TRUE(Convert(loaded, GetParam().policy).unchanged);
  EXPECT_TRUE(Serialized(loaded) == once);
}

std::vector<SampleCase> SampleCases() {
  std::vector<SampleCase> cases;
  for (const char* model : {"cnn", "mlp", "resnet", "transformer"}) {
    for (const char* opset : {"13", "17"}) {
      for (const char* policy : {"mixed_float16", "mixed_bfloat16", "float32"}) {
        cases.push_back({absl::StrCat(model, "_opset", opset), policy});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Models, AutocastSampleTest, ::testing::ValuesIn(SampleCases()),
                         [](const ::testing::TestParamInfo<SampleCase>& info) {
                           return absl::StrCat(info.param.model, "_", info.param.policy);
                         });

TEST(AutocastSampleTest, CnnUnderMixedFloat16HasTheExpectedStructure) {
  Model model = ValueOrDie(LoadModel(std::string(CASTOR_SOURCE_DIR) + "/models/cnn_opset17.onnx"));
  ASSERT_TRUE(InferTypes(model).ok());
  const AutocastReport report = Convert(model, "mixed_float16");
  EXPECT_THAT(CastSummary(model),
              ElementsAre("input->float16", "conv.weight->float16", "conv.bias->float16",
                          "fc1.weight->float16", "fc1.bias->float16",
                          "/Relu_1_output_0->float32"));
  EXPECT_EQ(RecordedDType(model, "/pool/MaxPool"), "float16");
  EXPECT_EQ(RecordedDType(model, "/fc2/Gemm"), "float32");
  EXPECT_EQ(report.weight_bytes_stored, 693962 * 4);
  EXPECT_EQ(report.weight_bytes_computed, (288 + 32 + 692224 + 128) * 2 + (1280 + 10) * 4);
}

}  // namespace
}  // namespace castor
