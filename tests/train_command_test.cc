// `castor train` in-process on a tiny .npy dataset (48 train, 16 test
// images, labels 0..9): the header, progress, evaluation and summary lines,
// the JSONL metrics (one object per step and per evaluation, with the
// fields the issue names), loss scaling on for mixed_float16 and off for
// mixed_bfloat16, checkpoints and resume (bit for bit; another policy
// refused unless allowed; a corrupt newest checkpoint skipped; pruning),
// and the flag errors.
#include "tools/train_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <tuple>
#include <vector>

#include "absl/strings/str_join.h"
#include "backend/cuda_backend.h"
#include "backend/cuda_probe.h"
#include "graph/json.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "tests/cli_test_util.h"
#include "training/checkpoint.h"
#include "training/npy.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class TrainCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A parameterized test's name holds a '/': one directory, not a parent
    // that TearDown would leave behind.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = fs::temp_directory_path() /
           ("castor_train_test_" + std::to_string(getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::mt19937 rng(3);
    WriteImageSplit(dir_, "train", 48, 1, rng);
    WriteImageSplit(dir_, "test", 16, 1, rng);
    data_ = absl::StrCat((dir_ / "train_x.npy").string(), ",", (dir_ / "train_y.npy").string(),
                         ",", (dir_ / "test_x.npy").string(), ",", (dir_ / "test_y.npy").string());
  }
  void TearDown() override { fs::remove_all(dir_); }

  struct Result {
    int code;
    std::string out, err;
  };
  Result Train(std::vector<std::string> extra) {
    std::vector<std::string> args = {std::string(CASTOR_SOURCE_DIR) + "/models/mlp_opset17.onnx",
                                     "--data", data_, "--batch", "16"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::ostringstream out, err;
    const int code = RunTrain(args, out, err);
    return {code, out.str(), err.str()};
  }

  fs::path dir_;
  std::string data_;
};

TEST_F(TrainCommandTest, TrainsEvaluatesAndWritesMetrics) {
  const std::string metrics = (dir_ / "metrics.jsonl").string();
  const Result r = Train({"--policy", "mixed_float16", "--epochs", "2", "--metrics", metrics});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("(48 train / 16 test), policy mixed_float16 (float16 compute), adam "
                               "lr 0.001, batch 16, 6 steps, loss scaling on"));
  EXPECT_THAT(r.err, HasSubstr("step 6/6  loss "));
  EXPECT_THAT(r.out, HasSubstr("eval  epoch 0 step 3: test loss "));
  EXPECT_THAT(r.out, HasSubstr("eval  epoch 1 step 6: test loss "));
  EXPECT_THAT(r.out, HasSubstr("weights         6 of 6 tensors float32"));
  EXPECT_THAT(r.out, HasSubstr("steps           6, 0 skipped"));
  EXPECT_THAT(r.out, HasSubstr("loss scale      65536 (final)"));
  EXPECT_THAT(r.out, HasSubstr("graph replay    none: the cpu backend runs each kernel as it is "
                               "queued"));

  std::ifstream in(metrics);
  std::string line;
  int steps = 0, evaluations = 0, summaries = 0;
  while (std::getline(in, line)) {
    absl::StatusOr<Json> json = Json::Parse(line);
    ASSERT_TRUE(json.ok()) << line;
    if (json->Find("summary") != nullptr) {
      ++summaries;
      EXPECT_EQ(steps, 6) << "the summary is the last line";
      EXPECT_EQ(json->Find("backend")->as_string(), "cpu");
      ASSERT_NE(json->Find("tf32"), nullptr);
      EXPECT_FALSE(json->Find("tf32")->as_bool());
      EXPECT_EQ(json->Find("policy")->as_string(), "mixed_float16");
      EXPECT_EQ(json->Find("steps")->as_int(), 6);
      EXPECT_EQ(json->Find("skipped")->as_int(), 0);
      EXPECT_GT(json->Find("step_time_ms")->as_number(), 0.0);
      EXPECT_GT(json->Find("samples_per_s")->as_number(), 0.0);
      EXPECT_GT(json->Find("peak_activation_bytes")->as_int(), 0);
      // The run was in this process: its resident peak is this process's
      // peak when the summary was written, which can only have grown since.
      struct rusage usage {};
      ASSERT_EQ(getrusage(RUSAGE_SELF, &usage), 0);
      const int64_t now = static_cast<int64_t>(usage.ru_maxrss) * 1024;
      EXPECT_LE(json->Find("peak_resident_bytes")->as_int(), now);
      EXPECT_GE(json->Find("peak_resident_bytes")->as_int(), now / 2);
      EXPECT_GT(json->Find("peak_resident_bytes")->as_int(),
                json->Find("peak_activation_bytes")->as_int());
      EXPECT_EQ(json->Find("steps_run")->as_int(), 6);
      EXPECT_EQ(json->Find("replayed_steps")->as_int(), 0);
      EXPECT_EQ(json->Find("peak_device_memory_bytes"), nullptr) << "no device memory on the CPU";
      continue;
    }
    if (json->Find("test_accuracy") != nullptr) {
      ++evaluations;
      EXPECT_NE(json->Find("epoch"), nullptr);
      EXPECT_NE(json->Find("test_loss"), nullptr);
      continue;
    }
    ++steps;
    for (const char* key : {"step", "loss", "loss_scale", "skipped", "lr", "samples_per_s"}) {
      EXPECT_NE(json->Find(key), nullptr) << key << " in " << line;
    }
    ASSERT_NE(json->Find("replayed"), nullptr) << line;
    EXPECT_FALSE(json->Find("replayed")->as_bool()) << "the CPU runs node by node";
    EXPECT_EQ(json->Find("step")->as_int(), steps);
    EXPECT_EQ(json->Find("loss_scale")->as_number(), 65536.0);
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(evaluations, 2);
  EXPECT_EQ(summaries, 1);
}

TEST_F(TrainCommandTest, BFloat16TrainsWithoutLossScaling) {
  const Result r = Train({"--policy", "mixed_bfloat16", "--max-steps", "2", "--optimizer", "sgd",
                          "--lr", "0.1", "--momentum", "0.9"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 steps, loss scaling off"));
  EXPECT_THAT(r.out, HasSubstr("loss scale      1 (final)"));
}

// --profile: after the summary, the kernels' milliseconds per step by op
// and dtype (the MLP's three bfloat16 Gemms among them) and the slowest
// nodes; the rows add up to the heading's total and their shares to 100%.
TEST_F(TrainCommandTest, ProfileSaysWhereTheStepGoes) {
  const Result r = Train({"--policy", "mixed_bfloat16", "--max-steps", "3", "--profile"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("graph replay    none: kernels are timed one by one"));
  const size_t heading = r.out.find("kernel time per training step (--profile): ");
  ASSERT_NE(heading, std::string::npos) << r.out;
  std::istringstream text(r.out.substr(heading));
  std::string line;
  std::getline(text, line);
  double total_ms = 0;
  int total_nodes = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "kernel time per training step (--profile): %lf ms in %d",
                        &total_ms, &total_nodes),
            2)
      << line;
  EXPECT_GT(total_ms, 0);
  std::getline(text, line);  // column names
  EXPECT_THAT(line, HasSubstr("ms/step"));
  double row_ms = 0, row_share = 0;
  int row_nodes = 0, bf16_gemm_nodes = 0;
  while (std::getline(text, line) && line != "the slowest nodes:") {
    std::istringstream row(line);
    std::string op, dtype, share;
    int nodes = 0;
    double ms = 0;
    ASSERT_TRUE(row >> op >> dtype >> nodes >> ms >> share) << line;
    row_ms += ms;
    row_nodes += nodes;
    row_share += std::stod(share);
    if (op == "Gemm" && dtype == "bfloat16") bf16_gemm_nodes += nodes;
  }
  EXPECT_EQ(line, "the slowest nodes:");
  EXPECT_EQ(row_nodes, total_nodes);
  EXPECT_NEAR(row_ms, total_ms, 0.001 * 40 + 0.01);
  EXPECT_NEAR(row_share, 100.0, 0.1 * 40);
  EXPECT_GE(bf16_gemm_nodes, 3);  // fc1..fc3 forward, at least
  int slowest = 0;
  while (std::getline(text, line) && !line.empty() && line[0] == ' ') ++slowest;
  EXPECT_EQ(slowest, 1 + 15);  // the column names, then the 15 slowest nodes
}

TEST_F(TrainCommandTest, CudaGraphsCanBeTurnedOffAndTakeOnlyAutoOrOff) {
  const Result off = Train({"--max-steps", "1", "--cuda-graphs", "off"});
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_THAT(off.out, HasSubstr("graph replay    off (--cuda-graphs off)"));
  const Result bad = Train({"--max-steps", "1", "--cuda-graphs", "always"});
  EXPECT_NE(bad.code, 0);
  EXPECT_THAT(bad.err, HasSubstr("--cuda-graphs"));
}

// Hyperparameters are finite and in range (NaN included: it passes no
// comparison), --threads is 0..1024: exit 2 naming the flag, before any work.
TEST_F(TrainCommandTest, NumericFlagsAreCheckedBeforeAnyWork) {
  for (const auto& [flag, value, expected] : std::vector<std::tuple<std::string, std::string,
                                                                    std::string>>{
           {"--lr", "nan", "--lr nan: expected a finite number > 0"},
           {"--lr", "-1", "--lr -1: expected a finite number > 0"},
           {"--lr", "0", "--lr 0: expected a finite number > 0"},
           {"--momentum", "nan", "--momentum nan: expected a finite number >= 0"},
           {"--weight-decay", "inf", "--weight-decay inf: expected a finite number >= 0"},
           {"--clip-norm", "-2", "--clip-norm -2: expected a finite number >= 0"},
           {"--gamma", "nan", "--gamma nan: expected a finite number > 0"},
           {"--threads", "100000", "--threads 100000: expected 0 ("}}) {
    const Result r = Train({"--max-steps", "1", flag, value});
    EXPECT_EQ(r.code, 2) << flag << " " << value << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(expected));
  }
}

// --tf32 is a CUDA setting: an error with --backend cpu, a note when auto
// chooses the CPU, and on the summary's backend line on CUDA.
TEST_F(TrainCommandTest, Tf32IsACudaSetting) {
  const Result cpu = Train({"--max-steps", "1", "--tf32", "--backend", "cpu"});
  EXPECT_EQ(cpu.code, 2);
  EXPECT_THAT(cpu.err, HasSubstr("--tf32 applies to the CUDA backend only; --backend is cpu"));
  const Result chosen = Train({"--max-steps", "1", "--tf32"});
  ASSERT_EQ(chosen.code, 0) << chosen.err;
  if (chosen.out.find("backend         cpu") != std::string::npos) {
    EXPECT_THAT(chosen.err, HasSubstr("--tf32 has no effect on the CPU"));
  } else {
    EXPECT_THAT(chosen.out, HasSubstr(", TF32 for float32 MatMul/Gemm/Conv\n"));
  }
}

// Checkpoints record whether TF32 ran (state.extra "tf32"); --resume keeps
// it unless --tf32/--no-tf32 is given, warns when what runs differs (the
// CPU computes float32 exactly) and refuses a record that is not a bool. (Here a checkpoint trained on the CPU is edited to say TF32 ran, as
// one trained with --tf32 on a GPU would.)
// A checkpoint whose state says batch_size 0 (edited and written with
// valid digests) is refused by --resume with exit 2 naming it (the state
// reader range-checks it); it divided by zero (SIGFPE) before.
TEST_F(TrainCommandTest, ResumeRefusesARecordedBatchSizeBelowOne) {
  const std::string ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(Train({"--max-steps", "1", "--checkpoint-dir", ckpt, "--backend", "cpu"}).code, 0);
  absl::StatusOr<training::FoundCheckpoint> saved = training::FindLatestCheckpoint(ckpt);
  ASSERT_TRUE(saved.ok()) << saved.status();
  training::Checkpoint edited = std::move(saved->checkpoint);
  edited.state.batch_size = 0;
  const std::string zero = (dir_ / "batch0.onnx").string();
  ASSERT_TRUE(training::WriteCheckpoint(edited, zero).ok());
  std::ostringstream out, err;
  const int code = RunTrain({"--resume", zero, "--data", data_, "--max-steps", "2", "--backend",
                             "cpu", "--checkpoint-dir", (dir_ / "resumed").string()},
                            out, err);
  EXPECT_EQ(code, 2) << err.str();
  EXPECT_THAT(err.str(), HasSubstr("field 'batch_size' is 0; expected >= 1"));
}

TEST_F(TrainCommandTest, ResumeKeepsTheCheckpointsTf32Setting) {
  const std::string ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(Train({"--max-steps", "1", "--checkpoint-dir", ckpt, "--backend", "cpu"}).code, 0);
  absl::StatusOr<training::FoundCheckpoint> saved = training::FindLatestCheckpoint(ckpt);
  ASSERT_TRUE(saved.ok()) << saved.status();
  const Json* recorded = saved->checkpoint.state.extra.Find("tf32");
  ASSERT_NE(recorded, nullptr);
  EXPECT_TRUE(recorded->is_bool());
  EXPECT_FALSE(recorded->as_bool());

  auto resume = [&](const std::string& from, std::vector<std::string> extra) {
    fs::remove_all(dir_ / "resumed");
    std::vector<std::string> args = {"--resume", from, "--data", data_, "--max-steps", "2",
                                     "--backend", "cpu", "--checkpoint-dir",
                                     (dir_ / "resumed").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    std::ostringstream out, err;
    const int code = RunTrain(args, out, err);
    return Result{code, out.str(), err.str()};
  };
  // The same setting: nothing to say.
  const Result same = resume(saved->path, {});
  ASSERT_EQ(same.code, 0) << same.err;
  EXPECT_THAT(same.err, Not(HasSubstr("TF32")));

  training::Checkpoint edited_checkpoint = std::move(saved->checkpoint);
  edited_checkpoint.state.extra.Set("tf32", Json::Bool(true));
  const std::string with_tf32 = (dir_ / "tf32.onnx").string();
  ASSERT_TRUE(training::WriteCheckpoint(edited_checkpoint, with_tf32).ok());
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{}, {"--no-tf32"}, {"--tf32=false"}}) {
    SCOPED_TRACE(flags.empty() ? "no flag" : flags[0]);
    const Result changed = resume(with_tf32, flags);
    ASSERT_EQ(changed.code, 0) << changed.err;
    EXPECT_THAT(changed.err, HasSubstr("warning: the checkpoint trained with TF32 (--tf32); this "
                                       "run goes on in exact float32 on the CPU"));
    EXPECT_THAT(changed.err, HasSubstr("its checkpoints record TF32 off"));
    // What ran is recorded: exact float32.
    absl::StatusOr<training::FoundCheckpoint> after = training::FindLatestCheckpoint((dir_ / "resumed").string());
    ASSERT_TRUE(after.ok()) << after.status();
    ASSERT_NE(after->checkpoint.state.extra.Find("tf32"), nullptr);
    EXPECT_FALSE(after->checkpoint.state.extra.Find("tf32")->as_bool());
  }

  // A record that is not a bool is refused, naming it.
  edited_checkpoint.state.extra.Set("tf32", Json::String("yes"));
  const std::string malformed = (dir_ / "malformed.onnx").string();
  ASSERT_TRUE(training::WriteCheckpoint(edited_checkpoint, malformed).ok());
  const Result refused = resume(malformed, {});
  EXPECT_EQ(refused.code, 2);
  EXPECT_THAT(refused.err, HasSubstr("records tf32 as \"yes\"; expected true or false"));
}

