// The losses the attach-loss pass builds, against PyTorch: binary
// cross-entropy with logits (--loss bce) on logits as large as 89 (the
// stable form never overflows), its loss and gradient against
// torch.nn.BCEWithLogitsLoss in float64 (torch 1.13, values below), and
// the model's own loss (--loss output).
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace castor
