// CUDA kernels of backend/cuda/resize.cu against the CPU backend: Resize
// (nearest in every element size, linear in the float types; each
// coordinate mode and nearest mode; scales and sizes; up and down; opset
// 10's form) and com.castor ResizeGrad (the adjoint, float32 atomics).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph/gradient_builder.h"
#include "tests/cuda_test_util.h"

namespace castor {
namespace {

using testing::CudaFloatTypes;
using testing::ExpectCudaMatchesCpu;
using testing::I64;
using testing::Make;
using testing::RandomTensor;
using testing::SingleNode;

Tensor Scales(const std::vector<float>& values) {
  return Tensor::FromVector(DType::kFloat32, {static_cast<int64_t>(values.size())}, values);
}

std::vector<Attribute> Modes(const std::string& mode, const std::string& transform,
                             const std::string& nearest) {
  return {Attribute::String("mode", mode),
          Attribute::String("coordinate_transformation_mode", transform),
          Attribute::String("nearest_mode", nearest)};
}

TEST(CudaResize, NearestAndLinearEveryModeScalesAndSizes) {
  CASTOR_REQUIRE_CUDA();
  unsigned seed = 1;
  const std::vector<std::vector<Tensor>> resizes = {
      {Tensor(), Scales({1, 1, 2, 2})},
      {Tensor(), Scales({1, 1, 0.5f, 1.5f})},
      {Tensor(), Tensor(), I64({4}, {2, 3, 7, 5})},
      {Tensor(), Tensor(), I64({4}, {2, 3, 3, 2})},
  };
  for (const std::vector<Tensor>& resize : resizes) {
    for (const char* transform :
         {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"}) {
      for (const char* nearest : {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}) {
        for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kUInt8, DType::kFloat16}) {
          std::vector<double> values(2 * 3 * 6 * 4);
          for (size_t i = 0; i < values.size(); ++i) {
            values[i] = static_cast<double>((i * 37 + seed) % 251);  // exact in every dtype
          }
          ++seed;
          std::vector<Tensor> inputs = {Make(dtype, {2, 3, 6, 4}, values)};
          inputs.insert(inputs.end(), resize.begin(), resize.end());
          SingleNode node("Resize", inputs, Modes("nearest", transform, nearest), 13);
          ExpectCudaMatchesCpu(node, std::string("nearest ") + transform + " " + nearest + " " +
                                         DTypeName(dtype));
        }
      }
      for (DType dtype : CudaFloatTypes()) {
        std::vector<Tensor> inputs = {RandomTensor(dtype, {2, 3, 6, 4}, seed++)};
        inputs.insert(inputs.end(), resize.begin(), resize.end());
        SingleNode node("Resize", inputs, Modes("linear", transform, "floor"), 13);
        ExpectCudaMatchesCpu(node, std::string("linear ") + transform + " " + DTypeName(dtype));
      }
    }
  }
  // Opset 10: (X, scales).
  SingleNode old("Resize", {RandomTensor(DType::kFloat32, {1, 2, 5, 4}, seed), Scales({1, 1, 2, 0.5f})},
                 {}, 10);
  ExpectCudaMatchesCpu(old, "opset 10");
}

TEST(CudaResize, ResizeGradScatterAddsWithTheSameWeights) {
  CASTOR_REQUIRE_CUDA();
  unsigned seed = 1;
  struct Case {
    std::vector<int64_t> x_dims, y_dims;
    Tensor scales, sizes;
    std::vector<Attribute> attributes;
  };
  const std::vector<Case> cases = {
      {{2, 3, 8, 8}, {2, 3, 16, 16}, Scales({1, 1, 2, 2}), Tensor(),
       Modes("linear", "half_pixel", "floor")},
      {{2, 3, 8, 8}, {2, 3, 5, 11}, Tensor(), I64({4}, {2, 3, 5, 11}),
       Modes("linear", "align_corners", "floor")},
      {{2, 3, 8, 8}, {2, 3, 16, 16}, Scales({1, 1, 2, 2}), Tensor(),
       Modes("nearest", "asymmetric", "floor")},
      {{1, 2, 9, 7}, {1, 2, 4, 3}, Tensor(), I64({4}, {1, 2, 4, 3}),
       Modes("linear", "pytorch_half_pixel", "floor")},
  };
  for (const Case& c : cases) {
    for (DType dtype : CudaFloatTypes()) {
      SingleNode node("ResizeGrad",
                      {RandomTensor(dtype, c.y_dims, seed), RandomTensor(dtype, c.x_dims, seed + 1),
                       c.scales, c.sizes},
                      c.attributes, 1, 1, kCastorDomain);
      ExpectCudaMatchesCpu(node, std::string("ResizeGrad ") + DTypeName(dtype),
                           dtype == DType::kFloat32
                               ? std::optional<testing::Tolerance>(testing::Tolerance{1e-4, 1e-5})
                               : std::nullopt);
      seed += 2;
    }
  }
}

}  // namespace
}  // namespace castor
