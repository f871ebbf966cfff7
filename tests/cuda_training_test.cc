// Training on the CUDA backend against the CPU backend (the reference):
// the same model, weights and batches give the same losses step by step and
// the same weights after several steps, for each sample model under each
// builtin policy; an injected overflow skips the whole update on CUDA and
// names the same first non-finite node; evaluation agrees; and once shapes
// repeat, a step allocates no device memory (the pool serves it); steps
// replayed as a CUDA graph give what node-by-node steps give, skip an
// overflowing update on the device, and have their labels checked. Skips
// without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "passes/autocast.h"
#include "passes/policy.h"
#include "passes/training_graph.h"
#include "tests/cuda_test_util.h"
#include "tests/trainer_test_util.h"
#include "training/trainer.h"

namespace castor::tools {
namespace {

using ::castor::testing::Cpu;
using ::castor::testing::Gpu;

Model LoadSample(const std::string& name, const std::string& policy) {
  absl::StatusOr<Model> model =
      LoadModel(std::string(CASTOR_SOURCE_DIR) + "/models/" + name + ".onnx");
  EXPECT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(InferTypes(*model).ok());
  if (policy != "float32") {
    absl::StatusOr<AutocastReport> report = RunAutocast(*model, *Policy::Builtin(policy));
    EXPECT_TRUE(report.ok()) << report.status();
  }
  return std::move(*model);
}

std::unique_ptr<training::Trainer> MakeTrainer(const std::string& name, const std::string& policy,
                                     Backend& backend, training::TrainerOptions options = {}) {
  Model model = LoadSample(name, policy);
  absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(model, TrainingGraphOptions{});
  EXPECT_TRUE(graph.ok()) << graph.status();
  options.scaler.enabled = policy == "mixed_float16";
  absl::StatusOr<std::unique_ptr<training::Trainer>> trainer =
      training::Trainer::Create(std::move(model), *graph, options, backend);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  return trainer.ok() ? std::move(*trainer) : nullptr;
}

// Batch `index`: `n` images in [0, 1) and labels 0..9, deterministic.
std::pair<Tensor, Tensor> Batch(int index, int64_t n = 16) {
  std::mt19937 rng(1000 + index);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Tensor images(DType::kFloat32, {n, 1, 28, 28});
  for (int64_t i = 0; i < images.num_elements(); ++i) images.data<float>()[i] = pixel(rng);
  Tensor labels(DType::kInt64, {n});
  for (int64_t i = 0; i < n; ++i) labels.data<int64_t>()[i] = (i + index) % 10;
  return {std::move(images), std::move(labels)};
}

// max |a - b| / max(max |b|, 1e-6) over two tensors of the same shape.
double RelativeMaxDifference(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 1e-6;
  for (int64_t i = 0; i < b.num_elements(); ++i) {
    diff = std::max(diff, std::fabs(a.GetDouble(i) - b.GetDouble(i)));
    scale = std::max(scale, std::fabs(b.GetDouble(i)));
  }
  return diff / scale;
}

struct Case {
  std::string model, policy;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " " << c.policy; }

class CudaTrainingTest : public ::testing::TestWithParam<Case> {};

// Five SGD steps on CUDA and on the CPU from the same weights and batches.
// SGD, not Adam: Adam's first steps move every weight by about lr whatever
// the gradient's size, so a gradient that is zero up to rounding noise (the
// transformer's key bias: softmax ignores a shift) would take a random +-lr
// step on each backend. Tolerances: float32 differs only by summation order
// (cuBLAS/cuDNN vs OpenBLAS/grid products; cuDNN's FFT and Winograd
// algorithms, which differ by more, are not used for float32), 16-bit
// compute by roundings of intermediate values that land on the other side
// of a 16-bit boundary.
TEST_P(CudaTrainingTest, StepsMatchTheCpuBackend) {
  CASTOR_REQUIRE_CUDA();
  const Case& c = GetParam();
  const double tolerance = c.policy == "float32" ? 1e-3 : 3e-2;
  training::TrainerOptions options;
  options.optimizer.kind = OptimizerKind::kSgd;
  options.lr.base_lr = 0.05;
  std::unique_ptr<training::Trainer> cpu = MakeTrainer(c.model, c.policy, Cpu(), options);
  std::unique_ptr<training::Trainer> gpu = MakeTrainer(c.model, c.policy, Gpu(), options);
  ASSERT_TRUE(cpu && gpu);
  for (int step = 0; step < 5; ++step) {
    auto [images, labels] = Batch(step);
    absl::StatusOr<training::StepResult> expected = cpu->Step({{"input", images}}, labels);
    absl::StatusOr<training::StepResult> got = gpu->Step({{"input", images}}, labels);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->skipped, expected->skipped) << "step " << step;
    EXPECT_NEAR(got->loss, expected->loss, tolerance * std::fabs(expected->loss))
        << "step " << step;
    EXPECT_LE(RelativeMaxDifference(got->output, expected->output), tolerance) << "step " << step;
  }
  const std::map<std::string, Tensor> gpu_state = StateOf(*gpu);
  for (const auto& [name, expected] : StateOf(*cpu)) {
    const Tensor& got = gpu_state.at(name);
    ASSERT_EQ(got.dims(), expected.dims()) << name;
    EXPECT_EQ(got.dtype(), DType::kFloat32) << name << ": master weights stay float32";
    EXPECT_LE(RelativeMaxDifference(got, expected), tolerance) << name;
  }
  auto [images, labels] = Batch(99);
  absl::StatusOr<training::StepResult> expected = cpu->Evaluate({{"input", images}}, labels);
  absl::StatusOr<training::StepResult> got = gpu->Evaluate({{"input", images}}, labels);
  ASSERT_TRUE(expected.ok() && got.ok()) << expected.status() << " / " << got.status();
  EXPECT_NEAR(got->loss, expected->loss, tolerance * std::fabs(expected->loss));
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const char* model : {"mlp_opset17", "cnn_opset17", "resnet_opset17", "transformer_opset17"}) {
    for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
      cases.push_back({model, policy});
    }
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return info.param.model + "_" + info.param.policy;
}

