// Scratch files for the fuzz targets (fuzz_util.h).
#include "tests/fuzz/fuzz_util.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

namespace castor::fuzz {
namespace {

// Reachable for the process's lifetime (kept from static destruction so that
// the atexit handler can still read it).
const std::string* MakeScratchDir() {
  // Memory-backed /dev/shm when there is one: a target writes every input.
  const char* tmp = std::getenv("TMPDIR");
  std::error_code error;
  const std::string base = tmp != nullptr && *tmp                           ? tmp
                           : std::filesystem::is_directory("/dev/shm", error) ? "/dev/shm"
                                                                               : "/tmp";
  std::string pattern = base + "/castor-fuzz-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {
    std::perror("castor fuzz: mkdtemp");
    std::abort();
  }
  return new std::string(buffer.data());
}

void RemoveScratchDir() {
  std::error_code ignored;
  std::filesystem::remove_all(ScratchDir(), ignored);
}

}  // namespace

const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const std::string* made = MakeScratchDir();
    std::atexit(RemoveScratchDir);
    return made;
  }();
  return *dir;
}

std::string WriteScratchFile(const std::string& name, std::string_view bytes) {
  const std::string path = ScratchDir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "castor fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

}  // namespace castor::fuzz