// --freeze / --train-only: the matching parameters keep their values, get
// no optimizer state, the summary counts them, the checkpoint records the
// pattern and --resume keeps them fixed. mlp_opset17's parameters:
// fc1.weight [512, 784], fc1.bias [512], fc2.* (512 x 512 + 512), fc3.*
// (10 x 512 + 10).
TEST_F(TrainCommandTest, FreezeKeepsMatchingParametersFixed) {
  absl::StatusOr<Model> original =
      LoadModel(std::string(CASTOR_SOURCE_DIR) + "/models/mlp_opset17.onnx");
  ASSERT_TRUE(original.ok()) << original.status();
  auto initializer = [](const Model& model, const std::string& name) {
    const Value* value = model.graph->FindValue(name);
    EXPECT_NE(value, nullptr) << name;
    return value != nullptr && value->initializer() != nullptr ? *value->initializer() : Tensor();
  };
  const std::string ckpt = (dir_ / "ckpt").string();
  const Result r = Train({"--freeze", "^fc1\\.", "--max-steps", "2", "--optimizer", "adam",
                          "--checkpoint-dir", ckpt});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  parameters      4 tensors (267786 elements) train, 2 (401920 "
                               "elements) frozen\n"));
  absl::StatusOr<training::FoundCheckpoint> saved = training::FindLatestCheckpoint(ckpt);
  ASSERT_TRUE(saved.ok()) << saved.status();
  const training::TrainingState& state = saved->checkpoint.state;
  EXPECT_EQ(state.parameters, (std::vector<std::string>{"fc2.weight", "fc2.bias", "fc3.weight",
                                                        "fc3.bias"}));
  EXPECT_EQ(state.moments.count("fc1.weight"), 0u);
  EXPECT_EQ(state.moments.count("fc1.bias"), 0u);
  EXPECT_EQ(state.moments.count("fc2.weight"), 1u);
  ASSERT_NE(state.extra.Find("freeze"), nullptr);
  EXPECT_EQ(state.extra.Find("freeze")->as_string(), "^fc1\\.");
  for (const char* name : {"fc1.weight", "fc1.bias"}) {
    EXPECT_EQ(initializer(saved->checkpoint.model, name), initializer(*original, name)) << name;
  }
  EXPECT_NE(initializer(saved->checkpoint.model, "fc2.weight"),
            initializer(*original, "fc2.weight"));

  // Resumed, they stay fixed; the flag is the checkpoint's to decide.
  std::ostringstream out, err;
  ASSERT_EQ(RunTrain({"--resume", ckpt, "--data", data_, "--max-steps", "3", "--freeze", "fc3"},
                     out, err),
            0)
      << err.str();
  EXPECT_THAT(err.str(), HasSubstr("--freeze is ignored with --resume: the checkpoint decides it"));
  EXPECT_THAT(out.str(), HasSubstr("4 tensors (267786 elements) train, 2 (401920 elements) "
                                   "frozen"));
  absl::StatusOr<training::FoundCheckpoint> resumed = training::FindLatestCheckpoint(ckpt);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->checkpoint.state.step, 3);
  EXPECT_EQ(initializer(resumed->checkpoint.model, "fc1.weight"),
            initializer(*original, "fc1.weight"));

  // --train-only: the complement.
  const Result only = Train({"--train-only", "fc3", "--max-steps", "1"});
  ASSERT_EQ(only.code, 0) << only.err;
  EXPECT_THAT(only.out, HasSubstr("  parameters      2 tensors (5130 elements) train, 4 (664576 "
                                  "elements) frozen\n"));
  // Without the flags, nothing is frozen.
  const Result all = Train({"--max-steps", "1"});
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_THAT(all.out, HasSubstr("6 tensors (669706 elements) train, 0 (0 elements) frozen"));

  // Patterns that match nothing, freeze everything, or do not parse.
  const Result none = Train({"--freeze", "^encoder\\.", "--max-steps", "1"});
  EXPECT_EQ(none.code, 2);
  EXPECT_THAT(none.err, HasSubstr("--freeze '^encoder\\.' matches none of the model's 6 "
                                  "parameters (fc1.weight, fc1.bias, fc2.weight"));
  const Result unmatched = Train({"--train-only", "decoder", "--max-steps", "1"});
  EXPECT_EQ(unmatched.code, 2);
  EXPECT_THAT(unmatched.err, HasSubstr("--train-only 'decoder' matches none"));
  const Result everything = Train({"--freeze", "fc", "--max-steps", "1"});
  EXPECT_EQ(everything.code, 2);
  EXPECT_THAT(everything.err, HasSubstr("leave none of the model's 6 parameters to train"));
  const Result invalid = Train({"--freeze", "fc(", "--max-steps", "1"});
  EXPECT_EQ(invalid.code, 2);
  EXPECT_THAT(invalid.err, HasSubstr("--freeze 'fc(' is not a valid regular expression"));
}

