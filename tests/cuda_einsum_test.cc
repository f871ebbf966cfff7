// CUDA kernel of Einsum (backend/cuda/einsum.cu) against the CPU backend, in
// float32 and float16 (ONNX's Einsum has no bfloat16): attention products
// (one GEMM as the inputs lie, and with transposed operands), matmul,
// outer product, trace, diagonal, transpose, sums, ellipsis broadcasting,
// implicit output, three operands, bilinear, size-1 broadcasting, an empty
// sum and a large case.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/common/dims.h"
#include "gtest/gtest.h"
#include "tests/cuda_test_util.h"

namespace castor {
namespace {

using testing::ExpectCudaMatchesCpu;
using testing::RandomTensor;
using testing::SingleNode;
using testing::Tolerance;

struct EinsumCase {
  const char* equation;
  std::vector<std::vector<int64_t>> dims;
};

// Runs each case in float32 and float16, CUDA against CPU. Sums of up to
// `longest_sum` terms in another order: float32 gets a tolerance for that.
void ExpectEinsumCases(const std::vector<EinsumCase>& cases, int64_t longest_sum) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    for (const EinsumCase& c : cases) {
      std::vector<Tensor> inputs;
      unsigned seed = 11;
      for (const std::vector<int64_t>& dims : c.dims) {
        inputs.push_back(RandomTensor(dtype, dims, seed++));
      }
      SingleNode node("Einsum", inputs, {Attribute::String("equation", c.equation)}, 12);
      std::optional<Tolerance> tolerance;
      if (dtype == DType::kFloat32) {
        tolerance = Tolerance{1e-4, std::max(1e-5, 2e-7 * static_cast<double>(longest_sum))};
      }
      ExpectCudaMatchesCpu(node, absl::StrCat("Einsum ", c.equation, " ", DTypeName(dtype)),
                           tolerance);
    }
  }
}

TEST(CudaEinsum, MatchesCpuOnEveryForm) {
  CASTOR_REQUIRE_CUDA();
  ExpectEinsumCases(
      {
          {"ij,jk->ik", {{3, 4}, {4, 5}}},
          {"bhqd,bhkd->bhqk", {{2, 3, 4, 5}, {2, 3, 6, 5}}},
          {"bhqk,bhkd->bhqd", {{2, 3, 4, 6}, {2, 3, 6, 5}}},
          {"ki,kj->ij", {{4, 3}, {4, 5}}},
          {"i,j->ij", {{3}, {4}}},
          {"ii->", {{4, 4}}},
          {"ii->i", {{4, 4}}},
          {"ij->ji", {{3, 4}}},
          {"ij->", {{3, 4}}},
          {"ijk->ki", {{2, 3, 4}}},
          {"...ij,...jk->...ik", {{2, 1, 3, 4}, {5, 4, 2}}},
          {"ij,jk", {{3, 4}, {4, 5}}},
          {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}},
          {"bn,anm,bm->ba", {{3, 4}, {2, 4, 5}, {3, 5}}},
          {"...ii->...i", {{2, 3, 3}}},
          {"iij,jk->ik", {{3, 3, 4}, {4, 2}}},
          {"ij,ij->ij", {{3, 1}, {1, 4}}},
          {"ij,jk->ik", {{2, 0}, {0, 3}}},
          {"bik,bkj->bj", {{2, 3, 4}, {2, 4, 5}}},
      },
      6);
}

TEST(CudaEinsum, LargeAttention) {
  CASTOR_REQUIRE_CUDA();
  ExpectEinsumCases({{"bhqd,bhkd->bhqk", {{4, 8, 64, 64}, {4, 8, 64, 64}}},
                     {"bhqk,bhkd->bhqd", {{4, 8, 64, 64}, {4, 8, 64, 64}}}},
                    64);
}

}  // namespace
}  // namespace castor
