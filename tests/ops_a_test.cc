// Dtype and shape inference of the elementwise, matmul, conv, pool,
// normalization, softmax, loss and training-optimizer op families: small
// graphs built in code, InferTypes, then the exact output dtypes/shapes, the
// opset-version differences and the errors (which must name the node).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"

namespace castor {
namespace {

using ::testing::HasSubstr;

Dim Sym(const std::string& name) { return Dim::Symbol(name); }

// A one-model test bench: graph inputs, nodes with attributes, inference.
class Bench {
 public:
  explicit Bench(int64_t opset, int64_t training_opset = 0) {
    model_.opset_imports.push_back({"", opset});
    if (training_opset > 0) model_.opset_imports.push_back({kTrainingDomain, training_opset});
  }

  Value* In(const std::string& name, DType dtype, Shape shape) {
    absl::StatusOr<Value*> v = model_.graph->AddInput(name, dtype, std::move(shape));
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : nullptr;
  }

  // A node named `name` whose outputs are "<name>_out<k>".
  Node* Op(const std::string& op_type, const std::vector<Value*>& inputs, int num_outputs = 1,
           const std::vector<Attribute>& attributes = {}, const std::string& name = "node",
           const std::string& domain = "") {
    std::vector<std::string> outputs;
    for (int k = 0; k < num_outputs; ++k) outputs.push_back(name + "_out" + std::to_string(k));
    absl::StatusOr<Node*> node = model_.graph->AddNode(op_type, inputs, outputs, name, domain);
    EXPECT_TRUE(node.ok()) << node.status();
    if (!node.ok()) return nullptr;
    for (const Attribute& a : attributes) (*node)->SetAttribute(a);
    return *node;
  }

  absl::Status Infer() { return InferTypes(model_); }

