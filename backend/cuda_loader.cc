// The entry points of backend/cuda_backend.h and backend/cuda_probe.h as the
// rest of castor calls them. The CUDA backend itself is a module,
// libcastor_cuda.so (backend/cuda_module.h), that this file opens on first
// use:
//  - ProbeCuda and CreateCudaBackend first ask the NVIDIA driver
//    (libcuda.so.1) whether there is a device at all, and open the module
//    only then, so a machine without a GPU never maps cuBLAS, cuBLASLt and
//    cuDNN;
//  - CudaKernelTable opens it regardless: the table is host-side, and tools
//    check graphs against it without a GPU; so does
//    LoadCudaCollectivesLibrary (the module opens NCCL, which needs none).
// The module is looked for in the running executable's own directory only
// (the build tree links it into tests/ and bench/ too), and must come from
// the same build directory (CASTOR_BUILD_ID). It is never closed once in
// use: CUDA libraries must not be unloaded while their handles may live.
//
// Builds without the CUDA backend (CASTOR_CUDA_MODULE_FILE undefined: no
// nvcc, CASTOR_CUDA=OFF, Bazel) answer from every entry point that it was
// not built.
#include <dlfcn.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "backend/cuda_backend.h"
#include "backend/cuda_module.h"
#include "backend/cuda_probe.h"
#include "graph/status.h"
#include "graph/version.h"

namespace castor {

namespace {

#ifdef CASTOR_CUDA_MODULE_FILE
constexpr const char* kModuleFile = CASTOR_CUDA_MODULE_FILE;
constexpr const char* kBuildId = CASTOR_BUILD_ID;
#else
constexpr const char* kModuleFile = nullptr;
constexpr const char* kBuildId = "";
#endif
constexpr const char* kNotBuilt = "castor was built without the CUDA backend";

// The module once OpenModule succeeded (CudaMemoryStats must not open it).
std::atomic<const CudaModule*> opened_module{nullptr};

// Where the module is: beside the running executable (its real path).
// Only looks; opening is LoadModule's.
absl::StatusOr<std::string> FindModule() {
  if (kModuleFile == nullptr) return absl::FailedPreconditionError(kNotBuilt);
  static const absl::StatusOr<std::string> found = []() -> absl::StatusOr<std::string> {
    std::error_code error;
    const std::filesystem::path executable = std::filesystem::read_symlink("/proc/self/exe", error);
    if (error) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot find the CUDA backend module ", kModuleFile,
          ": the running executable's path is unknown (/proc/self/exe: ", error.message(), ")"));
    }
    const std::filesystem::path path = executable.parent_path() / kModuleFile;
    if (!std::filesystem::exists(path, error)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the CUDA backend module ", kModuleFile, " is missing (looked for ", path.string(), ")"));
    }
    return path.string();
  }();
  return found;
}

absl::StatusOr<const CudaModule*> LoadModule() {
  CASTOR_ASSIGN_OR_RETURN(const std::string path, FindModule());
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load the CUDA backend module ", path, ": ", dlerror()));
  }
  auto refuse = [handle](std::string why) {
    dlclose(handle);  // nothing of it was used
    return absl::FailedPreconditionError(std::move(why));
  };
  using Entry = const CudaModule* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, CASTOR_CUDA_MODULE_ENTRY));
  if (entry == nullptr) {
    return refuse(absl::StrCat(path, " is not a castor CUDA backend module (no ",
                               CASTOR_CUDA_MODULE_ENTRY, ")"));
  }
  const CudaModule* module = entry();
  if (module->abi_version != kCudaModuleAbiVersion ||
      std::string(module->castor_version) != CASTOR_VERSION_STRING ||
      std::string(module->build_id) != kBuildId) {
    return refuse(absl::StrCat(
        "the CUDA backend module ", path, " is from another build (castor ", module->castor_version,
        ", module ABI ", module->abi_version, ", build ", module->build_id, "; this is castor ",
        CASTOR_VERSION_STRING, ", ABI ", kCudaModuleAbiVersion, ", build ", kBuildId,
        "): copy castor and its module from the same build directory"));
  }
  return module;
}

