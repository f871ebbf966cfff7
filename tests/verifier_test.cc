// Tests for passes/verifier.h: VerifyModel on hand-built graphs, one test
// per invariant, each checking the violation is reported with a message that
// names the offending node or value. Uses the registered Relu/Add/Cast/
// MatMul/Identity definitions (graph/ops/elementwise.cc, misc.cc, matmul.cc).
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/graph.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"
#include "gtest/gtest.h"
#include "passes/verifier.h"

namespace castor {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

template <typename T>
T ValueOrDie(absl::StatusOr<T> result) {
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) std::abort();
  return *std::move(result);
}

class VerifierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* op : {"Relu", "Add", "Cast", "MatMul", "Identity"}) {
      ASSERT_NE(OpRegistry::Global().Find("", op), nullptr)
          << op << " is not registered; these tests need the op families in graph/ops/";
    }
    model_.opset_imports = {{"", 17}};
    x_ = ValueOrDie(graph().AddInput("x", DType::kFloat32, Shape({Dim::Symbol("N"), 4})));
  }

  Graph& graph() { return *model_.graph; }

  // The verifier's message, or "" when it passes.
  std::string Problems(const VerifyOptions& options = {}) {
    absl::Status status = VerifyModel(model_, options);
    if (status.ok()) return "";
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    return std::string(status.message());
  }

  Model model_;
  Value* x_ = nullptr;
};

TEST_F(VerifierTest, EmptyGraphPasses) {
  graph().AddOutput(x_);
  EXPECT_EQ(Problems(), "");
}

TEST_F(VerifierTest, ValidGraphPasses) {
  // x[N,4] + b[4] -> Relu -> MatMul w[4,3] -> Cast float16 -> y[N,3]
  Value* b = ValueOrDie(graph().AddInitializer(
      "b", Tensor::FromVector<float>(DType::kFloat32, {4}, {0, 1, 2, 3})));
  Value* w = ValueOrDie(graph().AddInitializer("w", Tensor(DType::kFloat32, {4, 3})));
  Node* add = ValueOrDie(graph().AddNode("Add", {x_, b}, {"sum"}, "add"));
  Node* relu = ValueOrDie(graph().AddNode("Relu", {add->output(0)}, {"act"}, "relu"));
  Node* matmul = ValueOrDie(graph().AddNode("MatMul", {relu->output(0), w}, {"mm"}, "matmul"));
  Node* cast = ValueOrDie(graph().AddNode("Cast", {matmul->output(0)}, {"y"}, "cast"));
  cast->SetAttribute(Attribute::Int("to", static_cast<int64_t>(DType::kFloat16)));
  graph().AddOutput(cast->output(0));

  ASSERT_TRUE(InferTypes(model_).ok()) << InferTypes(model_);
  EXPECT_EQ(cast->output(0)->dtype(), DType::kFloat16);
  EXPECT_EQ(cast->output(0)->shape().ToString(), "[N,3]");
  EXPECT_EQ(Problems(), "");
  EXPECT_EQ(Problems({.check_types = false}), "");
}

TEST_F(VerifierTest, NodeOutOfTopologicalOrder) {
  // Added as second, first; then "second" rewired to read first's output.
  Node* second = ValueOrDie(graph().AddNode("Relu", {x_}, {"second_out"}, "second"));
  Node* first = ValueOrDie(graph().AddNode("Relu", {x_}, {"first_out"}, "first"));
  second->SetInput(0, first->output(0));
  graph().AddOutput(second->output(0));

  const std::string problems = Problems({.check_types = false});
  EXPECT_THAT(problems, HasSubstr("Relu node 'second' input 0 'first_out' is defined later "
                                  "(graph is not in topological order)"));
  EXPECT_THAT(problems, HasSubstr("(1 problem)"));

  // TopologicalSort repairs it.
  ASSERT_TRUE(graph().TopologicalSort().ok());
  EXPECT_EQ(Problems({.check_types = false}), "");
}

