// CUDA kernels of the matmul and conv families (backend/cuda/matmul.cu,
// backend/cuda/conv.cu) against the CPU backend, in float32, float16 and
// bfloat16: MatMul (2-D, 1-D operands, batched with each side broadcast, a
// large case, empty cases), Gemm (every transA/transB, alpha/beta, each C
// shape, no C, K = 0), Conv (1-D/2-D/3-D, pads incl. asymmetric, strides,
// dilations, groups, depthwise, auto_pad, bias or not, a large case),
// ConvTranspose (pads, output_padding, output_shape, auto_pad, groups,
// 1-D, castor's form) and com.castor ConvGrad (all outputs and fewer),
// plus errors.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/dims.h"
#include "graph/gradient_builder.h"
#include "gtest/gtest.h"
#include "tests/cuda_test_util.h"

namespace castor {
namespace {

using testing::CudaFloatTypes;
using testing::ExpectBothRefuse;
using testing::ExpectCudaMatchesCpu;
using testing::Gpu;
using testing::RandomTensor;
using testing::RunOk;
using testing::SingleNode;
using testing::Tolerance;

// ---- MatMul -----------------------------------------------------------------------

// Dot products of length k over values in [-1, 1): the backends sum in
// different orders, so float32 results differ by rounding errors of the
// order of 2^-24 * k^0.5 times the terms, which outputs near zero see as
// absolute error; 16-bit outputs keep the default (one output rounding).
std::optional<Tolerance> DotTolerance(DType dtype, int64_t k) {
  if (dtype != DType::kFloat32) return std::nullopt;
  return Tolerance{1e-4, std::max(1e-5, 2e-7 * static_cast<double>(k))};
}

// MatMul of random A and B in every CUDA float dtype, CUDA against CPU.
void ExpectMatMul(const std::vector<int64_t>& a_dims, const std::vector<int64_t>& b_dims,
                  unsigned seed) {
  for (DType dtype : CudaFloatTypes()) {
    SingleNode node("MatMul",
                    {RandomTensor(dtype, a_dims, seed), RandomTensor(dtype, b_dims, seed + 1)},
                    {}, 17);
    ExpectCudaMatchesCpu(
        node,
        absl::StrCat("MatMul ", DTypeName(dtype), " ", common::DimsToString(a_dims), " x ",
                     common::DimsToString(b_dims)),
        DotTolerance(dtype, a_dims.back()));
  }
}

TEST(CudaMatMul, TwoDimensional) {
  CASTOR_REQUIRE_CUDA();
  ExpectMatMul({37, 53}, {53, 29}, 1);
  ExpectMatMul({1, 7}, {7, 1}, 3);
}

TEST(CudaMatMul, OneDimensionalOperands) {
  CASTOR_REQUIRE_CUDA();
  ExpectMatMul({53}, {53, 29}, 5);     // 1-D x 2-D
  ExpectMatMul({37, 53}, {53}, 7);     // 2-D x 1-D
  ExpectMatMul({53}, {53}, 9);         // dot product: a scalar
  ExpectMatMul({4, 37, 53}, {53}, 11);  // batched x 1-D: B shared, batch folded into M
  ExpectMatMul({53}, {4, 53, 29}, 13);  // 1-D x batched: A shared
}

TEST(CudaMatMul, BatchedAndBroadcast) {
  CASTOR_REQUIRE_CUDA();
  ExpectMatMul({4, 37, 53}, {4, 53, 29}, 21);        // dense batches: strided batched
  ExpectMatMul({4, 37, 53}, {53, 29}, 23);           // B broadcast: folded into M
  ExpectMatMul({4, 37, 53}, {1, 53, 29}, 25);        // B broadcast along a size-1 axis
  ExpectMatMul({37, 53}, {4, 53, 29}, 27);           // A broadcast: stride 0
  ExpectMatMul({1, 37, 53}, {4, 53, 29}, 29);        // A broadcast along a size-1 axis
  ExpectMatMul({2, 3, 17, 23}, {2, 3, 23, 11}, 31);  // 4-D dense: merged into one axis
  ExpectMatMul({3, 1, 17, 23}, {1, 5, 23, 11}, 33);  // each side broadcast: pointer arrays
  ExpectMatMul({2, 3, 17, 23}, {3, 23, 11}, 35);     // B broadcast on the outer axis only
  ExpectMatMul({2, 1, 17, 23}, {2, 3, 23, 11}, 37);  // A broadcast on the inner axis only
  ExpectMatMul({2, 1, 3, 5, 8}, {1, 4, 3, 8, 6}, 39);  // 5-D: three alternating axes
}

TEST(CudaMatMul, Large) {
  CASTOR_REQUIRE_CUDA();
  ExpectMatMul({256, 512}, {512, 384}, 41);
}

TEST(CudaMatMul, EmptyOperands) {
  CASTOR_REQUIRE_CUDA();
  ExpectMatMul({0, 5}, {5, 3}, 51);        // empty output
  ExpectMatMul({3, 0}, {0, 4}, 53);        // K = 0: zeros
  ExpectMatMul({2, 0, 3, 4}, {4, 5}, 55);  // empty batch
  ExpectMatMul({2, 3, 0}, {2, 0, 6}, 57);  // batched K = 0
}

TEST(CudaMatMul, Float64HasNoCudaKernel) {
  CASTOR_REQUIRE_CUDA();
  SingleNode node("MatMul",
                  {RandomTensor(DType::kFloat64, {2, 3}, 61),
                   RandomTensor(DType::kFloat64, {3, 2}, 62)},
                  {}, 17);
  ASSERT_TRUE(node.status().ok()) << node.status();
  absl::StatusOr<std::vector<Tensor>> result = node.Run(Gpu());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(std::string(result.status().message()).find("MatMul node 'node'"), std::string::npos)
      << result.status();
  EXPECT_NE(std::string(result.status().message()).find("float64"), std::string::npos)
      << result.status();
}

// ---- Gemm -------------------------------------------------------------------------

// Gemm of A [M, K] (or [K, M] with transA), B [K, N] (or [N, K]) and an
// optional C of `c_dims` (nullptr: no C) in every CUDA float dtype.
void ExpectGemm(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                const std::vector<int64_t>* c_dims, std::vector<Attribute> scalars,
                unsigned seed) {
  const std::vector<int64_t> a_dims = trans_a ? std::vector<int64_t>{k, m}
                                              : std::vector<int64_t>{m, k};
  const std::vector<int64_t> b_dims = trans_b ? std::vector<int64_t>{n, k}
                                              : std::vector<int64_t>{k, n};
  std::vector<Attribute> attributes = std::move(scalars);
  attributes.push_back(Attribute::Int("transA", trans_a ? 1 : 0));
  attributes.push_back(Attribute::Int("transB", trans_b ? 1 : 0));
  for (DType dtype : CudaFloatTypes()) {
    std::vector<Tensor> inputs = {RandomTensor(dtype, a_dims, seed),
                                  RandomTensor(dtype, b_dims, seed + 1)};
    if (c_dims != nullptr) inputs.push_back(RandomTensor(dtype, *c_dims, seed + 2));
    SingleNode node("Gemm", inputs, attributes, 13);
    ExpectCudaMatchesCpu(
        node,
        absl::StrCat("Gemm ", DTypeName(dtype), " M=", m, " N=", n, " K=", k,
                     " transA=", trans_a ? 1 : 0, " transB=", trans_b ? 1 : 0, " C ",
                     c_dims != nullptr ? common::DimsToString(*c_dims) : std::string("none")),
        DotTolerance(dtype, k));
  }
}

TEST(CudaGemm, EveryTransposeAndCShape) {
  CASTOR_REQUIRE_CUDA();
  const int64_t m = 13, n = 19, k = 27;
  const std::vector<std::vector<int64_t>> c_shapes = {{n}, {1, n}, {m, 1}, {}, {1, 1}, {m, n}};
  unsigned seed = 100;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      ExpectGemm(m, n, k, trans_a, trans_b, nullptr, {}, seed += 3);
      for (const std::vector<int64_t>& c : c_shapes) {
        ExpectGemm(m, n, k, trans_a, trans_b, &c,
                   {Attribute::Float("alpha", 0.75f), Attribute::Float("beta", -1.25f)},
                   seed += 3);
      }
    }
  }
}

