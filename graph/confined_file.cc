// OpenConfinedFile (see confined_file.h): lexical checks, then the
// canonical path against the canonical directory, then open + fstat.
#include "graph/confined_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace castor {
namespace {

absl::Status ErrnoError(int error_number, const std::string& message) {
  return absl::Status(absl::ErrnoToStatusCode(error_number),
                      absl::StrCat(message, ": ", std::strerror(error_number)));
}

}  // namespace

absl::StatusOr<ConfinedFile> OpenConfinedFile(const std::string& base_dir,
                                              const std::string& location,
                                              const std::string& what) {
  const std::filesystem::path relative(location);
  bool escapes = relative.is_absolute() || location.empty();
  for (const std::filesystem::path& part : relative) escapes = escapes || part == "..";
  if (escapes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " location '", location,
        "' must be a relative path inside the model's directory (no absolute path, no '..')"));
  }
  ConfinedFile file;
  file.path = base_dir.empty() ? location : (std::filesystem::path(base_dir) / location).string();
  // A symlink on the way (a directory `etc -> /etc` beside the model) must
  // not lead outside the model's directory either.
  std::error_code error;
  const std::filesystem::path resolved = std::filesystem::canonical(file.path, error);
  if (error) {
    if (error == std::errc::no_such_file_or_directory) {
      return absl::NotFoundError(absl::StrCat(what, " file ", file.path, " does not exist"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot resolve ", file.path, ": ", error.message()));
  }
  const std::filesystem::path directory =
      std::filesystem::canonical(base_dir.empty() ? "." : base_dir, error);
  const std::filesystem::path inside = resolved.lexically_relative(directory);
  if (error || inside.empty() || *inside.begin() == "..") {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " location '", location, "' resolves to ", resolved.string(),
        ", outside the model's directory ", directory.string(), " (a symlink on the way?)"));
  }
  // O_NONBLOCK: a FIFO is refused below, never waited on.
  file.fd = open(resolved.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (file.fd < 0) {
    return ErrnoError(errno, absl::StrCat(what, ": cannot open ", file.path));
  }
  struct stat info;
  if (fstat(file.fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(file.fd);
    return absl::InvalidArgumentError(
        absl::StrCat(what, " file ", file.path, " is not a regular file"));
  }
  return file;
}

}  // namespace castor