// --loss bce: float multi-label targets shaped like the logits [N, 10]
// (an .npy list here); the evaluation reports the loss and no accuracy.
// Targets of another shape, and float labels for cross-entropy, are refused.
TEST_F(TrainCommandTest, BinaryCrossEntropyTrainsOnFloatTargets) {
  std::vector<std::string> paths;
  for (const auto& [split, n] : {std::pair<std::string, int64_t>{"train", 48}, {"test", 16}}) {
    Tensor targets(DType::kFloat32, {n, 10});
    for (int64_t i = 0; i < n * 10; ++i) targets.data<float>()[i] = (i * 7) % 3 == 0 ? 1.0f : 0.0f;
    const std::string path = (dir_ / (split + "_targets.npy")).string();
    ASSERT_TRUE(training::WriteNpy(path, targets).ok());
    paths.push_back((dir_ / (split + "_x.npy")).string());
    paths.push_back(path);
  }
  const std::string data = absl::StrJoin(paths, ",");
  const std::string metrics = (dir_ / "bce.jsonl").string();
  std::vector<std::string> args = {std::string(CASTOR_SOURCE_DIR) + "/models/mlp_opset17.onnx",
                                   "--data", data, "--batch", "16", "--loss", "bce",
                                   "--max-steps", "3", "--metrics", metrics};
  std::ostringstream out, err;
  ASSERT_EQ(RunTrain(args, out, err), 0) << err.str();
  EXPECT_THAT(out.str(), HasSubstr("eval  epoch 0 step 3: test loss "));
  EXPECT_THAT(out.str(), Not(HasSubstr("accuracy")));
  EXPECT_THAT(err.str(), HasSubstr("acc -"));
  std::ifstream in(metrics);
  std::string line;
  bool evaluated = false;
  while (std::getline(in, line)) {
    absl::StatusOr<Json> json = Json::Parse(line);
    ASSERT_TRUE(json.ok()) << line;
    if (json->Find("test_loss") == nullptr) continue;
    evaluated = true;
    EXPECT_TRUE(json->Find("test_accuracy")->is_null());
    // Random logits near 0 against 1/3 positives: about log(2).
    EXPECT_NEAR(json->Find("test_loss")->as_number(), std::log(2.0), 0.2);
  }
  EXPECT_TRUE(evaluated);

  // Class labels [N] do not fit bce; float targets do not fit cross-entropy.
  const Result labels = Train({"--loss", "bce", "--max-steps", "1"});
  EXPECT_EQ(labels.code, 2);
  EXPECT_THAT(labels.err, HasSubstr("train_y.npy: targets [48] do not fit --loss bce: it takes "
                                    "float targets shaped like the output, [N,10]"));
  std::ostringstream out2, err2;
  args = {std::string(CASTOR_SOURCE_DIR) + "/models/mlp_opset17.onnx", "--data", data,
          "--max-steps", "1"};
  EXPECT_EQ(RunTrain(args, out2, err2), 2);
  EXPECT_THAT(err2.str(), HasSubstr("train_targets.npy: labels are float32; cross-entropy takes "
                                    "integer class indices (float targets: --loss mse or bce)"));
}

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The "loss" field of every step line of a metrics file, as printed (%.9g:
// exact for float32).
std::vector<std::string> StepLosses(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::vector<std::string> losses;
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("\"loss\":");
    if (at != std::string::npos) losses.push_back(line.substr(at, line.find(',', at) - at));
  }
  return losses;
}