TEST(CudaGemm, AlphaBetaVariants) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<int64_t> c = {31, 17};
  ExpectGemm(31, 17, 45, false, false, &c, {}, 201);  // defaults: alpha = beta = 1
  ExpectGemm(31, 17, 45, false, true, &c, {Attribute::Float("beta", 0.0f)}, 204);  // C unused
  ExpectGemm(31, 17, 45, true, false, nullptr, {Attribute::Float("alpha", -2.5f)}, 207);
}

TEST(CudaGemm, LargeAndEmpty) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<int64_t> row = {384};
  ExpectGemm(300, 384, 256, false, true, &row, {}, 301);  // 115k outputs
  const std::vector<int64_t> c = {5, 7};
  ExpectGemm(5, 7, 0, false, false, &c, {Attribute::Float("beta", 0.5f)}, 304);  // K = 0
  ExpectGemm(5, 7, 0, true, false, nullptr, {}, 307);                            // K = 0, no C
  const std::vector<int64_t> empty_c = {7};
  ExpectGemm(0, 7, 4, false, false, &empty_c, {}, 310);  // M = 0
}

// ---- Conv -------------------------------------------------------------------------

// cuDNN may pick Winograd or FFT algorithms, whose transforms round
// intermediates of the order of the sum of |terms| rather than of the
// result; float32 gets a little absolute slack for that, and 16-bit results
// (rounded once from float32 on both backends) get 2.5x the default.
Tolerance ConvTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return {1e-4, 1e-4};
    case DType::kFloat16: return {5e-3, 5e-3};
    default: return {4e-2, 4e-2};
  }
}

