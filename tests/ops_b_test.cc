// Type and shape inference of the reduce, shape, data-movement and misc op
// families (graph/ops/{reduce,shape_ops,data_movement,misc}.cc): small
// graphs built in code, one behaviour per test, covering opset differences,
// shape-value propagation (symbolic batch dims through Shape -> Gather ->
// Concat -> Reshape) and error messages. The last test checks the ONNX
// node conformance cases of these ops with their integer inputs as
// constants, so that every output shape must come out exact.
#include <algorithm>
#include <climits>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "graph/graph.h"
#include "graph/onnx_io.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"

namespace castor {
namespace {

// A one-graph model under construction at one ai.onnx opset.
class ModelBuilder {
 public:
  explicit ModelBuilder(int64_t opset) { model_.opset_imports = {{"", opset}}; }

  Value* Input(const std::string& name, DType dtype, Shape shape) {
    absl::StatusOr<Value*> v = model_.graph->AddInput(name, dtype, std::move(shape));
    EXPECT_TRUE(v.ok()) << v.status();
    return *v;
  }
  Value* Initializer(const std::string& name, Tensor tensor) {
    absl::StatusOr<Value*> v = model_.graph->AddInitializer(name, std::move(tensor));
    EXPECT_TRUE(v.ok()) << v.status();
    return *v;
  }
  Value* Ints(const std::string& name, const std::vector<int64_t>& values) {
    return Initializer(name, Tensor::Int64s(values));
  }
  Value* ScalarInt(const std::string& name, int64_t value) {
    return Initializer(name, Tensor::FromVector<int64_t>(DType::kInt64, {}, {value}));
  }
  // Adds a node named `name` with `num_outputs` outputs named name:0, name:1...
  Node* Add(const std::string& op, const std::vector<Value*>& inputs,
            std::vector<Attribute> attributes = {}, const std::string& name = "n",
            int num_outputs = 1) {
    std::vector<std::string> outputs;
    for (int i = 0; i < num_outputs; ++i) outputs.push_back(name + ":" + std::to_string(i));
    absl::StatusOr<Node*> node = model_.graph->AddNode(op, inputs, outputs, name);
    EXPECT_TRUE(node.ok()) << node.status();
    for (Attribute& a : attributes) (*node)->SetAttribute(std::move(a));
    return *node;
  }
  // The node's output `i` after inference.
  Value* Out(Node* node, int i = 0) { return node->output(i); }
  absl::Status Infer() { return InferTypes(model_); }
  Model& model() { return model_; }

 private:
  Model model_;
};

std::string ShapeOf(const Value* v) { return v->shape().ToString(); }

Shape Dims(std::initializer_list<Dim> dims) { return Shape(dims); }

// Expects inference to fail with a message naming the node and containing
// `fragment`.
void ExpectInferError(ModelBuilder& b, const std::string& node_name, const std::string& fragment) {
  absl::Status s = b.Infer();
  ASSERT_FALSE(s.ok()) << "expected an error containing: " << fragment;
  EXPECT_NE(s.message().find("'" + node_name + "'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
}

// ---- Reduce ------------------------------------------------------------------

TEST(ReduceOps, ReduceSumAxesAttributeAtOpset11) {
  ModelBuilder b(11);
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 3, 4}));
  Node* keep = b.Add("ReduceSum", {x}, {Attribute::Ints("axes", {1})}, "keep");
  Node* drop = b.Add("ReduceSum", {x},
                     {Attribute::Ints("axes", {-1, 0}), Attribute::Int("keepdims", 0)}, "drop");
  Node* all = b.Add("ReduceSum", {x}, {Attribute::Int("keepdims", 0)}, "all");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(keep)), "[2,1,4]");
  EXPECT_EQ(ShapeOf(b.Out(drop)), "[3]");
  EXPECT_EQ(ShapeOf(b.Out(all)), "[]");
  EXPECT_EQ(b.Out(keep)->dtype(), DType::kFloat32);
}

TEST(ReduceOps, ReduceSumAxesInputAtOpset13) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 3, 4}));
  Node* keep = b.Add("ReduceSum", {x, b.Ints("axes", {1})}, {}, "keep");
  Node* noop = b.Add("ReduceSum", {x, b.Ints("none", {})},
                     {Attribute::Int("noop_with_empty_axes", 1)}, "noop");
  Node* all = b.Add("ReduceSum", {x}, {}, "all");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(keep)), "[2,1,4]");
  EXPECT_EQ(ShapeOf(b.Out(noop)), "[2,3,4]");
  EXPECT_EQ(ShapeOf(b.Out(all)), "[1,1,1]");
}

TEST(ReduceOps, ReduceSumAxesAttributeRejectedAtOpset13) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 3}));
  b.Add("ReduceSum", {x}, {Attribute::Ints("axes", {1})}, "old_style");
  ExpectInferError(b, "old_style", "'axes' is an input since opset 13");
}

TEST(ReduceOps, ReduceMeanAttributeAt13InputAt18) {
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat16, Dims({Dim::Symbol("N"), 8, 4}));
    Node* m = b.Add("ReduceMean", {x},
                    {Attribute::Ints("axes", {2}), Attribute::Int("keepdims", 0)}, "mean");
    ASSERT_TRUE(b.Infer().ok()) << b.Infer();
    EXPECT_EQ(ShapeOf(b.Out(m)), "[N,8]");
    EXPECT_EQ(b.Out(m)->dtype(), DType::kFloat16);
  }
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat32, Dims({2, 3}));
    b.Add("ReduceMean", {x, b.Ints("axes", {1})}, {}, "too_early");
    ExpectInferError(b, "too_early", "takes one input before opset 18");
  }
  {
    ModelBuilder b(18);
    Value* x = b.Input("x", DType::kFloat32, Dims({Dim::Symbol("N"), 8, 4}));
    Node* m = b.Add("ReduceMean", {x, b.Ints("axes", {-1})}, {Attribute::Int("keepdims", 0)},
                    "mean");
    ASSERT_TRUE(b.Infer().ok()) << b.Infer();
    EXPECT_EQ(ShapeOf(b.Out(m)), "[N,8]");
  }
}

TEST(ReduceOps, UnknownAxesKeepRankOnlyWithKeepdims) {
  ModelBuilder b(18);
  Value* x = b.Input("x", DType::kFloat32, Dims({1, 3, 4}));
  Value* axes = b.Input("axes", DType::kInt64, Dims({Dim::Unknown()}));
  Value* two_axes = b.Input("two_axes", DType::kInt64, Dims({2}));
  Node* keep = b.Add("ReduceMax", {x, axes}, {}, "keep");
  Node* drop = b.Add("ReduceMax", {x, axes}, {Attribute::Int("keepdims", 0)}, "drop");
  Node* drop2 = b.Add("ReduceMax", {x, two_axes}, {Attribute::Int("keepdims", 0)}, "drop2");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(keep)), "[1,?,?]");
  EXPECT_FALSE(b.Out(drop)->shape().rank_known());
  EXPECT_EQ(ShapeOf(b.Out(drop2)), "[?]");
}

