// CUDA kernels of the softmax and loss families (backend/cuda/softmax.cu,
// backend/cuda/losses.cu) against the CPU backend: Softmax / LogSoftmax
// over the first, a middle and the last axis, opset 11 (2-D coercion) vs 13
// (one axis), lines longer than a block and short lines, every launch shape
// (warp, block and thread per line); SoftmaxGrad / LogSoftmaxGrad;
// SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss with each reduction,
// ignore_index, weights, the log_prob output, N-D scores, int32 labels;
// SoftmaxCrossEntropyLossGrad; and the out-of-range label error. Every
// float dtype the kernels take (float32, float16, bfloat16).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/executor.h"
#include "graph/gradient_builder.h"
#include "tests/cuda_test_util.h"

namespace castor {
namespace {

using testing::CudaFloatTypes;
using testing::ExpectBothRefuse;
using testing::ExpectCudaMatchesCpu;
using testing::Make;
using testing::RandomTensor;
using testing::SingleNode;

std::string Name(DType dtype, const std::vector<int64_t>& dims) {
  std::string s = std::string(DTypeName(dtype)) + " [";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

// ---- Softmax / LogSoftmax ----------------------------------------------------------

struct SoftmaxCase {
  std::vector<int64_t> dims;
  int64_t axis;
  int64_t opset;
};

void CheckSoftmax(const SoftmaxCase& c, unsigned seed) {
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    for (DType dtype : CudaFloatTypes()) {
      if (dtype == DType::kBFloat16 && c.opset < 13) continue;  // bfloat16 from opset 13
      SingleNode node(op, {RandomTensor(dtype, c.dims, seed, -5.0, 5.0)},
                      {Attribute::Int("axis", c.axis)}, c.opset);
      ExpectCudaMatchesCpu(node, std::string(op) + " " + Name(dtype, c.dims) + " axis " +
                                     std::to_string(c.axis) + " opset " + std::to_string(c.opset));
    }
  }
}

TEST(CudaSoftmax, FirstMiddleAndLastAxisOpset13) {
  CASTOR_REQUIRE_CUDA();
  for (int64_t axis : {0, 1, 2, -1, -2}) CheckSoftmax({{4, 6, 5}, axis, 13}, 11);
  CheckSoftmax({{7, 3}, 1, 13}, 12);     // short lines, warp per line
  CheckSoftmax({{1}, 0, 13}, 13);        // one line of one element
  CheckSoftmax({{3, 1, 4}, 1, 13}, 14);  // lines of one element
}

TEST(CudaSoftmax, Opset11CoercesTo2D) {
  CASTOR_REQUIRE_CUDA();
  for (int64_t axis : {0, 1, 2, -1, -3}) CheckSoftmax({{4, 6, 5}, axis, 11}, 21);
  // Default axis (1 before opset 13, -1 from 13).
  for (int64_t opset : {11, 13}) {
    for (DType dtype : CudaFloatTypes()) {
      if (dtype == DType::kBFloat16 && opset < 13) continue;
      SingleNode node("Softmax", {RandomTensor(dtype, {3, 4, 5}, 22)}, {}, opset);
      ExpectCudaMatchesCpu(node, "Softmax default axis opset " + std::to_string(opset));
    }
  }
}

TEST(CudaSoftmax, LongLinesAndManyLines) {
  CASTOR_REQUIRE_CUDA();
  CheckSoftmax({{3, 5000}, -1, 13}, 31);    // contiguous, block per line
  CheckSoftmax({{5000, 3}, 0, 13}, 32);     // strided, few long lines: block per line
  CheckSoftmax({{2, 3000, 7}, 1, 13}, 33);  // strided, block per line
  CheckSoftmax({{256, 500}, 1, 13}, 34);    // 128k elements, warp per line
  CheckSoftmax({{8, 50, 300}, 1, 13}, 35);  // 120k, strided, thread per line
  CheckSoftmax({{2, 3, 2000}, 1, 11}, 36);  // coerced rows of 6000
  CheckSoftmax({{40, 1025}, -1, 13}, 37);   // just over the warp limit
}

TEST(CudaSoftmax, LargeValuesAreStable) {
  CASTOR_REQUIRE_CUDA();
  const Tensor x =
      Make(DType::kFloat32, {2, 4}, {1000, 1001, 1002, 1003, -1000, -1001, -1002, 3.0e38});
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    SingleNode node(op, {x}, {}, 13);
    ExpectCudaMatchesCpu(node, std::string(op) + " large values");
  }
}

TEST(CudaSoftmax, Float64IsRefusedAtPlanTime) {
  CASTOR_REQUIRE_CUDA();
  // The CPU runs float64; the CUDA kernels take float32/float16/bfloat16
  // only, and say so before running anything.
  SingleNode node("Softmax", {RandomTensor(DType::kFloat64, {2, 3}, 41)}, {}, 13);
  ASSERT_TRUE(node.status().ok()) << node.status();
  absl::StatusOr<std::vector<Tensor>> result = node.Run(testing::Gpu());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnimplemented) << result.status();
  EXPECT_NE(std::string(result.status().message()).find("float64"), std::string::npos)
      << result.status();
}

