// CUDA kernels of backend/cuda/shape_ops.cu against the CPU backend:
// Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout, Transpose,
// Expand, Shape, Size, Constant, ConstantOfShape, Range, Concat, Split,
// Slice, Gather, Tile, Pad, GatherND, ScatterND, GatherElements,
// ScatterElements, Trilu, DepthToSpace, SpaceToDepth, CumSum
// (backend/cuda/reduce.cu) and com.castor
// GatherGrad, GatherNDGrad, GatherElementsGrad. The data-movement ops
// move bytes, so each runs with float and int64 data and with elements of
// every size (1, 2, 4 and 8 bytes: bool/uint8, float16/bfloat16, int32/
// float32, int64/float64); with the attribute and opset variants that
// change the code path; negative axes and steps; and >= 100k-element
// Transposes (tiled and general) and Concats.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "backend/run_node.h"
#include "graph/gradient_builder.h"
#include "tests/cuda_test_util.h"

namespace castor {
namespace {

using testing::CompareTensors;
using testing::Cpu;
using testing::CudaFloatTypes;
using testing::ExpectBothRefuse;
using testing::ExpectCudaMatchesCpu;
using testing::Gpu;
using testing::I32;
using testing::I64;
using testing::Make;
using testing::RandomTensor;
using testing::SingleNode;

// float32, int64 and one dtype of each other element size.
const std::vector<DType>& MovedTypes() {
  static const std::vector<DType> types = {DType::kFloat32,  DType::kInt64,   DType::kFloat16,
                                           DType::kBFloat16, DType::kUInt8,   DType::kBool,
                                           DType::kInt32,    DType::kFloat64, DType::kInt16};
  return types;
}
const std::vector<DType>& FloatAndInt64() {
  static const std::vector<DType> types = {DType::kFloat32, DType::kInt64};
  return types;
}

// A tensor of `dims`: random floats, or integers/bools whose elements have
// distinct byte patterns.
Tensor Data(DType dtype, const std::vector<int64_t>& dims, unsigned seed) {
  if (IsFloatingPoint(dtype)) return RandomTensor(dtype, dims, seed, -4.0, 4.0);
  Tensor t(dtype, dims);
  const size_t size = DTypeSize(dtype);
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    for (size_t b = 0; b < size; ++b) {
      t.raw()[i * size + b] =
          dtype == DType::kBool
              ? static_cast<uint8_t>(b == 0 ? ((i + seed) / 3) % 2 : 0)
              : static_cast<uint8_t>(
                    (i * 131 + static_cast<int64_t>(b) * 29 + seed * 7 + (i >> 8) * 13) & 0xff);
    }
  }
  return t;
}

std::string Name(const std::string& op, DType dtype, const std::vector<int64_t>& dims) {
  std::string s = op + " " + DTypeName(dtype) + " [";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

// Runs `op` on both backends for every dtype in `dtypes`, data input 0 of
// `dims` followed by `extra` inputs.
void ExpectOpMatches(const std::string& op, const std::vector<DType>& dtypes,
                     const std::vector<int64_t>& dims, const std::vector<Tensor>& extra,
                     const std::vector<Attribute>& attributes, int64_t opset,
                     const std::string& what, int num_outputs = 1) {
  unsigned seed = 1;
  for (DType dtype : dtypes) {
    std::vector<Tensor> inputs = {Data(dtype, dims, seed++)};
    inputs.insert(inputs.end(), extra.begin(), extra.end());
    SingleNode node(op, inputs, attributes, opset, num_outputs);
    ExpectCudaMatchesCpu(node, Name(op, dtype, dims) + " " + what);
  }
}

// ---- Reshape / Flatten / Squeeze / Unsqueeze / Identity -------------------------------

TEST(CudaShapeOps, Reshape) {
  CASTOR_REQUIRE_CUDA();
  ExpectOpMatches("Reshape", MovedTypes(), {2, 3, 4}, {I64({3}, {0, -1, 2})}, {}, 14,
                  "shape [0,-1,2]");
  ExpectOpMatches("Reshape", FloatAndInt64(), {2, 3, 4}, {I64({2}, {-1, 6})}, {}, 14, "[-1,6]");
  ExpectOpMatches("Reshape", FloatAndInt64(), {0, 4}, {I64({2}, {4, 0})},
                  {Attribute::Int("allowzero", 1)}, 14, "allowzero");
  ExpectOpMatches("Reshape", FloatAndInt64(), {300, 400}, {I64({3}, {20, -1, 30})}, {}, 14,
                  "large");
  SingleNode twice("Reshape", {Data(DType::kFloat32, {2, 3}, 1), I64({2}, {-1, -1})}, {}, 14);
  ExpectBothRefuse(twice, "more than one -1", "Reshape [-1,-1]");
}

TEST(CudaShapeOps, Flatten) {
  CASTOR_REQUIRE_CUDA();
  for (int64_t axis : {0, 1, 2, 4, -1}) {
    ExpectOpMatches("Flatten", FloatAndInt64(), {2, 3, 4, 5}, {}, {Attribute::Int("axis", axis)},
                    13, "axis " + std::to_string(axis));
  }
  ExpectOpMatches("Flatten", MovedTypes(), {2, 3, 4}, {}, {}, 13, "default axis");
}

TEST(CudaShapeOps, SqueezeAndUnsqueezeBothOpsetForms) {
  CASTOR_REQUIRE_CUDA();
  ExpectOpMatches("Squeeze", FloatAndInt64(), {3, 1, 4, 1}, {}, {Attribute::Ints("axes", {-1})}, 11,
                  "axes attribute");
  ExpectOpMatches("Squeeze", MovedTypes(), {1, 3, 1, 4}, {I64({2}, {0, -2})}, {}, 13, "axes input");
  ExpectOpMatches("Squeeze", FloatAndInt64(), {1, 3, 1, 4}, {}, {}, 13, "every size-1 axis");
  ExpectOpMatches("Unsqueeze", FloatAndInt64(), {3, 4}, {}, {Attribute::Ints("axes", {0, 3})}, 11,
                  "axes attribute");
  ExpectOpMatches("Unsqueeze", MovedTypes(), {3, 4}, {I64({3}, {4, -5, 2})}, {}, 13, "axes input");
  SingleNode bad("Squeeze", {Data(DType::kFloat32, {3, 2}, 1), I64({1}, {1})}, {}, 13);
  ExpectBothRefuse(bad, "cannot squeeze axis 1", "Squeeze size 2");
}

TEST(CudaShapeOps, Identity) {
  CASTOR_REQUIRE_CUDA();
  ExpectOpMatches("Identity", MovedTypes(), {5, 7}, {}, {}, 13, "");
  ExpectOpMatches("Identity", FloatAndInt64(), {}, {}, {}, 13, "scalar");
}

// ---- Dropout -------------------------------------------------------------------------

TEST(CudaShapeOps, DropoutInference) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<DType> floats = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                     DType::kFloat64};
  const Tensor ratio = Make(DType::kFloat32, {}, {0.5});
  ExpectOpMatches("Dropout", floats, {4, 5}, {ratio}, {}, 13, "ratio only, mask", 2);
  ExpectOpMatches("Dropout", floats, {4, 5}, {ratio}, {}, 13, "ratio only, no mask", 1);
  ExpectOpMatches("Dropout", floats, {4, 5}, {ratio, testing::Bool({}, {0})}, {}, 13,
                  "training_mode false", 2);
  ExpectOpMatches("Dropout", floats, {4, 5},
                  {Make(DType::kFloat32, {}, {0.0}), testing::Bool({}, {1})}, {}, 13,
                  "training with ratio 0", 2);
  // Opset 7: ratio attribute; the mask has the data's dtype.
  ExpectOpMatches("Dropout", {DType::kFloat32, DType::kFloat16, DType::kFloat64}, {4, 5}, {},
                  {Attribute::Float("ratio", 0.3f)}, 7, "opset 7", 2);
}

