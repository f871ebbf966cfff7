// BatchNormalization in the training graph, in every form exporters write
// it: the inference form (one output), torch's training export below
// opset 14 (no training_mode; five outputs Y, mean, var, saved_mean,
// saved_var, the last four read by nobody) and from opset 14
// (training_mode=1, three outputs). Whatever the form and opset, the
// batchnorm-training pass replaces it by castor's BatchNormalizationTraining
// (com.castor), and the step normalises with batch statistics and updates
// the running statistics with the node's momentum as PyTorch's train()
// does, the running variance with the unbiased batch variance: the same
// losses and the same state to the bit in every form, the step-1 loss and
// the running statistics against a float64 reference computed here, and a
// model torch 1.13 exported at opsets 13 and 17 against torch's own losses
// and running statistics after 3 steps (tests/data/batch_norm_golden.json,
// written by tests/data/generate_batch_norm_golden.py). Plus the errors for
// forms castor cannot train.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "graph/gradient_builder.h"
#include "graph/json.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "gtest/gtest.h"
#include "passes/training_graph.h"
#include "passes/verifier.h"
#include "tests/trainer_test_util.h"
#include "training/trainer.h"

namespace castor::tools {
namespace {

using ::testing::HasSubstr;

CpuBackend& Cpu() {
  static CpuBackend* backend = new CpuBackend();
  return *backend;
}

constexpr int64_t kBatch = 4, kChannels = 2, kLength = 3, kClasses = 3;
// torch's BatchNorm momentum 0.3 (not the default 0.1), exported as ONNX's
// 1 - 0.3: the weight of the old running value.
constexpr float kOnnxMomentum = 0.7f;
constexpr float kEpsilon = 1e-5f;

const std::vector<float> kScale = {1.5f, 0.5f}, kBias = {0.25f, -0.5f};
const std::vector<float> kMean = {0.1f, -0.2f}, kVar = {0.9f, 1.3f};

std::vector<float> Weights() {
  std::vector<float> w(kChannels * kLength * kClasses);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.125f * static_cast<float>((i * 5) % 9) - 0.5f;
  return w;
}

std::vector<float> Inputs() {
  std::vector<float> x(kBatch * kChannels * kLength);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = 0.3f * static_cast<float>((i * 7) % 5) - 0.6f + 0.01f * static_cast<float>(i);
  }
  return x;
}

// Targets of the mean squared error (the loss castor attaches at every
// opset: SoftmaxCrossEntropyLoss exists from opset 12 only).
std::vector<float> Targets() {
  std::vector<float> t(kBatch * kClasses);
  for (size_t i = 0; i < t.size(); ++i) t[i] = 0.5f * static_cast<float>((i * 3) % 4) - 0.75f;
  return t;
}

enum class Form {
  kInference,       // Y only
  kTorchBelow14,    // Y, mean, var, saved_mean, saved_var (opsets 7-13)
  kTrainingMode14,  // training_mode=1: Y, running_mean, running_var (opset 14+)
};

std::string FormName(Form form) {
  switch (form) {
    case Form::kInference: return "inference form";
    case Form::kTorchBelow14: return "five outputs";
    case Form::kTrainingMode14: return "training_mode=1";
  }
  return "";
}

// x [4, 2, 3] -> BatchNormalization (form) -> Flatten -> MatMul W [6, 3].
Model BatchNormModel(int64_t opset, Form form) {
  Model model;
  model.ir_version = 8;
  model.opset_imports.push_back({"", opset});
  Graph& g = *model.graph;
  Value* x = *g.AddInput("x", DType::kFloat32, Shape{Dim(kBatch), Dim(kChannels), Dim(kLength)});
  auto floats = [&](const std::string& name, std::vector<int64_t> dims, std::vector<float> v) {
    return *g.AddInitializer(name, Tensor::FromVector<float>(DType::kFloat32, std::move(dims), v));
  };
  Value* scale = floats("scale", {kChannels}, kScale);
  Value* bias = floats("B", {kChannels}, kBias);
  Value* mean = floats("mean", {kChannels}, kMean);
  Value* var = floats("var", {kChannels}, kVar);
  Value* weight = floats("W", {kChannels * kLength, kClasses}, Weights());
  std::vector<std::string> outputs = {"bn"};
  if (form == Form::kTorchBelow14) {
    outputs = {"bn", "bn_mean", "bn_var", "bn_saved_mean", "bn_saved_var"};
  } else if (form == Form::kTrainingMode14) {
    outputs = {"bn", "bn_running_mean", "bn_running_var"};
  }
  Node* bn = *g.AddNode("BatchNormalization", {x, scale, bias, mean, var}, outputs, "bn");
  bn->SetAttribute(Attribute::Float("epsilon", kEpsilon));
  bn->SetAttribute(Attribute::Float("momentum", kOnnxMomentum));
  if (form == Form::kTrainingMode14) bn->SetAttribute(Attribute::Int("training_mode", 1));
  Node* flat = *g.AddNode("Flatten", {bn->output(0)}, {"flat"}, "flatten");
  Node* matmul = *g.AddNode("MatMul", {flat->output(0), weight}, {"logits"}, "head");
  g.AddOutput(matmul->output(0));
  absl::Status inferred = InferTypes(model);
  EXPECT_TRUE(inferred.ok()) << inferred;
  return model;
}

// The step-1 loss in float64: batch statistics (biased variance, as the
// normalisation uses), Y, logits, mean squared error.
double ReferenceLoss() {
  const std::vector<float> x = Inputs();
  const std::vector<float> w = Weights();
  std::vector<double> y(x.size());
  for (int64_t c = 0; c < kChannels; ++c) {
    double sum = 0, squares = 0;
    for (int64_t n = 0; n < kBatch; ++n) {
      for (int64_t i = 0; i < kLength; ++i) sum += x[(n * kChannels + c) * kLength + i];
    }
    const double mean = sum / (kBatch * kLength);
    for (int64_t n = 0; n < kBatch; ++n) {
      for (int64_t i = 0; i < kLength; ++i) {
        const double d = x[(n * kChannels + c) * kLength + i] - mean;
        squares += d * d;
      }
    }
    const double var = squares / (kBatch * kLength);
    for (int64_t n = 0; n < kBatch; ++n) {
      for (int64_t i = 0; i < kLength; ++i) {
        const int64_t at = (n * kChannels + c) * kLength + i;
        y[at] = (x[at] - mean) / std::sqrt(var + static_cast<double>(kEpsilon)) * kScale[c] +
                kBias[c];
      }
    }
  }
  const std::vector<float> targets = Targets();
  double loss = 0;
  for (int64_t n = 0; n < kBatch; ++n) {
    for (int64_t k = 0; k < kClasses; ++k) {
      double logit = 0;
      for (int64_t j = 0; j < kChannels * kLength; ++j) {
        logit += y[n * kChannels * kLength + j] * w[j * kClasses + k];
      }
      const double error = logit - targets[n * kClasses + k];
      loss += error * error;
    }
  }
  return loss / (kBatch * kClasses);
}

// Batch mean and variance of channel c of Inputs(); `unbiased` divides the
// squared deviations by count - 1 instead of count.
std::pair<double, double> BatchStatistics(int64_t c, bool unbiased) {
  const std::vector<float> x = Inputs();
  const int64_t count = kBatch * kLength;
  double sum = 0, squares = 0;
  for (int64_t n = 0; n < kBatch; ++n) {
    for (int64_t i = 0; i < kLength; ++i) sum += x[(n * kChannels + c) * kLength + i];
  }
  const double mean = sum / count;
  for (int64_t n = 0; n < kBatch; ++n) {
    for (int64_t i = 0; i < kLength; ++i) {
      const double d = x[(n * kChannels + c) * kLength + i] - mean;
      squares += d * d;
    }
  }
  return {mean, squares / static_cast<double>(unbiased ? count - 1 : count)};
}

struct TrainingRun {
  std::vector<double> losses;
  std::map<std::string, Tensor> state;
};

// Three SGD steps (lr 0.1, no loss scaling, mean squared error) on the
// same batch.
TrainingRun Train(int64_t opset, Form form) {
  Model model = BatchNormModel(opset, form);
  TrainingGraphOptions graph_options;
  graph_options.loss = LossKind::kMeanSquaredError;
  absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(model, graph_options);
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return {};
  absl::Status verified = VerifyModel(model);
  EXPECT_TRUE(verified.ok()) << verified;
  // The training node is castor's, with the node's epsilon and momentum.
  int training_nodes = 0;
  for (const Node* node : model.graph->nodes()) {
    EXPECT_NE(node->op_type(), "BatchNormalization");
    if (node->op_type() != "BatchNormalizationTraining") continue;
    ++training_nodes;
    EXPECT_EQ(node->domain(), kCastorDomain);
    // Y, the running statistics, and the batch mean, which the gradient
    // reads instead of computing it again (and nothing else reads).
    EXPECT_EQ(node->num_outputs(), 4);
    if (node->num_outputs() == 4) {
      const std::vector<Use>& mean_readers = node->output(3)->uses();
      EXPECT_EQ(mean_readers.size(), 1u);
      for (const Use& use : mean_readers) {
        EXPECT_EQ(use.node->op_type(), "BatchNormalizationGrad");
        EXPECT_EQ(use.index, 3);
      }
      EXPECT_EQ(node->output(3)->dtype(), DType::kFloat32);
    }
    EXPECT_FALSE(node->has_attribute("training_mode"));
    EXPECT_EQ(node->GetFloat("momentum", 0.0f), kOnnxMomentum);
    EXPECT_EQ(node->GetFloat("epsilon", 0.0f), kEpsilon);
  }
  EXPECT_EQ(training_nodes, 1);
  std::set<std::string> stats;
  for (const auto& [stat, updated] : graph->running_stats) stats.insert(stat);
  EXPECT_EQ(stats, (std::set<std::string>{"mean", "var"}));

  training::TrainerOptions options;
  options.optimizer.kind = OptimizerKind::kSgd;
  options.lr.base_lr = 0.1;
  options.scaler.enabled = false;
  absl::StatusOr<std::unique_ptr<training::Trainer>> trainer =
      training::Trainer::Create(std::move(model), *graph, options, Cpu());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return {};
  TrainingRun run;
  const Tensor x = Tensor::FromVector<float>(DType::kFloat32, {kBatch, kChannels, kLength}, Inputs());
  const Tensor labels = Tensor::FromVector<float>(DType::kFloat32, {kBatch, kClasses}, Targets());
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<training::StepResult> result = (*trainer)->Step({{"x", x}}, labels);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return {};
    run.losses.push_back(result->loss);
  }
  run.state = StateOf(**trainer);
  return run;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.num_elements() == b.num_elements() &&
         std::memcmp(a.raw(), b.raw(), a.byte_size()) == 0;
}