// The module, opened on the first call (and the same answer ever after).
absl::StatusOr<const CudaModule*> OpenModule() {
  static const absl::StatusOr<const CudaModule*> module = [] {
    absl::StatusOr<const CudaModule*> loaded = LoadModule();
    if (loaded.ok()) opened_module.store(*loaded);
    return loaded;
  }();
  return module;
}

// OK when the NVIDIA driver is installed and reports at least one device;
// otherwise why not, in the driver's words. Asks the driver API directly
// (cuInit, cuDeviceGetCount), which costs a few MiB, not the module's
// libraries. The driver is left loaded: the CUDA runtime uses it next.
absl::Status DriverHasADevice() {
  static const absl::Status status = []() -> absl::Status {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("no NVIDIA driver: ", dlerror()));
    }
    // CUresult is an int-sized enum; 0 is CUDA_SUCCESS.
    using CuInit = int (*)(unsigned int);
    using CuDeviceGetCount = int (*)(int*);
    using CuGetErrorString = int (*)(int, const char**);
    auto init = reinterpret_cast<CuInit>(dlsym(driver, "cuInit"));
    auto device_count = reinterpret_cast<CuDeviceGetCount>(dlsym(driver, "cuDeviceGetCount"));
    auto error_string = reinterpret_cast<CuGetErrorString>(dlsym(driver, "cuGetErrorString"));
    if (init == nullptr || device_count == nullptr || error_string == nullptr) {
      return absl::FailedPreconditionError(
          "the NVIDIA driver's libcuda.so.1 lacks cuInit, cuDeviceGetCount or cuGetErrorString");
    }
    auto describe = [&](const char* call, int result) {
      const char* text = nullptr;
      if (error_string(result, &text) != 0 || text == nullptr) text = "unknown error";
      return absl::FailedPreconditionError(
          absl::StrCat(text, " (", call, " returned ", result, ")"));
    };
    if (int result = init(0); result != 0) return describe("cuInit", result);
    int count = 0;
    if (int result = device_count(&count); result != 0) return describe("cuDeviceGetCount", result);
    if (count == 0) return absl::FailedPreconditionError("no CUDA device");
    return absl::OkStatus();
  }();
  return status;
}

// The module, for work on a device: found, a device reported by the
// driver, then opened (in that order, so every caller gives the same
// reason for the same machine).
absl::StatusOr<const CudaModule*> ModuleForADevice() {
  CASTOR_RETURN_IF_ERROR(FindModule().status());
  CASTOR_RETURN_IF_ERROR(DriverHasADevice());
  return OpenModule();
}

}  // namespace

CudaProbe ProbeCuda() {
  CudaProbe probe;
  probe.compiled = kModuleFile != nullptr;
  if (absl::StatusOr<std::string> found = FindModule(); found.ok()) probe.module_path = *found;
  absl::StatusOr<const CudaModule*> module = ModuleForADevice();
  if (!module.ok()) {
    probe.reason = std::string(module.status().message());
    return probe;
  }
  CudaProbe devices = (*module)->probe();
  devices.module_path = probe.module_path;
  return devices;
}

bool CudaBackendCompiled() { return kModuleFile != nullptr; }

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  CASTOR_ASSIGN_OR_RETURN(const CudaModule* module, ModuleForADevice());
  return module->create_backend(options);
}

absl::StatusOr<const KernelTable*> CudaKernelTable() {
  absl::StatusOr<const CudaModule*> module = OpenModule();
  if (!module.ok()) return module.status();
  return (*module)->kernel_table();
}

absl::StatusOr<std::string> LoadCudaCollectivesLibrary(const std::string& file) {
  CASTOR_ASSIGN_OR_RETURN(const CudaModule* module, OpenModule());
  return module->load_collectives_library(file);
}

absl::StatusOr<DeviceMemoryStats> CudaMemoryStats(const Backend& backend) {
  const CudaModule* module = opened_module.load();
  if (module == nullptr) {
    // No CUDA backend can exist before the module is open.
    return absl::InvalidArgumentError(absl::StrCat(
        "backend '", backend.name(), "' is not a CUDA backend (",
        kModuleFile == nullptr ? kNotBuilt : "the CUDA backend module is not loaded", ")"));
  }
  return module->memory_stats(backend);
}

}  // namespace castor
