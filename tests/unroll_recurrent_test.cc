// Tests for passes/unroll_recurrent.h (LSTM, GRU, RNN rewritten into
// primitive ops): gradients of the rewritten graph against central finite
// differences (the tests/autodiff_test.cc GradCheck recipe: L = sum over the
// outputs of ReduceSum(out * R_k) for fixed random R_k, every parameter a
// graph input, every gradient element compared in double), the shape of the
// rewrite (output names kept, opset forms of Unsqueeze), and the refusals
// naming the node and what to do. Forward values against PyTorch and ONNX
// Runtime are checked by tests/recurrent_reference_check.py.
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/executor.h"
#include "gmock/gmock.h"
#include "graph/shape_inference.h"
#include "gtest/gtest.h"
#include "passes/autodiff.h"
#include "passes/pass_manager.h"
#include "passes/unroll_recurrent.h"
#include "passes/verifier.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using ::testing::HasSubstr;
using testing::Cpu;
using testing::ValueOrDie;

Tensor RandomTensor(const std::vector<int64_t>& dims, std::mt19937& rng, float scale = 0.6f) {
  Tensor tensor(DType::kFloat32, dims);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  for (int64_t i = 0; i < tensor.num_elements(); ++i) tensor.data<float>()[i] = uniform(rng);
  return tensor;
}

int CountOps(const Graph& graph, const std::string& op_type) {
  int n = 0;
  for (const Node* node : graph.nodes()) n += node->op_type() == op_type;
  return n;
}

// One recurrent node whose inputs are parameters (graph inputs) with
// random values; `inputs` lists (slot name, dims), an empty name omits it.
class RecurrentModel {
 public:
  explicit RecurrentModel(int64_t opset = 17) : rng_(4321) { model_.opset_imports = {{"", opset}}; }
  Graph& graph() { return *model_.graph; }
  Model& model() { return model_; }

  Node* Build(const std::string& op_type,
              const std::vector<std::pair<std::string, std::vector<int64_t>>>& inputs,
              int num_outputs, std::vector<Attribute> attributes) {
    std::vector<Value*> values;
    for (const auto& [name, dims] : inputs) {
      if (name.empty()) {
        values.push_back(nullptr);
        continue;
      }
      values.push_back(ValueOrDie(graph().AddInput(name, DType::kFloat32, Shape::FromDims(dims))));
      feeds_.emplace_back(name, RandomTensor(dims, rng_));
      parameters_.push_back(name);
    }
    std::vector<std::string> outputs;
    for (int k = 0; k < num_outputs; ++k) outputs.push_back(absl::StrCat("out", k));
    Node* node = ValueOrDie(graph().AddNode(op_type, values, outputs, "cell"));
    for (Attribute& attribute : attributes) node->SetAttribute(std::move(attribute));
    for (Value* out : node->outputs()) graph().AddOutput(out);
    return node;
  }

  // Unrolls, appends L = sum_k ReduceSum(out_k * R_k) and the backward
  // graph, and compares every gradient with central differences.
  void CheckGradients(double rtol = 2e-3, double atol = 2e-4, double step = 1e-3) {
    ASSERT_TRUE(InferTypes(model_).ok());
    const UnrollRecurrentReport report = ValueOrDie(UnrollRecurrent(model_));
    ASSERT_TRUE(report.changed());
    for (const char* op : {"LSTM", "GRU", "RNN"}) ASSERT_EQ(CountOps(graph(), op), 0) << op;
    std::vector<Value*> outputs = graph().outputs();
    graph().ClearOutputs();
    Value* loss = nullptr;
    for (size_t k = 0; k < outputs.size(); ++k) {
      const std::vector<int64_t> dims = *outputs[k]->shape().StaticDims();
      Value* r = ValueOrDie(graph().AddInitializer(absl::StrCat("R", k), RandomTensor(dims, rng_, 1.0f)));
      Value* weighted = ValueOrDie(graph().AddNode("Mul", {outputs[k], r}, {absl::StrCat("w", k)},
                                                            absl::StrCat("weigh", k)))->output(0);
      Node* sum = ValueOrDie(graph().AddNode("ReduceSum", {weighted}, {absl::StrCat("s", k)},
                                                absl::StrCat("sum", k)));
      sum->SetAttribute(Attribute::Int("keepdims", 0));
      loss = loss == nullptr ? sum->output(0)
                             : ValueOrDie(graph().AddNode("Add", {loss, sum->output(0)},
                                                          {absl::StrCat("l", k)},
                                                          absl::StrCat("add", k)))->output(0);
    }
    graph().AddOutput(loss);
    absl::Status inferred = InferTypes(model_);
    ASSERT_TRUE(inferred.ok()) << inferred;
    AutodiffResult result =
        ValueOrDie(BuildGradients(model_, AutodiffRequest{loss->name(), parameters_, ""}));
    for (const std::string& parameter : parameters_) {
      bool found = false;
      for (const auto& [p, gradient] : result.gradients) {
        if (p != parameter) continue;
        graph().AddOutput(graph().FindValue(gradient));
        found = true;
      }
      ASSERT_TRUE(found) << "no gradient for " << parameter;
    }
    absl::Status verified = VerifyModel(model_);
    ASSERT_TRUE(verified.ok()) << verified;
    auto executor = ValueOrDie(Executor::Create(model_, Cpu()));
    const std::vector<Tensor> values = ValueOrDie(executor->Run(feeds_));
    int checked = 0;
    for (size_t p = 0; p < parameters_.size(); ++p) {
      const Tensor& analytic = values[1 + p];
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
        EXPECT_NEAR(analytic.data<float>()[i], numeric, atol + rtol * std::fabs(numeric))
            << "d loss / d " << parameters_[p] << "[" << i << "]";
        ++checked;
      }
    }
    EXPECT_GT(checked, 0);
  }

 private:
  Model model_;
  std::mt19937 rng_;
  std::vector<std::pair<std::string, Tensor>> feeds_;
  std::vector<std::string> parameters_;
};

