// Einsum's plan (see einsum_plan.h).
#include "backend/common/einsum_plan.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "graph/ops/einsum_equation.h"
#include "graph/status.h"

namespace castor::common {
namespace {

// One operand as the planner sees it: a buffer and its labels (distinct,
// sizes above 1) with the element stride of each in that buffer.
struct Operand {
  int buffer = 0;
  std::vector<int> labels;
  std::vector<int64_t> strides;
  bool dense = true;  // the buffer is exactly these labels, row-major, in this order
};

bool Contains(const std::vector<int>& labels, int label) {
  return std::find(labels.begin(), labels.end(), label) != labels.end();
}

std::vector<int> Concat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class Planner {
 public:
  Planner(EinsumPlan& plan, std::vector<int64_t> sizes)
      : plan_(plan), sizes_(std::move(sizes)) {}

  int64_t Size(int label) const { return sizes_[label]; }

  int64_t Product(const std::vector<int>& labels) const {
    int64_t product = 1;
    for (int label : labels) product *= sizes_[label];
    return product;
  }

  int64_t StrideOf(const Operand& op, int label) const {
    for (size_t i = 0; i < op.labels.size(); ++i) {
      if (op.labels[i] == label) return op.strides[i];
    }
    return 0;  // not in the operand: broadcast
  }

  // A strided sum of `op` into `target` (a new scratch buffer when -1) with
  // the axes `order` and the `summed` labels summed over.
  Operand Gather(const Operand& op, const std::vector<int>& order, const std::vector<int>& summed,
                 int target = -1) {
    EinsumStep step;
    step.gather.source = op.buffer;
    for (int label : order) {
      step.gather.dims.push_back(sizes_[label]);
      step.gather.strides.push_back(StrideOf(op, label));
    }
    for (int label : summed) {
      step.gather.sum_dims.push_back(sizes_[label]);
      step.gather.sum_strides.push_back(StrideOf(op, label));
    }
    if (target < 0) target = NewScratch(Product(order));
    step.gather.target = target;
    plan_.steps.push_back(std::move(step));
    return DenseOperand(target, order);
  }

  Operand DenseOperand(int buffer, const std::vector<int>& labels) const {
    Operand op;
    op.buffer = buffer;
    op.labels = labels;
    op.strides.assign(labels.size(), 1);
    for (size_t i = labels.size(); i-- > 1;) op.strides[i - 1] = op.strides[i] * sizes_[labels[i]];
    return op;
  }

  int NewScratch(int64_t elements) {
    plan_.scratch_elements.push_back(elements);
    return plan_.num_inputs + static_cast<int>(plan_.scratch_elements.size());
  }

  void Gemm(const EinsumGemm& gemm) {
    EinsumStep step;
    step.is_gemm = true;
    step.gemm = gemm;
    plan_.steps.push_back(step);
  }

 private:
  EinsumPlan& plan_;
  std::vector<int64_t> sizes_;
};

std::string LabelName(int label) {
  return label < kEinsumLetters ? absl::StrCat("'", EinsumLabelText(label), "'")
                                : absl::StrCat("\"...\" dim ", label - kEinsumLetters);
}

}  // namespace

absl::StatusOr<EinsumPlan> PlanEinsum(const KernelContext& ctx) {
  const int n = ctx.num_inputs();
  absl::StatusOr<EinsumEquation> equation =
      ParseEinsumEquation(ctx.GetString("equation", ""), n);
  if (!equation.ok()) return ctx.Error(std::string(equation.status().message()));
  std::vector<int64_t> ranks;
  for (int i = 0; i < n; ++i) {
    if (!ctx.has_input(i)) return ctx.Error(absl::StrCat("input ", i, " is missing"));
    if (ctx.input(i).dtype != ctx.input(0).dtype) {
      return ctx.Error(absl::StrCat("input ", i, " is ", DTypeName(ctx.input(i).dtype),
                                    " but input 0 is ", DTypeName(ctx.input(0).dtype)));
    }
    ranks.push_back(static_cast<int64_t>(ctx.input(i).dims.size()));
  }
  absl::StatusOr<EinsumAxes> axes = ResolveEinsumAxes(*equation, ranks);
  if (!axes.ok()) return ctx.Error(std::string(axes.status().message()));

  // Each label's size: the one size other than 1 its dims have.
  const int labels = kEinsumLetters + axes->ellipsis_rank;
  std::vector<int64_t> sizes(labels, 1);
  std::vector<std::string> size_from(labels);
  for (int i = 0; i < n; ++i) {
    const std::vector<int64_t>& dims = ctx.input(i).dims;
    const std::vector<int>& term = axes->inputs[i];
    for (size_t axis = 0; axis < term.size(); ++axis) {
      const int label = term[axis];
      for (size_t earlier = 0; earlier < axis; ++earlier) {
        if (term[earlier] == label && dims[earlier] != dims[axis]) {
          return ctx.Error(absl::StrCat("input ", i, " repeats subscript ", LabelName(label),
                                        " (a diagonal) on axes ", earlier, " and ", axis,
                                        " of sizes ", dims[earlier], " and ", dims[axis],
                                        "; a diagonal needs equal sizes"));
        }
      }
      if (dims[axis] == 1) continue;
      const std::string where = absl::StrCat("input ", i, " axis ", axis);
      if (sizes[label] != 1 && sizes[label] != dims[axis]) {
        return ctx.Error(absl::StrCat("subscript ", LabelName(label), " labels sizes ",
                                      sizes[label], " (", size_from[label], ") and ", dims[axis],
                                      " (", where, "), which neither equal nor broadcast"));
      }
      sizes[label] = dims[axis];
      size_from[label] = where;
    }
  }

  EinsumPlan plan;
  plan.num_inputs = n;
  for (int label : axes->output) plan.out_dims.push_back(sizes[label]);
  for (int label = 0; label < labels; ++label) {
    if (sizes[label] != 0) continue;
    // Something is empty: the output, or a sum (zeros).
    int64_t out_elements = 1;
    for (int64_t d : plan.out_dims) out_elements *= d;
    plan.zero_output = out_elements > 0;
    return plan;
  }
  Planner planner(plan, sizes);

  // The labels (size above 1) of each input, with their strides (a repeated
  // label's strides added: its diagonal).
  std::vector<Operand> operands(n);
  for (int i = 0; i < n; ++i) {
    Operand& op = operands[i];
    op.buffer = i;
    const std::vector<int64_t>& dims = ctx.input(i).dims;
    int64_t stride = 1;
    std::vector<int64_t> axis_strides(dims.size());
    for (size_t axis = dims.size(); axis-- > 0;) {
      axis_strides[axis] = stride;
      stride *= dims[axis];
    }
    for (size_t axis = 0; axis < dims.size(); ++axis) {
      const int label = axes->inputs[i][axis];
      if (dims[axis] == 1) continue;
      auto found = std::find(op.labels.begin(), op.labels.end(), label);
      if (found != op.labels.end()) {
        op.strides[found - op.labels.begin()] += axis_strides[axis];
        op.dense = false;
        continue;
      }
      op.labels.push_back(label);
      op.strides.push_back(axis_strides[axis]);
    }
  }
  std::vector<int> output_labels;  // the output's labels of size above 1
  for (int label : axes->output) {
    if (sizes[label] > 1) output_labels.push_back(label);
  }
  auto needed_after = [&](int label, int first_later_input, int except) {
    if (Contains(output_labels, label)) return true;
    for (int j = first_later_input; j < n; ++j) {
      if (j != except && Contains(operands[j].labels, label)) return true;
    }
    return false;
  };

  // One input: a single strided sum into the output.
  if (n == 1) {
    std::vector<int> summed;
    for (int label : operands[0].labels) {
      if (!Contains(output_labels, label)) summed.push_back(label);
    }
    planner.Gather(operands[0], axes->output, summed, plan.output_buffer());
    return plan;
  }

  // Sum away first the labels only one input has (and the output lacks),
  // and take the diagonals.
  for (int i = 0; i < n; ++i) {
    Operand& op = operands[i];
    std::vector<int> kept, summed;
    for (int label : op.labels) {
      (needed_after(label, 0, i) ? kept : summed).push_back(label);
    }
    if (op.dense && summed.empty()) continue;
    op = planner.Gather(op, kept, summed);
  }

  Operand current = operands[0];
  for (int j = 1; j < n; ++j) {
    const Operand& right = operands[j];
    std::vector<int> batch, left, only_right, contracted;
    for (int label : current.labels) {
      if (!Contains(right.labels, label)) {
        left.push_back(label);
      } else if (needed_after(label, j + 1, -1)) {
        batch.push_back(label);
      } else {
        contracted.push_back(label);
      }
    }
    for (int label : right.labels) {
      if (!Contains(current.labels, label)) only_right.push_back(label);
    }
    EinsumGemm gemm;
    gemm.batch = planner.Product(batch);
    gemm.m = planner.Product(left);
    gemm.k = planner.Product(contracted);
    gemm.n = planner.Product(only_right);
    // A as [batch, m, k] or [batch, k, m]; B as [batch, k, n] or [batch, n, k].
    Operand a = current;
    if (a.dense && a.labels == Concat(Concat(batch, left), contracted)) {
      gemm.trans_a = false;
    } else if (a.dense && a.labels == Concat(Concat(batch, contracted), left)) {
      gemm.trans_a = true;
    } else {
      a = planner.Gather(a, Concat(Concat(batch, left), contracted), {});
    }
    Operand b = right;
    if (b.dense && b.labels == Concat(Concat(batch, contracted), only_right)) {
      gemm.trans_b = false;
    } else if (b.dense && b.labels == Concat(Concat(batch, only_right), contracted)) {
      gemm.trans_b = true;
    } else {
      b = planner.Gather(b, Concat(Concat(batch, contracted), only_right), {});
    }
    const std::vector<int> result = Concat(Concat(batch, left), only_right);
    gemm.a = a.buffer;
    gemm.b = b.buffer;
    gemm.c = j == n - 1 && result == output_labels ? plan.output_buffer()
                                                   : planner.NewScratch(planner.Product(result));
    planner.Gemm(gemm);
    current = planner.DenseOperand(gemm.c, result);
  }
  if (current.buffer != plan.output_buffer()) {
    planner.Gather(current, axes->output, {}, plan.output_buffer());
  }
  return plan;
}

absl::StatusOr<std::vector<void*>> EinsumBuffers(KernelContext& ctx, const EinsumPlan& plan,
                                                 DType dtype, void* output) {
  std::vector<void*> buffers;
  for (int i = 0; i < ctx.num_inputs(); ++i) buffers.push_back(ctx.input(i).data);
  buffers.push_back(output);
  for (int64_t elements : plan.scratch_elements) {
    CASTOR_ASSIGN_OR_RETURN(void* scratch,
                            ctx.Scratch(static_cast<size_t>(elements) * DTypeSize(dtype)));
    buffers.push_back(scratch);
  }
  return buffers;
}

}  // namespace castor::common
