// Tests of the CUDA reduce kernels (backend/cuda/reduce.cu) against the CPU
// backend: every Reduce* op in every float dtype over first, middle, last,
// several and all axes with keepdims 0 and 1, axes as an attribute and as
// an input, empty axes with and without noop_with_empty_axes, negative axes,
// empty reductions; large reductions of each kernel shape (1M elements into
// one, long rows, tall columns, two separate reduced axis groups) that
// split into slices; integer Sum/Max/Min/Prod; ArgMax/ArgMin with ties,
// select_last_index and NaN, across slices; com.castor ReduceToShapeOf over
// every broadcast pattern; and the clear refusals.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/attribute.h"
#include "graph/dtype.h"
#include "graph/gradient_builder.h"
#include "graph/shape.h"
#include "graph/tensor.h"
#include "gtest/gtest.h"
#include "tests/cuda_test_util.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using testing::Count;
using testing::CudaFloatTypes;
using testing::ExpectBothRefuse;
using testing::ExpectCudaMatchesCpu;
using testing::F32;
using testing::Gpu;
using testing::I32;
using testing::I64;
using testing::Make;
using testing::Random;
using testing::RandomTensor;
using testing::SingleNode;
using testing::Tolerance;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

const std::vector<std::string> kReduceOps = {
    "ReduceSum", "ReduceMean",      "ReduceMax",      "ReduceMin",      "ReduceProd",
    "ReduceL1",  "ReduceL2",        "ReduceSumSquare", "ReduceLogSumExp"};

std::string DimsText(const std::vector<int64_t>& dims) {
  return Shape::FromDims(dims).ToString();
}

// The opset from which `op` takes axes as an input.
int64_t AxesInputSince(const std::string& op) { return op == "ReduceSum" ? 13 : 18; }

// A Reduce node over `axes` at `opset`: axes as an attribute before the
// op's axes-input opset, as an int64 input after (omitted when empty).
SingleNode ReduceNode(const std::string& op, const Tensor& x, const std::vector<int64_t>& axes,
                      bool keepdims, int64_t opset, bool noop_with_empty_axes = false) {
  std::vector<Attribute> attributes = {Attribute::Int("keepdims", keepdims ? 1 : 0)};
  if (opset < AxesInputSince(op)) {
    if (!axes.empty()) attributes.push_back(Attribute::Ints("axes", axes));
    return SingleNode(op, {x}, attributes, opset);
  }
  if (noop_with_empty_axes) attributes.push_back(Attribute::Int("noop_with_empty_axes", 1));
  if (axes.empty()) return SingleNode(op, {x}, attributes, opset);
  return SingleNode(op, {x, I64({static_cast<int64_t>(axes.size())}, axes)}, attributes, opset,
                    1, "", {1});
}

// Inputs suited to `op`: near 1 for products (so they stay in range),
// otherwise uniform in [-1, 1).
Tensor ReduceInput(const std::string& op, DType dtype, const std::vector<int64_t>& dims,
                   unsigned seed) {
  if (op == "ReduceProd") return RandomTensor(dtype, dims, seed, 0.7, 1.3);
  return RandomTensor(dtype, dims, seed);
}

TEST(CudaReduce, EveryOpOverEveryAxisSet) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<int64_t> dims = {3, 4, 5};
  const std::vector<std::vector<int64_t>> axis_sets = {{0},  {1},    {2},    {-1},    {0, 2},
                                                       {0, 1}, {1, 2}, {-3, -2}, {0, 1, 2}, {}};
  for (const std::string& op : kReduceOps) {
    for (DType dtype : CudaFloatTypes()) {
      const Tensor x = ReduceInput(op, dtype, dims, 1);
      for (int64_t opset : {13, 18}) {
        for (const auto& axes : axis_sets) {
          for (bool keepdims : {true, false}) {
            SingleNode node = ReduceNode(op, x, axes, keepdims, opset);
            ExpectCudaMatchesCpu(node, absl::StrCat(op, " ", DTypeName(dtype), " opset ", opset,
                                                    " axes ", DimsText(axes), " keepdims ",
                                                    keepdims));
          }
        }
      }
    }
  }
}

TEST(CudaReduce, EmptyAxesWithNoopPassesThrough) {
  CASTOR_REQUIRE_CUDA();
  for (const std::string& op : kReduceOps) {
    for (DType dtype : CudaFloatTypes()) {
      SingleNode node = ReduceNode(op, ReduceInput(op, dtype, {2, 3}, 2), {}, true, 18, true);
      ExpectCudaMatchesCpu(node, absl::StrCat(op, " ", DTypeName(dtype), " noop"));
    }
  }
}

