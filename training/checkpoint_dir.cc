// Checkpoint directories (see checkpoint.h): ckpt-<step>.onnx names, listing
// them by step, saving into a directory and pruning older checkpoints, and
// finding the newest usable one to resume from; and the cleanup of what an
// interrupted write leaves (temporary and unreferenced data files), which
// WriteCheckpoint shares.
#include "training/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/status.h"
#include "training/checkpoint_internal.h"

namespace castor::training {
namespace checkpoint_internal {

namespace fs = std::filesystem;

bool IsStaleTempOf(const std::string& file, const std::string& name) {
  static const std::regex kTempSuffix(R"((\.[0-9a-f]{16}\.data)?\.tmp\.[A-Za-z0-9]{6})");
  return file.size() > name.size() && file.compare(0, name.size(), name) == 0 &&
         std::regex_match(file.substr(name.size()), kTempSuffix);
}

bool IsDataFileOf(const std::string& file, const std::string& name) {
  static const std::regex kDataSuffix(R"(\.[0-9a-f]{16}\.data)");
  return file.size() > name.size() && file.compare(0, name.size(), name) == 0 &&
         std::regex_match(file.substr(name.size()), kDataSuffix);
}

std::vector<std::string> FilesInDirectory(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    std::error_code type_error;
    if (entry.is_regular_file(type_error)) names.push_back(entry.path().filename().string());
  }
  return names;
}

void RemoveLeftovers(const std::string& dir, const std::string& name, bool remove_temps,
                     bool remove_data, const std::string& keep_data) {
  for (const std::string& file : FilesInDirectory(dir)) {
    const bool temp = remove_temps && IsStaleTempOf(file, name);
    const bool data = remove_data && file != keep_data && IsDataFileOf(file, name);
    if (temp || data) {
      std::error_code ignored;
      fs::remove(fs::path(dir) / file, ignored);
    }
  }
}

}  // namespace checkpoint_internal

namespace fs = std::filesystem;
using namespace checkpoint_internal;

std::string CheckpointFileName(int64_t step) {
  std::string digits = std::to_string(step);
  if (digits.size() < 8) digits.insert(0, 8 - digits.size(), '0');
  return absl::StrCat("ckpt-", digits, ".onnx");
}

absl::StatusOr<std::vector<CheckpointFile>> ListCheckpoints(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  }
  static const std::regex kName(R"(ckpt-([0-9]{8,18})\.onnx)");
  std::vector<CheckpointFile> files;
  for (const std::string& file : FilesInDirectory(dir)) {
    std::smatch match;
    if (!std::regex_match(file, match, kName)) continue;
    int64_t step = 0;
    if (!absl::SimpleAtoi(match[1].str(), &step)) continue;
    files.push_back({step, (fs::path(dir) / file).string()});
  }
  std::sort(files.begin(), files.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return files;
}

absl::StatusOr<SavedCheckpoint> SaveToCheckpointDir(const std::string& dir,
                                                    const Checkpoint& checkpoint, int64_t keep_last,
                                                    const CheckpointWriteOptions& options) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create checkpoint directory ", dir, ": ", error.message()));
  }
  SavedCheckpoint saved;
  const std::string path = (fs::path(dir) / CheckpointFileName(checkpoint.state.step)).string();
  CASTOR_ASSIGN_OR_RETURN(saved.written, WriteCheckpoint(checkpoint, path, options));
  CASTOR_ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpoints(dir));
  if (keep_last > 0 && static_cast<int64_t>(files.size()) > keep_last) {
    const size_t remove_count = files.size() - static_cast<size_t>(keep_last);
    for (size_t k = 0; k < remove_count; ++k) {
      if (files[k].path == path) continue;  // never the one just written
      std::error_code remove_error;
      if (fs::remove(files[k].path, remove_error)) saved.removed.push_back(files[k].path);
      // Its data files (removed even if the model file was already gone).
      RemoveLeftovers(dir, FileNameOf(files[k].path), true, true, "");
    }
  }
  RemoveInterruptedWrites(dir);
  return saved;
}

std::vector<std::string> RemoveInterruptedWrites(const std::string& dir) {
  // Leftovers of checkpoints no longer present: data files, temporary files.
  static const std::regex kOwnFile(R"((ckpt-[0-9]{8,18}\.onnx)\..+)");
  std::vector<std::string> removed;
  for (const std::string& file : FilesInDirectory(dir)) {
    std::smatch match;
    if (!std::regex_match(file, match, kOwnFile)) continue;
    const std::string base = match[1].str();
    std::error_code error;
    const bool base_exists = fs::exists(fs::path(dir) / base, error);
    if ((IsStaleTempOf(file, base)) || (!base_exists && IsDataFileOf(file, base))) {
      std::error_code remove_error;
      if (fs::remove(fs::path(dir) / file, remove_error)) removed.push_back(file);
    }
  }
  return removed;
}

absl::Status MoveCheckpointAside(const std::string& path) {
  const std::string aside = path + kMovedAsideSuffix;
  std::error_code error;
  fs::rename(path, aside, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot move ", path, " aside to ", aside, ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<FoundCheckpoint> FindLatestCheckpoint(const std::string& dir_or_file) {
  std::error_code error;
  auto read_and_check = [](const std::string& path) -> absl::StatusOr<Checkpoint> {
    CASTOR_ASSIGN_OR_RETURN(Checkpoint checkpoint, ReadCheckpoint(path));
    std::vector<std::string> problems = FindCheckpointInconsistencies(checkpoint);
    if (!problems.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": inconsistent checkpoint: ", absl::StrJoin(problems, "; ")));
    }
    return checkpoint;
  };
  if (!fs::is_directory(dir_or_file, error)) {
    CASTOR_ASSIGN_OR_RETURN(Checkpoint checkpoint, read_and_check(dir_or_file));
    FoundCheckpoint found(std::move(checkpoint));
    found.path = dir_or_file;
    return found;
  }
  CASTOR_ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpoints(dir_or_file));
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(dir_or_file,
                                            ": no checkpoint (ckpt-<step>.onnx) in "
                                            "this directory"));
  }
  std::vector<std::string> skipped, skipped_paths;
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    absl::StatusOr<Checkpoint> checkpoint = read_and_check(it->path);
    if (!checkpoint.ok()) {
      skipped.push_back(std::string(checkpoint.status().message()));
      skipped_paths.push_back(it->path);
      continue;
    }
    FoundCheckpoint found(std::move(checkpoint).value());
    found.path = it->path;
    found.skipped = std::move(skipped);
    found.skipped_paths = std::move(skipped_paths);
    return found;
  }
  return absl::DataLossError(
      absl::StrCat(dir_or_file, ": none of its ", files.size(),
                   " checkpoints is usable: ", absl::StrJoin(skipped, "; ")));
}

}  // namespace castor::training