TEST(CudaShapeOps, DropoutTrainingDrawsTheCpuMask) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<DType> floats = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                     DType::kFloat64};
  for (int64_t seed : {0, 42}) {
    const std::vector<Attribute> attributes = {Attribute::Int("seed", seed)};
    ExpectOpMatches("Dropout", floats, {200, 513},
                    {Make(DType::kFloat32, {}, {0.75}), testing::Bool({}, {1})}, attributes, 13,
                    "training seed " + std::to_string(seed), 2);
    ExpectOpMatches("Dropout", floats, {3, 7},
                    {Make(DType::kFloat32, {}, {0.3}), testing::Bool({}, {1})}, attributes, 13,
                    "training without mask", 1);
    // castor's DropoutTraining (the training graph's form, state input
    // castor.rng): the device draws the CPU's Philox bits for every counter,
    // with the ratio in each float dtype (read on the device), omitted
    // (0.5) and 0 (every element kept).
    for (int64_t counter : {int64_t{0}, int64_t{1}, int64_t{5000000000}}) {
      const std::vector<Tensor> ratios = {Make(DType::kFloat32, {}, {0.5}),
                                          Make(DType::kFloat16, {}, {0.25}),
                                          Make(DType::kBFloat16, {}, {0.75}),
                                          Make(DType::kFloat64, {}, {0.1}), Tensor(),
                                          Make(DType::kFloat32, {}, {0.0})};
      unsigned data_seed = 1;
      for (const Tensor& ratio : ratios) {
        for (DType dtype : floats) {
          for (int outputs : {1, 2}) {
            SingleNode node("DropoutTraining",
                            {Data(dtype, {200, 513}, data_seed++), ratio,
                             I64({2}, {seed, counter})},
                            {}, 1, outputs, kCastorDomain);
            ExpectCudaMatchesCpu(
                node, Name("DropoutTraining", dtype, {200, 513}) + " ratio " +
                          (ratio.dtype() == DType::kUndefined ? "omitted"
                                                              : DTypeName(ratio.dtype())) +
                          " counter " + std::to_string(counter) + " outputs " +
                          std::to_string(outputs));
          }
        }
      }
    }
  }
}

