// CUDA pool and normalization kernels (backend/cuda/pool.cu,
// normalization.cu) against the CPU backend: MaxPool (Indices in both
// storage orders, ties, NaN, int8/uint8), AveragePool (count_include_pad),
// the global pools, BatchNormalization (inference, training with running
// statistics at opsets 9/14/15, spatial = 0, castor's
// BatchNormalizationTraining), LayerNormalization (last axis
// and last two axes, warp and block rows, broadcast Scale/B, optional
// outputs, stash_type), InstanceNormalization (1- to 3-D, 1-element and
// block-long rows, a mean far from zero; GroupNorm's [N, G, -1] form) and
// the com.castor gradients of each, in float32,
// float16 and bfloat16, over overlapping and disjoint windows, padding,
// ceil_mode, auto_pad, dilations, odd sizes and tensors of >= 100k elements.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "graph/gradient_builder.h"
#include "gtest/gtest.h"
#include "tests/cuda_test_util.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using testing::Count;
using testing::CudaFloatTypes;
using testing::DefaultTolerance;
using testing::ExpectBothRefuse;
using testing::ExpectCudaMatchesCpu;
using testing::Gpu;
using testing::I8;
using testing::Make;
using testing::Random;
using testing::RandomTensor;
using testing::RunOk;
using testing::SingleNode;
using testing::Tolerance;
using testing::U8;

// Pools take bfloat16 from opset 22; every pool attribute exists there.
constexpr int64_t kPoolOpset = 22;

// The tolerance of `dtype` with at least 1e-4 relative and absolute: for
// outputs that are sums of thousands of terms (the CPU sums in float64, the
// GPU in float32 in another order).
Tolerance SumTolerance(DType dtype) {
  const Tolerance t = DefaultTolerance(dtype);
  return {std::max(t.rtol, 1e-4), std::max(t.atol, 1e-4)};
}

// Builds one node and compares CUDA with the CPU.
void Check(const std::string& op, std::vector<Tensor> inputs, std::vector<Attribute> attributes,
           int64_t opset, int outputs, const std::string& what,
           std::optional<Tolerance> tolerance = std::nullopt) {
  SingleNode node(op, std::move(inputs), std::move(attributes), opset, outputs);
  ExpectCudaMatchesCpu(node, what, tolerance);
}

// The same for a com.castor gradient op.
void CheckGrad(const std::string& op, std::vector<Tensor> inputs,
               std::vector<Attribute> attributes, int outputs, const std::string& what,
               std::optional<Tolerance> tolerance = std::nullopt) {
  SingleNode node(op, std::move(inputs), std::move(attributes), 1, outputs, kCastorDomain);
  ExpectCudaMatchesCpu(node, what, tolerance);
}

// Small integers in [-3, 3]: windows full of ties.
Tensor Integers(DType dtype, const std::vector<int64_t>& dims, unsigned seed) {
  return Make(dtype, dims, Random(Count(dims), seed, /*integers=*/true));
}

// The gradient ops' scale dtypes to try with X of `dtype`: X's own (what
// autodiff emits) and float32.
std::vector<DType> ScaleDTypes(DType dtype) {
  if (dtype == DType::kFloat32) return {dtype};
  return {dtype, DType::kFloat32};
}

// ---- window cases -------------------------------------------------------------------

struct PoolCase {
  std::string name;
  std::vector<int64_t> x_dims, kernel, strides, dilations, pads;
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false;
};

std::vector<Attribute> WindowAttributes(const PoolCase& c) {
  std::vector<Attribute> attrs = {Attribute::Ints("kernel_shape", c.kernel)};
  if (!c.strides.empty()) attrs.push_back(Attribute::Ints("strides", c.strides));
  if (!c.dilations.empty()) attrs.push_back(Attribute::Ints("dilations", c.dilations));
  if (!c.pads.empty()) attrs.push_back(Attribute::Ints("pads", c.pads));
  if (c.auto_pad != "NOTSET") attrs.push_back(Attribute::String("auto_pad", c.auto_pad));
  if (c.ceil_mode) attrs.push_back(Attribute::Int("ceil_mode", 1));
  return attrs;
}

std::vector<Attribute> With(std::vector<Attribute> attrs, Attribute extra) {
  attrs.push_back(std::move(extra));
  return attrs;
}

