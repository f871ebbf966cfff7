// Tests for passes/autodiff.h and the gradient rules (graph/ops/
// gradient_rules.cc): for each rule, a finite-difference check. A small model
// computes Y from parameters given as graph inputs; the loss is
// L = ReduceSum(Y * R) for a fixed random R; the autodiff pass appends the
// backward graph; the CPU backend runs it; every gradient element is
// compared with the central difference (L(p + h) - L(p - h)) / 2h
// accumulated in double. Inputs avoid kinks (no value within 2h of one).
// Plus: 16-bit activations get 16-bit gradients and the Cast rule casts
// back, contributions of a value used twice are summed, and the errors
// (an op without a gradient, a parameter that does not reach the loss, a
// non-scalar loss) name what is wrong.
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/executor.h"
#include "gmock/gmock.h"
#include "graph/gradient_builder.h"
#include "graph/shape_inference.h"
#include "gtest/gtest.h"
#include "passes/autodiff.h"
#include "passes/verifier.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using ::testing::HasSubstr;
using testing::Cpu;
using testing::ValueOrDie;

// Values spread over [lo, hi] avoiding |x| < gap (kinks at 0, FD steps).
Tensor RandomTensor(std::vector<int64_t> dims, std::mt19937& rng, float lo = -1.0f,
                    float hi = 1.0f, float gap = 0.05f) {
  Tensor tensor(DType::kFloat32, dims);
  std::uniform_real_distribution<float> uniform(lo, hi);
  for (int64_t i = 0; i < tensor.num_elements(); ++i) {
    float v = uniform(rng);
    while (std::fabs(v) < gap) v = uniform(rng);
    tensor.data<float>()[i] = v;
  }
  return tensor;
}

// Builds: parameters (graph inputs) -> body -> Y; L = ReduceSum(Y * R).
class GradCheck {
 public:
  explicit GradCheck(int64_t opset = 17) : rng_(1234) { model_.opset_imports = {{"", opset}}; }

  Graph& graph() { return *model_.graph; }
  std::mt19937& rng() { return rng_; }

  // A parameter with random values (or given ones).
  Value* Parameter(const std::string& name, std::vector<int64_t> dims, float lo = -1.0f,
                   float hi = 1.0f) {
    Tensor value = RandomTensor(dims, rng_, lo, hi);
    Value* input = ValueOrDie(graph().AddInput(name, DType::kFloat32, Shape::FromDims(dims)));
    feeds_.emplace_back(name, std::move(value));
    parameters_.push_back(name);
    return input;
  }
  // A parameter fed random values of `dims` but declared with `declared`
  // (symbolic dims, as an exporter's computed shapes leave them).
  Value* Parameter(const std::string& name, std::vector<int64_t> dims, Shape declared) {
    Tensor value = RandomTensor(dims, rng_, -1.0f, 1.0f);
    Value* input = ValueOrDie(graph().AddInput(name, DType::kFloat32, std::move(declared)));
    feeds_.emplace_back(name, std::move(value));
    parameters_.push_back(name);
    return input;
  }
  // A parameter with the given float32 values (to keep clear of kinks).
  Value* Parameter(const std::string& name, Tensor value) {
    Value* input = ValueOrDie(graph().AddInput(name, DType::kFloat32, value.shape()));
    feeds_.emplace_back(name, std::move(value));
    parameters_.push_back(name);
    return input;
  }
  Value* Constant(const std::string& name, Tensor value) {
    return ValueOrDie(graph().AddInitializer(name, std::move(value)));
  }
  Value* Op(const std::string& op_type, const std::vector<Value*>& inputs,
            std::vector<Attribute> attributes = {}, int num_outputs = 1) {
    std::vector<std::string> names;
    for (int k = 0; k < num_outputs; ++k) names.push_back(absl::StrCat(op_type, "_", count_, "_", k));
    Node* node = ValueOrDie(graph().AddNode(op_type, inputs, names, absl::StrCat(op_type, "_", count_++)));
    for (Attribute& attribute : attributes) node->SetAttribute(std::move(attribute));
    return node->output(0);
  }

  // Finishes the model with the loss and the backward graph; checks every
  // gradient against central differences.
  void Check(Value* y, double rtol = 2e-3, double atol = 2e-4, double step = 1e-3) {
    ASSERT_TRUE(InferTypes(model_).ok());
    Value* r = Constant("R", RandomTensor(ValueOrDie(ToDims(y)), rng_));
    Value* weighted = Op("Mul", {y, r});
    Value* loss = Op("ReduceSum", {weighted}, {Attribute::Int("keepdims", 0)});
    graph().AddOutput(loss);
    absl::Status inferred = InferTypes(model_);
    ASSERT_TRUE(inferred.ok()) << inferred;
    AutodiffResult result =
        ValueOrDie(BuildGradients(model_, AutodiffRequest{loss->name(), parameters_, ""}));
    for (const auto& [parameter, gradient] : result.gradients) {
      graph().AddOutput(graph().FindValue(gradient));
    }
    absl::Status verified = VerifyModel(model_);
    ASSERT_TRUE(verified.ok()) << verified;
    auto executor = ValueOrDie(Executor::Create(model_, Cpu()));
    const std::vector<Tensor> outputs = ValueOrDie(executor->Run(feeds_));
    for (size_t p = 0; p < parameters_.size(); ++p) {
      const Tensor& analytic = outputs[1 + p];
      ASSERT_EQ(analytic.dtype(), DType::kFloat32);
      Tensor& value = feeds_[p].second;
      ASSERT_EQ(analytic.num_elements(), value.num_elements()) << parameters_[p];
      for (int64_t i = 0; i < value.num_elements(); ++i) {
        const float saved = value.data<float>()[i];
        value.data<float>()[i] = saved + static_cast<float>(step);
        const double up = ValueOrDie(executor->Run(feeds_))[0].data<float>()[0];
        value.data<float>()[i] = saved - static_cast<float>(step);
        const double down = ValueOrDie(executor->Run(feeds_))[0].data<float>()[0];
        value.data<float>()[i] = saved;
        const double numeric = (up - down) / (2 * step);
        const double got = analytic.data<float>()[i];
        EXPECT_NEAR(got, numeric, atol + rtol * std::fabs(numeric))
            << "d loss / d " << parameters_[p] << "[" << i << "]";
      }
    }
  }

  Model& model() { return model_; }

 private:
  static absl::StatusOr<std::vector<int64_t>> ToDims(const Value* value) {
    std::optional<std::vector<int64_t>> dims = value->shape().StaticDims();
    if (!dims) return absl::InvalidArgumentError("Y needs a static shape");
    return *dims;
  }

  Model model_;
  std::mt19937 rng_;
  std::vector<std::pair<std::string, Tensor>> feeds_;
  std::vector<std::string> parameters_;
  int count_ = 0;
};

TEST(GradientRuleTest, AddSubMulDivSameShapes) {
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    SCOPED_TRACE(op);
    GradCheck check;
    Value* a = check.Parameter("a", {2, 3});
    Value* b = check.Parameter("b", {2, 3}, 0.5f, 1.5f);
    check.Check(check.Op(op, {a, b}));
  }
}

TEST(GradientRuleTest, ValueUsedTwiceSumsItsContributions) {
  GradCheck check;
  Value* a = check.Parameter("a", {3, 2});
  Value* square = check.Op("Mul", {a, a});
  check.Check(check.Op("Add", {square, a}));
}

TEST(GradientRuleTest, UnaryOps) {
  struct Case {
    const char* op;
    float lo, hi;
  };
  for (const Case& c : std::vector<Case>{{"Neg", -1, 1},
                                         {"Identity", -1, 1},
                                         {"Exp", -1, 1},
                                         {"Log", 0.5f, 2},
                                         {"Sqrt", 0.5f, 2},
                                         {"Tanh", -1, 1},
                                         {"Sigmoid", -2, 2},
                                         {"Erf", -1.5f, 1.5f}}) {
    SCOPED_TRACE(c.op);
    GradCheck check;
    Value* x = check.Parameter("x", {2, 5}, c.lo, c.hi);
    check.Check(check.Op(c.op, {x}));
  }
}

TEST(GradientRuleTest, PowBaseAndExponent) {
  GradCheck check;
  Value* a = check.Parameter("a", {2, 3}, 0.5f, 1.5f);
  Value* b = check.Parameter("b", {2, 3}, 1.0f, 3.0f);
  check.Check(check.Op("Pow", {a, b}));
}

TEST(GradientRuleTest, MatMulTwoDimensionalAndBatched) {
  {
    GradCheck check;
    Value* a = check.Parameter("a", {3, 4});
    Value* b = check.Parameter("b", {4, 2});
    check.Check(check.Op("MatMul", {a, b}));
  }
  {
    GradCheck check;
    Value* a = check.Parameter("a", {2, 3, 4});
    Value* b = check.Parameter("b", {2, 4, 2});
    check.Check(check.Op("MatMul", {a, b}));
  }
}

// Counts the nodes of `op_type` in the graph.
int CountOps(const Graph& graph, const std::string& op_type) {
  int count = 0;
  for (const Node* node : graph.nodes()) count += node->op_type() == op_type ? 1 : 0;
  return count;
}

// The rules ask for ReduceToShapeOf before inference has shaped the
// gradients (MatMul's dA and dB differ from its output's shape); autodiff
// drops the ones that turn out to be identities, and keeps the ones that
// sum a broadcast batch.
TEST(GradientRuleTest, MatMulReducesOnlyTheBatchesItBroadcast) {
  {
    GradCheck same_batches;
    Value* a = same_batches.Parameter("a", {2, 3, 4});
    Value* b = same_batches.Parameter("b", {2, 4, 2});
    same_batches.Check(same_batches.Op("MatMul", {a, b}));
    EXPECT_EQ(CountOps(same_batches.graph(), "ReduceToShapeOf"), 0);
  }
  {
    GradCheck broadcast_b;
    Value* a = broadcast_b.Parameter("a", {2, 3, 4});
    Value* b = broadcast_b.Parameter("b", {1, 4, 2});
    broadcast_b.Check(broadcast_b.Op("MatMul", {a, b}));
    EXPECT_EQ(CountOps(broadcast_b.graph(), "ReduceToShapeOf"), 1);  // dB over the batch
  }
}

