// CPU kernels of the shape_ops and data_movement families (Reshape, Flatten,
// Squeeze, Unsqueeze, Transpose, Expand, Shape, Size, Concat, Split, Slice,
// Gather, Tile, Pad, GatherND, ScatterND, GatherElements, ScatterElements,
// Trilu, DepthToSpace, SpaceToDepth): each op against an index-mapping reference computed here, in
// every dtype castor carries (the kernels move bytes; scatter reductions
// against sums and products computed here), plus the ONNX node
// conformance cases of these ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/run_node.h"
#include "graph/half.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

namespace fs = std::filesystem;
using testing::ConformanceRoot;
using testing::ConformanceSummary;
using testing::Cpu;
using testing::F32;
using testing::I32;
using testing::I64;
using testing::RunConformanceCasesOf;
using testing::RunNodeOf;
using testing::RunOk;
using testing::SingleNode;
using testing::Unravel;

const std::vector<DType>& AllDTypes() {
  static const std::vector<DType> kTypes = {
      DType::kBool,    DType::kInt64,   DType::kInt32, DType::kFloat16, DType::kBFloat16,
      DType::kFloat32, DType::kFloat64, DType::kUInt8, DType::kInt8,    DType::kInt16,
      DType::kUInt16,  DType::kUInt32,  DType::kUInt64};
  return kTypes;
}

// A tensor whose elements have distinct byte patterns (bool: 0/1).
Tensor Pattern(DType dtype, std::vector<int64_t> dims) {
  Tensor t(dtype, std::move(dims));
  const size_t size = DTypeSize(dtype);
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    for (size_t b = 0; b < size; ++b) {
      t.raw()[i * size + b] =
          dtype == DType::kBool
              ? static_cast<uint8_t>(i % 2)
              : static_cast<uint8_t>((i * 37 + static_cast<int64_t>(b) * 101 + (i >> 8) * 13 + 1) &
                                     0xff);
    }
  }
  return t;
}

int64_t Ravel(const std::vector<int64_t>& index, const std::vector<int64_t>& dims) {
  int64_t i = 0;
  for (size_t k = 0; k < dims.size(); ++k) i = i * dims[k] + index[k];
  return i;
}

// The tensor of `dims` whose element j is element map(j's index) of `in`
// (a negative source: the element `fill`).
template <typename MapFn>
Tensor Mapped(const Tensor& in, const std::vector<int64_t>& dims, MapFn map,
              const Tensor* fill = nullptr) {
  Tensor out(in.dtype(), dims);
  const size_t size = DTypeSize(in.dtype());
  for (int64_t j = 0; j < out.num_elements(); ++j) {
    const int64_t src = map(Unravel(j, dims));
    std::memcpy(out.raw() + j * size, src < 0 ? fill->raw() : in.raw() + src * size, size);
  }
  return out;
}

// Builds the node from `declared` inputs (types inferred from them) but runs
// the kernel on `actual` tensors: reaches kernel checks that type inference
// would catch first, and inputs inference rejects (see CpuPad).
absl::StatusOr<std::vector<Tensor>> RunKernelOn(const std::string& op, std::vector<Tensor> declared,
                                                std::vector<Attribute> attributes, int64_t opset,
                                                const std::vector<const Tensor*>& actual) {
  SingleNode node(op, std::move(declared), std::move(attributes), opset);
  if (!node.status().ok()) return node.status();
  return RunNode(Cpu(), node.node(), opset, actual);
}

// Expects `op` to fail with a message containing every string in `parts`.
void ExpectError(const std::string& op, std::vector<Tensor> inputs,
                 std::vector<Attribute> attributes, int64_t opset,
                 const std::vector<std::string>& parts) {
  absl::StatusOr<std::vector<Tensor>> result =
      RunNodeOf(op, std::move(inputs), std::move(attributes), opset);
  ASSERT_FALSE(result.ok()) << op << " should have failed";
  for (const std::string& part : parts) {
    EXPECT_NE(std::string(result.status().message()).find(part), std::string::npos)
        << "message '" << result.status().message() << "' lacks '" << part << "'";
  }
}

// ---- Reshape / Flatten / Squeeze / Unsqueeze ------------------------------------

TEST(CpuReshape, ZeroCopiesDimAndMinusOneIsInferredInEveryDType) {
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    Tensor in = Pattern(dtype, {2, 3, 4});
    std::vector<Tensor> out = RunOk("Reshape", {in, I64({3}, {0, -1, 2})}, {}, 14);
    Tensor expected = in;
    ASSERT_EQ(out[0].dims(), (std::vector<int64_t>{2, 6, 2}));
    EXPECT_EQ(std::memcmp(out[0].raw(), in.raw(), in.byte_size()), 0);
  }
}

TEST(CpuReshape, AllowZeroMakesZeroALiteralDim) {
  Tensor empty(DType::kFloat32, {0, 3});
  std::vector<Tensor> out =
      RunOk("Reshape", {empty, I64({2}, {3, 0})}, {Attribute::Int("allowzero", 1)}, 14);
  EXPECT_EQ(out[0].dims(), (std::vector<int64_t>{3, 0}));
  // Without allowzero the 0 copies input dim 1 (3): 9 elements from 0.
  ExpectError("Reshape", {empty, I64({2}, {3, 0})}, {}, 14, {"[0,3]", "[3,0]"});
}

