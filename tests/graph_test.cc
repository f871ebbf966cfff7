// Tests for the IR: Dim/Shape (graph/shape.h), Tensor (graph/tensor.h),
// Attribute (graph/attribute.h) and Value/Node/Graph/Model (graph/graph.h):
// construction, use lists, rewrites and topological ordering.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "graph/attribute.h"
#include "graph/graph.h"
#include "graph/half.h"
#include "graph/shape.h"
#include "graph/tensor.h"
#include "gtest/gtest.h"

namespace castor {

// Readable gtest output for use lists.
void PrintTo(const Use& use, std::ostream* os) {
  *os << "Use{" << (use.node ? use.node->name() : std::string("null")) << ", " << use.index
      << "}";
}

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// Unwraps a StatusOr in a test, failing it (fatally) on error.
template <typename T>
T ValueOrDie(absl::StatusOr<T> result) {
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) std::abort();
  return *std::move(result);
}

std::vector<std::string> NodeNames(const Graph& graph) {
  std::vector<std::string> names;
  for (const Node* node : graph.nodes()) names.push_back(node->name());
  return names;
}

// ------------------------------------------------------------------ Dim/Shape

TEST(ShapeTest, DimKinds) {
  const Dim fixed(28);
  EXPECT_TRUE(fixed.is_static());
  EXPECT_FALSE(fixed.is_symbolic());
  EXPECT_EQ(fixed.value(), 28);
  EXPECT_EQ(fixed.ToString(), "28");

  const Dim symbol = Dim::Symbol("N");
  EXPECT_TRUE(symbol.is_symbolic());
  EXPECT_FALSE(symbol.is_static());
  EXPECT_EQ(symbol.value(), -1);
  EXPECT_EQ(symbol.ToString(), "N");

  const Dim unknown = Dim::Unknown();
  EXPECT_TRUE(unknown.is_unknown());
  EXPECT_EQ(unknown.ToString(), "?");

  EXPECT_EQ(Dim(0).ToString(), "0");
  EXPECT_TRUE(Dim(0).is_static());
  EXPECT_EQ(Dim(28), Dim(28));
  EXPECT_NE(Dim(28), Dim(27));
  EXPECT_EQ(Dim::Symbol("N"), Dim::Symbol("N"));
  EXPECT_NE(Dim::Symbol("N"), Dim::Symbol("B"));
  EXPECT_NE(Dim::Symbol("N"), Dim::Unknown());
}

TEST(ShapeTest, ToString) {
  EXPECT_EQ(Shape({Dim::Symbol("N"), 1, 28, 28}).ToString(), "[N,1,28,28]");
  EXPECT_EQ(Shape({Dim::Unknown(), 3}).ToString(), "[?,3]");
  EXPECT_EQ(Shape::Unknown().ToString(), "?");
  EXPECT_EQ(Shape().ToString(), "?");
  EXPECT_EQ(Shape::Scalar().ToString(), "[]");
  EXPECT_EQ(Shape::FromDims({2, 3}).ToString(), "[2,3]");
}

TEST(ShapeTest, RankAndStaticQueries) {
  const Shape image = Shape::FromDims({8, 1, 28, 28});
  EXPECT_TRUE(image.rank_known());
  EXPECT_EQ(image.rank(), 4);
  EXPECT_TRUE(image.is_static());
  EXPECT_EQ(image.NumElements(), std::optional<int64_t>(8 * 28 * 28));
  ASSERT_TRUE(image.StaticDims().has_value());
  EXPECT_THAT(*image.StaticDims(), ElementsAre(8, 1, 28, 28));

  const Shape scalar = Shape::Scalar();
  EXPECT_TRUE(scalar.rank_known());
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_TRUE(scalar.is_static());
  EXPECT_EQ(scalar.NumElements(), std::optional<int64_t>(1));
  EXPECT_THAT(*scalar.StaticDims(), IsEmpty());

  const Shape empty = Shape::FromDims({4, 0});
  EXPECT_EQ(empty.NumElements(), std::optional<int64_t>(0));

  const Shape symbolic({Dim::Symbol("N"), 10});
  EXPECT_FALSE(symbolic.is_static());
  EXPECT_EQ(symbolic.NumElements(), std::nullopt);
  EXPECT_EQ(symbolic.StaticDims(), std::nullopt);

  const Shape unknown_rank = Shape::Unknown();
  EXPECT_FALSE(unknown_rank.rank_known());
  EXPECT_FALSE(unknown_rank.is_static());
  EXPECT_EQ(unknown_rank.NumElements(), std::nullopt);
  EXPECT_EQ(unknown_rank.StaticDims(), std::nullopt);
}

TEST(ShapeTest, Equality) {
  EXPECT_EQ(Shape::FromDims({2, 3}), Shape({2, 3}));
  EXPECT_NE(Shape::FromDims({2, 3}), Shape::FromDims({3, 2}));
  EXPECT_NE(Shape::Scalar(), Shape::Unknown());  // rank 0 vs unknown rank
  EXPECT_NE(Shape({Dim::Symbol("N")}), Shape({Dim::Unknown()}));
}