int GemmsWithTransA(const Graph& graph) {
  int count = 0;
  for (const Node* node : graph.nodes()) {
    count += node->op_type() == "Gemm" && node->GetInt("transA", 0) == 1;
  }
  return count;
}

// A matrix B shared by every batch of A (a linear layer on a sequence): dB
// is one Gemm over the folded batch (transA), with no Transpose of A, also
// where only B's shape gives K; the general rule (a transposed copy of A,
// per-batch products, a sum over the batch) remains before opset 11, where
// Gemm needs C.
TEST(GradientRuleTest, MatMulWithASharedMatrixIsOneGemm) {
  for (const std::vector<int64_t>& a_dims :
       {std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{2, 2, 3, 4}}) {
    SCOPED_TRACE(a_dims.size() == 3 ? "A rank 3" : "A rank 4");
    GradCheck check;
    Value* a = check.Parameter("a", a_dims);
    Value* b = check.Parameter("b", {4, 2});
    check.Check(check.Op("MatMul", {a, b}));
    if (HasFatalFailure()) return;
    EXPECT_EQ(GemmsWithTransA(check.graph()), 1);
    // One Transpose remains: B's, for dA = dY @ B^T.
    EXPECT_EQ(CountOps(check.graph(), "Transpose"), 1);
  }
  {
    // A's K unknown (declared [2, 3, k], as a computed Reshape leaves it):
    // B's first dim gives K, and dB is still one Gemm.
    GradCheck symbolic_k;
    Value* a = symbolic_k.Parameter("a", {2, 3, 4},
                                    Shape({Dim(2), Dim(3), Dim::Symbol("k")}));
    Value* b = symbolic_k.Parameter("b", {4, 2});
    symbolic_k.Check(symbolic_k.Op("MatMul", {a, b}));
    if (HasFatalFailure()) return;
    EXPECT_EQ(GemmsWithTransA(symbolic_k.graph()), 1);
    EXPECT_EQ(CountOps(symbolic_k.graph(), "ReduceToShapeOf"), 0);
  }
  GradCheck opset10(10);
  Value* a = opset10.Parameter("a", {2, 3, 4});
  Value* b = opset10.Parameter("b", {4, 2});
  opset10.Check(opset10.Op("MatMul", {a, b}));
  EXPECT_EQ(CountOps(opset10.graph(), "Gemm"), 0);
  EXPECT_EQ(CountOps(opset10.graph(), "Transpose"), 2);
}

// Einsum: every input's gradient is one backward Einsum, plus Unsqueeze +
// Expand for labels only that input has and ReduceToShapeOf for dims the
// forward broadcast; opset 12 (Unsqueeze's axes an attribute) and 13.
TEST(GradientRuleTest, EinsumEquations) {
  struct Case {
    const char* equation;
    std::vector<std::vector<int64_t>> dims;
  };
  for (int64_t opset : {12, 13}) {
    for (const Case& c : std::vector<Case>{
             {"ij,jk->ik", {{3, 4}, {4, 2}}},
             {"bhqd,bhkd->bhqk", {{2, 2, 3, 4}, {2, 2, 2, 4}}},
             {"bhqk,bhkd->bhqd", {{2, 2, 3, 2}, {2, 2, 2, 4}}},
             {"i,j->ij", {{3}, {4}}},
             {"ij->ji", {{3, 4}}},
             {"ij->", {{3, 4}}},
             {"ijk,k->j", {{2, 3, 4}, {4}}},                      // i only in input 0: Expand
             {"...ij,...jk->...ik", {{2, 1, 3, 4}, {3, 4, 2}}},  // broadcast "..."
             {"ij,jk", {{2, 3}, {3, 4}}},                        // implicit output
             {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 2}}},
             {"bn,anm,bm->ba", {{3, 4}, {2, 4, 5}, {3, 5}}},
             {"ij,ij->ij", {{3, 1}, {1, 4}}},  // size-1 dims broadcast
         }) {
      SCOPED_TRACE(absl::StrCat(c.equation, " opset ", opset));
      GradCheck check(opset);
      std::vector<Value*> inputs;
      for (size_t i = 0; i < c.dims.size(); ++i) {
        inputs.push_back(check.Parameter(absl::StrCat("x", i), c.dims[i]));
      }
      check.Check(check.Op("Einsum", inputs, {Attribute::String("equation", c.equation)}));
      if (HasFatalFailure()) return;
    }
  }
}

// An input's own diagonal has no gradient rule: the error names the node and
// the repeated subscript. The other input of the same node still has one.
TEST(GradientRuleTest, EinsumDiagonalInputHasNoGradient) {
  {
    Model model;
    model.opset_imports = {{"", 13}};
    Graph& g = *model.graph;
    Value* x = ValueOrDie(g.AddInput("x", DType::kFloat32, Shape({3, 3})));
    Node* node = ValueOrDie(g.AddNode("Einsum", {x}, {"y"}, "diag"));
    node->SetAttribute(Attribute::String("equation", "ii->i"));
    Node* loss = ValueOrDie(g.AddNode("ReduceSum", {node->output(0)}, {"loss"}, "sum"));
    loss->SetAttribute(Attribute::Int("keepdims", 0));
    g.AddOutput(loss->output(0));
    ASSERT_TRUE(InferTypes(model).ok());
    absl::StatusOr<AutodiffResult> result =
        BuildGradients(model, AutodiffRequest{"loss", {"x"}, ""});
    ASSERT_FALSE(result.ok());
    const std::string message(result.status().message());
    EXPECT_NE(message.find("'diag'"), std::string::npos) << message;
    EXPECT_NE(message.find("repeat 'i' (a diagonal)"), std::string::npos) << message;
  }
  GradCheck check(13);
  Value* a = check.Constant("a", RandomTensor({3, 3, 4}, check.rng()));
  Value* b = check.Parameter("b", {4, 2});
  check.Check(check.Op("Einsum", {a, b}, {Attribute::String("equation", "iij,jk->ik")}));
}

TEST(GradientRuleTest, GemmEveryTransposeCombinationAlphaBeta) {
  for (int trans_a : {0, 1}) {
    for (int trans_b : {0, 1}) {
      SCOPED_TRACE(absl::StrCat("transA=", trans_a, " transB=", trans_b));
      GradCheck check;
      Value* a = check.Parameter("a", trans_a ? std::vector<int64_t>{4, 3} : std::vector<int64_t>{3, 4});
      Value* b = check.Parameter("b", trans_b ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{4, 2});
      Value* c = check.Parameter("c", {3, 2});
      check.Check(check.Op("Gemm", {a, b, c},
                           {Attribute::Int("transA", trans_a), Attribute::Int("transB", trans_b),
                            Attribute::Float("alpha", 0.75f), Attribute::Float("beta", 1.5f)}));
    }
  }
}

TEST(GradientRuleTest, ReshapeFlattenTranspose) {
  {
    GradCheck check;
    Value* x = check.Parameter("x", {2, 3, 4});
    Value* shape = check.Constant("shape", Tensor::Int64s({4, 6}));
    check.Check(check.Op("Reshape", {x, shape}));
  }
  {
    GradCheck check;
    Value* x = check.Parameter("x", {2, 3, 2});
    check.Check(check.Op("Flatten", {x}, {Attribute::Int("axis", 1)}));
  }
  {
    GradCheck check;
    Value* x = check.Parameter("x", {2, 3, 4});
    check.Check(check.Op("Transpose", {x}, {Attribute::Ints("perm", {1, 2, 0})}));
  }
}

TEST(GradientRuleTest, ReduceSumAndMeanWithAndWithoutKeepdims) {
  for (int keepdims : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("keepdims=", keepdims));
    GradCheck sum;
    Value* x = sum.Parameter("x", {2, 3, 4});
    Value* axes = sum.Constant("axes", Tensor::Int64s({1}));
    sum.Check(sum.Op("ReduceSum", {x, axes}, {Attribute::Int("keepdims", keepdims)}));
    GradCheck mean;
    Value* y = mean.Parameter("x", {2, 3, 4});
    mean.Check(mean.Op("ReduceMean", {y}, {Attribute::Ints("axes", {0, 2}),
                                          Attribute::Int("keepdims", keepdims)}));
    // Before opset 13 ReduceSum's axes, and Unsqueeze's in the backward
    // graph, are attributes.
    for (const char* op : {"ReduceSum", "ReduceMean"}) {
      SCOPED_TRACE(::testing::Message() << op << " at opset 11");
      GradCheck opset11(11);
      Value* z = opset11.Parameter("x", {2, 3, 4});
      opset11.Check(opset11.Op(op, {z}, {Attribute::Ints("axes", {1}),
                                         Attribute::Int("keepdims", keepdims)}));
    }
  }
}

TEST(GradientRuleTest, CastToFloat16AndBackGivesFloat32Gradients) {
  // x (float32 master) -> Cast float16 -> Mul float16 -> Cast float32: the
  // gradient of x is float32; the 16-bit path rounds, so the tolerance is
  // float16's.
  GradCheck check;
  Value* x = check.Parameter("x", {2, 4});
  Value* w = check.Parameter("w", {2, 4});
  Value* x16 = check.Op("Cast", {x}, {Attribute::Int("to", 10)});
  Value* w16 = check.Op("Cast", {w}, {Attribute::Int("to", 10)});
  Value* product = check.Op("Mul", {x16, w16});
  check.Check(check.Op("Cast", {product}, {Attribute::Int("to", 1)}), /*rtol=*/2e-2,
              /*atol=*/2e-2, /*step=*/5e-2);
  // The backward graph kept the 16-bit gradients 16-bit.
  for (const Node* node : check.model().graph->nodes()) {
    if (node->name().rfind("Mul_2/grad/", 0) == 0 && node->op_type() == "Mul") {
      EXPECT_EQ(node->output(0)->dtype(), DType::kFloat16) << node->name();
    }
  }
}

TEST(GradientRuleTest, BroadcastingElementwiseSumsBackToTheInputShape) {
  GradCheck check;
  Value* a = check.Parameter("a", {2, 3, 4});
  Value* bias = check.Parameter("bias", {4});
  Value* scale = check.Parameter("scale", {3, 1}, 0.5f, 1.5f);
  Value* shifted = check.Op("Add", {a, bias});
  check.Check(check.Op("Div", {shifted, scale}));
}

