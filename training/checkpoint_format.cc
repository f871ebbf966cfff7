// The checkpoint file format (see checkpoint.h): the training state as
// JSON, the data and record digests, the atomic write (with an external data
// file for large models) and the read with its corruption checks, plus the
// record and moment-tensor names, SetInitializers and the inference model.
// Consistency checks are in checkpoint_checks.cc, directories and the
// cleanup of interrupted writes in checkpoint_dir.cc.
#include "training/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/io/coded_stream.h"
#include "graph/confined_file.h"
#include "graph/onnx_io.h"
#include "graph/sha256.h"
#include "graph/shape_inference.h"
#include "graph/status.h"
#include "graph/user_regex.h"
#include "graph/version.h"
#include "passes/training_graph.h"
#include "training/checkpoint_internal.h"
#include "training/session.h"

namespace castor::training {
namespace {

namespace fs = std::filesystem;
using namespace checkpoint_internal;

// The training_info algorithm graph that carries the optimizer moments.
constexpr const char* kStateGraphName = "castor.optimizer_state";
// Tensors at least this large go to the data file when data is external.
constexpr size_t kExternalTensorMinBytes = 1024;
// Data file offsets are aligned to this (a page, as onnx's external data
// helper and ONNX Runtime's memory mapping like it).
constexpr uint64_t kExternalAlignment = 4096;
// Protobuf cannot parse messages of 2 GB or more.
constexpr uint64_t kMaxProtoBytes = INT_MAX;
// training_info needs IR version 7.
constexpr int64_t kTrainingInfoIrVersion = 7;
// Hex digits of the data digest in a data file's name.
constexpr size_t kDataNameDigits = 16;

absl::Status ErrnoError(int error_number, const std::string& message) {
  return absl::Status(absl::ErrnoToStatusCode(error_number),
                      absl::StrCat(message, ": ", std::strerror(error_number)));
}

// ------------------------------------------------------------- digests

// SHA-256 over length-prefixed fields, so no two field lists hash alike.
class FieldHasher {
 public:
  void Field(const void* data, size_t size) {
    const uint64_t length = size;
    uint8_t prefix[8];
    for (int k = 0; k < 8; ++k) prefix[k] = static_cast<uint8_t>(length >> (8 * k));
    hasher_.Update(prefix, sizeof(prefix));
    if (size > 0) hasher_.Update(data, size);
  }
  void Field(const std::string& s) { Field(s.data(), s.size()); }
  void TensorFields(const std::string& kind, const std::string& name, const Tensor& tensor) {
    Field(kind);
    Field(name);
    Field(std::string(DTypeName(tensor.dtype())));
    Field(DimsText(tensor.dims()));
    if (tensor.dtype() == DType::kString) {
      Field(std::to_string(tensor.strings().size()));
      for (const std::string& s : tensor.strings()) Field(s);
    } else {
      Field(tensor.raw(), tensor.byte_size());
    }
  }
  std::string Finish() { return absl::StrCat("sha256:", hasher_.FinishHex()); }