TEST(BatchNormTrainingTest, EveryOpsetFormTrainsWithBatchStatistics) {
  const TrainingRun reference = Train(17, Form::kTrainingMode14);
  ASSERT_EQ(reference.losses.size(), 3u);
  // Step 1 against float64.
  EXPECT_NEAR(reference.losses[0], ReferenceLoss(), 1e-6 * ReferenceLoss());
  // The batch is the same every step, so after 3 steps each running
  // statistic is momentum^3 * initial + (1 - momentum^3) * batch, whatever
  // the weights did; the variance's batch value is the unbiased one
  // (x 12/11 here), as PyTorch's.
  const double keep = std::pow(static_cast<double>(kOnnxMomentum), 3);
  const Tensor& mean = reference.state.at("mean");
  const Tensor& var = reference.state.at("var");
  for (int64_t c = 0; c < kChannels; ++c) {
    const auto [batch_mean, batch_var] = BatchStatistics(c, /*unbiased=*/true);
    EXPECT_NEAR(mean.data<float>()[c], keep * kMean[c] + (1 - keep) * batch_mean, 1e-6) << c;
    EXPECT_NEAR(var.data<float>()[c], keep * kVar[c] + (1 - keep) * batch_var, 1e-6) << c;
    // Not the ONNX spec's biased update: that is far outside the tolerance.
    const double biased = BatchStatistics(c, /*unbiased=*/false).second;
    EXPECT_GT(std::fabs(var.data<float>()[c] - (keep * kVar[c] + (1 - keep) * biased)), 1e-3)
        << c;
  }
  // The weights moved.
  EXPECT_NE(reference.state.at("W").data<float>()[0], Weights()[0]);

  struct Case {
    int64_t opset;
    Form form;
  };
  const std::vector<Case> cases = {
      {9, Form::kTorchBelow14},  {11, Form::kTorchBelow14},   {12, Form::kTorchBelow14},
      {13, Form::kTorchBelow14}, {13, Form::kInference},      {9, Form::kInference},
      {14, Form::kTrainingMode14}, {15, Form::kTrainingMode14}, {17, Form::kInference}};
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("opset ", c.opset, ", ", FormName(c.form)));
    const TrainingRun run = Train(c.opset, c.form);
    ASSERT_EQ(run.losses, reference.losses);
    ASSERT_EQ(run.state.size(), reference.state.size());
    for (const auto& [name, tensor] : reference.state) {
      EXPECT_TRUE(SameBits(run.state.at(name), tensor)) << name;
    }
  }
}