TEST(CpuReshape, ElementCountMismatchNamesBothShapes) {
  ExpectError("Reshape", {F32({2, 3}, {1, 2, 3, 4, 5, 6}), I64({2}, {4, 2})}, {}, 13,
              {"[2,3]", "[4,2]", "6 elements", "8 elements"});
  ExpectError("Reshape", {F32({2, 3}, {1, 2, 3, 4, 5, 6}), I64({2}, {4, -1})}, {}, 13,
              {"[2,3]", "[4,-1]"});
  ExpectError("Reshape", {F32({2, 3}, {1, 2, 3, 4, 5, 6}), I64({2}, {-1, -1})}, {}, 13,
              {"more than one -1"});
}

TEST(CpuFlatten, AxisSplitsTheDims) {
  Tensor in = Pattern(DType::kFloat16, {2, 3, 4, 5});
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> cases = {
      {0, {1, 120}}, {1, {2, 60}}, {2, {6, 20}}, {4, {120, 1}}, {-1, {24, 5}}, {-4, {1, 120}}};
  for (const auto& [axis, dims] : cases) {
    std::vector<Tensor> out = RunOk("Flatten", {in}, {Attribute::Int("axis", axis)}, 13);
    EXPECT_EQ(out[0].dims(), dims) << "axis " << axis;
    EXPECT_EQ(std::memcmp(out[0].raw(), in.raw(), in.byte_size()), 0);
  }
}

TEST(CpuSqueeze, AxesAttributeInputOrAllOnes) {
  Tensor in = Pattern(DType::kInt64, {1, 3, 1, 2});
  // Opset 11: attribute; negative axes.
  EXPECT_EQ(RunOk("Squeeze", {in}, {Attribute::Ints("axes", {-2})}, 11)[0].dims(),
            (std::vector<int64_t>{1, 3, 2}));
  // Opset 13: input.
  EXPECT_EQ(RunOk("Squeeze", {in, I64({2}, {0, 2})}, {}, 13)[0].dims(),
            (std::vector<int64_t>{3, 2}));
  // No axes: every size-1 dim.
  std::vector<Tensor> out = RunOk("Squeeze", {in}, {}, 13);
  EXPECT_EQ(out[0].dims(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(std::memcmp(out[0].raw(), in.raw(), in.byte_size()), 0);
  ExpectError("Squeeze", {in, I64({1}, {1})}, {}, 13, {"axis 1", "size is 3"});
}

TEST(CpuUnsqueeze, InsertsAxesAtOutputPositions) {
  Tensor in = Pattern(DType::kBool, {3, 4});
  EXPECT_EQ(RunOk("Unsqueeze", {in}, {Attribute::Ints("axes", {0, 3})}, 11)[0].dims(),
            (std::vector<int64_t>{1, 3, 4, 1}));
  EXPECT_EQ(RunOk("Unsqueeze", {in, I64({3}, {4, -5, 2})}, {}, 13)[0].dims(),
            (std::vector<int64_t>{1, 3, 1, 4, 1}));
  ExpectError("Unsqueeze", {in, I64({2}, {1, 1})}, {}, 13, {"twice"});
}

// ---- Transpose / Expand / Shape / Size ----------------------------------------

TEST(CpuTranspose, PermutesInEveryDType) {
  const std::vector<int64_t> in_dims = {2, 3, 4};
  const std::vector<std::vector<int64_t>> perms = {{2, 0, 1}, {1, 0, 2}, {0, 2, 1}, {2, 1, 0}};
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    Tensor in = Pattern(dtype, in_dims);
    for (const auto& perm : perms) {
      std::vector<int64_t> dims = {in_dims[perm[0]], in_dims[perm[1]], in_dims[perm[2]]};
      Tensor expected = Mapped(in, dims, [&](const std::vector<int64_t>& o) {
        std::vector<int64_t> i(3);
        for (int k = 0; k < 3; ++k) i[perm[k]] = o[k];
        return Ravel(i, in_dims);
      });
      EXPECT_EQ(RunOk("Transpose", {in}, {Attribute::Ints("perm", perm)}, 13)[0], expected);
    }
    // No perm: reversed axes.
    Tensor reversed = Mapped(in, {4, 3, 2}, [&](const std::vector<int64_t>& o) {
      return Ravel({o[2], o[1], o[0]}, in_dims);
    });
    EXPECT_EQ(RunOk("Transpose", {in}, {}, 13)[0], reversed);
  }
}

// Expects Transpose of `in` by `perm` (4 axes) to move every element where
// the permutation says.
void ExpectTransposes(const Tensor& in, const std::vector<int64_t>& perm) {
  const std::vector<int64_t>& in_dims = in.dims();
  std::vector<int64_t> dims(4);
  for (int k = 0; k < 4; ++k) dims[k] = in_dims[perm[k]];
  Tensor expected = Mapped(in, dims, [&](const std::vector<int64_t>& o) {
    std::vector<int64_t> i(4);
    for (int k = 0; k < 4; ++k) i[perm[k]] = o[k];
    return Ravel(i, in_dims);
  });
  EXPECT_EQ(RunOk("Transpose", {in}, {Attribute::Ints("perm", perm)}, 13)[0], expected);
}

// Transposes whose innermost output axis is strided in the input and whose
// next axis is contiguous there run as register-transposed square blocks
// (8 x 8 for 2-byte, 4 x 4 for 4-byte elements) plus element-wise edges:
// sizes 19 and 21 leave edges on both sides of the blocks, in every dtype
// (1- and 8-byte elements take the row-by-row copy).
TEST(CpuTranspose, BlockTransposesAndTheirEdgesInEveryDType) {
  const std::vector<int64_t> in_dims = {2, 19, 3, 21};
  const std::vector<std::vector<int64_t>> perms = {
      {0, 2, 3, 1}, {0, 3, 1, 2}, {0, 1, 3, 2}, {3, 2, 1, 0}, {0, 2, 1, 3}, {1, 3, 0, 2}};
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    Tensor in = Pattern(dtype, in_dims);
    for (const auto& perm : perms) {
      SCOPED_TRACE(::testing::Message() << "perm " << perm[0] << perm[1] << perm[2] << perm[3]);
      ExpectTransposes(in, perm);
    }
  }
}

