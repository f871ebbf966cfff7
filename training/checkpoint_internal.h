// What the three parts of the checkpoint code share (not part of the API):
// checkpoint_format.cc (the file format: digests, state JSON, write, read),
// checkpoint_checks.cc (consistency and policy checks) and checkpoint_dir.cc
// (checkpoint directories and the leftovers of interrupted writes).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "training/checkpoint.h"

namespace castor::training::checkpoint_internal {

using Record = std::vector<std::pair<std::string, std::string>>;

// "'s'".
std::string Quoted(const std::string& s);
// "[2,3]".
std::string DimsText(const std::vector<int64_t>& dims);
// The directory of `path` ("." for a bare name) and its file name.
std::string DirectoryOf(const std::string& path);
std::string FileNameOf(const std::string& path);

// Whether `key` is a castor.checkpoint.* record key.
bool IsRecordKey(const std::string& key);
// The record digest: every record entry but the digest itself, by key.
std::string RecordDigest(const Record& record);
// The value of `key` in `record`; nullptr when absent.
const std::string* FindEntry(const Record& record, const std::string& key);

// The in-memory checks of FindCheckpointInconsistencies (checkpoint_checks.cc),
// which WriteCheckpoint also runs.
void CheckStateAgainstGraph(const Checkpoint& checkpoint, std::vector<std::string>& problems);

// checkpoint_dir.cc: temporary files castor's atomic writers leave when
// killed ("<name>.tmp.XXXXXX", "<name>.<hex>.data.tmp.XXXXXX"), data files
// ("<name>.<16 hex>.data"), the regular files of `dir`, and their removal.
bool IsStaleTempOf(const std::string& file, const std::string& name);
bool IsDataFileOf(const std::string& file, const std::string& name);
std::vector<std::string> FilesInDirectory(const std::string& dir);
// Removes `name`'s stale temporary files in `dir` (when `remove_temps`) and
// its data files other than `keep_data` (when `remove_data`; "" keeps none).
void RemoveLeftovers(const std::string& dir, const std::string& name, bool remove_temps,
                     bool remove_data, const std::string& keep_data);

}  // namespace castor::training::checkpoint_internal