 private:
  Sha256 hasher_;
};

// The graph's structure: the GraphProto without its initializers (hashed as
// tensors) and value_info (type annotations that tools rewrite: onnx 1.12's
// onnx.checker.check_model(path, full_check=True) writes inferred shapes back
// into the file it checks; castor's import checks declared types against its
// own inference, so an edited value_info cannot change what castor runs).
std::string GraphStructureBytes(const onnx::GraphProto& graph) {
  onnx::GraphProto structure = graph;
  structure.clear_initializer();
  structure.clear_value_info();
  return structure.SerializeAsString();
}

// The data digest (checkpoint.h): structure, initializers, moments, state.
std::string DataDigest(const std::string& structure,
                       const std::vector<std::pair<std::string, const Tensor*>>& initializers,
                       const std::map<std::string, std::map<std::string, Tensor>>& moments,
                       const std::string& state_json) {
  FieldHasher hasher;
  hasher.Field(std::string(kCheckpointFormat));
  hasher.Field(std::string("graph"));
  hasher.Field(structure);
  std::vector<std::pair<std::string, const Tensor*>> sorted = initializers;
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [name, tensor] : sorted) hasher.TensorFields("initializer", name, *tensor);
  // std::map: parameters, then slots, sorted.
  for (const auto& [parameter, slots] : moments) {
    for (const auto& [slot, tensor] : slots) {
      hasher.TensorFields("moment", MomentTensorName(parameter, slot), tensor);
    }
  }
  hasher.Field(std::string("state"));
  hasher.Field(state_json);
  return hasher.Finish();
}

std::vector<std::pair<std::string, const Tensor*>> GraphInitializers(const Graph& graph) {
  std::vector<std::pair<std::string, const Tensor*>> result;
  for (const Value* value : graph.initializers()) {
    result.emplace_back(value->name(), value->initializer());
  }
  return result;
}

// ------------------------------------------------------------- JSON helpers

absl::Status FieldError(const std::string& source, const std::string& field,
                        const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field '", field, "' ", what));
}

absl::StatusOr<const Json*> Required(const Json& json, const std::string& source,
                                     const std::string& field) {
  const Json* value = json.Find(field);
  if (value == nullptr) return FieldError(source, field, "is missing");
  return value;
}

absl::StatusOr<int64_t> IntField(const Json& json, const std::string& source,
                                 const std::string& field) {
  CASTOR_ASSIGN_OR_RETURN(const Json* value, Required(json, source, field));
  if (!value->is_int()) return FieldError(source, field, "must be an integer");
  return value->as_int();
}

absl::StatusOr<double> NumberField(const Json& json, const std::string& source,
                                   const std::string& field) {
  CASTOR_ASSIGN_OR_RETURN(const Json* value, Required(json, source, field));
  if (!value->is_number()) return FieldError(source, field, "must be a number");
  return value->as_number();
}

// An integer field of at least `min` (a state edited and re-sealed must
// not divide by zero or index before the data).
absl::StatusOr<int64_t> IntFieldAtLeast(const Json& json, const std::string& source,
                                        const std::string& field, int64_t min) {
  CASTOR_ASSIGN_OR_RETURN(int64_t value, IntField(json, source, field));
  if (value < min) return FieldError(source, field, absl::StrCat("is ", value, "; expected >= ", min));
  return value;
}

// A finite number field in [min, max) (`above_min`: in (min, max)).
absl::StatusOr<double> NumberFieldInRange(const Json& json, const std::string& source,
                                          const std::string& field, double min, bool above_min,
                                          double max = std::numeric_limits<double>::infinity()) {
  CASTOR_ASSIGN_OR_RETURN(double value, NumberField(json, source, field));
  if (!std::isfinite(value) || value < min || (above_min && value == min) || value >= max) {
    return FieldError(source, field,
                      absl::StrCat("is ", value, "; expected a finite number ",
                                   above_min ? "> " : ">= ", min,
                                   std::isinf(max) ? "" : absl::StrCat(" and < ", max)));
  }
  return value;
}

absl::StatusOr<bool> BoolField(const Json& json, const std::string& source,
                               const std::string& field) {
  CASTOR_ASSIGN_OR_RETURN(const Json* value, Required(json, source, field));
  if (!value->is_bool()) return FieldError(source, field, "must be true or false");
  return value->as_bool();
}

absl::StatusOr<std::string> StringField(const Json& json, const std::string& source,
                                        const std::string& field) {
  CASTOR_ASSIGN_OR_RETURN(const Json* value, Required(json, source, field));
  if (!value->is_string()) return FieldError(source, field, "must be a string");
  return value->as_string();
}

absl::StatusOr<std::vector<std::string>> StringListField(const Json& json,
                                                         const std::string& source,
                                                         const std::string& field) {
  CASTOR_ASSIGN_OR_RETURN(const Json* value, Required(json, source, field));
  if (!value->is_array()) return FieldError(source, field, "must be an array of strings");
  std::vector<std::string> result;
  for (const Json& item : value->items()) {
    if (!item.is_string()) return FieldError(source, field, "must be an array of strings");
    result.push_back(item.as_string());
  }
  return result;
}

Json StringList(const std::vector<std::string>& values) {
  Json array = Json::Array();
  for (const std::string& v : values) array.Append(Json::String(v));
  return array;
}

// ------------------------------------------------------------- files

absl::Status FsyncDirectory(const std::string& dir, const std::string& what) {
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || fsync(dir_fd) != 0) {
    const int error_number = errno;
    if (dir_fd >= 0) close(dir_fd);
    return ErrnoError(error_number,
                      absl::StrCat("wrote ", what, " but cannot fsync directory ", dir));
  }
  close(dir_fd);
  return absl::OkStatus();
}

// One piece of the data file: `bytes` at `offset`.
struct DataPiece {
  uint64_t offset;
  std::string_view bytes;
};