TEST(ReduceOps, DTypesPerOpset) {
  {
    ModelBuilder b(20);
    Value* x = b.Input("x", DType::kBool, Dims({4, 2}));
    Node* m = b.Add("ReduceMax", {x, b.Ints("axes", {1})}, {}, "max");
    ASSERT_TRUE(b.Infer().ok()) << b.Infer();
    EXPECT_EQ(b.Out(m)->dtype(), DType::kBool);
    EXPECT_EQ(ShapeOf(b.Out(m)), "[4,1]");
  }
  {
    ModelBuilder b(18);
    Value* x = b.Input("x", DType::kBool, Dims({4, 2}));
    b.Add("ReduceMax", {x}, {}, "bool_max");
    ExpectInferError(b, "bool_max", "input 0 has dtype bool");
  }
  {
    ModelBuilder b(11);
    Value* x = b.Input("x", DType::kBFloat16, Dims({4}));
    b.Add("ReduceSum", {x}, {}, "bf16_sum");
    ExpectInferError(b, "bf16_sum", "input 0 has dtype bfloat16");
  }
}

TEST(ReduceOps, OtherReductionsAndBadAxis) {
  ModelBuilder b(18);
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 3, 4}));
  int i = 0;
  for (const char* op : {"ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                         "ReduceLogSumExp"}) {
    Node* n = b.Add(op, {x, b.Ints("axes" + std::to_string(i), {0, 2})}, {},
                    "r" + std::to_string(i));
    ++i;
    ASSERT_TRUE(b.Infer().ok()) << op << ": " << b.Infer();
    EXPECT_EQ(ShapeOf(b.Out(n)), "[1,3,1]") << op;
  }
  b.Add("ReduceL2", {x, b.Ints("bad_axes", {3})}, {}, "bad_axis");
  ExpectInferError(b, "bad_axis", "axis 3 is out of range for rank 3");
}

TEST(ReduceOps, ArgMaxArgMinAndCumSum) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 3, 4}));
  Node* amax = b.Add("ArgMax", {x}, {Attribute::Int("axis", -1), Attribute::Int("keepdims", 0)},
                     "amax");
  Node* amin = b.Add("ArgMin", {x}, {Attribute::Int("axis", 1)}, "amin");
  Node* cs = b.Add("CumSum", {x, b.ScalarInt("axis", 1)}, {}, "cs");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Out(amax)->dtype(), DType::kInt64);
  EXPECT_EQ(ShapeOf(b.Out(amax)), "[2,3]");
  EXPECT_EQ(ShapeOf(b.Out(amin)), "[2,1,4]");
  EXPECT_EQ(b.Out(cs)->dtype(), DType::kFloat32);
  EXPECT_EQ(ShapeOf(b.Out(cs)), "[2,3,4]");
}

// ---- Reshape -----------------------------------------------------------------

TEST(ShapeOps, ReshapeZeroCopiesAndMinusOneInferred) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 3, 4}));
  Node* r1 = b.Add("Reshape", {x, b.Ints("s1", {0, -1})}, {}, "r1");
  Node* r2 = b.Add("Reshape", {x, b.Ints("s2", {-1, 2, 2})}, {}, "r2");
  Node* r3 = b.Add("Reshape", {x, b.Ints("s3", {2, 0, 1, 4})}, {}, "r3");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(r1)), "[2,12]");
  EXPECT_EQ(ShapeOf(b.Out(r2)), "[6,2,2]");
  EXPECT_EQ(ShapeOf(b.Out(r3)), "[2,3,1,4]");
}

TEST(ShapeOps, ReshapeAllowZero) {
  ModelBuilder b(14);
  Value* x = b.Input("x", DType::kFloat32, Dims({0, 3, 4}));
  Node* r = b.Add("Reshape", {x, b.Ints("s", {3, 4, 0})}, {Attribute::Int("allowzero", 1)}, "r");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(r)), "[3,4,0]");

  ModelBuilder old(13);
  Value* y = old.Input("y", DType::kFloat32, Dims({0, 3, 4}));
  old.Add("Reshape", {y, old.Ints("s", {3, 4, 0})}, {Attribute::Int("allowzero", 1)},
          "allowzero_at_13");
  ExpectInferError(old, "allowzero_at_13", "'allowzero' exists from opset 14");

  ModelBuilder both(14);
  Value* z = both.Input("z", DType::kFloat32, Dims({0, 3, 4}));
  both.Add("Reshape", {z, both.Ints("s", {0, -1})}, {Attribute::Int("allowzero", 1)},
           "zero_and_minus_one");
  ExpectInferError(both, "zero_and_minus_one", "both 0 and -1");
}

TEST(ShapeOps, ReshapeTargetFromShapeKeepsSymbolicBatch) {
  // x[N,1,28,28] -> Shape -> Gather(0) -> Unsqueeze -> Concat([28,28]) -> Reshape.
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({Dim::Symbol("N"), 1, 28, 28}));
  Node* shape = b.Add("Shape", {x}, {}, "shape");
  Node* batch = b.Add("Gather", {b.Out(shape), b.ScalarInt("zero", 0)}, {}, "batch");
  Node* batch1d = b.Add("Unsqueeze", {b.Out(batch), b.Ints("axes", {0})}, {}, "batch1d");
  Node* target = b.Add("Concat", {b.Out(batch1d), b.Ints("hw", {28, 28})},
                       {Attribute::Int("axis", 0)}, "target");
  Node* reshape = b.Add("Reshape", {x, b.Out(target)}, {}, "reshape");
  // The same with -1 for the rest: Concat(batch, [-1]) -> [N, 784].
  Node* target2 = b.Add("Concat", {b.Out(batch1d), b.Ints("rest", {-1})},
                        {Attribute::Int("axis", 0)}, "target2");
  Node* flat = b.Add("Reshape", {x, b.Out(target2)}, {}, "flat");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(shape)), "[4]");
  EXPECT_EQ(b.Out(shape)->dtype(), DType::kInt64);
  EXPECT_EQ(ShapeOf(b.Out(batch)), "[]");
  EXPECT_EQ(ShapeOf(b.Out(batch1d)), "[1]");
  EXPECT_EQ(ShapeOf(b.Out(target)), "[3]");
  EXPECT_EQ(ShapeOf(b.Out(reshape)), "[N,28,28]");
  EXPECT_EQ(ShapeOf(b.Out(flat)), "[N,784]");
}

