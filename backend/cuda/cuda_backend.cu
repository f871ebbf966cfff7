// CudaBackend, its DevicePool, and the module entry points that create one,
// list the kernels and read a backend's memory statistics.
#include "backend/cuda/cuda_backend.h"

#include <cudnn.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/nccl_collectives.h"

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
    if (code == cudaErrorMemoryAllocation && !recording_) {
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
  if (recording_) recorded_.insert(block);
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
    std::vector<void*> kept;
    for (void* block : blocks) {
      if (recorded_.count(block) > 0) {
        kept.push_back(block);
        continue;
      }
      cudaFree(block);
      sizes_.erase(block);
      stats_.reserved_bytes -= static_cast<int64_t>(size);
    }
    blocks = std::move(kept);
  }
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
  // A workspace of our own (the size cuBLAS recommends: 32 MiB on Hopper,
  // 4 MiB before), so cuBLAS allocates nothing while a graph is recorded.
  const size_t workspace = info.compute_capability() >= 90 ? size_t{32} << 20 : size_t{4} << 20;
  CASTOR_ASSIGN_OR_RETURN(backend->cublas_workspace_, backend->pool_.Allocate(workspace));
  CASTOR_CUBLAS_CALL(
      cublasSetWorkspace(backend->cublas_, backend->cublas_workspace_, workspace));
  backend->step_kernels_ = MakeCudaStepKernels(*backend);
  backend->collectives_ = MakeNcclCollectives(*backend);
  return backend;
}

CudaBackend::~CudaBackend() {
  AbortCapture();
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
  if (capturing_) {
    // A graph copies from pinned memory that outlives the call (the
    // caller's source may be gone by the first replay).
    void* pinned = nullptr;
    CASTOR_CUDA_CALL(cudaMallocHost(&pinned, bytes));
    capture_staging_.push_back(pinned);
    std::memcpy(pinned, host_src, bytes);
    CASTOR_CUDA_CALL(cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, stream_));
    return absl::OkStatus();
  }
  // From pageable memory the call returns once the source has been staged,
  // so the caller may release it at once.
  CASTOR_CUDA_CALL(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

namespace {

absl::Status RefusedWhileCapturing(const char* what) {
  return absl::FailedPreconditionError(
      absl::StrCat("cuda: ", what, " while a CUDA graph is being recorded (a graph cannot wait "
                   "for the device or read its memory on the host)"));
}

// A recorded step: the instantiated graph, replayed on the backend's
// stream, and the pinned host copies its host-to-device copies read.
class CudaGraph : public CapturedWork {
 public:
  CudaGraph(int device, cudaStream_t stream, cudaGraph_t graph, cudaGraphExec_t exec,
            std::vector<void*> staging)
      : device_(device), stream_(stream), graph_(graph), exec_(exec),
        staging_(std::move(staging)) {}
  ~CudaGraph() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);  // a replay may still read the staging copies
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    for (void* pinned : staging_) cudaFreeHost(pinned);
  }
  absl::Status Replay() override {
    CASTOR_CUDA_CALL(cudaSetDevice(device_));
    CASTOR_CUDA_CALL(cudaGraphLaunch(exec_, stream_));
    return absl::OkStatus();
  }

 private:
  int device_;
  cudaStream_t stream_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  std::vector<void*> staging_;
};

}  // namespace

absl::Status CudaBackend::BeginCapture() {
  if (capturing_) return absl::FailedPreconditionError("cuda: a CUDA graph is already being recorded");
  CASTOR_RETURN_IF_ERROR(Activate());
  // Relaxed: allocating device memory (a pool miss) stays allowed.
  CASTOR_CUDA_CALL(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
  pool_.set_recording(true);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CapturedWork>> CudaBackend::EndCapture() {
  if (!capturing_) return absl::FailedPreconditionError("cuda: no CUDA graph is being recorded");
  capturing_ = false;
  pool_.set_recording(false);
  std::vector<void*> staging = std::move(capture_staging_);
  capture_staging_.clear();
  auto drop = [&staging] {
    for (void* pinned : staging) cudaFreeHost(pinned);
  };
  cudaGraph_t graph = nullptr;
  if (absl::Status ended = CudaStatus(cudaStreamEndCapture(stream_, &graph), "ending the capture");
      !ended.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    drop();
    return ended;
  }
  cudaGraphExec_t exec = nullptr;
  if (absl::Status made = CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "instantiating");
      !made.ok()) {
    cudaGraphDestroy(graph);
    drop();
    return made;
  }
  return std::unique_ptr<CapturedWork>(
      new CudaGraph(device_.device, stream_, graph, exec, std::move(staging)));
}

void CudaBackend::AbortCapture() {
  if (!capturing_) return;
  capturing_ = false;
  pool_.set_recording(false);
  cudaSetDevice(device_.device);
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream_, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();  // a capture that went wrong leaves a (non-sticky) error behind
  for (void* pinned : capture_staging_) cudaFreeHost(pinned);
  capture_staging_.clear();
}

absl::Status CudaBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (capturing_) return RefusedWhileCapturing("copying device memory to the host");
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
  if (capturing_) return RefusedWhileCapturing("waiting for the device");
  CASTOR_RETURN_IF_ERROR(Activate());
  CASTOR_CUDA_CALL(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

const KernelTable& CudaBackend::kernels() const { return *Kernels(); }

// ---- the module's entry points (backend/cuda/module.cc) ----------------------------

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const CudaBackendOptions& options) {
  CASTOR_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

const KernelTable* Kernels() {
  static const KernelTable* table = [] {
    auto* t = new KernelTable();
    RegisterElementwiseKernels(*t);
    RegisterReduceKernels(*t);
    RegisterMatMulKernels(*t);
    RegisterEinsumKernels(*t);
    RegisterConvKernels(*t);
    RegisterPoolKernels(*t);
    RegisterNormalizationKernels(*t);
    RegisterSoftmaxKernels(*t);
    RegisterLossKernels(*t);
    RegisterShapeKernels(*t);
    RegisterResizeKernels(*t);
    return t;
  }();
  return table;
}

absl::StatusOr<DeviceMemoryStats> MemoryStats(const Backend& backend) {
  const auto* cuda_backend = dynamic_cast<const CudaBackend*>(&backend);
  if (cuda_backend == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("backend '", backend.name(), "' is not a CUDA backend"));
  }
  return cuda_backend->memory_stats();
}

}  // namespace cuda
}  // namespace castor