constexpr int64_t kSeq = 3, kBatch = 2, kInput = 3, kHidden = 2;

TEST(UnrollRecurrentTest, LstmBidirectionalPeepholesGradientsMatchFiniteDifferences) {
  RecurrentModel m;
  m.Build("LSTM",
          {{"X", {kSeq, kBatch, kInput}},
           {"W", {2, 4 * kHidden, kInput}},
           {"R", {2, 4 * kHidden, kHidden}},
           {"B", {2, 8 * kHidden}},
           {"", {}},
           {"initial_h", {2, kBatch, kHidden}},
           {"initial_c", {2, kBatch, kHidden}},
           {"P", {2, 3 * kHidden}}},
          3, {Attribute::Int("hidden_size", kHidden), Attribute::String("direction", "bidirectional")});
  m.CheckGradients();
}

TEST(UnrollRecurrentTest, LstmLayout1ZeroStateClipGradientsMatchFiniteDifferences) {
  RecurrentModel m;
  m.Build("LSTM",
          {{"X", {kBatch, kSeq, kInput}}, {"W", {1, 4 * kHidden, kInput}},
           {"R", {1, 4 * kHidden, kHidden}}},
          3, {Attribute::Int("hidden_size", kHidden), Attribute::Int("layout", 1),
              Attribute::Float("clip", 5.0f), Attribute::String("direction", "reverse")});
  m.CheckGradients();
}

TEST(UnrollRecurrentTest, GruGradientsMatchFiniteDifferencesWithAndWithoutLinearBeforeReset) {
  for (int64_t linear_before_reset : {0, 1}) {
    SCOPED_TRACE(absl::StrCat("linear_before_reset ", linear_before_reset));
    RecurrentModel m;
    m.Build("GRU",
            {{"X", {kSeq, kBatch, kInput}},
             {"W", {1, 3 * kHidden, kInput}},
             {"R", {1, 3 * kHidden, kHidden}},
             {"B", {1, 6 * kHidden}},
             {"", {}},
             {"initial_h", {1, kBatch, kHidden}}},
            2, {Attribute::Int("hidden_size", kHidden),
                Attribute::Int("linear_before_reset", linear_before_reset)});
    m.CheckGradients();
  }
}

TEST(UnrollRecurrentTest, GruBidirectionalZeroStateGradientsMatchFiniteDifferences) {
  RecurrentModel m;
  m.Build("GRU",
          {{"X", {kSeq, kBatch, kInput}}, {"W", {2, 3 * kHidden, kInput}},
           {"R", {2, 3 * kHidden, kHidden}}, {"B", {2, 6 * kHidden}}},
          2, {Attribute::Int("hidden_size", kHidden), Attribute::String("direction", "bidirectional"),
              Attribute::Int("linear_before_reset", 1)});
  m.CheckGradients();
}

