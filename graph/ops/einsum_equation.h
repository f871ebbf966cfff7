// The equation of ONNX Einsum ("bhqd,bhkd->bhqk", "...ij,...jk", "ii->i"),
// parsed once and shared by the op definition (graph/ops/einsum.cc: type
// and shape inference, the gradient rule) and the kernels' plan
// (backend/common/einsum_plan.h).
//
// Grammar (as numpy.einsum and the ONNX reference): terms of letters
// a-z/A-Z separated by ',', one per input, optionally "->" and the output
// term; spaces are ignored; "..." stands for the dims no letter names, at
// most once per term. Without "->" (implicit output) the output is "..."
// (when any input has one) followed by the letters that appear exactly once
// in the inputs, in ASCII order (upper case first), as numpy writes it.
// A letter repeated within one input takes that input's diagonal; letters
// missing from the output are summed over. Ellipsis dims are right-aligned
// and broadcast across inputs, and so is any dim of size 1 (torch.einsum's
// rule): a label's size is the one size other than 1 its dims have.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace castor {

// A letter's label is its index 0..51 ('A'..'Z' then 'a'..'z', ASCII
// order); kEinsumEllipsis marks where "..." stands in a term.
inline constexpr int kEinsumLetters = 52;
inline constexpr int kEinsumEllipsis = -1;

struct EinsumEquation {
  std::vector<std::vector<int>> inputs;  // per input: labels and kEinsumEllipsis
  std::vector<int> output;               // explicit, or the implicit output spelled out
  bool explicit_output = false;
};

// Parses `equation` for `num_inputs` inputs. Errors say what is wrong
// ("term 2 has ..."), without the node (callers add it).
absl::StatusOr<EinsumEquation> ParseEinsumEquation(const std::string& equation, int num_inputs);

// The letter of label `label` (0..51), or "..." for kEinsumEllipsis.
std::string EinsumLabelText(int label);
// A term written back as text ("bhqd", "...ij").
std::string EinsumTermText(const std::vector<int>& term);

// The labels of every axis, once the inputs' ranks are known: "..." spelled
// out as labels kEinsumLetters + j for ellipsis dim j of `ellipsis_rank`
// (the largest ellipsis among the inputs; an input with a shorter one has
// its last ones, right-aligned).
struct EinsumAxes {
  std::vector<std::vector<int>> inputs;  // one label per axis of each input
  std::vector<int> output;               // one label per output axis
  int ellipsis_rank = 0;
};

// Errors for an input whose rank is not its term's letter count (or, with
// "...", is less than it).
absl::StatusOr<EinsumAxes> ResolveEinsumAxes(const EinsumEquation& equation,
                                             const std::vector<int64_t>& input_ranks);

}  // namespace castor