// Writes the data file atomically (as WriteFileAtomically, streaming the
// pieces with zero padding between them).
absl::Status WriteDataFileAtomically(const std::string& path, const std::vector<DataPiece>& pieces,
                                     uint64_t total_bytes) {
  std::string temp_path = absl::StrCat(path, ".tmp.XXXXXX");
  const int fd = mkstemp(temp_path.data());
  if (fd < 0) {
    return ErrnoError(errno, absl::StrCat("cannot write external data ", path,
                                          ": cannot create a temporary file"));
  }
  auto fail = [&](int error_number, const char* what) {
    close(fd);
    unlink(temp_path.c_str());
    return ErrnoError(error_number, absl::StrCat("cannot write external data ", path, ": ", what,
                                                 " ", temp_path));
  };
  if (fchmod(fd, 0644) != 0) return fail(errno, "cannot set the permissions of");
  auto write_all = [&](const char* data, size_t size) -> int {
    size_t done = 0;
    while (done < size) {
      const ssize_t n = write(fd, data + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return n < 0 ? errno : EIO;
      done += static_cast<size_t>(n);
    }
    return 0;
  };
  const std::string zeros(kExternalAlignment, '\0');
  uint64_t position = 0;
  for (const DataPiece& piece : pieces) {
    while (position < piece.offset) {
      const size_t pad =
          static_cast<size_t>(std::min<uint64_t>(piece.offset - position, zeros.size()));
      if (int e = write_all(zeros.data(), pad); e != 0) return fail(e, "cannot write to");
      position += pad;
    }
    if (int e = write_all(piece.bytes.data(), piece.bytes.size()); e != 0) {
      return fail(e, "cannot write to");
    }
    position += piece.bytes.size();
  }
  if (position != total_bytes) return fail(EIO, "internal error: wrong size of");
  if (fsync(fd) != 0) return fail(errno, "cannot fsync");
  if (close(fd) != 0) {
    const int error_number = errno;
    unlink(temp_path.c_str());
    return ErrnoError(error_number, absl::StrCat("cannot write external data ", path,
                                                 ": cannot close ", temp_path));
  }
  if (rename(temp_path.c_str(), path.c_str()) != 0) {
    const int error_number = errno;
    unlink(temp_path.c_str());
    return ErrnoError(error_number, absl::StrCat("cannot write external data ", path,
                                                 ": cannot rename ", temp_path, " over it"));
  }
  return FsyncDirectory(DirectoryOf(path), path);
}

absl::Status DataLoss(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}


// ------------------------------------------------------------------ write

// training_info[0] of `proto`: the moments, one initializer each (an older
// castor entry is replaced; other entries stay, after it).
void PutMomentsInTrainingInfo(const Checkpoint& checkpoint, onnx::ModelProto& proto) {
  google::protobuf::RepeatedPtrField<onnx::TrainingInfoProto> others;
  for (const onnx::TrainingInfoProto& info : proto.training_info()) {
    if (info.algorithm().name() != kStateGraphName) *others.Add() = info;
  }
  proto.clear_training_info();
  onnx::TrainingInfoProto* info = proto.add_training_info();
  info->mutable_algorithm()->set_name(kStateGraphName);
  info->mutable_algorithm()->set_doc_string(
      "castor's optimizer state (moments), one initializer castor.moment/<slot>/<parameter> "
      "each; castor runs the training step itself");
  for (const auto& [parameter, slots] : checkpoint.state.moments) {
    for (const auto& [slot, tensor] : slots) {
      *info->mutable_algorithm()->add_initializer() =
          TensorToProto(tensor, MomentTensorName(parameter, slot));
    }
  }
  for (const onnx::TrainingInfoProto& other : others) *proto.add_training_info() = other;
}

// Moves the tensors of `proto` (graph initializers and moments) of at least
// kExternalTensorMinBytes into the data file `dir`/`data_name`, page aligned,
// written atomically; records it in `written`.
absl::Status WriteExternalData(onnx::ModelProto& proto, const std::string& dir,
                               const std::string& data_name, WrittenCheckpoint& written) {
  std::vector<DataPiece> pieces;
  uint64_t offset = 0;
  auto externalize = [&](onnx::TensorProto& tensor) {
    if (!tensor.has_raw_data() || tensor.raw_data().size() < kExternalTensorMinBytes) return;
    offset = (offset + kExternalAlignment - 1) / kExternalAlignment * kExternalAlignment;
    pieces.push_back({offset, tensor.raw_data()});
    tensor.set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&tensor](const char* key, const std::string& value) {
      onnx::StringStringEntryProto* entry = tensor.add_external_data();
      entry->set_key(key);
      entry->set_value(value);
    };
    add("location", data_name);
    add("offset", std::to_string(offset));
    add("length", std::to_string(tensor.raw_data().size()));
    offset += tensor.raw_data().size();
  };
  for (onnx::TensorProto& tensor : *proto.mutable_graph()->mutable_initializer())
    externalize(tensor);
  for (onnx::TensorProto& tensor :
       *proto.mutable_training_info(0)->mutable_algorithm()->mutable_initializer()) {
    externalize(tensor);
  }
  CASTOR_RETURN_IF_ERROR(
      WriteDataFileAtomically((fs::path(dir) / data_name).string(), pieces, offset));
  // The pieces pointed into raw_data; drop it now that it is on disk.
  for (onnx::TensorProto& tensor : *proto.mutable_graph()->mutable_initializer()) {
    if (tensor.data_location() == onnx::TensorProto::EXTERNAL) tensor.clear_raw_data();
  }
  for (onnx::TensorProto& tensor :
       *proto.mutable_training_info(0)->mutable_algorithm()->mutable_initializer()) {
    if (tensor.data_location() == onnx::TensorProto::EXTERNAL) tensor.clear_raw_data();
  }
  written.external_data_path = (fs::path(dir) / data_name).string();
  written.external_data_bytes = static_cast<int64_t>(offset);
  return absl::OkStatus();
}

// ------------------------------------------------------------------- read

// The ModelProto in the file at `path`: DataLoss when it is empty, does not
// parse, or lacks what every ONNX model has.
absl::StatusOr<onnx::ModelProto> ReadModelProto(const std::string& path) {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a directory, not a checkpoint file"));
  }
  CASTOR_ASSIGN_OR_RETURN(
      std::string bytes,
      ReadWholeFile(path, kMaxProtoBytes,
                    "protobuf's 2 GB limit; not a castor checkpoint (its tensors would be "
                    "external)"));
  if (bytes.empty()) return DataLoss(path, "not a checkpoint: the file is empty");
  onnx::ModelProto proto;
  {
    google::protobuf::io::CodedInputStream stream(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                  static_cast<int>(bytes.size()));
    stream.SetTotalBytesLimit(INT_MAX);
    if (!proto.ParseFromCodedStream(&stream) || !stream.ConsumedEntireMessage()) {
      return DataLoss(path,
                      "not a valid ONNX model (protobuf parsing failed: truncated, "
                      "corrupt or not a ModelProto)");
    }
  }
  if (proto.ir_version() <= 0 || !proto.has_graph() || proto.opset_import_size() == 0) {
    return DataLoss(path,
                    "not a valid ONNX model (no ir_version, graph or opset_import: "
                    "truncated, corrupt or another kind of file)");
  }
  return proto;
}