const std::vector<PoolCase>& PoolCases() {
  static const std::vector<PoolCase> cases = {
      // 3x3 stride 2 pad 1 (ResNet's stem pool): overlapping, >= 100k elements.
      {"2-D 3x3/2 pad 1, large", {4, 8, 61, 63}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}},
      {"2-D 2x2/2 disjoint, odd, ceil_mode", {2, 3, 9, 11}, {2, 2}, {2, 2}, {}, {}, "NOTSET",
       true},
      {"2-D 3x2/1 dilated, asymmetric pads", {2, 3, 10, 9}, {3, 2}, {1, 1}, {2, 1},
       {2, 0, 1, 1}},
      {"2-D SAME_UPPER 3x3/2", {1, 4, 7, 8}, {3, 3}, {2, 2}, {}, {}, "SAME_UPPER"},
      {"2-D SAME_LOWER 2x3/(1,2)", {1, 2, 6, 5}, {2, 3}, {1, 2}, {}, {}, "SAME_LOWER"},
      {"2-D VALID 3x3/(2,3) ceil_mode", {2, 2, 8, 7}, {3, 3}, {2, 3}, {}, {}, "VALID", true},
      {"1-D 4/3 pads ceil_mode", {3, 4, 17}, {4}, {3}, {}, {1, 2}, "NOTSET", true},
      {"3-D 2x3x2 dilated pads", {2, 3, 5, 6, 7}, {2, 3, 2}, {2, 1, 2}, {1, 1, 2},
       {0, 1, 1, 1, 1, 0}},
  };
  return cases;
}

// ---- pools -------------------------------------------------------------------------

TEST(CudaPool, MaxPoolWithAndWithoutIndices) {
  CASTOR_REQUIRE_CUDA();
  for (const PoolCase& c : PoolCases()) {
    for (DType dtype : CudaFloatTypes()) {
      const Tensor x = RandomTensor(dtype, c.x_dims, 11);
      const std::string what = c.name + " " + DTypeName(dtype);
      Check("MaxPool", {x}, WindowAttributes(c), kPoolOpset, 1, "MaxPool " + what);
      for (int64_t order : {0, 1}) {
        Check("MaxPool", {x}, With(WindowAttributes(c), Attribute::Int("storage_order", order)),
              kPoolOpset, 2,
              "MaxPool+Indices storage_order " + std::to_string(order) + " " + what);
      }
    }
  }
}

TEST(CudaPool, MaxPoolTiesPickTheFirstMaximum) {
  CASTOR_REQUIRE_CUDA();
  // Values in [-3, 3] (and all equal): most windows hold several maxima, so
  // the Indices (compared exactly) show which one each backend picked.
  for (const PoolCase& c : PoolCases()) {
    for (DType dtype : CudaFloatTypes()) {
      for (int64_t order : {0, 1}) {
        Check("MaxPool", {Integers(dtype, c.x_dims, 13)},
              With(WindowAttributes(c), Attribute::Int("storage_order", order)), kPoolOpset, 2,
              "MaxPool ties " + c.name + " " + DTypeName(dtype));
      }
    }
  }
  const PoolCase& c = PoolCases()[2];
  Check("MaxPool", {Make(DType::kFloat32, c.x_dims, std::vector<double>(Count(c.x_dims), 0.5))},
        WindowAttributes(c), kPoolOpset, 2, "MaxPool all equal");
}

TEST(CudaPool, MaxPoolNaNWins) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<int64_t> dims = {2, 3, 9, 10};
  std::vector<double> values = Random(Count(dims), 17);
  for (size_t i = 0; i < values.size(); i += 23) {
    values[i] = std::numeric_limits<double>::quiet_NaN();
  }
  for (const PoolCase& c : {PoolCases()[1], PoolCases()[2]}) {
    for (DType dtype : CudaFloatTypes()) {
      Check("MaxPool", {Make(dtype, dims, values)},
            With(WindowAttributes(c), Attribute::Int("storage_order", 0)), kPoolOpset, 2,
            "MaxPool NaN " + c.name + " " + DTypeName(dtype));
    }
  }
}