TEST(ShapeOps, ReshapeMinusOneWithSymbolicInput) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({Dim::Symbol("N"), 1, 28, 28}));
  Node* r1 = b.Add("Reshape", {x, b.Ints("s1", {-1, 784})}, {}, "r1");
  Node* r2 = b.Add("Reshape", {x, b.Ints("s2", {0, -1})}, {}, "r2");
  Node* r3 = b.Add("Reshape", {x, b.Ints("s3", {-1, 100})}, {}, "r3");  // N*784/100: unknown
  Value* y = b.Input("y", DType::kFloat32, Dims({Dim::Unknown(), 4}));
  Node* r4 = b.Add("Reshape", {y, b.Ints("s4", {-1})}, {}, "r4");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(r1)), "[N,784]");
  EXPECT_EQ(ShapeOf(b.Out(r2)), "[N,784]");
  EXPECT_EQ(ShapeOf(b.Out(r3)), "[?,100]");
  EXPECT_EQ(ShapeOf(b.Out(r4)), "[?]");
}

TEST(ShapeOps, ReshapeErrors) {
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat32, Dims({2, 3, 4}));
    b.Add("Reshape", {x, b.Ints("s", {5, 5})}, {}, "bad_count");
    ExpectInferError(b, "bad_count", "element-count mismatch");
  }
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat32, Dims({2, 3, 4}));
    b.Add("Reshape", {x, b.Ints("s", {5, -1})}, {}, "bad_infer");
    ExpectInferError(b, "bad_infer", "cannot reshape [2,3,4] (24 elements)");
  }
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat32, Dims({2, 3, 4}));
    b.Add("Reshape", {x, b.Ints("s", {-1, -1})}, {}, "two_minus_ones");
    ExpectInferError(b, "two_minus_ones", "more than one -1");
  }
}

TEST(ShapeOps, ReshapeTargetOfUnknownValueButKnownLength) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 3, 4}));
  Value* s = b.Input("s", DType::kInt64, Dims({3}));
  Node* r = b.Add("Reshape", {x, s}, {}, "r");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(r)), "[?,?,?]");
}

// ---- Flatten / Transpose ------------------------------------------------------

TEST(ShapeOps, Flatten) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 3, 4, 5}));
  Value* y = b.Input("y", DType::kInt64, Dims({Dim::Symbol("N"), 3, 4}));
  Node* f0 = b.Add("Flatten", {x}, {Attribute::Int("axis", 0)}, "f0");
  Node* f2 = b.Add("Flatten", {x}, {Attribute::Int("axis", 2)}, "f2");
  Node* fneg = b.Add("Flatten", {x}, {Attribute::Int("axis", -1)}, "fneg");
  Node* f4 = b.Add("Flatten", {x}, {Attribute::Int("axis", 4)}, "f4");
  Node* fsym = b.Add("Flatten", {y}, {}, "fsym");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(f0)), "[1,120]");
  EXPECT_EQ(ShapeOf(b.Out(f2)), "[6,20]");
  EXPECT_EQ(ShapeOf(b.Out(fneg)), "[24,5]");
  EXPECT_EQ(ShapeOf(b.Out(f4)), "[120,1]");
  EXPECT_EQ(ShapeOf(b.Out(fsym)), "[N,12]");
  EXPECT_EQ(b.Out(fsym)->dtype(), DType::kInt64);
}

TEST(ShapeOps, FlattenOpsetDifferences) {
  {
    ModelBuilder b(9);
    Value* x = b.Input("x", DType::kFloat32, Dims({2, 3}));
    b.Add("Flatten", {x}, {Attribute::Int("axis", -1)}, "negative_at_9");
    ExpectInferError(b, "negative_at_9", "axis -1 is out of range [0, 2]");
  }
  {
    ModelBuilder b(8);
    Value* x = b.Input("x", DType::kInt64, Dims({2, 3}));
    b.Add("Flatten", {x}, {}, "int_at_8");
    ExpectInferError(b, "int_at_8", "input 0 has dtype int64");
  }
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat32, Dims({2, 3}));
    b.Add("Flatten", {x}, {Attribute::Int("axis", 3)}, "too_big");
    ExpectInferError(b, "too_big", "axis 3 is out of range [-2, 2]");
  }
}

TEST(ShapeOps, Transpose) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({Dim::Symbol("N"), 3, 4}));
  Node* rev = b.Add("Transpose", {x}, {}, "rev");
  Node* perm = b.Add("Transpose", {x}, {Attribute::Ints("perm", {0, 2, 1})}, "perm");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(rev)), "[4,3,N]");
  EXPECT_EQ(ShapeOf(b.Out(perm)), "[N,4,3]");

  b.Add("Transpose", {x}, {Attribute::Ints("perm", {0, 0, 1})}, "bad_perm");
  ExpectInferError(b, "bad_perm", "is not a permutation of 0..2");
}

// ---- Squeeze / Unsqueeze -----------------------------------------------------

TEST(ShapeOps, SqueezeAcrossOpsets) {
  for (int64_t opset : {11, 13, 25}) {
    SCOPED_TRACE(opset);
    ModelBuilder b(opset);
    Value* x = b.Input("x", DType::kFloat32, Dims({1, 3, 1, 5}));
    Node* some = opset < 13
                     ? b.Add("Squeeze", {x}, {Attribute::Ints("axes", {0, -2})}, "some")
                     : b.Add("Squeeze", {x, b.Ints("axes", {0, -2})}, {}, "some");
    Node* all = b.Add("Squeeze", {x}, {}, "all");
    ASSERT_TRUE(b.Infer().ok()) << b.Infer();
    EXPECT_EQ(ShapeOf(b.Out(some)), "[3,5]");
    EXPECT_EQ(ShapeOf(b.Out(all)), "[3,5]");
  }
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat32, Dims({1, 3}));
    b.Add("Squeeze", {x}, {Attribute::Ints("axes", {0})}, "attr_at_13");
    ExpectInferError(b, "attr_at_13", "'axes' is an input since opset 13");
  }
  {
    ModelBuilder b(11);
    Value* x = b.Input("x", DType::kFloat32, Dims({1, 3}));
    b.Add("Squeeze", {x}, {Attribute::Ints("axes", {1})}, "not_one");
    ExpectInferError(b, "not_one", "its size is not 1");
  }
  {
    // Without axes, a dim that may or may not be 1 leaves the rank unknown.
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat32, Dims({Dim::Symbol("N"), 1, 3}));
    Node* s = b.Add("Squeeze", {x}, {}, "s");
    ASSERT_TRUE(b.Infer().ok()) << b.Infer();
    EXPECT_FALSE(b.Out(s)->shape().rank_known());
  }
}