// Dense innermost rows of 16, 32 and 64 bytes (an attention head's 16
// bfloat16 values when heads are split or merged) are copied with a fixed
// size; rows of other sizes, element by element or by memcpy. Every dtype,
// row lengths on both sides, and enough rows that the copy runs in
// several chunks (each starting its odometer mid-tensor).
TEST(CpuTranspose, ShortDenseRowsInEveryDType) {
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t size = static_cast<int64_t>(DTypeSize(dtype));
    for (int64_t row_bytes : {16, 32, 64, 24, 48}) {
      if (row_bytes % size != 0) continue;
      SCOPED_TRACE(::testing::Message() << "rows of " << row_bytes << " bytes");
      ExpectTransposes(Pattern(dtype, {9, 40, 12, row_bytes / size}), {0, 2, 1, 3});
    }
  }
}

TEST(CpuTranspose, LargeMatrixUsesThreadsAndStaysExact) {
  const std::vector<int64_t> in_dims = {300, 257};
  Tensor in = Pattern(DType::kFloat32, in_dims);
  Tensor expected = Mapped(in, {257, 300}, [&](const std::vector<int64_t>& o) {
    return Ravel({o[1], o[0]}, in_dims);
  });
  EXPECT_EQ(RunOk("Transpose", {in}, {Attribute::Ints("perm", {1, 0})}, 13)[0], expected);
}

TEST(CpuExpand, BroadcastsBothWays) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kBool, DType::kInt64}) {
    Tensor in = Pattern(dtype, {3, 1});
    // Shape [2, 1, 4]: the input's 3 survives the target's 1.
    Tensor expected = Mapped(in, {2, 3, 4}, [](const std::vector<int64_t>& o) { return o[1]; });
    EXPECT_EQ(RunOk("Expand", {in, I64({3}, {2, 1, 4})}, {}, 13)[0], expected);
    // A shorter shape keeps the input's rank.
    EXPECT_EQ(RunOk("Expand", {in, I64({1}, {5})}, {}, 13)[0].dims(),
              (std::vector<int64_t>{3, 5}));
  }
  ExpectError("Expand", {Pattern(DType::kFloat32, {3, 2}), I64({2}, {3, 4})}, {}, 13,
              {"[3,2]", "[3,4]"});
}