 private:
  Model model_;
};

// "float32 [N,3,4]" for compact expectations.
std::string TypeOf(const Value* v) {
  return std::string(DTypeName(v->dtype())) + " " + v->shape().ToString();
}

// Infers and returns the types of the node's outputs; on error, the message.
std::vector<std::string> InferOutputs(Bench& bench, const Node* node) {
  absl::Status status = bench.Infer();
  if (!status.ok()) return {"error: " + std::string(status.message())};
  std::vector<std::string> types;
  for (const Value* out : node->outputs()) types.push_back(TypeOf(out));
  return types;
}

// The error message of inference, which must fail.
std::string InferError(Bench& bench) {
  absl::Status status = bench.Infer();
  EXPECT_FALSE(status.ok()) << "inference unexpectedly succeeded";
  return std::string(status.message());
}

using Strings = std::vector<std::string>;

// ---------------------------------------------------------------- elementwise

TEST(Elementwise, BinaryBroadcastKeepsSymbolicDims) {
  Bench b(14);
  Node* add =
      b.Op("Add", {b.In("a", DType::kFloat32, {Sym("N"), 3, 1}), b.In("b", DType::kFloat32, {4})});
  EXPECT_EQ(InferOutputs(b, add), Strings{"float32 [N,3,4]"});
}

TEST(Elementwise, BroadcastOfTwoDifferentSymbolsIsUnknown) {
  Bench b(14);
  Node* mul = b.Op("Mul", {b.In("a", DType::kFloat32, {Sym("N"), 3}),
                           b.In("b", DType::kFloat32, {Sym("M"), 1})});
  EXPECT_EQ(InferOutputs(b, mul), Strings{"float32 [?,3]"});
}

TEST(Elementwise, BroadcastOfSymbolAndStaticTakesTheNumber) {
  Bench b(14);
  Node* sub =
      b.Op("Sub", {b.In("a", DType::kFloat16, {Sym("N"), 1}), b.In("b", DType::kFloat16, {5, 7})});
  EXPECT_EQ(InferOutputs(b, sub), Strings{"float16 [5,7]"});
}

TEST(Elementwise, MismatchedBroadcastNamesTheNode) {
  Bench b(14);
  b.Op("Add", {b.In("a", DType::kFloat32, {2, 3}), b.In("b", DType::kFloat32, {4})}, 1, {},
       "add_bad");
  const std::string error = InferError(b);
  EXPECT_THAT(error, HasSubstr("Add node 'add_bad'"));
  EXPECT_THAT(error, HasSubstr("[4]"));
  EXPECT_THAT(error, HasSubstr("[2,3]"));
}

TEST(Elementwise, MixedInputDtypesAreAnError) {
  Bench b(14);
  b.Op("Div", {b.In("a", DType::kFloat32, {3}), b.In("b", DType::kFloat16, {3})}, 1, {}, "div0");
  const std::string error = InferError(b);
  EXPECT_THAT(error, HasSubstr("Div node 'div0'"));
  EXPECT_THAT(error, HasSubstr("input 1 has dtype float16"));
}

TEST(Elementwise, SmallIntegerArithmeticNeedsOpset14) {
  {
    Bench b(13);
    b.Op("Add", {b.In("a", DType::kInt8, {3}), b.In("b", DType::kInt8, {3})}, 1, {}, "add8");
    EXPECT_THAT(InferError(b), HasSubstr("input 0 has dtype int8"));
  }
  {
    Bench b(14);
    Node* add = b.Op("Add", {b.In("a", DType::kInt8, {3}), b.In("b", DType::kInt8, {3})});
    EXPECT_EQ(InferOutputs(b, add), Strings{"int8 [3]"});
  }
}

TEST(Elementwise, BFloat16ArithmeticNeedsOpset13) {
  Bench b(12);
  b.Op("Mul", {b.In("a", DType::kBFloat16, {3}), b.In("b", DType::kBFloat16, {3})});
  EXPECT_THAT(InferError(b), HasSubstr("bfloat16"));
}

TEST(Elementwise, PowExponentMayHaveAnotherDtypeFromOpset12) {
  {
    Bench b(15);
    Node* pow = b.Op(
        "Pow", {b.In("x", DType::kFloat32, {2, 3}), b.In("y", DType::kInt64, Shape::Scalar())});
    EXPECT_EQ(InferOutputs(b, pow), Strings{"float32 [2,3]"});
  }
  {
    Bench b(15);  // an integer base with a float exponent keeps the base's dtype
    Node* pow = b.Op("Pow", {b.In("x", DType::kInt64, {3}), b.In("y", DType::kFloat32, {3})});
    EXPECT_EQ(InferOutputs(b, pow), Strings{"int64 [3]"});
  }
  {
    Bench b(11);
    b.Op("Pow", {b.In("x", DType::kFloat32, {3}), b.In("y", DType::kInt64, {3})}, 1, {}, "p");
    EXPECT_THAT(InferError(b), HasSubstr("Pow node 'p'"));
  }
}

TEST(Elementwise, UnaryOpsKeepDtypeAndShape) {
  for (const char* op : {"Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt",
                         "Reciprocal", "LeakyRelu"}) {
    SCOPED_TRACE(op);
    Bench b(16);
    Node* node = b.Op(op, {b.In("x", DType::kBFloat16, {Sym("N"), 8})});
    EXPECT_EQ(InferOutputs(b, node), Strings{"bfloat16 [N,8]"});
  }
}

TEST(Elementwise, UnaryDtypeHistories) {
  {
    Bench b(14);  // Relu accepts signed integers from opset 14
    Node* relu = b.Op("Relu", {b.In("x", DType::kInt32, {4})});
    EXPECT_EQ(InferOutputs(b, relu), Strings{"int32 [4]"});
  }
  {
    Bench b(13);
    b.Op("Relu", {b.In("x", DType::kInt32, {4})}, 1, {}, "relu_int");
    EXPECT_THAT(InferError(b), HasSubstr("Relu node 'relu_int': input 0 has dtype int32"));
  }
  {
    Bench b(15);  // LeakyRelu gained bfloat16 only at opset 16
    b.Op("LeakyRelu", {b.In("x", DType::kBFloat16, {4})}, 1, {Attribute::Float("alpha", 0.2f)});
    EXPECT_THAT(InferError(b), HasSubstr("bfloat16"));
  }
  {
    Bench b(17);
    b.Op("Sqrt", {b.In("x", DType::kInt64, {4})});
    EXPECT_THAT(InferError(b), HasSubstr("input 0 has dtype int64"));
  }
}

TEST(Elementwise, GeluApproximateAttribute) {
  {
    Bench b(20);
    Node* gelu = b.Op("Gelu", {b.In("x", DType::kFloat32, {2, 5})}, 1,
                      {Attribute::String("approximate", "tanh")});
    EXPECT_EQ(InferOutputs(b, gelu), Strings{"float32 [2,5]"});
  }
  {
    Bench b(20);
    b.Op("Gelu", {b.In("x", DType::kFloat32, {2, 5})}, 1, {Attribute::String("approximate", "erf")},
         "gelu1");
    EXPECT_THAT(InferError(b), HasSubstr("Gelu node 'gelu1': attribute 'approximate'"));
  }
  const OpDef* def = OpRegistry::Global().Find("", "Gelu");
  ASSERT_NE(def, nullptr);
  EXPECT_EQ(def->min_opset, 20);
}

TEST(Elementwise, EqualGivesBoolAndFollowsItsInputs) {
  Bench b(19);
  Node* eq =
      b.Op("Equal", {b.In("a", DType::kInt64, {Sym("N"), 1}), b.In("b", DType::kInt64, {1, 6})});
  EXPECT_EQ(InferOutputs(b, eq), Strings{"bool [N,6]"});
  EXPECT_EQ(OpRegistry::Global().Find("", "Equal")->autocast, AutocastCategory::kFollow);
}

TEST(Elementwise, EqualOnFloatsNeedsOpset11) {
  Bench b(10);
  b.Op("Equal", {b.In("a", DType::kFloat32, {3}), b.In("b", DType::kFloat32, {3})});
  EXPECT_THAT(InferError(b), HasSubstr("input 0 has dtype float32"));
}

TEST(Elementwise, WhereBroadcastsThreeWays) {
  Bench b(16);
  Node* where =
      b.Op("Where", {b.In("c", DType::kBool, {Sym("N"), 1, 1}),
                     b.In("x", DType::kFloat16, {1, 4, 1}), b.In("y", DType::kFloat16, {5})});
  EXPECT_EQ(InferOutputs(b, where), Strings{"float16 [N,4,5]"});
}

TEST(Elementwise, WhereNeedsABoolCondition) {
  Bench b(16);
  b.Op("Where",
       {b.In("c", DType::kFloat32, {3}), b.In("x", DType::kFloat32, {3}),
        b.In("y", DType::kFloat32, {3})},
       1, {}, "w");
  EXPECT_THAT(InferError(b), HasSubstr("Where node 'w': input 0 has dtype float32"));
}

TEST(Elementwise, VariadicMaxMinSumBroadcast) {
  for (const char* op : {"Max", "Min", "Sum"}) {
    SCOPED_TRACE(op);
    Bench b(13);
    Node* node = b.Op(op, {b.In("a", DType::kFloat32, {3, 1}), b.In("b", DType::kFloat32, {4}),
                           b.In("c", DType::kFloat32, {Sym("B"), 1, 1})});
    EXPECT_EQ(InferOutputs(b, node), Strings{"float32 [B,3,4]"});
  }
  {
    Bench b(13);  // one input is fine
    Node* node = b.Op("Max", {b.In("a", DType::kInt32, {2})});
    EXPECT_EQ(InferOutputs(b, node), Strings{"int32 [2]"});
  }
  {
    Bench b(13);
    b.Op("Min", {b.In("a", DType::kFloat32, {3}), b.In("b", DType::kFloat32, {2})}, 1, {}, "min0");
    EXPECT_THAT(InferError(b), HasSubstr("Min node 'min0'"));
  }
  {
    Bench b(13);  // Sum is float-only
    b.Op("Sum", {b.In("a", DType::kInt32, {2}), b.In("b", DType::kInt32, {2})});
    EXPECT_THAT(InferError(b), HasSubstr("input 0 has dtype int32"));
  }
  {
    Bench b(7);  // before opset 8 no broadcasting
    b.Op("Sum", {b.In("a", DType::kFloat32, {2, 3}), b.In("b", DType::kFloat32, {3})});
    EXPECT_THAT(InferError(b), HasSubstr("before opset 8"));
  }
}

TEST(Elementwise, ClipBoundsAreAttributesBeforeOpset11) {
  {
    Bench b(10);
    Node* clip = b.Op("Clip", {b.In("x", DType::kFloat32, {2, 3})}, 1,
                      {Attribute::Float("min", -1.f), Attribute::Float("max", 1.f)});
    EXPECT_EQ(InferOutputs(b, clip), Strings{"float32 [2,3]"});
  }
  {
    Bench b(10);
    b.Op("Clip", {b.In("x", DType::kFloat32, {2}), b.In("lo", DType::kFloat32, Shape::Scalar())}, 1,
         {}, "clip10");
    EXPECT_THAT(InferError(b), HasSubstr("Clip node 'clip10': min and max are inputs only from"));
  }
}

TEST(Elementwise, ClipBoundsAreInputsFromOpset11) {
  {
    Bench b(13);  // min omitted (nullptr), max given
    Node* clip = b.Op("Clip", {b.In("x", DType::kInt64, {Sym("N")}), nullptr,
                               b.In("hi", DType::kInt64, Shape::Scalar())});
    EXPECT_EQ(InferOutputs(b, clip), Strings{"int64 [N]"});
  }
  {
    Bench b(13);
    b.Op("Clip", {b.In("x", DType::kFloat32, {2})}, 1, {Attribute::Float("min", 0.f)}, "clip13");
    EXPECT_THAT(InferError(b),
                HasSubstr("Clip node 'clip13': attribute 'min' exists up to opset 10"));
  }
  {
    Bench b(13);
    b.Op("Clip", {b.In("x", DType::kFloat32, {2}), b.In("lo", DType::kFloat32, {2})});
    EXPECT_THAT(InferError(b), HasSubstr("must be a scalar"));
  }
  {
    Bench b(13);
    b.Op("Clip", {b.In("x", DType::kFloat32, {2}), b.In("lo", DType::kFloat16, Shape::Scalar())});
    EXPECT_THAT(InferError(b), HasSubstr("input 1 has dtype float16"));
  }
}

// --------------------------------------------------------------------- matmul

TEST(MatMul, NumpySemantics) {
  struct Case {
    Shape a, b;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{Sym("N"), 3, 4}, {4, 5}, "float32 [N,3,5]"},
      {{4}, {4}, "float32 []"},
      {{4}, {2, 4, 5}, "float32 [2,5]"},
      {{2, 3, 4}, {4}, "float32 [2,3]"},
      {{2, 1, 3, 4}, {5, 4, 6}, "float32 [2,5,3,6]"},
      {{3, 4}, {Sym("K"), 7}, "float32 [3,7]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.a.ToString() + " x " + c.b.ToString());
    Bench b(13);
    Node* mm = b.Op("MatMul", {b.In("a", DType::kFloat32, c.a), b.In("b", DType::kFloat32, c.b)});
    EXPECT_EQ(InferOutputs(b, mm), Strings{c.expected});
  }
}

TEST(MatMul, Errors) {
  {
    Bench b(13);
    b.Op("MatMul", {b.In("a", DType::kFloat32, {3, 4}), b.In("b", DType::kFloat32, {5, 6})}, 1, {},
         "mm");
    const std::string error = InferError(b);
    EXPECT_THAT(error, HasSubstr("MatMul node 'mm': inner dimensions differ"));
  }
  {
    Bench b(13);
    b.Op("MatMul", {b.In("a", DType::kFloat32, {2, 3, 4}), b.In("b", DType::kFloat32, {3, 4, 6})});
    EXPECT_THAT(InferError(b), HasSubstr("batch dimensions"));
  }
  {
    Bench b(13);
    b.Op("MatMul", {b.In("a", DType::kFloat32, Shape::Scalar()), b.In("b", DType::kFloat32, {3})});
    EXPECT_THAT(InferError(b), HasSubstr("rank >= 1"));
  }
}

TEST(Gemm, TransposeFlagsAndBroadcastC) {
  Bench b(13);
  Node* gemm = b.Op("Gemm",
                    {b.In("a", DType::kFloat32, {3, Sym("M")}), b.In("b", DType::kFloat32, {4, 3}),
                     b.In("c", DType::kFloat32, {4})},
                    1, {Attribute::Int("transA", 1), Attribute::Int("transB", 1)});
  EXPECT_EQ(InferOutputs(b, gemm), Strings{"float32 [M,4]"});
}

TEST(Gemm, NoTransposeAndScalarC) {
  Bench b(13);
  Node* gemm = b.Op("Gemm", {b.In("a", DType::kFloat16, {2, 3}), b.In("b", DType::kFloat16, {3, 4}),
                             b.In("c", DType::kFloat16, Shape::Scalar())});
  EXPECT_EQ(InferOutputs(b, gemm), Strings{"float16 [2,4]"});
}

TEST(Gemm, Errors) {
  {
    Bench b(13);  // without transB, B [5, 3] contracts over 5 and A [2, 3] over 3
    b.Op("Gemm", {b.In("a", DType::kFloat32, {2, 3}), b.In("b", DType::kFloat32, {5, 3})}, 1, {},
         "gemm_k");
    EXPECT_THAT(InferError(b), HasSubstr("Gemm node 'gemm_k': inner dimensions differ"));
  }
  {
    Bench b(13);
    b.Op("Gemm",
         {b.In("a", DType::kFloat32, {2, 3}), b.In("b", DType::kFloat32, {3, 4}),
          b.In("c", DType::kFloat32, {3, 4})},
         1, {}, "gemm_c");
    EXPECT_THAT(InferError(b), HasSubstr("Gemm node 'gemm_c': input C [3,4]"));
  }
  {
    Bench b(9);
    b.Op("Gemm", {b.In("a", DType::kFloat32, {2, 3}), b.In("b", DType::kFloat32, {3, 4})});
    EXPECT_THAT(InferError(b), HasSubstr("optional only from opset 11"));
  }
  {
    Bench b(11);  // ... and from 11 it is
    Node* gemm =
        b.Op("Gemm", {b.In("a", DType::kFloat32, {2, 3}), b.In("b", DType::kFloat32, {3, 4})});
    EXPECT_EQ(InferOutputs(b, gemm), Strings{"float32 [2,4]"});
  }
  {
    Bench b(13);
    b.Op("Gemm", {b.In("a", DType::kFloat32, {2, 3, 1}), b.In("b", DType::kFloat32, {3, 4})});
    EXPECT_THAT(InferError(b), HasSubstr("must be 2-D"));
  }
}

// ----------------------------------------------------------------------- conv

TEST(Conv, PadsStridesDilations) {
  {
    Bench b(13);
    Node* conv =
        b.Op("Conv",
             {b.In("x", DType::kFloat32, {Sym("N"), 3, 32, 32}),
              b.In("w", DType::kFloat32, {8, 3, 3, 3}), b.In("bias", DType::kFloat32, {8})},
             1, {Attribute::Ints("pads", {1, 1, 1, 1}), Attribute::Ints("strides", {2, 2})});
    EXPECT_EQ(InferOutputs(b, conv), Strings{"float32 [N,8,16,16]"});
  }
  {
    Bench b(13);  // dilation 2 makes the 3x3 kernel span 5
    Node* conv =
        b.Op("Conv",
             {b.In("x", DType::kFloat32, {1, 1, 7, 9}), b.In("w", DType::kFloat32, {2, 1, 3, 3})},
             1, {Attribute::Ints("dilations", {2, 2})});
    EXPECT_EQ(InferOutputs(b, conv), Strings{"float32 [1,2,3,5]"});
  }
  {
    Bench b(22);  // asymmetric pads, 1-D kernel_shape given explicitly
    Node* conv = b.Op(
        "Conv",
        {b.In("x", DType::kFloat32, {1, 1, 7, 5}), b.In("w", DType::kFloat32, {1, 1, 3, 3})}, 1,
        {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("pads", {1, 0, 1, 0}),
         Attribute::Ints("strides", {2, 2})});
    EXPECT_EQ(InferOutputs(b, conv), Strings{"float32 [1,1,4,2]"});
  }
}

TEST(Conv, GroupedConvolution) {
  {
    Bench b(13);
    Node* conv =
        b.Op("Conv",
             {b.In("x", DType::kFloat16, {2, 4, 5, 5}), b.In("w", DType::kFloat16, {6, 2, 3, 3})},
             1, {Attribute::Int("group", 2)});
    EXPECT_EQ(InferOutputs(b, conv), Strings{"float16 [2,6,3,3]"});
  }
  {
    Bench b(13);
    b.Op("Conv",
         {b.In("x", DType::kFloat32, {2, 4, 5, 5}), b.In("w", DType::kFloat32, {6, 3, 3, 3})}, 1,
         {Attribute::Int("group", 2)}, "conv_g");
    EXPECT_THAT(InferError(b), HasSubstr("Conv node 'conv_g': input channels C must equal"));
  }
}

TEST(Conv, AutoPadSameUpperAndValid) {
  {
    Bench b(13);  // ceil(7 / 2) = 4
    Node* conv =
        b.Op("Conv",
             {b.In("x", DType::kFloat32, {1, 1, 7, 8}), b.In("w", DType::kFloat32, {4, 1, 3, 3})},
             1, {Attribute::String("auto_pad", "SAME_UPPER"), Attribute::Ints("strides", {2, 2})});
    EXPECT_EQ(InferOutputs(b, conv), Strings{"float32 [1,4,4,4]"});
  }
  {
    Bench b(13);
    Node* conv =
        b.Op("Conv",
             {b.In("x", DType::kFloat32, {1, 1, 7, 8}), b.In("w", DType::kFloat32, {4, 1, 3, 3})},
             1, {Attribute::String("auto_pad", "VALID"), Attribute::Ints("strides", {2, 2})});
    EXPECT_EQ(InferOutputs(b, conv), Strings{"float32 [1,4,3,3]"});
  }
  {
    Bench b(13);  // symbolic spatial dims stay unknown
    Node* conv = b.Op("Conv",
                      {b.In("x", DType::kFloat32, {Sym("N"), 1, Sym("H"), 8}),
                       b.In("w", DType::kFloat32, {4, 1, 3, 3})},
                      1, {Attribute::String("auto_pad", "SAME_LOWER")});
    EXPECT_EQ(InferOutputs(b, conv), Strings{"float32 [N,4,?,8]"});
  }
}

TEST(Conv, Errors) {
  {
    Bench b(13);
    b.Op("Conv",
         {b.In("x", DType::kFloat32, {1, 3, 8, 8}), b.In("w", DType::kFloat32, {4, 3, 3, 3}),
          b.In("bias", DType::kFloat32, {3})},
         1, {}, "conv_b");
    EXPECT_THAT(InferError(b), HasSubstr("Conv node 'conv_b': bias B must have M"));
  }
  {
    Bench b(13);
    b.Op("Conv",
         {b.In("x", DType::kFloat32, {1, 3, 8, 8}), b.In("w", DType::kFloat32, {4, 3, 3, 3})}, 1,
         {Attribute::Ints("kernel_shape", {5, 5})}, "conv_k");
    EXPECT_THAT(InferError(b), HasSubstr("does not match the weight's spatial dims [3,3]"));
  }
  {
    Bench b(13);
    b.Op("Conv",
         {b.In("x", DType::kFloat32, {1, 3, 8, 8}), b.In("w", DType::kFloat32, {4, 3, 3, 3})}, 1,
         {Attribute::Ints("strides", {2})}, "conv_s");
    EXPECT_THAT(InferError(b), HasSubstr("attribute 'strides' [2] has 1 entries; expected 2"));
  }
  {
    Bench b(13);
    b.Op("Conv",
         {b.In("x", DType::kFloat32, {1, 3, 8, 8}), b.In("w", DType::kFloat32, {4, 3, 3, 3})}, 1,
         {Attribute::String("auto_pad", "SAME_UPPER"), Attribute::Ints("pads", {1, 1, 1, 1})});
    EXPECT_THAT(InferError(b), HasSubstr("cannot be used together with auto_pad"));
  }
  {
    Bench b(13);  // bfloat16 convolution is ONNX from opset 22
    b.Op("Conv",
         {b.In("x", DType::kBFloat16, {1, 3, 8, 8}), b.In("w", DType::kBFloat16, {4, 3, 3, 3})});
    EXPECT_THAT(InferError(b), HasSubstr("input 0 has dtype bfloat16"));
  }
  {
    Bench b(13);
    b.Op("Conv",
         {b.In("x", DType::kFloat32, {1, 3, 2, 2}), b.In("w", DType::kFloat32, {4, 3, 3, 3})});
    EXPECT_THAT(InferError(b), HasSubstr("padded input has only 2"));
  }
}

TEST(ConvTranspose, StridesAndOutputPadding) {
  Bench b(22);
  Node* ct =
      b.Op("ConvTranspose",
           {b.In("x", DType::kFloat32, {1, 1, 3, 3}), b.In("w", DType::kFloat32, {1, 2, 3, 3})}, 1,
           {Attribute::Ints("strides", {3, 2}), Attribute::Ints("output_padding", {1, 1})});
  // 3 * (3 - 1) + 1 + 3 = 10 and 2 * (3 - 1) + 1 + 3 = 8
  EXPECT_EQ(InferOutputs(b, ct), Strings{"float32 [1,2,10,8]"});
}

TEST(ConvTranspose, OutputShapeGroupsPadsAndAutoPad) {
  {
    Bench b(22);
    Node* ct =
        b.Op("ConvTranspose",
             {b.In("x", DType::kFloat32, {1, 1, 3, 3}), b.In("w", DType::kFloat32, {1, 2, 3, 3})},
             1, {Attribute::Ints("strides", {3, 2}), Attribute::Ints("output_shape", {10, 8})});
    EXPECT_EQ(InferOutputs(b, ct), Strings{"float32 [1,2,10,8]"});
  }
  {
    Bench b(22);  // output channels = W.dim(1) * group
    Node* ct = b.Op(
        "ConvTranspose",
        {b.In("x", DType::kFloat32, {Sym("N"), 2, 3, 3}), b.In("w", DType::kFloat32, {2, 3, 3, 3})},
        1, {Attribute::Int("group", 2)});
    EXPECT_EQ(InferOutputs(b, ct), Strings{"float32 [N,6,5,5]"});
  }
  {
    Bench b(22);  // pads and dilations: 2 * (4 - 1) + ((3 - 1) * 2 + 1) - 1 - 2 = 8
    Node* ct =
        b.Op("ConvTranspose",
             {b.In("x", DType::kFloat32, {1, 1, 4}), b.In("w", DType::kFloat32, {1, 1, 3})}, 1,
             {Attribute::Ints("strides", {2}), Attribute::Ints("dilations", {2}),
              Attribute::Ints("pads", {1, 2})});
    EXPECT_EQ(InferOutputs(b, ct), Strings{"float32 [1,1,8]"});
  }
  {
    Bench b(22);  // SAME_UPPER: input * stride
    Node* ct =
        b.Op("ConvTranspose",
             {b.In("x", DType::kFloat32, {1, 1, 3, 5}), b.In("w", DType::kFloat32, {1, 1, 3, 3})},
             1, {Attribute::String("auto_pad", "SAME_UPPER"), Attribute::Ints("strides", {2, 2})});
    EXPECT_EQ(InferOutputs(b, ct), Strings{"float32 [1,1,6,10]"});
  }
  {
    Bench b(22);
    b.Op("ConvTranspose",
         {b.In("x", DType::kFloat32, {1, 3, 3, 3}), b.In("w", DType::kFloat32, {2, 2, 3, 3})}, 1,
         {}, "ct_c");
    EXPECT_THAT(InferError(b),
                HasSubstr("ConvTranspose node 'ct_c': input channels C must equal W.dim(0)"));
  }
  {
    Bench b(22);
    b.Op("ConvTranspose",
         {b.In("x", DType::kFloat32, {1, 1, 3, 3}), b.In("w", DType::kFloat32, {1, 1, 3, 3})}, 1,
         {Attribute::Ints("output_padding", {2, 2})});
    EXPECT_THAT(InferError(b), HasSubstr("output_padding"));
  }
}

// ----------------------------------------------------------------------- pool

TEST(MaxPool, CeilModeAndIndices) {
  {
    Bench b(22);  // ceil((4 - 3) / 2) + 1 = 2; floor would give 1
    Node* pool = b.Op("MaxPool", {b.In("x", DType::kFloat32, {Sym("N"), 3, 4, 4})}, 2,
                      {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("strides", {2, 2}),
                       Attribute::Int("ceil_mode", 1)});
    EXPECT_EQ(InferOutputs(b, pool), (Strings{"float32 [N,3,2,2]", "int64 [N,3,2,2]"}));
  }
  {
    Bench b(22);
    Node* pool =
        b.Op("MaxPool", {b.In("x", DType::kFloat32, {1, 3, 4, 4})}, 1,
             {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("strides", {2, 2})});
    EXPECT_EQ(InferOutputs(b, pool), Strings{"float32 [1,3,1,1]"});
  }
  {
    Bench b(22);  // the second ceil-mode window would start past the input: dropped
    Node* pool = b.Op("MaxPool", {b.In("x", DType::kFloat32, {1, 1, 2, 2})}, 1,
                      {Attribute::Ints("kernel_shape", {1, 1}), Attribute::Ints("strides", {2, 2}),
                       Attribute::Int("ceil_mode", 1)});
    EXPECT_EQ(InferOutputs(b, pool), Strings{"float32 [1,1,1,1]"});
  }
}

TEST(MaxPool, PadsDilationsAndSameLower) {
  {
    Bench b(12);
    Node* pool =
        b.Op("MaxPool", {b.In("x", DType::kInt8, {1, 1, 28, 28})}, 1,
             {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("pads", {2, 2, 2, 2})});
    EXPECT_EQ(InferOutputs(b, pool), Strings{"int8 [1,1,30,30]"});
  }
  {
    Bench b(12);
    Node* pool =
        b.Op("MaxPool", {b.In("x", DType::kFloat32, {1, 1, 4, 4, 4})}, 1,
             {Attribute::Ints("kernel_shape", {2, 2, 2}), Attribute::Ints("dilations", {2, 2, 2})});
    EXPECT_EQ(InferOutputs(b, pool), Strings{"float32 [1,1,2,2,2]"});
  }
  {
    Bench b(12);
    Node* pool = b.Op(
        "MaxPool", {b.In("x", DType::kFloat32, {1, 3, 32, 31})}, 1,
        {Attribute::Ints("kernel_shape", {2, 2}), Attribute::String("auto_pad", "SAME_LOWER")});
    EXPECT_EQ(InferOutputs(b, pool), Strings{"float32 [1,3,32,31]"});
  }
}

TEST(MaxPool, Errors) {
  {
    Bench b(9);
    b.Op("MaxPool", {b.In("x", DType::kFloat32, {1, 1, 4, 4})}, 1,
         {Attribute::Ints("kernel_shape", {2, 2}), Attribute::Ints("dilations", {2, 2})}, "mp9");
    EXPECT_THAT(InferError(b),
                HasSubstr("MaxPool node 'mp9': attribute 'dilations' exists from opset 10"));
  }
  {
    Bench b(13);
    b.Op("MaxPool", {b.In("x", DType::kFloat32, {1, 1, 4, 4})}, 1, {}, "mp_nok");
    EXPECT_THAT(InferError(b),
                HasSubstr("MaxPool node 'mp_nok': attribute 'kernel_shape' is required"));
  }
  {
    Bench b(13);
    b.Op("MaxPool", {b.In("x", DType::kFloat32, {1, 4})}, 1,
         {Attribute::Ints("kernel_shape", {2})});
    EXPECT_THAT(InferError(b), HasSubstr("rank >= 3"));
  }
  {
    Bench b(7);
    b.Op("MaxPool", {b.In("x", DType::kFloat32, {1, 1, 4, 4})}, 2,
         {Attribute::Ints("kernel_shape", {2, 2})});
    EXPECT_THAT(InferError(b), HasSubstr("Indices output exists from opset 8"));
  }
}

TEST(AveragePool, CountIncludePadAndDilationsFromOpset19) {
  {
    Bench b(22);
    Node* pool =
        b.Op("AveragePool", {b.In("x", DType::kFloat32, {1, 1, 32, 32, 32})}, 1,
             {Attribute::Ints("kernel_shape", {5, 5, 5}), Attribute::Ints("strides", {3, 3, 3}),
              Attribute::Ints("dilations", {2, 2, 2}), Attribute::Int("ceil_mode", 1),
              Attribute::Int("count_include_pad", 1)});
    EXPECT_EQ(InferOutputs(b, pool), Strings{"float32 [1,1,9,9,9]"});
  }
  {
    Bench b(18);
    b.Op("AveragePool", {b.In("x", DType::kFloat32, {1, 1, 8, 8})}, 1,
         {Attribute::Ints("kernel_shape", {2, 2}), Attribute::Ints("dilations", {2, 2})}, "ap");
    EXPECT_THAT(InferError(b),
                HasSubstr("AveragePool node 'ap': attribute 'dilations' exists from opset 19"));
  }
  {
    Bench b(13);  // SAME_UPPER with stride: ceil(5 / 2) = 3
    Node* pool = b.Op("AveragePool", {b.In("x", DType::kFloat16, {1, 1, 5, 5})}, 1,
                      {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("strides", {2, 2}),
                       Attribute::String("auto_pad", "SAME_UPPER")});
    EXPECT_EQ(InferOutputs(b, pool), Strings{"float16 [1,1,3,3]"});
  }
}

TEST(GlobalPool, ReducesSpatialDimsToOne) {
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    SCOPED_TRACE(op);
    Bench b(13);
    Node* pool = b.Op(op, {b.In("x", DType::kFloat32, {Sym("N"), 16, 7, Sym("W")})});
    EXPECT_EQ(InferOutputs(b, pool), Strings{"float32 [N,16,1,1]"});
  }
}

// -------------------------------------------------------------- normalization

std::vector<Value*> BatchNormInputs(Bench& b, DType x, DType params, DType stats, int64_t c) {
  return {b.In("x", x, {Sym("N"), c, 4, 4}), b.In("scale", params, {c}), b.In("bias", params, {c}),
          b.In("mean", stats, {c}), b.In("var", stats, {c})};
}

TEST(BatchNormalization, InferenceMode) {
  Bench b(15);
  Node* bn = b.Op("BatchNormalization",
                  BatchNormInputs(b, DType::kFloat16, DType::kFloat16, DType::kFloat16, 3));
  EXPECT_EQ(InferOutputs(b, bn), Strings{"float16 [N,3,4,4]"});
}

TEST(BatchNormalization, TrainingModeOutputsRunningStatsOfTheirDtype) {
  Bench b(15);  // opset 15: X float16 with float32 parameters and statistics
  Node* bn = b.Op("BatchNormalization",
                  BatchNormInputs(b, DType::kFloat16, DType::kFloat32, DType::kFloat32, 3), 3,
                  {Attribute::Int("training_mode", 1), Attribute::Float("momentum", 0.9f)});
  EXPECT_EQ(InferOutputs(b, bn), (Strings{"float16 [N,3,4,4]", "float32 [3]", "float32 [3]"}));
}

TEST(BatchNormalization, OpsetDifferences) {
  {
    Bench b(14);  // at 14 scale and B must have X's dtype
    b.Op("BatchNormalization",
         BatchNormInputs(b, DType::kFloat16, DType::kFloat32, DType::kFloat32, 3), 1, {}, "bn14");
    EXPECT_THAT(InferError(b),
                HasSubstr("BatchNormalization node 'bn14': input 1 has dtype float32"));
  }
  {
    Bench b(14);  // ... but mean and var (U) may differ
    Node* bn = b.Op("BatchNormalization",
                    BatchNormInputs(b, DType::kFloat16, DType::kFloat16, DType::kFloat32, 3), 3,
                    {Attribute::Int("training_mode", 1)});
    EXPECT_EQ(InferOutputs(b, bn), (Strings{"float16 [N,3,4,4]", "float32 [3]", "float32 [3]"}));
  }
  {
    Bench b(9);  // opset 9-13: up to five outputs, all of X's dtype
    Node* bn = b.Op("BatchNormalization",
                    BatchNormInputs(b, DType::kFloat32, DType::kFloat32, DType::kFloat32, 3), 5);
    EXPECT_EQ(InferOutputs(b, bn), (Strings{"float32 [N,3,4,4]", "float32 [3]", "float32 [3]",
                                            "float32 [3]", "float32 [3]"}));
  }
  {
    Bench b(13);
    b.Op("BatchNormalization",
         BatchNormInputs(b, DType::kFloat32, DType::kFloat32, DType::kFloat16, 3));
    EXPECT_THAT(InferError(b), HasSubstr("input 3 has dtype float16"));
  }
  {
    Bench b(15);
    b.Op("BatchNormalization",
         BatchNormInputs(b, DType::kFloat32, DType::kFloat32, DType::kFloat32, 3), 3, {}, "bn_inf");
    EXPECT_THAT(InferError(b), HasSubstr("training_mode is 0"));
  }
  {
    Bench b(13);
    b.Op("BatchNormalization",
         BatchNormInputs(b, DType::kFloat32, DType::kFloat32, DType::kFloat32, 3), 1,
         {Attribute::Int("training_mode", 1)});
    EXPECT_THAT(InferError(b), HasSubstr("attribute 'training_mode' exists from opset 14"));
  }
}

TEST(BatchNormalization, ChannelMismatch) {
  Bench b(15);
  b.Op("BatchNormalization",
       {b.In("x", DType::kFloat32, {2, 3, 4}), b.In("scale", DType::kFloat32, {4}),
        b.In("bias", DType::kFloat32, {3}), b.In("mean", DType::kFloat32, {3}),
        b.In("var", DType::kFloat32, {3})},
       1, {}, "bn_c");
  EXPECT_THAT(InferError(b),
              HasSubstr("BatchNormalization node 'bn_c': input 1 (scale) has 4 entries"));
}

TEST(LayerNormalization, OptionalOutputsHaveStashDtypeAndReducedDims) {
  {
    Bench b(17);
    Node* ln = b.Op("LayerNormalization",
                    {b.In("x", DType::kFloat16, {Sym("N"), Sym("T"), 16}),
                     b.In("scale", DType::kFloat16, {16}), b.In("bias", DType::kFloat16, {16})},
                    3);
    EXPECT_EQ(InferOutputs(b, ln),
              (Strings{"float16 [N,T,16]", "float32 [N,T,1]", "float32 [N,T,1]"}));
  }
  {
    Bench b(17);
    Node* ln =
        b.Op("LayerNormalization",
             {b.In("x", DType::kFloat32, {2, 3, 4, 5}), b.In("scale", DType::kFloat32, {3, 4, 5})},
             2, {Attribute::Int("axis", 1)});
    EXPECT_EQ(InferOutputs(b, ln), (Strings{"float32 [2,3,4,5]", "float32 [2,1,1,1]"}));
  }
  {
    Bench b(17);
    Node* ln = b.Op("LayerNormalization",
                    {b.In("x", DType::kBFloat16, {2, 8}), b.In("scale", DType::kBFloat16, {8})}, 3,
                    {Attribute::Int("axis", -2), Attribute::Int("stash_type", 16)});
    EXPECT_EQ(InferOutputs(b, ln), (Strings{"bfloat16 [2,8]", "bfloat16 [1,1]", "bfloat16 [1,1]"}));
  }
}

TEST(LayerNormalization, Errors) {
  {
    Bench b(17);
    b.Op("LayerNormalization",
         {b.In("x", DType::kFloat32, {2, 3, 4}), b.In("scale", DType::kFloat32, {4})}, 1,
         {Attribute::Int("axis", 3)}, "ln_axis");
    EXPECT_THAT(InferError(b),
                HasSubstr("LayerNormalization node 'ln_axis': axis 3 is out of range"));
  }
  {
    Bench b(17);
    b.Op("LayerNormalization",
         {b.In("x", DType::kFloat32, {2, 3, 4}), b.In("scale", DType::kFloat32, {8})}, 1, {},
         "ln_scale");
    EXPECT_THAT(InferError(b), HasSubstr("input 1 (Scale) shape [8] does not broadcast"));
  }
  {
    Bench b(17);
    b.Op("LayerNormalization",
         {b.In("x", DType::kFloat32, {2, 4}), b.In("scale", DType::kFloat16, {4})});
    EXPECT_THAT(InferError(b), HasSubstr("input 1 has dtype float16"));
  }
  {
    Bench b(17);
    b.Op("LayerNormalization",
         {b.In("x", DType::kFloat32, {2, 4}), b.In("scale", DType::kFloat32, {4})}, 2,
         {Attribute::Int("stash_type", 7)});
    EXPECT_THAT(InferError(b), HasSubstr("attribute 'stash_type' is 7"));
  }
}

// -------------------------------------------------------------------- softmax

TEST(Softmax, DefaultAxisChangedAtOpset13) {
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    SCOPED_TRACE(op);
    {
      Bench b(13);  // default axis -1: fine for a 1-D input
      Node* sm = b.Op(op, {b.In("x", DType::kFloat32, {10})});
      EXPECT_EQ(InferOutputs(b, sm), Strings{"float32 [10]"});
    }
    {
      Bench b(11);  // default axis 1: out of range for a 1-D input
      b.Op(op, {b.In("x", DType::kFloat32, {10})}, 1, {}, "sm11");
      EXPECT_THAT(InferError(b), HasSubstr("node 'sm11': axis 1 is out of range for rank 1"));
    }
    {
      Bench b(11);
      Node* sm =
          b.Op(op, {b.In("x", DType::kFloat32, {Sym("N"), 3, 4})}, 1, {Attribute::Int("axis", -3)});
      EXPECT_EQ(InferOutputs(b, sm), Strings{"float32 [N,3,4]"});
    }
  }
}