INSTANTIATE_TEST_SUITE_P(SampleModels, CudaTrainingTest, ::testing::ValuesIn(AllCases()),
                         CaseName);

TEST(CudaTrainerTest, InjectedOverflowSkipsTheWholeUpdate) {
  CASTOR_REQUIRE_CUDA();
  training::TrainerOptions options;
  options.scaler.initial_scale = 1e30;  // float16 gradients overflow for sure
  std::unique_ptr<training::Trainer> gpu = MakeTrainer("resnet_opset17", "mixed_float16", Gpu(), options);
  std::unique_ptr<training::Trainer> cpu = MakeTrainer("resnet_opset17", "mixed_float16", Cpu(), options);
  ASSERT_TRUE(gpu && cpu);
  const std::map<std::string, Tensor> before = StateOf(*gpu);
  auto [images, labels] = Batch(0, 8);
  absl::StatusOr<training::StepResult> result = gpu->Step({{"input", images}}, labels);
  absl::StatusOr<training::StepResult> reference = cpu->Step({{"input", images}}, labels);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_TRUE(result->skipped);
  EXPECT_EQ(gpu->scaler().scale(), 5e29);
  EXPECT_EQ(gpu->scaler().skipped_steps(), 1);
  EXPECT_EQ(gpu->optimizer_step(), 0);
  const std::map<std::string, Tensor> after = StateOf(*gpu);
  for (const auto& [name, tensor] : before) {
    const Tensor& now = after.at(name);
    EXPECT_EQ(std::memcmp(tensor.raw(), now.raw(), tensor.byte_size()), 0) << name;
  }
  EXPECT_FALSE(result->first_non_finite.empty());
  EXPECT_EQ(result->first_non_finite, reference->first_non_finite);
}

TEST(CudaTrainerTest, RepeatedStepsAllocateNoDeviceMemory) {
  CASTOR_REQUIRE_CUDA();
  std::unique_ptr<training::Trainer> gpu = MakeTrainer("cnn_opset17", "mixed_float16", Gpu());
  ASSERT_TRUE(gpu);
  auto [images, labels] = Batch(0);
  for (int step = 0; step < 2; ++step) ASSERT_TRUE(gpu->Step({{"input", images}}, labels).ok());
  const DeviceMemoryStats warm = *CudaMemoryStats(Gpu());
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(gpu->Step({{"input", images}}, labels).ok());
  const DeviceMemoryStats after = *CudaMemoryStats(Gpu());
  EXPECT_EQ(after.device_allocations, warm.device_allocations);
  EXPECT_GT(after.peak_in_use_bytes, 0);
}

