// ChooseTrainingBackend and DescribeBackend (see training_backend.h).
#include "training/training_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cuda_backend.h"
#include "backend/cuda_probe.h"

namespace castor::training {
namespace {

// Why the CUDA kernels cannot run these graphs, or OK. (Compute capability
// needs no check of its own: CreateCudaBackend refuses devices older than
// 8.0, which all have bfloat16 and float16 tensor cores.)
absl::Status CudaCanRun(const std::vector<const Model*>& graphs) {
  absl::StatusOr<const KernelTable*> table = CudaKernelTable();
  if (!table.ok()) return table.status();
  std::vector<std::string> missing;
  for (const Model* model : graphs) {
    for (const Node* node : model->graph->nodes()) {
      if (absl::StatusOr<const KernelDef*> kernel = (*table)->Find(*node); !kernel.ok()) {
        missing.push_back(std::string(kernel.status().message()));
      }
    }
  }
  if (!missing.empty()) {
    constexpr size_t kShown = 8;
    const size_t shown = std::min(missing.size(), kShown);
    return absl::FailedPreconditionError(absl::StrCat(
        missing.size(), " node(s) have no CUDA kernel: ",
        absl::StrJoin(missing.begin(), missing.begin() + shown, "; "),
        missing.size() > shown ? absl::StrCat("; and ", missing.size() - shown, " more") : ""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDevicesForRanks(int device_count, const RankPlacement& placement) {
  if (placement.local_world_size <= 1 || device_count >= placement.local_world_size) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      placement.local_world_size, " data-parallel ranks on this host but ", device_count,
      " CUDA device(s): each rank needs a device of its own (start as many ranks per host as "
      "it has GPUs, or train on the CPU with --backend cpu)"));
}

absl::StatusOr<ChosenBackend> ChooseTrainingBackend(const std::string& flag, int cpu_threads,
                                                    const std::vector<const Model*>& graphs,
                                                    const CudaBackendOptions& cuda_options,
                                                    const RankPlacement& placement) {
  ChosenBackend chosen;
  auto cpu = [&](std::string note) {
    chosen.backend = std::make_unique<CpuBackend>(CpuBackendOptions{cpu_threads});
    chosen.note = std::move(note);
    return std::move(chosen);
  };
  if (flag == "cpu") return cpu("");
  if (flag != "cuda" && flag != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend ", flag, ": expected cpu, cuda or auto"));
  }
  const bool required = flag == "cuda";
  const CudaProbe probe = ProbeCuda();
  absl::Status usable = probe.usable ? CudaCanRun(graphs)
                                     : absl::FailedPreconditionError(DescribeCudaProbe(probe));
  if (usable.ok()) usable = CheckDevicesForRanks(probe.device_count, placement);
  CudaBackendOptions options = cuda_options;
  if (placement.local_world_size > 1) options.device = placement.local_rank;
  absl::StatusOr<std::unique_ptr<Backend>> created =
      usable.ok() ? CreateCudaBackend(options)
                  : absl::StatusOr<std::unique_ptr<Backend>>(usable);
  if (!created.ok()) {
    if (required) {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend cuda: ", created.status().message()));
    }
    return cpu(absl::StrCat("--backend auto chose the CPU: ", created.status().message()));
  }
  chosen.backend = *std::move(created);
  return chosen;
}

std::string DescribeBackend(const Backend& backend) {
  if (const auto* cpu = dynamic_cast<const CpuBackend*>(&backend); cpu != nullptr) {
    return absl::StrCat("cpu (", cpu->num_threads(), " threads, ", cpu::DescribeGemm(), ")");
  }
  const CudaProbe probe = ProbeCuda();
  if (probe.usable) {
    return absl::StrFormat("%s (%s, compute capability %d.%d)", backend.name(), probe.device_name,
                           probe.compute_capability_major, probe.compute_capability_minor);
  }
  return backend.name();
}

}  // namespace castor::training