TEST(Softmax, Errors) {
  {
    Bench b(13);
    b.Op("Softmax", {b.In("x", DType::kFloat32, {2, 3})}, 1, {Attribute::Int("axis", 2)}, "sm");
    EXPECT_THAT(InferError(b), HasSubstr("Softmax node 'sm': axis 2 is out of range for rank 2"));
  }
  {
    Bench b(13);
    b.Op("LogSoftmax", {b.In("x", DType::kInt64, {2, 3})});
    EXPECT_THAT(InferError(b), HasSubstr("input 0 has dtype int64"));
  }
}

// --------------------------------------------------------------------- losses

TEST(Losses, SoftmaxCrossEntropyReductions) {
  {
    Bench b(13);
    Node* sce = b.Op(
        "SoftmaxCrossEntropyLoss",
        {b.In("scores", DType::kFloat32, {Sym("N"), 5}), b.In("labels", DType::kInt64, {Sym("N")})},
        2);
    EXPECT_EQ(InferOutputs(b, sce), (Strings{"float32 []", "float32 [N,5]"}));
  }
  {
    Bench b(13);
    Node* sce =
        b.Op("SoftmaxCrossEntropyLoss",
             {b.In("scores", DType::kFloat16, {2, 5, 3, 4}),
              b.In("labels", DType::kInt32, {2, 3, 4}), b.In("weights", DType::kFloat16, {5})},
             1, {Attribute::String("reduction", "none"), Attribute::Int("ignore_index", -1)});
    EXPECT_EQ(InferOutputs(b, sce), Strings{"float16 [2,3,4]"});
  }
  {
    Bench b(13);
    Node* sce = b.Op("SoftmaxCrossEntropyLoss",
                     {b.In("scores", DType::kFloat32, {3, 5}), b.In("labels", DType::kInt64, {3})},
                     1, {Attribute::String("reduction", "sum")});
    EXPECT_EQ(InferOutputs(b, sce), Strings{"float32 []"});
  }
}