TEST(CpuShape, StartAndEndClamp) {
  Tensor in = Pattern(DType::kFloat32, {2, 3, 4, 5});
  auto shape = [&](std::vector<Attribute> attributes) {
    return RunOk("Shape", {in}, std::move(attributes), 15)[0].ToInt64Vector();
  };
  EXPECT_EQ(shape({}), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(shape({Attribute::Int("start", 1), Attribute::Int("end", -1)}),
            (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(shape({Attribute::Int("start", -10)}), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(shape({Attribute::Int("end", 10)}), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(shape({Attribute::Int("start", 3), Attribute::Int("end", 1)}),
            (std::vector<int64_t>{}));
  std::vector<Tensor> size = RunOk("Size", {in}, {}, 13);
  EXPECT_EQ(size[0].dtype(), DType::kInt64);
  EXPECT_TRUE(size[0].dims().empty());
  EXPECT_EQ(size[0].GetInt64(0), 120);
}

// ---- Concat / Split ------------------------------------------------------------

TEST(CpuConcat, JoinsAlongAxisInEveryDType) {
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    Tensor a = Pattern(dtype, {2, 1, 3}), b = Pattern(dtype, {2, 4, 3}),
           c = Pattern(dtype, {2, 0, 3});
    // Reference: out[:, 0:1] = a, out[:, 1:5] = b.
    Tensor expected(dtype, {2, 5, 3});
    const size_t size = DTypeSize(dtype);
    for (int64_t j = 0; j < expected.num_elements(); ++j) {
      std::vector<int64_t> o = Unravel(j, {2, 5, 3});
      const Tensor& from = o[1] < 1 ? a : b;
      const int64_t i = o[1] < 1 ? Ravel(o, {2, 1, 3}) : Ravel({o[0], o[1] - 1, o[2]}, {2, 4, 3});
      std::memcpy(expected.raw() + j * size, from.raw() + i * size, size);
    }
    EXPECT_EQ(RunOk("Concat", {a, c, b}, {Attribute::Int("axis", 1)}, 13)[0], expected);
    EXPECT_EQ(RunOk("Concat", {a, b}, {Attribute::Int("axis", -2)}, 13)[0], expected);
  }
  const Tensor a = Pattern(DType::kFloat32, {2, 3}), b = Pattern(DType::kFloat32, {3, 3});
  absl::StatusOr<std::vector<Tensor>> bad =
      RunKernelOn("Concat", {a, a}, {Attribute::Int("axis", 1)}, 13, {&a, &b});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("input 1 [3,3] does not match input 0 [2,3]"),
            std::string::npos)
      << bad.status();
}

TEST(CpuSplit, SizesFromAttributeInputEqualPartsOrNumOutputs) {
  Tensor in = Pattern(DType::kInt32, {2, 7});
  auto piece = [&](int64_t begin, int64_t length) {
    return Mapped(in, {2, length}, [&](const std::vector<int64_t>& o) {
      return Ravel({o[0], begin + o[1]}, {2, 7});
    });
  };
  // Opset 11: 'split' attribute.
  std::vector<Tensor> out =
      RunOk("Split", {in}, {Attribute::Int("axis", 1), Attribute::Ints("split", {2, 5})}, 11, 2);
  EXPECT_EQ(out[0], piece(0, 2));
  EXPECT_EQ(out[1], piece(2, 5));
  // Opset 13: 'split' input, a zero-size part.
  out = RunOk("Split", {in, I64({3}, {3, 0, 4})}, {Attribute::Int("axis", -1)}, 13, 3);
  EXPECT_EQ(out[0], piece(0, 3));
  EXPECT_EQ(out[1], piece(3, 0));
  EXPECT_EQ(out[2], piece(3, 4));
  // Opset 18: num_outputs = 3 over 7 -> 3, 3, 1.
  out = RunOk("Split", {in}, {Attribute::Int("axis", 1), Attribute::Int("num_outputs", 3)}, 18, 3);
  EXPECT_EQ(out[0], piece(0, 3));
  EXPECT_EQ(out[1], piece(3, 3));
  EXPECT_EQ(out[2], piece(6, 1));
  // Equal parts along axis 0.
  out = RunOk("Split", {in}, {}, 13, 2);
  EXPECT_EQ(out[0], Mapped(in, {1, 7}, [](const std::vector<int64_t>& o) { return o[1]; }));
  EXPECT_EQ(out[1], Mapped(in, {1, 7}, [](const std::vector<int64_t>& o) { return 7 + o[1]; }));
  // Sizes that do not cover the axis.
  absl::StatusOr<std::vector<Tensor>> bad =
      RunNodeOf("Split", {in, I64({2}, {3, 3})}, {Attribute::Int("axis", 1)}, 13, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("sum 6"), std::string::npos) << bad.status();
}

// ---- Slice ---------------------------------------------------------------------

// Reference: the indices data[start:end:step] picks along a dim of size
// `dim`, by the ONNX spec's rules: negative starts/ends count from the end;
// starts clamp to [0, dim] (positive steps) or [0, dim-1] (negative steps);
// ends clamp to [0, dim] or [-1, dim-1]. (This differs from Python slicing
// only for a negative step with start < -dim, which picks element 0.)
std::vector<int64_t> SliceIndices(int64_t dim, int64_t start, int64_t end, int64_t step) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  std::vector<int64_t> picked;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    for (int64_t i = start; i < end; i += step) picked.push_back(i);
  } else if (dim > 0) {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
    for (int64_t i = start; i > end; i += step) picked.push_back(i);
  }
  return picked;
}

TEST(CpuSlice, NegativeStepsAndClampingFollowTheSpec) {
  const std::vector<int64_t> in_dims = {5, 6};
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  struct Case {
    int64_t start, end, step;
  };
  const std::vector<Case> cases = {
      {0, 3, 1},       {1, -1, 2},   {-1, kMin, -1},   {4, 0, -2},    {-100, 100, 1},
      {100, -100, -1}, {10, 20, 1},  {kMax, kMin, -3}, {2, 2, 1},     {3, 1, 1},
      {-2, kMax, 1},   {0, kMax, 4}, {-100, kMin, -1}, {-100, -3, -1}};
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64, DType::kBool}) {
    Tensor in = Pattern(dtype, in_dims);
    for (const Case& c : cases) {
      SCOPED_TRACE(
          absl::StrCat(DTypeName(dtype), " axis 1 [", c.start, ":", c.end, ":", c.step, "]"));
      const std::vector<int64_t> picked = SliceIndices(6, c.start, c.end, c.step);
      const std::vector<int64_t> rows = SliceIndices(5, -1, kMin, -2);  // 4, 2, 0
      Tensor expected =
          Mapped(in, {3, static_cast<int64_t>(picked.size())}, [&](const std::vector<int64_t>& o) {
            return Ravel({rows[o[0]], picked[o[1]]}, in_dims);
          });
      std::vector<Tensor> out = RunOk("Slice",
                                      {in, I64({2}, {-1, c.start}), I64({2}, {kMin, c.end}),
                                       I64({2}, {0, -1}), I64({2}, {-2, c.step})},
                                      {}, 13);
      EXPECT_EQ(out[0], expected);
    }
  }
}