// Conv of random X, W (and B when `bias`) in every CUDA float dtype
// (opset 22: bfloat16 Conv).
void ExpectConv(const std::vector<int64_t>& x_dims, const std::vector<int64_t>& w_dims,
                const std::vector<Attribute>& attributes, bool bias, unsigned seed,
                const std::string& what) {
  for (DType dtype : CudaFloatTypes()) {
    std::vector<Tensor> inputs = {RandomTensor(dtype, x_dims, seed),
                                  RandomTensor(dtype, w_dims, seed + 1)};
    if (bias) inputs.push_back(RandomTensor(dtype, {w_dims[0]}, seed + 2));
    SingleNode node("Conv", inputs, attributes, 22);
    ExpectCudaMatchesCpu(node,
                         absl::StrCat("Conv ", what, " ", DTypeName(dtype), bias ? " bias" : ""),
                         ConvTolerance(dtype));
  }
}

TEST(CudaConv, TwoDimensional) {
  CASTOR_REQUIRE_CUDA();
  for (bool bias : {true, false}) {
    ExpectConv({2, 3, 11, 13}, {4, 3, 3, 3}, {Attribute::Ints("pads", {1, 1, 1, 1})}, bias, 1,
               "3x3 pads 1");
    ExpectConv({2, 3, 11, 13}, {5, 3, 3, 2},
               {Attribute::Ints("strides", {2, 3}), Attribute::Ints("dilations", {2, 1}),
                Attribute::Ints("pads", {2, 1, 2, 1}), Attribute::Ints("kernel_shape", {3, 2})},
               bias, 4, "strides, dilations, pads");
    ExpectConv({1, 2, 9, 8}, {3, 2, 1, 1}, {}, bias, 7, "pointwise");
  }
}

TEST(CudaConv, AsymmetricPads) {
  CASTOR_REQUIRE_CUDA();
  ExpectConv({2, 3, 10, 9}, {4, 3, 3, 3}, {Attribute::Ints("pads", {1, 0, 2, 1})}, true, 11,
             "pads [1,0,2,1]");
  ExpectConv({2, 3, 10, 9}, {4, 3, 3, 3},
             {Attribute::Ints("pads", {0, 2, 1, 0}), Attribute::Ints("strides", {2, 2})}, false,
             14, "pads [0,2,1,0] strides 2");
}

