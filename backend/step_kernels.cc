// Argument checks shared by every backend's step kernels (step_kernels.h).
#include "backend/step_kernels.h"

#include "absl/strings/str_cat.h"

namespace castor {

absl::Status CheckStepInputs(const std::vector<TensorView>& gradients, const TensorView& loss) {
  for (const TensorView& gradient : gradients) {
    if (gradient.dtype != DType::kFloat32 && gradient.dtype != DType::kFloat16 &&
        gradient.dtype != DType::kBFloat16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unscale: a gradient is ", DTypeName(gradient.dtype),
          "; expected float32, float16 or bfloat16"));
    }
  }
  if (loss.dtype != DType::kFloat32 || loss.num_elements() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("unscale: the loss is ", DTypeName(loss.dtype),
                                                   " with ", loss.num_elements(),
                                                   " elements; expected a float32 scalar"));
  }
  return absl::OkStatus();
}

absl::Status CheckParameters(const OptimizerOptions& options,
                             const std::vector<ParameterUpdate>& parameters) {
  const int slots = OptimizerSlotCount(options);
  for (const ParameterUpdate& p : parameters) {
    if (p.weight.dtype != DType::kFloat32 || p.gradient.dtype != DType::kFloat32 ||
        p.weight.dims != p.gradient.dims) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer: parameter '", p.name, "' is ", DTypeName(p.weight.dtype), " with a ",
          DTypeName(p.gradient.dtype), " gradient", p.weight.dims == p.gradient.dims ? "" : " of other dims",
          "; expected float32 for both, same dims"));
    }
    for (int s = 0; s < slots; ++s) {
      if (p.slots[s] == nullptr && p.weight.num_elements() > 0) {
        return absl::InvalidArgumentError(absl::StrCat("optimizer: parameter '", p.name,
                                                       "' has no slot ", s, " of ", slots));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckCopy(const TensorView& destination, const TensorView& source) {
  if (destination.byte_size() != source.byte_size()) {
    return absl::InvalidArgumentError(absl::StrCat("commit: ", source.byte_size(),
                                                   " bytes into a tensor of ",
                                                   destination.byte_size()));
  }
  return absl::OkStatus();
}

}  // namespace castor