// ---- Transpose -------------------------------------------------------------------------

TEST(CudaShapeOps, TransposeEveryPermutationOfRank3) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<std::vector<int64_t>> perms = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                                   {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (const std::vector<int64_t>& perm : perms) {
    ExpectOpMatches("Transpose", MovedTypes(), {2, 3, 4}, {}, {Attribute::Ints("perm", perm)}, 13,
                    "perm");
    // Sides >= 16: the tiled path where the permutation swaps two blocks.
    ExpectOpMatches("Transpose", {DType::kFloat32, DType::kInt64, DType::kFloat16, DType::kUInt8},
                    {3, 33, 47}, {}, {Attribute::Ints("perm", perm)}, 13, "odd sides");
  }
  ExpectOpMatches("Transpose", FloatAndInt64(), {2, 3, 4}, {}, {}, 13, "default perm");
}

TEST(CudaShapeOps, TransposeLargeTiledAndGeneral) {
  CASTOR_REQUIRE_CUDA();
  struct Case {
    std::vector<int64_t> dims, perm;
  };
  const std::vector<Case> cases = {
      {{300, 400}, {1, 0}},              // 120k, tiled 2-D
      {{64, 48, 40}, {0, 2, 1}},         // 123k, tiled batched last-two swap
      {{16, 24, 20, 18}, {2, 3, 0, 1}},  // 138k, merges into one 2-D transpose
      {{8, 30, 20, 25}, {3, 1, 0, 2}},   // 120k, general
      {{5, 100, 250}, {0, 2, 1}},        // 125k, swap with sides >= 16
      {{2000, 5, 11}, {1, 2, 0}},        // 110k, general with a short side
  };
  for (const Case& c : cases) {
    ExpectOpMatches("Transpose", {DType::kFloat32, DType::kInt64, DType::kFloat16}, c.dims, {},
                    {Attribute::Ints("perm", c.perm)}, 13, "large");
  }
  // Rank 8, the general kernel.
  ExpectOpMatches("Transpose", FloatAndInt64(), {2, 3, 2, 3, 2, 2, 3, 2}, {},
                  {Attribute::Ints("perm", {7, 2, 5, 0, 3, 6, 1, 4})}, 13, "rank 8");
}

// ---- Expand / Tile -----------------------------------------------------------------------

TEST(CudaShapeOps, Expand) {
  CASTOR_REQUIRE_CUDA();
  ExpectOpMatches("Expand", MovedTypes(), {3, 1}, {I64({3}, {2, 1, 4})}, {}, 13, "[2,1,4]");
  ExpectOpMatches("Expand", FloatAndInt64(), {1}, {I64({1}, {5})}, {}, 13, "[5]");
  ExpectOpMatches("Expand", FloatAndInt64(), {2, 1, 3}, {I64({3}, {2, 4, 1})}, {}, 13,
                  "middle axis");
  ExpectOpMatches("Expand", FloatAndInt64(), {1, 250}, {I64({2}, {500, 250})}, {}, 13,
                  "large rows");
}

TEST(CudaShapeOps, Tile) {
  CASTOR_REQUIRE_CUDA();
  ExpectOpMatches("Tile", MovedTypes(), {2, 3}, {I64({2}, {3, 2})}, {}, 13, "[3,2]");
  ExpectOpMatches("Tile", FloatAndInt64(), {2, 3}, {I64({2}, {1, 0})}, {}, 13, "zero repeat");
  ExpectOpMatches("Tile", FloatAndInt64(), {2, 3, 4}, {I64({3}, {2, 1, 3})}, {}, 13, "rank 3");
  ExpectOpMatches("Tile", FloatAndInt64(), {50, 41}, {I64({2}, {4, 15})}, {}, 13, "large");
}

// ---- Shape / Size / Constant / ConstantOfShape / Range --------------------------------------

TEST(CudaShapeOps, ShapeWithStartAndEnd) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<std::vector<Attribute>> variants = {
      {},
      {Attribute::Int("start", 1)},
      {Attribute::Int("end", -1)},
      {Attribute::Int("start", -2), Attribute::Int("end", 10)},
      {Attribute::Int("start", 3), Attribute::Int("end", 1)},
  };
  for (const std::vector<Attribute>& attributes : variants) {
    ExpectOpMatches("Shape", FloatAndInt64(), {2, 3, 4, 5}, {}, attributes, 15, "start/end");
  }
  ExpectOpMatches("Size", MovedTypes(), {2, 3, 4}, {}, {}, 13, "");
  ExpectOpMatches("Size", FloatAndInt64(), {}, {}, {}, 13, "scalar");
}

