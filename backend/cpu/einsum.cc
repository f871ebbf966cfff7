// CPU kernel of Einsum (graph/ops/einsum.cc): runs the steps of
// backend/common/einsum_plan.h. Strided sums without a sum are
// StridedCopy's transposes; with one, a loop accumulating in float32
// (float64 for float64, wrapping unsigned arithmetic for integers) and
// rounding once on store. GEMMs go through gemm.h as MatMul's do (OpenBLAS;
// 16-bit operands widened, float32 accumulation, one rounding), one per
// batch, batches in parallel when each GEMM is small; integers use a plain
// wrapping loop. float32, float16, float64, int32 and int64 (ONNX lists no
// bfloat16 for Einsum).
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/einsum_plan.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/strided_copy.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

const std::vector<DType> kEinsumDTypes = {DType::kFloat32, DType::kFloat16, DType::kFloat64,
                                          DType::kInt32, DType::kInt64};

// The element offset of flat index `flat` of `dims` with `strides`.
int64_t OffsetOf(int64_t flat, const std::vector<int64_t>& dims,
                 const std::vector<int64_t>& strides) {
  int64_t offset = 0;
  for (size_t d = dims.size(); d-- > 0;) {
    offset += (flat % dims[d]) * strides[d];
    flat /= dims[d];
  }
  return offset;
}

// Steps `index` (a row-major counter over `dims`) by one, moving `offset`
// along `strides`.
void Advance(std::vector<int64_t>& index, const std::vector<int64_t>& dims,
             const std::vector<int64_t>& strides, int64_t& offset) {
  for (size_t d = dims.size(); d-- > 0;) {
    offset += strides[d];
    if (++index[d] < dims[d]) return;
    offset -= index[d] * strides[d];
    index[d] = 0;
  }
}

// out[o] = sum over s of in[o . strides + s . sum_strides], T's accumulator
// Acc (Load/Store convert).
template <typename T, typename Acc, typename Load, typename Store>
void StridedSum(const common::EinsumGather& g, const T* in, T* out, Load load, Store store) {
  int64_t count = 1, sum_count = 1;
  for (int64_t d : g.dims) count *= d;
  for (int64_t d : g.sum_dims) sum_count *= d;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, sum_count));
  ParallelFor(0, count, grain, [&](int64_t lo, int64_t hi) {
    std::vector<int64_t> index(g.dims.size());
    int64_t rest = lo;
    for (size_t d = g.dims.size(); d-- > 0;) {
      index[d] = rest % g.dims[d];
      rest /= g.dims[d];
    }
    int64_t offset = OffsetOf(lo, g.dims, g.strides);
    std::vector<int64_t> sum_index(g.sum_dims.size());
    for (int64_t o = lo; o < hi; ++o) {
      Acc acc = Acc(0);
      int64_t sum_offset = 0;
      for (int64_t s = 0; s < sum_count; ++s) {
        acc += load(in[offset + sum_offset]);
        Advance(sum_index, g.sum_dims, g.sum_strides, sum_offset);
      }
      store(&out[o], acc);
      Advance(index, g.dims, g.strides, offset);
    }
  });
}

void RunGather(const common::EinsumGather& g, DType dtype, const void* in, void* out) {
  if (g.sum_dims.empty()) {
    std::vector<int64_t> dense(g.dims.size(), 1);
    for (size_t d = g.dims.size(); d-- > 1;) dense[d - 1] = dense[d] * g.dims[d];
    StridedCopy(g.dims, DTypeSize(dtype), in, g.strides, out, dense);
    return;
  }
  const bool is_float = DispatchFloat(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, double>) {
      StridedSum<T, double>(
          g, static_cast<const T*>(in), static_cast<T*>(out), [](double v) { return v; },
          [](double* p, double v) { *p = v; });
    } else {
      StridedSum<T, float>(
          g, static_cast<const T*>(in), static_cast<T*>(out), [](T v) { return LoadF(v); },
          [](T* p, float v) { StoreF(p, v); });
    }
  });
  if (is_float) return;
  auto integers = [&](auto zero) {
    using T = decltype(zero);
    using U = std::make_unsigned_t<T>;
    StridedSum<T, U>(
        g, static_cast<const T*>(in), static_cast<T*>(out), [](T v) { return static_cast<U>(v); },
        [](T* p, U v) { *p = static_cast<T>(v); });
  };
  if (dtype == DType::kInt32) integers(int32_t{});
  if (dtype == DType::kInt64) integers(int64_t{});
}