TEST(CudaPool, MaxPoolInt8AndUInt8) {
  CASTOR_REQUIRE_CUDA();
  for (const PoolCase& c : PoolCases()) {
    std::mt19937 rng(19);
    std::uniform_int_distribution<int> value(-128, 127);
    std::vector<int8_t> s8(static_cast<size_t>(Count(c.x_dims)));
    std::vector<uint8_t> u8(s8.size());
    for (size_t i = 0; i < s8.size(); ++i) {
      s8[i] = static_cast<int8_t>(value(rng));
      u8[i] = static_cast<uint8_t>(value(rng) + 128);
    }
    Check("MaxPool", {I8(c.x_dims, s8)}, WindowAttributes(c), kPoolOpset, 2,
          "MaxPool int8 " + c.name);
    Check("MaxPool", {U8(c.x_dims, u8)}, WindowAttributes(c), kPoolOpset, 1,
          "MaxPool uint8 " + c.name);
  }
}

TEST(CudaPool, AveragePoolCountIncludePad) {
  CASTOR_REQUIRE_CUDA();
  for (const PoolCase& c : PoolCases()) {
    for (DType dtype : CudaFloatTypes()) {
      const Tensor x = RandomTensor(dtype, c.x_dims, 23);
      for (int64_t include : {0, 1}) {
        Check("AveragePool", {x},
              With(WindowAttributes(c), Attribute::Int("count_include_pad", include)),
              kPoolOpset, 1,
              "AveragePool count_include_pad " + std::to_string(include) + " " + c.name + " " +
                  DTypeName(dtype));
      }
    }
  }
}

TEST(CudaPool, GlobalPools) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 3, 7, 5}, {4, 64, 23, 17}, {2, 5, 300}, {1, 2, 3, 4, 5}, {3, 2, 1, 1}, {1, 3, 181, 191}};
  for (const std::vector<int64_t>& dims : shapes) {
    for (DType dtype : CudaFloatTypes()) {
      const Tensor x = RandomTensor(dtype, dims, 29);
      const std::string what = DTypeName(dtype) + std::string(" ") + std::to_string(Count(dims));
      Check("GlobalAveragePool", {x}, {}, kPoolOpset, 1, "GlobalAveragePool " + what);
      Check("GlobalMaxPool", {x}, {}, kPoolOpset, 1, "GlobalMaxPool " + what);
    }
  }
  // A NaN makes its plane's max NaN; -inf planes stay -inf.
  std::vector<double> values = Random(2 * 3 * 35, 31);
  values[40] = std::numeric_limits<double>::quiet_NaN();
  for (int i = 70; i < 105; ++i) values[i] = -std::numeric_limits<double>::infinity();
  for (DType dtype : CudaFloatTypes()) {
    Check("GlobalMaxPool", {Make(dtype, {2, 3, 5, 7}, values)}, {}, kPoolOpset, 1,
          std::string("GlobalMaxPool NaN/-inf ") + DTypeName(dtype));
  }
}

// ---- pool gradients ----------------------------------------------------------------

// dY for the pool `op` of `c` over X (the CPU forward gives its dims).
Tensor PoolOutputGrad(const std::string& op, const PoolCase& c, DType dtype, unsigned seed) {
  const std::vector<Tensor> y =
      RunOk(op, {RandomTensor(DType::kFloat32, c.x_dims, 1)}, WindowAttributes(c), kPoolOpset);
  return RandomTensor(dtype, y[0].dims(), seed);
}

TEST(CudaPoolGrad, MaxPoolGrad) {
  CASTOR_REQUIRE_CUDA();
  for (const PoolCase& c : PoolCases()) {
    for (DType dtype : CudaFloatTypes()) {
      const Tensor dy = PoolOutputGrad("MaxPool", c, dtype, 37);
      const std::string what = c.name + " " + DTypeName(dtype);
      CheckGrad("MaxPoolGrad", {dy, RandomTensor(dtype, c.x_dims, 38)}, WindowAttributes(c), 1,
                "MaxPoolGrad " + what);
      // Ties: every window routes its gradient to the same first maximum.
      CheckGrad("MaxPoolGrad", {dy, Integers(dtype, c.x_dims, 39)}, WindowAttributes(c), 1,
                "MaxPoolGrad ties " + what);
    }
  }
}