// Equal whatever the inputs: the same numbers and symbols; an unknown dim
// or rank proves nothing (structural equality calls two unknowns equal).
TEST(ShapeTest, ProvablyEquals) {
  EXPECT_TRUE(Shape({Dim::Symbol("N"), 28, 64}).ProvablyEquals(Shape({Dim::Symbol("N"), 28, 64})));
  EXPECT_TRUE(Shape::Scalar().ProvablyEquals(Shape::Scalar()));
  EXPECT_FALSE(Shape({Dim::Symbol("N"), 28}).ProvablyEquals(Shape({Dim::Symbol("M"), 28})));
  EXPECT_FALSE(Shape({Dim::Symbol("N"), 28}).ProvablyEquals(Shape({Dim::Symbol("N"), 64})));
  EXPECT_FALSE(Shape({2, 3}).ProvablyEquals(Shape({2, 3, 1})));
  EXPECT_EQ(Shape({Dim::Unknown(), 3}), Shape({Dim::Unknown(), 3}));
  EXPECT_FALSE(Shape({Dim::Unknown(), 3}).ProvablyEquals(Shape({Dim::Unknown(), 3})));
  EXPECT_FALSE(Shape::Unknown().ProvablyEquals(Shape::Unknown()));
}

// ------------------------------------------------------------------ Tensor

TEST(TensorTest, FromVectorAndGetDouble) {
  const Tensor t = Tensor::FromVector<float>(DType::kFloat32, {2, 2}, {1.5f, -2.0f, 0.25f, 8.0f});
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_THAT(t.dims(), ElementsAre(2, 2));
  EXPECT_EQ(t.num_elements(), 4);
  EXPECT_EQ(t.byte_size(), 16u);
  EXPECT_EQ(t.shape(), Shape::FromDims({2, 2}));
  EXPECT_EQ(t.GetDouble(0), 1.5);
  EXPECT_EQ(t.GetDouble(1), -2.0);
  EXPECT_EQ(t.GetDouble(3), 8.0);
  EXPECT_EQ(t.data<float>()[2], 0.25f);
}

TEST(TensorTest, GetDoubleOfSixteenBitFloats) {
  // float16: 1.0 = 0x3c00, -2.5 = 0xc100, 65504 = 0x7bff, 2^-24 = 0x0001.
  const Tensor half =
      Tensor::FromVector<uint16_t>(DType::kFloat16, {4}, {0x3c00, 0xc100, 0x7bff, 0x0001});
  EXPECT_EQ(half.byte_size(), 8u);
  EXPECT_EQ(half.GetDouble(0), 1.0);
  EXPECT_EQ(half.GetDouble(1), -2.5);
  EXPECT_EQ(half.GetDouble(2), 65504.0);
  EXPECT_EQ(half.GetDouble(3), std::ldexp(1.0, -24));

  // bfloat16: 1.0 = 0x3f80, -3.0 = 0xc040, 1/128 = 0x3c00 (exponent 120).
  const Tensor bf16 = Tensor::FromVector<uint16_t>(DType::kBFloat16, {3}, {0x3f80, 0xc040, 0x3c00});
  EXPECT_EQ(bf16.GetDouble(0), 1.0);
  EXPECT_EQ(bf16.GetDouble(1), -3.0);
  EXPECT_EQ(bf16.GetDouble(2), 1.0 / 128);
}

TEST(TensorTest, GetDoubleAndInt64OfIntegerTypes) {
  const Tensor i8 = Tensor::FromVector<int8_t>(DType::kInt8, {2}, {-128, 127});
  EXPECT_EQ(i8.GetDouble(0), -128.0);
  EXPECT_EQ(i8.GetInt64(1), 127);
  const Tensor u8 = Tensor::FromVector<uint8_t>(DType::kUInt8, {1}, {255});
  EXPECT_EQ(u8.GetDouble(0), 255.0);
  const Tensor i32 = Tensor::FromVector<int32_t>(DType::kInt32, {2}, {-7, 1 << 30});
  EXPECT_EQ(i32.GetDouble(0), -7.0);
  EXPECT_EQ(i32.GetInt64(1), 1 << 30);
  const Tensor u32 = Tensor::FromVector<uint32_t>(DType::kUInt32, {1}, {4000000000u});
  EXPECT_EQ(u32.GetInt64(0), 4000000000);
  // int64 beyond 2^53 must not go through double in GetInt64.
  const int64_t big = (int64_t{1} << 60) + 1;
  const Tensor i64 = Tensor::FromVector<int64_t>(DType::kInt64, {2}, {big, -3});
  EXPECT_EQ(i64.GetInt64(0), big);
  EXPECT_EQ(i64.GetDouble(1), -3.0);
  const Tensor flags = Tensor::FromVector<uint8_t>(DType::kBool, {2}, {0, 1});
  EXPECT_EQ(flags.GetDouble(0), 0.0);
  EXPECT_EQ(flags.GetDouble(1), 1.0);

  EXPECT_THAT(Tensor::Int64s({4, -1, 7}).ToInt64Vector(), ElementsAre(4, -1, 7));
  EXPECT_THAT(Tensor::Int64s({4, -1, 7}).dims(), ElementsAre(3));
  const Tensor scalar = Tensor::Scalar(0.5f);
  EXPECT_THAT(scalar.dims(), IsEmpty());
  EXPECT_EQ(scalar.num_elements(), 1);
  EXPECT_EQ(scalar.GetDouble(0), 0.5);
}