// Two runs of the same steps give the same bits: cuDNN's deterministic
// algorithms are preferred (backend/cuda/conv.cu) and these models' other
// kernels add in a fixed order. (MaxPoolGrad over overlapping windows and
// GatherGrad still add with atomics; no sample model has them.) The second
// run is on a backend of its own, as a second `castor train` would be: it
// searches cuDNN's algorithms afresh instead of reusing the first one's.
TEST(CudaTrainerTest, RepeatedRunsGiveTheSameBits) {
  CASTOR_REQUIRE_CUDA();
  absl::StatusOr<std::unique_ptr<Backend>> fresh = CreateCudaBackend();
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  for (const char* model : {"cnn_opset17", "resnet_opset17", "transformer_opset17"}) {
    for (const char* policy : {"float32", "mixed_float16"}) {
      SCOPED_TRACE(std::string(model) + " " + policy);
      training::TrainerOptions options;
      options.optimizer.kind = OptimizerKind::kSgd;
      options.optimizer.momentum = 0.9;
      options.lr.base_lr = 0.05;
      options.replay_steps = false;
      std::unique_ptr<training::Trainer> first = MakeTrainer(model, policy, Gpu(), options);
      std::unique_ptr<training::Trainer> second = MakeTrainer(model, policy, **fresh, options);
      ASSERT_TRUE(first && second);
      for (int step = 0; step < 4; ++step) {
        auto [images, labels] = Batch(step);
        absl::StatusOr<training::StepResult> a = first->Step({{"input", images}}, labels);
        absl::StatusOr<training::StepResult> b = second->Step({{"input", images}}, labels);
        ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " / " << b.status();
        EXPECT_EQ(a->loss, b->loss) << "step " << step;
      }
      const std::map<std::string, Tensor> second_state = StateOf(*second);
      for (const auto& [name, tensor] : StateOf(*first)) {
        const Tensor& other = second_state.at(name);
        ASSERT_EQ(other.byte_size(), tensor.byte_size()) << name;
        EXPECT_EQ(std::memcmp(tensor.raw(), other.raw(), tensor.byte_size()), 0) << name;
      }
    }
  }
}

// A backend that allows TF32 (castor train --tf32) trains float32 models
// close to exact float32 (TF32 products keep 10 mantissa bits) but not
// bit-identically: its tensor-core paths (cuBLAS's TF32 compute, cuDNN's
// tensor-op math and FFT/Winograd algorithms) run.
TEST(CudaTrainerTest, Tf32StepsStayCloseToFloat32) {
  CASTOR_REQUIRE_CUDA();
  CudaBackendOptions tf32_options;
  tf32_options.allow_tf32 = true;
  absl::StatusOr<std::unique_ptr<Backend>> tf32 = CreateCudaBackend(tf32_options);
  ASSERT_TRUE(tf32.ok()) << tf32.status();
  for (const char* model : {"mlp_opset17", "resnet_opset17"}) {
    SCOPED_TRACE(model);
    training::TrainerOptions options;
    options.optimizer.kind = OptimizerKind::kSgd;
    options.optimizer.momentum = 0.9;
    options.lr.base_lr = 0.05;
    std::unique_ptr<training::Trainer> exact = MakeTrainer(model, "float32", Gpu(), options);
    std::unique_ptr<training::Trainer> fast = MakeTrainer(model, "float32", **tf32, options);
    ASSERT_TRUE(exact && fast);
    bool outputs_differ = false;
    for (int step = 0; step < 5; ++step) {
      auto [images, labels] = Batch(step, 64);
      absl::StatusOr<training::StepResult> a = exact->Step({{"input", images}}, labels);
      absl::StatusOr<training::StepResult> b = fast->Step({{"input", images}}, labels);
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " / " << b.status();
      EXPECT_NEAR(b->loss, a->loss, 1e-2 * std::fabs(a->loss)) << "step " << step;
      ASSERT_EQ(a->output.byte_size(), b->output.byte_size());
      outputs_differ |=
          std::memcmp(a->output.raw(), b->output.raw(), a->output.byte_size()) != 0;
    }
    EXPECT_TRUE(outputs_differ) << "TF32 gave exact float32's bits in every step";
  }
}