TEST(GradientRuleTest, ReluSoftmaxLogSoftmax) {
  {
    GradCheck check;
    Value* x = check.Parameter("x", {3, 4});
    check.Check(check.Op("Relu", {x}));
  }
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    SCOPED_TRACE(op);
    GradCheck check;
    Value* x = check.Parameter("x", {2, 3, 4});
    check.Check(check.Op(op, {x}, {Attribute::Int("axis", 1)}));
  }
}

TEST(GradientRuleTest, ConvWithBiasAndPooling) {
  GradCheck check;
  Value* x = check.Parameter("x", {2, 2, 5, 5});
  Value* w = check.Parameter("w", {3, 2, 3, 3});
  Value* b = check.Parameter("b", {3});
  Value* conv = check.Op("Conv", {x, w, b},
                         {Attribute::Ints("pads", {1, 1, 1, 1}), Attribute::Ints("strides", {1, 1})});
  Value* pooled = check.Op("MaxPool", {conv}, {Attribute::Ints("kernel_shape", {2, 2}),
                                               Attribute::Ints("strides", {2, 2})});
  Value* averaged = check.Op("AveragePool", {pooled}, {Attribute::Ints("kernel_shape", {2, 2})});
  check.Check(check.Op("GlobalAveragePool", {averaged}), /*rtol=*/5e-3, /*atol=*/5e-4);
}

// ConvTranspose in the forms exporters write: torch's (explicit pads,
// output_padding, stride 2, a bias), grouped and dilated, 1-D, and the
// auto_pad SAME_UPPER / SAME_LOWER and output_shape forms whose pads the
// rule resolves from X's static dims. dX, dW and dB against central
// differences.
TEST(GradientRuleTest, ConvTransposeInEveryPaddingForm) {
  struct Form {
    const char* name;
    std::vector<int64_t> x_dims, w_dims;
    std::vector<Attribute> attributes;
    bool bias;
  };
  const std::vector<Form> forms = {
      {"torch: pads, output_padding, stride 2",
       {2, 3, 4, 5},
       {3, 2, 3, 3},
       {Attribute::Ints("strides", {2, 2}), Attribute::Ints("pads", {1, 1, 1, 1}),
        Attribute::Ints("output_padding", {1, 1})},
       true},
      {"grouped, dilated, uneven pads",
       {2, 4, 5, 4},
       {4, 3, 2, 3},
       {Attribute::Int("group", 2), Attribute::Ints("dilations", {2, 1}),
        Attribute::Ints("strides", {1, 2}), Attribute::Ints("pads", {1, 0, 0, 2})},
       true},
      {"1-D", {2, 3, 7}, {3, 2, 4}, {Attribute::Ints("strides", {3})}, false},
      {"SAME_UPPER",
       {1, 2, 3, 4},
       {2, 3, 3, 2},
       {Attribute::String("auto_pad", "SAME_UPPER"), Attribute::Ints("strides", {2, 2})},
       true},
      {"SAME_LOWER",
       {1, 2, 3, 3},
       {2, 2, 2, 3},
       {Attribute::String("auto_pad", "SAME_LOWER"), Attribute::Ints("strides", {2, 1})},
       false},
      {"output_shape",
       {1, 2, 3, 3},
       {2, 2, 3, 3},
       {Attribute::Ints("strides", {2, 2}), Attribute::Ints("output_shape", {6, 7})},
       true},
  };
  for (const Form& form : forms) {
    SCOPED_TRACE(form.name);
    GradCheck check;
    std::vector<Value*> inputs = {check.Parameter("x", form.x_dims),
                                  check.Parameter("w", form.w_dims)};
    const int64_t group = form.attributes.front().name == "group" ? 2 : 1;
    if (form.bias) inputs.push_back(check.Parameter("b", {form.w_dims[1] * group}));
    check.Check(check.Op("ConvTranspose", inputs, form.attributes), /*rtol=*/5e-3,
                /*atol=*/5e-4);
  }
}

// castor's ConvTranspose (the form mixed_bfloat16 gives the op at any
// opset) on bfloat16 activations: its backward Conv (castor's form too) and
// ConvGrad compute in bfloat16, and the gradients of the float32
// parameters behind the Casts match central differences to bfloat16
// tolerance.
TEST(GradientRuleTest, CastorConvTransposeTrainsInBFloat16) {
  GradCheck check(17);
  check.model().opset_imports.push_back({kCastorDomain, 1});
  const int64_t bf16 = DTypeToOnnx(DType::kBFloat16);
  Value* x = check.Parameter("x", {1, 2, 3, 3});
  Value* w = check.Parameter("w", {2, 2, 3, 3});
  Value* b = check.Parameter("b", {2});
  std::vector<Value*> narrowed;
  for (Value* v : {x, w, b}) narrowed.push_back(check.Op("Cast", {v}, {Attribute::Int("to", bf16)}));
  Node* node = ValueOrDie(check.graph().AddNode(
      "ConvTranspose", narrowed, {"y16"}, "deconv", kCastorDomain));
  node->SetAttribute(Attribute::Ints("strides", {2, 2}));
  node->SetAttribute(Attribute::Ints("pads", {1, 1, 1, 1}));
  node->SetAttribute(Attribute::Ints("output_padding", {1, 1}));
  check.Check(check.Op("Cast", {node->output(0)}, {Attribute::Int("to", 1)}), /*rtol=*/6e-2,
              /*atol=*/6e-2, /*step=*/5e-2);
  int bfloat16_backward = 0;
  for (const Node* n : check.model().graph->nodes()) {
    if (n->name().rfind("deconv/grad/", 0) != 0) continue;
    if (n->op_type() == "Conv") {
      EXPECT_EQ(n->domain(), kCastorDomain);
    }
    for (const Value* out : n->outputs()) {
      if (!IsFloatingPoint(out->dtype())) continue;  // ReduceSum's axes
      EXPECT_EQ(out->dtype(), DType::kBFloat16) << n->name();
      ++bfloat16_backward;
    }
  }
  EXPECT_EQ(bfloat16_backward, 5);  // Conv's dX, ConvGrad's three, ReduceSum's dB
}

// ConvTranspose's gradient needs its pads: with auto_pad SAME_* and X's
// spatial dims unknown, the rule says so instead of guessing.
TEST(GradientRuleTest, ConvTransposeWithSamePadsNeedsStaticDims) {
  GradCheck check;
  Value* x = ValueOrDie(check.graph().AddInput(
      "x", DType::kFloat32, Shape({Dim(1), Dim(2), Dim::Unknown(), Dim(3)})));
  Value* w = check.Parameter("w", {2, 2, 3, 3});
  Value* y = check.Op("ConvTranspose", {x, w},
                      {Attribute::String("auto_pad", "SAME_UPPER"),
                       Attribute::Ints("strides", {2, 2})});
  Value* loss = check.Op("ReduceSum", {y}, {Attribute::Int("keepdims", 0)});
  ASSERT_TRUE(InferTypes(check.model()).ok());
  absl::StatusOr<AutodiffResult> result =
      BuildGradients(check.model(), AutodiffRequest{loss->name(), {"w"}, ""});
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(),
              HasSubstr("its pads depend on X's spatial dims, which are not static here"));
}

// The pool forms torchvision and timm export: ceil_mode windows running
// into the end padding (GoogLeNet, SqueezeNet, timm's avg_down
// AvgPool2d(ceil_mode=True, count_include_pad=False)), padding counted or
// not, and dilated MaxPool. Each at opset 13 and 17 (AveragePool changed at
// opset 19 only; dilations exist on MaxPool from opset 10).
TEST(GradientRuleTest, PoolsAsExportersWriteThem) {
  struct PoolForm {
    const char* op;
    std::vector<Attribute> attributes;
  };
  const std::vector<PoolForm> forms = {
      {"AveragePool",
       {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("strides", {2, 2}),
        Attribute::Ints("pads", {1, 1, 1, 1}), Attribute::Int("ceil_mode", 1),
        Attribute::Int("count_include_pad", 0)}},
      {"AveragePool",
       {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("strides", {2, 2}),
        Attribute::Ints("pads", {1, 1, 1, 1}), Attribute::Int("ceil_mode", 1),
        Attribute::Int("count_include_pad", 1)}},
      {"AveragePool",
       {Attribute::Ints("kernel_shape", {2, 2}), Attribute::Ints("strides", {2, 2}),
        Attribute::Int("ceil_mode", 1), Attribute::Int("count_include_pad", 0)}},
      {"MaxPool",
       {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("strides", {2, 2}),
        Attribute::Ints("pads", {1, 1, 1, 1}), Attribute::Int("ceil_mode", 1)}},
      {"MaxPool",
       {Attribute::Ints("kernel_shape", {3, 3}), Attribute::Ints("strides", {1, 1}),
        Attribute::Ints("pads", {1, 1, 1, 1}), Attribute::Ints("dilations", {2, 2})}},
  };
  for (int64_t opset : {13, 17}) {
    for (size_t i = 0; i < forms.size(); ++i) {
      SCOPED_TRACE(absl::StrCat(forms[i].op, " form ", i, " opset ", opset));
      GradCheck check(opset);
      // Distinct values 0.01 apart (a permutation): no two within the
      // finite-difference step of each other, so no max-pool tie.
      Tensor values(DType::kFloat32, {1, 2, 7, 9});
      for (int64_t k = 0; k < values.num_elements(); ++k) {
        values.data<float>()[k] = 0.01f * static_cast<float>((k * 37) % 126 - 63) + 0.005f;
      }
      Value* x = check.Parameter("x", std::move(values));
      check.Check(check.Op(forms[i].op, {x}, forms[i].attributes));
    }
  }
}