TEST(CudaPoolGrad, AveragePoolGrad) {
  CASTOR_REQUIRE_CUDA();
  for (const PoolCase& c : PoolCases()) {
    for (DType dtype : CudaFloatTypes()) {
      const Tensor dy = PoolOutputGrad("AveragePool", c, dtype, 41);
      const Tensor x = RandomTensor(dtype, c.x_dims, 42);
      for (int64_t include : {0, 1}) {
        CheckGrad("AveragePoolGrad", {dy, x},
                  With(WindowAttributes(c), Attribute::Int("count_include_pad", include)), 1,
                  "AveragePoolGrad count_include_pad " + std::to_string(include) + " " +
                      c.name + " " + DTypeName(dtype));
      }
    }
  }
}

TEST(CudaPoolGrad, GlobalAveragePoolGrad) {
  CASTOR_REQUIRE_CUDA();
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{2, 3, 7, 5}, {4, 64, 23, 17}, {2, 5, 301}}) {
    std::vector<int64_t> y_dims(dims.size(), 1);
    y_dims[0] = dims[0];
    y_dims[1] = dims[1];
    for (DType dtype : CudaFloatTypes()) {
      CheckGrad("GlobalAveragePoolGrad",
                {RandomTensor(dtype, y_dims, 43), RandomTensor(dtype, dims, 44)}, {}, 1,
                std::string("GlobalAveragePoolGrad ") + DTypeName(dtype));
    }
  }
}

// ---- BatchNormalization ------------------------------------------------------------

// X, scale, B, mean, var for X of `dims` (C = dims[1], or the product of
// dims[1:] when `per_entry`): X in `x_dtype`, scale/B in `param_dtype`,
// mean/var (var > 0) in `stats_dtype`.
std::vector<Tensor> BatchNormInputs(const std::vector<int64_t>& dims, DType x_dtype,
                                    DType param_dtype, DType stats_dtype, unsigned seed,
                                    bool per_entry = false) {
  const std::vector<int64_t> param_dims =
      per_entry ? std::vector<int64_t>(dims.begin() + 1, dims.end())
                : std::vector<int64_t>{dims[1]};
  return {RandomTensor(x_dtype, dims, seed, -2.0, 3.0),
          RandomTensor(param_dtype, param_dims, seed + 1),
          RandomTensor(param_dtype, param_dims, seed + 2),
          RandomTensor(stats_dtype, param_dims, seed + 3),
          RandomTensor(stats_dtype, param_dims, seed + 4, 0.5, 2.0)};
}

const std::vector<std::vector<int64_t>>& BatchNormShapes() {
  static const std::vector<std::vector<int64_t>> shapes = {
      {8, 16, 29, 31}, {5, 3}, {3, 4, 7}, {2, 3, 3, 4, 5}, {1, 130, 2, 2}};
  return shapes;
}

TEST(CudaBatchNorm, InferenceMode) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<Attribute> attrs = {Attribute::Float("epsilon", 1e-3f)};
  for (const std::vector<int64_t>& dims : BatchNormShapes()) {
    for (DType dtype : CudaFloatTypes()) {
      const std::string what = std::string(DTypeName(dtype)) + " " + std::to_string(Count(dims));
      // Opset 15: float32 scale/B/mean/var with any X; all of X's dtype.
      Check("BatchNormalization",
            BatchNormInputs(dims, dtype, DType::kFloat32, DType::kFloat32, 51), attrs, 15, 1,
            "BN inference f32 params, X " + what);
      Check("BatchNormalization", BatchNormInputs(dims, dtype, dtype, dtype, 52), attrs, 15, 1,
            "BN inference X-typed params " + what);
    }
  }
  // spatial = 0 (opset 8): per [C, D1, ...] entry statistics.
  Check("BatchNormalization",
        BatchNormInputs({4, 3, 5}, DType::kFloat32, DType::kFloat32, DType::kFloat32, 53, true),
        {Attribute::Int("spatial", 0)}, 8, 1, "BN inference spatial=0");
}