TEST(TensorTest, ZeroFilledConstructor) {
  const Tensor t(DType::kFloat64, {3, 0});
  EXPECT_EQ(t.num_elements(), 0);
  EXPECT_EQ(t.byte_size(), 0u);
  const Tensor z(DType::kInt16, {3});
  EXPECT_EQ(z.byte_size(), 6u);
  EXPECT_EQ(z.GetInt64(2), 0);
  const Tensor s(DType::kString, {2});
  EXPECT_EQ(s.strings().size(), 2u);
  EXPECT_EQ(s.byte_size(), 0u);
}

TEST(TensorTest, EqualityComparesDTypeDimsAndBytes) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor a = Tensor::FromVector<float>(DType::kFloat32, {2}, {1.0f, nan});
  const Tensor b = Tensor::FromVector<float>(DType::kFloat32, {2}, {1.0f, nan});
  EXPECT_EQ(a, b);  // same NaN bits compare equal
  EXPECT_NE(a, Tensor::FromVector<float>(DType::kFloat32, {2}, {1.0f, 2.0f}));
  EXPECT_NE(a, Tensor::FromVector<float>(DType::kFloat32, {1, 2}, {1.0f, nan}));
  // +0 and -0 are equal numbers but different bytes.
  EXPECT_NE(Tensor::Scalar(0.0f), Tensor::Scalar(-0.0f));
  // Same bytes, different dtype.
  EXPECT_NE(Tensor::FromVector<int32_t>(DType::kInt32, {1}, {0}),
            Tensor::FromVector<uint32_t>(DType::kUInt32, {1}, {0}));
}

TEST(TensorDeathTest, FromVectorRejectsWrongElementCount) {
  EXPECT_DEATH(Tensor::FromVector<float>(DType::kFloat32, {3}, {1.0f, 2.0f}),
               "FromVector.*2 values.*3 elements");
  EXPECT_DEATH(Tensor::FromVector<int32_t>(DType::kInt64, {2}, {1, 2}),
               "FromVector.*4-byte.*int64");
}

// ------------------------------------------------------------------ Attribute

TEST(AttributeTest, ToString) {
  EXPECT_EQ(Attribute::Int("axis", -1).ToString(), "-1");
  EXPECT_EQ(Attribute::Float("alpha", 0.5f).ToString(), "0.5");
  EXPECT_EQ(Attribute::String("auto_pad", "NOTSET").ToString(), "\"NOTSET\"");
  EXPECT_EQ(Attribute::Ints("strides", {1, 1}).ToString(), "[1,1]");
  EXPECT_EQ(Attribute::Ints("axes", {}).ToString(), "[]");
  EXPECT_EQ(Attribute::Floats("scales", {1.0f, 2.5f}).ToString(), "[1,2.5]");
  EXPECT_EQ(Attribute::TensorValue("value", Tensor::Int64s({1, 2, 3})).ToString(),
            "<tensor int64 [3]>");
  EXPECT_EQ(Attribute::TensorValue("value", Tensor::Scalar(1.0f)).ToString(),
            "<tensor float32 []>");

  Attribute strings;
  strings.name = "names";
  strings.kind = AttrKind::kStrings;
  strings.strings = {"a", "b"};
  EXPECT_EQ(strings.ToString(), "[\"a\",\"b\"]");
  strings.strings.clear();
  EXPECT_EQ(strings.ToString(), "[]");

  Attribute graph;
  graph.kind = AttrKind::kGraph;
  graph.serialized = {"..."};
  EXPECT_EQ(graph.ToString(), "<graph>");
  Attribute sparse;
  sparse.kind = AttrKind::kSparseTensor;
  EXPECT_EQ(sparse.ToString(), "<sparse_tensor>");
}

