// Files a model names (external data, a checkpoint's data file), opened
// only when they stay inside the model's directory: the confinement that
// the ONNX reader and the checkpoint reader share.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace castor {

// A file named by a model, opened for reading: `location` must be a
// relative path without '..' that resolves, symlinks followed, inside
// `base_dir` ("" : the current directory), to a regular file (a FIFO is
// refused, never waited on). Errors begin with `what` ("tensor 'w':
// external data"): "<what> location '...' must be a relative path ...",
// "<what> location '...' resolves to ..., outside the model's directory
// ...", "<what> file P does not exist", "<what> file P is not a regular
// file". The caller closes `fd`.
struct ConfinedFile {
  int fd = -1;
  std::string path;  // base_dir joined with location
};
absl::StatusOr<ConfinedFile> OpenConfinedFile(const std::string& base_dir,
                                              const std::string& location,
                                              const std::string& what);

}  // namespace castor
