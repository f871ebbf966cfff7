// CudaBackend, its DevicePool, and the backend/cuda_backend.h entry points
// for CUDA builds.
#include "backend/cuda/cuda_backend.h"

#include <cudnn.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace castor {
namespace cuda {

// ---- DevicePool ----------------------------------------------------------------

size_t DevicePool::RoundedSize(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kSmallLimit = size_t{1} << 20;
  if (bytes == 0) bytes = 1;
  return bytes < kSmallLimit ? (bytes + kSmall - 1) / kSmall * kSmall
                             : (bytes + kLarge - 1) / kLarge * kLarge;
}

DevicePool::~DevicePool() {
  for (auto& [block, size] : sizes_) cudaFree(block);
}

absl::StatusOr<void*> DevicePool::Allocate(size_t bytes) {
  const size_t size = RoundedSize(bytes);
  void* block = nullptr;
  if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
    block = it->second.back();
    it->second.pop_back();
  } else {
    cudaError_t code = cudaMalloc(&block, size);
    if (code == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      ReleaseCached();
      code = cudaMalloc(&block, size);
    }
    if (code != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cuda: cannot allocate %d bytes of device memory (%s); this backend holds %d bytes, "
          "%d in use",
          size, cudaGetErrorString(code), stats_.reserved_bytes, stats_.in_use_bytes));
    }
    sizes_[block] = size;
    stats_.reserved_bytes += static_cast<int64_t>(size);
    ++stats_.device_allocations;
  }
  stats_.in_use_bytes += static_cast<int64_t>(size);
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return block;
}

void DevicePool::Free(void* data) {
  if (data == nullptr) return;
  auto it = sizes_.find(data);
  if (it == sizes_.end()) return;  // not ours; nothing sensible to do
  stats_.in_use_bytes -= static_cast<int64_t>(it->second);
  free_[it->second].push_back(data);
}

void DevicePool::ReleaseCached() {
  for (auto& [size, blocks] : free_) {
    for (void* block : blocks) {
      cudaFree(block);
      sizes_.erase(block);
      stats_.reserved_bytes -= static_cast<int64_t>(size);
    }
  }
  free_.clear();
}

// ---- errors and helpers (cuda_common.cuh) -----------------------------------------

absl::Status CudaStatus(cudaError_t code, const char* what) {
  if (code == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a non-sticky error so later calls are not blamed
  return absl::InternalError(absl::StrCat("cuda: ", what, ": ", cudaGetErrorName(code), " (",
                                          cudaGetErrorString(code), ")"));
}

absl::Status CublasStatus(cublasStatus_t code, const char* what) {
  if (code == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cublas: ", what, ": ", cublasGetStatusName(code),
                                          " (", cublasGetStatusString(code), ")"));
}

