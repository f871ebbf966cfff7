// kill -9 of a real `castor train` process that saves a checkpoint every
// step, 25 times, each at a random moment after the run saved its first
// new checkpoint: after every kill the checkpoint directory's newest
// checkpoint reads, its digests match and it is consistent (no torn file is
// ever taken, none needs skipping), and the next run resumes from it and
// gets further. How many kills tore a
// save (left its temporary file) is recorded, not asserted: about 1 in 10
// here. tests/checkpoint_test.cc kills a writer that does nothing but save,
// 200 times, for certain coverage of torn writes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "training/checkpoint.h"
#include "tests/cli_test_util.h"
#include "training/npy.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;

class TrainCrashTest : public CliTempDirTest {
 protected:
  TrainCrashTest() : CliTempDirTest("train_crash") {}

  void SetUp() override {
    CliTempDirTest::SetUp();
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> pixel(0, 255);
    Tensor images(DType::kUInt8, {64, 28, 28});
    for (int64_t i = 0; i < images.num_elements(); ++i) images.data<uint8_t>()[i] = pixel(rng);
    Tensor labels(DType::kInt64, {64});
    for (int64_t i = 0; i < 64; ++i) labels.data<int64_t>()[i] = i % 10;
    ASSERT_TRUE(training::WriteNpy((dir_ / "x.npy").string(), images).ok());
    ASSERT_TRUE(training::WriteNpy((dir_ / "y.npy").string(), labels).ok());
  }

  // Starts `castor train` (fresh, or resuming from the checkpoint dir) with
  // a checkpoint every step; returns its pid.
  pid_t StartTraining(bool resume) {
    const std::string data = (dir_ / "x.npy").string() + "," + (dir_ / "y.npy").string();
    const std::string model = std::string(CASTOR_SOURCE_DIR) + "/models/mlp_opset17.onnx";
    const std::string checkpoints = (dir_ / "ckpt").string();
    std::vector<std::string> args = {CASTOR_BINARY, "train"};
    if (resume) {
      args.insert(args.end(), {"--resume", checkpoints});
    } else {
      args.insert(args.end(), {model, "--policy", "mixed_float16", "--batch", "16"});
    }
    args.insert(args.end(), {"--data", data, "--epochs", "100000", "--checkpoint-dir",
                             checkpoints, "--save-every", "1", "--keep", "2", "--threads", "1"});
    const pid_t child = fork();
    if (child == 0) {
      // Quiet child: its output would interleave with the test log.
      freopen("/dev/null", "w", stdout);
      freopen("/dev/null", "w", stderr);
      std::vector<char*> argv;
      for (std::string& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    return child;
  }
};

TEST_F(TrainCrashTest, KillDuringTrainingAlwaysLeavesAUsableCheckpoint) {
  constexpr int kKills = 25;
  std::mt19937 rng(11);
  // Each run is killed at a random moment after it saved its first new
  // checkpoint (so every run makes progress however loaded the machine is),
  // somewhere in the following steps and saves.
  std::uniform_int_distribution<int> delay_ms(0, 400);
  const fs::path ckpt = dir_ / "ckpt";
  auto newest_step = [&]() -> int64_t {
    if (!fs::exists(ckpt)) return 0;
    absl::StatusOr<std::vector<training::CheckpointFile>> files = training::ListCheckpoints(ckpt.string());
    return files.ok() && !files->empty() ? files->back().step : 0;
  };
  int64_t last_step = 0;
  int torn_saves = 0;  // kills that landed in the middle of a save
  for (int kill_index = 0; kill_index < kKills; ++kill_index) {
    const pid_t child = StartTraining(/*resume=*/last_step > 0);
    ASSERT_GT(child, 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (newest_step() <= last_step && std::chrono::steady_clock::now() < deadline &&
           waitpid(child, nullptr, WNOHANG) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ASSERT_EQ(kill(child, SIGKILL), 0) << "kill " << kill_index << ": the run ended by itself";
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "kill " << kill_index << ": the run ended by itself";
    for (const auto& entry : fs::directory_iterator(ckpt)) {
      torn_saves += entry.path().filename().string().find(".tmp.") != std::string::npos;
    }
    absl::StatusOr<training::FoundCheckpoint> found = training::FindLatestCheckpoint(ckpt.string());
    ASSERT_TRUE(found.ok()) << "kill " << kill_index << ": " << found.status();
    EXPECT_THAT(found->skipped, ::testing::IsEmpty()) << "kill " << kill_index;
    EXPECT_THAT(training::FindCheckpointInconsistencies(found->checkpoint), ::testing::IsEmpty());
    // Every run saved at least one checkpoint past the one it resumed.
    ASSERT_GT(found->checkpoint.state.step, last_step) << "kill " << kill_index;
    last_step = found->checkpoint.state.step;
  }
  ::testing::Test::RecordProperty("torn_saves", torn_saves);
  ::testing::Test::RecordProperty("last_step", static_cast<int>(last_step));
  // The newest checkpoint also passes `castor verify`.
  const std::vector<training::CheckpointFile> files = *training::ListCheckpoints((dir_ / "ckpt").string());
  ASSERT_FALSE(files.empty());
  const Program verify = RunCastor(dir_, "verify " + files.back().path);
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
}

}  // namespace
}  // namespace castor::tools
