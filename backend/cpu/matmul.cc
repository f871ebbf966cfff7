// CPU kernels: matmul family (ops of graph/ops/matmul.cc): MatMul (numpy
// matmul: 1-D operands, broadcast batch dims) and Gemm (transA/transB,
// alpha/beta, C unidirectionally broadcast to [M, N], optional C).
// Float GEMMs go through gemm.h (OpenBLAS; 16-bit operands widened to float32
// and the float32 result rounded once on store), except a batched 16-bit
// MatMul's small products that gemm.h would widen, which small_gemm.h sums
// in registers (the same float32 sums in another order, rounded once); the
// 32/64-bit integer types use a plain loop with wrap-around arithmetic.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/op_geometry.h"
#include "backend/cpu/broadcast.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/float_io.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/small_gemm.h"
#include "graph/status.h"

namespace castor::cpu {
namespace {

const std::vector<DType> kMatrixDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                          DType::kFloat64, DType::kInt32,   DType::kInt64,
                                          DType::kUInt32,  DType::kUInt64};

// Calls fn(T{}) for the integer dtypes MatMul/Gemm accept.
template <typename Fn>
bool DispatchMatrixInt(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kInt32: fn(int32_t{}); return true;
    case DType::kInt64: fn(int64_t{}); return true;
    case DType::kUInt32: fn(uint32_t{}); return true;
    case DType::kUInt64: fn(uint64_t{}); return true;
    default: return false;
  }
}

// C[m,n] (+)= A[m,k] * B[k,n] for integers, wrapping on overflow.
template <typename T>
void IntMatMul(const T* a, const T* b, T* c, int64_t m, int64_t n, int64_t k) {
  using U = std::make_unsigned_t<T>;
  std::vector<U> row(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), U(0));
    for (int64_t p = 0; p < k; ++p) {
      const U av = static_cast<U>(a[i * k + p]);
      const T* brow = b + p * n;
      for (int64_t j = 0; j < n; ++j) row[j] += av * static_cast<U>(brow[j]);
    }
    for (int64_t j = 0; j < n; ++j) c[i * n + j] = static_cast<T>(row[j]);
  }
}

// One float GEMM of MatMul: c[m,n] = a[m,k] * b[k,n] for storage type T,
// rounding the float32 product once on store for 16-bit T.
template <typename T>
void FloatMatMul(DType dtype, const T* a, const T* b, T* c, int64_t m, int64_t n, int64_t k) {
  if constexpr (std::is_same_v<T, double>) {
    Dgemm(false, false, m, n, k, 1.0, a, k, b, n, 0.0, c, n);
  } else if constexpr (std::is_same_v<T, float>) {
    Sgemm(false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  } else if (SmallGemmApplies(dtype, m, n, k)) {  // attention's per-head products
    SmallGemmRounded(dtype, m, n, k, 1.0f, a, k, b, n, c, n);
  } else {
    GemmRoundedToDType(dtype, false, false, m, n, k, 1.0f, a, k, b, n, c, n);
  }
}

absl::Status MatMulKernel(KernelContext& ctx) {
  const TensorView& a = ctx.input(0);
  const TensorView& b = ctx.input(1);
  CASTOR_ASSIGN_OR_RETURN(const common::MatMulGeometry geometry, common::PlanMatMul(ctx));
  const int64_t m = geometry.m, n = geometry.n, k = geometry.k;
  const std::vector<int64_t>& batch = geometry.batch;
  const std::vector<int64_t>& a_stride = geometry.a_stride;
  const std::vector<int64_t>& b_stride = geometry.b_stride;
  const size_t rank = batch.size();
  const std::vector<int64_t>& out_dims = geometry.out_dims;
  TensorView* y;
  {
    absl::StatusOr<TensorView*> out = ctx.Output(0, a.dtype, out_dims);
    if (!out.ok()) return out.status();
    y = *out;
  }
  int64_t batch_count = 1;
  for (int64_t d : batch) batch_count *= d;
  if (y->num_elements() == 0) return absl::OkStatus();
  if (k == 0) {
    std::memset(y->data, 0, y->byte_size());
    return absl::OkStatus();
  }
  // Offsets (in matrices) of A and B for output batch index `i`.
  auto offsets = [&](int64_t i, int64_t& a_off, int64_t& b_off) {
    a_off = b_off = 0;
    for (size_t r = rank; r-- > 0;) {
      const int64_t idx = i % batch[r];
      i /= batch[r];
      a_off += idx * a_stride[r];
      b_off += idx * b_stride[r];
    }
  };
  bool b_shared = true;  // every batch reads the same B matrix
  bool a_dense = true;   // A's batches are the output's, in order
  for (size_t r = 0; r < rank; ++r) {
    b_shared &= b_stride[r] == 0;
    a_dense &= (a_stride[r] != 0 || batch[r] == 1);
  }
  a_dense &= static_cast<int64_t>(a.num_elements()) == batch_count * m * k;

  auto run_typed = [&](auto tag) {
    using T = decltype(tag);
    const T* ap = a.as<T>();
    const T* bp = b.as<T>();
    T* cp = y->as<T>();
    if (b_shared && a_dense) {  // one GEMM with the batch folded into M
      FloatMatMul<T>(a.dtype, ap, bp, cp, batch_count * m, n, k);
      return;
    }
    auto run_batches = [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        int64_t a_off, b_off;
        offsets(i, a_off, b_off);
        FloatMatMul<T>(a.dtype, ap + a_off * m * k, bp + b_off * k * n, cp + i * m * n, m, n, k);
      }
    };
    if (IsSmallGemm(m, n, k)) {
      ParallelFor(0, batch_count, 1, run_batches);
    } else {
      run_batches(0, batch_count);
    }
  };
  const bool is_float = DispatchFloat(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    run_typed(T{});
  });
  if (is_float) return absl::OkStatus();
  const bool is_int = DispatchMatrixInt(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* ap = a.as<T>();
    const T* bp = b.as<T>();
    T* cp = y->as<T>();
    ParallelFor(0, batch_count, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        int64_t a_off, b_off;
        offsets(i, a_off, b_off);
        IntMatMul<T>(ap + a_off * m * k, bp + b_off * k * n, cp + i * m * n, m, n, k);
      }
    });
  });
  if (!is_int) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(a.dtype)));
  return absl::OkStatus();
}

