// The named steps of `castor train` that tests can call without a training
// run: the flag and checkpoint decisions of SetUpOrResume
// (TrainerOptionsFromFlags, FlagsTheCheckpointDecides,
// TakeCheckpointSettings, RecordedTf32), the step count, the summary
// rendering, and the library pieces of training/session.h (CountCorrect,
// TrimMetrics, PolicyChangeByNode).
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "graph/onnx_io.h"
#include "passes/policy.h"
#include "tests/cli_test_util.h"
#include "tools/train_command.h"
#include "training/session.h"

namespace castor::tools {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TrainStepsTest, TotalStepsCountsPartialBatchesAndStopsAtMaxSteps) {
  EXPECT_EQ(training::TotalSteps(60000, 128, 1, 0), 469);  // 468 full batches and one of 96
  EXPECT_EQ(training::TotalSteps(60000, 128, 2, 0), 938);
  EXPECT_EQ(training::TotalSteps(60000, 128, 2, 100), 100);
  EXPECT_EQ(training::TotalSteps(60000, 128, 1, 5000), 469);  // max-steps above the total
  EXPECT_EQ(training::TotalSteps(10, 5, 3, 0), 6);
}

TEST(TrainStepsTest, FreshRunTakesOptimizerAndScheduleFromFlags) {
  TrainOptions o;
  o.optimizer = "sgd";
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 5e-4;
  o.clip_norm = 1.5;
  o.lr = 0.05;
  o.warmup = 10;
  o.step_size = 300;
  o.gamma = 0.5;
  const training::TrainerOptions t = TrainerOptionsFromFlags(o);
  EXPECT_EQ(t.optimizer.kind, OptimizerKind::kSgd);
  EXPECT_EQ(t.optimizer.momentum, 0.9);
  EXPECT_TRUE(t.optimizer.nesterov);
  EXPECT_EQ(t.optimizer.weight_decay, 5e-4);
  EXPECT_EQ(t.optimizer.clip_norm, 1.5);
  EXPECT_EQ(t.lr.base_lr, 0.05);
  EXPECT_EQ(t.lr.warmup_steps, 10);
  EXPECT_EQ(t.lr.step_size, 300);
  EXPECT_EQ(t.lr.gamma, 0.5);
  // The kind and length wait for the step count (PrepareGraphAndData).
  EXPECT_EQ(t.lr.kind, LrSchedule::Kind::kConstant);
  EXPECT_EQ(t.lr.total_steps, 0);
}

TEST(TrainStepsTest, ResumedRunNamesTheFlagsTheCheckpointDecides) {
  EXPECT_THAT(FlagsTheCheckpointDecides({"--resume", "ckpt", "--lr", "0.1", "--epochs", "2",
                                         "--batch=64", "--no-shuffle", "--data", "mnist",
                                         "--lr=0.2"}),
              ElementsAre("--lr", "--batch", "--no-shuffle", "--lr"));
  EXPECT_THAT(FlagsTheCheckpointDecides({"--resume", "ckpt", "--epochs", "2", "--tf32"}),
              ElementsAre());
  // A prefix is not the flag: --loss-scaling is one flag, not --loss.
  EXPECT_THAT(FlagsTheCheckpointDecides({"--loss-scaling", "off", "--lrx"}),
              ElementsAre("--loss-scaling"));
}

training::TrainingState SavedState() {
  training::TrainingState saved;
  saved.data = "mnist";
  saved.loss = "mse";
  saved.output = "probs";
  saved.input = "pixels";
  saved.batch_size = 32;
  saved.seed = 7;
  saved.shuffle = false;
  saved.optimizer.kind = OptimizerKind::kAdamW;
  saved.optimizer.weight_decay = 0.01;
  saved.lr_schedule.kind = LrSchedule::Kind::kCosine;
  saved.lr_schedule.base_lr = 0.002;
  saved.lr_schedule.total_steps = 900;
  return saved;
}