TEST(AttributeTest, Equality) {
  EXPECT_EQ(Attribute::Int("axis", 1), Attribute::Int("axis", 1));
  EXPECT_NE(Attribute::Int("axis", 1), Attribute::Int("axis", 2));
  EXPECT_NE(Attribute::Int("axis", 1), Attribute::Int("axes", 1));
  EXPECT_NE(Attribute::Int("x", 0), Attribute::Float("x", 0.0f));  // kind differs

  // Floats compare by bits: a NaN attribute equals itself, +0 != -0.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Attribute::Float("f", nan), Attribute::Float("f", nan));
  EXPECT_NE(Attribute::Float("f", 0.0f), Attribute::Float("f", -0.0f));
  EXPECT_EQ(Attribute::Floats("fs", {1.0f, nan}), Attribute::Floats("fs", {1.0f, nan}));
  EXPECT_NE(Attribute::Floats("fs", {1.0f, nan}), Attribute::Floats("fs", {1.0f}));
  EXPECT_NE(Attribute::Floats("fs", {1.0f, nan}), Attribute::Floats("fs", {1.0f, 2.0f}));

  EXPECT_EQ(Attribute::TensorValue("v", Tensor::Int64s({1})),
            Attribute::TensorValue("v", Tensor::Int64s({1})));
  EXPECT_NE(Attribute::TensorValue("v", Tensor::Int64s({1})),
            Attribute::TensorValue("v", Tensor::Int64s({2})));

  Attribute with_doc = Attribute::Int("axis", 1);
  with_doc.doc_string = "the axis";
  EXPECT_NE(with_doc, Attribute::Int("axis", 1));
}

// ------------------------------------------------------------------ Graph

// x -> Relu "relu" -> y -> Neg "neg" -> z, output z.
class ChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    x_ = ValueOrDie(graph_.AddInput("x", DType::kFloat32, Shape({Dim::Symbol("N"), 4})));
    relu_ = ValueOrDie(graph_.AddNode("Relu", {x_}, {"y"}, "relu"));
    y_ = relu_->output(0);
    neg_ = ValueOrDie(graph_.AddNode("Neg", {y_}, {"z"}, "neg"));
    z_ = neg_->output(0);
    graph_.AddOutput(z_);
  }

  Graph graph_;
  Value* x_ = nullptr;
  Value* y_ = nullptr;
  Value* z_ = nullptr;
  Node* relu_ = nullptr;
  Node* neg_ = nullptr;
};

TEST_F(ChainTest, Definitions) {
  EXPECT_TRUE(x_->is_graph_input());
  EXPECT_EQ(x_->producer(), nullptr);
  EXPECT_EQ(x_->dtype(), DType::kFloat32);
  EXPECT_EQ(x_->shape().ToString(), "[N,4]");
  EXPECT_THAT(graph_.inputs(), ElementsAre(x_));

  EXPECT_EQ(y_->name(), "y");
  EXPECT_EQ(y_->producer(), relu_);
  EXPECT_EQ(y_->producer_output(), 0);
  EXPECT_FALSE(y_->is_graph_input());
  EXPECT_EQ(y_->dtype(), DType::kUndefined);  // not inferred yet
  EXPECT_TRUE(z_->is_graph_output());
  EXPECT_FALSE(y_->is_graph_output());

  EXPECT_EQ(relu_->op_type(), "Relu");
  EXPECT_EQ(relu_->domain(), "");
  EXPECT_EQ(relu_->graph(), &graph_);
  EXPECT_THAT(relu_->inputs(), ElementsAre(x_));
  EXPECT_EQ(relu_->input(1), nullptr);  // past the end
  EXPECT_EQ(relu_->output(1), nullptr);
  EXPECT_EQ(graph_.num_nodes(), 2);
  EXPECT_THAT(NodeNames(graph_), ElementsAre("relu", "neg"));

  EXPECT_EQ(graph_.FindValue("y"), y_);
  EXPECT_EQ(graph_.FindValue("nope"), nullptr);
  EXPECT_EQ(graph_.FindNode("neg"), neg_);
  EXPECT_EQ(graph_.FindNode("y"), nullptr);

  EXPECT_THAT(x_->uses(), ElementsAre(Use{relu_, 0}));
  EXPECT_THAT(y_->uses(), ElementsAre(Use{neg_, 0}));
  EXPECT_THAT(z_->uses(), IsEmpty());  // graph outputs are not uses
}

TEST_F(ChainTest, InitializersAndDomains) {
  Value* w = ValueOrDie(graph_.AddInitializer("w", Tensor::FromVector<float>(
                                                       DType::kFloat32, {4}, {1, 2, 3, 4})));
  EXPECT_EQ(w->dtype(), DType::kFloat32);
  EXPECT_EQ(w->shape(), Shape::FromDims({4}));
  ASSERT_NE(w->initializer(), nullptr);
  EXPECT_EQ(w->initializer()->GetDouble(3), 4.0);
  EXPECT_FALSE(w->is_graph_input());
  EXPECT_THAT(graph_.initializers(), ElementsAre(w));
  EXPECT_THAT(graph_.inputs(), ElementsAre(x_));

  // An input with a default: still an input, now also an initializer.
  Value* bias = ValueOrDie(graph_.AddInput("bias", DType::kFloat32, Shape::Unknown()));
  graph_.SetInitializerOfInput(bias, Tensor::FromVector<float>(DType::kFloat32, {1}, {0.5f}));
  EXPECT_TRUE(bias->is_graph_input());
  EXPECT_EQ(bias->shape(), Shape::FromDims({1}));
  EXPECT_THAT(graph_.initializers(), ElementsAre(w, bias));
  // Setting it again replaces the data without listing it twice.
  graph_.SetInitializerOfInput(bias, Tensor::FromVector<float>(DType::kFloat32, {2}, {1, 2}));
  EXPECT_THAT(graph_.initializers(), ElementsAre(w, bias));
  EXPECT_EQ(bias->shape(), Shape::FromDims({2}));

  Node* custom = ValueOrDie(graph_.AddNode("Mul", {y_, w}, {"m"}, "mul", "ai.onnx"));
  EXPECT_EQ(custom->domain(), "");  // canonical
  Node* sgd = ValueOrDie(
      graph_.AddNode("Adam", {w}, {"w_new"}, "adam", "ai.onnx.preview.training"));
  EXPECT_EQ(sgd->domain(), "ai.onnx.preview.training");
}

