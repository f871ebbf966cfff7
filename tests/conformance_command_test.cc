// `castor conformance` tests: the comparison rules (dtype/shape exact,
// rtol/atol, NaN placement, infinities, exact ints and bool), the
// expected-failures parser, and the program on synthetic cases written to a
// temp dir (pass, near miss, far miss, NaN moved, wrong dtype/shape; expected
// failures, an unexpected pass, an unknown listed case, --filter).
// The synthetic models use only Identity, so they need just that CPU kernel.
#include "tools/conformance_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "backend/cuda_probe.h"
#include "graph/onnx_io.h"
#include "tests/cli_test_util.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

Tensor Floats(std::vector<int64_t> dims, std::vector<float> values) {
  return Tensor::FromVector<float>(DType::kFloat32, std::move(dims), values);
}

std::string CompareMessage(const Tensor& expected, const Tensor& actual) {
  return std::string(CompareTensors(expected, actual).message());
}

TEST(CompareTensorsTest, ToleranceIsAtolPlusRtolTimesExpected) {
  const Tensor expected = Floats({3}, {1000.0f, 1.0f, 0.0f});
  EXPECT_TRUE(CompareTensors(expected, Floats({3}, {1000.9f, 1.0009f, 0.0f})).ok());
  EXPECT_TRUE(CompareTensors(expected, Floats({3}, {1000.0f, 1.0f, 9e-8f})).ok());
  EXPECT_THAT(CompareMessage(expected, Floats({3}, {1001.2f, 1.0f, 0.0f})),
              HasSubstr("1 of 3 elements differ (rtol=0.001, atol=1e-07); first at [0]: "
                        "expected 1000, got 1001.2"));
  EXPECT_THAT(CompareMessage(expected, Floats({3}, {1000.0f, 1.0f, 2e-7f})),
              HasSubstr("first at [2]: expected 0, got 2.00000002e-07"));
  EXPECT_THAT(CompareMessage(Floats({2, 2}, {1, 2, 3, 4}), Floats({2, 2}, {1, 2, 3, 5})),
              HasSubstr("first at [1,1]: expected 4, got 5; max abs error 1, max rel error 0.25"));
}

TEST(CompareTensorsTest, NaNsMustSitInTheSamePlacesAndInfinitiesMatch) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(CompareTensors(Floats({3}, {nan, 1, inf}), Floats({3}, {nan, 1, inf})).ok());
  EXPECT_THAT(CompareMessage(Floats({3}, {nan, 1, 2}), Floats({3}, {0, nan, 2})),
              HasSubstr("NaN placement differs; first at [0]: expected nan, got 0"));
  EXPECT_THAT(CompareMessage(Floats({2}, {inf, 1}), Floats({2}, {-inf, 1})),
              HasSubstr("first at [0]: expected inf, got -inf"));
  EXPECT_THAT(CompareMessage(Floats({2}, {inf, 1}), Floats({2}, {3e38f, 1})),
              HasSubstr("1 of 2 elements differ"));
}

TEST(CompareTensorsTest, DTypeAndShapeMustMatchExactly) {
  EXPECT_THAT(CompareMessage(Floats({2}, {1, 2}), Tensor(DType::kFloat64, {2})),
              HasSubstr("dtype float32 expected, got float64"));
  EXPECT_THAT(CompareMessage(Floats({2, 1}, {1, 2}), Floats({2}, {1, 2})),
              HasSubstr("shape [2,1] expected, got [2]"));
  EXPECT_THAT(CompareMessage(Floats({}, {1}), Floats({1}, {1})), HasSubstr("shape [] expected"));
}

TEST(CompareTensorsTest, IntegersAndBoolCompareExactly) {
  const Tensor big = Tensor::FromVector<int64_t>(DType::kInt64, {2}, {1LL << 60, 5});
  const Tensor big_plus_one = Tensor::FromVector<int64_t>(DType::kInt64, {2}, {(1LL << 60) + 1, 5});
  EXPECT_TRUE(CompareTensors(big, big).ok());
  EXPECT_THAT(CompareMessage(big, big_plus_one),
              HasSubstr("1 of 2 elements differ (exact compare); first at [0]: expected "
                        "1152921504606846976, got 1152921504606846977"));
  const Tensor t = Tensor::FromVector<uint8_t>(DType::kBool, {2}, {1, 0});
  const Tensor f = Tensor::FromVector<uint8_t>(DType::kBool, {2}, {1, 1});
  EXPECT_THAT(CompareMessage(t, f), HasSubstr("first at [1]: expected 0, got 1"));
}