TEST(CudaReduce, EmptyReductionsGiveIdentities) {
  CASTOR_REQUIRE_CUDA();
  for (const std::string& op : kReduceOps) {
    for (DType dtype : CudaFloatTypes()) {
      // Reducing a 0-sized axis: every output is the identity (NaN for Mean).
      SingleNode empty_axis = ReduceNode(op, Make(dtype, {3, 0}, {}), {1}, true, 18);
      ExpectCudaMatchesCpu(empty_axis, absl::StrCat(op, " ", DTypeName(dtype), " over [3,0]"));
      // No outputs at all.
      SingleNode no_outputs = ReduceNode(op, Make(dtype, {0, 4}, {}), {1}, false, 18);
      ExpectCudaMatchesCpu(no_outputs, absl::StrCat(op, " ", DTypeName(dtype), " into [0]"));
      // A scalar input.
      SingleNode scalar = ReduceNode(op, Make(dtype, {}, {0.75}), {}, true, 18);
      ExpectCudaMatchesCpu(scalar, absl::StrCat(op, " ", DTypeName(dtype), " of a scalar"));
    }
  }
}

TEST(CudaReduce, SpecialValues) {
  CASTOR_REQUIRE_CUDA();
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = F32({4, 3}, {kNaN, 1, 2, inf, inf, 1, -inf, -inf, -inf, 5, -inf, 3});
  for (const std::string& op : kReduceOps) {
    for (int64_t axis : {0, 1}) {
      SingleNode node = ReduceNode(op, x, {axis}, true, 18);
      ExpectCudaMatchesCpu(node, absl::StrCat(op, " special values axis ", axis));
    }
  }
}

// Each kernel shape at a size that splits reductions into slices.
struct LargeCase {
  std::vector<int64_t> dims;
  std::vector<int64_t> axes;
};

const std::vector<LargeCase>& LargeCases() {
  static const auto* cases = new std::vector<LargeCase>{
      {{1 << 20}, {0}},            // 1M into 1 (a warp per slice)
      {{1000, 1000}, {}},          // all axes, empty list
      {{4, 100000}, {1}},          // long rows
      {{100000, 4}, {0}},          // tall columns (a thread per slice)
      {{64, 1000, 3}, {0, 2}},     // two reduced groups around a kept one
      {{3, 50000, 2}, {1}},        // middle axis
      {{2000, 130}, {1}},          // many short rows
  };
  return *cases;
}

TEST(CudaReduce, LargeReductionsSplitAcrossTheDevice) {
  CASTOR_REQUIRE_CUDA();
  unsigned seed = 10;
  for (const LargeCase& c : LargeCases()) {
    for (const std::string op : {"ReduceMean", "ReduceMax", "ReduceLogSumExp", "ReduceL2"}) {
      for (DType dtype : CudaFloatTypes()) {
        SingleNode node = ReduceNode(op, RandomTensor(dtype, c.dims, ++seed), c.axes, false, 18);
        ExpectCudaMatchesCpu(node, absl::StrCat(op, " ", DTypeName(dtype), " ", DimsText(c.dims),
                                                " axes ", DimsText(c.axes)));
      }
    }
    // Sums of positive values (no cancellation, so float32 accumulation in
    // a different order stays within float32 tolerance).
    SingleNode sum = ReduceNode("ReduceSum", RandomTensor(DType::kFloat32, c.dims, ++seed, 0, 1),
                                c.axes, true, 13);
    ExpectCudaMatchesCpu(sum, absl::StrCat("ReduceSum float32 ", DimsText(c.dims)));
  }
}

TEST(CudaReduce, IntegerSumMaxMinProd) {
  CASTOR_REQUIRE_CUDA();
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    const std::vector<int64_t> dims = {6, 7, 5};
    const Tensor x = Make(dtype, dims, Random(Count(dims), 20, /*integers=*/true));
    for (const std::string op : {"ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"}) {
      for (const std::vector<int64_t>& axes :
           std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}, {}}) {
        SingleNode node = ReduceNode(op, x, axes, true, 18);
        ExpectCudaMatchesCpu(node, absl::StrCat(op, " ", DTypeName(dtype), " axes ",
                                                DimsText(axes)));
      }
    }
    // Sums and products that wrap around.
    constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
    const Tensor big = dtype == DType::kInt32
                           ? I32({4}, {std::numeric_limits<int32_t>::max(), 5, 1 << 30, 3})
                           : I64({4}, {kMax64, 5, int64_t{1} << 62, 3});
    for (const std::string op : {"ReduceSum", "ReduceProd"}) {
      SingleNode node = ReduceNode(op, big, {0}, false, 18);
      ExpectCudaMatchesCpu(node, absl::StrCat(op, " ", DTypeName(dtype), " wrapping"));
    }
    const std::vector<int64_t> large = {3, 200000};
    SingleNode sum = ReduceNode("ReduceSum", Make(dtype, large, Random(Count(large), 21, true)),
                                {1}, true, 13);
    ExpectCudaMatchesCpu(sum, absl::StrCat("ReduceSum ", DTypeName(dtype), " large"));
  }
}

// ---- ArgMax / ArgMin ---------------------------------------------------------------

SingleNode ArgNode(const std::string& op, const Tensor& x, int64_t axis, bool keepdims,
                   bool last) {
  return SingleNode(op, {x},
                    {Attribute::Int("axis", axis), Attribute::Int("keepdims", keepdims ? 1 : 0),
                     Attribute::Int("select_last_index", last ? 1 : 0)},
                    13);
}