struct ResumeCase {
  std::string model, policy, optimizer;
};

// An MLP with Dropout(0.5) in training mode, as torch exports nn.Dropout:
// input [N, 1, 28, 28] -> Flatten -> Gemm 784x16 -> Relu -> Dropout ->
// Gemm 16x10 -> logits. Written to `path`.
void WriteDropoutMlp(const std::string& path) {
  Model model;
  model.ir_version = 8;
  model.opset_imports.push_back({"", 17});
  Graph& g = *model.graph;
  Value* input = *g.AddInput("input", DType::kFloat32,
                             Shape{Dim::Symbol("N"), Dim(1), Dim(28), Dim(28)});
  auto weights = [&](const std::string& name, std::vector<int64_t> dims, float scale) {
    Tensor t(DType::kFloat32, std::move(dims));
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      t.data<float>()[i] = scale * static_cast<float>((i * 37) % 19 - 9);
    }
    return *g.AddInitializer(name, std::move(t));
  };
  Node* flatten = *g.AddNode("Flatten", {input}, {"flat"}, "flatten");
  Node* fc1 = *g.AddNode("Gemm", {flatten->output(0), weights("fc1.weight", {16, 784}, 1e-4f),
                                  weights("fc1.bias", {16}, 1e-2f)},
                         {"fc1"}, "fc1");
  fc1->SetAttribute(Attribute::Int("transB", 1));
  Node* relu = *g.AddNode("Relu", {fc1->output(0)}, {"relu"}, "relu");
  Value* ratio = *g.AddInitializer("ratio", Tensor::Scalar(0.5f));
  Tensor yes(DType::kBool, {});
  yes.data<uint8_t>()[0] = 1;
  Value* training = *g.AddInitializer("training_mode", std::move(yes));
  Node* dropout =
      *g.AddNode("Dropout", {relu->output(0), ratio, training}, {"dropped", "mask"}, "dropout");
  Node* fc2 = *g.AddNode("Gemm", {dropout->output(0), weights("fc2.weight", {10, 16}, 1e-2f),
                                  weights("fc2.bias", {10}, 1e-2f)},
                         {"logits"}, "fc2");
  fc2->SetAttribute(Attribute::Int("transB", 1));
  g.AddOutput(fc2->output(0));
  ASSERT_TRUE(InferTypes(model).ok());
  ASSERT_TRUE(SaveModel(model, path).ok());
}