TEST(Losses, NegativeLogLikelihood) {
  {
    Bench b(22);
    Node* nll = b.Op("NegativeLogLikelihoodLoss",
                     {b.In("input", DType::kBFloat16, {3, 5, 2}),
                      b.In("target", DType::kInt64, {3, 2}), b.In("weight", DType::kBFloat16, {5})},
                     1, {Attribute::String("reduction", "none")});
    EXPECT_EQ(InferOutputs(b, nll), Strings{"bfloat16 [3,2]"});
  }
  {
    Bench b(13);  // bfloat16 NLL is ONNX from opset 22
    b.Op("NegativeLogLikelihoodLoss",
         {b.In("input", DType::kBFloat16, {3, 5}), b.In("target", DType::kInt64, {3})});
    EXPECT_THAT(InferError(b), HasSubstr("input 0 has dtype bfloat16"));
  }
}

TEST(Losses, Errors) {
  {
    Bench b(13);
    b.Op("SoftmaxCrossEntropyLoss",
         {b.In("scores", DType::kFloat32, {3, 5}), b.In("labels", DType::kFloat32, {3})}, 1, {},
         "sce");
    EXPECT_THAT(InferError(b),
                HasSubstr("SoftmaxCrossEntropyLoss node 'sce': input 1 has dtype float32"));
  }
  {
    Bench b(13);
    b.Op("SoftmaxCrossEntropyLoss",
         {b.In("scores", DType::kFloat32, {3, 5}), b.In("labels", DType::kInt64, {3})}, 1,
         {Attribute::String("reduction", "avg")});
    EXPECT_THAT(InferError(b), HasSubstr("attribute 'reduction' is \"avg\""));
  }
  {
    Bench b(13);
    b.Op("NegativeLogLikelihoodLoss",
         {b.In("input", DType::kFloat32, {3, 5}), b.In("target", DType::kInt64, {3}),
          b.In("weight", DType::kFloat32, {4})},
         1, {}, "nll_w");
    EXPECT_THAT(InferError(b),
                HasSubstr("NegativeLogLikelihoodLoss node 'nll_w': weights [4] must have C = 5"));
  }
  {
    Bench b(13);
    b.Op("NegativeLogLikelihoodLoss",
         {b.In("input", DType::kFloat32, {3, 5, 2}), b.In("target", DType::kInt64, {3, 4})});
    EXPECT_THAT(InferError(b), HasSubstr("do not match input 0 [3,5,2]"));
  }
  {
    Bench b(13);
    b.Op("NegativeLogLikelihoodLoss",
         {b.In("input", DType::kFloat32, {3, 5, 2}), b.In("target", DType::kInt64, {3})});
    EXPECT_THAT(InferError(b), HasSubstr("must have rank 2"));
  }
}

