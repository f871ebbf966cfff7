// DepthToSpace / SpaceToDepth copy plans (see depth_geometry.h).
#include "backend/common/depth_geometry.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "backend/common/dims.h"
#include "graph/status.h"

namespace castor::common {
namespace {

// The copy reading `view` (the input's 6-D view) through `perm` into an
// output of `out_dims`.
CopyPlan Permuted(const std::vector<int64_t>& view, const std::vector<int64_t>& perm,
                  std::vector<int64_t> out_dims) {
  const std::vector<int64_t> strides = ContiguousStrides(view);
  CopyPlan plan;
  plan.out_dims = std::move(out_dims);
  for (int64_t p : perm) {
    plan.copy_dims.push_back(view[p]);
    plan.src_strides.push_back(strides[p]);
  }
  return plan;
}

absl::StatusOr<int64_t> Blocksize(const KernelContext& ctx, const std::vector<int64_t>& in_dims) {
  if (in_dims.size() != 4) {
    return ctx.Error(absl::StrCat("input is ", DimsToString(in_dims), "; expected [N, C, H, W]"));
  }
  const int64_t b = ctx.GetInt("blocksize", 0);
  if (b < 1) return ctx.Error(absl::StrCat("attribute 'blocksize' is ", b, "; expected >= 1"));
  return b;
}

}  // namespace

absl::StatusOr<CopyPlan> PlanDepthToSpace(const KernelContext& ctx,
                                          const std::vector<int64_t>& in_dims) {
  CASTOR_ASSIGN_OR_RETURN(const int64_t b, Blocksize(ctx, in_dims));
  const int64_t n = in_dims[0], c = in_dims[1], h = in_dims[2], w = in_dims[3];
  if (c % (b * b) != 0) {
    return ctx.Error(absl::StrCat("channels ", c, " of input ", DimsToString(in_dims),
                                  " are not divisible by blocksize^2 = ", b * b));
  }
  const std::string mode = ctx.GetString("mode", "DCR");
  const int64_t depth = c / (b * b);
  const std::vector<int64_t> out_dims = {n, depth, h * b, w * b};
  if (mode == "DCR") return Permuted({n, b, b, depth, h, w}, {0, 3, 4, 1, 5, 2}, out_dims);
  if (mode == "CRD") return Permuted({n, depth, b, b, h, w}, {0, 1, 4, 2, 5, 3}, out_dims);
  return ctx.Error(absl::StrCat("attribute 'mode' is \"", mode, "\"; expected DCR or CRD"));
}

absl::StatusOr<CopyPlan> PlanSpaceToDepth(const KernelContext& ctx,
                                          const std::vector<int64_t>& in_dims) {
  CASTOR_ASSIGN_OR_RETURN(const int64_t b, Blocksize(ctx, in_dims));
  const int64_t n = in_dims[0], c = in_dims[1], h = in_dims[2], w = in_dims[3];
  if (h % b != 0 || w % b != 0) {
    return ctx.Error(absl::StrCat("spatial dims of input ", DimsToString(in_dims),
                                  " are not divisible by blocksize ", b));
  }
  return Permuted({n, c, h / b, b, w / b, b}, {0, 3, 5, 1, 2, 4}, {n, c * b * b, h / b, w / b});
}

}  // namespace castor::common