TEST_F(ChainTest, DuplicateNamesAreRejectedNamingTheValue) {
  absl::StatusOr<Value*> input = graph_.AddInput("y", DType::kFloat32, Shape::Scalar());
  ASSERT_FALSE(input.ok());
  EXPECT_EQ(input.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(input.status().message()), HasSubstr("'y'"));

  absl::StatusOr<Value*> init = graph_.AddInitializer("x", Tensor::Scalar(1.0f));
  ASSERT_FALSE(init.ok());
  EXPECT_THAT(std::string(init.status().message()), HasSubstr("'x'"));

  absl::StatusOr<Node*> node = graph_.AddNode("Relu", {x_}, {"z"}, "relu2");
  ASSERT_FALSE(node.ok());
  EXPECT_THAT(std::string(node.status().message()), HasSubstr("'z'"));
  EXPECT_THAT(std::string(node.status().message()), HasSubstr("relu2"));

  // Two outputs of one node with the same name.
  absl::StatusOr<Node*> twice = graph_.AddNode("Split", {x_}, {"part", "part"}, "split");
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("'part'"));

  absl::StatusOr<Value*> unnamed = graph_.AddInput("", DType::kFloat32, Shape::Scalar());
  EXPECT_FALSE(unnamed.ok());

  // Failed additions leave the graph unchanged.
  EXPECT_EQ(graph_.num_nodes(), 2);
  EXPECT_EQ(graph_.FindValue("part"), nullptr);
  EXPECT_THAT(graph_.inputs(), ElementsAre(x_));
  EXPECT_THAT(x_->uses(), ElementsAre(Use{relu_, 0}));
}

TEST_F(ChainTest, FreshOutputNames) {
  Node* a = ValueOrDie(graph_.AddNode("Relu", {x_}, {""}, "act"));
  EXPECT_EQ(a->output(0)->name(), "act_out");
  Node* b = ValueOrDie(graph_.AddNode("Relu", {x_}, {""}, "act"));
  EXPECT_EQ(b->output(0)->name(), "act_out_1");
  Node* c = ValueOrDie(graph_.AddNode("Sigmoid", {x_}, {"", ""}));
  EXPECT_EQ(c->output(0)->name(), "Sigmoid_out");
  EXPECT_EQ(c->output(1)->name(), "Sigmoid_out_1");
  // A fresh name never clashes with an explicit one of the same node.
  Node* d = ValueOrDie(graph_.AddNode("TopK", {x_}, {"", "TopK_out"}, ""));
  EXPECT_NE(d->output(0)->name(), "TopK_out");
  EXPECT_EQ(d->output(1)->name(), "TopK_out");
  EXPECT_EQ(graph_.FindValue(d->output(0)->name()), d->output(0));
}

TEST_F(ChainTest, SetInputTracksUses) {
  // One node using the same value twice has two uses.
  Node* add = ValueOrDie(graph_.AddNode("Add", {y_, y_}, {"sum"}, "add"));
  EXPECT_THAT(y_->uses(), ElementsAre(Use{neg_, 0}, Use{add, 0}, Use{add, 1}));

  add->SetInput(1, x_);
  EXPECT_THAT(y_->uses(), ElementsAre(Use{neg_, 0}, Use{add, 0}));
  EXPECT_THAT(x_->uses(), ElementsAre(Use{relu_, 0}, Use{add, 1}));
  EXPECT_THAT(add->inputs(), ElementsAre(y_, x_));

  // Growing the input list leaves omitted (nullptr) slots between.
  add->SetInput(3, z_);
  EXPECT_EQ(add->num_inputs(), 4);
  EXPECT_EQ(add->input(2), nullptr);
  EXPECT_THAT(z_->uses(), ElementsAre(Use{add, 3}));

  add->SetInput(3, nullptr);
  EXPECT_THAT(z_->uses(), IsEmpty());
  add->AddInput(x_);
  EXPECT_THAT(x_->uses(), ElementsAre(Use{relu_, 0}, Use{add, 1}, Use{add, 4}));
}