// ------------------------------------------------------------------- training

TEST(Training, AdamOutputsNewXThenVThenH) {
  Bench b(13, 1);
  std::vector<Value*> inputs = {b.In("R", DType::kFloat32, Shape::Scalar()),
                                b.In("T", DType::kInt64, Shape::Scalar())};
  for (const char* group : {"X", "G", "V", "H"}) {
    inputs.push_back(b.In(std::string(group) + "1", DType::kFloat32, {3, 4}));
    inputs.push_back(b.In(std::string(group) + "2", DType::kFloat32, {7}));
  }
  Node* adam = b.Op("Adam", inputs, 6, {Attribute::Float("alpha", 0.9f)}, "adam", kTrainingDomain);
  EXPECT_EQ(InferOutputs(b, adam), (Strings{"float32 [3,4]", "float32 [7]", "float32 [3,4]",
                                            "float32 [7]", "float32 [3,4]", "float32 [7]"}));
  const OpDef* def = OpRegistry::Global().Find(kTrainingDomain, "Adam");
  ASSERT_NE(def, nullptr);
  EXPECT_EQ(def->autocast, AutocastCategory::kDeny);  // master weights stay float32
  EXPECT_EQ(def->min_opset, 1);
  EXPECT_EQ(def->max_opset, 1);
}