TEST(CudaBatchNorm, TrainingModeOpset15) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<Attribute> attrs = {Attribute::Float("epsilon", 1e-2f),
                                        Attribute::Float("momentum", 0.8f),
                                        Attribute::Int("training_mode", 1)};
  for (const std::vector<int64_t>& dims : BatchNormShapes()) {
    for (DType dtype : CudaFloatTypes()) {
      const std::string what = std::string(DTypeName(dtype)) + " " + std::to_string(Count(dims));
      // Y, running_mean, running_var.
      Check("BatchNormalization",
            BatchNormInputs(dims, dtype, DType::kFloat32, DType::kFloat32, 61), attrs, 15, 3,
            "BN training f32 params, X " + what);
      Check("BatchNormalization", BatchNormInputs(dims, dtype, dtype, dtype, 62), attrs, 15, 3,
            "BN training X-typed params " + what);
      // Mixed parameter dtypes: bfloat16 scale/B, float16 mean/var.
      Check("BatchNormalization",
            BatchNormInputs(dims, dtype, DType::kBFloat16, DType::kFloat16, 63), attrs, 15, 3,
            "BN training bf16 params f16 stats, X " + what);
      // Training without the running-statistics outputs.
      Check("BatchNormalization",
            BatchNormInputs(dims, dtype, DType::kFloat32, DType::kFloat32, 64), attrs, 15, 1,
            "BN training Y only " + what);
    }
  }
}

TEST(CudaBatchNorm, TrainingModeOlderOpsets) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<Attribute> attrs = {Attribute::Float("momentum", 0.7f)};
  for (DType dtype : CudaFloatTypes()) {
    // Opset 14: X, scale, B share T; mean/var U.
    Check("BatchNormalization",
          BatchNormInputs({6, 5, 11, 3}, dtype, dtype, DType::kFloat32, 71),
          {Attribute::Float("momentum", 0.7f), Attribute::Int("training_mode", 1)}, 14, 3,
          std::string("BN training opset 14 ") + DTypeName(dtype));
  }
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    // Opset 9: training when the optional outputs are requested: running
    // mean/var, then the saved batch mean/var.
    for (int outputs : {2, 3, 5}) {
      Check("BatchNormalization", BatchNormInputs({6, 5, 11, 3}, dtype, dtype, dtype, 72), attrs,
            9, outputs,
            "BN opset 9 with " + std::to_string(outputs) + " outputs " + DTypeName(dtype));
    }
  }
  Check("BatchNormalization",
        BatchNormInputs({7, 3, 5}, DType::kFloat32, DType::kFloat32, DType::kFloat32, 73, true),
        {Attribute::Int("spatial", 0)}, 8, 5, "BN training spatial=0");
}

// castor's BatchNormalizationTraining (the training graph's form): the
// running variance takes the unbiased batch variance.
TEST(CudaBatchNorm, CastorTrainingForm) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<Attribute> attrs = {Attribute::Float("epsilon", 1e-2f),
                                        Attribute::Float("momentum", 0.8f)};
  for (const std::vector<int64_t>& dims : BatchNormShapes()) {
    for (DType dtype : CudaFloatTypes()) {
      const std::string what = std::string(DTypeName(dtype)) + " " + std::to_string(Count(dims));
      CheckGrad("BatchNormalizationTraining",
                BatchNormInputs(dims, dtype, DType::kFloat32, DType::kFloat32, 81), attrs, 3,
                "BatchNormalizationTraining f32 params, X " + what);
      CheckGrad("BatchNormalizationTraining", BatchNormInputs(dims, dtype, dtype, dtype, 82),
                attrs, 3, "BatchNormalizationTraining X-typed params " + what);
      // The batch mean (output 3) and the fused Relu (fuse-batchnorm-relu).
      std::vector<Attribute> relu_attrs = attrs;
      relu_attrs.push_back(Attribute::Int("relu", 1));
      CheckGrad("BatchNormalizationTraining",
                BatchNormInputs(dims, dtype, DType::kFloat32, DType::kFloat32, 83), relu_attrs, 4,
                "BatchNormalizationTraining relu = 1, batch mean, X " + what);
    }
  }
  // One value per channel: both backends refuse it.
  SingleNode single("BatchNormalizationTraining",
                    BatchNormInputs({1, 4}, DType::kFloat32, DType::kFloat32, DType::kFloat32, 83),
                    attrs, 1, 3, kCastorDomain);
  ExpectBothRefuse(single, "1 value per channel", "BatchNormalizationTraining X [1, 4]");
}

