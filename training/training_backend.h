// Which backend `castor train` (and the benchmarks) run on, from the
// --backend flag: cpu, cuda, or auto (CUDA when a usable GPU can run every
// node of the training and evaluation graphs, else the CPU with a note
// saying why).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "graph/graph.h"

namespace castor::training {

struct ChosenBackend {
  std::unique_ptr<Backend> backend;
  // Why auto fell back to the CPU, or a performance warning; "" otherwise.
  std::string note;
};

// `flag` is "cpu", "cuda" or "auto"; `cpu_threads` as CpuBackendOptions,
// `cuda_options` for a CUDA backend; `graphs` the models that will run,
// converted under the policy (every node needs a kernel for its dtypes).
// With "cuda", a missing or too old GPU (compute capability below 8.0) or
// nodes without a CUDA kernel (the first ones listed) are a
// FailedPrecondition error saying so.
// A data-parallel rank's place on its host: each rank of a GPU run takes
// device `local_rank` (cuda_options.device is ignored when
// local_world_size > 1).
struct RankPlacement {
  int local_rank = 0;
  int local_world_size = 1;
};

// OK when `device_count` CUDA devices can give each of the ranks on this
// host one of its own; FailedPrecondition saying how many there are of each.
absl::Status CheckDevicesForRanks(int device_count, const RankPlacement& placement);

absl::StatusOr<ChosenBackend> ChooseTrainingBackend(const std::string& flag, int cpu_threads,
                                                    const std::vector<const Model*>& graphs,
                                                    const CudaBackendOptions& cuda_options = {},
                                                    const RankPlacement& placement = {});

// "cuda:0 (NVIDIA H200, compute capability 9.0)" or "cpu (2 threads)".
std::string DescribeBackend(const Backend& backend);

}  // namespace castor::training
