// The main() a fuzz target links with in the ordinary (g++) build, where
// there is no libFuzzer: it replays corpora through LLVMFuzzerTestOneInput,
// so ctest checks every seed and every recorded finding on each build (and
// under ASan/UBSan in the sanitizer build).
//
//   fuzz_npy [--mutations N] [--seed S] [--only-mutant K] PATH...
//
// PATH is a file or a directory (all regular files below it, in name order).
// With --mutations N it then runs N deterministic mutants (bit flips, byte
// overwrites with interesting values, truncations, duplicated or deleted
// ranges; a seeded std::mt19937_64, so a run is reproducible) of the inputs
// in turn. A mutant that crashes the target (SIGABRT, SIGSEGV, SIGFPE,
// SIGBUS, SIGILL) is written to fuzz-crash-mutant (in
// $TEST_UNDECLARED_OUTPUTS_DIR under Bazel, else the working directory).
// --only-mutant K runs mutant K alone (0-based; the same bytes as in a run of
// more than K mutants) after writing it to fuzz-mutant-K: to find the one
// that is slow or hungry. Prints one summary line; exit 0 when every input
// returned, 2 on a usage error or an unreadable path.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool ReadFile(const std::filesystem::path& path, std::string& bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

// Regular files of `path` (itself, or those below it in name order).
bool CollectInputs(const std::filesystem::path& path, std::vector<std::filesystem::path>& files) {
  std::error_code error;
  if (std::filesystem::is_regular_file(path, error)) {
    files.push_back(path);
    return true;
  }
  if (!std::filesystem::is_directory(path, error)) return false;
  std::vector<std::filesystem::path> found;
  for (std::filesystem::recursive_directory_iterator it(path, error), end; !error && it != end;
       it.increment(error)) {
    if (it->is_regular_file(error)) found.push_back(it->path());
  }
  if (error) return false;
  std::sort(found.begin(), found.end());
  files.insert(files.end(), found.begin(), found.end());
  return true;
}

// One mutation of `bytes` in place, in the spirit of libFuzzer's own.
void Mutate(std::string& bytes, std::mt19937_64& rng) {
  static constexpr uint64_t kInteresting[] = {0,          1,          0x7f,       0x80,
                                              0xff,       0x7fff,     0x8000,     0xffff,
                                              0x7fffffff, 0x80000000, 0xffffffff, ~0ull};
  auto pick = [&rng](uint64_t n) { return n == 0 ? 0 : rng() % n; };
  switch (pick(6)) {
    case 0:  // flip one bit
      if (!bytes.empty()) bytes[pick(bytes.size())] ^= static_cast<char>(1u << pick(8));
      break;
    case 1: {  // overwrite 1, 2, 4 or 8 bytes with an interesting value
      const size_t width = size_t{1} << pick(4);
      if (bytes.size() < width) break;
      const uint64_t value = kInteresting[pick(std::size(kInteresting))];
      const size_t at = pick(bytes.size() - width + 1);
      for (size_t i = 0; i < width; ++i) bytes[at + i] = static_cast<char>(value >> (8 * i));
      break;
    }
    case 2:  // truncate
      bytes.resize(pick(bytes.size() + 1));
      break;
    case 3: {  // delete a range
      if (bytes.empty()) break;
      const size_t at = pick(bytes.size());
      bytes.erase(at, 1 + pick(std::min<size_t>(bytes.size() - at, 64)));
      break;
    }
    case 4: {  // duplicate a range
      if (bytes.empty() || bytes.size() > (1u << 20)) break;
      const size_t at = pick(bytes.size());
      const std::string range = bytes.substr(at, 1 + pick(64));
      bytes.insert(pick(bytes.size() + 1), range);
      break;
    }
    default:  // a random byte
      if (!bytes.empty()) bytes[pick(bytes.size())] = static_cast<char>(rng());
      break;
  }
}

// The mutant being run and where a crash writes it (read by the handler).
const std::string* g_current_mutant = nullptr;
char g_crash_path[4096];

void WriteMutantAndDie(int signal_number) {
  if (g_current_mutant != nullptr) {
    const int fd = open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      const char* data = g_current_mutant->data();
      size_t left = g_current_mutant->size();
      while (left > 0) {
        const ssize_t wrote = write(fd, data, left);
        if (wrote <= 0) break;
        data += wrote;
        left -= static_cast<size_t>(wrote);
      }
      close(fd);
      static constexpr char kNote[] = "replay: the crashing mutant is in fuzz-crash-mutant\n";
      (void)!write(STDERR_FILENO, kNote, sizeof(kNote) - 1);
    }
  }
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

int Run(const std::string& bytes) {
  return LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mutations = 0;
  int64_t only_mutant = -1;
  uint64_t seed = 1;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--mutations" || arg == "--seed" || arg == "--only-mutant") && i + 1 < argc) {
      char* end = nullptr;
      const long long value = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0' || value < 0) {
        std::fprintf(stderr, "%s: %s expects a non-negative integer, got '%s'\n", argv[0],
                     arg.c_str(), argv[i]);
        return 2;
      }
      if (arg == "--mutations") {
        mutations = value;
      } else if (arg == "--only-mutant") {
        only_mutant = value;
      } else {
        seed = static_cast<uint64_t>(value);
      }
    } else if (!CollectInputs(arg, files)) {
      std::fprintf(stderr, "%s: %s is neither a readable file nor a directory\n", argv[0],
                   arg.c_str());
      return 2;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s [--mutations N] [--seed S] [--only-mutant K] FILE_OR_DIR...\n",
                 argv[0]);
    return 2;
  }

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> inputs;
  for (const std::filesystem::path& file : files) {
    std::string bytes;
    if (!ReadFile(file, bytes)) {
      std::fprintf(stderr, "%s: cannot read %s\n", argv[0], file.c_str());
      return 2;
    }
    Run(bytes);
    inputs.push_back(std::move(bytes));
  }
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string crash_path =
      (std::filesystem::path(outputs != nullptr && *outputs ? outputs : ".") / "fuzz-crash-mutant")
          .string();
  std::snprintf(g_crash_path, sizeof(g_crash_path), "%s", crash_path.c_str());
  for (int signal_number : {SIGABRT, SIGSEGV, SIGFPE, SIGBUS, SIGILL}) {
    std::signal(signal_number, WriteMutantAndDie);
  }
  std::mt19937_64 rng(seed);
  if (only_mutant >= 0) mutations = only_mutant + 1;
  for (int64_t i = 0; i < mutations; ++i) {
    std::string mutant = inputs[static_cast<size_t>(i) % inputs.size()];
    const int rounds = 1 + static_cast<int>(rng() % 4);
    for (int r = 0; r < rounds; ++r) Mutate(mutant, rng);
    if (only_mutant >= 0 && i != only_mutant) continue;
    if (only_mutant >= 0) {
      std::ofstream kept("fuzz-mutant-" + std::to_string(i), std::ios::binary | std::ios::trunc);
      kept.write(mutant.data(), static_cast<std::streamsize>(mutant.size()));
    }
    g_current_mutant = &mutant;
    Run(mutant);
    g_current_mutant = nullptr;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: replayed %zu inputs and %lld mutants (seed %llu) in %.2f s, no crash\n",
              argv[0], inputs.size(), static_cast<long long>(mutations),
              static_cast<unsigned long long>(seed), seconds);
  return 0;
}
