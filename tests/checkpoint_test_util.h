// Test helpers for checkpoints (tests/checkpoint_test.cc,
// tests/verify_export_test.cc): a Checkpoint of a sample model trained a few
// steps by the real Trainer, a deep copy, and file surgery: truncate, flip a
// byte, find a tensor's bytes, edit the castor.checkpoint.* record (and
// re-seal its digest, as someone tampering with it would).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "onnx/onnx_pb.h"
#include "passes/autocast.h"
#include "passes/model_loader.h"
#include "passes/training_graph.h"
#include "training/checkpoint.h"
#include "training/trainer.h"

namespace castor::tools {

inline std::string SampleModelPath(const std::string& sample) {
  return std::string(CASTOR_SOURCE_DIR) + "/models/" + sample + ".onnx";
}

// The float32 sample model as `castor train` loads it.
inline Model LoadFloat32Sample(const std::string& sample) {
  absl::StatusOr<Model> model = LoadAndCheckModel(SampleModelPath(sample));
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

inline Backend& CheckpointTestBackend() {
  static CpuBackend* backend = new CpuBackend();
  return *backend;
}

// `sample` trained `steps` steps by the Trainer under `policy_name` on a
// fixed batch of 16 images (Adam, loss scaling for mixed_float16 starting
// at `initial_scale`), captured the way `castor train` fills a checkpoint.
inline training::Checkpoint TrainedCheckpoint(const std::string& sample, const std::string& policy_name,
                                    int steps, double initial_scale = 65536.0) {
  absl::StatusOr<Policy> policy = Policy::Builtin(policy_name);
  EXPECT_TRUE(policy.ok()) << policy.status();
  Model original = LoadFloat32Sample(sample);
  absl::StatusOr<Model> training = CloneModel(original);
  EXPECT_TRUE(training.ok()) << training.status();
  EXPECT_TRUE(InferTypes(*training).ok());
  EXPECT_TRUE(RunAutocast(*training, *policy).ok());
  absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(*training, TrainingGraphOptions{});
  EXPECT_TRUE(graph.ok()) << graph.status();
  training::TrainerOptions options;
  options.scaler.enabled = policy_name == "mixed_float16";
  options.scaler.initial_scale = initial_scale;
  absl::StatusOr<std::unique_ptr<training::Trainer>> trainer =
      training::Trainer::Create(std::move(*training), *graph, options, CheckpointTestBackend());
  EXPECT_TRUE(trainer.ok()) << trainer.status();

  constexpr int64_t kBatch = 16;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Tensor images(DType::kFloat32, {kBatch, 1, 28, 28});
  for (int64_t i = 0; i < images.num_elements(); ++i) images.data<float>()[i] = pixel(rng);
  Tensor labels(DType::kInt64, {kBatch});
  for (int64_t i = 0; i < kBatch; ++i) labels.data<int64_t>()[i] = i % 10;
  for (int k = 0; k < steps; ++k) {
    absl::StatusOr<training::StepResult> step = (*trainer)->Step({{"input", images}}, labels);
    EXPECT_TRUE(step.ok()) << step.status();
  }

  training::Checkpoint checkpoint(*policy);
  checkpoint.model = std::move(original);
  absl::StatusOr<training::Trainer::Snapshot> snapshot = (*trainer)->TakeSnapshot();
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(training::SetInitializers(checkpoint.model, snapshot->state).ok());
  training::TrainingState& state = checkpoint.state;
  state.step = (*trainer)->steps();
  state.optimizer_step = snapshot->optimizer.step();
  state.epoch = 2;
  state.position = kBatch * steps;
  state.seed = 1234;
  state.batch_size = kBatch;
  state.dataset_size = 60000;
  state.data = "fashion-mnist";
  state.loss = "cross-entropy";
  state.output = "logits";
  state.input = "input";
  for (const auto& [parameter, gradient] : graph->gradients) state.parameters.push_back(parameter);
  for (const auto& [statistic, updated] : graph->running_stats) {
    state.running_stats.push_back(statistic);
  }
  state.optimizer = options.optimizer;
  state.lr_schedule = options.lr;
  state.loss_scaler = (*trainer)->scaler().ToJson();
  state.moments = snapshot->optimizer.state();
  return checkpoint;
}

// A deep copy (Checkpoint holds a move-only Model).
inline training::Checkpoint CopyCheckpoint(const training::Checkpoint& checkpoint) {
  training::Checkpoint copy(checkpoint.policy);
  absl::StatusOr<Model> model = CloneModel(checkpoint.model);
  EXPECT_TRUE(model.ok()) << model.status();
  copy.model = std::move(model).value();
  EXPECT_TRUE(InferTypes(copy.model).ok());
  copy.state = checkpoint.state;
  copy.kept_float32_nodes = checkpoint.kept_float32_nodes;
  copy.castor_version = checkpoint.castor_version;
  copy.external_data_file = checkpoint.external_data_file;
  copy.record = checkpoint.record;
  return copy;
}

inline std::string ReadBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void WriteBytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Offset of the first 64 bytes of `tensor` in `bytes` (npos when absent).
inline size_t FindTensorBytes(const std::string& bytes, const Tensor& tensor) {
  const size_t n = std::min<size_t>(64, tensor.byte_size());
  return bytes.find(std::string(reinterpret_cast<const char*>(tensor.raw()), n));
}

// Rewrites the castor.checkpoint.* record of the checkpoint at `path`:
// `edit` changes the entries; with `reseal` the record digest is recomputed
// afterwards (a tamperer who knows the format).
inline void EditRecord(
    const std::filesystem::path& path,
    const std::function<void(std::vector<std::pair<std::string, std::string>>&)>& edit,
    bool reseal) {
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(ReadBytes(path)));
  std::vector<std::pair<std::string, std::string>> record;
  for (const onnx::StringStringEntryProto& entry : proto.metadata_props()) {
    record.emplace_back(entry.key(), entry.value());
  }
  edit(record);
  if (reseal) {
    for (auto& [key, value] : record) {
      if (key == training::kCheckpointRecordDigestKey) value = training::CheckpointRecordDigest(record);
    }
  }
  proto.clear_metadata_props();
  for (const auto& [key, value] : record) {
    onnx::StringStringEntryProto* entry = proto.add_metadata_props();
    entry->set_key(key);
    entry->set_value(value);
  }
  WriteBytes(path, proto.SerializeAsString());
}

// The value of `key` in a record being edited.
inline std::string& RecordEntry(std::vector<std::pair<std::string, std::string>>& record,
                                const std::string& key) {
  for (auto& [k, v] : record) {
    if (k == key) return v;
  }
  ADD_FAILURE() << "no record entry " << key;
  static std::string none;
  return none;
}

}  // namespace castor::tools
