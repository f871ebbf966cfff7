// How both backends run an Einsum node: its equation (graph/ops/
// einsum_equation.h) and its inputs' dims planned once into a few steps of
// two kinds, each a primitive every backend has:
//   - a strided sum (EinsumGather): out[o] = sum over s of
//     in[o . strides + s . sum_strides], which is a transpose, a diagonal
//     (a repeated label's strides added), a sum over labels only one input
//     has, or all three at once;
//   - a batched GEMM (EinsumGemm) on dense operands [batch, m, k] x
//     [batch, k, n] (either side optionally stored transposed).
// Axes of size 1 carry no label (they broadcast, as "..." dims and size-1
// dims do), so each GEMM sees only real labels. One input is a single
// strided sum into the output. Two or more are contracted left to right:
// per pair each label is batch (in both, needed later), left-only,
// right-only or contracted (in both, not needed later); an operand already
// laid out [batch, left, contracted] or [batch, contracted, left] (B:
// [batch, contracted, right] or [batch, right, contracted]) goes to the GEMM
// as it is, else one strided copy makes it so; the last GEMM writes the
// output directly when its [batch, left, right] order is the output's.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/kernel.h"

namespace castor::common {

// Buffers the steps name: 0..num_inputs-1 the inputs, num_inputs the output,
// num_inputs + 1 + j scratch buffer j (EinsumPlan::scratch_elements[j]).
struct EinsumGather {
  int source = 0, target = 0;
  std::vector<int64_t> dims, strides;          // target axes (dense row-major in target)
  std::vector<int64_t> sum_dims, sum_strides;  // summed axes
};

struct EinsumGemm {
  int a = 0, b = 0, c = 0;
  int64_t batch = 1, m = 1, n = 1, k = 1;
  bool trans_a = false;  // A stored [batch, k, m]
  bool trans_b = false;  // B stored [batch, n, k]
};

struct EinsumStep {
  bool is_gemm = false;
  EinsumGather gather;  // when !is_gemm
  EinsumGemm gemm;      // when is_gemm
};

struct EinsumPlan {
  std::vector<int64_t> out_dims;
  // A label of size 0 is summed over: the (non-empty) output is zeros and
  // there are no steps.
  bool zero_output = false;
  std::vector<int64_t> scratch_elements;
  std::vector<EinsumStep> steps;
  int output_buffer() const { return num_inputs; }
  int num_inputs = 0;
};

// The plan of Einsum node `ctx` for its inputs' dims. Errors (the node's)
// for a malformed equation, input ranks the equation does not fit, and
// label sizes that neither agree nor broadcast.
absl::StatusOr<EinsumPlan> PlanEinsum(const KernelContext& ctx);

// The buffers `plan`'s steps index: the node's inputs, `output`, then one
// scratch buffer (ctx.Scratch, in `dtype`) per plan.scratch_elements.
absl::StatusOr<std::vector<void*>> EinsumBuffers(KernelContext& ctx, const EinsumPlan& plan,
                                                 DType dtype, void* output);

}  // namespace castor::common