TEST(GradientRuleTest, NormalizationsInTrainingForm) {
  // BatchNormalization's training form in each opset: training_mode=1 from
  // opset 14; below it no training_mode, training asked for by the
  // optional outputs (three, as castor's training graph writes it, or all
  // five, as torch exports it).
  struct BatchNormForm {
    int64_t opset;
    int num_outputs;
  };
  for (const BatchNormForm form : {BatchNormForm{17, 3}, BatchNormForm{14, 3},
                                   BatchNormForm{13, 3}, BatchNormForm{9, 5}}) {
    SCOPED_TRACE(absl::StrCat("BatchNormalization opset ", form.opset));
    GradCheck check(form.opset);
    Value* x = check.Parameter("x", {4, 3, 2, 2});
    Value* scale = check.Parameter("scale", {3}, 0.5f, 1.5f);
    Value* bias = check.Parameter("bias", {3});
    Value* mean = check.Constant("mean", Tensor(DType::kFloat32, {3}));
    Tensor ones(DType::kFloat32, {3});
    for (int i = 0; i < 3; ++i) ones.data<float>()[i] = 1.0f;
    Value* var = check.Constant("var", std::move(ones));
    std::vector<Attribute> attributes;
    if (form.opset >= 14) attributes.push_back(Attribute::Int("training_mode", 1));
    check.Check(check.Op("BatchNormalization", {x, scale, bias, mean, var}, attributes,
                         form.num_outputs),
                /*rtol=*/5e-3, /*atol=*/5e-4);
  }
  {  // castor's BatchNormalizationTraining, the form the training graph runs
    GradCheck check;
    Value* x = check.Parameter("x", {4, 3, 2, 2});
    Value* scale = check.Parameter("scale", {3}, 0.5f, 1.5f);
    Value* bias = check.Parameter("bias", {3});
    Value* mean = check.Constant("mean", Tensor(DType::kFloat32, {3}));
    Tensor ones(DType::kFloat32, {3});
    for (int i = 0; i < 3; ++i) ones.data<float>()[i] = 1.0f;
    Value* var = check.Constant("var", std::move(ones));
    Node* training = ValueOrDie(check.graph().AddNode(
        "BatchNormalizationTraining", {x, scale, bias, mean, var}, {"y", "new_mean", "new_var"},
        "bn_training", kCastorDomain));
    check.Check(training->output(0), /*rtol=*/5e-3, /*atol=*/5e-4);
  }
  {
    GradCheck check;
    Value* x = check.Parameter("x", {2, 3, 4});
    Value* scale = check.Parameter("scale", {4}, 0.5f, 1.5f);
    Value* bias = check.Parameter("bias", {4});
    check.Check(check.Op("LayerNormalization", {x, scale, bias}), /*rtol=*/5e-3, /*atol=*/5e-4);
  }
  // InstanceNormalization has one form from opset 6 (the check's loss needs 8).
  for (int64_t opset : {8, 17}) {
    SCOPED_TRACE(absl::StrCat("InstanceNormalization opset ", opset));
    GradCheck check(opset);
    Value* x = check.Parameter("x", {2, 3, 5});
    Value* scale = check.Parameter("scale", {3}, 0.5f, 1.5f);
    Value* bias = check.Parameter("bias", {3});
    check.Check(check.Op("InstanceNormalization", {x, scale, bias},
                         {Attribute::Float("epsilon", 1e-3f)}),
                /*rtol=*/5e-3, /*atol=*/5e-4);
  }
  {  // nn.GroupNorm(2, 4) as torch.onnx.export writes it
    GradCheck check;
    Value* x = check.Parameter("x", {2, 4, 3, 1});
    Value* gamma = check.Parameter("gamma", {4, 1, 1}, 0.5f, 1.5f);
    Value* beta = check.Parameter("beta", {4, 1, 1});
    Value* grouped = check.Op("Reshape", {x, check.Constant("grouped", Tensor::Int64s({2, 2, -1}))});
    Tensor ones(DType::kFloat32, {2});
    ones.data<float>()[0] = ones.data<float>()[1] = 1.0f;
    Value* normalized = check.Op(
        "InstanceNormalization",
        {grouped, check.Constant("ones", std::move(ones)),
         check.Constant("zeros", Tensor(DType::kFloat32, {2}))});
    Value* back = check.Op("Reshape", {normalized, check.Op("Shape", {x})});
    check.Check(check.Op("Add", {check.Op("Mul", {back, gamma}), beta}), /*rtol=*/5e-3,
                /*atol=*/5e-4);
  }
}

TEST(GradientRuleTest, SoftmaxCrossEntropyLossAndGather) {
  {
    GradCheck check;
    Value* scores = check.Parameter("scores", {4, 5});
    Value* labels = check.Constant("labels", Tensor::Int64s({0, 3, 4, 1}));
    check.Check(check.Op("SoftmaxCrossEntropyLoss", {scores, labels}));
  }
  {
    GradCheck check;
    Value* table = check.Parameter("table", {5, 3});
    Value* indices = check.Constant("indices", Tensor::Int64s({4, 0, 4, 2}));
    check.Check(check.Op("Gather", {table, indices}));
  }
}

// Int64 indices of `dims` (a constant of the check's model).
Value* Indices(GradCheck& check, const std::string& name, std::vector<int64_t> dims,
               const std::vector<int64_t>& values) {
  return check.Constant(name, Tensor::FromVector(DType::kInt64, std::move(dims), values));
}

TEST(GradientRuleTest, GatherNDAndGatherElementsScatterAddRepeatedIndices) {
  {  // k = 1 rows, one repeated, one negative
    GradCheck check(13);
    Value* x = check.Parameter("x", {4, 3});
    check.Check(check.Op("GatherND", {x, Indices(check, "i", {3, 1}, {2, -1, 2})}));
  }
  {  // k = 2 elements with batch_dims 1
    GradCheck check(13);
    Value* x = check.Parameter("x", {2, 3, 4});
    check.Check(check.Op("GatherND", {x, Indices(check, "i", {2, 3, 2}, {0, 1, 2, 3, 0, 1,
                                                                         1, 1, -1, 0, 1, 1})},
                         {Attribute::Int("batch_dims", 1)}));
  }
  for (int64_t axis : {0, 1, -1}) {
    SCOPED_TRACE(absl::StrCat("GatherElements axis ", axis));
    GradCheck check(13);
    Value* x = check.Parameter("x", {3, 4});
    check.Check(check.Op("GatherElements", {x, Indices(check, "i", {2, 3}, {2, 0, 1, 0, -1, 2})},
                         {Attribute::Int("axis", axis)}));
  }
}

TEST(GradientRuleTest, ScatterNDAndScatterElementsRouteDataAndUpdates) {
  {  // reduction none: written rows get no data gradient
    GradCheck check(13);
    Value* data = check.Parameter("data", {4, 3});
    Value* updates = check.Parameter("updates", {2, 3});
    check.Check(check.Op("ScatterND", {data, Indices(check, "i", {2, 1}, {3, 1}), updates}));
  }
  {  // reduction add, a repeated element tuple
    GradCheck check(16);
    Value* data = check.Parameter("data", {2, 3});
    Value* updates = check.Parameter("updates", {3});
    check.Check(check.Op("ScatterND",
                         {data, Indices(check, "i", {3, 2}, {0, 1, 1, -1, 0, 1}), updates},
                         {Attribute::String("reduction", "add")}));
  }
  for (const std::string reduction : {"none", "add"}) {
    SCOPED_TRACE("ScatterElements " + reduction);
    GradCheck check(16);
    Value* data = check.Parameter("data", {3, 4});
    Value* updates = check.Parameter("updates", {2, 3});
    const std::vector<int64_t> columns =
        reduction == "none" ? std::vector<int64_t>{3, 0, 1, 2, -1, 0}
                            : std::vector<int64_t>{3, 3, 1, 2, -1, 2};
    check.Check(check.Op("ScatterElements", {data, Indices(check, "i", {2, 3}, columns), updates},
                         {Attribute::Int("axis", 1), Attribute::String("reduction", reduction)}));
  }
}

TEST(GradientRuleTest, TriluMasksAndCumSumScansBack) {
  for (int64_t upper : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("Trilu upper ", upper));
    GradCheck check(14);
    Value* x = check.Parameter("x", {2, 3, 4});
    Value* k = check.Constant("k", Tensor::FromVector(DType::kInt64, {}, std::vector<int64_t>{1}));
    check.Check(check.Op("Trilu", {x, k}, {Attribute::Int("upper", upper)}));
    GradCheck no_k(14);
    Value* y = no_k.Parameter("y", {4, 3});
    no_k.Check(no_k.Op("Trilu", {y}, {Attribute::Int("upper", upper)}));
  }
  for (int64_t exclusive : {0, 1}) {
    for (int64_t reverse : {0, 1}) {
      SCOPED_TRACE(absl::StrCat("CumSum exclusive ", exclusive, " reverse ", reverse));
      GradCheck check(14);
      Value* x = check.Parameter("x", {3, 4});
      Value* axis = check.Constant("axis", Tensor::Int64s({-1}));
      check.Check(check.Op("CumSum", {x, axis},
                           {Attribute::Int("exclusive", exclusive),
                            Attribute::Int("reverse", reverse)}));
    }
  }
  GradCheck axis0(11);
  Value* x = axis0.Parameter("x", {3, 2});
  axis0.Check(axis0.Op("CumSum", {x, axis0.Constant("axis", Tensor::Int64s({0}))}));
}

TEST(GradientRuleTest, ResizeNearestAndLinearInEachOpsetForm) {
  const Tensor scales = Tensor::FromVector(DType::kFloat32, {4}, std::vector<float>{1, 1, 2, 1.5f});
  const Tensor sizes = Tensor::Int64s({1, 2, 2, 5});
  for (const char* mode : {"nearest", "linear"}) {
    for (const char* transform : {"half_pixel", "align_corners", "asymmetric"}) {
      SCOPED_TRACE(absl::StrCat(mode, " ", transform));
      std::vector<Attribute> attributes = {
          Attribute::String("mode", mode),
          Attribute::String("coordinate_transformation_mode", transform)};
      GradCheck with_scales(13);
      Value* x = with_scales.Parameter("x", {1, 2, 3, 4});
      with_scales.Check(with_scales.Op(
          "Resize", {x, nullptr, with_scales.Constant("scales", scales)}, attributes));
      GradCheck with_sizes(17);  // downsampling rows, upsampling columns
      Value* y = with_sizes.Parameter("y", {1, 2, 3, 4});
      with_sizes.Check(with_sizes.Op(
          "Resize", {y, nullptr, nullptr, with_sizes.Constant("sizes", sizes)}, attributes));
    }
  }
  GradCheck opset10(10);  // (X, scales), Resize-10's nearest rule
  Value* x = opset10.Parameter("x", {1, 1, 3, 4});
  opset10.Check(opset10.Op("Resize", {x, opset10.Constant("scales", scales)}));
}

