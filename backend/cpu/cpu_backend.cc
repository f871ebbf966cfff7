// CpuBackend (see cpu_backend.h).
#include "backend/cpu/cpu_backend.h"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/parallel.h"

namespace castor {

namespace {

// "12345", "512M", "24G" (binary units) -> bytes; -1 when malformed.
int64_t ParseByteCount(absl::string_view text) {
  int64_t scale = 1;
  if (!text.empty()) {
    switch (std::toupper(static_cast<unsigned char>(text.back()))) {
      case 'K': scale = int64_t{1} << 10; break;
      case 'M': scale = int64_t{1} << 20; break;
      case 'G': scale = int64_t{1} << 30; break;
      case 'T': scale = int64_t{1} << 40; break;
      default: break;
    }
    if (scale != 1) text.remove_suffix(1);
  }
  int64_t count = 0;
  if (!absl::SimpleAtoi(text, &count) || count <= 0 ||
      count > std::numeric_limits<int64_t>::max() / scale) {
    return -1;
  }
  return count * scale;
}

// MemAvailable from /proc/meminfo in bytes; 0 when it cannot be read.
int64_t MemAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string text; std::getline(meminfo, text);) {
    absl::string_view line = text;
    int64_t kib = 0;
    if (absl::ConsumePrefix(&line, "MemAvailable:") &&
        absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(line), "kB"), &kib)) {
      return kib * 1024;
    }
  }
  return 0;
}

std::string Bytes(int64_t bytes) {
  return bytes >= (int64_t{1} << 30)
             ? absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30))
             : absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

absl::Status CheckCpuThreadsFlag(int64_t threads) {
  if (threads < 0 || threads > kMaxCpuThreads) {
    return absl::InvalidArgumentError(absl::StrCat("--threads ", threads, ": expected 0 (all ",
                                                   std::thread::hardware_concurrency(),
                                                   " hardware threads) to ", kMaxCpuThreads));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DefaultCpuMemoryLimit() {
  if (const char* limit = std::getenv("CASTOR_MEMORY_LIMIT"); limit != nullptr && *limit) {
    const int64_t bytes = ParseByteCount(limit);
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CASTOR_MEMORY_LIMIT='", limit, "': expected a byte count such as 8G, 512M or 1000000"));
    }
    return bytes;
  }
  return MemAvailableBytes();
}

CpuBackend::CpuBackend(CpuBackendOptions options)
    : num_threads_(options.num_threads > 0
                       ? options.num_threads
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {
  cpu::SetNumThreads(num_threads_);
  if (options.memory_limit_bytes > 0) {
    memory_limit_bytes_ = options.memory_limit_bytes;
  } else {
    // A malformed CASTOR_MEMORY_LIMIT is reported by the commands, which
    // call DefaultCpuMemoryLimit first; here it means no budget.
    memory_limit_bytes_ = DefaultCpuMemoryLimit().value_or(0);
  }
}

absl::StatusOr<void*> CpuBackend::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes > std::numeric_limits<size_t>::max() / 2) {  // rounding up would wrap around
    return absl::ResourceExhaustedError(absl::StrCat("cpu: cannot allocate ", bytes, " bytes"));
  }
  const size_t rounded = (bytes + 63) / 64 * 64;
  std::lock_guard<std::mutex> lock(mutex_);
  if (memory_limit_bytes_ > 0 &&
      (rounded > static_cast<size_t>(memory_limit_bytes_) ||
       bytes_in_use_ > memory_limit_bytes_ - static_cast<int64_t>(rounded))) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cpu: ", bytes, " bytes (", Bytes(static_cast<int64_t>(bytes)),
        ") more would pass the memory budget of ", Bytes(memory_limit_bytes_), " (",
        Bytes(bytes_in_use_), " in use; the budget is the memory available at start, or "
        "CASTOR_MEMORY_LIMIT)"));
  }
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cpu: out of memory allocating ", bytes,
                                                     " bytes"));
  }
  bytes_in_use_ += static_cast<int64_t>(rounded);
  sizes_[p] = static_cast<int64_t>(rounded);
  return p;
}

void CpuBackend::Free(void* data) {
  if (data == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sizes_.find(data);
    if (it != sizes_.end()) {
      bytes_in_use_ -= it->second;
      sizes_.erase(it);
    }
  }
  std::free(data);
}

int64_t CpuBackend::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_in_use_;
}

absl::Status CpuBackend::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
  return absl::OkStatus();
}
absl::Status CpuBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
  return absl::OkStatus();
}
absl::Status CpuBackend::CopyWithin(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

const KernelTable& CpuBackend::kernels() const {
  static const KernelTable* table = [] {
    auto* t = new KernelTable();
    cpu::RegisterElementwiseKernels(*t);
    cpu::RegisterMatMulKernels(*t);
    cpu::RegisterEinsumKernels(*t);
    cpu::RegisterConvKernels(*t);
    cpu::RegisterConvGradKernels(*t);
    cpu::RegisterPoolKernels(*t);
    cpu::RegisterPoolGradKernels(*t);
    cpu::RegisterNormalizationKernels(*t);
    cpu::RegisterNormalizationGradKernels(*t);
    cpu::RegisterSoftmaxKernels(*t);
    cpu::RegisterLossKernels(*t);
    cpu::RegisterTrainingKernels(*t);
    cpu::RegisterReduceKernels(*t);
    cpu::RegisterShapeKernels(*t);
    cpu::RegisterDataMovementKernels(*t);
    cpu::RegisterResizeKernels(*t);
    cpu::RegisterMiscKernels(*t);
    return t;
  }();
  return *table;
}

}  // namespace castor