class TrainResumeTest : public TrainCommandTest,
                        public ::testing::WithParamInterface<ResumeCase> {};

// Training 6 steps equals training 3, saving, resuming and training 3 more:
// the step-6 checkpoints are the same bytes (weights, BN statistics,
// optimizer moments, loss-scaler state, data position) and every step's loss
// is the same float.
TEST_P(TrainResumeTest, ResumeIsBitExact) {
  const ResumeCase& c = GetParam();
  std::string model = std::string(CASTOR_SOURCE_DIR) + "/models/" + c.model + ".onnx";
  const bool dropout = c.model == "dropout_mlp";
  if (dropout) {
    model = (dir_ / "dropout_mlp.onnx").string();
    WriteDropoutMlp(model);
  }
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--data", data_, "--batch", "16", "--policy", c.policy,
                                     "--optimizer", c.optimizer, "--momentum",
                                     c.optimizer == "sgd" ? "0.9" : "0", "--lr", "0.01",
                                     "--threads", "1", "--epochs", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::ostringstream out, err;
    const int code = RunTrain(args, out, err);
    EXPECT_EQ(code, 0) << err.str();
    return out.str();
  };
  const fs::path a = dir_ / "a", b = dir_ / "b";
  run({model, "--max-steps", "6", "--checkpoint-dir", a.string(), "--save-every", "3",
       "--metrics", (dir_ / "a.jsonl").string()});
  run({model, "--max-steps", "3", "--checkpoint-dir", b.string(), "--metrics",
       (dir_ / "b.jsonl").string()});
  {
    // What a crash after step 3's checkpoint leaves: a later step's line
    // and a torn one. The resumed run drops both.
    std::ofstream metrics(dir_ / "b.jsonl", std::ios::app);
    metrics << "{\"step\":4,\"loss\":9.5}\n{\"step\":5,\"lo";
  }
  const std::string resumed = run({"--resume", b.string(), "--max-steps", "6", "--checkpoint-dir",
                                   b.string(), "--metrics", (dir_ / "b.jsonl").string()});
  EXPECT_THAT(resumed, HasSubstr("resuming from " + (b / "ckpt-00000003.onnx").string() +
                                 ": step 3, epoch 1, policy " + c.policy));
  const std::string straight = Slurp(a / "ckpt-00000006.onnx");
  ASSERT_GT(straight.size(), 10000u);
  EXPECT_TRUE(straight == Slurp(b / "ckpt-00000006.onnx"));
  const std::vector<std::string> losses = StepLosses(dir_ / "a.jsonl");
  EXPECT_EQ(losses.size(), 6u);
  EXPECT_EQ(losses, StepLosses(dir_ / "b.jsonl"));
  if (!dropout) return;

  // The checkpoint records Dropout's RNG state: the run's seed and 3 draws.
  absl::StatusOr<training::Checkpoint> third =
      training::ReadCheckpoint((b / "ckpt-00000003.onnx").string());
  ASSERT_TRUE(third.ok()) << third.status();
  const Json* rng = third->state.extra.Find("rng");
  ASSERT_NE(rng, nullptr);
  EXPECT_EQ(rng->Dump(), "{\"seed\":0,\"counter\":3}");
  // A checkpoint from before the RNG state was recorded (no "rng") resumes
  // with the run's seed and its step as the counter: for a run this castor
  // started, the same masks, so the same bytes at step 6.
  training::Checkpoint older = *std::move(third);
  Json extra = Json::Object();
  for (const auto& [key, value] : older.state.extra.members()) {
    if (key != "rng") extra.Set(key, value);
  }
  older.state.extra = extra;
  const fs::path c_dir = dir_ / "c";
  fs::create_directories(c_dir);
  ASSERT_TRUE(training::WriteCheckpoint(older, (c_dir / "ckpt-00000003.onnx").string()).ok());
  run({"--resume", c_dir.string(), "--max-steps", "6", "--checkpoint-dir", c_dir.string()});
  EXPECT_TRUE(straight == Slurp(c_dir / "ckpt-00000006.onnx"));
  // A malformed record is refused, naming it.
  older.state.extra.Set("rng", Json::String("lucky"));
  const fs::path d_dir = dir_ / "d";
  fs::create_directories(d_dir);
  ASSERT_TRUE(training::WriteCheckpoint(older, (d_dir / "ckpt-00000003.onnx").string()).ok());
  std::ostringstream out, err;
  EXPECT_EQ(RunTrain({"--resume", d_dir.string(), "--data", data_, "--max-steps", "6"}, out, err),
            2);
  EXPECT_THAT(err.str(), HasSubstr("records rng as \"lucky\""));
}

