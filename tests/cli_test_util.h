// Test helpers for the `castor` subcommands: run one (in-process or as the
// built binary) and capture its exit code, stdout and stderr; read a file
// whole; a fixture with a fresh temp dir per test; random image data for
// `castor train --data`; what a training run wrote (its metrics' losses, a
// checkpoint's weights) and whether two runs trained alike.
//
//   class RunProgramTest : public CliTempDirTest {
//    protected:
//     RunProgramTest() : CliTempDirTest("run") {}
//   };
//   Program p = RunCastor(dir_, "run model.onnx --input x=x.npy");
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "graph/json.h"
#include "graph/tensor.h"
#include "training/checkpoint.h"
#include "training/npy.h"

namespace castor::tools {

// What one run of a subcommand did.
struct Program {
  int exit_code = -1;
  std::string out, err;
};

// The whole file at `path` ("" when it cannot be read).
inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Runs a subcommand in-process: `command` is its entry point (e.g.
// RunConvert), given `args` and streams that capture stdout and stderr.
inline Program RunCommand(int (*command)(const std::vector<std::string>&, std::ostream&,
                                         std::ostream&),
                          const std::vector<std::string>& args) {
  std::ostringstream out, err;
  Program program;
  program.exit_code = command(args, out, err);
  program.out = out.str();
  program.err = err.str();
  return program;
}

// Runs the built `castor` binary (or `binary`) with `arguments` (shell
// words, e.g. "run model.onnx --verbose"); stdout and stderr pass through
// `dir`/out.txt and `dir`/err.txt.
inline Program RunCastor(const std::filesystem::path& dir, const std::string& arguments,
                         const std::string& binary = CASTOR_BINARY) {
  const std::filesystem::path out = dir / "out.txt", err = dir / "err.txt";
  const std::string command = binary + " " + arguments + " >" +
                              out.string() + " 2>" + err.string();
  const int status = std::system(command.c_str());
  return Program{WEXITSTATUS(status), ReadFile(out), ReadFile(err)};
}

// A fixture whose tests each get an empty dir_ (under the system temp dir,
// named after `prefix`, the process and the test), removed afterwards.
// A subclass that overrides SetUp calls CliTempDirTest::SetUp() first.
class CliTempDirTest : public ::testing::Test {
 protected:
  explicit CliTempDirTest(std::string prefix) : prefix_(std::move(prefix)) {}

  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("castor_" + prefix_ + "_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

// Writes dir/SPLIT_x.npy (uint8 [n, 28, 28], pixels drawn from `rng`) and
// dir/SPLIT_y.npy (int64 [n], label i = (i * label_step) % 10): one split
// as `castor train --data X,Y[,TEST_X,TEST_Y]` reads it.
inline void WriteImageSplit(const std::filesystem::path& dir, const std::string& split,
                            int64_t n, int64_t label_step, std::mt19937& rng) {
  std::uniform_int_distribution<int> pixel(0, 255);
  Tensor images(DType::kUInt8, {n, 28, 28});
  for (int64_t i = 0; i < images.num_elements(); ++i) images.data<uint8_t>()[i] = pixel(rng);
  Tensor labels(DType::kInt64, {n});
  for (int64_t i = 0; i < n; ++i) labels.data<int64_t>()[i] = (i * label_step) % 10;
  ASSERT_TRUE(training::WriteNpy((dir / (split + "_x.npy")).string(), images).ok());
  ASSERT_TRUE(training::WriteNpy((dir / (split + "_y.npy")).string(), labels).ok());
}

// The "loss" of every step line of a `castor train --metrics` file, in order.
inline std::vector<double> MetricsLosses(const std::filesystem::path& metrics) {
  std::vector<double> losses;
  for (absl::string_view line : absl::StrSplit(ReadFile(metrics), '\n')) {
    absl::StatusOr<Json> json = Json::Parse(std::string(line));
    if (!json.ok() || json->Find("loss") == nullptr) continue;
    losses.push_back(json->Find("loss")->as_number());
  }
  return losses;
}

// The float32 weights of a checkpoint by name (a checkpoint that cannot be
// read fails the test and gives none).
inline std::map<std::string, Tensor> CheckpointWeights(const std::filesystem::path& path) {
  std::map<std::string, Tensor> weights;
  absl::StatusOr<training::Checkpoint> checkpoint = training::ReadCheckpoint(path.string());
  EXPECT_TRUE(checkpoint.ok()) << path << ": " << checkpoint.status();
  if (!checkpoint.ok()) return weights;
  for (const std::string& name : checkpoint->state.parameters) {
    const Value* value = checkpoint->model.graph->FindValue(name);
    if (value != nullptr && value->initializer() != nullptr) {
      weights[name] = *value->initializer();
    }
  }
  return weights;
}

// Two runs that should train alike (one process and a data-parallel group
// on the same global batches): `steps` losses each, step by step within
// 1e-6 relative, and the weights of their checkpoints within 1e-5.
inline void ExpectSameTraining(const std::filesystem::path& metrics,
                               const std::filesystem::path& checkpoint,
                               const std::filesystem::path& other_metrics,
                               const std::filesystem::path& other_checkpoint, size_t steps) {
  const std::vector<double> expected = MetricsLosses(metrics);
  const std::vector<double> losses = MetricsLosses(other_metrics);
  ASSERT_EQ(expected.size(), steps);
  ASSERT_EQ(losses.size(), steps);
  for (size_t k = 0; k < losses.size(); ++k) {
    EXPECT_NEAR(losses[k], expected[k], 1e-6 * std::abs(expected[k])) << "step " << k + 1;
  }
  const std::map<std::string, Tensor> expected_weights = CheckpointWeights(checkpoint);
  const std::map<std::string, Tensor> weights = CheckpointWeights(other_checkpoint);
  ASSERT_FALSE(expected_weights.empty());
  ASSERT_EQ(weights.size(), expected_weights.size());
  for (const auto& [name, expected_weight] : expected_weights) {
    const Tensor& weight = weights.at(name);
    for (int64_t i = 0; i < weight.num_elements(); ++i) {
      ASSERT_NEAR(weight.data<float>()[i], expected_weight.data<float>()[i], 1e-5) << name;
    }
  }
}

}  // namespace castor::tools