TEST(CudaShapeOps, ConstantEveryValueAttribute) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<Attribute> attributes = {
      Attribute::TensorValue("value", Data(DType::kFloat32, {2, 3}, 1)),
      Attribute::TensorValue("value", Data(DType::kInt64, {4}, 2)),
      Attribute::TensorValue("value", Data(DType::kFloat16, {3, 1}, 3)),
      Attribute::TensorValue("value", Data(DType::kBool, {5}, 4)),
      Attribute::Float("value_float", 2.5f),
      Attribute::Floats("value_floats", {1, 2, -3}),
      Attribute::Int("value_int", -7),
      Attribute::Ints("value_ints", {4, 5, 6}),
  };
  for (const Attribute& a : attributes) {
    SingleNode node("Constant", {}, {a}, 13);
    ExpectCudaMatchesCpu(node, "Constant " + a.name);
  }
}

TEST(CudaShapeOps, ConstantOfShape) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<std::vector<Attribute>> variants = {
      {},
      {Attribute::TensorValue("value", I64({1}, {-9}))},
      {Attribute::TensorValue("value", Data(DType::kFloat16, {1}, 5))},
      {Attribute::TensorValue("value", Data(DType::kUInt8, {1}, 6))},
  };
  for (const std::vector<Attribute>& attributes : variants) {
    for (const Tensor& shape : {I64({2}, {2, 3}), I64({3}, {40, 50, 60}), I64({2}, {0, 4})}) {
      SingleNode node("ConstantOfShape", {shape}, attributes, 13);
      ExpectCudaMatchesCpu(node, "ConstantOfShape");
    }
  }
}

TEST(CudaShapeOps, RangeEachDType) {
  CASTOR_REQUIRE_CUDA();
  struct Case {
    DType dtype;
    double start, limit, delta;
  };
  const std::vector<Case> cases = {
      {DType::kFloat32, 1, 5, 1.5},     {DType::kFloat32, 0, -100000, -0.75},
      {DType::kFloat64, 0.5, -1, -0.5}, {DType::kInt64, 10, 4, -3},
      {DType::kInt64, 1, 1, 1},         {DType::kInt32, 0, 200001, 2},
      {DType::kInt16, -3, 4, 3},        {DType::kInt32, 5, 0, 1},
  };
  for (const Case& c : cases) {
    Tensor start(c.dtype, {}), limit(c.dtype, {}), delta(c.dtype, {});
    auto set = [&](Tensor& t, double v) {
      switch (c.dtype) {
        case DType::kFloat32: *t.data<float>() = static_cast<float>(v); break;
        case DType::kFloat64: *t.data<double>() = v; break;
        case DType::kInt16: *t.data<int16_t>() = static_cast<int16_t>(v); break;
        case DType::kInt32: *t.data<int32_t>() = static_cast<int32_t>(v); break;
        default: *t.data<int64_t>() = static_cast<int64_t>(v); break;
      }
    };
    set(start, c.start);
    set(limit, c.limit);
    set(delta, c.delta);
    SingleNode node("Range", {start, limit, delta}, {}, 11);
    ExpectCudaMatchesCpu(node, std::string("Range ") + DTypeName(c.dtype));
  }
  SingleNode zero("Range", {I64({}, {0}), I64({}, {3}), I64({}, {0})}, {}, 11);
  ExpectBothRefuse(zero, "delta is 0", "Range delta 0");
}

// ---- Concat / Split / Slice ----------------------------------------------------------------

TEST(CudaShapeOps, ConcatEachAxisAndLarge) {
  CASTOR_REQUIRE_CUDA();
  unsigned seed = 1;
  for (DType dtype : MovedTypes()) {
    const std::vector<Tensor> parts = {
        Data(dtype, {2, 3, 4}, seed), Data(dtype, {2, 5, 4}, seed + 1),
        Data(dtype, {2, 1, 4}, seed + 2), Data(dtype, {2, 0, 4}, seed + 3)};
    SingleNode node("Concat", parts, {Attribute::Int("axis", 1)}, 13);
    ExpectCudaMatchesCpu(node, Name("Concat", dtype, {2, 3, 4}) + " axis 1");
    SingleNode last("Concat", {Data(dtype, {3, 2}, seed), Data(dtype, {3, 5}, seed + 1)},
                    {Attribute::Int("axis", -1)}, 13);
    ExpectCudaMatchesCpu(last, Name("Concat", dtype, {3, 2}) + " axis -1");
    SingleNode first("Concat", {Data(dtype, {3, 2}, seed), Data(dtype, {1, 2}, seed + 1)},
                     {Attribute::Int("axis", 0)}, 13);
    ExpectCudaMatchesCpu(first, Name("Concat", dtype, {3, 2}) + " axis 0");
    seed += 4;
  }
  // >= 100k elements; the odd widths leave rows that cannot be widened.
  for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kFloat16, DType::kUInt8}) {
    SingleNode wide(
        "Concat",
        {Data(dtype, {100, 300}, 1), Data(dtype, {100, 500}, 2), Data(dtype, {100, 401}, 3)},
        {Attribute::Int("axis", 1)}, 13);
    ExpectCudaMatchesCpu(wide, Name("Concat", dtype, {100, 1201}) + " large");
    SingleNode tall("Concat", {Data(dtype, {60000, 2}, 4), Data(dtype, {1, 2}, 5)},
                    {Attribute::Int("axis", 0)}, 13);
    ExpectCudaMatchesCpu(tall, Name("Concat", dtype, {60001, 2}) + " large axis 0");
  }
}