TEST(TrainStepsTest, ResumedRunContinuesAsTheCheckpointWasConfigured) {
  TrainOptions o;  // defaults: cross-entropy, logits, batch 128, adam, no --data
  const training::TrainerOptions t =
      TakeCheckpointSettings(SavedState(), "runs/a/ckpt-00000100.onnx", o);
  EXPECT_EQ(o.data, "mnist");
  EXPECT_EQ(o.loss, "mse");
  EXPECT_EQ(o.output, "probs");
  EXPECT_EQ(o.input, "pixels");
  EXPECT_EQ(o.batch, 32);
  EXPECT_EQ(o.seed, 7);
  EXPECT_FALSE(o.shuffle);
  EXPECT_EQ(o.optimizer, "adamw");
  EXPECT_EQ(o.checkpoint_dir, "runs/a");
  EXPECT_EQ(t.optimizer.kind, OptimizerKind::kAdamW);
  EXPECT_EQ(t.optimizer.weight_decay, 0.01);
  EXPECT_EQ(t.lr.kind, LrSchedule::Kind::kCosine);
  EXPECT_EQ(t.lr.base_lr, 0.002);
  EXPECT_EQ(t.lr.total_steps, 900);
}

TEST(TrainStepsTest, ResumedRunKeepsGivenDataAndCheckpointDir) {
  TrainOptions o;
  o.data = "fashion-mnist";
  o.checkpoint_dir = "elsewhere";
  o.lr = 0.5;  // the checkpoint decides it
  const training::TrainerOptions t = TakeCheckpointSettings(SavedState(), "ckpt-00000100.onnx", o);
  EXPECT_EQ(o.data, "fashion-mnist");
  EXPECT_EQ(o.checkpoint_dir, "elsewhere");
  EXPECT_EQ(t.lr.base_lr, 0.002);

  TrainOptions bare;  // a checkpoint named without a directory saves beside it
  TakeCheckpointSettings(SavedState(), "ckpt-00000100.onnx", bare);
  EXPECT_EQ(bare.checkpoint_dir, ".");
}

TEST(TrainStepsTest, RecordedTf32) {
  training::TrainingState state;
  EXPECT_EQ(training::RecordedTf32(state).value(), false);  // from before it was recorded
  state.extra.Set(training::kTf32StateKey, Json::Bool(true));
  EXPECT_EQ(training::RecordedTf32(state).value(), true);
  state.extra.Set(training::kTf32StateKey, Json::String("yes"));
  EXPECT_EQ(training::RecordedTf32(state).status().message(),
            "records tf32 as \"yes\"; expected true or false");
}

TEST(TrainStepsTest, FormatDuration) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(44.6), "45s");
  EXPECT_EQ(FormatDuration(59.4), "59s");
  EXPECT_EQ(FormatDuration(125), "2m05s");
  EXPECT_EQ(FormatDuration(-1), "?");
  EXPECT_EQ(FormatDuration(std::nan("")), "?");
}

TrainSummary ExampleSummary() {
  TrainSummary s;
  s.policy = "mixed_bfloat16";
  s.compute_dtype = "bfloat16";
  s.float32_weights = 8;
  s.weights = 8;
  s.trained_tensors = 4;
  s.trained_elements = 1234;
  s.frozen_tensors = 2;
  s.frozen_elements = 56;
  s.steps = 469;
  s.skipped_steps = 2;
  s.loss_scale = 32768;
  s.backend = "cpu (2 threads)";
  s.graph_replay = "none: the CPU backend does not record steps";
  s.peak_activation_bytes = 3 * 1048576 + 524288;  // 3.5 MiB
  s.peak_resident_bytes = 200 * 1048576;
  s.mean_step_ms = 12.345;
  s.samples_per_s = 10368.4;
  s.seconds = 65;
  return s;
}

TEST(TrainStepsTest, SummaryRendering) {
  EXPECT_EQ(RenderTrainSummary(ExampleSummary()),
            "summary:\n"
            "  policy          mixed_bfloat16 (bfloat16 compute, float32 variables)\n"
            "  weights         8 of 8 tensors float32 (master weights and BN statistics)\n"
            "  parameters      4 tensors (1234 elements) train, 2 (56 elements) frozen\n"
            "  steps           469, 2 skipped\n"
            "  loss scale      32768 (final)\n"
            "  backend         cpu (2 threads)\n"
            "  graph replay    none: the CPU backend does not record steps\n"
            "  peak memory     3.5 MiB of activations; process 200 MiB resident\n"
            "  step time       12.3 ms (mean), 10368 samples/s, 1m05s in all\n");
}

