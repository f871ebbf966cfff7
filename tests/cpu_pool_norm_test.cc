// CPU kernels of the pool and normalization families (backend/cpu/pool.cc,
// normalization.cc) against naive float64 references written here: direct
// windowed max/average (ceil_mode, pads, count_include_pad, dilations,
// auto_pad, MaxPool Indices in both storage orders; the direct 2-D MaxPool
// path against the reference and the generic path, NaN and infinities),
// global pools, BatchNormalization in inference and training mode (and
// castor's BatchNormalizationTraining, PyTorch's unbiased running variance),
// LayerNormalization over every axis with its Mean/InvStdDev outputs,
// InstanceNormalization and com.castor InstanceNormalizationGrad in every
// dtype (odd and 1-element spatial sizes, a mean far from zero) and against
// PyTorch's F.instance_norm / F.group_norm forward and backward
// (tests/data/instance_norm_torch_reference.txt, written once by
// tests/data/make_instance_norm_reference.py; GroupNorm in the form
// torch.onnx.export writes). Also runs the ONNX conformance cases of these
// ops.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/run_node.h"
#include "graph/gradient_builder.h"
#include "graph/half.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "backend/cpu/simd16.h"
#include "gtest/gtest.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using testing::ConformanceSummary;
using testing::Count;
using testing::Cpu;
using testing::ExpectNear;
using testing::Make;
using testing::Random;
using testing::RoundTo;
using testing::RunConformanceCasesOf;
using testing::RunOk;
using testing::SingleNode;
using testing::Unravel;
using testing::Values;

// ---- Pools --------------------------------------------------------------------

struct PoolSpec {
  std::vector<int64_t> x_dims, kernel, strides, dilations, pads;
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false;
  bool count_include_pad = false;
};

// Direct pooling in float64. `max` selects MaxPool (indices filled, storage
// order 0 and 1) or AveragePool.
std::vector<double> RefPool(const PoolSpec& s, const std::vector<double>& x, bool max,
                            std::vector<int64_t>* out_dims, std::vector<int64_t>* idx_row,
                            std::vector<int64_t>* idx_col) {
  const size_t nd = s.x_dims.size() - 2;
  std::vector<int64_t> in(s.x_dims.begin() + 2, s.x_dims.end());
  auto or_fill = [&](const std::vector<int64_t>& v, size_t n, int64_t f) {
    return v.empty() ? std::vector<int64_t>(n, f) : v;
  };
  const auto st = or_fill(s.strides, nd, 1), dl = or_fill(s.dilations, nd, 1);
  auto pads = or_fill(s.pads, 2 * nd, 0);
  std::vector<int64_t> out(nd);
  for (size_t d = 0; d < nd; ++d) {
    const int64_t win = (s.kernel[d] - 1) * dl[d] + 1;
    if (s.auto_pad == "SAME_UPPER" || s.auto_pad == "SAME_LOWER") {
      const int64_t o = (in[d] + st[d] - 1) / st[d];
      const int64_t total = std::max<int64_t>(0, (o - 1) * st[d] + win - in[d]);
      pads[d] = s.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pads[d + nd] = total - pads[d];
    } else if (s.auto_pad == "VALID") {
      pads[d] = pads[d + nd] = 0;
    }
    const int64_t span = in[d] + pads[d] + pads[d + nd] - win;
    out[d] = (s.ceil_mode ? (span + st[d] - 1) / st[d] : span / st[d]) + 1;
    if (s.ceil_mode && (out[d] - 1) * st[d] >= in[d] + pads[d]) --out[d];
  }
  *out_dims = {s.x_dims[0], s.x_dims[1]};
  out_dims->insert(out_dims->end(), out.begin(), out.end());
  const int64_t planes = s.x_dims[0] * s.x_dims[1], isz = Count(in), osz = Count(out);
  const int64_t ksz = Count(s.kernel);
  std::vector<double> y(static_cast<size_t>(planes * osz));
  idx_row->assign(y.size(), -1);
  idx_col->assign(y.size(), -1);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t q = 0; q < osz; ++q) {
      const auto o = Unravel(q, out);
      double best = -std::numeric_limits<double>::infinity(), sum = 0;
      int64_t count = 0, padded = 0;
      for (int64_t kq = 0; kq < ksz; ++kq) {
        const auto k = Unravel(kq, s.kernel);
        bool inside = true, in_padded = true;
        int64_t row = 0, col = 0, step = 1;
        for (size_t d = 0; d < nd; ++d) {
          const int64_t i = o[d] * st[d] - pads[d] + k[d] * dl[d];
          if (i < 0 || i >= in[d]) inside = false;
          if (i < -pads[d] || i >= in[d] + pads[d + nd]) in_padded = false;
          row = row * in[d] + i;
        }
        for (size_t d = 0; d < nd; ++d) {
          col += (o[d] * st[d] - pads[d] + k[d] * dl[d]) * step;
          step *= in[d];
        }
        padded += in_padded;
        if (!inside) continue;
        const double v = x[p * isz + row];
        ++count;
        sum += v;
        if (v > best) {
          best = v;
          (*idx_row)[p * osz + q] = p * isz + row;
          (*idx_col)[p * osz + q] = p * isz + col;
        }
      }
      y[p * osz + q] = max ? best : sum / static_cast<double>(s.count_include_pad ? padded : count);
    }
  return y;
}

std::vector<Attribute> PoolAttrs(const PoolSpec& s, bool max) {
  std::vector<Attribute> attrs = {Attribute::Ints("kernel_shape", s.kernel)};
  if (!s.strides.empty()) attrs.push_back(Attribute::Ints("strides", s.strides));
  if (!s.dilations.empty()) attrs.push_back(Attribute::Ints("dilations", s.dilations));
  if (!s.pads.empty()) attrs.push_back(Attribute::Ints("pads", s.pads));
  if (s.auto_pad != "NOTSET") attrs.push_back(Attribute::String("auto_pad", s.auto_pad));
  if (s.ceil_mode) attrs.push_back(Attribute::Int("ceil_mode", 1));
  if (!max) attrs.push_back(Attribute::Int("count_include_pad", s.count_include_pad));
  return attrs;
}

const std::vector<PoolSpec>& PoolSpecs() {
  static const std::vector<PoolSpec> specs = {
      {{2, 3, 6, 6}, {2, 2}, {2, 2}, {}, {}, "NOTSET", false, false},
      {{1, 2, 7, 8}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, "NOTSET", false, false},
      {{1, 2, 7, 8}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, "NOTSET", false, true},
      {{1, 2, 7, 8}, {3, 2}, {2, 3}, {}, {1, 0, 0, 1}, "NOTSET", true, false},
      {{1, 2, 7, 8}, {3, 2}, {2, 3}, {}, {1, 0, 0, 1}, "NOTSET", true, true},
      {{1, 1, 4, 4}, {3, 3}, {2, 2}, {}, {}, "NOTSET", true, false},
      {{1, 2, 9, 9}, {2, 3}, {1, 2}, {2, 2}, {1, 1, 1, 1}, "NOTSET", false, true},
      {{1, 2, 9, 9}, {2, 3}, {2, 1}, {2, 2}, {}, "NOTSET", true, false},
      {{2, 2, 7, 6}, {3, 2}, {2, 2}, {}, {}, "SAME_UPPER", false, false},
      {{2, 2, 7, 6}, {3, 2}, {2, 2}, {}, {}, "SAME_LOWER", false, true},
      {{2, 2, 7, 6}, {3, 2}, {2, 2}, {}, {}, "VALID", false, false},
      {{2, 3, 11}, {3}, {2}, {}, {1, 2}, "NOTSET", false, true},
      {{1, 2, 5, 6, 7}, {2, 3, 2}, {2, 1, 2}, {1, 2, 2}, {1, 0, 1, 0, 1, 1}, "NOTSET", true, true},
  };
  return specs;
}