// C[m, n] = op(A) op(B) for integers, wrapping on overflow.
template <typename T>
void IntGemm(const common::EinsumGemm& s, const T* a, const T* b, T* c) {
  using U = std::make_unsigned_t<T>;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      U sum = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const T av = s.trans_a ? a[p * s.m + i] : a[i * s.k + p];
        const T bv = s.trans_b ? b[j * s.k + p] : b[p * s.n + j];
        sum += static_cast<U>(av) * static_cast<U>(bv);
      }
      c[i * s.n + j] = static_cast<T>(sum);
    }
  }
}

void RunGemm(const common::EinsumGemm& s, DType dtype, const void* a, const void* b, void* c) {
  const size_t element = DTypeSize(dtype);
  const int64_t lda = s.trans_a ? s.m : s.k;
  const int64_t ldb = s.trans_b ? s.k : s.n;
  auto one = [&](int64_t i) {
    const char* ap = static_cast<const char*>(a) + i * s.m * s.k * element;
    const char* bp = static_cast<const char*>(b) + i * s.k * s.n * element;
    char* cp = static_cast<char*>(c) + i * s.m * s.n * element;
    switch (dtype) {
      case DType::kFloat64:
        Dgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0, reinterpret_cast<const double*>(ap), lda,
              reinterpret_cast<const double*>(bp), ldb, 0.0, reinterpret_cast<double*>(cp), s.n);
        break;
      case DType::kInt32:
        IntGemm(s, reinterpret_cast<const int32_t*>(ap), reinterpret_cast<const int32_t*>(bp),
                reinterpret_cast<int32_t*>(cp));
        break;
      case DType::kInt64:
        IntGemm(s, reinterpret_cast<const int64_t*>(ap), reinterpret_cast<const int64_t*>(bp),
                reinterpret_cast<int64_t*>(cp));
        break;
      default:
        GemmRoundedToDType(dtype, s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, ap, lda, bp, ldb, cp,
                           s.n);
        break;
    }
  };
  const bool is_int = dtype == DType::kInt32 || dtype == DType::kInt64;
  if (s.batch > 1 && (is_int || IsSmallGemm(s.m, s.n, s.k))) {
    ParallelFor(0, s.batch, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) one(i);
    });
  } else {
    for (int64_t i = 0; i < s.batch; ++i) one(i);
  }
}

absl::Status EinsumKernel(KernelContext& ctx) {
  CASTOR_ASSIGN_OR_RETURN(const common::EinsumPlan plan, common::PlanEinsum(ctx));
  const DType dtype = ctx.input(0).dtype;
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, dtype, plan.out_dims));
  if (plan.zero_output) {
    std::memset(y->data, 0, y->byte_size());  // all-zero bits are 0 in every dtype here
    return absl::OkStatus();
  }
  CASTOR_ASSIGN_OR_RETURN(const std::vector<void*> buffers,
                          common::EinsumBuffers(ctx, plan, dtype, y->data));
  for (const common::EinsumStep& step : plan.steps) {
    if (step.is_gemm) {
      RunGemm(step.gemm, dtype, buffers[step.gemm.a], buffers[step.gemm.b],
              buffers[step.gemm.c]);
    } else {
      RunGather(step.gather, dtype, buffers[step.gather.source], buffers[step.gather.target]);
    }
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterEinsumKernels(KernelTable& table) {
  table.Register({"", "Einsum", InputDTypeIn(0, kEinsumDTypes), EinsumKernel});
}

}  // namespace castor::cpu
