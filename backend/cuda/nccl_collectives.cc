// NCCL behind the CUDA backend's device collectives (see
// nccl_collectives.h and backend/device_collectives.h).
//
// Loading: libnccl.so.2 is opened with dlopen once per process and the
// dozen functions used here are resolved from it; NCCL 2.14 or newer is
// required (nonblocking communicators; ncclAvg came in 2.10).
//
// Never an endless wait: communicators are nonblocking (ncclConfig_t
// blocking = 0), so joining and queueing return at once and the host polls
// ncclCommGetAsyncError until they are done; the averages themselves run on
// the backend's stream, and Wait polls an event recorded after them,
// checking ncclCommGetAsyncError in between. Past the group's timeout (the
// run's --dist-timeout) the communicator is aborted (ncclCommAbort, which
// also ends kernels still waiting for a peer) and the error names the rank.
#include "backend/cuda/nccl_collectives.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda_backend.h"
#include "backend/dynamic_library.h"
#include "graph/status.h"

namespace castor::cuda {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kNeededFor[] = "data-parallel training on cuda needs NCCL";
// 2.14: nonblocking communicators and ncclCommGetAsyncError's progress.
constexpr int kOldestVersion = 21400;

// "2.28.9" from ncclGetVersion's code (X*10000 + Y*100 + Z since 2.9,
// X*1000 + Y*100 + Z before).
std::string VersionText(int code) {
  if (code >= 10000) {
    return absl::StrFormat("%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
  }
  return absl::StrFormat("%d.%d.%d", code / 1000, code % 1000 / 100, code % 100);
}

// The NCCL functions castor calls.
struct NcclApi {
  std::string engine;  // "NCCL 2.28.9"
  ncclResult_t (*GetVersion)(int*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  const char* (*GetLastError)(ncclComm_t) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommFinalize)(ncclComm_t) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;

  // "unhandled system error (ncclSystemError): <NCCL's last message>".
  std::string Describe(ncclResult_t code, ncclComm_t comm) const {
    std::string text = GetErrorString(code);
    const char* last = GetLastError(comm);
    if (last != nullptr && last[0] != '\0') absl::StrAppend(&text, " (", last, ")");
    return text;
  }
};

absl::StatusOr<NcclApi> OpenNccl(const std::string& file) {
  CASTOR_ASSIGN_OR_RETURN(DynamicLibrary library, DynamicLibrary::Open(file, kNeededFor));
  NcclApi api;
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclGetVersion", &api.GetVersion));
  int version = 0;
  if (api.GetVersion(&version) != ncclSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat(kNeededFor, " (", file, "): ncclGetVersion failed"));
  }
  if (version < kOldestVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        kNeededFor, " 2.14 or newer (nonblocking communicators); ", file, " is NCCL ",
        VersionText(version)));
  }
  api.engine = absl::StrCat("NCCL ", VersionText(version));
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclGetErrorString", &api.GetErrorString));
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclGetLastError", &api.GetLastError));
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclGetUniqueId", &api.GetUniqueId));
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclCommInitRankConfig", &api.CommInitRankConfig));
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclCommGetAsyncError", &api.CommGetAsyncError));
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclCommFinalize", &api.CommFinalize));
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclCommDestroy", &api.CommDestroy));
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclCommAbort", &api.CommAbort));
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclGroupStart", &api.GroupStart));
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclGroupEnd", &api.GroupEnd));
  CASTOR_RETURN_IF_ERROR(library.Resolve("ncclAllReduce", &api.AllReduce));
  return api;
}

// libnccl.so.2, opened on first use (the same answer ever after).
const absl::StatusOr<NcclApi>& Nccl() {
  static const absl::StatusOr<NcclApi> api = OpenNccl(kNcclLibraryFile);
  return api;
}

absl::StatusOr<ncclDataType_t> NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    default: return absl::InvalidArgumentError(DTypeName(dtype));
  }
}

std::string Seconds(std::chrono::milliseconds timeout) {
  return absl::StrFormat("%g s", static_cast<double>(timeout.count()) / 1000.0);
}