absl::Status CudnnStatus(cudnnStatus_t code, const char* what) {
  if (code == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  char message[256] = {0};
  cudnnGetLastErrorString(message, sizeof(message));
  return absl::InternalError(absl::StrCat("cudnn: ", what, ": ", cudnnGetErrorString(code),
                                          message[0] ? absl::StrCat(" (", message, ")") : ""));
}

absl::Status CheckLaunch(const KernelContext& ctx) {
  const cudaError_t code = cudaGetLastError();
  if (code == cudaSuccess) return absl::OkStatus();
  return ctx.Error(absl::StrCat("CUDA kernel launch failed: ", cudaGetErrorName(code), " (",
                                cudaGetErrorString(code), ")"));
}

absl::StatusOr<std::vector<int64_t>> ReadInt64s(const KernelContext& ctx, int index) {
  const TensorView& t = ctx.input(index);
  const int64_t n = t.num_elements();
  std::vector<int64_t> values(static_cast<size_t>(n));
  // The executor's host copy when there is one, else a copy that waits for
  // the device.
  auto copy = [&](void* host) -> absl::Status {
    if (n == 0) return absl::OkStatus();
    if (t.host_data != nullptr) {
      std::memcpy(host, t.host_data, t.byte_size());
      return absl::OkStatus();
    }
    return ctx.backend().CopyToHost(host, t.data, t.byte_size());
  };
  if (t.dtype == DType::kInt64) {
    CASTOR_RETURN_IF_ERROR(copy(values.data()));
  } else if (t.dtype == DType::kInt32) {
    std::vector<int32_t> narrow(static_cast<size_t>(n));
    CASTOR_RETURN_IF_ERROR(copy(narrow.data()));
    for (int64_t i = 0; i < n; ++i) values[i] = narrow[i];
  } else {
    return ctx.Error(absl::StrCat("input ", index, " must be int32 or int64, got ",
                                  DTypeName(t.dtype)));
  }
  return values;
}

absl::Status WriteInt64Output(KernelContext& ctx, int index, const std::vector<int64_t>& dims,
                              const std::vector<int64_t>& values) {
  CASTOR_ASSIGN_OR_RETURN(TensorView * out, ctx.Output(index, DType::kInt64, dims));
  if (out->num_elements() != static_cast<int64_t>(values.size())) {
    return ctx.Error("WriteInt64Output: the output size differs from the values given");
  }
  CASTOR_RETURN_IF_ERROR(ctx.backend().CopyFromHost(out->data, values.data(), out->byte_size()));
  ctx.SetHostCopy(index, Tensor::FromVector<int64_t>(DType::kInt64, dims, values));
  return absl::OkStatus();
}

// ---- CudaBackend -------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options) {
  auto unusable = [&](const std::string& why) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", options.device, " is not usable: ", why));
  };
  int count = 0;
  if (cudaError_t code = cudaGetDeviceCount(&count); code != cudaSuccess) {
    return unusable(cudaGetErrorString(code));
  }
  if (options.device < 0 || options.device >= count) {
    return unusable(absl::StrCat("this machine has ", count, " CUDA device(s)"));
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(options));
  DeviceInfo& info = backend->device_;
  cudaDeviceProp prop;
  if (cudaError_t code = cudaGetDeviceProperties(&prop, options.device); code != cudaSuccess) {
    return unusable(cudaGetErrorString(code));
  }
  info.device = options.device;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.total_memory = static_cast<int64_t>(prop.totalGlobalMem);
  info.multiprocessors = prop.multiProcessorCount;
  if (info.compute_capability() < kMinComputeCapability) {
    return unusable(absl::StrFormat(
        "%s has compute capability %d.%d; castor's CUDA kernels are built for 8.0 and newer",
        info.name, info.major, info.minor));
  }
  CASTOR_RETURN_IF_ERROR(backend->Activate());
  CASTOR_CUDA_CALL(cudaStreamCreateWithFlags(&backend->stream_, cudaStreamNonBlocking));
  CASTOR_CUBLAS_CALL(cublasCreate(&backend->cublas_));
  CASTOR_CUBLAS_CALL(cublasSetStream(backend->cublas_, backend->stream_));
  CASTOR_CUDNN_CALL(cudnnCreate(&backend->cudnn_));
  CASTOR_CUDNN_CALL(cudnnSetStream(backend->cudnn_, backend->stream_));
  backend->step_kernels_ = MakeCudaStepKernels(*backend);
  return backend;
}

CudaBackend::~CudaBackend() {
  if (Activate().ok() && stream_ != nullptr) cudaStreamSynchronize(stream_);
  step_kernels_.reset();
  if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  pool_.ReleaseCached();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaBackend::Activate() const {
  CASTOR_CUDA_CALL(cudaSetDevice(device_.device));
  return absl::OkStatus();
}

std::string CudaBackend::name() const { return absl::StrCat("cuda:", device_.device); }

absl::StatusOr<void*> CudaBackend::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  CASTOR_RETURN_IF_ERROR(Activate());
  return pool_.Allocate(bytes);
}

void CudaBackend::Free(void* data) { pool_.Free(data); }

absl::Status CudaBackend::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  CASTOR_RETURN_IF_ERROR(Activate());
  // From pageable memory the call returns once the source has been staged,
  // so the caller may release it at once.
  CASTOR_CUDA_CALL(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  CASTOR_RETURN_IF_ERROR(Activate());
  CASTOR_CUDA_CALL(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  CASTOR_CUDA_CALL(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyWithin(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return absl::OkStatus();
  CASTOR_RETURN_IF_ERROR(Activate());
  CASTOR_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Synchronize() {
  CASTOR_RETURN_IF_ERROR(Activate());
  CASTOR_CUDA_CALL(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

const KernelTable& CudaBackend::kernels() const { return *CudaKernelTable(); }

}  // namespace cuda

// ---- backend/cuda_backend.h ---------------------------------------------------------

bool CudaBackendCompiled() { return true; }

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  CASTOR_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaBackend> backend,
                          cuda::CudaBackend::Create(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

const KernelTable* CudaKernelTable() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable();
    cuda::RegisterElementwiseKernels(*t);
    cuda::RegisterReduceKernels(*t);
    cuda::RegisterMatMulKernels(*t);
    cuda::RegisterConvKernels(*t);
    cuda::RegisterPoolKernels(*t);
    cuda::RegisterNormalizationKernels(*t);
    cuda::RegisterSoftmaxKernels(*t);
    cuda::RegisterLossKernels(*t);
    cuda::RegisterShapeKernels(*t);
    return t;
  }();
  return table;
}

absl::StatusOr<DeviceMemoryStats> CudaMemoryStats(const Backend& backend) {
  const auto* cuda_backend = dynamic_cast<const cuda::CudaBackend*>(&backend);
  if (cuda_backend == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("backend '", backend.name(), "' is not a CUDA backend"));
  }
  return cuda_backend->memory_stats();
}

}  // namespace castor