// ---- SoftmaxGrad / LogSoftmaxGrad ---------------------------------------------------

TEST(CudaSoftmaxGrad, EachAxisAndLineLength) {
  CASTOR_REQUIRE_CUDA();
  struct Case {
    std::vector<int64_t> dims;
    int64_t axis;
  };
  const std::vector<Case> cases = {{{4, 6, 5}, 0},    {{4, 6, 5}, 1}, {{4, 6, 5}, -1},
                                   {{3, 5000}, -1},   {{5000, 3}, 0}, {{256, 500}, -1},
                                   {{8, 50, 300}, 1}, {{7, 3}, 1}};
  unsigned seed = 51;
  for (const Case& c : cases) {
    for (DType dtype : CudaFloatTypes()) {
      for (bool log : {false, true}) {
        const std::string op = log ? "LogSoftmaxGrad" : "SoftmaxGrad";
        // Y as the forward op would give it: probabilities or log-probabilities.
        const Tensor y = log ? RandomTensor(dtype, c.dims, seed, -6.0, -0.1)
                             : RandomTensor(dtype, c.dims, seed, 0.0, 0.5);
        const Tensor dy = RandomTensor(dtype, c.dims, seed + 1);
        SingleNode node(op, {dy, y}, {Attribute::Int("axis", c.axis)}, 1, 1, kCastorDomain);
        // float32: dX subtracts a sum of up to 5000 terms that the two
        // backends add in different orders.
        const std::optional<testing::Tolerance> tolerance =
            dtype == DType::kFloat32 ? std::optional<testing::Tolerance>({1e-4, 1e-4})
                                     : std::nullopt;
        ExpectCudaMatchesCpu(
            node, op + " " + Name(dtype, c.dims) + " axis " + std::to_string(c.axis), tolerance);
        seed += 2;
      }
    }
  }
}

TEST(CudaSoftmaxGrad, DefaultAxisIsLast) {
  CASTOR_REQUIRE_CUDA();
  for (const char* op : {"SoftmaxGrad", "LogSoftmaxGrad"}) {
    SingleNode node(op,
                    {RandomTensor(DType::kFloat32, {3, 4, 5}, 61),
                     RandomTensor(DType::kFloat32, {3, 4, 5}, 62, -2.0, -0.1)},
                    {}, 1, 1, kCastorDomain);
    ExpectCudaMatchesCpu(node, std::string(op) + " default axis");
  }
}

// ---- SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss -----------------------------

struct LossCase {
  std::vector<int64_t> dims;  // scores [N, C, d1, ...]
  std::string reduction;
  bool weighted = false;
  bool ignore = false;
  int64_t ignore_index = -100;
  DType label_dtype = DType::kInt64;
  bool log_prob = false;  // SoftmaxCrossEntropyLoss's second output
};

std::vector<int64_t> LabelDims(const std::vector<int64_t>& score_dims) {
  std::vector<int64_t> dims = {score_dims[0]};
  dims.insert(dims.end(), score_dims.begin() + 2, score_dims.end());
  return dims;
}

// Labels in [0, C), every third one ignore_index when `ignore`.
Tensor Labels(const LossCase& c, unsigned seed) {
  const std::vector<int64_t> dims = LabelDims(c.dims);
  int64_t count = 1;
  for (int64_t d : dims) count *= d;
  std::mt19937 rng(seed);
  std::vector<double> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    values[i] = static_cast<double>(rng() % static_cast<uint32_t>(c.dims[1]));
    if (c.ignore && i % 3 == 1) values[i] = static_cast<double>(c.ignore_index);
  }
  return Make(c.label_dtype, dims, values);
}

std::vector<Attribute> LossAttributes(const LossCase& c) {
  std::vector<Attribute> attributes = {Attribute::String("reduction", c.reduction)};
  if (c.ignore) attributes.push_back(Attribute::Int("ignore_index", c.ignore_index));
  return attributes;
}

std::string Describe(const std::string& op, DType dtype, const LossCase& c) {
  return op + " " + Name(dtype, c.dims) + " " + c.reduction + (c.weighted ? " weighted" : "") +
         (c.ignore ? " ignore " + std::to_string(c.ignore_index) : "") +
         (c.label_dtype == DType::kInt32 ? " int32 labels" : "") + (c.log_prob ? " +log_prob" : "");
}