TEST(CudaShapeOps, SplitEveryForm) {
  CASTOR_REQUIRE_CUDA();
  ExpectOpMatches("Split", FloatAndInt64(), {3, 7}, {},
                  {Attribute::Int("axis", 1), Attribute::Ints("split", {2, 5})}, 11,
                  "split attribute", 2);
  ExpectOpMatches("Split", MovedTypes(), {3, 7}, {I64({3}, {3, 0, 4})},
                  {Attribute::Int("axis", -1)}, 13, "split input", 3);
  ExpectOpMatches("Split", FloatAndInt64(), {3, 7}, {},
                  {Attribute::Int("axis", 1), Attribute::Int("num_outputs", 3)}, 18, "num_outputs",
                  3);
  ExpectOpMatches("Split", FloatAndInt64(), {4, 6}, {}, {}, 13, "even", 2);
  ExpectOpMatches("Split", FloatAndInt64(), {200, 600}, {I64({2}, {199, 401})},
                  {Attribute::Int("axis", 1)}, 13, "large", 2);
}

TEST(CudaShapeOps, SliceStepsAxesAndClamping) {
  CASTOR_REQUIRE_CUDA();
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  struct Case {
    std::vector<int64_t> starts, ends, axes, steps;
  };
  const std::vector<Case> cases = {
      {{1, 0}, {3, 2}, {}, {}},                   // no axes, no steps
      {{-1}, {kMin}, {1}, {-1}},                  // reversed axis 1
      {{0, 5}, {kMax, -kMax}, {0, -1}, {2, -2}},  // both steps, clamped ends
      {{2}, {100}, {-2}, {3}},
      {{4}, {1}, {2}, {1}},  // empty
      {{-3, 1}, {-1, kMax}, {2, 1}, {1, 2}},
  };
  for (const Case& c : cases) {
    std::vector<Tensor> extra = {I64({static_cast<int64_t>(c.starts.size())}, c.starts),
                                 I64({static_cast<int64_t>(c.ends.size())}, c.ends)};
    if (!c.axes.empty()) extra.push_back(I64({static_cast<int64_t>(c.axes.size())}, c.axes));
    if (!c.steps.empty()) {
      if (c.axes.empty()) extra.push_back(Tensor());
      extra.push_back(I64({static_cast<int64_t>(c.steps.size())}, c.steps));
    }
    ExpectOpMatches("Slice", MovedTypes(), {5, 6, 7}, extra, {}, 13, "slice");
  }
  ExpectOpMatches("Slice", FloatAndInt64(), {5, 6, 7}, {I32({2}, {1, 0}), I32({2}, {3, 2})}, {}, 13,
                  "int32 starts/ends");
  ExpectOpMatches("Slice", FloatAndInt64(), {5, 6, 7}, {},
                  {Attribute::Ints("starts", {1, -3}), Attribute::Ints("ends", {4, 100}),
                   Attribute::Ints("axes", {0, 2})},
                  9, "opset 9 attributes");
  ExpectOpMatches("Slice", {DType::kFloat32, DType::kInt64, DType::kFloat16}, {400, 600},
                  {I64({2}, {3, -1}), I64({2}, {kMax, kMin}), I64({2}, {0, 1}), I64({2}, {2, -3})},
                  {}, 13, "large strided");
  ExpectOpMatches("Slice", {DType::kFloat32, DType::kInt64, DType::kFloat16}, {400, 600},
                  {I64({1}, {8}), I64({1}, {-16})}, {}, 13, "large rows");
}

// ---- Gather / GatherGrad -------------------------------------------------------------------