TEST(ShapeOps, UnsqueezeAcrossOpsets) {
  for (int64_t opset : {11, 13, 25}) {
    SCOPED_TRACE(opset);
    ModelBuilder b(opset);
    Value* x = b.Input("x", DType::kFloat32, Dims({3, 4, 5}));
    Node* u = opset < 13
                  ? b.Add("Unsqueeze", {x}, {Attribute::Ints("axes", {5, 2, 4})}, "u")
                  : b.Add("Unsqueeze", {x, b.Ints("axes", {5, 2, 4})}, {}, "u");
    Node* neg = opset < 13 ? b.Add("Unsqueeze", {x}, {Attribute::Ints("axes", {-1})}, "neg")
                           : b.Add("Unsqueeze", {x, b.Ints("axes_neg", {-1})}, {}, "neg");
    ASSERT_TRUE(b.Infer().ok()) << b.Infer();
    EXPECT_EQ(ShapeOf(b.Out(u)), "[3,4,1,5,1,1]");
    EXPECT_EQ(ShapeOf(b.Out(neg)), "[3,4,5,1]");
  }
  {
    ModelBuilder b(11);
    Value* x = b.Input("x", DType::kFloat32, Dims({3}));
    b.Add("Unsqueeze", {x}, {}, "no_axes");
    ExpectInferError(b, "no_axes", "attribute 'axes' is required before opset 13");
  }
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat32, Dims({3}));
    b.Add("Unsqueeze", {x, b.Ints("axes", {0, 0})}, {}, "dup");
    ExpectInferError(b, "dup", "listed twice");
  }
}

// ---- Expand / Shape / Size ---------------------------------------------------

TEST(ShapeOps, ExpandWithConstantAndShapeValue) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({3, 1}));
  Value* like = b.Input("like", DType::kFloat32, Dims({Dim::Symbol("B"), 3, 6}));
  Node* e = b.Add("Expand", {x, b.Ints("s", {2, 1, 6})}, {}, "e");
  Node* shape = b.Add("Shape", {like}, {}, "shape");
  Node* e2 = b.Add("Expand", {x, b.Out(shape)}, {}, "e2");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(e)), "[2,3,6]");
  EXPECT_EQ(ShapeOf(b.Out(e2)), "[B,3,6]");

  b.Add("Expand", {x, b.Ints("bad", {4, 6})}, {}, "bad_expand");
  ExpectInferError(b, "bad_expand", "do not broadcast");
}

TEST(ShapeOps, ShapeStartEndAndShapeValues) {
  ModelBuilder b(15);
  Value* x = b.Input("x", DType::kFloat32, Dims({Dim::Symbol("N"), 4, 5}));
  Node* mid = b.Add("Shape", {x}, {Attribute::Int("start", 1), Attribute::Int("end", -1)}, "mid");
  Node* clip = b.Add("Shape", {x}, {Attribute::Int("start", -10), Attribute::Int("end", 10)},
                     "clip");
  Node* empty = b.Add("Shape", {x}, {Attribute::Int("start", 2), Attribute::Int("end", 1)},
                      "empty");
  // The shape value of Shape(x)[0:2] = {N, 4} drives ConstantOfShape.
  Node* head = b.Add("Shape", {x}, {Attribute::Int("end", 2)}, "head");
  Node* zeros = b.Add("ConstantOfShape", {b.Out(head)}, {}, "zeros");
  Node* size = b.Add("Size", {x}, {}, "size");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(mid)), "[1]");
  EXPECT_EQ(ShapeOf(b.Out(clip)), "[3]");
  EXPECT_EQ(ShapeOf(b.Out(empty)), "[0]");
  EXPECT_EQ(ShapeOf(b.Out(zeros)), "[N,4]");
  EXPECT_EQ(b.Out(zeros)->dtype(), DType::kFloat32);
  EXPECT_EQ(ShapeOf(b.Out(size)), "[]");
  EXPECT_EQ(b.Out(size)->dtype(), DType::kInt64);

  ModelBuilder old(13);
  Value* y = old.Input("y", DType::kFloat32, Dims({2}));
  old.Add("Shape", {y}, {Attribute::Int("start", 1)}, "start_at_13");
  ExpectInferError(old, "start_at_13", "exist from opset 15");
}

// ---- Concat / Split ----------------------------------------------------------

TEST(DataMovementOps, Concat) {
  ModelBuilder b(13);
  Value* a = b.Input("a", DType::kFloat32, Dims({Dim::Symbol("N"), 2, 3}));
  Value* c = b.Input("c", DType::kFloat32, Dims({Dim::Symbol("N"), 5, 3}));
  Node* cat = b.Add("Concat", {a, c}, {Attribute::Int("axis", -2)}, "cat");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(cat)), "[N,7,3]");

  b.Add("Concat", {a, c}, {Attribute::Int("axis", 0)}, "bad_cat");
  ExpectInferError(b, "bad_cat", "differs from input 0 off axis 0");
}

TEST(DataMovementOps, ConcatNeedsAxisAndSameDType) {
  {
    ModelBuilder b(13);
    Value* a = b.Input("a", DType::kFloat32, Dims({2}));
    b.Add("Concat", {a, a}, {}, "no_axis");
    ExpectInferError(b, "no_axis", "attribute 'axis' is required");
  }
  {
    ModelBuilder b(13);
    Value* a = b.Input("a", DType::kFloat32, Dims({2}));
    Value* i = b.Input("i", DType::kInt64, Dims({2}));
    b.Add("Concat", {a, i}, {Attribute::Int("axis", 0)}, "mixed");
    ExpectInferError(b, "mixed", "they must match");
  }
}

TEST(DataMovementOps, SplitAttributeAt11) {
  ModelBuilder b(11);
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 6}));
  Node* var = b.Add("Split", {x}, {Attribute::Int("axis", 1), Attribute::Ints("split", {2, 4})},
                    "var", 2);
  Node* eq = b.Add("Split", {x}, {Attribute::Int("axis", -1)}, "eq", 3);
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(var, 0)), "[2,2]");
  EXPECT_EQ(ShapeOf(b.Out(var, 1)), "[2,4]");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ShapeOf(b.Out(eq, i)), "[2,2]");

  b.Add("Split", {x}, {Attribute::Int("axis", 1)}, "uneven", 4);
  ExpectInferError(b, "uneven", "does not split evenly into 4 outputs");
}

TEST(DataMovementOps, SplitInputAt13) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({6}));
  Node* var = b.Add("Split", {x, b.Ints("split", {2, 4})}, {}, "var", 2);
  Node* eq = b.Add("Split", {x}, {}, "eq", 3);
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(var, 0)), "[2]");
  EXPECT_EQ(ShapeOf(b.Out(var, 1)), "[4]");
  EXPECT_EQ(ShapeOf(b.Out(eq, 2)), "[2]");

  b.Add("Split", {x}, {Attribute::Ints("split", {3, 3})}, "attr_at_13", 2);
  ExpectInferError(b, "attr_at_13", "'split' is an input since opset 13");
}