TEST(CpuSlice, DefaultAxesStepsInt32InputsAndOpset9Attributes) {
  const std::vector<int64_t> in_dims = {4, 3, 2};
  Tensor in = Pattern(DType::kUInt8, in_dims);
  Tensor expected = Mapped(in, {2, 2, 2}, [&](const std::vector<int64_t>& o) {
    return Ravel({o[0] + 1, o[1], o[2]}, in_dims);
  });
  EXPECT_EQ(RunOk("Slice", {in, I32({2}, {1, 0}), I32({2}, {3, 2})}, {}, 11)[0], expected);
  EXPECT_EQ(RunOk("Slice", {in},
                  {Attribute::Ints("starts", {1, 0}), Attribute::Ints("ends", {3, 2}),
                   Attribute::Ints("axes", {0, 1})},
                  9)[0],
            expected);
  ExpectError("Slice", {in, I64({1}, {0}), I64({1}, {1}), I64({1}, {0}), I64({1}, {0})},
              {}, 13, {"steps"});
  ExpectError("Slice", {in, I64({2}, {0, 0}), I64({2}, {1, 1}), I64({2}, {1, -2})}, {}, 13,
              {"twice"});
}

// ---- Gather --------------------------------------------------------------------

TEST(CpuGather, NegativeIndicesAndAxes) {
  const std::vector<int64_t> in_dims = {3, 4, 2};
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    Tensor in = Pattern(dtype, in_dims);
    const std::vector<int64_t> indices = {-1, 0, 2, -4, 3, 1};
    Tensor expected = Mapped(in, {3, 2, 3, 2}, [&](const std::vector<int64_t>& o) {
      int64_t index = indices[o[1] * 3 + o[2]];
      if (index < 0) index += 4;
      return Ravel({o[0], index, o[3]}, in_dims);
    });
    EXPECT_EQ(RunOk("Gather", {in, I64({2, 3}, indices)}, {Attribute::Int("axis", 1)}, 13)[0],
              expected);
    EXPECT_EQ(RunOk("Gather", {in, I32({2, 3}, {-1, 0, 2, -4, 3, 1})},
                    {Attribute::Int("axis", -2)}, 13)[0],
              expected);
  }
  // A scalar index drops the axis.
  Tensor in = Pattern(DType::kFloat32, in_dims);
  std::vector<Tensor> out = RunOk("Gather", {in, I64({}, {-3})}, {}, 13);
  EXPECT_EQ(out[0], Mapped(in, {4, 2}, [&](const std::vector<int64_t>& o) {
              return Ravel({0, o[0], o[1]}, in_dims);
            }));
  ExpectError("Gather", {in, I64({2}, {0, 4})}, {Attribute::Int("axis", 1)}, 13,
              {"index 4", "axis 1", "size 4"});
  ExpectError("Gather", {in, I64({1}, {-4})}, {}, 13, {"index -4", "size 3"});
}

// ---- Tile ----------------------------------------------------------------------

TEST(CpuTile, RepeatsEachAxis) {
  const std::vector<int64_t> in_dims = {2, 3};
  for (DType dtype : {DType::kFloat64, DType::kInt8, DType::kBFloat16, DType::kBool}) {
    Tensor in = Pattern(dtype, in_dims);
    Tensor expected = Mapped(in, {6, 6}, [&](const std::vector<int64_t>& o) {
      return Ravel({o[0] % 2, o[1] % 3}, in_dims);
    });
    EXPECT_EQ(RunOk("Tile", {in, I64({2}, {3, 2})}, {}, 13)[0], expected);
    EXPECT_EQ(RunOk("Tile", {in, I64({2}, {1, 0})}, {}, 13)[0].dims(),
              (std::vector<int64_t>{2, 0}));
  }
}

// ---- Pad -----------------------------------------------------------------------

// Reference source index along one axis (numpy.pad semantics).
int64_t PadIndex(int64_t o, int64_t n, int64_t before, const std::string& mode) {
  int64_t i = o - before;
  if (i >= 0 && i < n) return i;
  if (mode == "constant") return -1;
  if (mode == "edge") return i < 0 ? 0 : n - 1;
  if (mode == "wrap") return ((i % n) + n) % n;
  while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;  // reflect
  return i;
}

TEST(CpuPad, ConstantReflectEdgeWrap) {
  const std::vector<int64_t> in_dims = {3, 4};
  const std::vector<int64_t> pads = {2, 1, 1, 3};  // x0_begin, x1_begin, x0_end, x1_end
  const std::vector<int64_t> out_dims = {3 + 2 + 1, 4 + 1 + 3};
  for (const std::string mode : {"constant", "reflect", "edge", "wrap"}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64, DType::kUInt8}) {
      SCOPED_TRACE(mode + " " + DTypeName(dtype));
      Tensor in = Pattern(dtype, in_dims);
      Tensor fill = Pattern(dtype, {1, 1});  // any element works as the constant
      std::memset(fill.raw(), 0x3c, fill.byte_size());
      Tensor expected = Mapped(
          in, out_dims,
          [&](const std::vector<int64_t>& o) {
            const int64_t r = PadIndex(o[0], 3, pads[0], mode);
            const int64_t c = PadIndex(o[1], 4, pads[1], mode);
            return r < 0 || c < 0 ? -1 : Ravel({r, c}, in_dims);
          },
          &fill);
      Tensor value(dtype, {});
      std::memcpy(value.raw(), fill.raw(), fill.byte_size());
      // The constant_value input: graph/ops/data_movement.cc's InferPad
      // checks inputs 0..2 share a dtype (pads is int64), so the node is
      // built without it and the kernel run with it.
      const Tensor pads_tensor = I64({4}, pads);
      absl::StatusOr<std::vector<Tensor>> out =
          RunKernelOn("Pad", {in, pads_tensor}, {Attribute::String("mode", mode)}, 19,
                      {&in, &pads_tensor, &value});
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ((*out)[0], expected);
    }
  }
}