// torch 1.13's own run: its exports at opset 13 (five-output
// BatchNormalization) and 17 (training_mode=1) train in castor to torch's
// losses and running statistics (momentum 0.3 and 0.1, 12 values per
// channel: the unbiased update differs from the biased one by up to 7e-3,
// the generating script prints it) after 3 SGD steps.
TEST(BatchNormTrainingTest, TorchExportsMatchTorchRunningStatistics) {
  absl::StatusOr<Json> golden = ParseJsonFile(std::string(CASTOR_SOURCE_DIR) +
                                              "/tests/data/batch_norm_golden.json");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const int64_t batch = golden->Find("batch")->as_int();
  const std::vector<Json>& xs = golden->Find("x")->items();
  const std::vector<Json>& ys = golden->Find("y")->items();
  const std::vector<Json>& losses = golden->Find("losses")->items();
  ASSERT_EQ(xs.size(), 3u);
  for (int opset : {13, 17}) {
    SCOPED_TRACE(absl::StrCat("opset ", opset));
    absl::StatusOr<Model> model = LoadModel(absl::StrCat(
        CASTOR_SOURCE_DIR, "/tests/data/batch_norm_opset", opset, ".onnx"));
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_TRUE(InferTypes(*model).ok());
    absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(*model, {});
    ASSERT_TRUE(graph.ok()) << graph.status();
    training::TrainerOptions options;
    options.optimizer.kind = OptimizerKind::kSgd;
    options.lr.base_lr = golden->Find("lr")->as_number();
    options.scaler.enabled = false;
    absl::StatusOr<std::unique_ptr<training::Trainer>> trainer =
        training::Trainer::Create(std::move(*model), *graph, options, Cpu());
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    for (size_t step = 0; step < xs.size(); ++step) {
      std::vector<float> x;
      for (const Json& image : xs[step].items()) {
        for (const Json& channel : image.items()) {
          for (const Json& row : channel.items()) {
            for (const Json& value : row.items()) x.push_back(static_cast<float>(value.as_number()));
          }
        }
      }
      std::vector<int64_t> y;
      for (const Json& label : ys[step].items()) y.push_back(label.as_int());
      const int64_t per_image = static_cast<int64_t>(x.size()) / batch;
      ASSERT_EQ(per_image, 8);
      absl::StatusOr<training::StepResult> result = (*trainer)->Step(
          {{"x", Tensor::FromVector<float>(DType::kFloat32, {batch, 2, 2, 2}, x)}},
          Tensor::FromVector<int64_t>(DType::kInt64, {batch}, y));
      ASSERT_TRUE(result.ok()) << result.status();
      const double want = losses[step].as_number();
      EXPECT_NEAR(result->loss, want, 1e-5 * std::fabs(want)) << "step " << step + 1;
    }
    const std::map<std::string, Tensor> state = StateOf(**trainer);
    int compared = 0;
    for (const auto& [name, values] : golden->Find("running_stats")->members()) {
      const Json* onnx_definition = golden->Find("running_stats_onnx_definition")->Find(name);
      ASSERT_NE(onnx_definition, nullptr) << name;
      auto it = state.find(name);
      ASSERT_NE(it, state.end()) << "castor has no state " << name;
      ASSERT_EQ(it->second.num_elements(), static_cast<int64_t>(values.items().size())) << name;
      double off_onnx_definition = 0;
      for (int64_t i = 0; i < it->second.num_elements(); ++i) {
        const double want = values.items()[i].as_number();
        const double got = it->second.data<float>()[i];
        EXPECT_NEAR(got, want, 2e-6 + 2e-6 * std::fabs(want)) << name << "[" << i << "]";
        off_onnx_definition = std::max(
            off_onnx_definition, std::fabs(got - onnx_definition->items()[i].as_number()));
      }
      // The variances are far from the ONNX definition's biased update.
      if (name.find("running_var") != std::string::npos) {
        EXPECT_GT(off_onnx_definition, 1e-3) << name;
      }
      ++compared;
    }
    EXPECT_EQ(compared, 4);  // running_mean and running_var of two BatchNorm2d
  }
}