TEST(DataMovementOps, SplitNumOutputsAt18) {
  ModelBuilder b(18);
  Value* x = b.Input("x", DType::kFloat32, Dims({7}));
  Node* four = b.Add("Split", {x}, {Attribute::Int("num_outputs", 4)}, "four", 4);
  Node* var = b.Add("Split", {x, b.Ints("split", {3, 4})}, {}, "var", 2);
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(four, 0)), "[2]");
  EXPECT_EQ(ShapeOf(b.Out(four, 2)), "[2]");
  EXPECT_EQ(ShapeOf(b.Out(four, 3)), "[1]");
  EXPECT_EQ(ShapeOf(b.Out(var, 1)), "[4]");
  {
    ModelBuilder c(18);
    Value* y = c.Input("y", DType::kFloat32, Dims({6}));
    c.Add("Split", {y}, {}, "neither", 3);
    ExpectInferError(c, "neither", "either input 'split' or attribute 'num_outputs'");
  }
  {
    ModelBuilder c(13);
    Value* y = c.Input("y", DType::kFloat32, Dims({6}));
    c.Add("Split", {y}, {Attribute::Int("num_outputs", 3)}, "num_outputs_at_13", 3);
    ExpectInferError(c, "num_outputs_at_13", "'num_outputs' exists from opset 18");
  }
  {
    ModelBuilder c(18);
    Value* y = c.Input("y", DType::kFloat32, Dims({6}));
    c.Add("Split", {y, c.Ints("split", {2, 2})}, {}, "bad_sum", 2);
    ExpectInferError(c, "bad_sum", "sums to 4 but axis 0");
  }
}

// ---- Slice -------------------------------------------------------------------

TEST(DataMovementOps, SliceAttributesBeforeOpset10) {
  ModelBuilder b(9);
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 4}));
  Node* s = b.Add("Slice", {x},
                  {Attribute::Ints("starts", {1, 0}), Attribute::Ints("ends", {2, 3}),
                   Attribute::Ints("axes", {0, 1})},
                  "s");
  Node* big = b.Add("Slice", {x},
                    {Attribute::Ints("starts", {0, 1}), Attribute::Ints("ends", {-1, 1000})},
                    "big");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(s)), "[1,3]");
  EXPECT_EQ(ShapeOf(b.Out(big)), "[1,3]");
}

TEST(DataMovementOps, SliceNegativeStepsAndClamping) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({20, 10, 5}));
  // The ONNX test_slice_neg_steps case: [20:0:-1, 10:0:-3, 4:1:-2] -> [19,3,2].
  Node* neg = b.Add("Slice",
                    {x, b.Ints("st", {20, 10, 4}), b.Ints("en", {0, 0, 1}),
                     b.Ints("ax", {0, 1, 2}), b.Ints("sp", {-1, -3, -2})},
                    {}, "neg");
  // Reverse a whole axis: start -1, end INT64_MIN, step -1.
  Node* rev = b.Add("Slice",
                    {x, b.Ints("st2", {-1}), b.Ints("en2", {INT64_MIN}), b.Ints("ax2", {1}),
                     b.Ints("sp2", {-1})},
                    {}, "rev");
  // Start past the end -> empty; end past the end -> clamped.
  Node* out_of_bounds = b.Add("Slice",
                              {x, b.Ints("st3", {1000, 2}), b.Ints("en3", {1000, 1000}),
                               b.Ints("ax3", {1, -1})},
                              {}, "oob");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(neg)), "[19,3,2]");
  EXPECT_EQ(ShapeOf(b.Out(rev)), "[20,10,5]");
  EXPECT_EQ(ShapeOf(b.Out(out_of_bounds)), "[20,0,3]");

  b.Add("Slice", {x, b.Ints("st4", {0}), b.Ints("en4", {1}), b.Ints("ax4", {0}),
                  b.Ints("sp4", {0})},
        {}, "zero_step");
  ExpectInferError(b, "zero_step", "'steps' entries must not be 0");
}

TEST(DataMovementOps, SliceKeepsSymbolsAndSlicesShapeValues) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({Dim::Symbol("N"), 3, 8, 8}));
  Node* whole = b.Add("Slice", {x, b.Ints("st", {0}), b.Ints("en", {INT64_MAX}),
                                b.Ints("ax", {0})},
                      {}, "whole");
  Node* shape = b.Add("Shape", {x}, {}, "shape");
  // Shape(x)[-2:] = {8, 8} and Shape(x)[0:2] = {N, 3}, used as Expand targets.
  Node* hw = b.Add("Slice", {b.Out(shape), b.Ints("st2", {-2}), b.Ints("en2", {INT64_MAX})}, {},
                   "hw");
  Node* head = b.Add("Slice", {b.Out(shape), b.Ints("st3", {0}), b.Ints("en3", {2})}, {}, "head");
  Node* reversed = b.Add("Slice",
                         {b.Out(shape), b.Ints("st4", {-1}), b.Ints("en4", {INT64_MIN}),
                          b.Ints("ax4", {0}), b.Ints("sp4", {-1})},
                         {}, "reversed");
  Value* one = b.Input("one", DType::kFloat32, Dims({1}));
  Node* e_hw = b.Add("Expand", {one, b.Out(hw)}, {}, "e_hw");
  Node* e_head = b.Add("Expand", {one, b.Out(head)}, {}, "e_head");
  Node* e_rev = b.Add("Expand", {one, b.Out(reversed)}, {}, "e_rev");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(whole)), "[N,3,8,8]");
  EXPECT_EQ(ShapeOf(b.Out(hw)), "[2]");
  EXPECT_EQ(ShapeOf(b.Out(e_hw)), "[8,8]");
  EXPECT_EQ(ShapeOf(b.Out(e_head)), "[N,3]");
  EXPECT_EQ(ShapeOf(b.Out(e_rev)), "[8,8,3,N]");
}

// ---- Gather ------------------------------------------------------------------

TEST(DataMovementOps, Gather) {
  ModelBuilder b(13);
  Value* data = b.Input("data", DType::kFloat32, Dims({5, 4, 3}));
  Node* scalar = b.Add("Gather", {data, b.ScalarInt("i0", -1)}, {}, "scalar");
  Value* idx = b.Input("idx", DType::kInt32, Dims({1, 2}));
  Node* two_d = b.Add("Gather", {data, idx}, {Attribute::Int("axis", 1)}, "two_d");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(scalar)), "[4,3]");
  EXPECT_EQ(ShapeOf(b.Out(two_d)), "[5,1,2,3]");

  b.Add("Gather", {data, b.Ints("far", {0, 7})}, {}, "out_of_range");
  ExpectInferError(b, "out_of_range", "index 7 is out of range for axis 0 of size 5");
}