TEST(Training, AdagradAndMomentum) {
  {
    Bench b(13, 1);
    Node* adagrad =
        b.Op("Adagrad",
             {b.In("R", DType::kFloat32, Shape::Scalar()),
              b.In("T", DType::kInt64, Shape::Scalar()), b.In("X", DType::kFloat64, {2}),
              b.In("G", DType::kFloat64, {2}), b.In("H", DType::kFloat64, {2})},
             2, {}, "adagrad", kTrainingDomain);
    EXPECT_EQ(InferOutputs(b, adagrad), (Strings{"float64 [2]", "float64 [2]"}));
  }
  {
    Bench b(13, 1);
    Node* momentum = b.Op(
        "Momentum",
        {b.In("R", DType::kFloat32, Shape::Scalar()), b.In("T", DType::kInt64, Shape::Scalar()),
         b.In("X1", DType::kFloat32, {1}), b.In("X2", DType::kFloat32, {2}),
         b.In("G1", DType::kFloat32, {1}), b.In("G2", DType::kFloat32, {2}),
         b.In("V1", DType::kFloat32, {1}), b.In("V2", DType::kFloat32, {2})},
        4,
        {Attribute::Float("alpha", 0.9f), Attribute::Float("beta", 1.f),
         Attribute::String("mode", "nesterov"), Attribute::Float("norm_coefficient", 0.f)},
        "momentum", kTrainingDomain);
    EXPECT_EQ(InferOutputs(b, momentum),
              (Strings{"float32 [1]", "float32 [2]", "float32 [1]", "float32 [2]"}));
  }
}