TEST(CpuPad, DefaultZeroAxesInputNegativePadsAndOpset7Attributes) {
  Tensor in = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  // Constant default 0.
  EXPECT_EQ(RunOk("Pad", {in, I64({4}, {0, 1, 0, 0})}, {}, 13)[0],
            F32({2, 4}, {0, 1, 2, 3, 0, 4, 5, 6}));
  // Opset 18 axes input: pad only axis -1 (reflect), crop nothing.
  EXPECT_EQ(RunOk("Pad", {in, I64({2}, {2, 1}), Tensor(), I64({1}, {-1})},
                  {Attribute::String("mode", "reflect")}, 18)[0],
            F32({2, 6}, {3, 2, 1, 2, 3, 2, 6, 5, 4, 5, 6, 5}));
  // Negative pads crop.
  EXPECT_EQ(RunOk("Pad", {in, I64({4}, {0, -1, -1, 1})}, {}, 13)[0], F32({1, 3}, {2, 3, 0}));
  // Opset 7: pads and value are attributes.
  EXPECT_EQ(RunOk("Pad", {in},
                  {Attribute::Ints("pads", {1, 0, 0, 0}), Attribute::Float("value", 1.5f)}, 7)[0],
            F32({3, 3}, {1.5f, 1.5f, 1.5f, 1, 2, 3, 4, 5, 6}));
  ExpectError("Pad", {in, I64({2}, {1, 1})}, {}, 13, {"pads", "expected 4"});
}

// ---- GatherND / ScatterND --------------------------------------------------------

TEST(CpuGatherND, TuplesOfEachLengthNegativeEntriesAndBatchDims) {
  const std::vector<int64_t> in_dims = {2, 3, 4};
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    Tensor in = Pattern(dtype, in_dims);
    // k = 2: each tuple picks a row of 4.
    const std::vector<int64_t> pairs = {1, -1, 0, 0, -2, 1};
    EXPECT_EQ(RunOk("GatherND", {in, I64({3, 2}, pairs)}, {}, 13)[0],
              Mapped(in, {3, 4}, [&](const std::vector<int64_t>& o) {
                const int64_t a = (pairs[o[0] * 2] + 2) % 2, b = (pairs[o[0] * 2 + 1] + 3) % 3;
                return Ravel({a, b, o[1]}, in_dims);
              }));
    // k = 3 (single elements), indices [2, 1, 3] -> output [2, 1].
    EXPECT_EQ(RunOk("GatherND", {in, I32({2, 1, 3}, {1, 2, 3, 0, -3, -1})}, {}, 13)[0],
              Mapped(in, {2, 1}, [&](const std::vector<int64_t>& o) {
                return o[0] == 0 ? Ravel({1, 2, 3}, in_dims) : Ravel({0, 0, 3}, in_dims);
              }));
    // batch_dims 1: batch b's tuples index data[b] ([3, 4]) with k = 1.
    const std::vector<int64_t> rows = {2, 0, -1, 1};
    EXPECT_EQ(RunOk("GatherND", {in, I64({2, 2, 1}, rows)}, {Attribute::Int("batch_dims", 1)},
                    13)[0],
              Mapped(in, {2, 2, 4}, [&](const std::vector<int64_t>& o) {
                return Ravel({o[0], (rows[o[0] * 2 + o[1]] + 3) % 3, o[2]}, in_dims);
              }));
  }
  Tensor in = Pattern(DType::kFloat32, in_dims);
  ExpectError("GatherND", {in, I64({1, 2}, {0, 3})}, {}, 13,
              {"GatherND", "tuple 0 [0,3]", "out of range", "[2,3]"});
  ExpectError("GatherND", {in, I64({1, 4}, {0, 0, 0, 0})}, {}, 13, {"tuples of 4 entries"});
}

TEST(CpuScatterND, WritesSlicesInEveryDTypeAndLastDuplicateWins) {
  const std::vector<int64_t> in_dims = {4, 3};
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    Tensor data = Pattern(dtype, in_dims);
    Tensor updates = Pattern(dtype, {3, 3});
    for (size_t i = 0; i < updates.byte_size(); ++i) updates.raw()[i] ^= 0x5a;
    if (dtype == DType::kBool) updates = Pattern(dtype, {3, 3});
    // Rows 1 and -1 (= 3), then row 1 again: its second update wins.
    Tensor expected = data;
    const size_t row_bytes = 3 * DTypeSize(dtype);
    std::memcpy(expected.raw() + 3 * row_bytes, updates.raw() + 1 * row_bytes, row_bytes);
    std::memcpy(expected.raw() + 1 * row_bytes, updates.raw() + 2 * row_bytes, row_bytes);
    EXPECT_EQ(RunOk("ScatterND", {data, I64({3, 1}, {1, -1, 1}), updates}, {}, 13)[0], expected);
  }
  // Single elements (k = 2) with int32 indices.
  EXPECT_EQ(RunOk("ScatterND", {F32({2, 2}, {1, 2, 3, 4}), I32({2, 2}, {0, 1, -1, 0}),
                                F32({2}, {9, 8})},
                  {}, 13)[0],
            F32({2, 2}, {1, 9, 8, 4}));
}