TEST(DataMovementOps, GatherBadAxisAndIndexType) {
  {
    ModelBuilder b(13);
    Value* data = b.Input("data", DType::kFloat32, Dims({5, 4}));
    b.Add("Gather", {data, b.Ints("i", {0})}, {Attribute::Int("axis", 2)}, "bad_axis");
    ExpectInferError(b, "bad_axis", "axis 2 is out of range for rank 2");
  }
  {
    ModelBuilder b(13);
    Value* data = b.Input("data", DType::kFloat32, Dims({5, 4}));
    Value* fi = b.Input("fi", DType::kFloat32, Dims({2}));
    b.Add("Gather", {data, fi}, {}, "float_indices");
    ExpectInferError(b, "float_indices", "input 1 has dtype float32");
  }
}

// ---- Tile / Pad --------------------------------------------------------------

TEST(DataMovementOps, TileAndPad) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({Dim::Symbol("N"), 3, 4}));
  Node* tile = b.Add("Tile", {x, b.Ints("reps", {1, 2, 3})}, {}, "tile");
  Node* pad = b.Add("Pad", {x, b.Ints("pads", {0, 1, 2, 0, 1, -1})}, {}, "pad");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(tile)), "[N,6,12]");
  EXPECT_EQ(ShapeOf(b.Out(pad)), "[N,5,5]");

  ModelBuilder old(9);  // pads is an attribute before opset 11
  Value* y = old.Input("y", DType::kFloat32, Dims({2, 3}));
  Node* p = old.Add("Pad", {y}, {Attribute::Ints("pads", {1, 1, 1, 1})}, "p");
  ASSERT_TRUE(old.Infer().ok()) << old.Infer();
  EXPECT_EQ(ShapeOf(old.Out(p)), "[4,5]");

  ModelBuilder axes(18);
  Value* z = axes.Input("z", DType::kFloat32, Dims({2, 3, 4}));
  Node* pa = axes.Add("Pad", {z, axes.Ints("pads", {1, 2}), nullptr, axes.Ints("axes", {-1})},
                      {}, "pa");
  ASSERT_TRUE(axes.Infer().ok()) << axes.Infer();
  EXPECT_EQ(ShapeOf(axes.Out(pa)), "[2,3,7]");
}

TEST(DataMovementOps, PadConstantValueMatchesDataNotPads) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 3}));
  b.Add("Pad", {x, b.Ints("pads", {0, 1, 0, 1}), b.Initializer("v", Tensor::Scalar(2.5f))}, {},
        "pad");
  EXPECT_TRUE(b.Infer().ok()) << b.Infer();  // int64 pads must not be compared with data

  ModelBuilder bad(13);
  Value* y = bad.Input("y", DType::kFloat32, Dims({2, 3}));
  bad.Add("Pad", {y, bad.Ints("pads", {0, 1, 0, 1}), bad.ScalarInt("v", 2)}, {}, "pad");
  const absl::Status status = bad.Infer();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(std::string(status.message()).find("constant_value"), std::string::npos) << status;
}

// ---- Cast --------------------------------------------------------------------

TEST(MiscOps, CastToHalfTypes) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({Dim::Symbol("N"), 4}));
  Node* h = b.Add("Cast", {x}, {Attribute::Int("to", 10)}, "to_f16");
  Node* bf = b.Add("Cast", {x}, {Attribute::Int("to", 16)}, "to_bf16");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Out(h)->dtype(), DType::kFloat16);
  EXPECT_EQ(b.Out(bf)->dtype(), DType::kBFloat16);
  EXPECT_EQ(ShapeOf(b.Out(bf)), "[N,4]");
}

TEST(MiscOps, CastErrors) {
  {
    ModelBuilder b(19);
    Value* x = b.Input("x", DType::kFloat32, Dims({2}));
    b.Add("Cast", {x}, {Attribute::Int("to", 17)}, "to_float8");
    ExpectInferError(b, "to_float8", "FLOAT8E4M3FN");
  }
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat32, Dims({2}));
    b.Add("Cast", {x}, {Attribute::Int("to", 14)}, "to_complex");
    ExpectInferError(b, "to_complex", "COMPLEX64");
  }
  {
    ModelBuilder b(11);
    Value* x = b.Input("x", DType::kFloat32, Dims({2}));
    b.Add("Cast", {x}, {Attribute::Int("to", 16)}, "bf16_at_11");
    ExpectInferError(b, "bf16_at_11", "casting to bfloat16 needs a newer opset than 11");
  }
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat32, Dims({2}));
    b.Add("Cast", {x}, {}, "no_to");
    ExpectInferError(b, "no_to", "attribute 'to' is required");
  }
}

TEST(MiscOps, CastSaturateIgnoredFrom19) {
  ModelBuilder b(19);
  Value* x = b.Input("x", DType::kFloat32, Dims({2}));
  Node* c = b.Add("Cast", {x}, {Attribute::Int("to", 10), Attribute::Int("saturate", 0)}, "c");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Out(c)->dtype(), DType::kFloat16);
}

// ---- Constant ----------------------------------------------------------------

TEST(MiscOps, ConstantVariants) {
  ModelBuilder b(13);
  Node* t = b.Add("Constant", {},
                  {Attribute::TensorValue("value", Tensor(DType::kFloat16, {5, 5}))}, "t");
  Attribute f = Attribute::Float("value_float", 1.5f);
  Node* vf = b.Add("Constant", {}, {f}, "vf");
  Node* vfs = b.Add("Constant", {}, {Attribute::Floats("value_floats", {1, 2, 3})}, "vfs");
  Node* vi = b.Add("Constant", {}, {Attribute::Int("value_int", 7)}, "vi");
  Node* vis = b.Add("Constant", {}, {Attribute::Ints("value_ints", {-1, 28})}, "vis");
  Attribute strings;
  strings.name = "value_strings";
  strings.kind = AttrKind::kStrings;
  strings.strings = {"a", "b"};
  Node* vss = b.Add("Constant", {}, {strings}, "vss");
  // value_ints drives a Reshape target: [-1, 28] on [2, 14, 2].
  Value* x = b.Input("x", DType::kFloat32, Dims({2, 14, 2}));
  Node* r = b.Add("Reshape", {x, b.Out(vis)}, {}, "r");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Out(t)->dtype(), DType::kFloat16);
  EXPECT_EQ(ShapeOf(b.Out(t)), "[5,5]");
  EXPECT_EQ(b.Out(vf)->dtype(), DType::kFloat32);
  EXPECT_EQ(ShapeOf(b.Out(vf)), "[]");
  EXPECT_EQ(ShapeOf(b.Out(vfs)), "[3]");
  EXPECT_EQ(b.Out(vi)->dtype(), DType::kInt64);
  EXPECT_EQ(ShapeOf(b.Out(vi)), "[]");
  EXPECT_EQ(ShapeOf(b.Out(vis)), "[2]");
  EXPECT_EQ(b.Out(vss)->dtype(), DType::kString);
  EXPECT_EQ(ShapeOf(b.Out(vss)), "[2]");
  EXPECT_EQ(ShapeOf(b.Out(r)), "[2,28]");
}