TEST(CudaShapeOps, GatherEachAxisAndNegativeIndices) {
  CASTOR_REQUIRE_CUDA();
  const Tensor indices = I64({2, 3}, {0, -1, 2, -4, 3, 1});
  for (int64_t axis : {0, 1, -1}) {
    ExpectOpMatches("Gather", MovedTypes(), {4, 5, 6}, {indices}, {Attribute::Int("axis", axis)},
                    13, "axis " + std::to_string(axis));
  }
  ExpectOpMatches("Gather", FloatAndInt64(), {4, 5, 6}, {I32({3}, {-1, 0, 2})},
                  {Attribute::Int("axis", 1)}, 13, "int32 indices");
  ExpectOpMatches("Gather", FloatAndInt64(), {4, 5}, {I64({}, {-3})}, {}, 13, "scalar index");
  ExpectOpMatches("Gather", {DType::kFloat16, DType::kUInt8}, {10, 3}, {I64({4}, {9, 0, -2, 3})},
                  {}, 13, "odd rows");
  // Embedding-like: 1000 rows of 128 picked from 1000 (128k elements).
  std::vector<int64_t> many(1000);
  for (int64_t i = 0; i < 1000; ++i) many[i] = (i * 389) % 1000 - (i % 7 == 0 ? 1000 : 0);
  ExpectOpMatches("Gather", {DType::kFloat32, DType::kInt64, DType::kFloat16}, {1000, 128},
                  {I64({1000}, many)}, {}, 13, "embedding");
}

TEST(CudaShapeOps, GatherGradScatterAddsRepeatedIndices) {
  CASTOR_REQUIRE_CUDA();
  struct Case {
    std::vector<int64_t> data_dims;
    Tensor indices;
    int64_t axis;
  };
  std::vector<int64_t> many(4000);
  for (int64_t i = 0; i < 4000; ++i) many[i] = (i * 37) % 50 - (i % 3 == 0 ? 50 : 0);
  const std::vector<Case> cases = {
      {{4, 5, 6}, I64({2, 3}, {0, -1, 2, -4, 3, 3}), 0},
      {{4, 5, 6}, I32({4}, {1, 1, -5, 4}), 1},
      {{4, 5, 6}, I64({3}, {5, -1, 0}), -1},
      {{50, 32}, I64({4000}, many), 0},  // 128k dY elements, 80 per row on average
  };
  unsigned seed = 1;
  for (const Case& c : cases) {
    // dY: Gather's output, data dims with the axis replaced by the indices' dims.
    const int64_t axis = c.axis < 0 ? c.axis + static_cast<int64_t>(c.data_dims.size()) : c.axis;
    std::vector<int64_t> y_dims(c.data_dims.begin(), c.data_dims.begin() + axis);
    y_dims.insert(y_dims.end(), c.indices.dims().begin(), c.indices.dims().end());
    y_dims.insert(y_dims.end(), c.data_dims.begin() + axis + 1, c.data_dims.end());
    for (DType dtype : CudaFloatTypes()) {
      SingleNode node("GatherGrad",
                      {RandomTensor(dtype, y_dims, seed), c.indices,
                       RandomTensor(dtype, c.data_dims, seed + 1)},
                      {Attribute::Int("axis", c.axis)}, 1, 1, kCastorDomain);
      // Sums of up to ~100 terms in another order: float32 reassociation.
      ExpectCudaMatchesCpu(node, Name("GatherGrad", dtype, c.data_dims),
                           dtype == DType::kFloat32
                               ? std::optional<testing::Tolerance>(testing::Tolerance{1e-4, 1e-4})
                               : std::nullopt);
      seed += 2;
    }
  }
}

// ---- GatherND / ScatterND / GatherElements / ScatterElements / Trilu / CumSum ---------

// Runs a scatter node (data of `dtype` and `dims`, `indices`, updates of
// `update_dims`) on both backends.
void ExpectScatterMatches(const std::string& op, DType dtype, const std::vector<int64_t>& dims,
                          const Tensor& indices, const std::vector<int64_t>& update_dims,
                          const std::vector<Attribute>& attributes, int64_t opset,
                          const std::string& what, unsigned seed) {
  SingleNode node(op, {Data(dtype, dims, seed), indices, Data(dtype, update_dims, seed + 7)},
                  attributes, opset);
  ExpectCudaMatchesCpu(node, Name(op, dtype, dims) + " " + what);
}

TEST(CudaShapeOps, GatherNDTupleLengthsAndBatchDims) {
  CASTOR_REQUIRE_CUDA();
  ExpectOpMatches("GatherND", MovedTypes(), {4, 5, 6}, {I64({3, 2}, {1, -1, 0, 0, -4, 2})}, {},
                  13, "k=2");
  ExpectOpMatches("GatherND", FloatAndInt64(), {4, 5, 6}, {I32({2, 1, 3}, {3, 4, 5, 0, -5, -1})},
                  {}, 13, "k=3 int32");
  ExpectOpMatches("GatherND", FloatAndInt64(), {2, 5, 6}, {I64({2, 3, 1}, {4, 0, -1, 2, 2, 1})},
                  {Attribute::Int("batch_dims", 1)}, 13, "batch_dims 1");
}