TEST(CudaConv, AutoPad) {
  CASTOR_REQUIRE_CUDA();
  // Even input, stride 2, 3x3: total padding 1 per axis, so asymmetric.
  ExpectConv({2, 3, 12, 10}, {4, 3, 3, 3},
             {Attribute::String("auto_pad", "SAME_UPPER"), Attribute::Ints("strides", {2, 2})},
             true, 21, "SAME_UPPER stride 2");
  ExpectConv({2, 3, 12, 10}, {4, 3, 3, 3},
             {Attribute::String("auto_pad", "SAME_LOWER"), Attribute::Ints("strides", {2, 2})},
             false, 24, "SAME_LOWER stride 2");
  ExpectConv({2, 3, 11, 10}, {4, 3, 3, 3}, {Attribute::String("auto_pad", "SAME_UPPER")}, true,
             27, "SAME_UPPER stride 1");
  ExpectConv({2, 3, 11, 10}, {4, 3, 2, 3}, {Attribute::String("auto_pad", "VALID")}, true, 30,
             "VALID");
}

TEST(CudaConv, GroupsAndDepthwise) {
  CASTOR_REQUIRE_CUDA();
  ExpectConv({2, 4, 9, 10}, {6, 2, 3, 3},
             {Attribute::Int("group", 2), Attribute::Ints("pads", {1, 1, 1, 1})}, true, 31,
             "group 2");
  ExpectConv({2, 8, 12, 12}, {8, 1, 3, 3},
             {Attribute::Int("group", 8), Attribute::Ints("pads", {1, 1, 1, 1})}, true, 34,
             "depthwise");
  ExpectConv({2, 8, 12, 12}, {16, 1, 3, 3},
             {Attribute::Int("group", 8), Attribute::Ints("strides", {2, 2})}, false, 37,
             "depthwise multiplier 2");
}

TEST(CudaConv, OneAndThreeDimensional) {
  CASTOR_REQUIRE_CUDA();
  ExpectConv({2, 3, 50}, {5, 3, 4},
             {Attribute::Ints("strides", {2}), Attribute::Ints("pads", {2, 2}),
              Attribute::Ints("dilations", {2})},
             true, 41, "1-D");
  ExpectConv({2, 3, 50}, {6, 1, 5},
             {Attribute::Int("group", 3), Attribute::Ints("pads", {1, 3})}, false, 44,
             "1-D group 3 asymmetric pads");
  ExpectConv({1, 2, 5, 6, 7}, {3, 2, 2, 3, 3}, {Attribute::Ints("pads", {1, 1, 1, 1, 1, 1})},
             true, 47, "3-D");
  ExpectConv({1, 2, 5, 6, 7}, {4, 2, 3, 3, 3},
             {Attribute::String("auto_pad", "SAME_UPPER"), Attribute::Ints("strides", {2, 2, 2})},
             false, 50, "3-D SAME_UPPER stride 2");
}

TEST(CudaConv, Large) {
  CASTOR_REQUIRE_CUDA();
  // Y [4, 32, 32, 32]: 131k outputs.
  ExpectConv({4, 16, 32, 32}, {32, 16, 3, 3}, {Attribute::Ints("pads", {1, 1, 1, 1})}, true, 61,
             "large");
}

TEST(CudaConv, EmptyAndUnsupported) {
  CASTOR_REQUIRE_CUDA();
  ExpectConv({0, 3, 8, 8}, {4, 3, 3, 3}, {}, true, 71, "empty batch");
  // 4 spatial axes run on the CPU; cuDNN convolutions have at most 3.
  SingleNode node("Conv",
                  {RandomTensor(DType::kFloat32, {1, 1, 3, 3, 3, 3}, 74),
                   RandomTensor(DType::kFloat32, {1, 1, 2, 2, 2, 2}, 75)},
                  {}, 17);
  ASSERT_TRUE(node.status().ok()) << node.status();
  absl::StatusOr<std::vector<Tensor>> result = node.Run(Gpu());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(std::string(result.status().message()).find("1 to 3 spatial axes"),
            std::string::npos)
      << result.status();
}