TEST(Training, Errors) {
  {
    Bench b(13, 1);  // 7 tensors do not split into X/G/V/H groups
    std::vector<Value*> inputs = {b.In("R", DType::kFloat32, Shape::Scalar()),
                                  b.In("T", DType::kInt64, Shape::Scalar())};
    for (int i = 0; i < 7; ++i)
      inputs.push_back(b.In("t" + std::to_string(i), DType::kFloat32, {2}));
    b.Op("Adam", inputs, 3, {}, "adam_n", kTrainingDomain);
    EXPECT_THAT(InferError(b), HasSubstr("Adam node 'adam_n': has 9 inputs; expected 2 + 4 * n"));
  }
  {
    Bench b(13, 1);
    std::vector<Value*> inputs = {b.In("R", DType::kFloat32, Shape::Scalar()),
                                  b.In("T", DType::kInt64, Shape::Scalar())};
    for (int i = 0; i < 4; ++i)
      inputs.push_back(b.In("t" + std::to_string(i), DType::kFloat32, {2}));
    b.Op("Adam", inputs, 2, {}, "adam_o", kTrainingDomain);
    EXPECT_THAT(InferError(b), HasSubstr("has 2 outputs; expected 3"));
  }
  {
    Bench b(13, 1);
    b.Op("Adagrad",
         {b.In("R", DType::kFloat32, Shape::Scalar()), b.In("T", DType::kInt64, Shape::Scalar()),
          b.In("X", DType::kFloat32, {2}), b.In("G", DType::kFloat32, {3}),
          b.In("H", DType::kFloat32, {2})},
         2, {}, "adagrad_g", kTrainingDomain);
    EXPECT_THAT(InferError(b),
                HasSubstr("input 3 (G1) [3] must have the shape of input 2 (X1) [2]"));
  }
  {
    Bench b(13, 1);
    b.Op("Adagrad",
         {b.In("R", DType::kFloat32, Shape::Scalar()), b.In("T", DType::kInt32, Shape::Scalar()),
          b.In("X", DType::kFloat32, {2}), b.In("G", DType::kFloat32, {2}),
          b.In("H", DType::kFloat32, {2})},
         2, {}, "adagrad_t", kTrainingDomain);
    EXPECT_THAT(InferError(b), HasSubstr("input 1 has dtype int32"));
  }
  {
    Bench b(13, 1);
    b.Op("Momentum",
         {b.In("R", DType::kFloat32, Shape::Scalar()), b.In("T", DType::kInt64, Shape::Scalar()),
          b.In("X", DType::kFloat32, {2}), b.In("G", DType::kFloat32, {2}),
          b.In("V", DType::kFloat32, {2})},
         2, {Attribute::String("mode", "heavy_ball")}, "mom", kTrainingDomain);
    EXPECT_THAT(InferError(b),
                HasSubstr("Momentum node 'mom': attribute 'mode' is \"heavy_ball\""));
  }
  {
    Bench b(13, 1);
    b.Op("Adagrad",
         {b.In("R", DType::kFloat32, {2}), b.In("T", DType::kInt64, Shape::Scalar()),
          b.In("X", DType::kFloat32, {2}), b.In("G", DType::kFloat32, {2}),
          b.In("H", DType::kFloat32, {2})},
         2, {}, "adagrad_r", kTrainingDomain);
    EXPECT_THAT(InferError(b), HasSubstr("input 0 (R) must be a scalar"));
  }
}