TEST(GradientRuleTest, DepthToSpaceAndSpaceToDepthInvertEachOther) {
  for (const char* mode : {"DCR", "CRD"}) {
    SCOPED_TRACE(mode);
    GradCheck check(13);
    Value* x = check.Parameter("x", {2, 8, 2, 3});
    check.Check(check.Op("DepthToSpace", {x},
                         {Attribute::Int("blocksize", 2), Attribute::String("mode", mode)}));
  }
  GradCheck check(13);
  Value* x = check.Parameter("x", {1, 2, 4, 6});
  check.Check(check.Op("SpaceToDepth", {x}, {Attribute::Int("blocksize", 2)}));
}

// ---- data movement: Concat, Split, Slice, Expand, Tile, Pad ------------------

// Output `k` of the node that produced `value`.
Value* OutputOf(Value* value, int k) { return value->producer()->output(k); }

// `value` reshaped to `dims` (the check's loss needs a static shape, which
// inference cannot give an output whose shape depends on run-time values).
Value* StaticShape(GradCheck& check, Value* value, const std::vector<int64_t>& dims) {
  static int count = 0;
  Value* shape = check.Constant(absl::StrCat("static_shape_", count++), Tensor::Int64s(dims));
  return check.Op("Reshape", {value, shape});
}

TEST(GradientRuleTest, ConcatSplitsTheGradientBySizes) {
  // Split's sizes: an input from opset 13, an attribute before.
  for (int64_t opset : {17, 11}) {
    SCOPED_TRACE(absl::StrCat("opset ", opset));
    GradCheck check(opset);
    Value* a = check.Parameter("a", {2, 3});
    Value* b = check.Parameter("b", {2, 1});
    Value* c = check.Parameter("c", {2, 2});
    check.Check(check.Op("Concat", {a, b, c}, {Attribute::Int("axis", -1)}));
  }
  GradCheck single;
  Value* x = single.Parameter("x", {2, 3});
  single.Check(single.Op("Concat", {x}, {Attribute::Int("axis", 0)}));
}

TEST(GradientRuleTest, SplitWithUnusedOutputsGivesThemZeroGradient) {
  {  // opset 13: sizes as an input; outputs 0 and 2 used, 1 not
    GradCheck check(13);
    Value* x = check.Parameter("x", {2, 6});
    Value* sizes = check.Constant("sizes", Tensor::Int64s({1, 3, 2}));
    Value* split = check.Op("Split", {x, sizes}, {Attribute::Int("axis", 1)}, 3);
    check.Check(check.Op("Concat", {OutputOf(split, 2), OutputOf(split, 0)},
                         {Attribute::Int("axis", 1)}));
  }
  {  // opset 18: num_outputs, negative axis; only the middle output used
    GradCheck check(18);
    Value* x = check.Parameter("x", {2, 3, 6});
    Value* split = check.Op("Split", {x},
                            {Attribute::Int("axis", -1), Attribute::Int("num_outputs", 3)}, 3);
    check.Check(OutputOf(split, 1));
  }
  {  // opset 11: sizes as an attribute
    GradCheck check(11);
    Value* x = check.Parameter("x", {5, 2});
    Value* split = check.Op("Split", {x}, {Attribute::Int("axis", 0), Attribute::Ints("split", {2, 3})}, 2);
    check.Check(OutputOf(split, 1));
  }
}

TEST(GradientRuleTest, SliceNegativeClampedSteppedAndRunTimeBounds) {
  constexpr int64_t kBig = std::numeric_limits<int64_t>::max();
  struct Case {
    const char* name;
    std::vector<int64_t> starts, ends, axes, steps;
    std::vector<int64_t> dims;  // Y's
  };
  for (const Case& c : std::vector<Case>{
           {"negative axis, clamped end, negative step", {1, -1}, {kBig, -100}, {0, -2}, {1, -2}, {3, 3, 5}},
           {"stepped", {0}, {5}, {2}, {2}, {4, 6, 3}},
           {"step 1 on two axes", {1, 2}, {3, -1}, {1, 2}, {1, 1}, {4, 2, 2}},
           {"whole axis", {0}, {kBig}, {1}, {1}, {4, 6, 5}}}) {
    for (bool run_time : {false, true}) {
      SCOPED_TRACE(absl::StrCat(c.name, run_time ? ", bounds known at run time" : ""));
      GradCheck check(13);
      Value* x = check.Parameter("x", {4, 6, 5});
      Value* starts = check.Constant("starts", Tensor::Int64s(c.starts));
      Value* ends = check.Constant("ends", Tensor::Int64s(c.ends));
      if (run_time) {  // computed: unknown to the rule, so indices via Range and Slice
        Value* zeros = check.Constant(
            "zeros", Tensor::Int64s(std::vector<int64_t>(c.starts.size(), 0)));
        starts = check.Op("Add", {starts, zeros});
        ends = check.Op("Add", {ends, zeros});
      }
      Value* axes = check.Constant("axes", Tensor::Int64s(c.axes));
      Value* steps = check.Constant("steps", Tensor::Int64s(c.steps));
      Value* y = check.Op("Slice", {x, starts, ends, axes, steps});
      check.Check(run_time ? StaticShape(check, y, c.dims) : y);
    }
  }
  {  // axes as exporters write them: Concat of Unsqueeze(Constant) pieces,
     // known to the rule before the graph runs (swin_t's attention slices)
    GradCheck check(13);
    Value* x = check.Parameter("x", {4, 6, 5});
    Value* starts = check.Constant("starts", Tensor::Int64s({1, 2}));
    Value* ends = check.Constant("ends", Tensor::Int64s({3, -1}));
    Value* axis_1 = check.Op("Unsqueeze", {check.Constant("a1", Tensor::FromVector<int64_t>(DType::kInt64, {}, {1})),
                                           check.Constant("u1", Tensor::Int64s({0}))});
    Value* axis_2 = check.Op("Unsqueeze", {check.Constant("a2", Tensor::FromVector<int64_t>(DType::kInt64, {}, {2})),
                                           check.Constant("u2", Tensor::Int64s({0}))});
    Value* axes = check.Op("Concat", {axis_1, axis_2}, {Attribute::Int("axis", 0)});
    check.Check(check.Op("Slice", {x, starts, ends, axes}));
  }
  {  // starts/ends only (axes and steps omitted)
    GradCheck check(13);
    Value* x = check.Parameter("x", {4, 3});
    Value* starts = check.Constant("starts", Tensor::Int64s({-3}));
    Value* ends = check.Constant("ends", Tensor::Int64s({-1}));
    check.Check(check.Op("Slice", {x, starts, ends}));
  }
  {  // opset 9: bounds as attributes
    GradCheck check(9);
    Value* x = check.Parameter("x", {4, 3});
    check.Check(check.Op("Slice", {x}, {Attribute::Ints("starts", {1, 0}),
                                        Attribute::Ints("ends", {-1, 2}),
                                        Attribute::Ints("axes", {0, 1})}));
  }
}

TEST(GradientRuleTest, ExpandAndTile) {
  {
    GradCheck check;
    Value* x = check.Parameter("x", {3, 1});
    Value* shape = check.Constant("shape", Tensor::Int64s({2, 3, 4}));
    check.Check(check.Op("Expand", {x, shape}));
  }
  for (int64_t opset : {13, 11}) {
    for (bool run_time : {false, true}) {
      SCOPED_TRACE(absl::StrCat("opset ", opset, run_time ? ", repeats known at run time" : ""));
      GradCheck check(opset);
      Value* x = check.Parameter("x", {2, 3, 1});
      Value* repeats = check.Constant("repeats", Tensor::Int64s({2, 1, 3}));
      if (run_time) repeats = check.Op("Identity", {repeats});
      Value* y = check.Op("Tile", {x, repeats});
      check.Check(run_time ? StaticShape(check, y, {4, 3, 3}) : y);
    }
  }
}

TEST(GradientRuleTest, PadConstantModeWithNegativePadsAxesAndAttributes) {
  for (bool run_time : {false, true}) {
    SCOPED_TRACE(run_time ? "pads known at run time" : "constant pads");
    GradCheck check(13);
    Value* x = check.Parameter("x", {2, 3});
    Value* pads = check.Constant("pads", Tensor::Int64s({1, 0, 2, -1}));
    if (run_time) pads = check.Op("Identity", {pads});
    Value* y = check.Op("Pad", {x, pads});
    check.Check(run_time ? StaticShape(check, y, {5, 2}) : y);
  }
  {  // opset 18: pads for the listed axes only
    GradCheck check(18);
    Value* x = check.Parameter("x", {2, 3, 2});
    Value* pads = check.Constant("pads", Tensor::Int64s({2, 1}));
    Value* axes = check.Constant("axes", Tensor::Int64s({-2}));
    check.Check(check.Op("Pad", {x, pads, nullptr, axes}));
  }
  {  // opset 10: pads as an attribute
    GradCheck check(10);
    Value* x = check.Parameter("x", {2, 3});
    check.Check(check.Op("Pad", {x}, {Attribute::Ints("pads", {0, 1, 1, 2})}));
  }
  {  // reflect mode: a clear error
    GradCheck check(13);
    Value* x = check.Parameter("x", {2, 3});
    Value* pads = check.Constant("pads", Tensor::Int64s({0, 1, 0, 1}));
    Value* y = check.Op("Pad", {x, pads}, {Attribute::String("mode", "reflect")});
    Value* loss = check.Op("ReduceSum", {y}, {Attribute::Int("keepdims", 0)});
    ASSERT_TRUE(InferTypes(check.model()).ok());
    absl::StatusOr<AutodiffResult> result =
        BuildGradients(check.model(), AutodiffRequest{loss->name(), {"x"}, ""});
    ASSERT_FALSE(result.ok());
    EXPECT_THAT(result.status().message(), HasSubstr("node 'Pad_0' (Pad): Pad in mode 'reflect'"));
  }
}

// ---- elementwise: Reciprocal, Abs, LeakyRelu, Gelu, Clip, Where, Max/Min, Dropout ----

Tensor Floats(std::vector<int64_t> dims, const std::vector<float>& values) {
  return Tensor::FromVector<float>(DType::kFloat32, std::move(dims), values);
}

Tensor Bools(std::vector<int64_t> dims, const std::vector<uint8_t>& values) {
  return Tensor::FromVector<uint8_t>(DType::kBool, std::move(dims), values);
}