// The same steps replayed as a CUDA graph and node by node (replay off).
// The first step with a batch shape runs node by node, the second is
// recorded and replayed, later ones replay; a smaller batch in between runs
// node by node and replay resumes after it. The kernels are the same either
// way and add in a fixed order, so the two should agree bit for bit; the
// tolerances (float32: 1e-5; 16-bit compute: 5e-3, a rounding on the other
// side of a 16-bit boundary) leave room for kernels that add with atomics
// (MaxPoolGrad over overlapping windows, GatherGrad).
class CudaReplayTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaReplayTest, ReplayedStepsMatchNodeByNodeSteps) {
  CASTOR_REQUIRE_CUDA();
  const Case& c = GetParam();
  const double tolerance = c.policy == "float32" ? 1e-5 : 5e-3;
  training::TrainerOptions options;
  options.optimizer.kind = OptimizerKind::kSgd;
  options.optimizer.momentum = 0.9;  // the slots are part of the recording too
  options.lr.base_lr = 0.05;
  training::TrainerOptions node_by_node = options;
  node_by_node.replay_steps = false;
  std::unique_ptr<training::Trainer> replay = MakeTrainer(c.model, c.policy, Gpu(), options);
  std::unique_ptr<training::Trainer> eager = MakeTrainer(c.model, c.policy, Gpu(), node_by_node);
  ASSERT_TRUE(replay && eager);
  EXPECT_EQ(replay->replay_unavailable(), "");
  EXPECT_EQ(eager->replay_unavailable(), "turned off");
  const std::vector<int64_t> batch = {16, 16, 16, 16, 8, 16, 16};
  const std::vector<bool> replayed = {false, true, true, true, false, true, true};
  for (size_t step = 0; step < batch.size(); ++step) {
    auto [images, labels] = Batch(static_cast<int>(step), batch[step]);
    absl::StatusOr<training::StepResult> got = replay->Step({{"input", images}}, labels);
    absl::StatusOr<training::StepResult> expected = eager->Step({{"input", images}}, labels);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(got->replayed, replayed[step]) << "step " << step;
    EXPECT_FALSE(expected->replayed);
    EXPECT_EQ(got->skipped, expected->skipped) << "step " << step;
    EXPECT_EQ(got->loss_scale, expected->loss_scale) << "step " << step;
    EXPECT_EQ(got->lr, expected->lr) << "step " << step;
    EXPECT_NEAR(got->loss, expected->loss, tolerance * std::fabs(expected->loss))
        << "step " << step;
    EXPECT_LE(RelativeMaxDifference(got->output, expected->output), tolerance) << "step " << step;
  }
  EXPECT_EQ(replay->replayed_steps(), 5);
  EXPECT_EQ(replay->replay_unavailable(), "");
  EXPECT_EQ(replay->optimizer_step(), eager->optimizer_step());
  const std::map<std::string, Tensor> replayed_state = StateOf(*replay);
  for (const auto& [name, expected] : StateOf(*eager)) {
    EXPECT_LE(RelativeMaxDifference(replayed_state.at(name), expected), tolerance) << name;
  }
  // Evaluation after replayed steps reads the weights they wrote.
  auto [images, labels] = Batch(99);
  absl::StatusOr<training::StepResult> got = replay->Evaluate({{"input", images}}, labels);
  absl::StatusOr<training::StepResult> expected = eager->Evaluate({{"input", images}}, labels);
  ASSERT_TRUE(got.ok() && expected.ok()) << got.status() << " / " << expected.status();
  EXPECT_NEAR(got->loss, expected->loss, tolerance * std::fabs(expected->loss));
}

INSTANTIATE_TEST_SUITE_P(SampleModels, CudaReplayTest,
                         ::testing::Values(Case{"mlp_opset17", "float32"},
                                           Case{"cnn_opset17", "mixed_float16"},
                                           Case{"resnet_opset17", "float32"},
                                           Case{"resnet_opset17", "mixed_bfloat16"},
                                           Case{"transformer_opset17", "mixed_float16"}),
                         CaseName);