// ---- ConvTranspose ----------------------------------------------------------------

// ConvTranspose of random X, W (and B, M = W.dim(1) * group entries, when
// `bias`) in every CUDA float dtype (opset 22: bfloat16), CUDA against CPU.
void ExpectConvTranspose(const std::vector<int64_t>& x_dims, const std::vector<int64_t>& w_dims,
                         const std::vector<Attribute>& attributes, int64_t group, bool bias,
                         unsigned seed, const std::string& what) {
  for (DType dtype : CudaFloatTypes()) {
    std::vector<Tensor> inputs = {RandomTensor(dtype, x_dims, seed),
                                  RandomTensor(dtype, w_dims, seed + 1)};
    if (bias) inputs.push_back(RandomTensor(dtype, {w_dims[1] * group}, seed + 2));
    SingleNode node("ConvTranspose", inputs, attributes, 22);
    ExpectCudaMatchesCpu(
        node, absl::StrCat("ConvTranspose ", what, " ", DTypeName(dtype), bias ? " bias" : ""),
        ConvTolerance(dtype));
  }
}

// torch's form (stride 2, pads, output_padding), asymmetric pads (a padded
// cuDNN output cropped to Y), groups with dilation, auto_pad SAME_UPPER and
// output_shape, 1-D, and castor's form (the training graph's).
TEST(CudaConvTranspose, EveryPaddingFormGroupsAndRanks) {
  CASTOR_REQUIRE_CUDA();
  for (bool bias : {true, false}) {
    ExpectConvTranspose({2, 5, 6, 7}, {5, 3, 3, 3},
                        {Attribute::Ints("strides", {2, 2}), Attribute::Ints("pads", {1, 1, 1, 1}),
                         Attribute::Ints("output_padding", {1, 1})},
                        1, bias, 40, "torch stride 2");
    ExpectConvTranspose({2, 4, 5, 6}, {4, 3, 3, 3}, {Attribute::Ints("pads", {0, 1, 2, 0})}, 1,
                        bias, 43, "asymmetric pads");
  }
  ExpectConvTranspose({2, 6, 5, 4}, {6, 2, 2, 3},
                      {Attribute::Int("group", 3), Attribute::Ints("dilations", {2, 1}),
                       Attribute::Ints("strides", {1, 2})},
                      3, true, 46, "grouped, dilated");
  ExpectConvTranspose({1, 3, 4, 5}, {3, 2, 3, 3},
                      {Attribute::String("auto_pad", "SAME_UPPER"),
                       Attribute::Ints("strides", {2, 2})},
                      1, true, 49, "SAME_UPPER");
  ExpectConvTranspose({1, 3, 4, 4}, {3, 2, 3, 3},
                      {Attribute::Ints("strides", {2, 2}), Attribute::Ints("output_shape", {8, 9})},
                      1, false, 52, "output_shape");
  ExpectConvTranspose({2, 3, 19}, {3, 4, 5},
                      {Attribute::Ints("strides", {3}), Attribute::Ints("pads", {2, 1})}, 1, true,
                      55, "1-D");
  for (DType dtype : CudaFloatTypes()) {
    SingleNode node("ConvTranspose",
                    {RandomTensor(dtype, {2, 4, 5, 5}, 58), RandomTensor(dtype, {4, 3, 3, 3}, 59)},
                    {Attribute::Ints("strides", {2, 2}), Attribute::Ints("pads", {1, 1, 1, 1})},
                    1, 1, kCastorDomain);
    ExpectCudaMatchesCpu(node, absl::StrCat("castor ConvTranspose ", DTypeName(dtype)),
                         ConvTolerance(dtype));
  }
}

// ---- ConvGrad ---------------------------------------------------------------------