INSTANTIATE_TEST_SUITE_P(
    Models, TrainResumeTest,
    ::testing::Values(ResumeCase{"mlp_opset17", "mixed_float16", "adam"},
                      ResumeCase{"resnet_opset17", "mixed_bfloat16", "sgd"},
                      ResumeCase{"dropout_mlp", "mixed_float16", "adam"}),
    [](const ::testing::TestParamInfo<ResumeCase>& info) {
      return info.param.model.substr(0, info.param.model.find('_')) + "_" + info.param.optimizer;
    });

TEST_F(TrainCommandTest, ResumeUnderAnotherPolicyIsRefusedUnlessAllowed) {
  const std::string ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(Train({"--policy", "mixed_bfloat16", "--max-steps", "2", "--checkpoint-dir", ckpt})
                .code,
            0);
  std::ostringstream out, err;
  int code = RunTrain({"--resume", ckpt, "--data", data_, "--policy", "mixed_float16",
                       "--epochs", "2", "--max-steps", "3"},
                      out, err);
  EXPECT_EQ(code, 1);
  EXPECT_THAT(err.str(), HasSubstr("was trained under policy 'mixed_bfloat16'"));
  EXPECT_THAT(err.str(), HasSubstr("the requested policy 'mixed_float16'"));
  EXPECT_THAT(err.str(), HasSubstr("--allow-policy-change"));

  std::ostringstream out2, err2;
  code = RunTrain({"--resume", ckpt, "--data", data_, "--policy", "mixed_float16", "--epochs",
                   "2", "--max-steps", "3", "--allow-policy-change", "--checkpoint-dir", ckpt},
                  out2, err2);
  EXPECT_EQ(code, 0) << err2.str();
  // The run goes on under the new policy, loss scaling switched on, and
  // saves a consistent checkpoint recording it.
  EXPECT_THAT(out2.str(), HasSubstr("loss scaling on"));
  absl::StatusOr<training::FoundCheckpoint> saved = training::FindLatestCheckpoint(ckpt);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->checkpoint.state.step, 3);
  EXPECT_EQ(saved->checkpoint.policy.name(), "mixed_float16");
  EXPECT_TRUE(saved->skipped.empty());
  EXPECT_TRUE(training::FindCheckpointInconsistencies(saved->checkpoint).empty());
  EXPECT_THAT(out2.str(), HasSubstr("policy change mixed_bfloat16 -> mixed_float16 "
                                    "(--allow-policy-change): 5 nodes change dtype"));
  EXPECT_THAT(out2.str(), HasSubstr("node '/fc1/Gemm' (Gemm): bfloat16 -> float16"));
  EXPECT_THAT(out2.str(), HasSubstr("policy mixed_float16 (float16 compute)"));
}

