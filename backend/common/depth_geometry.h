// DepthToSpace and SpaceToDepth as one strided copy each (a CopyPlan, see
// op_geometry.h), which the CPU and CUDA kernels share: the input [N, C,
// H, W] seen as a 6-D tensor, transposed, and read as the output.
//   DepthToSpace DCR: [N, b, b, C/b^2, H, W] -> [N, C/b^2, H, b, W, b]
//   DepthToSpace CRD: [N, C/b^2, b, b, H, W] -> [N, C/b^2, H, b, W, b]
//   SpaceToDepth:     [N, C, H/b, b, W/b, b] -> [N, b, b, C, H/b, W/b]
// SpaceToDepth inverts DepthToSpace DCR (each is the other's gradient).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/common/op_geometry.h"
#include "backend/kernel.h"

namespace castor::common {

// Errors for an input that is not 4-D, a blocksize below 1, an unknown
// mode, and C not divisible by blocksize^2 (DepthToSpace) or H, W not by
// blocksize (SpaceToDepth).
absl::StatusOr<CopyPlan> PlanDepthToSpace(const KernelContext& ctx,
                                          const std::vector<int64_t>& in_dims);
absl::StatusOr<CopyPlan> PlanSpaceToDepth(const KernelContext& ctx,
                                          const std::vector<int64_t>& in_dims);

}  // namespace castor::common