// ConvGrad(dY, X, W) with `outputs` outputs (dX, dW, dB in that order) in
// every CUDA float dtype; dY has Conv's output dims for X and W.
void ExpectConvGrad(const std::vector<int64_t>& x_dims, const std::vector<int64_t>& w_dims,
                    const std::vector<Attribute>& attributes, int outputs, unsigned seed,
                    const std::string& what) {
  const Tensor y = RunOk("Conv",
                         {RandomTensor(DType::kFloat32, x_dims, seed),
                          RandomTensor(DType::kFloat32, w_dims, seed + 1)},
                         attributes, 17)[0];
  ASSERT_FALSE(y.dims().empty()) << what;
  for (DType dtype : CudaFloatTypes()) {
    SingleNode node("ConvGrad",
                    {RandomTensor(dtype, y.dims(), seed + 2), RandomTensor(dtype, x_dims, seed),
                     RandomTensor(dtype, w_dims, seed + 1)},
                    attributes, 1, outputs, kCastorDomain);
    ExpectCudaMatchesCpu(node,
                         absl::StrCat("ConvGrad ", what, " ", DTypeName(dtype), " ", outputs,
                                      " outputs"),
                         ConvTolerance(dtype));
  }
}

TEST(CudaConvGrad, TwoDimensional) {
  CASTOR_REQUIRE_CUDA();
  ExpectConvGrad({2, 3, 11, 13}, {4, 3, 3, 3}, {Attribute::Ints("pads", {1, 1, 1, 1})}, 3, 1,
                 "3x3 pads 1");
  ExpectConvGrad({2, 4, 9, 10}, {6, 2, 3, 3},
                 {Attribute::Int("group", 2), Attribute::Ints("strides", {2, 1}),
                  Attribute::Ints("pads", {1, 0, 1, 1}), Attribute::Ints("dilations", {1, 2})},
                 3, 4, "group 2, strides, dilations, asymmetric pads");
  ExpectConvGrad({2, 8, 12, 12}, {8, 1, 3, 3},
                 {Attribute::Int("group", 8), Attribute::String("auto_pad", "SAME_UPPER"),
                  Attribute::Ints("strides", {2, 2})},
                 3, 7, "depthwise SAME_UPPER stride 2");
}

TEST(CudaConvGrad, OneAndThreeDimensional) {
  CASTOR_REQUIRE_CUDA();
  ExpectConvGrad({3, 3, 17}, {4, 3, 3},
                 {Attribute::Ints("strides", {2}), Attribute::Ints("pads", {1, 1})}, 3, 11,
                 "1-D");
  ExpectConvGrad({1, 2, 4, 5, 6}, {3, 2, 2, 2, 2},
                 {Attribute::String("auto_pad", "SAME_UPPER"),
                  Attribute::Ints("strides", {2, 1, 1})},
                 3, 14, "3-D SAME_UPPER");
}

TEST(CudaConvGrad, FewerOutputs) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<Attribute> attributes = {Attribute::Ints("pads", {1, 0, 1, 0})};
  ExpectConvGrad({2, 3, 8, 9}, {4, 3, 3, 3}, attributes, 1, 21, "dX only");
  ExpectConvGrad({2, 3, 8, 9}, {4, 3, 3, 3}, attributes, 2, 24, "dX and dW");
}

TEST(CudaConvGrad, Large) {
  CASTOR_REQUIRE_CUDA();
  // dY [4, 32, 32, 32]: 131k elements; dW sums 4096 products per element.
  ExpectConvGrad({4, 16, 32, 32}, {32, 16, 3, 3}, {Attribute::Ints("pads", {1, 1, 1, 1})}, 3,
                 31, "large");
}

TEST(CudaConvGrad, WrongGradientShapeIsRefused) {
  CASTOR_REQUIRE_CUDA();
  SingleNode node("ConvGrad",
                  {RandomTensor(DType::kFloat32, {2, 4, 5, 5}, 41),
                   RandomTensor(DType::kFloat32, {2, 3, 8, 8}, 42),
                   RandomTensor(DType::kFloat32, {4, 3, 3, 3}, 43)},
                  {}, 1, 3, kCastorDomain);
  ExpectBothRefuse(node, "Conv's output for X and W", "ConvGrad with a wrong dY");
}

}  // namespace
}  // namespace castor