TEST(CudaBatchNormGrad, TrainingGradients) {
  CASTOR_REQUIRE_CUDA();
  for (const std::vector<int64_t>& dims : BatchNormShapes()) {
    for (DType dtype : CudaFloatTypes()) {
      const std::string what = std::string(DTypeName(dtype)) + " " + std::to_string(Count(dims));
      const Tensor dy = RandomTensor(dtype, dims, 81);
      const Tensor x = RandomTensor(dtype, dims, 82, -2.0, 3.0);
      for (DType scale_dtype : ScaleDTypes(dtype)) {
        const Tensor scale = RandomTensor(scale_dtype, {dims[1]}, 83);
        CheckGrad("BatchNormalizationGrad", {dy, x, scale}, {Attribute::Float("epsilon", 1e-3f)},
                  3, "BN grad scale " + std::string(DTypeName(scale_dtype)) + ", X " + what,
                  SumTolerance(dtype));
        CheckGrad("BatchNormalizationGrad", {dy, x, scale}, {}, 1, "BN grad dX only, X " + what,
                  SumTolerance(dtype));
        // The mean given (the forward's in a training graph) is the one used.
        const Tensor mean = RandomTensor(DType::kFloat32, {dims[1]}, 84);
        CheckGrad("BatchNormalizationGrad", {dy, x, scale, mean}, {}, 3,
                  "BN grad with a mean input, X " + what, SumTolerance(dtype));
        // A fused Relu's output (half of it not positive) masks dY.
        const Tensor relu_output = RandomTensor(dtype, dims, 85);
        CheckGrad("BatchNormalizationGrad", {dy, x, scale, Tensor(), relu_output}, {}, 3,
                  "BN grad with a fused Relu's output, X " + what, SumTolerance(dtype));
        CheckGrad("BatchNormalizationGrad", {dy, x, scale, mean, relu_output}, {}, 3,
                  "BN grad with a mean and a fused Relu's output, X " + what,
                  SumTolerance(dtype));
      }
    }
  }
}

// ---- LayerNormalization ------------------------------------------------------------

struct LayerNormCase {
  std::string name;
  std::vector<int64_t> x_dims;
  int64_t axis;
  std::vector<int64_t> scale_dims, bias_dims;  // no bias when empty
};

const std::vector<LayerNormCase>& LayerNormCases() {
  static const std::vector<LayerNormCase> cases = {
      {"last axis, warp rows", {64, 33, 40}, -1, {40}, {40}},
      {"last axis, block rows, >= 100k", {40, 2600}, -1, {2600}, {2600}},
      {"last axis, 1025-long rows", {7, 1025}, 1, {1025}, {}},
      {"last two axes", {6, 12, 50}, -2, {12, 50}, {12, 50}},
      {"last two axes, long rows", {3, 9, 301}, 1, {9, 301}, {}},
      {"last two axes, Scale/B broadcast", {4, 6, 10}, -2, {10}, {6, 1}},
      {"Scale [1, D]", {5, 7, 9}, -1, {1, 9}, {9}},
      {"Scale over an outer axis", {3, 5, 8}, -1, {3, 1, 8}, {}},
      {"whole tensor (axis 0)", {3, 700}, 0, {3, 700}, {700}},
  };
  return cases;
}

std::vector<Tensor> LayerNormInputs(const LayerNormCase& c, DType dtype, unsigned seed) {
  std::vector<Tensor> inputs = {RandomTensor(dtype, c.x_dims, seed, -2.0, 3.0),
                                RandomTensor(dtype, c.scale_dims, seed + 1)};
  if (!c.bias_dims.empty()) inputs.push_back(RandomTensor(dtype, c.bias_dims, seed + 2));
  return inputs;
}

TEST(CudaLayerNorm, AxesBiasAndOptionalOutputs) {
  CASTOR_REQUIRE_CUDA();
  for (const LayerNormCase& c : LayerNormCases()) {
    for (DType dtype : CudaFloatTypes()) {
      const std::vector<Attribute> attrs = {Attribute::Int("axis", c.axis),
                                            Attribute::Float("epsilon", 1e-4f)};
      for (int outputs : {1, 2, 3}) {
        Check("LayerNormalization", LayerNormInputs(c, dtype, 91), attrs, 17, outputs,
              "LayerNorm " + c.name + " " + DTypeName(dtype) + " with " +
                  std::to_string(outputs) + " outputs");
      }
    }
  }
  // Mean/InvStdDev in bfloat16 (stash_type 16).
  const LayerNormCase& c = LayerNormCases()[0];
  Check("LayerNormalization", LayerNormInputs(c, DType::kFloat32, 92),
        {Attribute::Int("axis", c.axis), Attribute::Int("stash_type", 16)}, 17, 3,
        "LayerNorm stash_type bfloat16");
}