TEST(CpuPool, MaxPoolWithIndices) {
  unsigned seed = 10;
  for (const PoolSpec& s : PoolSpecs()) {
    const auto x = RoundTo(DType::kFloat32, Random(Count(s.x_dims), seed++));
    std::vector<int64_t> dims, idx_row, idx_col;
    const auto expected = RefPool(s, x, true, &dims, &idx_row, &idx_col);
    for (int64_t order : {0, 1}) {
      auto attrs = PoolAttrs(s, true);
      attrs.push_back(Attribute::Int("storage_order", order));
      auto out = RunOk("MaxPool", {Make(DType::kFloat32, s.x_dims, x)}, attrs, 12, 2);
      ASSERT_EQ(out.size(), 2u);
      ASSERT_EQ(out[0].dims(), dims);
      ExpectNear(expected, out[0], 0, 0, "MaxPool");
      ASSERT_EQ(out[1].dtype(), DType::kInt64);
      const auto& idx = order == 0 ? idx_row : idx_col;
      for (size_t i = 0; i < idx.size(); ++i) {
        EXPECT_EQ(out[1].data<int64_t>()[i], idx[i]) << "Indices element " << i << " order " << order;
      }
    }
    for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
      const auto xr = RoundTo(dt, x);
      std::vector<int64_t> d2, r2, c2;
      const auto e2 = RefPool(s, xr, true, &d2, &r2, &c2);
      auto out = RunOk("MaxPool", {Make(dt, s.x_dims, xr)}, PoolAttrs(s, true), 22);
      ASSERT_EQ(out.size(), 1u);
      ASSERT_EQ(out[0].dtype(), dt);
      ExpectNear(e2, out[0], 0, 0, "MaxPool 16/64-bit");
    }
  }
}

// The direct 2-D MaxPool path (no Indices output) against the float64
// reference and against the generic N-d path (taken when Indices is
// requested), on batches of several planes (so planes run in parallel),
// with pads, strides, dilations, ceil_mode and auto_pad, in every dtype.
TEST(CpuPool, MaxPool2DFastPathMatchesReferenceAndGenericPath) {
  const std::vector<PoolSpec> specs = {
      {{3, 5, 26, 26}, {2, 2}, {2, 2}, {}, {}, "NOTSET", false, false},  // the sample CNN's pool
      {{2, 3, 13, 14}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, "NOTSET", true, false},
      {{2, 4, 11, 9}, {2, 3}, {1, 2}, {2, 2}, {1, 2, 1, 0}, "NOTSET", false, false},
      {{2, 2, 10, 7}, {3, 2}, {3, 1}, {}, {}, "SAME_LOWER", true, false},
      {{1, 3, 6, 6}, {6, 6}, {1, 1}, {}, {}, "VALID", false, false},  // one window per plane
  };
  unsigned seed = 700;
  for (const PoolSpec& s : specs) {
    SCOPED_TRACE(::testing::Message() << "kernel " << s.kernel[0] << "x" << s.kernel[1]
                                      << " ceil " << s.ceil_mode << " auto_pad " << s.auto_pad);
    const auto x = Random(Count(s.x_dims), seed++);
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
      const auto xr = RoundTo(dt, x);
      std::vector<int64_t> dims, r, c;
      const auto expected = RefPool(s, xr, true, &dims, &r, &c);
      auto fast = RunOk("MaxPool", {Make(dt, s.x_dims, xr)}, PoolAttrs(s, true), 22, 1);
      auto generic = RunOk("MaxPool", {Make(dt, s.x_dims, xr)}, PoolAttrs(s, true), 22, 2);
      ASSERT_EQ(fast.size(), 1u);
      ASSERT_EQ(generic.size(), 2u);
      ASSERT_EQ(fast[0].dims(), dims);
      ExpectNear(expected, fast[0], 0, 0, "MaxPool 2-D fast path vs reference");
      ExpectNear(Values(generic[0]), fast[0], 0, 0, "MaxPool 2-D fast path vs generic path");
    }
  }
}

// NaN and infinities: a window holding a NaN gives NaN on both paths, -inf
// loses to everything, +inf wins; other windows are unaffected.
TEST(CpuPool, MaxPool2DFastPathNanAndInfinity) {
  const PoolSpec s = {{2, 2, 9, 9}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, "NOTSET", false, false};
  std::vector<double> x = Random(Count(s.x_dims), 811);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  x[0 * 81 + 4 * 9 + 4] = nan;   // plane 0, centre
  x[1 * 81 + 0 * 9 + 8] = inf;   // plane 1, top-right corner
  x[2 * 81 + 8 * 9 + 0] = -inf;  // plane 2, bottom-left corner
  std::vector<double> finite = x;
  for (double& v : finite) {
    if (std::isnan(v)) v = -1e300;  // stands in for "not the max" in the reference
  }
  std::vector<int64_t> dims, r, c;
  const auto reference = RefPool(s, finite, true, &dims, &r, &c);  // dims [2, 2, 5, 5]
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kFloat64}) {
    auto fast = RunOk("MaxPool", {Make(dt, s.x_dims, x)}, PoolAttrs(s, true), 12, 1);
    auto generic = RunOk("MaxPool", {Make(dt, s.x_dims, x)}, PoolAttrs(s, true), 12, 2);
    ASSERT_EQ(fast.size(), 1u);
    ASSERT_EQ(generic.size(), 2u);
    for (int64_t i = 0; i < fast[0].num_elements(); ++i) {
      const int64_t plane = i / 25, oh = i % 25 / 5, ow = i % 5;
      // Output (oh, ow) covers input rows/cols [2 o - 1, 2 o + 1].
      const bool sees_nan = plane == 0 && std::abs(2 * oh - 4) <= 1 && std::abs(2 * ow - 4) <= 1;
      const double got = fast[0].GetDouble(i);
      const double generic_value = generic[0].GetDouble(i);
      if (sees_nan) {
        EXPECT_TRUE(std::isnan(got)) << "element " << i;
        EXPECT_TRUE(std::isnan(generic_value)) << "element " << i;
      } else {
        EXPECT_EQ(got, static_cast<double>(Values(Make(dt, {1}, {reference[i]}))[0]))
            << "element " << i;
        EXPECT_EQ(got, generic_value) << "element " << i;
      }
    }
    EXPECT_EQ(fast[0].GetDouble(1 * 25 + 0 * 5 + 4), inf);  // plane 1's corner window
  }
}