TEST_F(ChainTest, ReplaceAllUsesWith) {
  Node* add = ValueOrDie(graph_.AddNode("Add", {y_, y_}, {"sum"}, "add"));
  Node* loop = ValueOrDie(graph_.AddNode("Loop", {}, {"loop_out"}, "loop"));
  loop->AddImplicitInput(y_);
  graph_.AddOutput(y_);
  Value* replacement = ValueOrDie(graph_.AddInput("r", DType::kFloat32, Shape::Unknown()));

  graph_.ReplaceAllUsesWith(y_, replacement);

  EXPECT_THAT(y_->uses(), IsEmpty());
  EXPECT_FALSE(y_->is_graph_output());
  EXPECT_THAT(neg_->inputs(), ElementsAre(replacement));
  EXPECT_THAT(add->inputs(), ElementsAre(replacement, replacement));
  EXPECT_THAT(loop->implicit_inputs(), ElementsAre(replacement));
  EXPECT_THAT(replacement->uses(),
              UnorderedElementsAre(Use{neg_, 0}, Use{add, 0}, Use{add, 1}, Use{loop, -1}));
  EXPECT_THAT(graph_.outputs(), ElementsAre(z_, replacement));
  EXPECT_TRUE(replacement->is_graph_output());

  // Now relu's output is unused and can go.
  EXPECT_TRUE(graph_.RemoveNode(relu_).ok());
  EXPECT_THAT(x_->uses(), IsEmpty());
}

TEST_F(ChainTest, ReplaceAllUsesWithItselfIsANoOp) {
  Node* loop = ValueOrDie(graph_.AddNode("Loop", {}, {"loop_out"}, "loop"));
  loop->AddImplicitInput(y_);
  graph_.ReplaceAllUsesWith(y_, y_);
  EXPECT_THAT(y_->uses(), UnorderedElementsAre(Use{neg_, 0}, Use{loop, -1}));
  EXPECT_THAT(loop->implicit_inputs(), ElementsAre(y_));
  EXPECT_THAT(neg_->inputs(), ElementsAre(y_));
}

TEST_F(ChainTest, GraphOutputBookkeeping) {
  graph_.AddOutput(z_);  // listed twice
  EXPECT_THAT(graph_.outputs(), ElementsAre(z_, z_));
  graph_.SetOutput(0, y_);
  EXPECT_TRUE(z_->is_graph_output());  // still the second output
  EXPECT_TRUE(y_->is_graph_output());
  graph_.SetOutput(1, y_);
  EXPECT_FALSE(z_->is_graph_output());
  graph_.ClearOutputs();
  EXPECT_FALSE(y_->is_graph_output());
  EXPECT_THAT(graph_.outputs(), IsEmpty());
}

TEST_F(ChainTest, RemoveNodeRefusesWhileOutputsAreUsed) {
  absl::Status used = graph_.RemoveNode(relu_);
  EXPECT_EQ(used.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(used.message()), HasSubstr("'relu'"));
  EXPECT_THAT(std::string(used.message()), HasSubstr("'y'"));

  absl::Status output = graph_.RemoveNode(neg_);  // z is a graph output
  EXPECT_EQ(output.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(output.message()), HasSubstr("'z'"));
  EXPECT_EQ(graph_.num_nodes(), 2);
}

TEST_F(ChainTest, RemoveNodeWhenUnused) {
  Node* loop = ValueOrDie(graph_.AddNode("Loop", {x_, nullptr, y_}, {"loop_out"}, "loop"));
  loop->AddImplicitInput(y_);
  EXPECT_EQ(y_->uses().size(), 3u);

  ASSERT_TRUE(graph_.RemoveNode(loop).ok());
  EXPECT_THAT(NodeNames(graph_), ElementsAre("relu", "neg"));
  EXPECT_THAT(x_->uses(), ElementsAre(Use{relu_, 0}));
  EXPECT_THAT(y_->uses(), ElementsAre(Use{neg_, 0}));
  EXPECT_EQ(graph_.FindValue("loop_out"), nullptr);
  // Its output name is free again.
  EXPECT_TRUE(graph_.AddInput("loop_out", DType::kFloat32, Shape::Unknown()).ok());

  graph_.ClearOutputs();
  ASSERT_TRUE(graph_.RemoveNode(neg_).ok());
  ASSERT_TRUE(graph_.RemoveNode(relu_).ok());
  EXPECT_EQ(graph_.num_nodes(), 0);
  EXPECT_THAT(x_->uses(), IsEmpty());
}