TEST(CpuScatterND, ReductionsCombineDuplicatesInOrder) {
  const Tensor data = F32({3, 2}, {1, 2, 3, 4, 5, 6});
  const Tensor indices = I64({3, 1}, {2, 0, 2});
  const Tensor updates = F32({3, 2}, {10, 20, 30, 40, 50, 60});
  auto run = [&](const std::string& reduction, const Tensor& d, const Tensor& u) {
    return RunOk("ScatterND", {d, indices, u}, {Attribute::String("reduction", reduction)},
                 18)[0];
  };
  EXPECT_EQ(run("add", data, updates), F32({3, 2}, {31, 42, 3, 4, 65, 86}));
  EXPECT_EQ(run("mul", data, updates), F32({3, 2}, {30, 80, 3, 4, 2500, 7200}));
  EXPECT_EQ(run("max", data, updates), F32({3, 2}, {30, 40, 3, 4, 50, 60}));
  EXPECT_EQ(run("min", data, updates), F32({3, 2}, {1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(run("add", I64({3, 2}, {1, 2, 3, 4, 5, 6}), I64({3, 2}, {10, 20, 30, 40, 50, 60})),
            I64({3, 2}, {31, 42, 3, 4, 65, 86}));
  // 16-bit floats combine in float32 and round on store (exact here).
  EXPECT_EQ(run("add", testing::F16({3, 2}, {1, 2, 3, 4, 5, 6}),
                testing::F16({3, 2}, {10, 20, 30, 40, 50, 60})),
            testing::F16({3, 2}, {31, 42, 3, 4, 65, 86}));
  ExpectError("ScatterND", {data, indices, updates}, {Attribute::String("reduction", "max")}, 16,
              {"reduction", "max", "opset 16"});
  ExpectError("ScatterND", {data, indices, F32({3, 1}, {1, 2, 3})}, {}, 13,
              {"updates", "[3,2]"});
  ExpectError("ScatterND", {data, I64({1, 1}, {3}), F32({1, 2}, {1, 2})}, {}, 13,
              {"ScatterND", "tuple 0 [3]", "out of range"});
}

// ---- GatherElements / ScatterElements ----------------------------------------------

TEST(CpuGatherElements, EachAxisNegativeIndicesAndSmallerIndexDims) {
  const std::vector<int64_t> in_dims = {3, 4};
  const std::vector<int64_t> values = {-1, 0, 2, 1, 3, -4};
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    Tensor in = Pattern(dtype, in_dims);
    // axis 1, indices [3, 2]: out[i][j] = in[i][indices[i][j]].
    EXPECT_EQ(RunOk("GatherElements", {in, I64({3, 2}, values)}, {Attribute::Int("axis", 1)},
                    13)[0],
              Mapped(in, {3, 2}, [&](const std::vector<int64_t>& o) {
                return Ravel({o[0], (values[o[0] * 2 + o[1]] + 4) % 4}, in_dims);
              }));
    // axis -2 (= 0), indices [2, 3]: out[i][j] = in[indices[i][j]][j].
    const std::vector<int32_t> rows = {2, -1, 0, 1, 1, -3};
    EXPECT_EQ(RunOk("GatherElements", {in, I32({2, 3}, rows)}, {Attribute::Int("axis", -2)},
                    13)[0],
              Mapped(in, {2, 3}, [&](const std::vector<int64_t>& o) {
                return Ravel({(rows[o[0] * 3 + o[1]] + 3) % 3, o[1]}, in_dims);
              }));
  }
  Tensor in = Pattern(DType::kFloat32, in_dims);
  ExpectError("GatherElements", {in, I64({1, 1}, {4})}, {Attribute::Int("axis", 1)}, 13,
              {"GatherElements", "index 4", "axis 1", "size 4"});
  ExpectError("GatherElements", {in, I64({3, 5}, std::vector<int64_t>(15, 0))}, {}, 13,
              {"exceed data"});
}

TEST(CpuScatterElements, WritesAndAddsAlongTheAxis) {
  const Tensor data = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor indices = I64({2, 2}, {2, 2, 0, -1});
  const Tensor updates = F32({2, 2}, {10, 20, 30, 40});
  // axis 1: row 0 writes column 2 twice (the second wins), row 1 columns 0 and 2.
  EXPECT_EQ(RunOk("ScatterElements", {data, indices, updates}, {Attribute::Int("axis", 1)}, 13)[0],
            F32({2, 3}, {1, 2, 20, 30, 5, 40}));
  EXPECT_EQ(RunOk("ScatterElements", {data, indices, updates},
                  {Attribute::Int("axis", 1), Attribute::String("reduction", "add")}, 16)[0],
            F32({2, 3}, {1, 2, 33, 34, 5, 46}));
  // axis 0 in every dtype: indices [1, 3] pick rows per column.
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    Tensor d = Pattern(dtype, {2, 3});
    Tensor u = Pattern(dtype, {1, 3});
    for (size_t i = 0; i < u.byte_size(); ++i) u.raw()[i] ^= dtype == DType::kBool ? 1 : 0x33;
    const std::vector<int64_t> rows = {1, -2, 1};
    Tensor expected = d;
    const size_t size = DTypeSize(dtype);
    for (int64_t j = 0; j < 3; ++j) {
      std::memcpy(expected.raw() + ((rows[j] + 2) % 2 * 3 + j) * size, u.raw() + j * size, size);
    }
    EXPECT_EQ(RunOk("ScatterElements", {d, I64({1, 3}, rows), u}, {}, 13)[0], expected);
  }
  ExpectError("ScatterElements", {data, I64({1, 1}, {-3}), F32({1, 1}, {1})},
              {Attribute::Int("axis", 0)}, 13, {"index -3", "axis 0", "size 2"});
}

// ---- Trilu -------------------------------------------------------------------------

TEST(CpuTrilu, UpperAndLowerForEveryDiagonalInEveryDType) {
  const std::vector<int64_t> in_dims = {2, 3, 4};
  for (DType dtype : AllDTypes()) {
    Tensor in = Pattern(dtype, in_dims);
    Tensor zero(dtype, {1});
    std::memset(zero.raw(), 0, zero.byte_size());
    for (int upper : {0, 1}) {
      for (int64_t k : {-5, -1, 0, 2, 4}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " upper ", upper, " k ", k));
        Tensor expected = Mapped(
            in, in_dims,
            [&](const std::vector<int64_t>& o) {
              const bool keep = upper ? o[2] >= o[1] + k : o[2] <= o[1] + k;
              return keep ? Ravel(o, in_dims) : -1;
            },
            &zero);
        EXPECT_EQ(RunOk("Trilu", {in, I64({}, {k})}, {Attribute::Int("upper", upper)}, 14)[0],
                  expected);
        if (k == 0) {
          EXPECT_EQ(RunOk("Trilu", {in}, {Attribute::Int("upper", upper)}, 14)[0], expected);
        }
      }
    }
  }
  ExpectError("Trilu", {F32({3}, {1, 2, 3})}, {}, 14, {"Trilu", "rank >= 2"});
}