absl::Status GemmKernel(KernelContext& ctx) {
  const TensorView& a = ctx.input(0);
  const TensorView& b = ctx.input(1);
  CASTOR_ASSIGN_OR_RETURN(const common::GemmGeometry g, common::PlanGemm(ctx));
  const bool trans_a = g.trans_a, trans_b = g.trans_b;
  const float alpha = g.alpha, beta = g.beta;
  const int64_t m = g.m, n = g.n, k = g.k;
  // C broadcast to [m, n]: c_rows x c_cols with 1 meaning broadcast.
  const TensorView* c = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const int64_t c_rows = g.c_rows, c_cols = g.c_cols;
  const bool use_c = g.use_c;
  absl::StatusOr<TensorView*> out = ctx.Output(0, a.dtype, {m, n});
  if (!out.ok()) return out.status();
  TensorView* y = *out;
  if (m == 0 || n == 0) return absl::OkStatus();
  auto c_index = [&](int64_t i, int64_t j) {
    return (c_rows == 1 ? 0 : i * c_cols) + (c_cols == 1 ? 0 : j);
  };
  // Fills acc[m, n] with broadcast C (when used).
  auto fill_c = [&](auto* acc) {
    using Acc = std::remove_pointer_t<decltype(acc)>;
    DispatchFloat(c->dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* cp = c->as<T>();
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          if constexpr (std::is_same_v<T, double>) {
            acc[i * n + j] = static_cast<Acc>(cp[c_index(i, j)]);
          } else {
            acc[i * n + j] = static_cast<Acc>(LoadF(cp[c_index(i, j)]));
          }
        }
      }
    });
  };
  switch (a.dtype) {
    case DType::kFloat64: {
      double* yp = y->as<double>();
      if (use_c) fill_c(yp);
      Dgemm(trans_a, trans_b, m, n, k, alpha, a.as<double>(), a.dims[1], b.as<double>(),
            b.dims[1], use_c ? beta : 0.0, yp, n);
      return absl::OkStatus();
    }
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16: {
      if (!use_c) {
        GemmRoundedToDType(a.dtype, trans_a, trans_b, m, n, k, alpha, a.data, a.dims[1], b.data,
                           b.dims[1], y->data, n);
        return absl::OkStatus();
      }
      // With C: C broadcast into the float32 accumulator, then the product.
      float* acc;
      std::vector<float> scratch;
      if (a.dtype == DType::kFloat32) {
        acc = y->as<float>();
      } else {
        scratch.resize(static_cast<size_t>(m * n));
        acc = scratch.data();
      }
      fill_c(acc);
      GemmFloat32Accumulate(a.dtype, trans_a, trans_b, m, n, k, alpha, a.data, a.dims[1], b.data,
                            b.dims[1], beta, acc, n);
      if (a.dtype != DType::kFloat32) ParallelFromFloat32(a.dtype, acc, y->data, m * n);
      return absl::OkStatus();
    }
    default:
      break;
  }
  const bool is_int = DispatchMatrixInt(a.dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* ap = a.as<T>();
    const T* bp = b.as<T>();
    const T* cp = use_c ? c->as<T>() : nullptr;
    T* yp = y->as<T>();
    const int64_t lda = a.dims[1], ldb = b.dims[1];
    ParallelFor(0, m, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          using U = std::make_unsigned_t<T>;
          U sum = 0;
          for (int64_t p = 0; p < k; ++p) {
            const T av = trans_a ? ap[p * lda + i] : ap[i * lda + p];
            const T bv = trans_b ? bp[j * ldb + p] : bp[p * ldb + j];
            sum += static_cast<U>(av) * static_cast<U>(bv);
          }
          if (alpha == 1.0f && (cp == nullptr || beta == 1.0f)) {  // exact, wrapping
            if (cp != nullptr) sum += static_cast<U>(cp[c_index(i, j)]);
            yp[i * n + j] = static_cast<T>(sum);
            continue;
          }
          double v = static_cast<double>(alpha) * static_cast<double>(static_cast<T>(sum));
          if (cp != nullptr) v += static_cast<double>(beta) * static_cast<double>(cp[c_index(i, j)]);
          yp[i * n + j] = static_cast<T>(v);
        }
      }
    });
  });
  if (!is_int) return ctx.Unimplemented(absl::StrCat("dtype ", DTypeName(a.dtype)));
  return absl::OkStatus();
}

}  // namespace

void RegisterMatMulKernels(KernelTable& table) {
  table.Register({"", "MatMul", InputDTypeIn(0, kMatrixDTypes), MatMulKernel});
  table.Register({"", "Gemm", InputDTypeIn(0, kMatrixDTypes), GemmKernel});
}

}  // namespace castor::cpu