// The optimizer moments of `proto`'s training_info into `state` (which
// lists them): every tensor listed and nothing else; DataLoss otherwise.
absl::Status ReadMoments(const onnx::ModelProto& proto, const std::string& path,
                         const std::string& dir, TrainingState& state) {
  const onnx::TrainingInfoProto* info = nullptr;
  for (const onnx::TrainingInfoProto& candidate : proto.training_info()) {
    if (candidate.algorithm().name() == kStateGraphName) info = &candidate;
  }
  if (info == nullptr && !state.moments.empty()) {
    return DataLoss(
        path, absl::StrCat("training_info has no ", kStateGraphName, " graph, but the state lists ",
                           state.moments.size(), " parameter(s) with optimizer moments"));
  }
  if (info != nullptr) {
    for (const onnx::TensorProto& tensor_proto : info->algorithm().initializer()) {
      std::string parameter, slot;
      if (!ParseMomentTensorName(tensor_proto.name(), &parameter, &slot) ||
          !state.moments.contains(parameter) || !state.moments[parameter].contains(slot)) {
        return DataLoss(path,
                        absl::StrCat("training_info holds tensor ", Quoted(tensor_proto.name()),
                                     ", which the state does not list as a moment"));
      }
      absl::StatusOr<Tensor> tensor = TensorFromProto(tensor_proto, dir);
      if (!tensor.ok()) {
        return DataLoss(path, absl::StrCat("moment ", Quoted(tensor_proto.name()), ": ",
                                           tensor.status().message()));
      }
      state.moments[parameter][slot] = std::move(tensor).value();
    }
  }
  for (const auto& [parameter, slots] : state.moments) {
    for (const auto& [slot, tensor] : slots) {
      if (tensor.dtype() == DType::kUndefined) {
        return DataLoss(path, absl::StrCat("moment ", Quoted(MomentTensorName(parameter, slot)),
                                           " is listed in the state but missing from "
                                           "training_info"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

// ------------------------------------------------ shared with the other parts

namespace checkpoint_internal {

std::string Quoted(const std::string& s) { return absl::StrCat("'", s, "'"); }

std::string DimsText(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

std::string DirectoryOf(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

std::string FileNameOf(const std::string& path) { return fs::path(path).filename().string(); }

bool IsRecordKey(const std::string& key) { return key.rfind(kCheckpointKeyPrefix, 0) == 0; }

std::string RecordDigest(const std::vector<std::pair<std::string, std::string>>& record) {
  std::vector<std::pair<std::string, std::string>> sorted;
  for (const auto& entry : record) {
    if (IsRecordKey(entry.first) && entry.first != kCheckpointRecordDigestKey) {
      sorted.push_back(entry);
    }
  }
  std::sort(sorted.begin(), sorted.end());
  FieldHasher hasher;
  hasher.Field(std::string(kCheckpointFormat));
  for (const auto& [key, value] : sorted) {
    hasher.Field(key);
    hasher.Field(value);
  }
  return hasher.Finish();
}

const std::string* FindEntry(const std::vector<std::pair<std::string, std::string>>& record,
                             const std::string& key) {
  for (const auto& [k, v] : record) {
    if (k == key) return &v;
  }
  return nullptr;
}

}  // namespace checkpoint_internal

// ===================================================================== API

std::string CheckpointRecordDigest(const std::vector<std::pair<std::string, std::string>>& record) {
  return RecordDigest(record);
}

std::string MomentTensorName(const std::string& parameter, const std::string& slot) {
  return absl::StrCat(kMomentTensorPrefix, slot, "/", parameter);
}

bool ParseMomentTensorName(const std::string& name, std::string* parameter, std::string* slot) {
  const std::string prefix = kMomentTensorPrefix;
  if (name.rfind(prefix, 0) != 0) return false;
  const size_t slash = name.find('/', prefix.size());
  if (slash == std::string::npos || slash == prefix.size() || slash + 1 == name.size()) {
    return false;
  }
  *slot = name.substr(prefix.size(), slash - prefix.size());
  *parameter = name.substr(slash + 1);
  return true;
}

const std::string* FindCheckpointRecord(const Checkpoint& checkpoint, const std::string& key) {
  return FindEntry(checkpoint.record, key);
}

absl::Status SetInitializers(Model& model, const std::map<std::string, Tensor>& values) {
  for (const auto& [name, tensor] : values) {
    Value* value = model.graph->FindValue(name);
    if (value == nullptr || value->mutable_initializer() == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("cannot set initializer ", Quoted(name),
                                                     ": the model has no such initializer"));
    }
    Tensor* target = value->mutable_initializer();
    if (target->dtype() != tensor.dtype() || target->dims() != tensor.dims()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot set initializer ", Quoted(name), ": the model's is ",
                       DTypeName(target->dtype()), DimsText(target->dims()), ", the new value ",
                       DTypeName(tensor.dtype()), DimsText(tensor.dims())));
    }
    *target = tensor;
  }
  return absl::OkStatus();
}

Json OptimizerOptionsToJson(const OptimizerOptions& options) {
  Json json = Json::Object();
  json.Set("kind", Json::String(OptimizerKindName(options.kind)));
  json.Set("momentum", Json::Number(options.momentum));
  json.Set("nesterov", Json::Bool(options.nesterov));
  json.Set("beta1", Json::Number(options.beta1));
  json.Set("beta2", Json::Number(options.beta2));
  json.Set("eps", Json::Number(options.eps));
  json.Set("weight_decay", Json::Number(options.weight_decay));
  json.Set("clip_norm", Json::Number(options.clip_norm));
  return json;
}

absl::StatusOr<OptimizerOptions> OptimizerOptionsFromJson(const Json& json,
                                                          const std::string& source) {
  if (!json.is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected an object"));
  OptimizerOptions options;
  CASTOR_ASSIGN_OR_RETURN(std::string kind, StringField(json, source, "kind"));
  absl::StatusOr<OptimizerKind> parsed = ParseOptimizerKind(kind);
  if (!parsed.ok()) return FieldError(source, "kind", std::string(parsed.status().message()));
  options.kind = *parsed;
  CASTOR_ASSIGN_OR_RETURN(options.momentum,
                          NumberFieldInRange(json, source, "momentum", 0, false));
  CASTOR_ASSIGN_OR_RETURN(options.nesterov, BoolField(json, source, "nesterov"));
  CASTOR_ASSIGN_OR_RETURN(options.beta1, NumberFieldInRange(json, source, "beta1", 0, false, 1));
  CASTOR_ASSIGN_OR_RETURN(options.beta2, NumberFieldInRange(json, source, "beta2", 0, false, 1));
  CASTOR_ASSIGN_OR_RETURN(options.eps, NumberFieldInRange(json, source, "eps", 0, true));
  CASTOR_ASSIGN_OR_RETURN(options.weight_decay,
                          NumberFieldInRange(json, source, "weight_decay", 0, false));
  CASTOR_ASSIGN_OR_RETURN(options.clip_norm,
                          NumberFieldInRange(json, source, "clip_norm", 0, false));
  return options;
}

Json LrScheduleToJson(const LrSchedule& schedule) {
  Json json = Json::Object();
  json.Set("kind", Json::String(LrScheduleKindName(schedule.kind)));
  json.Set("base_lr", Json::Number(schedule.base_lr));
  json.Set("warmup_steps", Json::Int(schedule.warmup_steps));
  json.Set("step_size", Json::Int(schedule.step_size));
  json.Set("gamma", Json::Number(schedule.gamma));
  json.Set("total_steps", Json::Int(schedule.total_steps));
  json.Set("min_lr", Json::Number(schedule.min_lr));
  return json;
}

absl::StatusOr<LrSchedule> LrScheduleFromJson(const Json& json, const std::string& source) {
  if (!json.is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected an object"));
  LrSchedule schedule;
  CASTOR_ASSIGN_OR_RETURN(std::string kind, StringField(json, source, "kind"));
  if (kind == "constant") {
    schedule.kind = LrSchedule::Kind::kConstant;
  } else if (kind == "step") {
    schedule.kind = LrSchedule::Kind::kStep;
  } else if (kind == "cosine") {
    schedule.kind = LrSchedule::Kind::kCosine;
  } else {
    return FieldError(source, "kind",
                      absl::StrCat("is ", Quoted(kind), "; expected constant, step or cosine"));
  }
  CASTOR_ASSIGN_OR_RETURN(schedule.base_lr, NumberFieldInRange(json, source, "base_lr", 0, true));
  CASTOR_ASSIGN_OR_RETURN(schedule.warmup_steps,
                          IntFieldAtLeast(json, source, "warmup_steps", 0));
  CASTOR_ASSIGN_OR_RETURN(schedule.step_size, IntFieldAtLeast(json, source, "step_size", 1));
  CASTOR_ASSIGN_OR_RETURN(schedule.gamma, NumberFieldInRange(json, source, "gamma", 0, true));
  CASTOR_ASSIGN_OR_RETURN(schedule.total_steps, IntFieldAtLeast(json, source, "total_steps", 0));
  CASTOR_ASSIGN_OR_RETURN(schedule.min_lr, NumberFieldInRange(json, source, "min_lr", 0, false));
  return schedule;
}

Json TrainingStateToJson(const TrainingState& state) {
  Json json = Json::Object();
  json.Set("step", Json::Int(state.step));
  json.Set("optimizer_step", Json::Int(state.optimizer_step));
  json.Set("epoch", Json::Int(state.epoch));
  json.Set("position", Json::Int(state.position));
  if (state.seed <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    json.Set("seed", Json::Int(static_cast<int64_t>(state.seed)));
  } else {
    json.Set("seed", Json::String(std::to_string(state.seed)));
  }
  json.Set("shuffle", Json::Bool(state.shuffle));
  json.Set("drop_last", Json::Bool(state.drop_last));
  json.Set("batch_size", Json::Int(state.batch_size));
  json.Set("dataset_size", Json::Int(state.dataset_size));
  json.Set("data", Json::String(state.data));
  json.Set("loss", Json::String(state.loss));
  json.Set("output", Json::String(state.output));
  json.Set("input", Json::String(state.input));
  json.Set("parameters", StringList(state.parameters));
  json.Set("running_stats", StringList(state.running_stats));
  json.Set("optimizer", OptimizerOptionsToJson(state.optimizer));
  json.Set("lr_schedule", LrScheduleToJson(state.lr_schedule));
  json.Set("loss_scaler", state.loss_scaler);
  Json moments = Json::Array();
  for (const auto& [parameter, slots] : state.moments) {
    for (const auto& [slot, tensor] : slots) {
      moments.Append(Json::String(MomentTensorName(parameter, slot)));
    }
  }
  json.Set("moments", std::move(moments));
  json.Set("extra", state.extra);
  return json;
}

// The settings --resume takes from the state, each on its own: the loss a
// kind castor trains with, the data a --data form ("" : not recorded),
// the extra entries (rng, tf32, ignore_index, freeze, train_only) well
// formed. Errors name `source` and the field.
absl::Status CheckRecordedSettings(const TrainingState& state, const std::string& source) {
  if (absl::StatusOr<LossKind> loss = ParseLossKind(state.loss); !loss.ok()) {
    return FieldError(source, "loss", absl::StrCat("is ", Quoted(state.loss), ": ",
                                                   loss.status().message()));
  }
  const std::vector<std::string> data_files = absl::StrSplit(state.data, ',');
  bool data_well_formed = state.data.empty() || data_files.size() == 1 ||
                          data_files.size() == 2 || data_files.size() == 4;
  for (const std::string& file : data_files) {
    data_well_formed = data_well_formed && (state.data.empty() || !file.empty());
    for (const char c : file) {
      data_well_formed = data_well_formed && static_cast<unsigned char>(c) >= 0x20;
    }
  }
  if (!data_well_formed) {
    return FieldError(source, "data",
                      absl::StrCat("is ", Quoted(state.data),
                                   ", no --data form (a name, a directory or .npz, or 2 or 4 "
                                   "comma-separated files)"));
  }
  for (const absl::Status& status :
       {RecordedRngState(state).status(), RecordedTf32(state).status(),
        RecordedIgnoreIndex(state).status()}) {
    if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", status.message()));
  }
  for (const char* key : {kFreezeStateKey, kTrainOnlyStateKey}) {
    const Json* pattern = state.extra.Find(key);
    if (pattern == nullptr) continue;
    if (!pattern->is_string() || !CompileUserRegex(pattern->as_string()).ok()) {
      return FieldError(source, absl::StrCat("extra.", key),
                        absl::StrCat("is ", pattern->Dump(-1),
                                     ", not a regular expression (ECMAScript)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainingState> TrainingStateFromJson(const Json& json, const std::string& source) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the state must be a JSON object"));
  }
  TrainingState state;
  // Every counter in range: a state edited and re-sealed (digests
  // recomputed) must be refused here, by verify as by --resume.
  CASTOR_ASSIGN_OR_RETURN(state.step, IntFieldAtLeast(json, source, "step", 0));
  CASTOR_ASSIGN_OR_RETURN(state.optimizer_step, IntFieldAtLeast(json, source, "optimizer_step", 0));
  if (state.optimizer_step > state.step) {
    return FieldError(source, "optimizer_step",
                      absl::StrCat("is ", state.optimizer_step, ", more than step ", state.step));
  }
  CASTOR_ASSIGN_OR_RETURN(state.epoch, IntFieldAtLeast(json, source, "epoch", 0));
  CASTOR_ASSIGN_OR_RETURN(state.position, IntFieldAtLeast(json, source, "position", 0));
  CASTOR_ASSIGN_OR_RETURN(const Json* seed, Required(json, source, "seed"));
  if (seed->is_int() && seed->as_int() >= 0) {
    state.seed = static_cast<uint64_t>(seed->as_int());
  } else if (!seed->is_string() || !absl::SimpleAtoi(seed->as_string(), &state.seed)) {
    return FieldError(source, "seed", "must be a non-negative integer");
  }
  CASTOR_ASSIGN_OR_RETURN(state.shuffle, BoolField(json, source, "shuffle"));
  CASTOR_ASSIGN_OR_RETURN(state.drop_last, BoolField(json, source, "drop_last"));
  CASTOR_ASSIGN_OR_RETURN(state.batch_size, IntFieldAtLeast(json, source, "batch_size", 1));
  CASTOR_ASSIGN_OR_RETURN(state.dataset_size, IntFieldAtLeast(json, source, "dataset_size", 0));
  if (state.dataset_size > 0 && state.position > state.dataset_size) {
    return FieldError(source, "position",
                      absl::StrCat("is ", state.position, ", past the ", state.dataset_size,
                                   " samples of dataset_size"));
  }
  CASTOR_ASSIGN_OR_RETURN(state.data, StringField(json, source, "data"));
  CASTOR_ASSIGN_OR_RETURN(state.loss, StringField(json, source, "loss"));
  CASTOR_ASSIGN_OR_RETURN(state.output, StringField(json, source, "output"));
  CASTOR_ASSIGN_OR_RETURN(state.input, StringField(json, source, "input"));
  CASTOR_ASSIGN_OR_RETURN(state.parameters, StringListField(json, source, "parameters"));
  CASTOR_ASSIGN_OR_RETURN(state.running_stats, StringListField(json, source, "running_stats"));
  CASTOR_ASSIGN_OR_RETURN(const Json* optimizer, Required(json, source, "optimizer"));
  CASTOR_ASSIGN_OR_RETURN(
      state.optimizer, OptimizerOptionsFromJson(*optimizer, absl::StrCat(source, ": optimizer")));
  CASTOR_ASSIGN_OR_RETURN(const Json* schedule, Required(json, source, "lr_schedule"));
  CASTOR_ASSIGN_OR_RETURN(state.lr_schedule,
                          LrScheduleFromJson(*schedule, absl::StrCat(source, ": lr_schedule")));
  CASTOR_ASSIGN_OR_RETURN(const Json* scaler, Required(json, source, "loss_scaler"));
  if (!scaler->is_null() && !scaler->is_object()) {
    return FieldError(source, "loss_scaler", "must be an object or null");
  }
  state.loss_scaler = *scaler;
  CASTOR_ASSIGN_OR_RETURN(std::vector<std::string> moments,
                          StringListField(json, source, "moments"));
  for (const std::string& name : moments) {
    std::string parameter, slot;
    if (!ParseMomentTensorName(name, &parameter, &slot)) {
      return FieldError(source, "moments",
                        absl::StrCat("holds ", Quoted(name), ", not a name ", kMomentTensorPrefix,
                                     "<slot>/<parameter>"));
    }
    state.moments[parameter][slot] = Tensor();
  }
  if (const Json* extra = json.Find("extra"); extra != nullptr) {
    if (!extra->is_object()) return FieldError(source, "extra", "must be an object");
    state.extra = *extra;
  }
  CASTOR_RETURN_IF_ERROR(CheckRecordedSettings(state, source));
  return state;
}

absl::StatusOr<Model> InferenceModelFromCheckpoint(const Checkpoint& checkpoint) {
  CASTOR_ASSIGN_OR_RETURN(Model model, CloneModel(checkpoint.model));
  model.serialized_training_info.clear();
  std::erase_if(model.metadata_props, [](const auto& entry) { return IsRecordKey(entry.first); });
  CASTOR_RETURN_IF_ERROR(InferTypes(model));
  return model;
}

// ------------------------------------------------------------------ write

absl::StatusOr<WrittenCheckpoint> WriteCheckpoint(const Checkpoint& checkpoint,
                                                  const std::string& path,
                                                  const CheckpointWriteOptions& options) {
  auto fail = [&path](const absl::Status& status) {
    return absl::Status(status.code(),
                        absl::StrCat("cannot write checkpoint ", path, ": ", status.message()));
  };
  if (path.empty()) return absl::InvalidArgumentError("cannot write a checkpoint to an empty path");
  {
    std::vector<std::string> problems;
    CheckStateAgainstGraph(checkpoint, problems);
    if (!problems.empty()) {
      return fail(absl::InvalidArgumentError(absl::StrCat(problems.size(), " inconsistenc",
                                                          problems.size() == 1 ? "y" : "ies", ": ",
                                                          absl::StrJoin(problems, "; "))));
    }
  }
  absl::StatusOr<std::vector<std::string>> kept =
      KeptFloat32Nodes(checkpoint.model, checkpoint.policy);
  if (!kept.ok()) {
    return fail(
        absl::Status(kept.status().code(),
                     absl::StrCat("autocast under policy ", Quoted(checkpoint.policy.name()),
                                  " fails: ", kept.status().message())));
  }

  absl::StatusOr<onnx::ModelProto> exported = ExportModel(checkpoint.model);
  if (!exported.ok()) return fail(exported.status());
  onnx::ModelProto proto = std::move(exported).value();
  if (proto.ir_version() < kTrainingInfoIrVersion) proto.set_ir_version(kTrainingInfoIrVersion);
  // The model's own metadata stays; an older record is replaced.
  {
    google::protobuf::RepeatedPtrField<onnx::StringStringEntryProto> kept_props;
    for (const onnx::StringStringEntryProto& entry : proto.metadata_props()) {
      if (!IsRecordKey(entry.key())) *kept_props.Add() = entry;
    }
    proto.mutable_metadata_props()->Swap(&kept_props);
  }
  // training_info[0]: the moments (an older castor entry is replaced).
  PutMomentsInTrainingInfo(checkpoint, proto);

  const std::string state_json = TrainingStateToJson(checkpoint.state).Dump(-1);
  const std::string data_digest =
      DataDigest(GraphStructureBytes(proto.graph()), GraphInitializers(*checkpoint.model.graph),
                 checkpoint.state.moments, state_json);

  std::vector<std::pair<std::string, std::string>> record = {
      {kCheckpointFormatKey, kCheckpointFormat},
      {kCheckpointCastorVersionKey, kCastorVersion},
      {kCheckpointPolicyNameKey, checkpoint.policy.name()},
      {kCheckpointPolicyDigestKey, checkpoint.policy.Digest()},
      {kCheckpointComputeDTypeKey, DTypeName(checkpoint.policy.compute_dtype())},
      {kCheckpointVariableDTypeKey, DTypeName(checkpoint.policy.variable_dtype())},
      {kCheckpointPolicyKey, checkpoint.policy.ToJson().Dump(-1)},
      {kCheckpointKeptFloat32Key, StringList(*kept).Dump(-1)},
      {kCheckpointStateKey, state_json},
      {kCheckpointDataDigestKey, data_digest},
  };

  // External data when the whole file would be over the threshold.
  const std::string dir = DirectoryOf(path);
  const std::string name = FileNameOf(path);
  uint64_t record_bytes = 0;
  for (const auto& [key, value] : record) record_bytes += key.size() + value.size() + 16;
  record_bytes += 128;  // the record digest entry
  const bool external =
      proto.ByteSizeLong() + record_bytes >
      static_cast<uint64_t>(std::max<int64_t>(options.external_data_threshold_bytes, 0));
  WrittenCheckpoint written;
  written.path = path;
  written.data_digest = data_digest;
  RemoveLeftovers(dir, name, /*remove_temps=*/true, /*remove_data=*/false, "");
  std::string data_name;
  if (external) {
    const std::string hex = data_digest.substr(std::string("sha256:").size(), kDataNameDigits);
    data_name = absl::StrCat(name, ".", hex, ".data");
    if (absl::Status s = WriteExternalData(proto, dir, data_name, written); !s.ok()) {
      return fail(s);
    }
    record.emplace_back(kCheckpointExternalDataKey, data_name);
  }
  record.emplace_back(kCheckpointRecordDigestKey, RecordDigest(record));
  for (const auto& [key, value] : record) {
    onnx::StringStringEntryProto* entry = proto.add_metadata_props();
    entry->set_key(key);
    entry->set_value(value);
  }

  const size_t size = proto.ByteSizeLong();
  if (size > kMaxProtoBytes) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("the model serializes to ", size,
                     " bytes even with external data, over protobuf's 2 GB "
                     "limit")));
  }
  std::string bytes;
  if (!proto.SerializeToString(&bytes)) {
    return fail(absl::InternalError("protobuf serialization failed"));
  }
  if (absl::Status s = WriteFileAtomically(path, bytes); !s.ok()) return s;
  written.file_bytes = static_cast<int64_t>(bytes.size());
  // Data files of earlier writes of this path are no longer referenced.
  RemoveLeftovers(dir, name, /*remove_temps=*/false, /*remove_data=*/true, data_name);
  return written;
}

// ------------------------------------------------------------------- read

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  CASTOR_ASSIGN_OR_RETURN(onnx::ModelProto proto, ReadModelProto(path));
  std::vector<std::pair<std::string, std::string>> record;
  for (const onnx::StringStringEntryProto& entry : proto.metadata_props()) {
    if (IsRecordKey(entry.key())) record.emplace_back(entry.key(), entry.value());
  }
  const std::string* format = FindEntry(record, kCheckpointFormatKey);
  if (format == nullptr) {
    return DataLoss(path, absl::StrCat("an ONNX model but not a castor checkpoint (no ",
                                       kCheckpointFormatKey, " metadata)"));
  }
  if (*format != kCheckpointFormat) {
    return DataLoss(path, absl::StrCat("checkpoint format ", Quoted(*format), "; this castor (",
                                       kCastorVersion, ") reads ", Quoted(kCheckpointFormat)));
  }
  for (const char* key :
       {kCheckpointCastorVersionKey, kCheckpointPolicyNameKey, kCheckpointPolicyDigestKey,
        kCheckpointPolicyKey, kCheckpointComputeDTypeKey, kCheckpointVariableDTypeKey,
        kCheckpointKeptFloat32Key, kCheckpointStateKey, kCheckpointDataDigestKey,
        kCheckpointRecordDigestKey}) {
    if (FindEntry(record, key) == nullptr) {
      return DataLoss(path,
                      absl::StrCat("the checkpoint record is incomplete: ", key, " is missing"));
    }
  }
  const std::string& state_text = *FindEntry(record, kCheckpointStateKey);
  absl::StatusOr<Json> state_json = Json::Parse(state_text);
  if (!state_json.ok()) {
    return DataLoss(path, absl::StrCat(kCheckpointStateKey, " is not valid JSON (",
                                       state_json.status().message(), ")"));
  }
  absl::StatusOr<TrainingState> state = TrainingStateFromJson(*state_json, kCheckpointStateKey);
  if (!state.ok()) return DataLoss(path, std::string(state.status().message()));
  absl::StatusOr<Json> kept_json = Json::Parse(*FindEntry(record, kCheckpointKeptFloat32Key));
  std::vector<std::string> kept;
  bool kept_valid = kept_json.ok() && kept_json->is_array();
  if (kept_valid) {
    for (const Json& item : kept_json->items()) {
      if (!item.is_string()) {
        kept_valid = false;
        break;
      }
      kept.push_back(item.as_string());
    }
  }
  if (!kept_valid) {
    return DataLoss(path,
                    absl::StrCat(kCheckpointKeptFloat32Key, " is not a JSON array of node names"));
  }
  absl::StatusOr<Json> policy_json = Json::Parse(*FindEntry(record, kCheckpointPolicyKey));
  if (!policy_json.ok()) {
    return DataLoss(path, absl::StrCat(kCheckpointPolicyKey, " is not valid JSON (",
                                       policy_json.status().message(), ")"));
  }
  absl::StatusOr<Policy> policy = Policy::FromJson(*policy_json, kCheckpointPolicyKey);
  if (!policy.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": the recorded policy is not a valid policy: ", policy.status().message()));
  }

  // The model (external data resolves beside the file).
  const std::string dir = DirectoryOf(path);
  absl::StatusOr<Model> model = ImportModel(proto, dir, path);
  if (!model.ok()) {
    return DataLoss(path,
                    absl::StrCat("cannot import the stored model: ", model.status().message()));
  }
  // The moments.
  CASTOR_RETURN_IF_ERROR(ReadMoments(proto, path, dir, *state));
  const std::string digest =
      DataDigest(GraphStructureBytes(proto.graph()), GraphInitializers(*model->graph),
                 state->moments, state_text);
  const std::string& recorded_digest = *FindEntry(record, kCheckpointDataDigestKey);
  if (digest != recorded_digest) {
    return DataLoss(path, absl::StrCat("data digest mismatch: the weights, moments, graph or "
                                       "training state were modified or corrupted (recorded ",
                                       recorded_digest, ", computed ", digest, ")"));
  }
  if (absl::Status s = InferTypes(*model); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }

  std::erase_if(model->metadata_props, [](const auto& entry) { return IsRecordKey(entry.first); });
  std::vector<std::string> others;
  for (const onnx::TrainingInfoProto& candidate : proto.training_info()) {
    if (candidate.algorithm().name() != kStateGraphName) {
      others.push_back(candidate.SerializeAsString());
    }
  }
  model->serialized_training_info = std::move(others);

  Checkpoint checkpoint(std::move(policy).value());
  checkpoint.model = std::move(model).value();
  checkpoint.state = std::move(state).value();
  checkpoint.kept_float32_nodes = std::move(kept);
  checkpoint.castor_version = *FindEntry(record, kCheckpointCastorVersionKey);
  if (const std::string* data = FindEntry(record, kCheckpointExternalDataKey)) {
    // Confined like every external data location: inside the checkpoint's
    // directory after symlinks, a regular file (verify reports its size).
    absl::StatusOr<ConfinedFile> file =
        OpenConfinedFile(dir, *data, kCheckpointExternalDataKey);
    if (!file.ok()) return DataLoss(path, std::string(file.status().message()));
    close(file->fd);
    checkpoint.external_data_file = file->path;
  }
  checkpoint.record = std::move(record);
  return checkpoint;
}

}  // namespace castor::training