// Waits while `comm` reports ncclInProgress (a nonblocking call not done
// yet), until `deadline`: the final state, or nullopt past the deadline.
std::optional<ncclResult_t> AwaitProgress(const NcclApi& api, ncclComm_t comm,
                                          Clock::time_point deadline) {
  const Clock::time_point started = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t asked = api.CommGetAsyncError(comm, &state);
    if (asked != ncclSuccess) return asked;
    if (state != ncclInProgress) return state;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return std::nullopt;
    // Yield for the first millisecond (queueing takes microseconds), then
    // poll every 200 us.
    if (now - started < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

class NcclGroup : public DeviceCollectiveGroup {
 public:
  NcclGroup(const NcclApi& api, CudaBackend& backend, ncclComm_t comm, int rank, int world_size,
            std::chrono::milliseconds timeout, cudaEvent_t start, cudaEvent_t end)
      : api_(api), backend_(backend), comm_(comm), rank_(rank), world_size_(world_size),
        timeout_(timeout), start_(start), end_(end) {}

  ~NcclGroup() override {
    if (!backend_.Activate().ok()) return;
    if (comm_ != nullptr) {
      // Finalize (flushes what is left) within the timeout, then free;
      // a communicator that cannot finish is aborted.
      bool finalized = false;
      if (const ncclResult_t code = api_.CommFinalize(comm_);
          code == ncclSuccess || code == ncclInProgress) {
        std::optional<ncclResult_t> state =
            AwaitProgress(api_, comm_, Clock::now() + timeout_);
        finalized = state.has_value() && *state == ncclSuccess;
      }
      if (finalized) {
        api_.CommDestroy(comm_);
      } else {
        api_.CommAbort(comm_);
      }
    }
    cudaEventDestroy(start_);
    cudaEventDestroy(end_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string engine() const override { return api_.engine; }

  absl::Status AverageInPlace(const std::vector<TensorView>& buffers,
                              const std::string& what) override {
    CASTOR_RETURN_IF_ERROR(failure_);
    std::vector<ncclDataType_t> types;
    for (size_t k = 0; k < buffers.size(); ++k) {
      absl::StatusOr<ncclDataType_t> type = NcclType(buffers[k].dtype);
      if (!type.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Prefix(), what, ": buffer ", k, " of ", buffers.size(), " is ",
            DTypeName(buffers[k].dtype), "; NCCL averages float32, float16 or bfloat16"));
      }
      types.push_back(*type);
    }
    CASTOR_RETURN_IF_ERROR(backend_.Activate());
    const cudaStream_t stream = backend_.stream();
    if (!pending_) {
      CASTOR_RETURN_IF_ERROR(CudaCall(cudaEventRecord(start_, stream), what, "cudaEventRecord"));
    }
    const Clock::time_point deadline = Clock::now() + timeout_;
    CASTOR_RETURN_IF_ERROR(Check(api_.GroupStart(), what, "ncclGroupStart"));
    ncclResult_t queued = ncclSuccess;
    size_t failed_at = 0;
    for (size_t k = 0; k < buffers.size() && (queued == ncclSuccess || queued == ncclInProgress);
         ++k) {
      const size_t count = static_cast<size_t>(buffers[k].num_elements());
      if (count == 0) continue;
      queued = api_.AllReduce(buffers[k].data, buffers[k].data, count, types[k], ncclAvg, comm_,
                              stream);
      failed_at = k;
    }
    // The group ends even when a call failed (it must be closed).
    const ncclResult_t ended = api_.GroupEnd();
    if (queued != ncclSuccess && queued != ncclInProgress) {
      return Fail(absl::StrCat(what, ": ncclAllReduce of buffer ", failed_at, " (",
                               buffers[failed_at].num_elements(), " ",
                               DTypeName(buffers[failed_at].dtype), "): ",
                               api_.Describe(queued, comm_)));
    }
    CASTOR_RETURN_IF_ERROR(Check(ended, what, "ncclGroupEnd"));
    // Queueing may wait for peers (connections are made on first use).
    CASTOR_RETURN_IF_ERROR(AwaitOrFail(deadline, what, "queueing the average"));
    CASTOR_RETURN_IF_ERROR(CudaCall(cudaEventRecord(end_, stream), what, "cudaEventRecord"));
    pending_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<double> Wait(const std::string& what) override {
    CASTOR_RETURN_IF_ERROR(failure_);
    if (!pending_) return 0.0;
    CASTOR_RETURN_IF_ERROR(backend_.Activate());
    const Clock::time_point started = Clock::now(), deadline = started + timeout_;
    for (;;) {
      const cudaError_t done = cudaEventQuery(end_);
      if (done == cudaSuccess) break;
      if (done != cudaErrorNotReady) {
        cudaGetLastError();
        return Fail(absl::StrCat(what, ": waiting for the average: ", cudaGetErrorName(done), " (",
                                 cudaGetErrorString(done), ")"));
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t asked = api_.CommGetAsyncError(comm_, &state);
      if (asked != ncclSuccess) state = asked;
      if (state != ncclSuccess && state != ncclInProgress) {
        return Fail(absl::StrCat(what, ": ", api_.Describe(state, comm_)));
      }
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        return Fail(absl::StrCat(what, ": the average did not finish within ", Seconds(timeout_),
                                 " (--dist-timeout): a rank died or stopped answering"));
      }
      if (now - started < std::chrono::milliseconds(1)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    pending_ = false;
    float ms = 0;
    CASTOR_RETURN_IF_ERROR(
        CudaCall(cudaEventElapsedTime(&ms, start_, end_), what, "cudaEventElapsedTime"));
    return static_cast<double>(ms) / 1000.0;
  }

 private:
  std::string Prefix() const {
    return absl::StrCat("rank ", rank_, " of ", world_size_, ": NCCL: ");
  }

  // Aborts the communicator (ending kernels still waiting for a peer) and
  // remembers why: every later call fails the same way.
  absl::Status Fail(const std::string& why) {
    if (comm_ != nullptr) {
      api_.CommAbort(comm_);
      comm_ = nullptr;
    }
    failure_ = absl::UnavailableError(
        absl::StrCat(Prefix(), why, "; the NCCL communicator was aborted"));
    return failure_;
  }

  absl::Status Check(ncclResult_t code, const std::string& what, const char* call) {
    if (code == ncclSuccess || code == ncclInProgress) return absl::OkStatus();
    return Fail(absl::StrCat(what, ": ", call, ": ", api_.Describe(code, comm_)));
  }

  absl::Status CudaCall(cudaError_t code, const std::string& what, const char* call) {
    if (code == cudaSuccess) return absl::OkStatus();
    cudaGetLastError();
    return absl::InternalError(absl::StrCat(Prefix(), what, ": ", call, ": ",
                                            cudaGetErrorName(code), " (",
                                            cudaGetErrorString(code), ")"));
  }

  absl::Status AwaitOrFail(Clock::time_point deadline, const std::string& what,
                           const char* doing) {
    std::optional<ncclResult_t> state = AwaitProgress(api_, comm_, deadline);
    if (!state.has_value()) {
      return Fail(absl::StrCat(what, ": ", doing, " did not finish within ", Seconds(timeout_),
                               " (--dist-timeout): a rank died or stopped answering"));
    }
    if (*state != ncclSuccess) {
      return Fail(absl::StrCat(what, ": ", doing, ": ", api_.Describe(*state, comm_)));
    }
    return absl::OkStatus();
  }

  const NcclApi& api_;
  CudaBackend& backend_;
  ncclComm_t comm_;  // null once aborted
  const int rank_;
  const int world_size_;
  const std::chrono::milliseconds timeout_;
  cudaEvent_t start_;  // recorded before the first average since the last Wait
  cudaEvent_t end_;    // after the last
  bool pending_ = false;
  absl::Status failure_;
};

class NcclCollectives : public DeviceCollectives {
 public:
  explicit NcclCollectives(CudaBackend& backend) : backend_(backend) {}

  std::string library() const override { return "NCCL"; }
  absl::Status Load() override { return Nccl().status(); }
  size_t group_id_bytes() const override { return sizeof(ncclUniqueId); }

  absl::StatusOr<std::string> NewGroupId() override {
    CASTOR_ASSIGN_OR_RETURN(const NcclApi* api, Api());
    CASTOR_RETURN_IF_ERROR(backend_.Activate());
    ncclUniqueId id;
    if (const ncclResult_t code = api->GetUniqueId(&id); code != ncclSuccess) {
      return absl::UnavailableError(absl::StrCat("rank 0: NCCL: ncclGetUniqueId: ",
                                                 api->Describe(code, nullptr)));
    }
    return std::string(id.internal, sizeof(id.internal));
  }

  absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> Join(
      const std::string& id, int rank, int world_size,
      std::chrono::milliseconds timeout) override {
    const std::string prefix = absl::StrCat("rank ", rank, " of ", world_size, ": NCCL: ");
    if (world_size < 1 || rank < 0 || rank >= world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "a rank must be in [0, world size), the world size >= 1"));
    }
    if (id.size() != sizeof(ncclUniqueId)) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "a group id of ", id.size(),
                                                     " bytes; NCCL's has ",
                                                     sizeof(ncclUniqueId)));
    }
    if (timeout.count() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "the timeout must be positive"));
    }
    CASTOR_ASSIGN_OR_RETURN(const NcclApi* api, Api());
    CASTOR_RETURN_IF_ERROR(backend_.Activate());
    ncclUniqueId unique;
    std::copy(id.begin(), id.end(), unique.internal);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const Clock::time_point deadline = Clock::now() + timeout;
    const ncclResult_t started = api->CommInitRankConfig(&comm, world_size, unique, rank, &config);
    auto fail = [&](const std::string& why) {
      if (comm != nullptr) api->CommAbort(comm);
      return absl::UnavailableError(absl::StrCat(prefix, "joining the group of ", world_size,
                                                 " rank(s) on ", backend_.name(), ": ", why));
    };
    if (started != ncclSuccess && started != ncclInProgress) {
      return fail(absl::StrCat("ncclCommInitRankConfig: ", api->Describe(started, comm)));
    }
    if (comm == nullptr) return fail("ncclCommInitRankConfig gave no communicator");
    std::optional<ncclResult_t> state = AwaitProgress(*api, comm, deadline);
    if (!state.has_value()) {
      return fail(absl::StrCat("not every rank joined within ", Seconds(timeout),
                               " (--dist-timeout)"));
    }
    if (*state != ncclSuccess) return fail(api->Describe(*state, comm));
    cudaEvent_t start = nullptr, end = nullptr;
    if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&end) != cudaSuccess) {
      cudaGetLastError();
      if (start != nullptr) cudaEventDestroy(start);
      return fail("cannot create the CUDA events that time the averages");
    }
    return std::unique_ptr<DeviceCollectiveGroup>(
        new NcclGroup(*api, backend_, comm, rank, world_size, timeout, start, end));
  }

 private:
  absl::StatusOr<const NcclApi*> Api() const {
    const absl::StatusOr<NcclApi>& api = Nccl();
    if (!api.ok()) return api.status();
    return &*api;
  }

  CudaBackend& backend_;
};

}  // namespace

std::unique_ptr<DeviceCollectives> MakeNcclCollectives(CudaBackend& backend) {
  return std::make_unique<NcclCollectives>(backend);
}

absl::StatusOr<std::string> LoadNcclLibrary(const std::string& file) {
  if (file == kNcclLibraryFile) {
    const absl::StatusOr<NcclApi>& api = Nccl();
    if (!api.ok()) return api.status();
    return api->engine;
  }
  CASTOR_ASSIGN_OR_RETURN(NcclApi api, OpenNccl(file));
  return api.engine;
}

}  // namespace castor::cuda