// The 2x2, stride-2 windows' own loop (column pairs): the window holding a
// NaN gives NaN, in either position of the pair, and every output equals the
// generic path's: on the 16-windows-at-a-time AVX-512 rows (where the CPU
// has them) and on the separable loops, for rows of 4 and of 35 windows.
TEST(CpuPool, MaxPool2DColumnPairsNan) {
  for (const bool fused : {true, false}) {
    if (fused && !cpu::HasSimd16()) {
      std::cout << "no AVX-512 here: the 16-window rows are not tested\n";
      continue;
    }
    for (const int64_t in_w : {8, 70}) {
      SCOPED_TRACE(::testing::Message() << (fused ? "AVX-512 rows" : "separable loops")
                                        << ", width " << in_w);
      const cpu::ScopedFusedSimd16ForTesting scoped_fused(fused);
      const PoolSpec s = {{1, 2, 8, in_w}, {2, 2}, {2, 2}, {}, {}, "NOTSET", false, false};
      std::vector<double> x = Random(Count(s.x_dims), 812);
      const double nan = std::numeric_limits<double>::quiet_NaN();
      x[0 * 8 * in_w + 3 * in_w + 5] = nan;  // plane 0: window (1, 2), second column of the pair
      x[1 * 8 * in_w + 6 * in_w + 0] = nan;  // plane 1: window (3, 0), first column
      const int64_t out_w = in_w / 2;
      for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
        auto fast = RunOk("MaxPool", {Make(dt, s.x_dims, x)}, PoolAttrs(s, true), 22, 1);
        auto generic = RunOk("MaxPool", {Make(dt, s.x_dims, x)}, PoolAttrs(s, true), 22, 2);
        ASSERT_EQ(fast.size(), 1u);
        ASSERT_EQ(generic.size(), 2u);
        ASSERT_EQ(fast[0].num_elements(), 2 * 4 * out_w);
        for (int64_t i = 0; i < fast[0].num_elements(); ++i) {
          const bool sees_nan = i == 0 * 4 * out_w + 1 * out_w + 2 || i == 1 * 4 * out_w + 3 * out_w + 0;
          const double got = fast[0].GetDouble(i);
          EXPECT_EQ(std::isnan(got), sees_nan) << "element " << i;
          if (!sees_nan) {
            EXPECT_EQ(got, generic[0].GetDouble(i)) << "element " << i;
          }
        }
      }
    }
  }
}

TEST(CpuPool, MaxPoolInt8) {
  const PoolSpec& s = PoolSpecs()[1];
  std::vector<double> x = Random(Count(s.x_dims), 77);
  for (double& v : x) v = std::round(v * 100);
  std::vector<int64_t> dims, r, c;
  const auto expected = RefPool(s, x, true, &dims, &r, &c);
  Tensor t(DType::kInt8, s.x_dims);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<int8_t>()[i] = static_cast<int8_t>(x[i]);
  auto out = RunOk("MaxPool", {t}, PoolAttrs(s, true), 12);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].dtype(), DType::kInt8);
  ExpectNear(expected, out[0], 0, 0, "MaxPool int8");
}

TEST(CpuPool, AveragePool) {
  unsigned seed = 50;
  for (const PoolSpec& s : PoolSpecs()) {
    SCOPED_TRACE(::testing::Message() << "pool spec kernel[0]=" << s.kernel[0] << " ceil "
                                      << s.ceil_mode << " include_pad " << s.count_include_pad
                                      << " auto_pad " << s.auto_pad);
    const auto x = Random(Count(s.x_dims), seed++);
    std::vector<int64_t> dims, r, c;
    const auto expected = RefPool(s, x, false, &dims, &r, &c);
    auto out = RunOk("AveragePool", {Make(DType::kFloat32, s.x_dims, x)}, PoolAttrs(s, false), 19);
    ASSERT_EQ(out.size(), 1u);
    ASSERT_EQ(out[0].dims(), dims);
    ExpectNear(expected, out[0], 1e-6, 1e-6, "AveragePool");
    const auto xh = RoundTo(DType::kFloat16, x);
    const auto eh = RefPool(s, xh, false, &dims, &r, &c);
    auto outh = RunOk("AveragePool", {Make(DType::kFloat16, s.x_dims, xh)}, PoolAttrs(s, false), 19);
    ExpectNear(RoundTo(DType::kFloat16, eh), outh[0], 1e-3, 1e-4, "AveragePool f16");
  }
}

TEST(CpuPool, GlobalPools) {
  const std::vector<int64_t> xd = {2, 3, 4, 5};
  const auto x = Random(Count(xd), 90);
  std::vector<double> avg(6), mx(6);
  for (int p = 0; p < 6; ++p) {
    double s = 0, m = -1e9;
    for (int i = 0; i < 20; ++i) {
      s += x[p * 20 + i];
      m = std::max(m, x[p * 20 + i]);
    }
    avg[p] = s / 20;
    mx[p] = m;
  }
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    auto a = RunOk("GlobalAveragePool", {Make(dt, xd, x)}, {});
    ASSERT_EQ(a[0].dims(), (std::vector<int64_t>{2, 3, 1, 1}));
    ExpectNear(avg, a[0], 1e-6, 1e-7, "GlobalAveragePool");
    auto m = RunOk("GlobalMaxPool", {Make(dt, xd, x)}, {});
    ASSERT_EQ(m[0].dims(), (std::vector<int64_t>{2, 3, 1, 1}));
    ExpectNear(mx, m[0], 1e-7, 0, "GlobalMaxPool");
  }
}

// GlobalAveragePool sums each plane in 16 float32 lanes: planes shorter
// than, equal to and just past one block of lanes, a 14x14 plane and a
// long one, in float32 and both 16-bit types (their inputs as stored),
// against the float64 mean.
TEST(CpuPool, GlobalAveragePoolPlaneSums) {
  for (const int64_t size : {1, 15, 16, 17, 196, 4099}) {
    const std::vector<int64_t> xd = {2, 3, size};
    const auto x = Random(Count(xd), 91);
    for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(::testing::Message() << "plane " << size << " " << DTypeName(dt));
      const std::vector<double> stored = RoundTo(dt, x);
      std::vector<double> mean(6, 0.0);
      for (int64_t p = 0; p < 6; ++p) {
        for (int64_t i = 0; i < size; ++i) mean[p] += stored[p * size + i];
        mean[p] /= static_cast<double>(size);
      }
      auto out = RunOk("GlobalAveragePool", {Make(dt, xd, stored)}, {}, 22);
      ASSERT_EQ(out[0].dims(), (std::vector<int64_t>{2, 3, 1}));
      EXPECT_EQ(out[0].dtype(), dt);
      // float32: a few ulps of the sum; 16-bit: the rounding of the mean.
      const double tol = dt == DType::kFloat32 ? 2e-6 : dt == DType::kFloat16 ? 1e-3 : 8e-3;
      ExpectNear(mean, out[0], tol, tol, "GlobalAveragePool");
    }
  }
}

// ---- Normalization ---------------------------------------------------------------