TEST(CudaShapeOps, ScatterNDNoneAndReductions) {
  CASTOR_REQUIRE_CUDA();
  unsigned seed = 1;
  for (DType dtype : MovedTypes()) {
    ExpectScatterMatches("ScatterND", dtype, {5, 3, 4}, I64({3, 1}, {4, -5, 2}), {3, 3, 4}, {}, 13,
                         "rows", seed++);
  }
  ExpectScatterMatches("ScatterND", DType::kFloat32, {5, 3}, I64({2, 2}, {4, 2, -5, 0}), {2}, {}, 13,
                       "elements", seed++);
  // Reductions with repeated tuples (combined atomically on the device).
  for (const std::string reduction : {"add", "mul", "max", "min"}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt64,
                        DType::kInt32}) {
      ExpectScatterMatches("ScatterND", dtype, {6, 4}, I64({5, 1}, {1, 3, 1, -5, 0}), {5, 4},
                           {Attribute::String("reduction", reduction)}, 18, reduction, seed++);
    }
  }
}

TEST(CudaShapeOps, GatherElementsAndScatterElementsEachAxis) {
  CASTOR_REQUIRE_CUDA();
  const Tensor indices = I64({2, 3, 2}, {0, -1, 2, 1, 1, 0, -3, 2, 0, 0, 1, 2});
  unsigned seed = 1;
  for (int64_t axis : {0, 1, 2, -1}) {
    ExpectOpMatches("GatherElements", MovedTypes(), {3, 4, 5}, {indices},
                    {Attribute::Int("axis", axis)}, 13, "axis " + std::to_string(axis));
  }
  // Distinct targets per axis slice for reduction none: a permutation.
  const Tensor permutation = I64({2, 3}, {2, 0, 1, -1, 1, 0});
  for (DType dtype : MovedTypes()) {
    ExpectScatterMatches("ScatterElements", dtype, {2, 3}, permutation, {2, 3},
                         {Attribute::Int("axis", 1)}, 13, "none", seed++);
  }
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64}) {
    ExpectScatterMatches("ScatterElements", dtype, {3, 4, 5}, indices, {2, 3, 2},
                         {Attribute::Int("axis", 1), Attribute::String("reduction", "add")}, 16,
                         "add", seed++);
  }
}

TEST(CudaShapeOps, GatherNDGradAndGatherElementsGradScatterAdd) {
  CASTOR_REQUIRE_CUDA();
  unsigned seed = 1;
  for (DType dtype : CudaFloatTypes()) {
    SingleNode nd("GatherNDGrad",
                  {RandomTensor(dtype, {4, 6}, seed), I64({4, 1}, {1, 3, 1, -1}),
                   RandomTensor(dtype, {5, 6}, seed + 1)},
                  {}, 1, 1, kCastorDomain);
    ExpectCudaMatchesCpu(nd, Name("GatherNDGrad", dtype, {5, 6}));
    SingleNode elements("GatherElementsGrad",
                        {RandomTensor(dtype, {2, 3}, seed + 2), I64({2, 3}, {0, 0, 3, -1, 2, 0}),
                         RandomTensor(dtype, {2, 4}, seed + 3)},
                        {Attribute::Int("axis", 1)}, 1, 1, kCastorDomain);
    ExpectCudaMatchesCpu(elements, Name("GatherElementsGrad", dtype, {2, 4}));
    seed += 4;
  }
}

TEST(CudaShapeOps, TriluEachDiagonal) {
  CASTOR_REQUIRE_CUDA();
  for (int64_t upper : {0, 1}) {
    for (int64_t k : {-4, -1, 0, 3, 6}) {
      ExpectOpMatches("Trilu", MovedTypes(), {2, 4, 5}, {I64({}, {k})},
                      {Attribute::Int("upper", upper)}, 14,
                      "upper " + std::to_string(upper) + " k " + std::to_string(k));
    }
    ExpectOpMatches("Trilu", FloatAndInt64(), {300, 200}, {}, {Attribute::Int("upper", upper)}, 14,
                    "no k, large");
  }
}

TEST(CudaShapeOps, CumSumEachAxisExclusiveAndReverse) {
  CASTOR_REQUIRE_CUDA();
  for (int64_t axis : {0, 1, -1}) {
    for (int64_t exclusive : {0, 1}) {
      for (int64_t reverse : {0, 1}) {
        ExpectOpMatches("CumSum", {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                   DType::kInt64, DType::kInt32},
                        {3, 40, 5}, {I64({}, {axis})},
                        {Attribute::Int("exclusive", exclusive), Attribute::Int("reverse", reverse)},
                        14,
                        "axis " + std::to_string(axis) + " exclusive " +
                            std::to_string(exclusive) + " reverse " + std::to_string(reverse));
      }
    }
  }
}

TEST(CudaShapeOps, DepthToSpaceBothModesAndSpaceToDepth) {
  CASTOR_REQUIRE_CUDA();
  for (const char* mode : {"DCR", "CRD"}) {
    ExpectOpMatches("DepthToSpace", MovedTypes(), {2, 12, 3, 5},
                    {}, {Attribute::Int("blocksize", 2), Attribute::String("mode", mode)}, 13,
                    mode);
  }
  ExpectOpMatches("SpaceToDepth", MovedTypes(), {2, 3, 6, 9}, {}, {Attribute::Int("blocksize", 3)},
                  13, "blocksize 3");
}

