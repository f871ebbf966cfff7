// MatMul's shape rules (NumPy matmul: 1-D operands promoted and dropped,
// batch axes right-aligned and broadcast), planned once on the host and
// shared by the CPU and CUDA MatMul kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/kernel.h"

namespace castor::cpu {

struct MatMulGeometry {
  int64_t m = 0, n = 0, k = 0;  // each product: [m, k] x [k, n]
  std::vector<int64_t> batch;     // the broadcast batch dims
  // Per batch axis, the step in matrices of A and of B (0 where the
  // operand is broadcast along it).
  std::vector<int64_t> a_stride, b_stride;
  std::vector<int64_t> out_dims;  // batch dims, then m (unless A is 1-D), n (unless B is)
};

// The geometry of MatMul node `ctx` from its inputs' dims; errors (the
// node's) for A and B of different dtypes, a rank-0 operand, inner dims
// that differ and batch dims that do not broadcast.
absl::StatusOr<MatMulGeometry> PlanMatMul(const KernelContext& ctx);

}  // namespace castor::cpu