TEST(CpuBatchNorm, InferenceMode) {
  const std::vector<int64_t> xd = {2, 3, 4, 2};
  const auto x = Random(Count(xd), 1), scale = Random(3, 2), bias = Random(3, 3), mean = Random(3, 4);
  std::vector<double> var = Random(3, 5);
  for (double& v : var) v = std::fabs(v) + 0.1;
  const double eps = 1e-3;
  std::vector<double> expected(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const int c = static_cast<int>((i / 8) % 3);
    expected[i] = (x[i] - mean[c]) / std::sqrt(var[c] + eps) * scale[c] + bias[c];
  }
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    auto out = RunOk("BatchNormalization",
                     {Make(dt, xd, x), Make(dt, {3}, scale), Make(dt, {3}, bias), Make(dt, {3}, mean),
                      Make(dt, {3}, var)},
                     {Attribute::Float("epsilon", static_cast<float>(eps))}, 15);
    ASSERT_EQ(out.size(), 1u);
    ExpectNear(expected, out[0], 1e-5, 1e-6, "BatchNorm inference");
  }
  // float16 X with float32 parameters (opset 15 T != T1/T2).
  const auto xh = RoundTo(DType::kFloat16, x);
  std::vector<double> eh(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const int c = static_cast<int>((i / 8) % 3);
    eh[i] = (xh[i] - mean[c]) / std::sqrt(var[c] + eps) * scale[c] + bias[c];
  }
  auto out = RunOk("BatchNormalization",
                   {Make(DType::kFloat16, xd, xh), Make(DType::kFloat32, {3}, scale),
                    Make(DType::kFloat32, {3}, bias), Make(DType::kFloat32, {3}, mean),
                    Make(DType::kFloat32, {3}, var)},
                   {Attribute::Float("epsilon", static_cast<float>(eps))}, 15);
  ASSERT_EQ(out[0].dtype(), DType::kFloat16);
  ExpectNear(RoundTo(DType::kFloat16, eh), out[0], 1e-3, 1e-3, "BatchNorm f16 X, f32 params");
}

TEST(CpuBatchNorm, TrainingModeOutputs) {
  const std::vector<int64_t> xd = {3, 2, 5};
  const auto x = Random(Count(xd), 21), scale = Random(2, 22), bias = Random(2, 23),
             mean = Random(2, 24);
  std::vector<double> var = Random(2, 25);
  for (double& v : var) v = std::fabs(v) + 0.5;
  const double eps = 1e-2, momentum = 0.8;
  std::vector<double> bmean(2, 0), bvar(2, 0);
  for (int c = 0; c < 2; ++c) {
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 5; ++i) bmean[c] += x[(n * 2 + c) * 5 + i] / 15.0;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 5; ++i) bvar[c] += std::pow(x[(n * 2 + c) * 5 + i] - bmean[c], 2) / 15.0;
  }
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const int c = static_cast<int>((i / 5) % 2);
    y[i] = (x[i] - bmean[c]) / std::sqrt(bvar[c] + eps) * scale[c] + bias[c];
  }
  std::vector<double> rmean(2), rvar(2);
  for (int c = 0; c < 2; ++c) {
    rmean[c] = mean[c] * momentum + bmean[c] * (1 - momentum);
    rvar[c] = var[c] * momentum + bvar[c] * (1 - momentum);  // biased batch variance
  }
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    auto out = RunOk("BatchNormalization",
                     {Make(dt, xd, x), Make(dt, {2}, scale), Make(dt, {2}, bias), Make(dt, {2}, mean),
                      Make(dt, {2}, var)},
                     {Attribute::Float("epsilon", static_cast<float>(eps)),
                      Attribute::Float("momentum", static_cast<float>(momentum)),
                      Attribute::Int("training_mode", 1)},
                     15, 3);
    ASSERT_EQ(out.size(), 3u);
    ExpectNear(y, out[0], 1e-5, 1e-6, "BatchNorm training Y");
    ExpectNear(rmean, out[1], 1e-5, 1e-6, "running_mean");
    ExpectNear(rvar, out[2], 1e-5, 1e-6, "running_var");
  }
  // float16 X, float32 statistics: running stats stay float32.
  auto out = RunOk("BatchNormalization",
                   {Make(DType::kFloat16, xd, RoundTo(DType::kFloat16, x)),
                    Make(DType::kFloat32, {2}, scale), Make(DType::kFloat32, {2}, bias),
                    Make(DType::kFloat32, {2}, mean), Make(DType::kFloat32, {2}, var)},
                   {Attribute::Float("epsilon", static_cast<float>(eps)),
                    Attribute::Float("momentum", static_cast<float>(momentum)),
                    Attribute::Int("training_mode", 1)},
                   15, 3);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].dtype(), DType::kFloat16);
  EXPECT_EQ(out[1].dtype(), DType::kFloat32);
  ExpectNear(y, out[0], 5e-3, 5e-3, "BatchNorm training Y f16");
  ExpectNear(rmean, out[1], 1e-3, 1e-3, "running_mean f16 X");
  ExpectNear(rvar, out[2], 1e-3, 1e-3, "running_var f16 X");

  // castor's BatchNormalizationTraining (the training graph's form): the
  // same Y and running mean; the running variance takes PyTorch's unbiased
  // batch variance, bvar * 15 / 14.
  std::vector<double> rvar_unbiased(2);
  for (int c = 0; c < 2; ++c) {
    rvar_unbiased[c] = var[c] * momentum + bvar[c] * 15.0 / 14.0 * (1 - momentum);
  }
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    const std::vector<double> xt = RoundTo(dt, x);
    const double tol = dt == DType::kFloat16    ? 5e-3
                       : dt == DType::kBFloat16 ? 3e-2
                                                : 1e-5;
    auto castor = RunOk("BatchNormalizationTraining",
                        {Make(dt, xd, xt), Make(DType::kFloat32, {2}, scale),
                         Make(DType::kFloat32, {2}, bias), Make(DType::kFloat32, {2}, mean),
                         Make(DType::kFloat32, {2}, var)},
                        {Attribute::Float("epsilon", static_cast<float>(eps)),
                         Attribute::Float("momentum", static_cast<float>(momentum))},
                        1, 3, kCastorDomain);
    ASSERT_EQ(castor.size(), 3u);
    EXPECT_EQ(castor[0].dtype(), dt);
    EXPECT_EQ(castor[2].dtype(), DType::kFloat32);
    const std::string what = std::string("BatchNormalizationTraining ") + DTypeName(dt);
    ExpectNear(y, castor[0], tol, tol, what + " Y");
    ExpectNear(rmean, castor[1], tol, tol, what + " running_mean");
    ExpectNear(rvar_unbiased, castor[2], tol, tol, what + " running_var (unbiased)");
  }
  // relu = 1 (the fuse-batchnorm-relu pass's form): the bits of Relu on
  // the plain node's Y, with negatives, zeros and a NaN among the inputs;
  // output 3 is the batch mean, float32.
  std::vector<double> with_nan = x;
  with_nan[7] = std::nan("");
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    SCOPED_TRACE(DTypeName(dt));
    const std::vector<Tensor> inputs = {
        Make(dt, xd, RoundTo(dt, with_nan)), Make(DType::kFloat32, {2}, scale),
        Make(DType::kFloat32, {2}, bias), Make(DType::kFloat32, {2}, mean),
        Make(DType::kFloat32, {2}, var)};
    const std::vector<Attribute> attrs = {Attribute::Float("epsilon", static_cast<float>(eps))};
    std::vector<Attribute> relu_attrs = attrs;
    relu_attrs.push_back(Attribute::Int("relu", 1));
    const auto plain = RunOk("BatchNormalizationTraining", inputs, attrs, 1, 4, kCastorDomain);
    const auto fused = RunOk("BatchNormalizationTraining", inputs, relu_attrs, 1, 4, kCastorDomain);
    const auto relu = RunOk("Relu", {plain[0]}, {}, 17);
    EXPECT_TRUE(testing::SameBits(fused[0], relu[0]));
    int negatives = 0, nans = 0;
    for (int64_t i = 0; i < plain[0].num_elements(); ++i) {
      negatives += plain[0].GetDouble(i) < 0;
      nans += std::isnan(plain[0].GetDouble(i));
    }
    EXPECT_GT(negatives, 0);  // the Relu had values to clamp
    EXPECT_EQ(nans, 15);      // channel 1, whose statistics the NaN reaches
    EXPECT_EQ(fused[3].dtype(), DType::kFloat32);
    EXPECT_TRUE(testing::SameBits(fused[3], plain[3]));
    EXPECT_NEAR(plain[3].GetDouble(0), bmean[0], 1e-2);
  }
  // One value per channel has no unbiased variance: a clear error.
  absl::StatusOr<std::vector<Tensor>> single = testing::RunNodeOf(
      "BatchNormalizationTraining",
      {Make(DType::kFloat32, {1, 2}, {0.5, 1.5}), Make(DType::kFloat32, {2}, scale),
       Make(DType::kFloat32, {2}, bias), Make(DType::kFloat32, {2}, mean),
       Make(DType::kFloat32, {2}, var)},
      {}, 1, 3, kCastorDomain);
  ASSERT_FALSE(single.ok());
  EXPECT_NE(single.status().message().find("1 value per channel"), std::string::npos)
      << single.status();
}

