// The losses the attach-loss pass builds, against PyTorch: binary
// cross-entropy with logits (--loss bce) on logits as large as 89 (the
// stable form never overflows), its loss and gradient against
// torch.nn.BCEWithLogitsLoss in float64 (torch 1.13, values below), and
// the model's own loss (--loss output); cross-entropy on a model whose
// opset predates SoftmaxCrossEntropyLoss (castor's copy of the op), against
// a float64 reference computed here.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "graph/shape_inference.h"
#include "passes/training_graph.h"
#include "tests/kernel_test_util.h"
#include "tests/trainer_test_util.h"
#include "training/trainer.h"

namespace castor {
namespace {

using testing::Cpu;

// logits = x [4, 3] @ W [3, 5] (W the parameter).
Model MatMulModel() {
  Model model;
  model.ir_version = 8;
  model.opset_imports.push_back({"", 17});
  Graph& g = *model.graph;
  Value* x = *g.AddInput("x", DType::kFloat32, Shape{Dim(4), Dim(3)});
  Value* w = *g.AddInitializer(
      "W", Tensor::FromVector<float>(DType::kFloat32, {3, 5},
                                     {0.5f, -1.0f, 2.0f, 0.0f, 3.0f, 1.5f, 0.25f, -2.0f, 4.0f,
                                      -3.0f, -0.5f, 2.0f, 1.0f, -1.0f, 5.0f}));
  Node* matmul = *g.AddNode("MatMul", {x, w}, {"logits"}, "matmul");
  g.AddOutput(matmul->output(0));
  EXPECT_TRUE(InferTypes(model).ok());
  return model;
}

// Generated with torch 1.13 (float64):
//   x = [[1, -2, .5], [3, .25, -1], [-4, 6, 2], [10, -8, 7]]; W as above;
//   y = [[1, 0, .3, 1, 0], [0, 1, .5, 0, 1], [1, 1, 0, .9, 0], [0, .2, 1, 1, 0]]
//   loss = torch.nn.BCEWithLogitsLoss()(x @ W, y); loss.backward()
// (the logits reach -39, 43 and 89).
constexpr double kTorchLoss = 8.580093503005735;
constexpr double kTorchGradW[15] = {
    0.09074776823453157,  0.21035875598621073,  0.10827689644657827,  -0.43787026689862557,
    0.5444004599866008,   0.10467479569657526,  -0.3225063340798989,  -0.06373721398821486,
    0.540989620693234,    -0.5004655724743574,  -0.06948050631907216, 0.29735393795217463,
    -0.006988180901890815, -0.4090347682523374, 0.3768660913235473};

TEST(BinaryCrossEntropyLoss, MatchesTorchLossAndGradient) {
  EXPECT_EQ(*ParseLossKind("bce"), LossKind::kBinaryCrossEntropy);
  Model model = MatMulModel();
  TrainingGraphOptions options;
  options.loss = LossKind::kBinaryCrossEntropy;
  absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(model, options);
  ASSERT_TRUE(graph.ok()) << graph.status();
  // Only W trains (the loss's constant 1 is no parameter).
  ASSERT_EQ(graph->gradients.size(), 1u);
  EXPECT_EQ(graph->gradients[0].first, "W");
  const Value* labels = model.graph->FindValue(kLabelsInput);
  ASSERT_NE(labels, nullptr);
  EXPECT_EQ(labels->dtype(), DType::kFloat32);
  EXPECT_EQ(labels->shape().ToString(), "[4,5]");

  training::TrainerOptions trainer_options;
  trainer_options.optimizer.kind = OptimizerKind::kSgd;
  trainer_options.lr.base_lr = 1.0;
  absl::StatusOr<std::unique_ptr<training::Trainer>> trainer =
      training::Trainer::Create(std::move(model), *graph, trainer_options, Cpu());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const Tensor x = Tensor::FromVector<float>(
      DType::kFloat32, {4, 3}, {1, -2, 0.5f, 3, 0.25f, -1, -4, 6, 2, 10, -8, 7});
  const Tensor y = Tensor::FromVector<float>(
      DType::kFloat32, {4, 5},
      {1, 0, 0.3f, 1, 0, 0, 1, 0.5f, 0, 1, 1, 1, 0, 0.9f, 0, 0, 0.2f, 1, 1, 0});
  const std::map<std::string, Tensor> before = tools::StateOf(**trainer);
  absl::StatusOr<training::StepResult> step = (*trainer)->Step({{"x", x}}, y);
  ASSERT_TRUE(step.ok()) << step.status();
  // float32 targets 0.3f, 0.9f, 0.2f differ from torch's float64 ones by
  // ~1e-8 relative; the loss sums terms of up to 89.
  EXPECT_NEAR(step->loss, kTorchLoss, 2e-6 * kTorchLoss);
  const std::map<std::string, Tensor> after = tools::StateOf(**trainer);
  for (int i = 0; i < 15; ++i) {
    const double update = static_cast<double>(after.at("W").data<float>()[i]) -
                          before.at("W").data<float>()[i];
    // SGD with lr 1: the update is minus the gradient, up to float32
    // rounding of W (|W| <= 5) and of the gradient.
    EXPECT_NEAR(-update, kTorchGradW[i], 2e-6) << "W[" << i << "]";
  }
}

// logits = Gemm(x [4, 3], W [3, 5], b [5]) at `opset` (Gemm's C is
// optional only from 11, so its gradient Gemms need one below).
Model GemmModelAtOpset(int64_t opset) {
  Model model;
  model.ir_version = opset < 12 ? 6 : 8;
  model.opset_imports.push_back({"", opset});
  Graph& g = *model.graph;
  Value* x = *g.AddInput("x", DType::kFloat32, Shape{Dim(4), Dim(3)});
  Value* w = *g.AddInitializer(
      "W", Tensor::FromVector<float>(DType::kFloat32, {3, 5},
                                     {0.5f, -1.0f, 2.0f, 0.0f, 3.0f, 1.5f, 0.25f, -2.0f, 4.0f,
                                      -3.0f, -0.5f, 2.0f, 1.0f, -1.0f, 5.0f}));
  Value* b = *g.AddInitializer(
      "b", Tensor::FromVector<float>(DType::kFloat32, {5}, {0.1f, -0.2f, 0.3f, 0.0f, -0.5f}));
  Node* gemm = *g.AddNode("Gemm", {x, w, b}, {"logits"}, "gemm");
  g.AddOutput(gemm->output(0));
  EXPECT_TRUE(InferTypes(model).ok());
  return model;
}

TEST(CrossEntropyLoss, TrainsModelsBelowOpset12LikeAbove) {
  const float x_values[12] = {1, -2, 0.5f, 3, 0.25f, -1, -4, 6, 2, 0.5f, -0.75f, 1};
  const int64_t label_values[4] = {2, 0, 4, 1};
  // float64 reference: loss = mean_n(logsumexp(z_n) - z_n[y_n]),
  // dW = x^T (softmax(z) - onehot(y)) / 4, db = sum_n (...) / 4.
  Model reference_model = GemmModelAtOpset(17);
  const Graph& rg = *reference_model.graph;
  const float* w = rg.FindValue("W")->initializer()->data<float>();
  const float* bias = rg.FindValue("b")->initializer()->data<float>();
  double loss = 0;
  double grad_w[15] = {};
  double grad_b[5] = {};
  for (int n = 0; n < 4; ++n) {
    double z[5];
    double max_z = -1e300;
    for (int c = 0; c < 5; ++c) {
      z[c] = bias[c];
      for (int k = 0; k < 3; ++k) z[c] += static_cast<double>(x_values[n * 3 + k]) * w[k * 5 + c];
      max_z = std::max(max_z, z[c]);
    }
    double sum = 0;
    for (double v : z) sum += std::exp(v - max_z);
    loss += (max_z + std::log(sum) - z[label_values[n]]) / 4;
    for (int c = 0; c < 5; ++c) {
      const double d = (std::exp(z[c] - max_z) / sum - (c == label_values[n] ? 1 : 0)) / 4;
      grad_b[c] += d;
      for (int k = 0; k < 3; ++k) grad_w[k * 5 + c] += x_values[n * 3 + k] * d;
    }
  }

  for (int64_t opset : {9, 11, 12, 17}) {
    SCOPED_TRACE(absl::StrCat("opset ", opset));
    Model model = GemmModelAtOpset(opset);
    absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(model, TrainingGraphOptions{});
    ASSERT_TRUE(graph.ok()) << graph.status();
    const Node* loss_node = nullptr;
    for (const Node* node : model.graph->nodes()) {
      if (node->op_type() == "SoftmaxCrossEntropyLoss") loss_node = node;
    }
    ASSERT_NE(loss_node, nullptr);
    // ONNX's op from opset 12, castor's copy below.
    EXPECT_EQ(loss_node->domain(), opset < 12 ? "com.castor" : "");

    training::TrainerOptions trainer_options;
    trainer_options.optimizer.kind = OptimizerKind::kSgd;
    trainer_options.lr.base_lr = 1.0;
    absl::StatusOr<std::unique_ptr<training::Trainer>> trainer =
        training::Trainer::Create(std::move(model), *graph, trainer_options, Cpu());
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const std::map<std::string, Tensor> before = tools::StateOf(**trainer);
    absl::StatusOr<training::StepResult> step = (*trainer)->Step(
        {{"x", Tensor::FromVector<float>(DType::kFloat32, {4, 3},
                                         std::vector<float>(x_values, x_values + 12))}},
        Tensor::FromVector<int64_t>(DType::kInt64, {4},
                                    std::vector<int64_t>(label_values, label_values + 4)));
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_NEAR(step->loss, loss, 1e-6 * loss);
    const std::map<std::string, Tensor> after = tools::StateOf(**trainer);
    for (int i = 0; i < 15; ++i) {
      const double update = static_cast<double>(after.at("W").data<float>()[i]) -
                            before.at("W").data<float>()[i];
      EXPECT_NEAR(-update, grad_w[i], 1e-6) << "W[" << i << "]";
    }
    for (int i = 0; i < 5; ++i) {
      const double update = static_cast<double>(after.at("b").data<float>()[i]) -
                            before.at("b").data<float>()[i];
      EXPECT_NEAR(-update, grad_b[i], 1e-6) << "b[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace castor