// The evaluation graph of a torch opset-13 training export normalises with
// the running statistics (eval()), as the inference form does.
TEST(BatchNormTrainingTest, EvaluationGraphBelowOpset14UsesRunningStatistics) {
  Model model = BatchNormModel(13, Form::kTorchBelow14);
  absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(model, {});
  ASSERT_TRUE(graph.ok()) << graph.status();
  int batch_norms = 0;
  for (const Node* node : graph->evaluation->graph->nodes()) {
    if (node->op_type() != "BatchNormalization") continue;
    ++batch_norms;
    EXPECT_EQ(node->num_outputs(), 1);
    EXPECT_FALSE(node->has_attribute("training_mode"));
  }
  EXPECT_EQ(batch_norms, 1);
  EXPECT_TRUE(VerifyModel(*graph->evaluation).ok());
}

TEST(BatchNormTrainingTest, FormsCastorCannotTrainAreNamed) {
  {  // spatial=0 (opsets 7-8): statistics per activation
    Model model = BatchNormModel(8, Form::kTorchBelow14);
    model.graph->FindNode("bn")->SetAttribute(Attribute::Int("spatial", 0));
    absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(model, {});
    ASSERT_FALSE(graph.ok());
    EXPECT_THAT(graph.status().message(), HasSubstr("'bn'"));
    EXPECT_THAT(graph.status().message(), HasSubstr("spatial=0"));
  }
  {  // saved_mean read by the model
    Model model = BatchNormModel(13, Form::kTorchBelow14);
    Graph& g = *model.graph;
    Node* read = *g.AddNode("Identity", {g.FindValue("bn_saved_mean")}, {"saved"}, "read_saved");
    g.AddOutput(read->output(0));
    ASSERT_TRUE(InferTypes(model).ok());
    absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(model, {});
    ASSERT_FALSE(graph.ok());
    // The evaluation graph, built first, names the read output.
    EXPECT_THAT(graph.status().message(), HasSubstr("output 3"));
    EXPECT_THAT(graph.status().message(), HasSubstr("'bn_saved_mean'"));
  }
}

}  // namespace
}  // namespace castor::tools