// float32 rows with a dense scale run four at a time in float64 lanes on
// AVX-512 (where the CPU has it): the same bits as the portable rows for
// Y, Mean and InvStdDev, for widths with and without a partial block, with
// and without a bias, and with a scale per outer index (rows then go four
// at a time only where they share it).
TEST(CpuLayerNorm, VectorRowsMatchPortableRowsBitForBit) {
  if (!cpu::HasSimd16()) GTEST_SKIP() << "this CPU has no AVX-512 (F/BW/VL): no vector rows";
  for (int64_t width : {1, 5, 8, 37, 64, 130}) {
    for (const bool per_outer_scale : {false, true}) {
      for (const bool bias : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "width " << width << (bias ? ", bias" : "")
                                          << (per_outer_scale ? ", scale [3, 1, D]" : ""));
        const std::vector<int64_t> xd = {3, 6, width};
        const std::vector<int64_t> sd =
            per_outer_scale ? std::vector<int64_t>{3, 1, width} : std::vector<int64_t>{width};
        std::vector<Tensor> inputs = {Make(DType::kFloat32, xd, Random(Count(xd), 71)),
                                      Make(DType::kFloat32, sd, Random(Count(sd), 72))};
        if (bias) inputs.push_back(Make(DType::kFloat32, {width}, Random(width, 73)));
        const std::vector<Attribute> attrs = {Attribute::Int("axis", -1)};
        std::vector<Tensor> vector_rows, portable_rows;
        {
          const cpu::ScopedFusedSimd16ForTesting fused(true);
          vector_rows = RunOk("LayerNormalization", inputs, attrs, 17, 3);
        }
        {
          const cpu::ScopedFusedSimd16ForTesting fused(false);
          portable_rows = RunOk("LayerNormalization", inputs, attrs, 17, 3);
        }
        ASSERT_EQ(vector_rows.size(), 3u);
        ASSERT_EQ(portable_rows.size(), 3u);
        for (int k = 0; k < 3; ++k) {
          EXPECT_TRUE(testing::SameBits(vector_rows[k], portable_rows[k])) << "output " << k;
        }
      }
    }
  }
}

// castor's LayerNormalization (com.castor, the fold-layernorm-casts form):
// a 16-bit X with float32 Scale and B gives the bits of the ONNX op on X
// widened to float32 with Y rounded once by a Cast, Mean and InvStdDev
// included, on the vector rows and the portable ones, for widths with and
// without a partial block, row counts that leave rows after the fours,
// with and without a bias, and rows holding a subnormal, an Inf and a NaN.
// The ONNX op itself refuses the mixed dtypes.
TEST(CpuLayerNorm, CastorFormIsTheWidenedOpRoundedOnce) {
  for (const DType dt : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t width : {1, 5, 37, 64, 130}) {
      for (const bool bias : {true, false}) {
        for (const bool vector_rows : {true, false}) {
          if (vector_rows && !cpu::HasSimd16()) continue;  // said below
          SCOPED_TRACE(::testing::Message() << DTypeName(dt) << ", width " << width
                                            << (bias ? ", bias" : "")
                                            << (vector_rows ? ", vector rows" : ""));
          const std::vector<int64_t> xd = {3, 6, width};
          std::vector<double> values = Random(Count(xd), 81);
          values[0] = 1e-40;  // a subnormal float32: 16-bit rounding flushes or keeps it
          values[width] = std::numeric_limits<double>::infinity();  // row 1
          values[2 * width] = std::nan("");                          // row 2
          const Tensor x16 = Make(dt, xd, values);
          std::vector<double> widened(static_cast<size_t>(Count(xd)));
          for (int64_t i = 0; i < Count(xd); ++i) widened[i] = x16.GetDouble(i);
          std::vector<Tensor> parameters = {
              Make(DType::kFloat32, {width}, Random(width, 82))};
          if (bias) parameters.push_back(Make(DType::kFloat32, {width}, Random(width, 83)));
          std::vector<Tensor> castor_inputs = {x16};
          std::vector<Tensor> onnx_inputs = {Make(DType::kFloat32, xd, widened)};
          for (const Tensor& p : parameters) {
            castor_inputs.push_back(p);
            onnx_inputs.push_back(p);
          }
          const std::vector<Attribute> attrs = {Attribute::Int("axis", -1)};
          const cpu::ScopedFusedSimd16ForTesting fused(vector_rows);
          const std::vector<Tensor> castor_form =
              RunOk("LayerNormalization", castor_inputs, attrs, 1, 3, kCastorDomain);
          const std::vector<Tensor> onnx = RunOk("LayerNormalization", onnx_inputs, attrs, 17, 3);
          ASSERT_EQ(castor_form[0].dtype(), dt);
          const Tensor rounded =
              testing::RunOp("Cast", {onnx[0]}, {Attribute::Int("to", DTypeToOnnx(dt))}, 17);
          EXPECT_TRUE(testing::SameBits(castor_form[0], rounded)) << "Y";
          EXPECT_TRUE(testing::SameBits(castor_form[1], onnx[1])) << "Mean";
          EXPECT_TRUE(testing::SameBits(castor_form[2], onnx[2])) << "InvStdDev";
          EXPECT_TRUE(std::isnan(castor_form[0].GetDouble(2 * width)));
          EXPECT_FALSE(std::isnan(castor_form[0].GetDouble(3 * width)));
        }
      }
    }
  }
  if (!cpu::HasSimd16()) {
    std::cout << "[  NOTE    ] no AVX-512 (F/BW/VL) here: the castor form's vector rows were "
                 "not run\n";
  }
  absl::StatusOr<std::vector<Tensor>> onnx_mixed = testing::RunNodeOf(
      "LayerNormalization",
      {Make(DType::kBFloat16, {2, 4}, Random(8, 84)), Make(DType::kFloat32, {4}, Random(4, 85))},
      {}, 17, 1);
  ASSERT_FALSE(onnx_mixed.ok());
  EXPECT_NE(onnx_mixed.status().message().find("dtype"), std::string::npos)
      << onnx_mixed.status();
}

