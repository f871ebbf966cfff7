// Checkpoints (DESIGN.md "Checkpoints"; README "Checkpoints" documents every
// field): one ONNX file that ONNX Runtime runs for inference as it is, and
// that castor resumes training from exactly.
//
// A checkpoint file is a ModelProto:
//   graph             the original float32 model as the user gave it, its
//                     initializers holding the trained float32 master weights
//                     and BatchNormalization running statistics
//   training_info[0]  algorithm.initializer: the optimizer moments, one
//                     float32 tensor "castor.moment/<slot>/<parameter>" each
//                     (slot "m", "v" or "momentum"). The algorithm graph has
//                     no nodes (castor runs the step itself); ONNX calls the
//                     algorithm graph's initializers the training state, and
//                     inference tools (ONNX Runtime, onnx.checker) ignore it.
//   metadata_props    the castor.checkpoint.* record (keys below): format,
//                     castor version, the policy (name, dtypes, resolved op
//                     lists, overrides, pins, digest), the nodes kept
//                     float32, the training state JSON and two digests.
// Two digests, SHA-256:
//   data digest    the graph structure (the GraphProto without initializers
//                  and value_info, as castor serializes it), every stored
//                  tensor (graph initializers and moments: kind, name, dtype,
//                  dims, bytes; sorted) and the state JSON. Independent of
//                  where tensors are stored (inline or external). A mismatch
//                  is corruption: ReadCheckpoint fails with DataLoss.
//   record digest  every castor.checkpoint.* entry but itself (key, value;
//                  sorted by key; it covers the data digest), so the policy
//                  record cannot be edited on its own. A mismatch, like a
//                  policy record that disagrees with itself, is an
//                  inconsistency (FindCheckpointInconsistencies), not
//                  corruption.
// Digests catch truncation, bit flips and edits; they are not signatures:
// whoever rewrites the file and recomputes every digest is not caught.
//
// Writing is atomic (temporary file in the same directory, fsync, rename,
// fsync the directory; WriteFileAtomically): a crash at any moment leaves
// the previous file or the new one, never a mix. Stale temporary files of
// the same path (from a writer that was killed) are removed by the next
// write. One writer per path (per directory for SaveToCheckpointDir).
//
// External data: when the checkpoint would serialize to more than the
// threshold (2 GB by default; protobuf cannot hold more), every tensor of
// 1 KiB or more goes to ONE data file beside it, named
// "<file name>.<16 hex digits of the data digest>.data" (ONNX external data
// fields: location, offset, length; offsets aligned to 4 KiB). The data file
// is written atomically before the model file; data files of older writes of
// the same path are removed after the rename.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/json.h"
#include "graph/tensor.h"
#include "training/optimizer.h"
#include "passes/policy.h"

namespace castor::training {

// The format version this castor writes and reads.
inline constexpr const char* kCheckpointFormat = "castor.checkpoint/1";

// Model metadata keys of the checkpoint record.
inline constexpr const char* kCheckpointFormatKey = "castor.checkpoint.format";
inline constexpr const char* kCheckpointCastorVersionKey = "castor.checkpoint.castor_version";
inline constexpr const char* kCheckpointPolicyNameKey = "castor.checkpoint.policy_name";
inline constexpr const char* kCheckpointPolicyDigestKey = "castor.checkpoint.policy_digest";
inline constexpr const char* kCheckpointPolicyKey = "castor.checkpoint.policy";  // compact JSON
inline constexpr const char* kCheckpointComputeDTypeKey = "castor.checkpoint.compute_dtype";
inline constexpr const char* kCheckpointVariableDTypeKey = "castor.checkpoint.variable_dtype";
// JSON array of node names, graph order.
inline constexpr const char* kCheckpointKeptFloat32Key = "castor.checkpoint.kept_float32_nodes";
inline constexpr const char* kCheckpointStateKey = "castor.checkpoint.state";  // compact JSON
// The data file name; absent when every tensor is inline.
inline constexpr const char* kCheckpointExternalDataKey = "castor.checkpoint.external_data";
inline constexpr const char* kCheckpointDataDigestKey = "castor.checkpoint.data_digest";
inline constexpr const char* kCheckpointRecordDigestKey = "castor.checkpoint.record_digest";
// Prefix of every record key (the record digest covers all of them).
inline constexpr const char* kCheckpointKeyPrefix = "castor.checkpoint.";
// Name prefix of the moment tensors in training_info[0].algorithm.
inline constexpr const char* kMomentTensorPrefix = "castor.moment/";

// Everything a resumed run needs besides the weights. Plain data: the
// trainer fills it and restores from it. Everything but `moments` is stored
// as the state JSON (TrainingStateToJson).
struct TrainingState {
  // Counters.
  int64_t step = 0;            // trainer steps taken, skipped ones included
  int64_t optimizer_step = 0;  // updates applied (Optimizer::step(): Adam's t, the LR step)

  // Data order (BatchIterator): the next batch starts at sample `position`
  // of epoch `epoch`'s order. Epoch e is shuffled by mt19937_64(seed + e),
  // so (seed, epoch, position) is the whole RNG state of the data order.
  int64_t epoch = 0;
  int64_t position = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;
  int64_t batch_size = 0;
  int64_t dataset_size = 0;  // samples in the training split (0: not recorded)
  std::string data;          // the --data argument ("" : not recorded)

