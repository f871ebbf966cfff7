// bfloat16 convolutions on cuDNN (backend/cuda/conv.cu, issue #29 item 3)
// against the CPU backend, beyond cuda_matmul_conv_test's sweep of every
// dtype: the convolutions of a ResNet (7x7 stride-2 stem, 3x3, stride-2 3x3
// and 1x1 downsamples) forward and backward (data and filter); float32
// accumulation (long sums of positive terms, where bfloat16 accumulation
// would stall, within one bfloat16 rounding of the CPU's float32 sums);
// the same bits on every run (deterministic algorithms first, as for
// float32). A host-side check, which needs a CUDA build but no GPU: the
// kernel table gives a bfloat16 Conv a kernel at every opset (the kernel is
// dtype-generic: a Conv the autocast pass paints bfloat16 below opset 22
// finds it too) and ConvGrad's bfloat16 form one; float64 none.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/dims.h"
#include "backend/cuda_backend.h"
#include "graph/gradient_builder.h"
#include "gtest/gtest.h"
#include "tests/cuda_test_util.h"

namespace castor {
namespace {

using testing::ExpectCudaMatchesCpu;
using testing::Gpu;
using testing::RandomTensor;
using testing::SingleNode;
using testing::Tolerance;
using testing::Values;

// Random values in [-1, 1) with float32 sums in a different order on each
// backend, then one rounding each: as cuda_matmul_conv_test's bfloat16
// conv tolerance.
constexpr Tolerance kBFloat16Conv = {4e-2, 4e-2};

// One bfloat16 rounding: two float32 sums that differ only in their last
// bits round to the same bfloat16 or to neighbours, at most one unit in the
// last place apart, and that unit is at most 2^-7 of the value.
constexpr Tolerance kOneBFloat16Rounding = {0.0079, 0};

// A Conv of bfloat16 X, W (and B when `bias`), opset 22.
SingleNode BFloat16Conv(const std::vector<int64_t>& x_dims, const std::vector<int64_t>& w_dims,
                        const std::vector<Attribute>& attributes, bool bias, unsigned seed,
                        double lo = -1.0, double hi = 1.0) {
  std::vector<Tensor> inputs = {RandomTensor(DType::kBFloat16, x_dims, seed, lo, hi),
                                RandomTensor(DType::kBFloat16, w_dims, seed + 1, lo, hi)};
  if (bias) inputs.push_back(RandomTensor(DType::kBFloat16, {w_dims[0]}, seed + 2, lo, hi));
  return SingleNode("Conv", inputs, attributes, 22);
}

// com.castor ConvGrad(dY, X, W) in bfloat16 with all three outputs; dY has
// Conv's output dims `y_dims`.
SingleNode BFloat16ConvGrad(const std::vector<int64_t>& y_dims,
                            const std::vector<int64_t>& x_dims,
                            const std::vector<int64_t>& w_dims,
                            const std::vector<Attribute>& attributes, unsigned seed,
                            double lo = -1.0, double hi = 1.0) {
  return SingleNode("ConvGrad",
                    {RandomTensor(DType::kBFloat16, y_dims, seed + 2, lo, hi),
                     RandomTensor(DType::kBFloat16, x_dims, seed, lo, hi),
                     RandomTensor(DType::kBFloat16, w_dims, seed + 1, lo, hi)},
                    attributes, 1, 3, kCastorDomain);
}

// ---- the kernel table (host side, no GPU) -----------------------------------------

// A graph with one `op_type` node over inputs of `dtypes` and `dims`,
// without type inference (which would refuse bfloat16 Conv below opset 22
// as ONNX does; a Conv the autocast pass computes in bfloat16 is castor's).
struct BareNode {
  Model model;
  Node* node = nullptr;
  BareNode(const std::string& op_type, const std::string& domain, int64_t opset,
           const std::vector<DType>& dtypes, const std::vector<std::vector<int64_t>>& dims,
           int outputs) {
    model.ir_version = 8;
    model.opset_imports.push_back({"", opset});
    if (!domain.empty()) model.opset_imports.push_back({domain, 1});
    std::vector<Value*> inputs;
    for (size_t i = 0; i < dtypes.size(); ++i) {
      absl::StatusOr<Value*> v =
          model.graph->AddInput(absl::StrCat("in", i), dtypes[i], Shape::FromDims(dims[i]));
      EXPECT_TRUE(v.ok()) << v.status();
      inputs.push_back(v.ok() ? *v : nullptr);
    }
    std::vector<std::string> names;
    for (int i = 0; i < outputs; ++i) names.push_back(absl::StrCat("out", i));
    absl::StatusOr<Node*> added = model.graph->AddNode(op_type, inputs, names, "node", domain);
    EXPECT_TRUE(added.ok()) << added.status();
    if (added.ok()) node = *added;
  }
};

TEST(CudaConvBFloat16, KernelTableHasBFloat16ConvAtEveryOpset) {
  if (!CudaBackendCompiled()) GTEST_SKIP() << "castor was built without the CUDA backend";
  absl::StatusOr<const KernelTable*> table = CudaKernelTable();
  ASSERT_TRUE(table.ok()) << table.status();
  const std::vector<std::vector<int64_t>> conv_dims = {{2, 3, 8, 8}, {4, 3, 3, 3}, {4}};
  for (int64_t opset : {1, 11, 13, 17, 21, 22}) {
    BareNode conv("Conv", "", opset, {DType::kBFloat16, DType::kBFloat16, DType::kBFloat16},
                  conv_dims, 1);
    ASSERT_NE(conv.node, nullptr);
    absl::StatusOr<const KernelDef*> kernel = (*table)->Find(*conv.node);
    EXPECT_TRUE(kernel.ok()) << "opset " << opset << ": " << kernel.status();
  }
  BareNode grad("ConvGrad", kCastorDomain, 17,
                {DType::kBFloat16, DType::kBFloat16, DType::kBFloat16},
                {{2, 4, 6, 6}, {2, 3, 8, 8}, {4, 3, 3, 3}}, 3);
  ASSERT_NE(grad.node, nullptr);
  absl::StatusOr<const KernelDef*> grad_kernel = (*table)->Find(*grad.node);
  EXPECT_TRUE(grad_kernel.ok()) << grad_kernel.status();
  // The table does refuse what it cannot run.
  BareNode wide("Conv", "", 22, {DType::kFloat64, DType::kFloat64}, {conv_dims[0], conv_dims[1]},
                1);
  ASSERT_NE(wide.node, nullptr);
  absl::StatusOr<const KernelDef*> none = (*table)->Find(*wide.node);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(std::string(none.status().message()).find("float64"), std::string::npos)
      << none.status();
}

// ---- on a GPU ---------------------------------------------------------------------

// The convolutions of a ResNet (channels and sizes scaled down), forward
// with and without bias and backward (dX, dW, dB).
TEST(CudaConvBFloat16, ResNetConvolutions) {
  CASTOR_REQUIRE_CUDA();
  struct Case {
    std::string what;
    std::vector<int64_t> x, w;
    std::vector<Attribute> attributes;
  };
  const std::vector<Case> cases = {
      {"stem 7x7 stride 2 pads 3",
       {2, 3, 32, 32},
       {16, 3, 7, 7},
       {Attribute::Ints("strides", {2, 2}), Attribute::Ints("pads", {3, 3, 3, 3})}},
      {"3x3 pads 1", {2, 16, 16, 16}, {16, 16, 3, 3}, {Attribute::Ints("pads", {1, 1, 1, 1})}},
      {"3x3 stride 2 pads 1",
       {2, 16, 16, 16},
       {32, 16, 3, 3},
       {Attribute::Ints("strides", {2, 2}), Attribute::Ints("pads", {1, 1, 1, 1})}},
      {"1x1 stride 2 downsample", {2, 16, 16, 16}, {32, 16, 1, 1},
       {Attribute::Ints("strides", {2, 2})}},
  };
  unsigned seed = 100;
  for (const Case& c : cases) {
    for (bool bias : {true, false}) {
      SingleNode conv = BFloat16Conv(c.x, c.w, c.attributes, bias, seed);
      ExpectCudaMatchesCpu(conv, absl::StrCat("bfloat16 Conv ", c.what, bias ? " bias" : ""),
                           kBFloat16Conv);
    }
    // dY with the forward's output dims.
    SingleNode conv = BFloat16Conv(c.x, c.w, c.attributes, false, seed);
    absl::StatusOr<std::vector<Tensor>> y = conv.Run(testing::Cpu());
    ASSERT_TRUE(y.ok()) << y.status();
    SingleNode grad = BFloat16ConvGrad((*y)[0].dims(), c.x, c.w, c.attributes, seed);
    ExpectCudaMatchesCpu(grad, absl::StrCat("bfloat16 ConvGrad ", c.what), kBFloat16Conv);
    seed += 10;
  }
}

// Sums of 2304 (forward), 1152 (dX) and 1568 (dW) positive products in
// [0.25, 1): accumulated in bfloat16 they would stall once the sum's unit
// in the last place passes the terms (at 256, a unit of 2); in float32 they
// agree with the CPU's float32 sums to one bfloat16 rounding.
TEST(CudaConvBFloat16, AccumulatesInFloat32) {
  CASTOR_REQUIRE_CUDA();
  SingleNode conv = BFloat16Conv({2, 256, 6, 6}, {8, 256, 3, 3}, {}, false, 201, 0.5, 1.0);
  ExpectCudaMatchesCpu(conv, "bfloat16 Conv over 2304 positive products", kOneBFloat16Rounding);
  // The sums are large: near 2304 * 0.5625, far past where bfloat16 stalls.
  absl::StatusOr<std::vector<Tensor>> y = conv.Run(testing::Cpu());
  ASSERT_TRUE(y.ok()) << y.status();
  for (double v : Values((*y)[0])) ASSERT_GT(v, 1000.0);

  // dY [8, 128, 14, 14], X [8, 8, 16, 16], W [128, 8, 3, 3]: each dX sums
  // 128 * 9 products, each dW 8 * 14 * 14; dB sums 8 * 196 terms.
  SingleNode grad =
      BFloat16ConvGrad({8, 128, 14, 14}, {8, 8, 16, 16}, {128, 8, 3, 3}, {}, 211, 0.5, 1.0);
  ExpectCudaMatchesCpu(grad, "bfloat16 ConvGrad over 1152 / 1568 positive products",
                       kOneBFloat16Rounding);
}

// The same inputs give the same bits on every run: the backend runs the
// algorithm its first search chose, a deterministic one.
TEST(CudaConvBFloat16, SameBitsEveryRun) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<Attribute> attributes = {Attribute::Ints("pads", {1, 1, 1, 1})};
  SingleNode conv = BFloat16Conv({4, 32, 16, 16}, {64, 32, 3, 3}, attributes, true, 301);
  SingleNode grad =
      BFloat16ConvGrad({4, 64, 16, 16}, {4, 32, 16, 16}, {64, 32, 3, 3}, attributes, 301);
  for (SingleNode* node : {&conv, &grad}) {
    const std::string what = node->node().op_type();
    absl::StatusOr<std::vector<Tensor>> first = node->Run(Gpu());
    ASSERT_TRUE(first.ok()) << what << ": " << first.status();
    for (int run = 1; run < 4; ++run) {
      absl::StatusOr<std::vector<Tensor>> again = node->Run(Gpu());
      ASSERT_TRUE(again.ok()) << what << ": " << again.status();
      ASSERT_EQ(again->size(), first->size());
      for (size_t i = 0; i < first->size(); ++i) {
        EXPECT_EQ(Values((*again)[i]), Values((*first)[i]))
            << what << " output " << i << " differs on run " << run;
      }
    }
  }
}

}  // namespace
}  // namespace castor