TEST(GradientRuleTest, ReciprocalAbsLeakyRelu) {
  {
    GradCheck check;
    Value* x = check.Parameter("x", {2, 5}, 0.5f, 2.0f);
    Value* negative = check.Op("Neg", {x});
    check.Check(check.Op("Add", {check.Op("Reciprocal", {x}), check.Op("Reciprocal", {negative})}));
  }
  {
    GradCheck check;
    Value* x = check.Parameter("x", {3, 4});  // no value within 0.05 of the kink
    check.Check(check.Op("Abs", {x}));
  }
  {
    GradCheck check;
    Value* x = check.Parameter("x", {3, 4});
    check.Check(check.Op("LeakyRelu", {x}, {Attribute::Float("alpha", 0.2f)}));
    GradCheck default_alpha;
    Value* y = default_alpha.Parameter("x", {3, 4});
    default_alpha.Check(default_alpha.Op("LeakyRelu", {y}));
  }
}

TEST(GradientRuleTest, AbsLeakyReluAndClipAtTheirKinksFollowPyTorch) {
  // d|x|/dx at 0 is 0; LeakyRelu's slope at 0 is alpha; Clip passes no
  // gradient at a bound (hardtanh/relu6). With L = sum(Y) the gradient is
  // the slope itself.
  for (const char* op : {"Abs", "LeakyRelu", "Clip"}) {
    SCOPED_TRACE(op);
    GradCheck check(13);
    Value* x = check.Parameter("x", Floats({3}, {0.0f, 0.5f, -0.5f}));
    Value* y = nullptr;
    if (op == std::string("LeakyRelu")) {
      y = check.Op(op, {x}, {Attribute::Float("alpha", 0.25f)});
    } else if (op == std::string("Clip")) {
      y = check.Op(op, {x, check.Constant("min", Tensor::Scalar(-0.5f)),
                        check.Constant("max", Tensor::Scalar(1.0f))});
    } else {
      y = check.Op(op, {x});
    }
    Value* loss = check.Op("ReduceSum", {y}, {Attribute::Int("keepdims", 0)});
    check.graph().AddOutput(loss);
    ASSERT_TRUE(InferTypes(check.model()).ok());
    AutodiffResult result =
        ValueOrDie(BuildGradients(check.model(), AutodiffRequest{loss->name(), {"x"}, ""}));
    check.graph().AddOutput(check.graph().FindValue(result.gradients[0].second));
    auto executor = ValueOrDie(Executor::Create(check.model(), Cpu()));
    const Tensor grad = ValueOrDie(executor->Run({{"x", Floats({3}, {0.0f, 0.5f, -0.5f})}}))[1];
    const std::string name = op;
    const float at_zero = name == "Abs" ? 0.0f : name == "Clip" ? 1.0f : 0.25f;
    const float below = name == "Abs" ? -1.0f : name == "Clip" ? 0.0f : 0.25f;
    EXPECT_EQ(grad.data<float>()[0], at_zero);
    EXPECT_EQ(grad.data<float>()[1], 1.0f);
    EXPECT_EQ(grad.data<float>()[2], below);
  }
}

TEST(GradientRuleTest, HardSigmoidAndHardSwish) {
  // Values on every piece, none within 0.05 of a kink (+-3, or where
  // alpha x + beta is 0 or 1).
  const Tensor x_values =
      Floats({2, 6}, {-5.0f, -3.5f, -2.7f, -1.0f, -0.3f, 0.4f, 1.2f, 2.2f, 2.9f, 3.3f, 4.5f, 7.0f});
  struct Case {
    const char* op;
    std::vector<Attribute> attrs;
    int64_t opset;
  };
  for (const Case& c : std::vector<Case>{
           {"HardSigmoid", {}, 8},  // (the loss's gradient needs Expand-8)
           {"HardSigmoid",
            {Attribute::Float("alpha", 1.0f / 6), Attribute::Float("beta", 0.5f)},
            17},
           {"HardSigmoid", {Attribute::Float("alpha", -0.4f), Attribute::Float("beta", 0.1f)}, 22},
           {"HardSwish", {}, 14},
           {"HardSwish", {}, 22}}) {
    SCOPED_TRACE(absl::StrCat(c.op, " opset ", c.opset));
    GradCheck check(c.opset);
    Value* x = check.Parameter("x", x_values);
    check.Check(check.Op(c.op, {x}, c.attrs));
  }
}

// At the kinks x = -3 and x = 3 the rules give what torch 1.13 gives:
// hardsigmoid_backward is 0 at both (open interval), hardswish_backward is
// dY (x / 3 + 1/2) at both (closed interval): -0.5 and 1.5.
TEST(GradientRuleTest, HardSigmoidAndHardSwishAtTheirKinksFollowPyTorch) {
  const std::vector<float> x_values = {-3.0f, 3.0f, -4.0f, 0.0f, 4.0f};
  for (const char* op : {"HardSigmoid", "HardSwish"}) {
    SCOPED_TRACE(op);
    GradCheck check(17);
    Value* x = check.Parameter("x", Floats({5}, x_values));
    std::vector<Attribute> attrs;
    if (op == std::string("HardSigmoid")) {
      attrs = {Attribute::Float("alpha", 1.0f / 6), Attribute::Float("beta", 0.5f)};
    }
    Value* loss =
        check.Op("ReduceSum", {check.Op(op, {x}, attrs)}, {Attribute::Int("keepdims", 0)});
    check.graph().AddOutput(loss);
    ASSERT_TRUE(InferTypes(check.model()).ok());
    AutodiffResult result =
        ValueOrDie(BuildGradients(check.model(), AutodiffRequest{loss->name(), {"x"}, ""}));
    check.graph().AddOutput(check.graph().FindValue(result.gradients[0].second));
    auto executor = ValueOrDie(Executor::Create(check.model(), Cpu()));
    const Tensor grad = ValueOrDie(executor->Run({{"x", Floats({5}, x_values)}}))[1];
    // torch.nn.functional.hardsigmoid / hardswish at [-3, 3, -4, 0, 4].
    const std::vector<float> expected = op == std::string("HardSigmoid")
                                            ? std::vector<float>{0, 0, 0, 1.0f / 6, 0}
                                            : std::vector<float>{-0.5f, 1.5f, 0, 0.5f, 1};
    for (int i = 0; i < 5; ++i) {
      EXPECT_FLOAT_EQ(grad.data<float>()[i], expected[i]) << "x = " << x_values[i];
    }
  }
}

// Mod on floats: dA = dY, dB = -dY floor(A / B) (fmod = 0) or -dY trunc(A / B)
// (fmod = 1), with broadcasting; values keep A / B away from integers.
TEST(GradientRuleTest, ModBothConventionsBroadcasting) {
  for (int fmod : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("fmod ", fmod));
    GradCheck check(13);
    Value* a = check.Parameter("a", Floats({2, 3}, {5.3f, -5.3f, 2.2f, -0.7f, 7.9f, -3.1f}));
    Value* b = check.Parameter("b", Floats({3}, {2.0f, -1.5f, 0.9f}));
    check.Check(check.Op("Mod", {a, b}, {Attribute::Int("fmod", fmod)}));
  }
}

// The trigonometric and hyperbolic functions, each inside its domain (at
// opset 9 rather than 7: the check's ReduceSum gradient needs Expand, 8+).
TEST(GradientRuleTest, TrigonometricAndHyperbolicFunctions) {
  struct Case {
    const char* op;
    int64_t opset;
    float lo, hi;
  };
  for (const Case& c : std::vector<Case>{{"Sin", 9, -4, 4},
                                         {"Cos", 22, -4, 4},
                                         {"Tan", 9, -1.2f, 1.2f},
                                         {"Asin", 9, -0.9f, 0.9f},
                                         {"Acos", 22, -0.9f, 0.9f},
                                         {"Atan", 9, -3, 3},
                                         {"Sinh", 9, -2, 2},
                                         {"Cosh", 9, -2, 2},
                                         {"Asinh", 9, -3, 3},
                                         {"Acosh", 9, 1.1f, 4},
                                         {"Atanh", 22, -0.9f, 0.9f}}) {
    SCOPED_TRACE(absl::StrCat(c.op, " opset ", c.opset));
    GradCheck check(c.opset);
    Value* x = check.Parameter("x", {3, 5}, c.lo, c.hi);
    check.Check(check.Op(c.op, {x}));
  }
}

TEST(GradientRuleTest, ExponentialAndSoftActivations) {
  struct Case {
    const char* op;
    std::vector<Attribute> attrs;
    int64_t opset;
    float lo, hi;
  };
  for (const Case& c : std::vector<Case>{
           {"Elu", {}, 13, -3, 3},
           {"Elu", {Attribute::Float("alpha", 0.3f)}, 22, -3, 3},
           {"Selu", {}, 13, -3, 3},
           {"Selu", {Attribute::Float("alpha", 2.0f), Attribute::Float("gamma", 0.7f)}, 22, -3, 3},
           {"Celu", {}, 13, -3, 3},
           {"Celu", {Attribute::Float("alpha", 2.0f)}, 13, -3, 3},
           {"Softplus", {}, 13, -4, 4},
           {"Softplus", {}, 22, -4, 4},
           {"Softsign", {}, 13, -3, 3},
           {"Softsign", {}, 22, -3, 3},
           {"Mish", {}, 18, -4, 4},
           {"Mish", {}, 22, -4, 4}}) {
    SCOPED_TRACE(absl::StrCat(c.op, " opset ", c.opset));
    GradCheck check(c.opset);
    Value* x = check.Parameter("x", {3, 5}, c.lo, c.hi);
    check.Check(check.Op(c.op, {x}, c.attrs));
  }
  for (float alpha : {1.0f, -0.5f}) {  // no value within 0.05 of alpha
    SCOPED_TRACE(absl::StrCat("ThresholdedRelu alpha ", alpha));
    GradCheck check(alpha == 1.0f ? 10 : 22);
    Value* x = check.Parameter(
        "x", Floats({2, 4}, {-1.3f, -0.6f, -0.3f, 0.4f, 0.8f, 1.2f, 1.9f, 2.5f}));
    std::vector<Attribute> attrs;
    if (alpha != 1.0f) attrs.push_back(Attribute::Float("alpha", alpha));
    check.Check(check.Op("ThresholdedRelu", {x}, attrs));
  }
}

