// `castor run` tests: the helpers (output summary, NAME=FILE parsing, output
// file names) and the program on an Identity-chain model written to a temp
// dir: .npy and .pb inputs, the summary and plan lines, --output-dir files,
// and exit 2 for missing, unknown or mistyped inputs.
#include "tools/run_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "graph/onnx_io.h"
#include "tests/cli_test_util.h"
#include "training/npy.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(RunHelpersTest, SummaryShowsTypeAndStatistics) {
  Tensor t = Tensor::FromVector<float>(DType::kFloat32, {2, 2}, {1.0f, -3.0f, std::nanf(""), 5.0f});
  EXPECT_EQ(SummarizeTensor("logits", t), "logits  float32[2,2]  min=-3 max=5 mean=1 nan=1");
  Tensor b = Tensor::FromVector<uint8_t>(DType::kBool, {4}, {1, 0, 0, 0});
  EXPECT_EQ(SummarizeTensor("mask", b), "mask  bool[4]  min=0 max=1 mean=0.25");
  EXPECT_EQ(SummarizeTensor("e", Tensor(DType::kInt64, {0})), "e  int64[0]  (no numbers)");
}

TEST(RunHelpersTest, InputFlagsAndOutputFileNames) {
  auto parsed = ParseInputFlag("x=data/a=b.npy");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->first, "x");
  EXPECT_EQ(parsed->second, "data/a=b.npy");
  EXPECT_THAT(std::string(ParseInputFlag("x.npy").status().message()),
              HasSubstr("--input 'x.npy': expected NAME=FILE"));
  EXPECT_FALSE(ParseInputFlag("=x.npy").ok());
  EXPECT_EQ(OutputFileName("logits:0/out"), "logits_0_out");
  EXPECT_EQ(OutputFileName(".."), "_..");
}

class RunProgramTest : public CliTempDirTest {
 protected:
  RunProgramTest() : CliTempDirTest("run") {}

  void SetUp() override {
    CliTempDirTest::SetUp();
    // y = Identity(Identity(x)), x float32[N,3]; z = Identity(k), k int64[2] with a default.
    Model model;
    model.ir_version = 8;
    model.opset_imports.push_back({"", 17});
    Graph& g = *model.graph;
    Value* x = *g.AddInput("x", DType::kFloat32, Shape{Dim::Symbol("N"), Dim(3)});
    Value* k = *g.AddInput("k", DType::kInt64, Shape{2});
    g.SetInitializerOfInput(k, Tensor::Int64s({7, 8}));
    Node* a = *g.AddNode("Identity", {x}, {"a"}, "first");
    Node* y = *g.AddNode("Identity", {a->output(0)}, {"y"}, "second");
    Node* z = *g.AddNode("Identity", {k}, {"z"}, "third");
    g.AddOutput(y->output(0));
    g.AddOutput(z->output(0));
    model_path_ = (dir_ / "model.onnx").string();
    ASSERT_TRUE(SaveModel(model, model_path_).ok());
    x_ = Tensor::FromVector<float>(DType::kFloat32, {2, 3}, {1, 2, 3, 4, 5, 6});
    ASSERT_TRUE(training::WriteNpy((dir_ / "x.npy").string(), x_).ok());
  }

  Program Run(const std::string& flags) {
    return RunCastor(dir_, "run " + model_path_ + " " + flags);
  }

  std::string model_path_;
  Tensor x_;
};

TEST_F(RunProgramTest, PrintsSummaryAndWritesOutputs) {
  const fs::path out_dir = dir_ / "outputs";
  Program p = Run("--input x=" + (dir_ / "x.npy").string() + " --output-dir " + out_dir.string());
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_THAT(p.out, AllOf(StartsWith("y  float32[2,3]  min=1 max=6 mean=3.5\n"
                                      "z  int64[2]  min=7 max=8 mean=7.5\n"),
                           HasSubstr("plan: peak activations ")));
  absl::StatusOr<Tensor> y = training::ReadNpy((out_dir / "y.npy").string());
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(*y, x_);
  absl::StatusOr<Tensor> z = training::ReadNpy((out_dir / "z.npy").string());
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(*z, Tensor::Int64s({7, 8}));
}

TEST_F(RunProgramTest, OverridesDefaultsFromPbFiles) {
  std::ofstream(dir_ / "k.pb", std::ios::binary)
      << TensorToProto(Tensor::Int64s({-1, 1}), "k").SerializeAsString();
  Program p =
      Run("--input x=" + (dir_ / "x.npy").string() + " --input k=" + (dir_ / "k.pb").string());
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_THAT(p.out, HasSubstr("z  int64[2]  min=-1 max=1 mean=0\n"));
  EXPECT_FALSE(fs::exists(dir_ / "y.npy"));  // no --output-dir: summary only
}

TEST_F(RunProgramTest, BadInputsExit2WithClearMessages) {
  Program p = Run("");
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("missing feed for graph input 'x' (float32[N,3])"));
  EXPECT_EQ(p.out, "");
  p = Run("--input x=" + (dir_ / "x.npy").string() + " --input w=" + (dir_ / "x.npy").string());
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("unknown feed 'w': the graph inputs are x, k"));
  ASSERT_TRUE(training::WriteNpy((dir_ / "wide.npy").string(), Tensor(DType::kFloat32, {2, 4})).ok());
  p = Run("--input x=" + (dir_ / "wide.npy").string());
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("input 'x': dim 1 is 4, the model expects 3"));
  p = Run("--input x=" + (dir_ / "nothere.npy").string());
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("nothere.npy: cannot open file"));
  p = Run("--input x");
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("expected NAME=FILE"));
}

TEST_F(RunProgramTest, HelpExplainsFlagsAndBFloat16) {
  Program p = Run("--help");
  EXPECT_EQ(p.exit_code, 0);
  EXPECT_THAT(p.out, AllOf(HasSubstr("--input NAME=FILE"), HasSubstr("--output-dir DIR"),
                           HasSubstr("--threads N"),
                           HasSubstr("bfloat16 outputs are written as "
                                     "float32"),
                           HasSubstr("examples:")));
}

}  // namespace
}  // namespace castor::tools
