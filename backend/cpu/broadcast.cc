// Broadcast planning for CPU elementwise kernels (see broadcast.h).
#include "backend/cpu/broadcast.h"

#include "backend/common/dims.h"

namespace castor::cpu {

absl::StatusOr<BroadcastPlan> MakeBroadcastPlan(
    const std::vector<std::vector<int64_t>>& input_dims) {
  absl::StatusOr<std::vector<int64_t>> out = common::BroadcastDims(input_dims);
  if (!out.ok()) return out.status();
  BroadcastPlan plan;
  plan.out_dims = *out;
  plan.num_elements = 1;
  for (int64_t d : plan.out_dims) plan.num_elements *= d;
  const size_t rank = plan.out_dims.size();
  const size_t n = input_dims.size();

  // Group the non-trivial output axes by which inputs are dense along them.
  std::vector<int64_t> group_sizes;
  std::vector<std::vector<bool>> group_dense;  // [group][input]
  for (size_t axis = 0; axis < rank; ++axis) {
    if (plan.out_dims[axis] == 1) continue;
    std::vector<bool> dense(n);
    for (size_t k = 0; k < n; ++k) {
      const size_t pad = rank - input_dims[k].size();
      dense[k] = axis >= pad && input_dims[k][axis - pad] != 1;
    }
    if (!group_sizes.empty() && group_dense.back() == dense) {
      group_sizes.back() *= plan.out_dims[axis];
    } else {
      group_sizes.push_back(plan.out_dims[axis]);
      group_dense.push_back(std::move(dense));
    }
  }
  if (group_sizes.empty()) {  // a single element (or all-ones dims)
    group_sizes.push_back(1);
    group_dense.push_back(std::vector<bool>(n, true));
  }
  plan.dims = group_sizes;
  plan.strides.assign(n, std::vector<int64_t>(group_sizes.size(), 0));
  for (size_t k = 0; k < n; ++k) {
    int64_t step = 1;
    for (size_t g = group_sizes.size(); g-- > 0;) {
      if (!group_dense[g][k]) continue;
      plan.strides[k][g] = step;
      step *= group_sizes[g];
    }
  }
  return plan;
}

}  // namespace castor::cpu