// PRelu: dX and a dslope summed back to the slope's shape (scalar, per
// channel, a full-shape slope).
TEST(GradientRuleTest, PReluSlopeReducesToItsShape) {
  for (const std::vector<int64_t>& slope_dims :
       std::vector<std::vector<int64_t>>{{}, {3, 1, 1}, {2}, {2, 3, 1, 2}}) {
    SCOPED_TRACE(::testing::PrintToString(slope_dims));
    GradCheck check(16);
    Value* x = check.Parameter("x", {2, 3, 1, 2});
    Value* slope = check.Parameter("slope", slope_dims, 0.1f, 0.9f);
    check.Check(check.Op("PRelu", {x, slope}));
  }
  {  // opset 9, slope a constant
    GradCheck check(9);
    Value* x = check.Parameter("x", {4, 3});
    check.Check(check.Op("PRelu", {x, check.Constant("slope", Floats({3}, {0.2f, -0.4f, 1.5f}))}));
  }
}

// At 0 the exponential units and PRelu take PyTorch's side (elu_backward
// and prelu backward use the negative piece at x = 0, so the slope is
// alpha, gamma alpha, 1 for Celu, and the PRelu slope); ThresholdedRelu
// passes nothing at x = alpha (threshold_backward).
TEST(GradientRuleTest, ExponentialUnitsPReluAndThresholdAtTheirKinksFollowPyTorch) {
  struct Case {
    const char* op;
    std::vector<Attribute> attrs;
    float at_kink;
    float kink;
  };
  const double gamma = 1.05070102214813232421875, alpha = 1.67326319217681884765625;
  for (const Case& c : std::vector<Case>{
           {"Elu", {Attribute::Float("alpha", 0.5f)}, 0.5f, 0.0f},
           {"Selu", {}, static_cast<float>(gamma * alpha), 0.0f},
           {"Celu", {Attribute::Float("alpha", 2.0f)}, 1.0f, 0.0f},
           {"ThresholdedRelu", {Attribute::Float("alpha", 0.5f)}, 0.0f, 0.5f},
           {"PRelu", {}, 0.25f, 0.0f}}) {
    SCOPED_TRACE(c.op);
    GradCheck check(13);
    Value* x = check.Parameter("x", Floats({1}, {c.kink}));
    std::vector<Value*> inputs = {x};
    if (c.op == std::string("PRelu")) {
      inputs.push_back(check.Constant("slope", Floats({1}, {0.25f})));
    }
    Value* loss =
        check.Op("ReduceSum", {check.Op(c.op, inputs, c.attrs)}, {Attribute::Int("keepdims", 0)});
    check.graph().AddOutput(loss);
    ASSERT_TRUE(InferTypes(check.model()).ok());
    AutodiffResult result =
        ValueOrDie(BuildGradients(check.model(), AutodiffRequest{loss->name(), {"x"}, ""}));
    check.graph().AddOutput(check.graph().FindValue(result.gradients[0].second));
    auto executor = ValueOrDie(Executor::Create(check.model(), Cpu()));
    const Tensor grad = ValueOrDie(executor->Run({{"x", Floats({1}, {c.kink})}}))[1];
    EXPECT_FLOAT_EQ(grad.data<float>()[0], c.at_kink);
  }
}