TEST(CpuLayerNorm, AxesAndStatisticsOutputs) {
  const std::vector<int64_t> xd = {2, 3, 4};
  const auto x = Random(Count(xd), 31);
  const double eps = 1e-4;
  for (int64_t axis : {-3, -2, -1, 0, 1, 2}) {
    const int64_t a = axis < 0 ? axis + 3 : axis;
    std::vector<int64_t> sd(xd.begin() + a, xd.end());
    const int64_t inner = Count(sd), outer = Count(xd) / inner;
    const auto scale = Random(inner, 32 + a), bias = Random(inner, 40 + a);
    std::vector<double> y(x.size()), mean(outer), inv(outer);
    for (int64_t r = 0; r < outer; ++r) {
      double m = 0, v = 0;
      for (int64_t i = 0; i < inner; ++i) m += x[r * inner + i] / inner;
      for (int64_t i = 0; i < inner; ++i) v += std::pow(x[r * inner + i] - m, 2) / inner;
      mean[r] = m;
      inv[r] = 1 / std::sqrt(v + eps);
      for (int64_t i = 0; i < inner; ++i) y[r * inner + i] = (x[r * inner + i] - m) * inv[r] * scale[i] + bias[i];
    }
    std::vector<int64_t> stats_dims = xd;
    for (int64_t d = a; d < 3; ++d) stats_dims[d] = 1;
    for (DType dt : {DType::kFloat32, DType::kFloat64}) {
      auto out = RunOk("LayerNormalization", {Make(dt, xd, x), Make(dt, sd, scale), Make(dt, sd, bias)},
                       {Attribute::Int("axis", axis), Attribute::Float("epsilon", static_cast<float>(eps))},
                       17, 3);
      ASSERT_EQ(out.size(), 3u);
      ExpectNear(y, out[0], 1e-5, 1e-6, "LayerNorm Y");
      EXPECT_EQ(out[1].dtype(), DType::kFloat32);
      EXPECT_EQ(out[1].dims(), stats_dims);
      ExpectNear(mean, out[1], 1e-5, 1e-6, "LayerNorm Mean");
      ExpectNear(inv, out[2], 1e-5, 1e-6, "LayerNorm InvStdDev");
    }
    // bfloat16 X: statistics in float32 and a float32 Mean output.
    const auto xb = RoundTo(DType::kBFloat16, x);
    auto out = RunOk("LayerNormalization",
                     {Make(DType::kBFloat16, xd, xb), Make(DType::kBFloat16, sd, RoundTo(DType::kBFloat16, scale))},
                     {Attribute::Int("axis", axis)}, 17, 2);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].dtype(), DType::kBFloat16);
    EXPECT_EQ(out[1].dtype(), DType::kFloat32);
    std::vector<double> bm(outer, 0);
    for (int64_t r = 0; r < outer; ++r)
      for (int64_t i = 0; i < inner; ++i) bm[r] += xb[r * inner + i] / inner;
    ExpectNear(bm, out[1], 1e-5, 1e-6, "LayerNorm Mean bf16");
  }
  // Scale broadcast from a [1, 4] tensor; no bias.
  const auto scale = Random(4, 60);
  auto out = RunOk("LayerNormalization", {Make(DType::kFloat32, xd, x), Make(DType::kFloat32, {1, 4}, scale)},
                   {Attribute::Int("axis", 1)}, 17);
  ASSERT_EQ(out.size(), 1u);
  for (int64_t r = 0; r < 2; ++r) {
    double m = 0, v = 0;
    for (int i = 0; i < 12; ++i) m += x[r * 12 + i] / 12;
    for (int i = 0; i < 12; ++i) v += std::pow(x[r * 12 + i] - m, 2) / 12;
    for (int i = 0; i < 12; ++i) {
      const double e = (x[r * 12 + i] - m) / std::sqrt(v + 1e-5) * scale[i % 4];
      EXPECT_NEAR(out[0].GetDouble(r * 12 + i), e, 1e-5);
    }
  }
}

// ---- InstanceNormalization -----------------------------------------------------

// InstanceNormalization in float64 over the (n, c) rows of X [N, C, ...].
std::vector<double> RefInstanceNorm(const std::vector<int64_t>& dims, const std::vector<double>& x,
                                    const std::vector<double>& scale,
                                    const std::vector<double>& bias, double eps) {
  const int64_t channels = dims[1], inner = Count(dims) / (dims[0] * dims[1]);
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < dims[0] * channels; ++r) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < inner; ++i) m += x[r * inner + i];
    m /= static_cast<double>(inner);
    for (int64_t i = 0; i < inner; ++i) v += (x[r * inner + i] - m) * (x[r * inner + i] - m);
    v /= static_cast<double>(inner);
    const int64_t c = r % channels;
    for (int64_t i = 0; i < inner; ++i) {
      y[r * inner + i] = (x[r * inner + i] - m) / std::sqrt(v + eps) * scale[c] + bias[c];
    }
  }
  return y;
}

// The gradients of sum(InstanceNorm(X) * dY) in float64: dX, dScale, dBias.
std::vector<std::vector<double>> RefInstanceNormGrad(const std::vector<int64_t>& dims,
                                                     const std::vector<double>& dy,
                                                     const std::vector<double>& x,
                                                     const std::vector<double>& scale,
                                                     double eps) {
  const int64_t channels = dims[1], inner = Count(dims) / (dims[0] * dims[1]);
  std::vector<double> dx(x.size()), d_scale(channels, 0.0), d_bias(channels, 0.0);
  for (int64_t r = 0; r < dims[0] * channels; ++r) {
    const int64_t c = r % channels;
    double m = 0, v = 0;
    for (int64_t i = 0; i < inner; ++i) m += x[r * inner + i];
    m /= static_cast<double>(inner);
    for (int64_t i = 0; i < inner; ++i) v += (x[r * inner + i] - m) * (x[r * inner + i] - m);
    v /= static_cast<double>(inner);
    const double inv = 1 / std::sqrt(v + eps);
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t i = 0; i < inner; ++i) {
      sum_dy += dy[r * inner + i];
      sum_dy_xhat += dy[r * inner + i] * (x[r * inner + i] - m) * inv;
    }
    d_scale[c] += sum_dy_xhat;
    d_bias[c] += sum_dy;
    for (int64_t i = 0; i < inner; ++i) {
      const double x_hat = (x[r * inner + i] - m) * inv;
      dx[r * inner + i] = scale[c] * inv *
                          (dy[r * inner + i] - sum_dy / inner - x_hat * sum_dy_xhat / inner);
    }
  }
  return {dx, d_scale, d_bias};
}

struct InstanceNormShape {
  std::string name;
  std::vector<int64_t> dims;
  double offset;  // added to X: a mean far from zero
};

const std::vector<InstanceNormShape>& InstanceNormShapes() {
  static const std::vector<InstanceNormShape> shapes = {
      {"2-D odd", {2, 3, 5, 7}, 0.0},
      {"1-element spatial", {3, 2, 1}, 0.0},
      {"1x1 image", {1, 4, 1, 1}, 0.0},
      {"3-D", {2, 2, 4, 3, 5}, 0.0},
      {"long rows", {1, 2, 1031}, 0.0},
      {"mean offset", {2, 3, 33}, 1.0},
  };
  return shapes;
}