TEST(UnrollRecurrentTest, RnnGradientsMatchFiniteDifferences) {
  RecurrentModel m;
  m.Build("RNN",
          {{"X", {kSeq, kBatch, kInput}}, {"W", {1, kHidden, kInput}},
           {"R", {1, kHidden, kHidden}}, {"B", {1, 2 * kHidden}}, {"", {}},
           {"initial_h", {1, kBatch, kHidden}}},
          2, {Attribute::Int("hidden_size", kHidden)});
  m.CheckGradients();
}

// A model with one LSTM node; X's sequence dim as given.
Model LstmModel(int64_t opset, Dim seq, std::vector<Attribute> attributes = {},
                std::optional<Tensor> sequence_lens = std::nullopt) {
  Model model;
  model.opset_imports = {{"", opset}};
  Graph& g = *model.graph;
  Value* x = ValueOrDie(g.AddInput("X", DType::kFloat32, Shape({seq, Dim(2), Dim(3)})));
  Value* w = ValueOrDie(g.AddInitializer("W", Tensor(DType::kFloat32, {1, 8, 3})));
  Value* r = ValueOrDie(g.AddInitializer("R", Tensor(DType::kFloat32, {1, 8, 2})));
  std::vector<Value*> inputs = {x, w, r};
  if (sequence_lens.has_value()) {
    inputs.push_back(nullptr);
    inputs.push_back(ValueOrDie(g.AddInitializer("lens", *sequence_lens)));
  }
  Node* node = ValueOrDie(g.AddNode("LSTM", inputs, {"Y", "Y_h", "Y_c"}, "encoder/lstm"));
  node->SetAttribute(Attribute::Int("hidden_size", 2));
  for (Attribute& attribute : attributes) node->SetAttribute(std::move(attribute));
  g.AddOutput(node->output(0));
  g.AddOutput(node->output(2));  // Y_h read by nobody: not computed
  return model;
}

TEST(UnrollRecurrentTest, KeepsOutputNamesAndUsesTheOpsetsUnsqueezeForm) {
  for (int64_t opset : {11, 13, 17}) {
    SCOPED_TRACE(absl::StrCat("opset ", opset));
    Model model = LstmModel(opset, Dim(4));
    ASSERT_TRUE(InferTypes(model).ok());
    PassManager manager;
    UnrollRecurrentReport report;
    manager.Add(MakeUnrollRecurrentPass(&report));
    PassContext context;
    absl::Status ran = manager.Run(model, context);  // verified after the pass
    ASSERT_TRUE(ran.ok()) << ran;
    EXPECT_EQ(report.lstm_nodes, 1);
    EXPECT_EQ(CountOps(*model.graph, "LSTM"), 0);
    ASSERT_EQ(context.notes.size(), 1u);
    EXPECT_THAT(context.notes[0], HasSubstr("unroll-recurrent: 1 LSTM"));
    ASSERT_EQ(model.graph->outputs().size(), 2u);
    EXPECT_EQ(model.graph->outputs()[0]->name(), "Y");
    EXPECT_EQ(model.graph->outputs()[0]->shape(), Shape({4, 1, 2, 2}));
    EXPECT_EQ(model.graph->outputs()[1]->name(), "Y_c");
    EXPECT_EQ(model.graph->outputs()[1]->shape(), Shape({1, 2, 2}));
    // One input MatMul for all steps, one recurrent MatMul per step after
    // the first (zero initial state).
    EXPECT_EQ(CountOps(*model.graph, "MatMul"), 1 + 3);
    for (const Node* node : model.graph->nodes()) {
      if (node->op_type() != "Unsqueeze") continue;
      EXPECT_EQ(node->has_attribute("axes"), opset < 13) << node->name();
      EXPECT_EQ(node->num_inputs(), opset < 13 ? 1 : 2) << node->name();
    }
  }
}

TEST(UnrollRecurrentTest, SymbolicSequenceLengthIsRefusedNamingTheNode) {
  Model model = LstmModel(17, Dim::Symbol("seq"));
  ASSERT_TRUE(InferTypes(model).ok());
  absl::StatusOr<UnrollRecurrentReport> report = UnrollRecurrent(model);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(), HasSubstr("LSTM node 'encoder/lstm'"));
  EXPECT_THAT(report.status().message(), HasSubstr("export the model with a fixed sequence length"));
}