void CheckLoss(const std::string& op, const LossCase& c, unsigned seed) {
  const bool softmax = op == "SoftmaxCrossEntropyLoss";
  for (DType dtype : CudaFloatTypes()) {
    // NLL reads log-probabilities: negative inputs.
    std::vector<Tensor> inputs = {softmax ? RandomTensor(dtype, c.dims, seed, -4.0, 4.0)
                                          : RandomTensor(dtype, c.dims, seed, -5.0, -0.01),
                                  Labels(c, seed + 1)};
    if (c.weighted) inputs.push_back(RandomTensor(dtype, {c.dims[1]}, seed + 2, 0.25, 2.0));
    // bfloat16 NegativeLogLikelihoodLoss needs opset 22.
    SingleNode node(op, inputs, LossAttributes(c), 22, softmax && c.log_prob ? 2 : 1);
    ExpectCudaMatchesCpu(node, Describe(op, dtype, c));
  }
}

TEST(CudaLosses, SoftmaxCrossEntropyEachReductionWeightsAndIgnoreIndex) {
  CASTOR_REQUIRE_CUDA();
  unsigned seed = 101;
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{6, 5}, {3, 4, 6}, {2, 3, 2, 3}}) {
    for (const char* reduction : {"none", "sum", "mean"}) {
      for (bool weighted : {false, true}) {
        for (bool ignore : {false, true}) {
          // An ignore_index outside [0, C) (PyTorch's -100) and one inside.
          for (int64_t ignore_index : {int64_t{-100}, int64_t{1}}) {
            if (!ignore && ignore_index != -100) continue;
            LossCase c{dims, reduction, weighted, ignore, ignore_index};
            c.log_prob = ignore_index == 1;
            CheckLoss("SoftmaxCrossEntropyLoss", c, seed);
            seed += 3;
          }
        }
      }
    }
  }
}

TEST(CudaLosses, SoftmaxCrossEntropyLogProbInt32LabelsAndLargeInputs) {
  CASTOR_REQUIRE_CUDA();
  LossCase c{{5, 7, 4}, "mean", true, true, 2, DType::kInt32, true};
  CheckLoss("SoftmaxCrossEntropyLoss", c, 201);
  c.reduction = "none";
  CheckLoss("SoftmaxCrossEntropyLoss", c, 202);
  // Many classes (lanes loop over C) and many positions (128k scores).
  CheckLoss("SoftmaxCrossEntropyLoss", {{4, 3000}, "mean", false, false, -100, DType::kInt64, true},
            203);
  CheckLoss("SoftmaxCrossEntropyLoss", {{64, 10, 200}, "sum", true, true, 3}, 204);
  CheckLoss("SoftmaxCrossEntropyLoss", {{12800, 10}, "mean", true, false}, 205);
}

TEST(CudaLosses, MeanOverOnlyIgnoredPositionsIsNaNOnBoth) {
  CASTOR_REQUIRE_CUDA();
  SingleNode node("SoftmaxCrossEntropyLoss",
                  {RandomTensor(DType::kFloat32, {3, 4}, 211), Make(DType::kInt64, {3}, {2, 2, 2})},
                  {Attribute::Int("ignore_index", 2)}, 13);
  ExpectCudaMatchesCpu(node, "SCE all positions ignored");
}

TEST(CudaLosses, NegativeLogLikelihood) {
  CASTOR_REQUIRE_CUDA();
  unsigned seed = 301;
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{6, 5}, {3, 4, 6}, {64, 10, 200}}) {
    for (const char* reduction : {"none", "sum", "mean"}) {
      for (bool weighted : {false, true}) {
        LossCase c{dims, reduction, weighted, true, 1};
        c.label_dtype = weighted ? DType::kInt32 : DType::kInt64;
        CheckLoss("NegativeLogLikelihoodLoss", c, seed);
        c.ignore = false;
        CheckLoss("NegativeLogLikelihoodLoss", c, seed + 1);
        seed += 3;
      }
    }
  }
}

TEST(CudaLosses, OutOfRangeLabelIsRefusedNamingIt) {
  CASTOR_REQUIRE_CUDA();
  for (const char* op : {"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"}) {
    SingleNode node(
        op, {RandomTensor(DType::kFloat32, {4, 3}, 311), Make(DType::kInt32, {4}, {0, 2, 3, 1})},
        {}, 13);
    ExpectBothRefuse(node, "label 3 at position 2 is out of range [0, 3)", op);
    SingleNode ignored(
        op, {RandomTensor(DType::kFloat32, {4, 3}, 312), Make(DType::kInt64, {4}, {-1, 5, -7, 1})},
        {Attribute::Int("ignore_index", -1)}, 13);
    ExpectBothRefuse(ignored,
                     "label 5 at position 1 is out of range [0, 3) and is not "
                     "ignore_index -1",
                     op);
  }
}