  // The training graph (TrainingGraphOptions and the train flags).
  std::string loss;    // "cross-entropy", "mse" or "output" (ParseLossKind)
  std::string output;  // the model output the loss is attached to
  std::string input;   // the model input the images feed ("" = its only input)
  // Trained float32 initializers (TrainingGraph::gradients order) and the
  // BatchNormalization running statistics (TrainingGraph::running_stats).
  std::vector<std::string> parameters;
  std::vector<std::string> running_stats;

  OptimizerOptions optimizer;
  LrSchedule lr_schedule;
  Json loss_scaler;  // LossScaler::ToJson(); null when not recorded

  // Free-form additions (an object), stored in the state JSON under "extra"
  // and covered by the data digest.
  Json extra = Json::Object();

  // Optimizer::state(): parameter -> slot ("m", "v", "momentum") -> float32
  // tensor shaped like the parameter. Stored in training_info.
  std::map<std::string, std::map<std::string, Tensor>> moments;
};

struct Checkpoint {
  explicit Checkpoint(Policy policy) : policy(std::move(policy)) {}

  // The original float32 graph (no autocast records; StripAutocast a
  // converted one), its initializers replaced by the trained master weights
  // and running statistics (SetInitializers). Its own metadata_props are
  // kept; castor.checkpoint.* entries are the record's and are removed from
  // it by ReadCheckpoint.
  Model model;
  // The policy the run trains under.
  Policy policy;
  TrainingState state;