TEST_F(TrainCommandTest, ResumeSkipsACorruptNewestCheckpointAndPrunes) {
  const fs::path ckpt = dir_ / "ckpt";
  ASSERT_EQ(Train({"--epochs", "2", "--max-steps", "4", "--checkpoint-dir", ckpt.string(),
                   "--save-every", "1",
                   "--keep", "2"})
                .code,
            0);
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(ckpt)) files.push_back(entry.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"ckpt-00000003.onnx", "ckpt-00000004.onnx"}));
  fs::resize_file(ckpt / "ckpt-00000004.onnx", 1000);  // a torn copy
  std::ostringstream out, err;
  const int code =
      RunTrain({"--resume", ckpt.string(), "--data", data_, "--epochs", "2", "--max-steps", "5"},
               out, err);
  EXPECT_EQ(code, 0) << err.str();
  EXPECT_THAT(err.str(), HasSubstr("ckpt-00000004.onnx"));
  EXPECT_THAT(out.str(), HasSubstr("ckpt-00000003.onnx: step 3"));
  EXPECT_THAT(out.str(), HasSubstr("steps           5, 0 skipped"));
  // The torn file was moved aside, not deleted, and the run saved into the
  // directory it resumed from.
  EXPECT_TRUE(fs::exists(ckpt / "ckpt-00000004.onnx.broken"));
  EXPECT_TRUE(fs::exists(ckpt / "ckpt-00000005.onnx"));
}