TEST(MiscOps, ConstantErrors) {
  {
    ModelBuilder b(13);
    Attribute sparse;
    sparse.name = "sparse_value";
    sparse.kind = AttrKind::kSparseTensor;
    sparse.serialized = {""};
    b.Add("Constant", {}, {sparse}, "sparse");
    ExpectInferError(b, "sparse", "sparse constants");
  }
  {
    ModelBuilder b(13);
    b.Add("Constant", {}, {Attribute::Int("value_int", 1), Attribute::Float("value_float", 1)},
          "two_values");
    ExpectInferError(b, "two_values", "exactly one of the value attributes");
  }
  {
    ModelBuilder b(11);
    b.Add("Constant", {}, {Attribute::Int("value_int", 1)}, "value_int_at_11");
    ExpectInferError(b, "value_int_at_11", "'value_int' exists from opset 12");
  }
  {
    ModelBuilder b(8);
    b.Add("Constant", {}, {Attribute::TensorValue("value", Tensor::Int64s({1}))}, "int_at_8");
    ExpectInferError(b, "int_at_8", "int64 constant is not allowed at opset 8");
  }
}

// ---- Identity / Dropout ------------------------------------------------------

TEST(MiscOps, IdentityForwardsTypeAndShapeValue) {
  ModelBuilder b(13);
  Value* x = b.Input("x", DType::kFloat32, Dims({Dim::Symbol("N"), 3}));
  Node* shape = b.Add("Shape", {x}, {}, "shape");
  Node* id = b.Add("Identity", {b.Out(shape)}, {}, "id");
  Node* fill = b.Add("ConstantOfShape", {b.Out(id)},
                     {Attribute::TensorValue("value", Tensor::Int64s({3}))}, "fill");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Out(id)->dtype(), DType::kInt64);
  EXPECT_EQ(ShapeOf(b.Out(fill)), "[N,3]");
  EXPECT_EQ(b.Out(fill)->dtype(), DType::kInt64);
}

TEST(MiscOps, DropoutOutputsPerOpset) {
  {
    ModelBuilder b(7);
    Value* x = b.Input("x", DType::kFloat32, Dims({3, 4}));
    Node* d = b.Add("Dropout", {x}, {Attribute::Float("ratio", 0.2f)}, "d", 2);
    ASSERT_TRUE(b.Infer().ok()) << b.Infer();
    EXPECT_EQ(b.Out(d, 0)->dtype(), DType::kFloat32);
    EXPECT_EQ(b.Out(d, 1)->dtype(), DType::kFloat32);  // mask is T before opset 10
    EXPECT_EQ(ShapeOf(b.Out(d, 1)), "[3,4]");
  }
  {
    ModelBuilder b(11);
    Value* x = b.Input("x", DType::kFloat16, Dims({3, 4}));
    Node* d = b.Add("Dropout", {x}, {}, "d", 2);
    ASSERT_TRUE(b.Infer().ok()) << b.Infer();
    EXPECT_EQ(b.Out(d, 0)->dtype(), DType::kFloat16);
    EXPECT_EQ(b.Out(d, 1)->dtype(), DType::kBool);
  }
  {
    ModelBuilder b(22);
    Value* x = b.Input("x", DType::kBFloat16, Dims({3, 4}));
    Value* ratio = b.Input("ratio", DType::kFloat32, Shape::Scalar());
    Value* training = b.Input("training", DType::kBool, Shape::Scalar());
    Node* d = b.Add("Dropout", {x, ratio, training}, {Attribute::Int("seed", 0)}, "d", 2);
    Node* only = b.Add("Dropout", {x}, {}, "only");
    ASSERT_TRUE(b.Infer().ok()) << b.Infer();
    EXPECT_EQ(b.Out(d, 0)->dtype(), DType::kBFloat16);
    EXPECT_EQ(b.Out(d, 1)->dtype(), DType::kBool);
    EXPECT_EQ(ShapeOf(b.Out(d, 1)), "[3,4]");
    EXPECT_EQ(only->num_outputs(), 1);
    EXPECT_EQ(ShapeOf(b.Out(only)), "[3,4]");
  }
}

TEST(MiscOps, DropoutErrors) {
  {
    ModelBuilder b(12);
    Value* x = b.Input("x", DType::kFloat32, Dims({3}));
    b.Add("Dropout", {x}, {Attribute::Float("ratio", 0.5f)}, "ratio_attr_at_12");
    ExpectInferError(b, "ratio_attr_at_12", "'ratio' is an input since opset 12");
  }
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kFloat32, Dims({3}));
    Value* ratio = b.Input("ratio", DType::kFloat32, Dims({1}));
    b.Add("Dropout", {x, ratio}, {}, "ratio_not_scalar");
    ExpectInferError(b, "ratio_not_scalar", "(ratio) must be a scalar");
  }
  {
    ModelBuilder b(13);
    Value* x = b.Input("x", DType::kInt64, Dims({3}));
    b.Add("Dropout", {x}, {}, "int_dropout");
    ExpectInferError(b, "int_dropout", "input 0 has dtype int64");
  }
}

// ---- Range / ConstantOfShape -------------------------------------------------

TEST(MiscOps, Range) {
  ModelBuilder b(11);
  Node* ints = b.Add("Range", {b.ScalarInt("s", 10), b.ScalarInt("l", 1), b.ScalarInt("d", -3)},
                     {}, "ints");
  Node* floats = b.Add("Range",
                       {b.Initializer("fs", Tensor::Scalar(0.0f)),
                        b.Initializer("fl", Tensor::Scalar(1.0f)),
                        b.Initializer("fd", Tensor::Scalar(0.3f))},
                       {}, "floats");
  Value* limit = b.Input("limit", DType::kInt64, Shape::Scalar());
  Node* unknown = b.Add("Range", {b.ScalarInt("s2", 0), limit, b.ScalarInt("d2", 1)}, {},
                        "unknown");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(ints)), "[3]");  // 10, 7, 4
  EXPECT_EQ(b.Out(ints)->dtype(), DType::kInt64);
  EXPECT_EQ(ShapeOf(b.Out(floats)), "[4]");  // 0, 0.3, 0.6, 0.9
  EXPECT_EQ(ShapeOf(b.Out(unknown)), "[?]");

  b.Add("Range", {b.ScalarInt("s3", 0), b.Initializer("fl3", Tensor::Scalar(1.0f)),
                  b.ScalarInt("d3", 1)},
        {}, "mixed_range");
  ExpectInferError(b, "mixed_range", "they must match");
}