TEST(UnrollRecurrentTest, SequenceLensIsMaskedFromOpset9AndCheckedWhenConstant) {
  Tensor lens(DType::kInt32, {2});
  lens.data<int32_t>()[0] = 4;
  lens.data<int32_t>()[1] = 3;
  {
    Model model = LstmModel(17, Dim(4), {}, lens);
    ASSERT_TRUE(InferTypes(model).ok());
    ASSERT_TRUE(UnrollRecurrent(model).ok());
    // Per step: Y, h, c; then the length-0 rule on the last h and c.
    EXPECT_EQ(CountOps(*model.graph, "Where"), 4 * 3 + 2);
  }
  {
    Model model = LstmModel(8, Dim(4), {}, lens);  // no Where below opset 9
    ASSERT_TRUE(InferTypes(model).ok());
    absl::StatusOr<UnrollRecurrentReport> report = UnrollRecurrent(model);
    ASSERT_FALSE(report.ok());
    EXPECT_THAT(report.status().message(), HasSubstr("LSTM node 'encoder/lstm'"));
    EXPECT_THAT(report.status().message(), HasSubstr("needs opset 9 (the model has 8)"));
  }
  {
    lens.data<int32_t>()[1] = 5;
    Model model = LstmModel(17, Dim(4), {}, lens);
    ASSERT_TRUE(InferTypes(model).ok());
    absl::StatusOr<UnrollRecurrentReport> report = UnrollRecurrent(model);
    ASSERT_FALSE(report.ok());
    EXPECT_THAT(report.status().message(), HasSubstr("has length 5; expected 0..4"));
  }
  {
    lens.data<int32_t>()[1] = 4;  // every entry the full length: nothing to mask
    Model model = LstmModel(8, Dim(4), {}, lens);
    ASSERT_TRUE(InferTypes(model).ok());
    ASSERT_TRUE(UnrollRecurrent(model).ok());
    EXPECT_EQ(CountOps(*model.graph, "Where"), 0);
  }
}

TEST(UnrollRecurrentTest, MaskedGruGradientsMatchFiniteDifferences) {
  RecurrentModel m;
  Node* gru = m.Build("GRU",
                      {{"X", {kSeq, kBatch, kInput}}, {"W", {1, 3 * kHidden, kInput}},
                       {"R", {1, 3 * kHidden, kHidden}}, {"B", {1, 6 * kHidden}}},
                      2, {Attribute::Int("hidden_size", kHidden)});
  Tensor lens(DType::kInt32, {kBatch});
  lens.data<int32_t>()[0] = 2;
  lens.data<int32_t>()[1] = 3;
  gru->SetInput(4, ValueOrDie(m.graph().AddInitializer("lens", lens)));
  m.CheckGradients();
}

TEST(UnrollRecurrentTest, UnsupportedActivationsAreRefusedNamingTheAttribute) {
  {
    Model model = LstmModel(17, Dim(4));
    Attribute affine;
    affine.name = "activations";
    affine.kind = AttrKind::kStrings;
    affine.strings = {"Sigmoid", "Affine", "Tanh"};
    model.graph->nodes()[0]->SetAttribute(affine);
    ASSERT_TRUE(InferTypes(model).ok());
    absl::StatusOr<UnrollRecurrentReport> report = UnrollRecurrent(model);
    ASSERT_FALSE(report.ok());
    EXPECT_THAT(report.status().message(), HasSubstr("LSTM node 'encoder/lstm'"));
    EXPECT_THAT(report.status().message(), HasSubstr("'activations' entry 1 is 'Affine'"));
  }
  {
    Model model = LstmModel(17, Dim(4));
    Attribute two;
    two.name = "activations";
    two.kind = AttrKind::kStrings;
    two.strings = {"Sigmoid", "Tanh"};
    model.graph->nodes()[0]->SetAttribute(two);
    ASSERT_TRUE(InferTypes(model).ok());
    absl::StatusOr<UnrollRecurrentReport> report = UnrollRecurrent(model);
    ASSERT_FALSE(report.ok());
    EXPECT_THAT(report.status().message(), HasSubstr("has 2 entries; expected 3"));
  }
}

TEST(UnrollRecurrentTest, InferenceGivesOnnxOutputShapesAndChecksWeights) {
  Model model = LstmModel(17, Dim(4), {Attribute::Int("layout", 0)});
  ASSERT_TRUE(InferTypes(model).ok());
  EXPECT_EQ(model.graph->FindValue("Y_h")->shape(), Shape({1, 2, 2}));
  // hidden_size 3 disagrees with W's 8 rows (4 gates * 2).
  Model wrong = LstmModel(17, Dim(4), {Attribute::Int("hidden_size", 3)});
  absl::Status inferred = InferTypes(wrong);
  ASSERT_FALSE(inferred.ok());
  EXPECT_THAT(inferred.message(), HasSubstr("expected 4 gates * hidden_size 3 = 12"));
}

}  // namespace
}  // namespace castor
