// Fuzz target: the checkpoint reader and its checks (training/checkpoint.h
// ReadCheckpoint, FindCheckpointInconsistencies, InferenceModelFromCheckpoint),
// as `castor verify`, `castor export` and `--resume` use them.
//
// Random edits nearly always break the data digest, which stops the reader
// early. So an input whose only fault is its digests is re-sealed, as a
// tamperer who knows the format would: the data digest the reader computed
// (its error names it) and the record digest are written into the record,
// and the result is read again, reaching the state, policy and consistency
// checks behind the digests.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "onnx/onnx_pb.h"
#include "training/checkpoint.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr char kComputedMarker[] = ", computed ";

void CheckRead(const std::string& path) {
  absl::StatusOr<castor::training::Checkpoint> checkpoint = castor::training::ReadCheckpoint(path);
  if (!checkpoint.ok()) return;
  (void)castor::training::FindCheckpointInconsistencies(*checkpoint);
  (void)castor::training::InferenceModelFromCheckpoint(*checkpoint);
}

// `bytes` with the data digest `digest` and a matching record digest; empty
// when `bytes` is no ModelProto.
std::string Reseal(const std::string& bytes, const std::string& digest) {
  onnx::ModelProto proto;
  if (!proto.ParseFromString(bytes)) return "";
  std::vector<std::pair<std::string, std::string>> record;
  for (const onnx::StringStringEntryProto& entry : proto.metadata_props()) {
    record.emplace_back(entry.key(), entry.value());
  }
  for (auto& [key, value] : record) {
    if (key == castor::training::kCheckpointDataDigestKey) value = digest;
  }
  for (auto& [key, value] : record) {
    if (key == castor::training::kCheckpointRecordDigestKey) {
      value = castor::training::CheckpointRecordDigest(record);
    }
  }
  proto.clear_metadata_props();
  for (const auto& [key, value] : record) {
    onnx::StringStringEntryProto* entry = proto.add_metadata_props();
    entry->set_key(key);
    entry->set_value(value);
  }
  return proto.SerializeAsString();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(castor::fuzz::AsBytes(data, size));
  const std::string path = castor::fuzz::WriteScratchFile("ckpt-00000001.onnx", bytes);
  absl::StatusOr<castor::training::Checkpoint> checkpoint = castor::training::ReadCheckpoint(path);
  if (checkpoint.ok()) {
    (void)castor::training::FindCheckpointInconsistencies(*checkpoint);
    (void)castor::training::InferenceModelFromCheckpoint(*checkpoint);
    return 0;
  }
  const std::string message(checkpoint.status().message());
  const size_t at = message.rfind(kComputedMarker);
  if (!absl::StrContains(message, "data digest mismatch") || at == std::string::npos) return 0;
  std::string digest = message.substr(at + sizeof(kComputedMarker) - 1);
  if (const size_t end = digest.find(')'); end != std::string::npos) digest.resize(end);
  const std::string resealed = Reseal(bytes, digest);
  if (resealed.empty()) return 0;
  CheckRead(castor::fuzz::WriteScratchFile("ckpt-00000001.onnx", resealed));
  return 0;
}
