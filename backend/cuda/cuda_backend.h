// CudaBackend: the Backend implementation for one CUDA device (see
// backend/cuda_backend.h for how the rest of castor creates one). Kernels
// reach it through KernelContext::backend() for the stream, the library
// handles and device facts; everything they queue runs in stream order, so
// memory a kernel frees may be reused by the next kernel without a sync.
//
// Threads: the backend makes its device current in each of its own calls
// (allocation, copies, synchronisation), but kernels launch on whatever
// device is current, so one host thread at a time drives a backend and
// runs its kernels (the executor does).
//
// This header includes CUDA headers and is only for backend/cuda/.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "backend/cuda_probe.h"
#include "backend/device_collectives.h"

namespace castor::cuda {

// A caching allocator of device memory. Sizes are rounded up (512 bytes
// below 1 MiB, 2 MiB above) and freed blocks are kept in per-size free lists,
// so a training step that repeats a shape never calls cudaMalloc. When the
// device runs out, the cache is returned to the driver and the allocation
// retried once (not while a CUDA graph is being recorded: freeing memory
// would end the recording). Blocks handed out while recording are never
// returned to the driver before the pool dies: a graph may still use them.
class DevicePool {
 public:
  DevicePool() = default;
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  absl::StatusOr<void*> Allocate(size_t bytes);
  void Free(void* data);
  // Returns every cached (free) block to the driver, except those a
  // recording was handed.
  void ReleaseCached();
  void set_recording(bool recording) { recording_ = recording; }
  const DeviceMemoryStats& stats() const { return stats_; }

  static size_t RoundedSize(size_t bytes);

 private:
  std::map<size_t, std::vector<void*>> free_;  // rounded size -> blocks
  std::unordered_map<void*, size_t> sizes_;    // every block held -> rounded size
  std::set<void*> recorded_;                   // handed out while recording
  bool recording_ = false;
  DeviceMemoryStats stats_;
};

// The oldest device castor's kernels are built for (CMake's
// CMAKE_CUDA_ARCHITECTURES: 80-real;90-real;90-virtual); bfloat16 math and
// atomics also need it.
inline constexpr int kMinComputeCapability = 80;

struct DeviceInfo {
  int device = 0;
  std::string name;
  int major = 0;  // compute capability
  int minor = 0;
  int64_t total_memory = 0;
  int multiprocessors = 0;

  int compute_capability() const { return major * 10 + minor; }
  bool has_bf16_tensor_cores() const { return compute_capability() >= 80; }
  bool has_fp16_tensor_cores() const { return compute_capability() >= 70; }
};

class CudaBackend : public Backend {
 public:
  // Fails (FailedPrecondition, saying why) without a usable device.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override;
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* data) override;
  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  absl::Status CopyWithin(void* dst, const void* src, size_t bytes) override;
  const KernelTable& kernels() const override;
  absl::Status Synchronize() override;
  StepKernels* step_kernels() override { return step_kernels_.get(); }
  // NCCL (nccl_collectives.h), loaded when a data-parallel run first asks.
  DeviceCollectives* device_collectives() override { return collectives_.get(); }

  // CUDA graphs: stream capture in relaxed mode on this backend's stream.
  // The graph replays on the same stream and must not outlive the backend.
  std::string CaptureUnsupportedReason() const override { return ""; }
  absl::Status BeginCapture() override;
  absl::StatusOr<std::unique_ptr<CapturedWork>> EndCapture() override;
  void AbortCapture() override;

  // Makes this backend's device current for the calling thread.
  absl::Status Activate() const;
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  const DeviceInfo& device() const { return device_; }
  bool allow_tf32() const { return options_.allow_tf32; }
  const DeviceMemoryStats& memory_stats() const { return pool_.stats(); }

  // The cuDNN algorithm that ran each convolution shape this backend has
  // seen (key: direction, beta, dtype, rank, group, FMA-only math, dims,
  // pads, strides, dilations; backend/cuda/conv.cu builds it). cuDNN 9's
  // heuristic and workspace queries build execution plans on every call, so
  // conv.cu asks them once per shape and then runs the remembered choice.
  struct ConvAlgorithm {
    int algo = 0;
    cudnnMathType_t math = CUDNN_DEFAULT_MATH;
    size_t workspace_bytes = 0;
  };
  std::map<std::vector<int64_t>, ConvAlgorithm>& conv_algorithms() { return conv_algorithms_; }

 private:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {}

  CudaBackendOptions options_;
  DeviceInfo device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  DevicePool pool_;
  void* cublas_workspace_ = nullptr;  // pool memory, fixed so graphs can hold on to it
  // While recording: the pinned host copies CopyFromHost made (the graph
  // reads them on every replay and owns them once recorded).
  bool capturing_ = false;
  std::vector<void*> capture_staging_;
  std::map<std::vector<int64_t>, ConvAlgorithm> conv_algorithms_;
  std::unique_ptr<StepKernels> step_kernels_;  // holds pool memory: released first
  std::unique_ptr<DeviceCollectives> collectives_;
};

// The module's entry points (backend/cuda/module.cc hands them to the
// loader; backend/cuda_backend.h documents them).
CudaProbe ProbeDevices();
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const CudaBackendOptions& options);
const KernelTable* Kernels();
absl::StatusOr<DeviceMemoryStats> MemoryStats(const Backend& backend);

}  // namespace castor::cuda