TEST_F(ChainTest, RemoveInitializer) {
  Value* w = ValueOrDie(graph_.AddInitializer("w", Tensor::Scalar(2.0f)));
  Node* mul = ValueOrDie(graph_.AddNode("Mul", {y_, w}, {"m"}, "mul"));

  absl::Status used = graph_.RemoveInitializer(w);
  EXPECT_EQ(used.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(used.message()), HasSubstr("'w'"));
  absl::Status produced = graph_.RemoveInitializer(y_);  // has a producer
  EXPECT_EQ(produced.code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(graph_.RemoveNode(mul).ok());
  ASSERT_TRUE(graph_.RemoveInitializer(w).ok());
  EXPECT_THAT(graph_.initializers(), IsEmpty());
  EXPECT_EQ(graph_.FindValue("w"), nullptr);

  // An input with a default disappears from both lists.
  Value* bias = ValueOrDie(graph_.AddInput("bias", DType::kFloat32, Shape::Unknown()));
  graph_.SetInitializerOfInput(bias, Tensor::Scalar(0.0f));
  ASSERT_TRUE(graph_.RemoveInitializer(bias).ok());
  EXPECT_THAT(graph_.inputs(), ElementsAre(x_));
  EXPECT_THAT(graph_.initializers(), IsEmpty());
}

TEST_F(ChainTest, UniqueName) {
  EXPECT_EQ(graph_.UniqueName("fresh"), "fresh");
  // A returned name is reserved even before a value takes it.
  EXPECT_EQ(graph_.UniqueName("fresh"), "fresh_1");
  EXPECT_EQ(graph_.UniqueName("fresh"), "fresh_2");
  // Existing values are skipped.
  EXPECT_EQ(graph_.UniqueName("y"), "y_1");
  ASSERT_TRUE(graph_.AddInput("x_1", DType::kFloat32, Shape::Unknown()).ok());
  EXPECT_EQ(graph_.UniqueName("x"), "x_2");
  // Node names count as used too ("relu" is a node, not a value).
  EXPECT_EQ(graph_.UniqueName("relu"), "relu_1");
}

TEST_F(ChainTest, NodeAttributesAndMetadata) {
  relu_->SetAttribute(Attribute::Int("axis", 1));
  relu_->SetAttribute(Attribute::Float("alpha", 0.25f));
  relu_->SetAttribute(Attribute::Int("axis", 2));  // replaces in place
  ASSERT_EQ(relu_->attributes().size(), 2u);
  EXPECT_EQ(relu_->attributes()[0].name, "axis");
  EXPECT_EQ(relu_->GetInt("axis", 0), 2);
  EXPECT_EQ(relu_->GetFloat("alpha", 0), 0.25f);
  EXPECT_EQ(relu_->GetInt("alpha", 7), 7);  // wrong kind -> default
  EXPECT_EQ(relu_->GetString("mode", "linear"), "linear");
  EXPECT_THAT(relu_->GetInts("perm", {1, 0}), ElementsAre(1, 0));
  relu_->RemoveAttribute("axis");
  EXPECT_FALSE(relu_->has_attribute("axis"));
  EXPECT_TRUE(relu_->has_attribute("alpha"));

  EXPECT_EQ(relu_->FindMetadata("autocast"), nullptr);
  relu_->SetMetadata("autocast", "allow");
  relu_->SetMetadata("autocast", "deny: rule 3");
  ASSERT_NE(relu_->FindMetadata("autocast"), nullptr);
  EXPECT_EQ(*relu_->FindMetadata("autocast"), "deny: rule 3");
  EXPECT_EQ(relu_->metadata().size(), 1u);
}

// ------------------------------------------------------------------ TopologicalSort

TEST(TopologicalSortTest, KeepsAnAlreadySortedOrder) {
  Graph graph;
  Value* x = ValueOrDie(graph.AddInput("x", DType::kFloat32, Shape::Unknown()));
  // Independent branches interleaved: any order of b1/b2 chains is valid,
  // so a stable sort must not touch it.
  Node* a2 = ValueOrDie(graph.AddNode("Relu", {x}, {"a2"}, "a2"));
  Node* a1 = ValueOrDie(graph.AddNode("Relu", {x}, {"a1"}, "a1"));
  Node* b2 = ValueOrDie(graph.AddNode("Relu", {a2->output(0)}, {"b2"}, "b2"));
  Node* b1 = ValueOrDie(graph.AddNode("Relu", {a1->output(0)}, {"b1"}, "b1"));
  ValueOrDie(graph.AddNode("Add", {b1->output(0), b2->output(0)}, {"c"}, "c"));
  ASSERT_TRUE(graph.TopologicalSort().ok());
  EXPECT_THAT(NodeNames(graph), ElementsAre("a2", "a1", "b2", "b1", "c"));
}

TEST(TopologicalSortTest, SortsAReversedChain) {
  Graph graph;
  Value* x = ValueOrDie(graph.AddInput("x", DType::kFloat32, Shape::Unknown()));
  // Added as c, b, a (all reading x), then rewired to x -> a -> b -> c.
  Node* c = ValueOrDie(graph.AddNode("Relu", {x}, {"c_out"}, "c"));
  Node* b = ValueOrDie(graph.AddNode("Relu", {x}, {"b_out"}, "b"));
  Node* a = ValueOrDie(graph.AddNode("Relu", {x}, {"a_out"}, "a"));
  b->SetInput(0, a->output(0));
  c->SetInput(0, b->output(0));
  ASSERT_TRUE(graph.TopologicalSort().ok());
  EXPECT_THAT(NodeNames(graph), ElementsAre("a", "b", "c"));
  // Sorting again changes nothing.
  ASSERT_TRUE(graph.TopologicalSort().ok());
  EXPECT_THAT(NodeNames(graph), ElementsAre("a", "b", "c"));
}

TEST(TopologicalSortTest, ImplicitInputsAreDependencies) {
  Graph graph;
  Value* x = ValueOrDie(graph.AddInput("x", DType::kFloat32, Shape::Unknown()));
  Node* loop = ValueOrDie(graph.AddNode("Loop", {}, {"loop_out"}, "loop"));
  Node* relu = ValueOrDie(graph.AddNode("Relu", {x}, {"r"}, "relu"));
  loop->AddImplicitInput(relu->output(0));
  ASSERT_TRUE(graph.TopologicalSort().ok());
  EXPECT_THAT(NodeNames(graph), ElementsAre("relu", "loop"));
}

TEST(TopologicalSortTest, DetectsACycleNamingANodeOnIt) {
  Graph graph;
  Value* x = ValueOrDie(graph.AddInput("x", DType::kFloat32, Shape::Unknown()));
  // "after" reads the cycle's output but is not on the cycle, and comes
  // first in the node list.
  Node* after = ValueOrDie(graph.AddNode("Relu", {x}, {"after_out"}, "after"));
  Node* p = ValueOrDie(graph.AddNode("Relu", {x}, {"p_out"}, "p"));
  Node* q = ValueOrDie(graph.AddNode("Relu", {p->output(0)}, {"q_out"}, "q"));
  p->SetInput(0, q->output(0));
  after->SetInput(0, q->output(0));
  const std::vector<std::string> before = NodeNames(graph);

  absl::Status status = graph.TopologicalSort();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
  EXPECT_THAT(message, HasSubstr("cycle"));
  EXPECT_TRUE(message.find("'p'") != std::string::npos ||
              message.find("'q'") != std::string::npos)
      << message;
  EXPECT_EQ(message.find("'after'"), std::string::npos) << message;
  EXPECT_EQ(NodeNames(graph), before);  // order untouched on failure
}

TEST(TopologicalSortTest, SelfLoop) {
  Graph graph;
  Value* x = ValueOrDie(graph.AddInput("x", DType::kFloat32, Shape::Unknown()));
  Node* self = ValueOrDie(graph.AddNode("Add", {x, x}, {"s"}, "self"));
  self->SetInput(1, self->output(0));
  absl::Status status = graph.TopologicalSort();
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("'self'"));
}

