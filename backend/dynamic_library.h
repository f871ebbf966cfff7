// A shared library a backend opens at run time (dlopen) instead of linking
// it, so that castor still starts where the library is missing and says
// what needed it only when something does: the CUDA backend opens NCCL this
// way for data-parallel training (backend/cuda/nccl_collectives.cc).
//
//   CASTOR_ASSIGN_OR_RETURN(DynamicLibrary nccl,
//       DynamicLibrary::Open("libnccl.so.2", "data-parallel training on cuda needs NCCL"));
//   CASTOR_RETURN_IF_ERROR(nccl.Resolve("ncclGetVersion", &get_version));
//
// Errors are FailedPrecondition and read "<needed for> (<file>): <why>".
// A library once opened stays loaded for the life of the process (GPU
// libraries must not be unloaded while handles into them may live).
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace castor {

class DynamicLibrary {
 public:
  // Opens `file` (dlopen's search: LD_LIBRARY_PATH, the caller's RUNPATH,
  // the system's cache); `needed_for` says what asked for it, e.g.
  // "data-parallel training on cuda needs NCCL".
  static absl::StatusOr<DynamicLibrary> Open(const std::string& file,
                                             const std::string& needed_for);

  // Sets `*function` to the library's function `name`; FailedPrecondition
  // naming it when the library has none (an older version, say).
  template <typename Function>
  absl::Status Resolve(const char* name, Function* function) const {
    absl::StatusOr<void*> address = Find(name);
    if (!address.ok()) return address.status();
    *function = reinterpret_cast<Function>(*address);
    return absl::OkStatus();
  }

  const std::string& file() const { return file_; }

 private:
  DynamicLibrary(void* handle, std::string file, std::string needed_for)
      : handle_(handle), file_(std::move(file)), needed_for_(std::move(needed_for)) {}
  absl::StatusOr<void*> Find(const char* name) const;

  void* handle_;
  std::string file_;
  std::string needed_for_;
};

}  // namespace castor