  // Filled by ReadCheckpoint; WriteCheckpoint computes and records them
  // itself (what the struct holds is ignored there).
  std::vector<std::string> kept_float32_nodes;  // as recorded
  std::string castor_version;                   // of the writer
  std::string external_data_file;               // path of the data file; "" when inline
  // The castor.checkpoint.* entries as read, in file order (empty for a
  // checkpoint built in memory).
  std::vector<std::pair<std::string, std::string>> record;
};

struct CheckpointWriteOptions {
  // Tensors go to an external data file when the file would be larger.
  int64_t external_data_threshold_bytes = 2'000'000'000;
};

// What WriteCheckpoint wrote.
struct WrittenCheckpoint {
  std::string path;
  std::string external_data_path;  // "" when inline
  int64_t file_bytes = 0;
  int64_t external_data_bytes = 0;
  std::string data_digest;  // "sha256:<hex>"
};

// The value of a castor.checkpoint.* entry as read (nullptr when absent).
const std::string* FindCheckpointRecord(const Checkpoint& checkpoint, const std::string& key);

// --- building a checkpoint ---------------------------------------------------

// Replaces the data of existing initializers by name (the trainer's float32
// masters and running statistics). Errors name the initializer: missing in
// the model, or a dtype/dims that differ from the model's.
absl::Status SetInitializers(Model& model, const std::map<std::string, Tensor>& values);

// The nodes of the float32 `model` that autocast under `policy` keeps in
// float32 (castor.autocast.dtype float32 on a copy), in graph order; Casts
// the pass inserts are not listed. As the training graph computes them
// (AutocastOptions::training_graph_ops: a Conv below opset 22 computes in
// bfloat16 as com.castor Conv).
absl::StatusOr<std::vector<std::string>> KeptFloat32Nodes(const Model& model, const Policy& policy);
// The same with training_graph_ops as given (false: as a converted file
// computes them, and as checkpoints written before the training forms
// recorded them).
absl::StatusOr<std::vector<std::string>> KeptFloat32NodesOfGraph(const Model& model,
                                                                 const Policy& policy,
                                                                 bool training_graph_ops);

// The state JSON (no tensors; "moments" lists the moment tensor names) and
// its inverse. FromJson errors name `source` and the field.
Json TrainingStateToJson(const TrainingState& state);
absl::StatusOr<TrainingState> TrainingStateFromJson(const Json& json, const std::string& source);
Json OptimizerOptionsToJson(const OptimizerOptions& options);
absl::StatusOr<OptimizerOptions> OptimizerOptionsFromJson(const Json& json,
                                                          const std::string& source);
Json LrScheduleToJson(const LrSchedule& schedule);
absl::StatusOr<LrSchedule> LrScheduleFromJson(const Json& json, const std::string& source);

// "castor.moment/m/fc1.weight"; ParseMomentTensorName is its inverse (false
// for other names).
std::string MomentTensorName(const std::string& parameter, const std::string& slot);
bool ParseMomentTensorName(const std::string& name, std::string* parameter, std::string* slot);

// The record digest over the castor.checkpoint.* entries of `record`
// (other entries and the record-digest entry itself are left out):
// "sha256:<hex>".
std::string CheckpointRecordDigest(const std::vector<std::pair<std::string, std::string>>& record);

// --- one file ----------------------------------------------------------------

// Checks the model and the state against the graph (the in-memory checks of
// FindCheckpointInconsistencies; a `record` left from ReadCheckpoint is
// ignored and written anew; on failure InvalidArgument listing what is
// wrong, and nothing is written) and writes the checkpoint atomically as
// described at the top.
absl::StatusOr<WrittenCheckpoint> WriteCheckpoint(const Checkpoint& checkpoint,
                                                  const std::string& path,
                                                  const CheckpointWriteOptions& options = {});

// Reads a checkpoint and checks its data digest. NotFound when the file is
// missing; DataLoss, naming the file, when it is unreadable, truncated, not
// ONNX, not a castor checkpoint (no castor.checkpoint.format), of another
// format version, has an unparseable record, lacks its external data file,
// or its data digest does not match; FailedPrecondition when the recorded
// policy JSON parses but is not a valid policy (an edited record). Does not
// run the consistency checks.
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

// What is inconsistent in a checkpoint, one sentence each (empty: nothing):
//   the model: the float32 graph without autocast records;
//   the state against the graph: every parameter and running statistic an
//     existing float32 initializer (statistics read by a
//     BatchNormalization), every moment a float32 tensor shaped like its
//     parameter in a slot of the optimizer's kind, every parameter with
//     all its slots once an update was applied, step = optimizer_step +
//     the scaler's skipped steps, the loss-scaler state valid;
//   the record (when read from a file): the record digest matches; the
//     policy JSON's digest equals the recorded digest; the recorded name and
//     dtypes equal the policy's; autocast of the stored graph under the
//     policy keeps the recorded set of nodes float32. When another castor
//     version wrote the checkpoint, a different set is expected (its
//     autocast pass may differ: 0.2.0 added rule 3b) and goes to `notes`
//     (may be null) instead of the problems.
std::vector<std::string> FindCheckpointInconsistencies(const Checkpoint& checkpoint,
                                                       std::vector<std::string>* notes = nullptr);

// How `recorded` differs from `expected`, one line per field (name,
// compute_dtype, keep_io_types, each op whose list differs, op overrides,
// node overrides, pins); empty when the digests are equal.
std::vector<std::string> DescribePolicyDifferences(const Policy& recorded, const Policy& expected);

// The inference model: a copy of checkpoint.model without training_info and
// castor.checkpoint.* metadata (float32, trained weights).
absl::StatusOr<Model> InferenceModelFromCheckpoint(const Checkpoint& checkpoint);

// --- checkpoint directories --------------------------------------------------

// "ckpt-00000100.onnx" (at least 8 digits).
std::string CheckpointFileName(int64_t step);

struct CheckpointFile {
  int64_t step = 0;
  std::string path;
};
// castor's checkpoint files in `dir` (names ckpt-<digits>.onnx only; temp
// and data files are not listed), ascending by step.
absl::StatusOr<std::vector<CheckpointFile>> ListCheckpoints(const std::string& dir);

struct SavedCheckpoint {
  WrittenCheckpoint written;
  std::vector<std::string> removed;  // older checkpoints pruned (and their data files)
};
// Writes `dir`/CheckpointFileName(state.step) (creating `dir`), then keeps
// only the newest `keep_last` checkpoints (0 or less: keep all), removing the
// older ones with their data files, and stale temporary files castor left in
// `dir`. Other files are never touched.
absl::StatusOr<SavedCheckpoint> SaveToCheckpointDir(const std::string& dir,
                                                    const Checkpoint& checkpoint, int64_t keep_last,
                                                    const CheckpointWriteOptions& options = {});

struct FoundCheckpoint {
  explicit FoundCheckpoint(Checkpoint found) : checkpoint(std::move(found)) {}
  std::string path;
  Checkpoint checkpoint;
  // One line per newer checkpoint that was skipped: its path and why
  // (unreadable, corrupt or inconsistent: it fails `castor verify`), and
  // the paths alone, in the same order.
  std::vector<std::string> skipped;
  std::vector<std::string> skipped_paths;
};
// For --resume D|FILE. A file: read and checked (errors as ReadCheckpoint;
// FailedPrecondition listing the inconsistencies). A directory: the newest
// checkpoint that reads and has no inconsistency, newer broken ones listed
// in `skipped`; NotFound when the directory has no checkpoint, DataLoss
// (listing each) when none is usable.
absl::StatusOr<FoundCheckpoint> FindLatestCheckpoint(const std::string& dir_or_file);

// The suffix a checkpoint that fails verify gets when --resume moves it
// aside ("ckpt-00000004.onnx.broken"): kept for inspection, no longer
// listed, resumed from or pruned.
inline constexpr char kMovedAsideSuffix[] = ".broken";
// Renames `path` to `path` + kMovedAsideSuffix; the error names both.
absl::Status MoveCheckpointAside(const std::string& path);

// Removes what interrupted writes left in `dir`: temporary files of
// castor's checkpoints ("ckpt-N.onnx.tmp.XXXXXX", "....data.tmp.XXXXXX")
// and data files whose checkpoint is gone. Returns the names removed.
// Other files are never touched. SaveToCheckpointDir runs it after each
// save; castor train runs it when it opens --checkpoint-dir.
std::vector<std::string> RemoveInterruptedWrites(const std::string& dir);

}  // namespace castor::training