TEST_F(VerifierTest, UnnamedNode) {
  Node* relu = ValueOrDie(graph().AddNode("Relu", {x_}, {"y"}));
  graph().AddOutput(relu->output(0));
  EXPECT_THAT(Problems({.check_types = false}),
              HasSubstr("Relu node without a name (output 'y')"));
}

TEST_F(VerifierTest, DuplicateNodeName) {
  Node* a = ValueOrDie(graph().AddNode("Relu", {x_}, {"a_out"}, "act"));
  Node* b = ValueOrDie(graph().AddNode("Identity", {a->output(0)}, {"b_out"}, "act"));
  graph().AddOutput(b->output(0));
  const std::string problems = Problems({.check_types = false});
  EXPECT_THAT(problems, HasSubstr("node name 'act' is used more than once"));
  EXPECT_THAT(problems, HasSubstr("(1 problem)"));
}

TEST_F(VerifierTest, UnregisteredOpIsListed) {
  Node* fancy = ValueOrDie(graph().AddNode("FancyOp", {x_}, {"f"}, "fancy"));
  Node* custom =
      ValueOrDie(graph().AddNode("Gelu2", {fancy->output(0)}, {"g"}, "custom", "com.example"));
  graph().AddOutput(custom->output(0));
  const std::string problems = Problems({.check_types = false});
  EXPECT_THAT(problems, HasSubstr("FancyOp node 'fancy': op FancyOp is not supported"));
  EXPECT_THAT(problems,
              HasSubstr("Gelu2 node 'custom': op Gelu2 (domain com.example) is not supported"));
  EXPECT_THAT(problems, HasSubstr("(2 problems)"));
}

TEST_F(VerifierTest, CastToTheSameType) {
  Node* cast = ValueOrDie(graph().AddNode("Cast", {x_}, {"y"}, "noop_cast"));
  cast->SetAttribute(Attribute::Int("to", static_cast<int64_t>(DType::kFloat32)));
  graph().AddOutput(cast->output(0));
  EXPECT_THAT(Problems({.check_types = false}),
              HasSubstr("Cast node 'noop_cast' casts 'x' to float32, the type it already has"));

  // A real conversion is fine.
  cast->SetAttribute(Attribute::Int("to", static_cast<int64_t>(DType::kBFloat16)));
  ASSERT_TRUE(InferTypes(model_).ok());
  EXPECT_EQ(Problems(), "");
}

TEST_F(VerifierTest, MissingRequiredInput) {
  Node* add = ValueOrDie(graph().AddNode("Add", {x_, nullptr}, {"y"}, "half_add"));
  graph().AddOutput(add->output(0));
  EXPECT_THAT(Problems({.check_types = false}),
              HasSubstr("Add node 'half_add': required input 1 is missing"));
}

TEST_F(VerifierTest, WrongArity) {
  Node* relu = ValueOrDie(graph().AddNode("Relu", {x_, x_}, {"y", "extra"}, "relu"));
  graph().AddOutput(relu->output(0));
  const std::string problems = Problems({.check_types = false});
  EXPECT_THAT(problems, HasSubstr("Relu node 'relu': has 2 inputs; expected 1..1"));
  EXPECT_THAT(problems, HasSubstr("Relu node 'relu': has 2 outputs; expected 1..1"));
}

TEST_F(VerifierTest, AttributeSchema) {
  Node* cast = ValueOrDie(graph().AddNode("Cast", {x_}, {"y"}, "cast"));
  graph().AddOutput(cast->output(0));
  EXPECT_THAT(Problems({.check_types = false}),
              HasSubstr("Cast node 'cast': required attribute 'to' is missing"));
  cast->SetAttribute(Attribute::String("to", "float16"));
  EXPECT_THAT(Problems({.check_types = false}),
              HasSubstr("Cast node 'cast': attribute 'to' is string; expected int"));
}