TEST(TopologicalSortTest, ReadingAnotherGraphsNodeOutputIsAnError) {
  Graph other;
  Value* other_x = ValueOrDie(other.AddInput("ox", DType::kFloat32, Shape::Unknown()));
  Node* foreign = ValueOrDie(other.AddNode("Relu", {other_x}, {"foreign_out"}, "foreign"));
  Graph graph;
  Value* x = ValueOrDie(graph.AddInput("x", DType::kFloat32, Shape::Unknown()));
  Node* reader = ValueOrDie(graph.AddNode("Add", {x, x}, {"sum"}, "reader"));
  reader->SetInput(1, foreign->output(0));
  absl::Status status = graph.TopologicalSort();
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("'reader'"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("'foreign_out'"));
  reader->SetInput(1, nullptr);  // detach before `other` goes away
}

// ------------------------------------------------------------------ Model

TEST(ModelTest, OpsetVersionTreatsEmptyAndAiOnnxAlike) {
  Model model;
  model.opset_imports = {{"ai.onnx", 17}, {"ai.onnx.preview.training", 1}};
  EXPECT_EQ(model.OpsetVersion(""), 17);
  EXPECT_EQ(model.OpsetVersion("ai.onnx"), 17);
  EXPECT_EQ(model.OpsetVersion("ai.onnx.preview.training"), 1);
  EXPECT_EQ(model.OpsetVersion("com.microsoft"), 0);

  Model plain;
  plain.opset_imports = {{"", 13}};
  EXPECT_EQ(plain.OpsetVersion("ai.onnx"), 13);
  EXPECT_EQ(plain.OpsetVersion(""), 13);

  EXPECT_EQ(CanonicalDomain("ai.onnx"), "");
  EXPECT_EQ(CanonicalDomain("com.microsoft"), "com.microsoft");
}

TEST(ModelTest, Metadata) {
  Model model;
  EXPECT_EQ(model.FindMetadata("castor.policy"), nullptr);
  model.SetMetadata("castor.policy", "mixed_float16");
  model.SetMetadata("castor.step", "10");
  model.SetMetadata("castor.policy", "mixed_bfloat16");  // overwrite keeps position
  ASSERT_NE(model.FindMetadata("castor.policy"), nullptr);
  EXPECT_EQ(*model.FindMetadata("castor.policy"), "mixed_bfloat16");
  EXPECT_EQ(*model.FindMetadata("castor.step"), "10");
  ASSERT_EQ(model.metadata_props.size(), 2u);
  EXPECT_EQ(model.metadata_props[0].first, "castor.policy");
  ASSERT_NE(model.graph, nullptr);
  EXPECT_EQ(model.graph->num_nodes(), 0);
}

}  // namespace
}  // namespace castor