TEST(CudaReduce, ArgMaxArgMinWithTies) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<int64_t> dims = {4, 5, 6};
  std::vector<DType> dtypes = CudaFloatTypes();
  dtypes.push_back(DType::kInt32);
  dtypes.push_back(DType::kInt64);
  for (const std::string op : {"ArgMax", "ArgMin"}) {
    for (DType dtype : dtypes) {
      // Small integers: many ties.
      const Tensor x = Make(dtype, dims, Random(Count(dims), 30, /*integers=*/true));
      for (int64_t axis : {0, 1, 2, -1}) {
        for (bool keepdims : {true, false}) {
          for (bool last : {false, true}) {
            SingleNode node = ArgNode(op, x, axis, keepdims, last);
            ExpectCudaMatchesCpu(node, absl::StrCat(op, " ", DTypeName(dtype), " axis ", axis,
                                                    " keepdims ", keepdims, " last ", last));
          }
        }
      }
      // Long rows split into slices: the tie rule must hold across them.
      const std::vector<int64_t> long_dims = {2, 300000};
      const Tensor long_x = Make(dtype, long_dims, Random(Count(long_dims), 31, true));
      for (bool last : {false, true}) {
        SingleNode node = ArgNode(op, long_x, 1, false, last);
        ExpectCudaMatchesCpu(node, absl::StrCat(op, " ", DTypeName(dtype), " 2x300000 last ",
                                                last));
      }
      const std::vector<int64_t> tall_dims = {100000, 3};
      SingleNode tall = ArgNode(op, Make(dtype, tall_dims, Random(Count(tall_dims), 32, true)),
                                0, true, true);
      ExpectCudaMatchesCpu(tall, absl::StrCat(op, " ", DTypeName(dtype), " 100000x3"));
    }
    // NaN counts as the extreme; the first NaN wins (the last with select_last_index).
    const Tensor nan = F32({2, 5}, {1, kNaN, 3, kNaN, 0, 2, 2, -1, 2, -1});
    for (bool last : {false, true}) {
      SingleNode node = ArgNode(op, nan, 1, true, last);
      ExpectCudaMatchesCpu(node, absl::StrCat(op, " with NaN last ", last));
    }
  }
}

// ---- ReduceToShapeOf ---------------------------------------------------------------

TEST(CudaReduce, ReduceToShapeOfSumsBroadcastAxes) {
  CASTOR_REQUIRE_CUDA();
  struct Case {
    std::vector<int64_t> dy, x;
  };
  const std::vector<Case> cases = {
      {{2, 3, 4, 5}, {2, 3, 4, 5}},  // nothing to sum
      {{2, 3, 4, 5}, {5}},
      {{2, 3, 4, 5}, {4, 1}},
      {{2, 3, 4, 5}, {3, 1, 1}},
      {{2, 3, 4, 5}, {1, 3, 1, 5}},
      {{2, 3, 4, 5}, {2, 1, 4, 1}},
      {{2, 3, 4, 5}, {}},
      {{2, 3, 4, 5}, {1}},
      {{2, 1, 4}, {1, 1, 4}},
      {{64, 32, 7, 7}, {32, 1, 1}},  // a conv bias gradient
      {{256, 1000}, {1000}},         // a dense bias gradient
      {{1 << 20}, {}},               // 1M into 1
      {{3, 0, 4}, {4}},              // empty sums are 0
  };
  for (DType dtype : CudaFloatTypes()) {
    unsigned seed = 40;
    for (const Case& c : cases) {
      SingleNode node("ReduceToShapeOf",
                      {RandomTensor(dtype, c.dy, ++seed, 0, 1), RandomTensor(dtype, c.x, ++seed)},
                      {}, 1, 1, kCastorDomain);
      ExpectCudaMatchesCpu(node, absl::StrCat("ReduceToShapeOf ", DTypeName(dtype), " ",
                                              DimsText(c.dy), " to ", DimsText(c.x)));
    }
  }
}

// ---- refusals ----------------------------------------------------------------------

TEST(CudaReduce, RefusesClearly) {
  CASTOR_REQUIRE_CUDA();
  SingleNode empty_axis("ArgMax", {F32({0, 3}, {})}, {}, 13);
  ExpectBothRefuse(empty_axis, "empty axis", "ArgMax over an empty axis");
  // Integer means are a CPU-only kernel.
  SingleNode mean = ReduceNode("ReduceMean", I32({2, 2}, {1, 2, 3, 4}), {0}, true, 18);
  ASSERT_TRUE(mean.status().ok()) << mean.status();
  absl::StatusOr<std::vector<Tensor>> result = mean.Run(Gpu());
  ASSERT_FALSE(result.ok()) << "ReduceMean int32 ran on CUDA";
  EXPECT_NE(std::string(result.status().message()).find("no kernel supports it"),
            std::string::npos)
      << result.status();
}

}  // namespace
}  // namespace castor