// An attribute the op does not define is refused, as ONNX's checker does: a
// misspelt `transb` must not run Gemm with the default transB = 0.
TEST_F(VerifierTest, UnknownAttribute) {
  Node* relu = ValueOrDie(graph().AddNode("Relu", {x_}, {"y"}, "relu"));
  graph().AddOutput(relu->output(0));
  relu->SetAttribute(Attribute::Int("alpha", 1));
  EXPECT_THAT(Problems({.check_types = false}),
              HasSubstr("Relu node 'relu': unknown attribute 'alpha' (Relu has no attributes)"));
  Node* cast = ValueOrDie(graph().AddNode("Cast", {x_}, {"z"}, "cast"));
  graph().AddOutput(cast->output(0));
  cast->SetAttribute(Attribute::Int("to", 1));
  cast->SetAttribute(Attribute::Int("too", 1));
  EXPECT_THAT(Problems({.check_types = false}),
              HasSubstr("Cast node 'cast': unknown attribute 'too' (Cast has "));
}

TEST_F(VerifierTest, OpsetOutsideTheOpsRange) {
  model_.opset_imports = {{"", 5}};
  Node* relu = ValueOrDie(graph().AddNode("Relu", {x_}, {"y"}, "relu"));
  graph().AddOutput(relu->output(0));
  EXPECT_THAT(Problems({.check_types = false}),
              HasSubstr("Relu node 'relu': opset 5 is outside the supported range"));
}

TEST_F(VerifierTest, GraphOutputNotDefined) {
  // A value of another graph stands in for a dangling output.
  Model other;
  Value* stranger = ValueOrDie(other.graph->AddInput("stranger", DType::kFloat32, Shape()));
  graph().AddOutput(x_);
  graph().AddOutput(stranger);
  const std::string problems = Problems({.check_types = false});
  EXPECT_THAT(problems, HasSubstr("graph output 'stranger' is not defined"));
  EXPECT_THAT(problems, Not(HasSubstr("'x'")));
}

TEST_F(VerifierTest, NodeInputNotDefined) {
  Model other;
  Value* stranger = ValueOrDie(other.graph->AddInput("stranger", DType::kFloat32, Shape()));
  Node* add = ValueOrDie(graph().AddNode("Add", {x_, stranger}, {"y"}, "add"));
  graph().AddOutput(add->output(0));
  EXPECT_THAT(Problems({.check_types = false}),
              HasSubstr("Add node 'add' input 1 'stranger' is not defined by any input, "
                        "initializer or node"));
  add->SetInput(1, nullptr);  // detach before `other` goes away
}

TEST_F(VerifierTest, TypesDisagreeingWithInference) {
  Node* relu = ValueOrDie(graph().AddNode("Relu", {x_}, {"y"}, "relu"));
  graph().AddOutput(relu->output(0));
  // Not inferred yet: the type check needs recorded dtypes.
  EXPECT_THAT(Problems(), HasSubstr("Relu node 'relu' output 'y': has no dtype recorded"));
  EXPECT_EQ(Problems({.check_types = false}), "");

  ASSERT_TRUE(InferTypes(model_).ok());
  EXPECT_EQ(Problems(), "");
  relu->output(0)->set_dtype(DType::kFloat16);  // Relu keeps its input's dtype
  EXPECT_THAT(Problems(), HasSubstr("Relu node 'relu' output 'y': declared dtype float16 but "
                                    "inferred float32"));
  EXPECT_EQ(Problems({.check_types = false}), "");
}

TEST_F(VerifierTest, ReportsEveryViolationAndCapsTheList) {
  // 30 unnamed nodes: 30 problems, 25 listed.
  for (int k = 0; k < 30; ++k) ValueOrDie(graph().AddNode("Relu", {x_}, {""}));
  graph().AddOutput(x_);
  const std::string problems = Problems({.check_types = false});
  EXPECT_THAT(problems, HasSubstr("graph verification failed (30 problems)"));
  EXPECT_THAT(problems, HasSubstr("... and 5 more"));
}

}  // namespace
}  // namespace castor