// ---- Pad -------------------------------------------------------------------------------------

// Builds Pad from `declared` inputs and runs it on both backends with
// `actual` inputs (the constant_value input, which type inference may not
// take with an int64 `pads` beside it).
void ExpectPadMatches(const std::vector<Tensor>& declared, const std::vector<Tensor>& actual,
                      const std::vector<Attribute>& attributes, int64_t opset,
                      const std::string& what) {
  SingleNode node("Pad", declared, attributes, opset);
  ASSERT_TRUE(node.status().ok()) << what << ": " << node.status();
  std::vector<const Tensor*> inputs;
  for (const Tensor& t : actual) inputs.push_back(t.dtype() == DType::kUndefined ? nullptr : &t);
  absl::StatusOr<std::vector<Tensor>> cpu = RunNode(Cpu(), node.node(), opset, inputs);
  ASSERT_TRUE(cpu.ok()) << what << " on the CPU: " << cpu.status();
  absl::StatusOr<std::vector<Tensor>> gpu = RunNode(Gpu(), node.node(), opset, inputs);
  ASSERT_TRUE(gpu.ok()) << what << " on CUDA: " << gpu.status();
  ASSERT_EQ(gpu->size(), cpu->size());
  absl::Status same = CompareTensors((*gpu)[0], (*cpu)[0], 0, 0);
  EXPECT_TRUE(same.ok()) << what << ": " << same.message();
}

TEST(CudaShapeOps, PadEveryMode) {
  CASTOR_REQUIRE_CUDA();
  const std::vector<int64_t> pads = {1, 2, 0, 3, 1, 4};  // [3, 4, 5]: begins then ends
  for (DType dtype : MovedTypes()) {
    const Tensor in = Data(dtype, {3, 4, 5}, 7);
    for (const char* mode : {"constant", "reflect", "edge", "wrap"}) {
      const std::vector<Attribute> attributes = {Attribute::String("mode", mode)};
      ExpectPadMatches({in, I64({6}, pads)}, {in, I64({6}, pads)}, attributes, 19,
                       Name("Pad", dtype, {3, 4, 5}) + " " + mode);
    }
    // A constant value; negative pads crop.
    Tensor value = Data(dtype, {}, 9);
    ExpectPadMatches({in, I64({6}, {0, -1, 2, 1, 0, -2})},
                     {in, I64({6}, {0, -1, 2, 1, 0, -2}), value}, {}, 13,
                     Name("Pad", dtype, {3, 4, 5}) + " constant value, cropping");
    // Opset 18 axes input: only the last axis.
    ExpectPadMatches({in, I64({2}, {2, 1}), Tensor(), I64({1}, {-1})},
                     {in, I64({2}, {2, 1}), Tensor(), I64({1}, {-1})},
                     {Attribute::String("mode", "reflect")}, 18,
                     Name("Pad", dtype, {3, 4, 5}) + " axes input");
  }
  // Opset 7: pads and value are attributes (float data only).
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kFloat64}) {
    const Tensor in = Data(dtype, {2, 3}, 11);
    ExpectPadMatches({in}, {in},
                     {Attribute::Ints("pads", {1, 0, 0, 2}), Attribute::Float("value", 1.5f)}, 7,
                     Name("Pad", dtype, {2, 3}) + " opset 7");
  }
  // Large: 128 x 1000 padded to 130 x 1004 (130k elements).
  for (DType dtype : FloatAndInt64()) {
    const Tensor in = Data(dtype, {128, 1000}, 13);
    for (const char* mode : {"constant", "edge"}) {
      ExpectPadMatches({in, I64({4}, {1, 2, 1, 2})}, {in, I64({4}, {1, 2, 1, 2})},
                       {Attribute::String("mode", mode)}, 13,
                       Name("Pad", dtype, {128, 1000}) + " large " + mode);
    }
  }
}

TEST(CudaShapeOps, ShapeValueErrorsAreRefusedOnBoth) {
  CASTOR_REQUIRE_CUDA();
  // The shape and repeats are graph inputs, so only the kernels see them.
  SingleNode reshape("Reshape", {Data(DType::kFloat32, {2, 3}, 1), I64({2}, {4, 2})}, {}, 14);
  ExpectBothRefuse(reshape, "cannot reshape input [2,3] (6 elements) to [4,2]",
                   "Reshape 6 elements to 8");
  SingleNode tile("Tile", {Data(DType::kInt64, {2, 3}, 2), I64({2}, {2, -1})}, {}, 13);
  ExpectBothRefuse(tile, "has a negative entry", "Tile negative repeat");
}

}  // namespace
}  // namespace castor
