// `castor train` in-process on a tiny .npy dataset (48 train, 16 test
// images, labels 0..9): the header, progress, evaluation and summary lines,
// the JSONL metrics (one object per step and per evaluation, with the
// fields the issue names), loss scaling on for mixed_float16 and off for
// mixed_bfloat16, and the flag errors.
#include "tools/train_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "graph/json.h"
#include "tools/npy.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TrainCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("castor_train_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> pixel(0, 255);
    for (const auto& [split, n] : {std::pair<std::string, int64_t>{"train", 48}, {"test", 16}}) {
      Tensor images(DType::kUInt8, {n, 28, 28});
      for (int64_t i = 0; i < images.num_elements(); ++i) images.data<uint8_t>()[i] = pixel(rng);
      Tensor labels(DType::kInt64, {n});
      for (int64_t i = 0; i < n; ++i) labels.data<int64_t>()[i] = i % 10;
      ASSERT_TRUE(WriteNpy((dir_ / (split + "_x.npy")).string(), images).ok());
      ASSERT_TRUE(WriteNpy((dir_ / (split + "_y.npy")).string(), labels).ok());
    }
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

  std::ifstream in(metrics);
  std::string line;
  int steps = 0, evaluations = 0;
  while (std::getline(in, line)) {
    absl::StatusOr<Json> json = Json::Parse(line);
    ASSERT_TRUE(json.ok()) << line;
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
    EXPECT_EQ(json->Find("step")->as_int(), steps);
    EXPECT_EQ(json->Find("loss_scale")->as_number(), 65536.0);
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(evaluations, 2);
}

TEST_F(TrainCommandTest, BFloat16TrainsWithoutLossScaling) {
  const Result r = Train({"--policy", "mixed_bfloat16", "--max-steps", "2", "--optimizer", "sgd",
                          "--lr", "0.1", "--momentum", "0.9"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 steps, loss scaling off"));
  EXPECT_THAT(r.out, HasSubstr("loss scale      1 (final)"));
}

TEST_F(TrainCommandTest, FlagErrorsAreExit2) {
  Result r = Train({"--backend", "cuda"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--backend cuda: the CUDA training backend is not built yet"));
  r = Train({"--output", "probs"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--output 'probs' is not a model output"));
  r = Train({"--epochs", "0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--batch and --epochs must be >= 1"));
  std::ostringstream out, err;
  EXPECT_EQ(RunTrain({"--help"}, out, err), 0);
  EXPECT_THAT(out.str(), HasSubstr("--loss-scaling"));
}

}  // namespace
}  // namespace castor::tools
