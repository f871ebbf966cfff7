// Helpers the fuzz targets share (tests/fuzz/README.md): most of castor's
// readers take a path, so a target writes the input to a file in a private
// scratch directory made once per process, and stops the process when an
// invariant of castor's own breaks (a crash is what the fuzzer reports).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace castor::fuzz {

// The process's scratch directory ($TMPDIR, else /dev/shm or /tmp; castor-fuzz-XXXXXX),
// created on first use and removed at exit.
const std::string& ScratchDir();

// Writes `bytes` to ScratchDir()/`name` (replacing it) and returns the path;
// aborts when the file cannot be written (the harness is broken, not castor).
std::string WriteScratchFile(const std::string& name, std::string_view bytes);

inline std::string_view AsBytes(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// A broken invariant: prints what broke and aborts, so libFuzzer (or the
// replay driver) records the input as a finding.
[[noreturn]] inline void Finding(const std::string& what) {
  std::fprintf(stderr, "castor fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace castor::fuzz