// X of `shape` in `dtype` (the values it holds): uniform in [-1, 1) or, for
// the offset case, a small spread around a mean that float32 sums of x and
// x^2 would cancel (1e4 +- 0.5 in float32/64; 16-bit keeps a few bits of
// spread: 300 +- 4 / 300 +- 16).
std::vector<double> InstanceNormX(const InstanceNormShape& shape, DType dtype, unsigned seed) {
  std::vector<double> x = Random(Count(shape.dims), seed);
  if (shape.offset != 0.0) {
    const bool wide = dtype == DType::kFloat32 || dtype == DType::kFloat64;
    const double mean = wide ? 1e4 : 300.0;
    const double spread = wide ? 0.5 : dtype == DType::kFloat16 ? 4.0 : 16.0;
    for (double& v : x) v = mean + spread * v;
  }
  return RoundTo(dtype, x);
}

// bfloat16 InstanceNormalization is opset 22's.
int64_t InstanceNormOpset(DType dtype) { return dtype == DType::kBFloat16 ? 22 : 17; }

TEST(CpuInstanceNorm, MatchesFloat64ReferenceInEveryDType) {
  const double eps = 1e-5f;  // the float attribute's value
  for (const InstanceNormShape& shape : InstanceNormShapes()) {
    for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(shape.name + " " + DTypeName(dt));
      const int64_t channels = shape.dims[1];
      const std::vector<double> x = InstanceNormX(shape, dt, 71);
      const std::vector<double> scale = RoundTo(dt, Random(channels, 72));
      const std::vector<double> bias = RoundTo(dt, Random(channels, 73));
      const std::vector<double> y = RefInstanceNorm(shape.dims, x, scale, bias, eps);
      const std::vector<Tensor> out = RunOk(
          "InstanceNormalization",
          {Make(dt, shape.dims, x), Make(dt, {channels}, scale), Make(dt, {channels}, bias)},
          {Attribute::Float("epsilon", static_cast<float>(eps))}, InstanceNormOpset(dt));
      ASSERT_EQ(out.size(), 1u);
      EXPECT_EQ(out[0].dtype(), dt);
      EXPECT_EQ(out[0].dims(), shape.dims);
      // Statistics in float64 and one rounding on store: the dtype's half ulp
      // (float64: the mean of values 1e4 +- 0.5 summed in another order is
      // ~1e-11 off, relative to the spread).
      const double rtol = dt == DType::kFloat64   ? 1e-10
                          : dt == DType::kFloat32 ? 2e-7
                          : dt == DType::kFloat16 ? 1e-3
                                                  : 8e-3;
      const double atol = dt == DType::kFloat64 ? 1e-9 : rtol * 1e-2;
      ExpectNear(y, out[0], rtol, atol, "InstanceNorm Y");
      if (Count(shape.dims) == shape.dims[0] * channels) {  // one value per row: Y = B
        for (int64_t i = 0; i < out[0].num_elements(); ++i) {
          EXPECT_EQ(out[0].GetDouble(i), bias[i % channels]) << "element " << i;
        }
      }
    }
  }
  // The default epsilon is 1e-5: a constant row gives B + 0 * scale, a
  // two-value row (+-1) gives +-1 / sqrt(1 + 1e-5) * scale + B.
  const std::vector<Tensor> out =
      RunOk("InstanceNormalization",
            {Make(DType::kFloat64, {1, 1, 2}, {-1.0, 1.0}), Make(DType::kFloat64, {1}, {2.0}),
             Make(DType::kFloat64, {1}, {0.5})},
            {}, 7);
  EXPECT_DOUBLE_EQ(out[0].GetDouble(1), 0.5 + 2.0 / std::sqrt(1.0 + 1e-5f));
}

TEST(CpuInstanceNormGrad, MatchesFloat64Reference) {
  const double eps = 1e-4f;  // the float attribute's value
  for (const InstanceNormShape& shape : InstanceNormShapes()) {
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      // A float32 scale with 16-bit activations (what autocast hands it) and
      // a scale of X's dtype.
      for (DType scale_dt : {DType::kFloat32, dt}) {
        SCOPED_TRACE(shape.name + " X " + DTypeName(dt) + " scale " + DTypeName(scale_dt));
        const int64_t channels = shape.dims[1];
        const std::vector<double> x = InstanceNormX(shape, dt, 81);
        const std::vector<double> dy = RoundTo(dt, Random(Count(shape.dims), 82));
        const std::vector<double> scale = RoundTo(scale_dt, Random(channels, 83));
        const std::vector<std::vector<double>> ref =
            RefInstanceNormGrad(shape.dims, dy, x, scale, eps);
        const std::vector<Attribute> attrs = {Attribute::Float("epsilon", static_cast<float>(eps))};
        const std::vector<Tensor> all = RunOk(
            "InstanceNormalizationGrad",
            {Make(dt, shape.dims, dy), Make(dt, shape.dims, x), Make(scale_dt, {channels}, scale)},
            attrs, 1, 3, kCastorDomain);
        ASSERT_EQ(all.size(), 3u);
        EXPECT_EQ(all[0].dtype(), dt);
        EXPECT_EQ(all[1].dtype(), scale_dt);
        // dX is a difference of terms of the size of dY: absolute slack of
        // the dtype's rounding of values ~ scale * inv_std * |dY|.
        const double r16 = dt == DType::kFloat32 ? 1e-6 : dt == DType::kFloat16 ? 1e-3 : 8e-3;
        const double spread = shape.offset == 0.0 ? 1.0 : 0.1;  // inv_std up to ~4 or ~40
        ExpectNear(ref[0], all[0], r16, r16 * 4 / spread, "dX");
        const double rp = scale_dt == DType::kFloat32 ? 1e-6 : scale_dt == DType::kFloat16 ? 1e-3 : 8e-3;
        ExpectNear(ref[1], all[1], rp, rp, "dScale");
        ExpectNear(ref[2], all[2], rp, rp, "dBias");
        // dX alone.
        const std::vector<Tensor> dx_only = RunOk(
            "InstanceNormalizationGrad",
            {Make(dt, shape.dims, dy), Make(dt, shape.dims, x), Make(scale_dt, {channels}, scale)},
            attrs, 1, 1, kCastorDomain);
        EXPECT_EQ(testing::Values(dx_only[0]), testing::Values(all[0]));
      }
    }
  }
}

struct TorchNormCase {
  std::string name, kind;
  int64_t groups = 0;
  double epsilon = 0;
  std::vector<int64_t> dims;
  std::vector<double> x, weight, bias, y, r, dx, d_weight, d_bias;
};

std::vector<double> ReadLine(std::istream& in) {
  std::string line;
  std::getline(in, line);
  std::istringstream words(line);
  std::vector<double> values;
  double v;
  while (words >> v) values.push_back(v);
  return values;
}