// Through the executor the fed labels come with a host copy, which the CUDA
// kernel checks on the host instead of through a device flag; the error and
// the loss must be the CPU's. (The device-flag path gives the same results,
// so this checks the host path's results, not that it was taken; that the
// executor hands kernels host copies is executor_test's.)
TEST(CudaLosses, FedLabelsAreCheckedOnTheHost) {
  CASTOR_REQUIRE_CUDA();
  const Tensor scores = RandomTensor(DType::kFloat32, {4, 3}, 314);
  for (const auto& [labels, error] :
       {std::pair{Make(DType::kInt64, {4}, {0, 2, 3, 1}),
                  std::string("label 3 at position 2 is out of range [0, 3)")},
        std::pair{Make(DType::kInt64, {4}, {0, 2, 1, 1}), std::string()}}) {
    SingleNode node("SoftmaxCrossEntropyLoss", {scores, labels}, {}, 13);
    ASSERT_TRUE(node.status().ok()) << node.status();
    std::vector<float> losses;
    for (Backend* backend : {static_cast<Backend*>(&testing::Cpu()), &testing::Gpu()}) {
      absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Create(node.model(), *backend);
      ASSERT_TRUE(executor.ok()) << executor.status();
      absl::StatusOr<std::vector<Tensor>> result =
          (*executor)->Run({{"in0", scores}, {"in1", labels}});
      if (!error.empty()) {
        ASSERT_FALSE(result.ok()) << backend->name();
        EXPECT_NE(std::string(result.status().message()).find(error), std::string::npos)
            << backend->name() << ": " << result.status();
        continue;
      }
      ASSERT_TRUE(result.ok()) << backend->name() << ": " << result.status();
      losses.push_back((*result)[0].data<float>()[0]);
    }
    if (error.empty()) {
      ASSERT_EQ(losses.size(), 2u);
      EXPECT_NEAR(losses[1], losses[0], 1e-6);
    }
  }
}

// ---- SoftmaxCrossEntropyLossGrad ------------------------------------------------------

void CheckCrossEntropyGrad(const LossCase& c, unsigned seed) {
  for (DType dtype : CudaFloatTypes()) {
    const std::vector<int64_t> loss_dims =
        c.reduction == "none" ? LabelDims(c.dims) : std::vector<int64_t>{};
    std::vector<Tensor> inputs = {RandomTensor(dtype, loss_dims, seed, 0.5, 2.0),
                                  RandomTensor(dtype, c.dims, seed + 1, -4.0, 4.0),
                                  Labels(c, seed + 2)};
    if (c.weighted) inputs.push_back(RandomTensor(dtype, {c.dims[1]}, seed + 3, 0.25, 2.0));
    SingleNode node("SoftmaxCrossEntropyLossGrad", inputs, LossAttributes(c), 1, 1, kCastorDomain);
    ExpectCudaMatchesCpu(node, Describe("SoftmaxCrossEntropyLossGrad", dtype, c));
  }
}

TEST(CudaLosses, SoftmaxCrossEntropyGradEachReductionWeightsAndIgnoreIndex) {
  CASTOR_REQUIRE_CUDA();
  unsigned seed = 401;
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{6, 5}, {3, 4, 6}, {2, 3, 2, 3}}) {
    for (const char* reduction : {"none", "sum", "mean"}) {
      for (bool weighted : {false, true}) {
        for (bool ignore : {false, true}) {
          LossCase c{dims, reduction, weighted, ignore, 1};
          c.label_dtype = ignore ? DType::kInt32 : DType::kInt64;
          CheckCrossEntropyGrad(c, seed);
          seed += 4;
        }
      }
    }
  }
  // Many classes and many positions.
  CheckCrossEntropyGrad({{4, 3000}, "mean", true, false}, 451);
  CheckCrossEntropyGrad({{64, 10, 200}, "none", true, true, -100}, 452);
}

TEST(CudaLosses, SoftmaxCrossEntropyGradOutOfRangeLabelIsRefused) {
  CASTOR_REQUIRE_CUDA();
  SingleNode node("SoftmaxCrossEntropyLossGrad",
                  {Make(DType::kFloat32, {}, {1.0}), RandomTensor(DType::kFloat32, {3, 4}, 461),
                   Make(DType::kInt64, {3}, {1, 0, 7})},
                  {}, 1, 1, kCastorDomain);
  ExpectBothRefuse(node, "input 2 (labels): label 7 at position 2 is out of range [0, 4)",
                   "SoftmaxCrossEntropyLossGrad label 7");
}

}  // namespace
}  // namespace castor