// castor's LayerNormalization (com.castor, the fold-layernorm-casts form):
// a 16-bit X with float32 Scale and B, every case and output count.
TEST(CudaLayerNorm, CastorFormFloat32Parameters) {
  CASTOR_REQUIRE_CUDA();
  for (const LayerNormCase& c : LayerNormCases()) {
    for (DType dtype : CudaFloatTypes()) {
      if (dtype == DType::kFloat32) continue;
      std::vector<Tensor> inputs = LayerNormInputs(c, DType::kFloat32, 93);
      inputs[0] = RandomTensor(dtype, c.x_dims, 93, -2.0, 3.0);
      const std::vector<Attribute> attrs = {Attribute::Int("axis", c.axis)};
      for (int outputs : {1, 3}) {
        SingleNode node("LayerNormalization", inputs, attrs, 1, outputs, kCastorDomain);
        ExpectCudaMatchesCpu(node, "castor LayerNorm " + c.name + " " + DTypeName(dtype) +
                                       " with float32 parameters, " + std::to_string(outputs) +
                                       " outputs");
      }
    }
  }
}

TEST(CudaLayerNormGrad, Gradients) {
  CASTOR_REQUIRE_CUDA();
  for (const LayerNormCase& c : LayerNormCases()) {
    const int64_t rank = static_cast<int64_t>(c.x_dims.size());
    const int64_t normalised_axes = rank - (c.axis < 0 ? c.axis + rank : c.axis);
    if (static_cast<int64_t>(c.scale_dims.size()) > normalised_axes) {
      continue;  // the gradient op's scale covers only the normalised axes
    }
    for (DType dtype : CudaFloatTypes()) {
      const Tensor dy = RandomTensor(dtype, c.x_dims, 101);
      const Tensor x = RandomTensor(dtype, c.x_dims, 102, -2.0, 3.0);
      const std::vector<Attribute> attrs = {Attribute::Int("axis", c.axis),
                                            Attribute::Float("epsilon", 1e-4f)};
      for (DType scale_dtype : ScaleDTypes(dtype)) {
        const Tensor scale = RandomTensor(scale_dtype, c.scale_dims, 103);
        const std::string what = c.name + ", X " + DTypeName(dtype) + ", scale " +
                                 DTypeName(scale_dtype);
        CheckGrad("LayerNormalizationGrad", {dy, x, scale}, attrs, 3, "LayerNormGrad " + what,
                  SumTolerance(dtype));
        CheckGrad("LayerNormalizationGrad", {dy, x, scale}, attrs, 1,
                  "LayerNormGrad dX only " + what, SumTolerance(dtype));
      }
    }
  }
}

// ---- InstanceNormalization ---------------------------------------------------------

struct InstanceNormCase {
  std::string name;
  std::vector<int64_t> x_dims;
  bool mean_offset = false;  // X far from zero: 1e4 + [0, 1) (16-bit: 300 + [0, 16))
};

const std::vector<InstanceNormCase>& InstanceNormCases() {
  static const std::vector<InstanceNormCase> cases = {
      {"2-D odd, warp rows", {4, 6, 7, 9}},
      {"1-element spatial", {3, 5, 1}},
      {"3-D", {2, 3, 4, 5, 3}},
      {"block rows, >= 100k", {2, 3, 130, 131}},
      {"GroupNorm form [N, G, -1]", {8, 4, 300}},
      {"mean offset", {2, 3, 11, 13}, true},
  };
  return cases;
}

Tensor InstanceNormX(const InstanceNormCase& c, DType dtype, unsigned seed) {
  if (!c.mean_offset) return RandomTensor(dtype, c.x_dims, seed, -2.0, 3.0);
  return dtype == DType::kFloat32 ? RandomTensor(dtype, c.x_dims, seed, 1e4, 1e4 + 1.0)
                                  : RandomTensor(dtype, c.x_dims, seed, 300.0, 316.0);
}