std::vector<TorchNormCase> LoadTorchNormCases() {
  std::ifstream in(std::string(CASTOR_SOURCE_DIR) +
                   "/tests/data/instance_norm_torch_reference.txt");
  std::vector<TorchNormCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("case ", 0) != 0) continue;
    TorchNormCase c;
    std::istringstream words(line.substr(5));
    words >> c.name >> c.kind >> c.groups >> c.epsilon;
    std::getline(in, line);
    std::istringstream dims(line.substr(3));
    int64_t d;
    while (dims >> d) c.dims.push_back(d);
    for (std::vector<double>* v :
         {&c.x, &c.weight, &c.bias, &c.y, &c.r, &c.dx, &c.d_weight, &c.d_bias}) {
      *v = ReadLine(in);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

// float32 values of `values` (exact: the generator wrote float32 values).
Tensor F32Of(const std::vector<int64_t>& dims, const std::vector<double>& values) {
  return Make(DType::kFloat32, dims, values);
}

TEST(CpuInstanceNorm, MatchesPyTorchInstanceNormAndGroupNormForwardAndBackward) {
  const std::vector<TorchNormCase> cases = LoadTorchNormCases();
  ASSERT_EQ(cases.size(), 5u) << "tests/data/instance_norm_torch_reference.txt";
  for (const TorchNormCase& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t channels = c.dims[1];
    const std::vector<Attribute> attrs = {
        Attribute::Float("epsilon", static_cast<float>(c.epsilon))};
    if (c.kind == "instance") {
      const std::vector<Tensor> y = RunOk("InstanceNormalization",
                                          {F32Of(c.dims, c.x), F32Of({channels}, c.weight),
                                           F32Of({channels}, c.bias)},
                                          attrs, 17);
      ExpectNear(c.y, y[0], 1e-6, 1e-6, "Y");
      const std::vector<Tensor> grads = RunOk(
          "InstanceNormalizationGrad",
          {F32Of(c.dims, c.r), F32Of(c.dims, c.x), F32Of({channels}, c.weight)}, attrs, 1, 3,
          kCastorDomain);
      ExpectNear(c.dx, grads[0], 1e-5, 1e-5, "dX");
      ExpectNear(c.d_weight, grads[1], 1e-6, 1e-5, "dWeight");
      ExpectNear(c.d_bias, grads[2], 1e-6, 1e-5, "dBias");
      continue;
    }
    // GroupNorm as torch.onnx.export writes it: X reshaped to [N, G, -1],
    // InstanceNormalization with scale ones[G] and B zeros[G], reshaped
    // back, then * gamma[c] + beta[c] (here in float64: the Mul and Add).
    const int64_t batch = c.dims[0], groups = c.groups;
    const int64_t per_channel = Count(c.dims) / (batch * channels);
    const std::vector<int64_t> grouped = {batch, groups, Count(c.dims) / (batch * groups)};
    const std::vector<double> ones(groups, 1.0), zeros(groups, 0.0);
    const std::vector<Tensor> normalized = RunOk(
        "InstanceNormalization",
        {F32Of(grouped, c.x), F32Of({groups}, ones), F32Of({groups}, zeros)}, attrs, 17);
    const std::vector<double> x_hat = testing::Values(normalized[0]);
    std::vector<double> y(x_hat.size()), dy_hat(x_hat.size()), d_gamma(channels, 0.0),
        d_beta(channels, 0.0);
    for (size_t i = 0; i < y.size(); ++i) {
      const int64_t ch = (static_cast<int64_t>(i) / per_channel) % channels;
      y[i] = x_hat[i] * c.weight[ch] + c.bias[ch];
      dy_hat[i] = c.r[i] * c.weight[ch];  // Mul's gradient, float32 as castor's Mul gives it
      d_gamma[ch] += c.r[i] * x_hat[i];
      d_beta[ch] += c.r[i];
    }
    std::vector<double> expected_y = c.y;
    for (size_t i = 0; i < y.size(); ++i) {
      EXPECT_NEAR(y[i], expected_y[i], 1e-5 * (1 + std::fabs(expected_y[i]))) << "Y " << i;
    }
    const std::vector<Tensor> grads = RunOk(
        "InstanceNormalizationGrad",
        {F32Of(grouped, dy_hat), F32Of(grouped, c.x), F32Of({groups}, ones)}, attrs, 1, 3,
        kCastorDomain);
    ExpectNear(c.dx, grads[0], 1e-5, 1e-5, "dX");
    for (int64_t ch = 0; ch < channels; ++ch) {
      EXPECT_NEAR(d_gamma[ch], c.d_weight[ch], 1e-5 * (1 + std::fabs(c.d_weight[ch]))) << ch;
      EXPECT_NEAR(d_beta[ch], c.d_bias[ch], 1e-5 * (1 + std::fabs(c.d_bias[ch]))) << ch;
    }
  }
}

TEST(CpuInstanceNorm, RefusesBadInputsByName) {
  auto error = [](const std::string& op, std::vector<Tensor> inputs, int64_t opset,
                  const std::string& domain) {
    absl::StatusOr<std::vector<Tensor>> result = testing::RunNodeOf(
        op, std::move(inputs), {}, opset, op == "InstanceNormalization" ? 1 : 3, domain);
    EXPECT_FALSE(result.ok()) << op;
    return result.ok() ? std::string() : std::string(result.status().message());
  };
  const Tensor c3 = Make(DType::kFloat32, {3}, {1, 2, 3});
  // X of rank 2.
  EXPECT_NE(error("InstanceNormalization", {Make(DType::kFloat32, {2, 3}, Random(6, 1)), c3, c3},
                  17, "")
                .find("rank >= 3"),
            std::string::npos);
  // A scale of 2 entries for 3 channels.
  const std::string wrong_scale =
      error("InstanceNormalization",
            {Make(DType::kFloat32, {1, 3, 4}, Random(12, 2)),
             Make(DType::kFloat32, {2}, {1, 1}), c3},
            17, "");
  EXPECT_NE(wrong_scale.find("InstanceNormalization"), std::string::npos) << wrong_scale;
  EXPECT_NE(wrong_scale.find("scale"), std::string::npos) << wrong_scale;
  // bfloat16 before opset 22.
  const Tensor b3 = Make(DType::kBFloat16, {3}, {1, 2, 3});
  EXPECT_NE(error("InstanceNormalization", {Make(DType::kBFloat16, {1, 3, 4}, Random(12, 3)), b3, b3},
                  17, "")
                .find("bfloat16"),
            std::string::npos);
  // The gradient op: a scale that is not [C], and dY of other dims.
  const Tensor x = Make(DType::kFloat32, {2, 3, 4}, Random(24, 4));
  EXPECT_NE(error("InstanceNormalizationGrad", {x, x, Make(DType::kFloat32, {4}, Random(4, 5))},
                  1, kCastorDomain)
                .find("scale"),
            std::string::npos);
  EXPECT_NE(error("InstanceNormalizationGrad",
                  {Make(DType::kFloat32, {2, 3, 5}, Random(30, 6)), x, c3}, 1, kCastorDomain)
                .find("dY"),
            std::string::npos);
}

// ---- Conformance cases -------------------------------------------------------

TEST(CpuPoolNormConformance, AllCasesPass) {
  const ConformanceSummary summary =
      RunConformanceCasesOf(Cpu(), {"MaxPool", "AveragePool", "GlobalAveragePool",
                                    "GlobalMaxPool", "BatchNormalization", "LayerNormalization",
                                    "InstanceNormalization"});
  if (summary.ran() == 0) GTEST_SKIP() << "no conformance data under " << CASTOR_SHARED_DIR;
  for (const std::string& failure : summary.failures) ADD_FAILURE() << failure;
  std::printf(
      "conformance (pools, BatchNormalization, LayerNormalization, InstanceNormalization): %d "
      "of %d pass\n",
              summary.passed, summary.ran());
  EXPECT_GE(summary.ran(), 40);
}

}  // namespace
}  // namespace castor