TEST(MiscOps, ConstantOfShape) {
  ModelBuilder b(13);
  Node* z = b.Add("ConstantOfShape", {b.Ints("shape", {2, 3})}, {}, "z");
  Node* scalar = b.Add("ConstantOfShape", {b.Ints("empty", {})},
                       {Attribute::TensorValue("value", Tensor::Int64s({1}))}, "scalar");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(ShapeOf(b.Out(z)), "[2,3]");
  EXPECT_EQ(b.Out(z)->dtype(), DType::kFloat32);
  EXPECT_EQ(ShapeOf(b.Out(scalar)), "[]");
  EXPECT_EQ(b.Out(scalar)->dtype(), DType::kInt64);

  b.Add("ConstantOfShape", {b.Ints("shape2", {2})},
        {Attribute::TensorValue("value", Tensor::Int64s({1, 2}))}, "two_values");
  ExpectInferError(b, "two_values", "must hold one element");
}

// ---- Registry records --------------------------------------------------------

TEST(OpsBRegistry, SchemasAndOpsetRanges) {
  const OpRegistry& registry = OpRegistry::Global();
  for (const char* op :
       {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1",
        "ReduceSumSquare", "ReduceLogSumExp", "ArgMax", "ArgMin", "CumSum", "Reshape", "Flatten",
        "Transpose", "Squeeze", "Unsqueeze", "Expand", "Shape", "Size", "Concat", "Split",
        "Slice", "Gather", "Tile", "Pad", "Cast", "Constant", "Identity", "Dropout", "Range",
        "ConstantOfShape"}) {
    const OpDef* def = registry.Find("", op);
    ASSERT_NE(def, nullptr) << op;
    EXPECT_EQ(def->max_opset, kMaxOnnxOpset) << op;
    EXPECT_GE(def->min_opset, kMinOnnxOpset) << op;
    EXPECT_FALSE(def->summary.empty()) << op;
    EXPECT_NE(def->autocast, AutocastCategory::kUnset) << op;  // autocast_table.cc covers all
  }
  const OpDef* concat = registry.Find("", "Concat");
  EXPECT_EQ(concat->max_inputs, INT_MAX);
  ASSERT_EQ(concat->attributes.size(), 1u);
  EXPECT_TRUE(concat->attributes[0].required);
  EXPECT_EQ(registry.Find("", "Split")->max_outputs, INT_MAX);
  EXPECT_EQ(registry.Find("", "Dropout")->max_outputs, 2);
  EXPECT_EQ(registry.Find("", "Range")->min_opset, 11);
  EXPECT_EQ(registry.Find("", "Expand")->min_opset, 8);
}

// ---- Conformance cases of these ops, with integer inputs as constants --------

namespace fs = std::filesystem;

bool IsOpOfThisFile(const std::string& op) {
  static const char* const kOps[] = {
      "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
      "ReduceL1", "ReduceSumSquare", "ReduceLogSumExp", "ArgMax", "ArgMin", "CumSum",
      "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Expand", "Shape", "Size",
      "Concat", "Split", "Slice", "Gather", "Tile", "Pad", "Cast", "Constant", "Identity",
      "Dropout", "Range", "ConstantOfShape"};
  for (const char* o : kOps) {
    if (op == o) return true;
  }
  return false;
}

TEST(OpsBConformance, ExactOutputTypesWithIntegerInputsAsConstants) {
  const fs::path root = fs::path(CASTOR_SHARED_DIR) / "conformance" / "onnx-node";
  if (!fs::is_directory(root)) GTEST_SKIP() << "no conformance data at " << root;
  std::vector<fs::path> cases;
  for (const auto& entry : fs::directory_iterator(root)) cases.push_back(entry.path());
  std::sort(cases.begin(), cases.end());
  int checked = 0;
  int cases_checked = 0;
  for (const fs::path& dir : cases) {
    absl::StatusOr<Model> model = LoadModel((dir / "model.onnx").string());
    ASSERT_TRUE(model.ok()) << dir << ": " << model.status();
    Graph& graph = *model->graph;
    if (graph.num_nodes() != 1 || !graph.nodes()[0]->domain().empty() ||
        !IsOpOfThisFile(graph.nodes()[0]->op_type())) {
      continue;
    }
    SCOPED_TRACE(dir.filename().string());
    ++cases_checked;
    Node* node = graph.nodes()[0];
    // Integer inputs become constants (as initializers would be), so shape
    // inference must produce exact output shapes.
    const std::vector<Value*> inputs = graph.inputs();
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!IsInteger(inputs[k]->dtype())) continue;
      absl::StatusOr<Tensor> data = LoadTensorProtoFile(
          (dir / "test_data_set_0" / ("input_" + std::to_string(k) + ".pb")).string());
      ASSERT_TRUE(data.ok()) << data.status();
      absl::StatusOr<Value*> constant =
          graph.AddInitializer(inputs[k]->name() + "__const", *std::move(data));
      ASSERT_TRUE(constant.ok()) << constant.status();
      for (int i = 0; i < node->num_inputs(); ++i) {
        if (node->input(i) == inputs[k]) node->SetInput(i, *constant);
      }
    }
    // Forget the declared output types: they must come from inference alone.
    for (Value* out : graph.outputs()) {
      out->set_dtype(DType::kUndefined);
      out->set_shape(Shape::Unknown());
    }
    absl::Status status = InferTypes(*model);
    ASSERT_TRUE(status.ok()) << status;
    for (size_t k = 0; k < graph.outputs().size(); ++k) {
      absl::StatusOr<Tensor> expected = LoadTensorProtoFile(
          (dir / "test_data_set_0" / ("output_" + std::to_string(k) + ".pb")).string());
      ASSERT_TRUE(expected.ok()) << expected.status();
      const Value* out = graph.outputs()[k];
      EXPECT_EQ(DTypeName(out->dtype()), std::string(DTypeName(expected->dtype())))
          << "output " << k;
      EXPECT_EQ(out->shape().ToString(), expected->shape().ToString()) << "output " << k;
      ++checked;
    }
  }
  // 109 cases use these ops (see ../shared/conformance), with 130 outputs
  // (Split and Dropout have several).
  EXPECT_EQ(cases_checked, 109);
  EXPECT_EQ(checked, 130);
}

}  // namespace
}  // namespace castor