TEST(ExpectedFailuresTest, ParsesNamesReasonsAndComments) {
  auto parsed = ParseExpectedFailures(
      "# header comment\n\ntest_a   # needs an RNG\n  test_b # two # hashes\n", "xf.txt");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->size(), 2u);
  EXPECT_EQ(parsed->at("test_a"), "needs an RNG");
  EXPECT_EQ(parsed->at("test_b"), "two # hashes");
  EXPECT_THAT(std::string(ParseExpectedFailures("test_a\n", "xf.txt").status().message()),
              HasSubstr("xf.txt:1: 'test_a' needs a reason"));
  EXPECT_THAT(std::string(ParseExpectedFailures("a # x\na # y\n", "xf.txt").status().message()),
              HasSubstr("xf.txt:2: 'a' is listed twice"));
  EXPECT_THAT(std::string(ParseExpectedFailures("a b # x\n", "xf.txt").status().message()),
              HasSubstr("xf.txt:1: 'a b' is not one case name"));
}

// ---- the program on synthetic cases ---------------------------------------------

class ConformanceProgramTest : public CliTempDirTest {
 protected:
  ConformanceProgramTest() : CliTempDirTest("conformance") {}

  void SetUp() override {
    CliTempDirTest::SetUp();
    cases_ = dir_ / "cases";
    const Tensor x = Floats({2, 2}, {1.0f, 2.0f, 3.0f, std::nanf("")});
    WriteCase("test_pass", x, x);
    WriteCase("test_near", x, Floats({2, 2}, {1.0005f, 2.0f, 3.0f, std::nanf("")}));
    WriteCase("test_far", x, Floats({2, 2}, {1.0f, 2.5f, 3.0f, std::nanf("")}));
    WriteCase("test_nan_moved", x, Floats({2, 2}, {std::nanf(""), 2.0f, 3.0f, 4.0f}));
    WriteCase("test_shape", x, Floats({4}, {1.0f, 2.0f, 3.0f, std::nanf("")}));
  }

  // An Identity model y = x with one data set.
  void WriteCase(const std::string& name, const Tensor& input, const Tensor& output) {
    Model model;
    model.ir_version = 8;
    model.opset_imports.push_back({"", 17});
    Value* x = *model.graph->AddInput("x", input.dtype(), input.shape());
    Node* node = *model.graph->AddNode("Identity", {x}, {"y"}, "identity");
    model.graph->AddOutput(node->output(0));
    node->output(0)->set_dtype(input.dtype());
    node->output(0)->set_shape(input.shape());
    const fs::path data = cases_ / name / "test_data_set_0";
    fs::create_directories(data);
    ASSERT_TRUE(SaveModel(model, (cases_ / name / "model.onnx").string()).ok());
    WriteProto(data / "input_0.pb", input);
    WriteProto(data / "output_0.pb", output);
  }
  void WriteProto(const fs::path& path, const Tensor& t) {
    std::ofstream(path, std::ios::binary) << TensorToProto(t, "t").SerializeAsString();
  }

  Program Run(const std::string& flags) {
    return RunCastor(dir_, "conformance " + cases_.string() + " " + flags);
  }
  std::string WriteList(const std::string& text) {
    const fs::path path = dir_ / "xfail.txt";
    std::ofstream(path) << text;
    return path.string();
  }

  fs::path cases_;
};

TEST_F(ConformanceProgramTest, ReportsEachFailureAndCounts) {
  Program p = Run("");
  EXPECT_EQ(p.exit_code, 1) << p.err;
  EXPECT_THAT(p.out, AllOf(HasSubstr("FAIL test_far: output 0 ('y'): 1 of 4 elements differ "
                                     "(rtol=0.001, atol=1e-07); first at [0,1]: expected 2.5, "
                                     "got 2"),
                           HasSubstr("FAIL test_nan_moved: output 0 ('y'): NaN placement "
                                     "differs; first at [0,0]: expected nan, got 1"),
                           HasSubstr("FAIL test_shape: output 0 ('y'): shape [4] expected, got "
                                     "[2,2]"),
                           Not(HasSubstr("test_pass")), Not(HasSubstr("test_near")),
                           HasSubstr("2 passed, 3 failed\n")));
}