TEST(CudaInstanceNorm, ShapesAndDTypes) {
  CASTOR_REQUIRE_CUDA();
  for (const InstanceNormCase& c : InstanceNormCases()) {
    for (DType dtype : CudaFloatTypes()) {
      const int64_t channels = c.x_dims[1];
      // bfloat16 InstanceNormalization is opset 22's.
      const int64_t opset = dtype == DType::kBFloat16 ? 22 : 17;
      Check("InstanceNormalization",
            {InstanceNormX(c, dtype, 111), RandomTensor(dtype, {channels}, 112),
             RandomTensor(dtype, {channels}, 113)},
            {Attribute::Float("epsilon", 1e-4f)}, opset, 1,
            "InstanceNorm " + c.name + " " + DTypeName(dtype));
    }
  }
}

TEST(CudaInstanceNormGrad, Gradients) {
  CASTOR_REQUIRE_CUDA();
  for (const InstanceNormCase& c : InstanceNormCases()) {
    for (DType dtype : CudaFloatTypes()) {
      const Tensor dy = RandomTensor(dtype, c.x_dims, 121);
      const Tensor x = InstanceNormX(c, dtype, 122);
      for (DType scale_dtype : ScaleDTypes(dtype)) {
        const Tensor scale = RandomTensor(scale_dtype, {c.x_dims[1]}, 123);
        const std::string what =
            c.name + ", X " + DTypeName(dtype) + ", scale " + DTypeName(scale_dtype);
        CheckGrad("InstanceNormalizationGrad", {dy, x, scale},
                  {Attribute::Float("epsilon", 1e-4f)}, 3, "InstanceNormGrad " + what,
                  SumTolerance(dtype));
        CheckGrad("InstanceNormalizationGrad", {dy, x, scale}, {}, 1,
                  "InstanceNormGrad dX only " + what, SumTolerance(dtype));
      }
    }
  }
}

// ---- what the kernels refuse -------------------------------------------------------

TEST(CudaPoolNormErrors, RefusedNodes) {
  CASTOR_REQUIRE_CUDA();
  // LayerNormalizationGrad's scale must broadcast to the normalised axes
  // (type inference checks only its rank).
  SingleNode bad_scale("LayerNormalizationGrad",
                       {RandomTensor(DType::kFloat32, {4, 8}, 1),
                        RandomTensor(DType::kFloat32, {4, 8}, 2),
                        RandomTensor(DType::kFloat32, {7}, 3)},
                       {}, 1, 1, kCastorDomain);
  ExpectBothRefuse(bad_scale, "does not broadcast to X's normalised axes",
                   "LayerNormalizationGrad with a [7] scale for rows of 8");
  // dY of the wrong dims for the pool.
  SingleNode bad_dy("MaxPoolGrad",
                    {RandomTensor(DType::kFloat32, {1, 2, 3, 3}, 3),
                     RandomTensor(DType::kFloat32, {1, 2, 8, 8}, 4)},
                    {Attribute::Ints("kernel_shape", {2, 2}), Attribute::Ints("strides", {2, 2})},
                    1, 1, kCastorDomain);
  ExpectBothRefuse(bad_dy, "the pool's output for X", "MaxPoolGrad with a wrong dY");
  // Pools over 4 spatial axes: the CPU runs them; CUDA says it has no kernel.
  SingleNode four_d("MaxPool", {RandomTensor(DType::kFloat32, {1, 1, 3, 3, 3, 3}, 5)},
                    {Attribute::Ints("kernel_shape", {2, 2, 2, 2})}, kPoolOpset);
  ASSERT_TRUE(four_d.status().ok()) << four_d.status();
  absl::StatusOr<std::vector<Tensor>> result = four_d.Run(Gpu());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(std::string(result.status().message()).find("kernel_shape has 4 axes"),
            std::string::npos)
      << result.status();
  // float64 is a CPU-only dtype.
  SingleNode f64("AveragePool", {RandomTensor(DType::kFloat64, {1, 2, 4, 4}, 6)},
                 {Attribute::Ints("kernel_shape", {2, 2})}, kPoolOpset);
  ASSERT_TRUE(f64.status().ok()) << f64.status();
  result = f64.Run(Gpu());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(std::string(result.status().message()).find("float64"), std::string::npos)
      << result.status();
}

}  // namespace
}  // namespace castor