TEST(TrainStepsTest, SummaryRenderingWithDeviceMemoryTestAndCheckpoint) {
  TrainSummary s = ExampleSummary();
  s.backend = "cuda:0 (NVIDIA H200, compute capability 9.0)";
  s.tf32 = true;
  s.graph_replay = "468 of this run's 469 steps replayed as a CUDA graph";
  s.peak_device_bytes = 1048576 / 4;  // 0.25 MiB
  s.test = training::Evaluation{0.3712, 0.8697};
  s.last_checkpoint = "ckpt/ckpt-00000469.onnx";
  const std::string text = RenderTrainSummary(s);
  EXPECT_THAT(text, HasSubstr("  backend         cuda:0 (NVIDIA H200, compute capability 9.0), "
                              "TF32 for float32 MatMul/Gemm/Conv\n"));
  EXPECT_THAT(text, HasSubstr("  peak memory     3.5 MiB of activations; 0.2 MiB of device "
                              "memory; process 200 MiB resident\n"));
  EXPECT_THAT(text,
              HasSubstr("in all\n"
                        "  test            loss 0.3712, accuracy 86.97%\n"
                        "  checkpoint      ckpt/ckpt-00000469.onnx (check it: castor verify "
                        "ckpt/ckpt-00000469.onnx)\n"));
}

TEST(TrainStepsTest, CountCorrectTakesTheArgmaxOfEachRow) {
  const Tensor output = Tensor::FromVector<float>(DType::kFloat32, {3, 3},
                                                  {0.1f, 0.7f, 0.2f,    // 1
                                                   0.5f, 0.4f, 0.1f,    // 0
                                                   0.2f, 0.2f, 0.6f});  // 2
  EXPECT_EQ(training::CountCorrect(output, Tensor::Int64s({1, 0, 2})), 3);
  EXPECT_EQ(training::CountCorrect(output, Tensor::Int64s({1, 2, 0})), 1);
  // A tie goes to the first class.
  const Tensor tie = Tensor::FromVector<float>(DType::kFloat32, {1, 2}, {0.5f, 0.5f});
  EXPECT_EQ(training::CountCorrect(tie, Tensor::Int64s({0})), 1);
}

class TrimMetricsTest : public CliTempDirTest {
 protected:
  TrimMetricsTest() : CliTempDirTest("trim_metrics") {}
};

TEST_F(TrimMetricsTest, KeepsLinesUpToTheStepAndDropsATornOne) {
  const std::string path = (dir_ / "run.jsonl").string();
  {
    std::ofstream(path) << "{\"step\":1,\"loss\":2.3}\n"
                        << "{\"epoch\":0,\"step\":2,\"test_loss\":1.9}\n"
                        << "{\"step\":3,\"loss\":2.1}\n"
                        << "{\"summary\":true,\"steps\":3}\n"
                        << "{\"step\":4,\"lo";
  }
  ASSERT_TRUE(training::TrimMetrics(path, 2).ok());
  std::stringstream kept;
  kept << std::ifstream(path).rdbuf();
  EXPECT_EQ(kept.str(), "{\"step\":1,\"loss\":2.3}\n{\"epoch\":0,\"step\":2,\"test_loss\":1.9}\n");
  // No file: nothing to trim.
  EXPECT_TRUE(training::TrimMetrics((dir_ / "missing.jsonl").string(), 2).ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ / "missing.jsonl"));
}

TEST(TrainStepsTest, PolicyChangeByNodeListsTheNodesThatChangeDtype) {
  absl::StatusOr<Model> model = LoadModel(CASTOR_SOURCE_DIR "/models/mlp_opset17.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  const Policy f16 = *Policy::Builtin("mixed_float16");
  absl::StatusOr<std::vector<std::string>> same = training::PolicyChangeByNode(*model, f16, f16);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_THAT(*same, ElementsAre());
  absl::StatusOr<std::vector<std::string>> changes =
      training::PolicyChangeByNode(*model, *Policy::Builtin("float32"), f16);
  ASSERT_TRUE(changes.ok()) << changes.status();
  // The last Gemm makes the logits, a graph output: float32 under both.
  EXPECT_THAT(*changes, ElementsAre("node '/flatten/Flatten' (Flatten): float32 -> float16",
                                    "node '/fc1/Gemm' (Gemm): float32 -> float16",
                                    "node '/Relu' (Relu): float32 -> float16",
                                    "node '/fc2/Gemm' (Gemm): float32 -> float16",
                                    "node '/Relu_1' (Relu): float32 -> float16"));
}

}  // namespace
}  // namespace castor::tools