TEST_F(TrainCommandTest, ResumingAnOlderCheckpointIntoItsDirectoryIsRefused) {
  const fs::path ckpt = dir_ / "ckpt";
  ASSERT_EQ(Train({"--epochs", "2", "--max-steps", "4", "--checkpoint-dir", ckpt.string(),
                   "--save-every", "2"})
                .code,
            0);
  std::ostringstream out, err;
  const std::string older = (ckpt / "ckpt-00000002.onnx").string();
  EXPECT_EQ(RunTrain({"--resume", older, "--data", data_, "--epochs", "2", "--checkpoint-dir",
                      ckpt.string()},
                     out, err),
            2);
  EXPECT_THAT(err.str(), HasSubstr("ckpt-00000004.onnx, later than the resumed step 2"));
  // A fresh run into a directory of another run's checkpoints is refused too.
  EXPECT_EQ(Train({"--checkpoint-dir", ckpt.string()}).code, 2);
  EXPECT_THAT(Train({"--checkpoint-dir", ckpt.string()}).err,
              HasSubstr("later than the start of this fresh run"));
  // Into another directory the branch is fine.
  std::ostringstream out2, err2;
  EXPECT_EQ(RunTrain({"--resume", older, "--data", data_, "--epochs", "2", "--checkpoint-dir",
                      (dir_ / "branch").string()},
                     out2, err2),
            0)
      << err2.str();
}

// Without a usable GPU, --backend cuda is refused saying why and --backend
// auto trains on the CPU saying why; with one, both train on it.
TEST_F(TrainCommandTest, BackendChoice) {
  const CudaProbe probe = ProbeCuda();
  Result cuda = Train({"--backend", "cuda", "--max-steps", "1"});
  Result automatic = Train({"--backend", "auto", "--max-steps", "1"});
  ASSERT_EQ(automatic.code, 0) << automatic.err;
  if (probe.usable) {
    ASSERT_EQ(cuda.code, 0) << cuda.err;
    EXPECT_THAT(cuda.out, HasSubstr("backend cuda:0 ("));
    EXPECT_THAT(automatic.out, HasSubstr("backend cuda:0 ("));
    return;
  }
  EXPECT_EQ(cuda.code, 2);
  EXPECT_THAT(cuda.err, HasSubstr("castor train: error: --backend cuda: "));
  EXPECT_THAT(cuda.err, HasSubstr(probe.compiled ? "no usable GPU" : "not compiled in"));
  EXPECT_THAT(automatic.err, HasSubstr("castor train: --backend auto chose the CPU: "));
  EXPECT_THAT(automatic.out, HasSubstr(", backend cpu ("));
  Result cpu = Train({"--backend", "cpu", "--max-steps", "1"});
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  EXPECT_THAT(cpu.err, Not(HasSubstr("--backend")));
}

// castor copied without its CUDA backend module (libcastor_cuda.so) still
// trains on the CPU, and says the module is missing where CUDA comes up:
// --version, --backend auto's choice, --backend cuda's refusal.
TEST_F(TrainCommandTest, TrainsOnTheCpuWithoutTheCudaModule) {
  if (!CudaBackendCompiled()) GTEST_SKIP() << "castor was built without the CUDA backend";
  fs::create_directories(dir_ / "alone");
  const fs::path alone = fs::canonical(dir_ / "alone");  // as /proc/self/exe names it
  fs::copy_file(CASTOR_BINARY, alone / "castor");
  const std::string binary = (alone / "castor").string();
  const std::string missing =
      absl::StrCat("the CUDA backend module libcastor_cuda.so is missing (looked for ",
                   (alone / "libcastor_cuda.so").string(), ")");
  Program version = RunCastor(dir_, "--version", binary);
  EXPECT_EQ(version.exit_code, 0) << version.err;
  EXPECT_THAT(version.out, HasSubstr("CUDA backend: compiled, no usable GPU (" + missing + ")"));
  const std::string train = absl::StrCat("train ", CASTOR_SOURCE_DIR,
                                         "/models/mlp_opset17.onnx --data ", data_,
                                         " --batch 16 --max-steps 1 --backend ");
  Program automatic = RunCastor(dir_, train + "auto", binary);
  ASSERT_EQ(automatic.exit_code, 0) << automatic.err;
  EXPECT_THAT(automatic.err, HasSubstr("--backend auto chose the CPU: "));
  EXPECT_THAT(automatic.err, HasSubstr(missing));
  EXPECT_THAT(automatic.out, HasSubstr(", backend cpu ("));
  Program cuda = RunCastor(dir_, train + "cuda", binary);
  EXPECT_EQ(cuda.exit_code, 2);
  EXPECT_THAT(cuda.err, HasSubstr(missing));
}

TEST_F(TrainCommandTest, FlagErrorsAreExit2) {
  Result r = Train({"--output", "probs"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--output 'probs' is not a model output"));
  r = Train({"--epochs", "0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--batch, --epochs and --step-size must be >= 1"));
  r = Train({"--policy", "mixed_float8"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("mixed_float8"));
  r = Train({"--allow-policy-change"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--allow-policy-change only applies with --resume"));
  std::ostringstream missing_out, missing_err;
  EXPECT_EQ(RunTrain({"--resume", (dir_ / "nothing").string(), "--data", data_}, missing_out,
                     missing_err),
            2);
  EXPECT_THAT(missing_err.str(), HasSubstr("--resume: "));
  std::ostringstream out, err;
  EXPECT_EQ(RunTrain({"--help"}, out, err), 0);
  EXPECT_THAT(out.str(), HasSubstr("--loss-scaling"));
}

}  // namespace
}  // namespace castor::tools