// The loss scale moving between replays, both ways: early steps overflow
// and back off, later ones update, and the scale grows every 3 good steps.
// Replays read the scale from the device, so they skip, update and move the
// scale exactly as node-by-node steps do.
TEST(CudaTrainerTest, ReplayedStepsFollowTheMovingLossScale) {
  CASTOR_REQUIRE_CUDA();
  training::TrainerOptions options;
  options.scaler.initial_scale = 1 << 22;  // the logits' float16 gradients overflow at first
  options.scaler.growth_interval = 3;
  training::TrainerOptions node_by_node = options;
  node_by_node.replay_steps = false;
  std::unique_ptr<training::Trainer> replay = MakeTrainer("cnn_opset17", "mixed_float16", Gpu(), options);
  std::unique_ptr<training::Trainer> eager =
      MakeTrainer("cnn_opset17", "mixed_float16", Gpu(), node_by_node);
  ASSERT_TRUE(replay && eager);
  int replayed_skips = 0, replayed_updates = 0;
  for (int step = 0; step < 12; ++step) {
    auto [images, labels] = Batch(step);
    absl::StatusOr<training::StepResult> got = replay->Step({{"input", images}}, labels);
    absl::StatusOr<training::StepResult> expected = eager->Step({{"input", images}}, labels);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(got->replayed, step >= 1) << "step " << step;
    EXPECT_EQ(got->skipped, expected->skipped) << "step " << step;
    EXPECT_EQ(got->loss_scale, expected->loss_scale) << "step " << step;
    if (got->replayed) (got->skipped ? replayed_skips : replayed_updates) += 1;
  }
  EXPECT_GT(replayed_skips, 0) << "no replay met an overflow";
  EXPECT_GT(replayed_updates, 3) << "no replay grew the scale";
  EXPECT_EQ(replay->scaler().scale(), eager->scaler().scale());
  EXPECT_EQ(replay->optimizer_step(), eager->optimizer_step());
  const std::map<std::string, Tensor> replayed_state = StateOf(*replay);
  for (const auto& [name, expected] : StateOf(*eager)) {
    EXPECT_LE(RelativeMaxDifference(replayed_state.at(name), expected), 5e-3) << name;
  }
}

// An overflow inside the recorded step: the decision is made on the device,
// so replayed steps skip the whole update (weights, moments, running
// statistics bit-identical), halve the scale, and the first non-finite node
// is still named (found by an extra node-by-node run).
TEST(CudaTrainerTest, ReplayedStepsSkipAnOverflowingUpdate) {
  CASTOR_REQUIRE_CUDA();
  training::TrainerOptions options;
  options.scaler.initial_scale = 1e30;  // float16 gradients overflow for sure
  std::unique_ptr<training::Trainer> gpu = MakeTrainer("resnet_opset17", "mixed_float16", Gpu(), options);
  ASSERT_TRUE(gpu);
  const std::map<std::string, Tensor> before = StateOf(*gpu);
  double scale = 1e30;
  for (int step = 0; step < 4; ++step) {
    auto [images, labels] = Batch(step, 8);
    absl::StatusOr<training::StepResult> result = gpu->Step({{"input", images}}, labels);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->replayed, step >= 1) << "step " << step;
    EXPECT_TRUE(result->skipped) << "step " << step;
    EXPECT_EQ(result->loss_scale, scale) << "step " << step;
    EXPECT_FALSE(result->first_non_finite.empty()) << "step " << step;
    scale /= 2;
  }
  EXPECT_EQ(gpu->scaler().scale(), scale);
  EXPECT_EQ(gpu->scaler().skipped_steps(), 4);
  EXPECT_EQ(gpu->optimizer_step(), 0);
  const std::map<std::string, Tensor> after = StateOf(*gpu);
  for (const auto& [name, tensor] : before) {
    EXPECT_EQ(std::memcmp(tensor.raw(), after.at(name).raw(), tensor.byte_size()), 0) << name;
  }
}

// The loss kernel checks labels once, while the step is recorded; before
// each replay the trainer checks them on the host instead, and a bad label
// fails the step with the same kind of message and changes nothing.
TEST(CudaTrainerTest, ReplayedStepsCheckTheirLabels) {
  CASTOR_REQUIRE_CUDA();
  std::unique_ptr<training::Trainer> gpu = MakeTrainer("cnn_opset17", "float32", Gpu());
  ASSERT_TRUE(gpu);
  for (int step = 0; step < 2; ++step) {
    auto [images, labels] = Batch(step);
    ASSERT_TRUE(gpu->Step({{"input", images}}, labels).ok());
  }
  ASSERT_EQ(gpu->replayed_steps(), 1);
  const std::map<std::string, Tensor> before = StateOf(*gpu);
  auto [images, labels] = Batch(2);
  labels.data<int64_t>()[3] = 10;
  absl::StatusOr<training::StepResult> bad = gpu->Step({{"input", images}}, labels);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("label 10 at position 3 is out of range [0, 10)"),
            absl::string_view::npos)
      << bad.status();
  EXPECT_EQ(gpu->steps(), 2);
  const std::map<std::string, Tensor> after = StateOf(*gpu);
  for (const auto& [name, tensor] : before) {
    EXPECT_EQ(std::memcmp(tensor.raw(), after.at(name).raw(), tensor.byte_size()), 0) << name;
  }
  labels.data<int64_t>()[3] = 9;
  absl::StatusOr<training::StepResult> good = gpu->Step({{"input", images}}, labels);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(good->replayed);
}

}  // namespace
}  // namespace castor::tools