// ---- DepthToSpace / SpaceToDepth -----------------------------------------------------

TEST(CpuDepthToSpace, BothModesAndSpaceToDepthInEveryDType) {
  const std::vector<int64_t> in_dims = {2, 8, 2, 3};  // b = 2: depth 2
  for (DType dtype : AllDTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    Tensor in = Pattern(dtype, in_dims);
    // ONNX: DCR reads channel (bh * 2 + bw) * depth + c, CRD c * 4 + bh * 2 + bw.
    for (const std::string mode : {"DCR", "CRD"}) {
      Tensor expected = Mapped(in, {2, 2, 4, 6}, [&](const std::vector<int64_t>& o) {
        const int64_t bh = o[2] % 2, bw = o[3] % 2, c = o[1];
        const int64_t channel = mode == "DCR" ? (bh * 2 + bw) * 2 + c : c * 4 + bh * 2 + bw;
        return Ravel({o[0], channel, o[2] / 2, o[3] / 2}, in_dims);
      });
      EXPECT_EQ(RunOk("DepthToSpace", {in},
                      {Attribute::Int("blocksize", 2), Attribute::String("mode", mode)}, 13)[0],
                expected);
    }
    // SpaceToDepth of [2, 2, 4, 6]: channel (bh * 2 + bw) * C + c.
    Tensor space = Pattern(dtype, {2, 2, 4, 6});
    Tensor expected = Mapped(space, {2, 8, 2, 3}, [&](const std::vector<int64_t>& o) {
      const int64_t block = o[1] / 2, c = o[1] % 2;
      return Ravel({o[0], c, o[2] * 2 + block / 2, o[3] * 2 + block % 2}, {2, 2, 4, 6});
    });
    EXPECT_EQ(RunOk("SpaceToDepth", {space}, {Attribute::Int("blocksize", 2)}, 13)[0], expected);
  }
  ExpectError("DepthToSpace", {Pattern(DType::kFloat32, {1, 6, 2, 2})},
              {Attribute::Int("blocksize", 2)}, 13, {"DepthToSpace", "divisible"});
  ExpectError("SpaceToDepth", {Pattern(DType::kFloat32, {1, 1, 3, 4})},
              {Attribute::Int("blocksize", 2)}, 13, {"SpaceToDepth", "divisible"});
}

// ---- Conformance ----------------------------------------------------------------

TEST(CpuShapeDataConformance, NodeCasesOfTheseOpsPass) {
  if (!fs::is_directory(ConformanceRoot())) {
    GTEST_SKIP() << "no conformance data at " << ConformanceRoot();
  }
  const ConformanceSummary summary =
      RunConformanceCasesOf(Cpu(), {"Expand",  "Flatten",   "Reshape",   "Shape",  "Size",
                                    "Squeeze", "Transpose", "Unsqueeze", "Concat", "Gather",
                                    "Pad",     "Slice",     "Split",     "Tile"});
  std::cout << "shape/data conformance: " << summary.passed << " passed, "
            << summary.failures.size() << " failed, " << summary.multi_node.size()
            << " multi-node skipped\n";
  for (const std::string& f : summary.failures) ADD_FAILURE() << f;
  for (const std::string& m : summary.multi_node) {
    std::cout << "  skipped (multi-node): " << m << "\n";
  }
  EXPECT_GE(summary.passed, 70) << "fewer cases of these ops than the 71 in onnx-node";
}

}  // namespace
}  // namespace castor