// ------------------------------------------------------------------- registry

TEST(Registry, SchemasOfThisFamily) {
  const OpRegistry& registry = OpRegistry::Global();
  const OpDef* gemm = registry.Find("", "Gemm");
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->min_inputs, 2);
  EXPECT_EQ(gemm->max_inputs, 3);
  EXPECT_EQ(gemm->attributes.size(), 4u);
  const OpDef* maxpool = registry.Find("", "MaxPool");
  ASSERT_NE(maxpool, nullptr);
  EXPECT_EQ(maxpool->max_outputs, 2);
  bool kernel_required = false;
  for (const AttrSpec& a : maxpool->attributes) {
    if (a.name == "kernel_shape") kernel_required = a.required && a.kind == AttrKind::kInts;
  }
  EXPECT_TRUE(kernel_required);
  const OpDef* layer_norm = registry.Find("", "LayerNormalization");
  ASSERT_NE(layer_norm, nullptr);
  EXPECT_EQ(layer_norm->min_opset, 17);
  EXPECT_EQ(layer_norm->max_outputs, 3);
  EXPECT_EQ(registry.Find("", "Sum")->max_inputs, INT_MAX);
  EXPECT_EQ(registry.Find("", "SoftmaxCrossEntropyLoss")->min_opset, 12);
  EXPECT_EQ(registry.Find("", "Conv")->max_opset, kMaxOnnxOpset);
  EXPECT_EQ(registry.Find("", "Conv")->autocast, AutocastCategory::kAllow);
}

}  // namespace
}  // namespace castor