TEST_F(ConformanceProgramTest, ListedFailuresPassTheRunAndUnexpectedPassesFailIt) {
  std::string list = WriteList(
      "# synthetic\ntest_far # off by 0.5\ntest_nan_moved # NaN moved\ntest_shape # reshaped\n");
  Program p = Run("--expected-failures " + list);
  EXPECT_EQ(p.exit_code, 0) << p.out << p.err;
  EXPECT_THAT(p.out, AllOf(Not(HasSubstr("FAIL")), HasSubstr("2 passed, 3 failed (3 expected "
                                                             "failures)")));
  p = Run("--expected-failures " + list + " --verbose");
  EXPECT_THAT(p.out, AllOf(HasSubstr("PASS test_pass\n"), HasSubstr("XFAIL test_far: ")));

  list = WriteList("test_far # a\ntest_nan_moved # b\ntest_shape # c\ntest_near # flaky once\n");
  p = Run("--expected-failures " + list);
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_THAT(p.out, AllOf(HasSubstr("UNEXPECTED PASS test_near: listed in " + list +
                                     " as failing (flaky once)"),
                           HasSubstr("2 passed, 3 failed (3 expected failures), 1 unexpectedly "
                                     "passed")));
}

TEST_F(ConformanceProgramTest, UnknownListedCaseAndBadInputAreExit2) {
  std::string list = WriteList("test_nope # gone\n");
  Program p = Run("--expected-failures " + list);
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("lists 'test_nope', which is not a test case in the folder"));
  EXPECT_EQ(Run("--filter '['").exit_code, 2);
  p = Run("--expected-failures " + (dir_ / "missing.txt").string());
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("missing.txt: cannot open"));
}

TEST_F(ConformanceProgramTest, FilterSelectsCasesByRegex) {
  Program p = Run("--filter 'pass|near' --verbose");
  EXPECT_EQ(p.exit_code, 0) << p.out << p.err;
  EXPECT_THAT(p.out, AllOf(HasSubstr("PASS test_near"), HasSubstr("2 passed, 0 failed"),
                           Not(HasSubstr("test_far"))));
}

// A backend with no kernels, to see how a case without a kernel is reported.
class NoKernelBackend : public Backend {
 public:
  std::string name() const override { return "empty"; }
  absl::StatusOr<void*> Allocate(size_t) override { return nullptr; }
  void Free(void*) override {}
  absl::Status CopyFromHost(void*, const void*, size_t) override { return absl::OkStatus(); }
  absl::Status CopyToHost(void*, const void*, size_t) override { return absl::OkStatus(); }
  absl::Status CopyWithin(void*, const void*, size_t) override { return absl::OkStatus(); }
  const KernelTable& kernels() const override { return table_; }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  KernelTable table_;
};

TEST_F(ConformanceProgramTest, CaseReasonsNameMissingKernelsAndLoadErrors) {
  NoKernelBackend backend;
  CaseResult result = RunConformanceCase((cases_ / "test_pass").string(), backend);
  EXPECT_FALSE(result.passed);
  EXPECT_EQ(result.name, "test_pass");
  EXPECT_THAT(result.reason,
              HasSubstr("missing kernel: backend 'empty' has no kernel for 1 node (op Identity)"));
  std::ofstream(cases_ / "test_pass" / "model.onnx") << "not a model";
  result = RunConformanceCase((cases_ / "test_pass").string(), backend);
  EXPECT_THAT(result.reason, AllOf(HasSubstr("load error: "), HasSubstr("model.onnx")));
}

// --backend cuda runs the cases on the GPU when there is one (every case is
// an Identity, which has a CUDA kernel, so the tally is the CPU's); without one
// it is exit 2 saying why.
TEST_F(ConformanceProgramTest, CudaBackendRunsTheCasesOrSaysWhyNot) {
  Program p = Run("--backend cuda");
  if (ProbeCuda().usable) {
    EXPECT_EQ(p.exit_code, 1) << p.err;
    EXPECT_THAT(p.out, HasSubstr("2 passed, 3 failed\n"));
  } else {
    EXPECT_EQ(p.exit_code, 2);
    EXPECT_THAT(p.err, HasSubstr("castor conformance: error: --backend cuda: "));
  }
}

TEST_F(ConformanceProgramTest, HelpExplainsFlags) {
  const std::string command =
      std::string(CASTOR_BINARY) + " conformance --help > " + (dir_ / "help.txt").string();
  fs::create_directories(dir_);
  ASSERT_EQ(std::system(command.c_str()), 0);
  EXPECT_THAT(ReadFile(dir_ / "help.txt"),
              AllOf(HasSubstr("--expected-failures FILE"), HasSubstr("--filter REGEX"),
                    HasSubstr("--[no-]verbose"), HasSubstr("examples:")));
}

}  // namespace
}  // namespace castor::tools