// Sign, Floor, Ceil, Round are piecewise constant: zero gradient, as
// PyTorch gives (also at the steps, and where dY is not finite).
TEST(GradientRuleTest, SignFloorCeilRoundHaveZeroGradient) {
  for (const char* op : {"Sign", "Floor", "Ceil", "Round"}) {
    SCOPED_TRACE(op);
    {
      GradCheck check(13);  // away from the steps: the finite differences are 0
      Value* x = check.Parameter("x", Floats({2, 3}, {-1.3f, -0.7f, 0.2f, 0.6f, 1.3f, 2.8f}));
      Value* y = check.Op(op, {x});
      check.Check(check.Op("Add", {y, check.Op("Mul", {x, x})}));
    }
    GradCheck check(13);
    const Tensor at_steps = Floats({3}, {0.0f, 1.0f, 0.5f});
    Value* x = check.Parameter("x", at_steps);
    Value* loss = check.Op("ReduceSum", {check.Op(op, {x})}, {Attribute::Int("keepdims", 0)});
    check.graph().AddOutput(loss);
    ASSERT_TRUE(InferTypes(check.model()).ok());
    AutodiffResult result =
        ValueOrDie(BuildGradients(check.model(), AutodiffRequest{loss->name(), {"x"}, ""}));
    check.graph().AddOutput(check.graph().FindValue(result.gradients[0].second));
    auto executor = ValueOrDie(Executor::Create(check.model(), Cpu()));
    const Tensor grad = ValueOrDie(executor->Run({{"x", at_steps}}))[1];
    ASSERT_EQ(grad.num_elements(), 3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(grad.data<float>()[i], 0.0f);
  }
}

TEST(GradientRuleTest, GeluExactAndTanh) {
  for (const char* approximate : {"none", "tanh"}) {
    SCOPED_TRACE(approximate);
    GradCheck check(20);
    Value* x = check.Parameter("x", {3, 5}, -3.0f, 3.0f);
    check.Check(check.Op("Gelu", {x}, {Attribute::String("approximate", approximate)}));
  }
}

TEST(GradientRuleTest, ClipAttributesInputsAndTrainableBounds) {
  const Tensor x_values = Floats({2, 4}, {-0.9f, -0.3f, 0.2f, 0.7f, 0.45f, -0.6f, 0.1f, 0.95f});
  {  // opset 10: bounds as attributes (ReLU6-style)
    GradCheck check(10);
    Value* x = check.Parameter("x", x_values);
    check.Check(check.Op("Clip", {x}, {Attribute::Float("min", -0.5f), Attribute::Float("max", 0.5f)}));
  }
  {  // opset 13: bounds as constant inputs, only max given
    GradCheck check(13);
    Value* x = check.Parameter("x", x_values);
    Value* max = check.Constant("max", Tensor::Scalar(0.5f));
    check.Check(check.Op("Clip", {x, nullptr, max}));
  }
  {  // opset 13: trainable bounds
    GradCheck check(13);
    Value* x = check.Parameter("x", x_values);
    Value* min = check.Parameter("min", Floats({}, {-0.5f}));
    Value* max = check.Parameter("max", Floats({}, {0.5f}));
    check.Check(check.Op("Clip", {x, min, max}));
  }
}

TEST(GradientRuleTest, WhereBroadcasting) {
  GradCheck check;
  Value* a = check.Parameter("a", {3, 1});
  Value* b = check.Parameter("b", {2, 3, 4});
  Value* condition = check.Constant("c", Bools({2, 1, 4}, {1, 0, 0, 1, 0, 1, 1, 0}));
  check.Check(check.Op("Where", {condition, a, b}));
}

TEST(GradientRuleTest, MaxMinVariadicBroadcastingAndTies) {
  for (const char* op : {"Max", "Min"}) {
    SCOPED_TRACE(op);
    {
      GradCheck check;
      Value* a = check.Parameter("a", {2, 3});
      Value* b = check.Parameter("b", {3});
      Value* c = check.Parameter("c", {2, 1});
      check.Check(check.Op(op, {a, b, c}));
    }
    {  // a tie with itself: each side takes half, so the total is dY
      GradCheck check;
      Value* x = check.Parameter("x", {2, 3});
      check.Check(check.Op(op, {x, x}));
    }
    {
      GradCheck check;
      Value* x = check.Parameter("x", {2, 3});
      check.Check(check.Op(op, {x}));
    }
  }
}

TEST(GradientRuleTest, DropoutTrainingMaskRatioAndInference) {
  // The kernels draw the same mask on every run (seeded by the node), so
  // the finite differences see one fixed mask.
  for (bool run_time : {false, true}) {
    SCOPED_TRACE(run_time ? "ratio and training_mode known at run time" : "constants");
    GradCheck check(13);
    Value* x = check.Parameter("x", {4, 5});
    Value* ratio = check.Constant("ratio", Tensor::Scalar(0.3f));
    Value* training = check.Constant("training", Bools({}, {1}));
    if (run_time) {
      ratio = check.Op("Identity", {ratio});
      training = check.Op("Identity", {training});
    }
    Value* y = check.Op("Dropout", {x, ratio, training}, {Attribute::Int("seed", 7)}, 2);
    check.Check(y);
  }
  {  // training_mode false: identity (the mask is unused)
    GradCheck check(13);
    Value* x = check.Parameter("x", {2, 3});
    Value* ratio = check.Constant("ratio", Tensor::Scalar(0.5f));
    Value* training = check.Constant("training", Bools({}, {0}));
    check.Check(check.Op("Dropout", {x, ratio, training}, {}, 2));
  }
  {  // ratio 0 in training: identity
    GradCheck check(13);
    Value* x = check.Parameter("x", {2, 3});
    Value* ratio = check.Constant("ratio", Tensor::Scalar(0.0f));
    Value* training = check.Constant("training", Bools({}, {1}));
    check.Check(check.Op("Dropout", {x, ratio, training}));
  }
  {  // before opset 12 the kernels never drop
    GradCheck check(10);
    Value* x = check.Parameter("x", {2, 3});
    check.Check(check.Op("Dropout", {x}, {Attribute::Float("ratio", 0.5f)}, 2));
  }
  {  // training without a mask output: a clear error
    GradCheck check(13);
    Value* x = check.Parameter("x", {2, 3});
    Value* ratio = check.Constant("ratio", Tensor::Scalar(0.5f));
    Value* training = check.Constant("training", Bools({}, {1}));
    Value* y = check.Op("Dropout", {x, ratio, training});
    Value* loss = check.Op("ReduceSum", {y}, {Attribute::Int("keepdims", 0)});
    ASSERT_TRUE(InferTypes(check.model()).ok());
    absl::StatusOr<AutodiffResult> result =
        BuildGradients(check.model(), AutodiffRequest{loss->name(), {"x"}, ""});
    ASSERT_FALSE(result.ok());
    EXPECT_THAT(result.status().message(), HasSubstr("without its mask output"));
  }
}

// castor's DropoutTraining, the form the training graph runs: the mask is a
// function of the RNG state input (a constant here), so the finite
// differences see the mask the gradient reads; the ratio as a constant, as a
// value known at run time, and omitted (0.5).
TEST(GradientRuleTest, CastorDropoutTrainingUsesItsMask) {
  for (int form = 0; form < 3; ++form) {
    SCOPED_TRACE(form == 0 ? "constant ratio" : form == 1 ? "run-time ratio" : "no ratio");
    GradCheck check(13);
    Value* x = check.Parameter("x", {4, 5});
    Value* ratio = nullptr;
    if (form < 2) ratio = check.Constant("ratio", Tensor::Scalar(0.3f));
    if (form == 1) ratio = check.Op("Identity", {ratio});
    Value* state = check.Constant(
        "state", Tensor::FromVector<int64_t>(DType::kInt64, {2}, {7, 3 + form}));
    Node* dropout = ValueOrDie(check.graph().AddNode("DropoutTraining", {x, ratio, state},
                                                     {"y", "mask"}, "dropout_training",
                                                     kCastorDomain));
    check.Check(dropout->output(0));
  }
}

// ---- reductions: ReduceMax/Min, ReduceL2, ReduceSumSquare, ReduceL1, ReduceLogSumExp ----

// Runs d sum(Y) / d x for Y = body(x) at the given x (no finite differences:
// for values on a kink, where the rule's convention decides).
std::vector<float> GradientOfSum(int64_t opset, const Tensor& x_value,
                                 const std::function<Value*(GradCheck&, Value*)>& body) {
  GradCheck check(opset);
  Value* x = check.Parameter("x", x_value);
  Value* loss = check.Op("ReduceSum", {body(check, x)}, {Attribute::Int("keepdims", 0)});
  check.graph().AddOutput(loss);
  EXPECT_TRUE(InferTypes(check.model()).ok());
  AutodiffResult result =
      ValueOrDie(BuildGradients(check.model(), AutodiffRequest{loss->name(), {"x"}, ""}));
  check.graph().AddOutput(check.graph().FindValue(result.gradients[0].second));
  auto executor = ValueOrDie(Executor::Create(check.model(), Cpu()));
  const Tensor grad = ValueOrDie(executor->Run({{"x", x_value}}))[1];
  return std::vector<float>(grad.data<float>(), grad.data<float>() + grad.num_elements());
}

TEST(GradientRuleTest, ReduceMaxMinAxesAttributeAndInputKeepdims) {
  for (const char* op : {"ReduceMax", "ReduceMin"}) {
    for (int keepdims : {0, 1}) {
      SCOPED_TRACE(absl::StrCat(op, " keepdims=", keepdims));
      {  // opset 13: axes an attribute
        GradCheck check(13);
        Value* x = check.Parameter("x", {2, 3, 4});
        check.Check(check.Op(op, {x}, {Attribute::Ints("axes", {-1, 0}),
                                       Attribute::Int("keepdims", keepdims)}));
      }
      {  // opset 18: axes an input, constant or known at run time
        for (bool run_time : {false, true}) {
          GradCheck check(18);
          Value* x = check.Parameter("x", {2, 3, 4});
          Value* axes = check.Constant("axes", Tensor::Int64s({-2}));
          if (run_time) axes = check.Op("Identity", {axes});
          Value* y = check.Op(op, {x, axes}, {Attribute::Int("keepdims", keepdims)});
          check.Check(run_time ? StaticShape(check, y, keepdims ? std::vector<int64_t>{2, 1, 4}
                                                                : std::vector<int64_t>{2, 4})
                               : y);
        }
      }
      {  // every axis, opset 11
        GradCheck check(11);
        Value* x = check.Parameter("x", {3, 2});
        check.Check(check.Op(op, {x}, {Attribute::Int("keepdims", keepdims)}));
      }
    }
  }
}

TEST(GradientRuleTest, GlobalMaxPool) {
  GradCheck check;
  Value* x = check.Parameter("x", {2, 3, 2, 3});
  check.Check(check.Op("GlobalMaxPool", {x}));
}

TEST(GradientRuleTest, ReduceMaxSplitsTiesEvenly) {
  const std::vector<float> grad = GradientOfSum(
      13, Floats({2, 3}, {1.0f, 3.0f, 3.0f, 2.0f, 0.5f, 1.0f}), [](GradCheck& check, Value* x) {
        return check.Op("ReduceMax", {x}, {Attribute::Ints("axes", {1}), Attribute::Int("keepdims", 0)});
      });
  EXPECT_THAT(grad, ::testing::ElementsAre(0.0f, 0.5f, 0.5f, 1.0f, 0.0f, 0.0f));
  const std::vector<float> elementwise = GradientOfSum(
      13, Floats({3}, {1.0f, 2.0f, -1.0f}), [](GradCheck& check, Value* x) {
        Value* other = check.Constant("other", Floats({3}, {1.0f, 0.0f, 0.0f}));
        return check.Op("Max", {x, other});
      });
  EXPECT_THAT(elementwise, ::testing::ElementsAre(0.5f, 1.0f, 0.0f));
}

TEST(GradientRuleTest, ReduceL2SumSquareL1LogSumExp) {
  for (const char* op : {"ReduceL2", "ReduceSumSquare", "ReduceL1", "ReduceLogSumExp"}) {
    for (int keepdims : {0, 1}) {
      SCOPED_TRACE(absl::StrCat(op, " keepdims=", keepdims));
      {
        GradCheck check(13);
        Value* x = check.Parameter("x", {2, 3, 4});
        check.Check(check.Op(op, {x}, {Attribute::Ints("axes", {1}),
                                       Attribute::Int("keepdims", keepdims)}));
      }
      {
        GradCheck check(18);
        Value* x = check.Parameter("x", {2, 3, 4});
        Value* axes = check.Constant("axes", Tensor::Int64s({0, -1}));
        check.Check(check.Op(op, {x, axes}, {Attribute::Int("keepdims", keepdims)}));
      }
    }
  }
  // A zero norm has a zero gradient (as PyTorch's norm), not 0/0.
  const std::vector<float> grad = GradientOfSum(
      13, Floats({2, 2}, {0.0f, 0.0f, 3.0f, -4.0f}), [](GradCheck& check, Value* x) {
        return check.Op("ReduceL2", {x}, {Attribute::Ints("axes", {1})});
      });
  EXPECT_THAT(grad, ::testing::ElementsAre(0.0f, 0.0f, 0.6f, -0.8f));
}

// 16-bit activations (as under mixed_float16 / mixed_bfloat16) keep 16-bit
// gradients through the new rules; the float32 master gets a float32 one.
TEST(GradientRuleTest, SixteenBitActivationsGetSixteenBitGradientsThroughNewRules) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    GradCheck check(20);
    // Values clear of LeakyRelu's kink and of ReduceMax near-ties by more
    // than the step.
    Value* x = check.Parameter("x", Floats({2, 4}, {0.3f, -0.7f, 0.9f, -0.2f, 0.6f, -0.4f, 0.15f, 0.8f}));
    Value* x16 = check.Op("Cast", {x}, {Attribute::Int("to", DTypeToOnnx(dtype))});
    std::vector<Value*> watched;
    auto watch = [&](Value* value) {
      watched.push_back(value);
      return value;
    };
    Value* sliced = watch(check.Op("Slice", {x16, check.Constant("starts", Tensor::Int64s({1})),
                                             check.Constant("ends", Tensor::Int64s({4})),
                                             check.Constant("axes", Tensor::Int64s({1}))}));
    Value* joined = watch(check.Op("Concat", {sliced, x16}, {Attribute::Int("axis", 1)}));
    Value* leaky = watch(check.Op("LeakyRelu", {joined}, {Attribute::Float("alpha", 0.1f)}));
    Value* padded = watch(check.Op("Pad", {leaky, check.Constant("pads", Tensor::Int64s({0, 1, 0, 1}))}));
    Value* peak = watch(check.Op("ReduceMax", {padded, check.Constant("max_axes", Tensor::Int64s({1}))}));
    Value* sum = check.Op("Add", {padded, peak});
    Value* gelu = watch(check.Op("Gelu", {sum}));
    const double tolerance = dtype == DType::kFloat16 ? 2e-2 : 6e-2;
    check.Check(check.Op("Cast", {gelu}, {Attribute::Int("to", 1)}), tolerance, tolerance,
                /*step=*/5e-2);
    int checked = 0;
    for (const Node* node : check.model().graph->nodes()) {
      for (Value* value : watched) {
        const std::string prefix = value->producer()->name() + "/grad/";
        if (node->name().rfind(prefix, 0) != 0) continue;
        for (const Value* out : node->outputs()) {
          if (!IsFloatingPoint(out->dtype())) continue;
          EXPECT_EQ(out->dtype(), dtype) << node->name();
          ++checked;
        }
      }
    }
    EXPECT_GT(checked, 10);
  }
}

TEST(AutodiffTest, ErrorsNameTheNodeTheParameterAndTheLoss) {
  {
    GradCheck check;
    Value* x = check.Parameter("x", {2, 3});
    Value* arg = check.Op("ArgMax", {x});
    Value* as_float = check.Op("Cast", {arg}, {Attribute::Int("to", 1)});
    Value* loss = check.Op("ReduceSum", {as_float}, {Attribute::Int("keepdims", 0)});
    ASSERT_TRUE(InferTypes(check.model()).ok());
    absl::StatusOr<AutodiffResult> result =
        BuildGradients(check.model(), AutodiffRequest{loss->name(), {"x"}, ""});
    ASSERT_FALSE(result.ok());
    EXPECT_THAT(result.status().message(), HasSubstr("parameter 'x' does not affect the loss"));
  }
  {
    GradCheck check;
    Value* x = check.Parameter("x", {2, 3});
    Value* y = check.Op("ReduceProd", {x}, {Attribute::Ints("axes", {1})});
    Value* loss = check.Op("ReduceSum", {y}, {Attribute::Int("keepdims", 0)});
    ASSERT_TRUE(InferTypes(check.model()).ok());
    absl::StatusOr<AutodiffResult> result =
        BuildGradients(check.model(), AutodiffRequest{loss->name(), {"x"}, ""});
    ASSERT_FALSE(result.ok());
    EXPECT_THAT(result.status().message(),
                HasSubstr("cannot train through node 'ReduceProd_0' (ReduceProd)"));
  }
  {
    GradCheck check;
    Value* x = check.Parameter("x", {2, 3});
    Value* y = check.Op("Neg", {x});
    ASSERT_TRUE(InferTypes(check.model()).ok());
    absl::StatusOr<AutodiffResult> result =
        BuildGradients(check.model(), AutodiffRequest{y->name(), {"x"}, ""});
    ASSERT_FALSE(result.ok());
    EXPECT_THAT(result.status().message(), HasSubstr("expected a single element"));
  }
}

}  // namespace
}  // namespace castor
