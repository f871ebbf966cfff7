// Tests for training/checkpoint.h: bit-exact round trips of weights, running
// statistics, moments and state (inline and with external data), the state
// JSON, what a write refuses, corruption detected on read, keep-last-K
// pruning, FindLatestCheckpoint falling back from a corrupt newest file, and
// kill -9 of a writer in the middle of saving, 200 times, always leaving a
// checkpoint that reads and verifies.
#include "training/checkpoint.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <limits>
#include <regex>
#include <set>
#include <thread>

#include "gmock/gmock.h"
#include "graph/version.h"
#include "gtest/gtest.h"
#include "passes/model_loader.h"
#include "training/loss_scaler.h"
#include "tests/checkpoint_test_util.h"
#include "tests/cli_test_util.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class CheckpointTest : public CliTempDirTest {
 protected:
  CheckpointTest() : CliTempDirTest("checkpoint") {}

  // Files in dir_, sorted.
  std::vector<std::string> Files() const {
    std::vector<std::string> names;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }
};

// Every initializer, moment and state field of `read` equals `written`'s,
// bit for bit.
void ExpectSameContents(const training::Checkpoint& written, const training::Checkpoint& read) {
  const Graph& a = *written.model.graph;
  const Graph& b = *read.model.graph;
  ASSERT_EQ(a.initializers().size(), b.initializers().size());
  for (const Value* value : a.initializers()) {
    const Value* other = b.FindValue(value->name());
    ASSERT_NE(other, nullptr) << value->name();
    ASSERT_NE(other->initializer(), nullptr) << value->name();
    EXPECT_TRUE(*value->initializer() == *other->initializer()) << value->name();
  }
  EXPECT_EQ(a.num_nodes(), b.num_nodes());
  ASSERT_EQ(written.state.moments.size(), read.state.moments.size());
  for (const auto& [parameter, slots] : written.state.moments) {
    ASSERT_TRUE(read.state.moments.contains(parameter)) << parameter;
    const auto& read_slots = read.state.moments.at(parameter);
    ASSERT_EQ(slots.size(), read_slots.size()) << parameter;
    for (const auto& [slot, tensor] : slots) {
      ASSERT_TRUE(read_slots.contains(slot)) << parameter << " " << slot;
      EXPECT_TRUE(tensor == read_slots.at(slot)) << parameter << " " << slot;
    }
  }
  EXPECT_EQ(training::TrainingStateToJson(written.state).Dump(), training::TrainingStateToJson(read.state).Dump());
  EXPECT_EQ(written.policy.Digest(), read.policy.Digest());
}

TEST_F(CheckpointTest, RoundTripOfATrainedMlpIsBitExact) {
  // A loss scale of 1e7 overflows the float16 gradients, so steps are
  // skipped and the scale backs off: the state records real skipped steps.
  training::Checkpoint checkpoint = TrainedCheckpoint("mlp_opset17", "mixed_float16", 6, 1e7);
  ASSERT_EQ(LossScaler::FromJson(checkpoint.state.loss_scaler)->skipped_steps(), 2);
  ASSERT_EQ(checkpoint.state.step, 6);
  ASSERT_EQ(checkpoint.state.optimizer_step, 4);
  ASSERT_EQ(checkpoint.state.moments.size(), 6u);  // Adam m and v for 3 Gemm weights + biases
  EXPECT_THAT(training::FindCheckpointInconsistencies(checkpoint), IsEmpty());

  const std::string path = (dir_ / "mlp.onnx").string();
  absl::StatusOr<training::WrittenCheckpoint> written = training::WriteCheckpoint(checkpoint, path);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->external_data_path, "");
  EXPECT_EQ(written->file_bytes, static_cast<int64_t>(fs::file_size(path)));
  // Weights (669,706 floats) and two moments each: about 3 x 2.7 MB.
  EXPECT_GT(written->file_bytes, 3 * 669706 * 4);
  EXPECT_THAT(Files(), ElementsAre("mlp.onnx"));

  absl::StatusOr<training::Checkpoint> read = training::ReadCheckpoint(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameContents(checkpoint, *read);
  EXPECT_EQ(read->castor_version, kCastorVersion);
  EXPECT_EQ(read->policy.name(), "mixed_float16");
  EXPECT_EQ(read->kept_float32_nodes, *training::KeptFloat32Nodes(checkpoint.model, checkpoint.policy));
  // The output Gemm (fc3) stays float32 under every policy (graph outputs).
  EXPECT_THAT(read->kept_float32_nodes, ::testing::Contains(HasSubstr("fc3")));
  EXPECT_THAT(training::FindCheckpointInconsistencies(*read), IsEmpty());
  // The model keeps its own metadata; the record is separate.
  EXPECT_NE(read->model.FindMetadata("castor.sample"), nullptr);
  EXPECT_EQ(read->model.FindMetadata(training::kCheckpointFormatKey), nullptr);
  EXPECT_TRUE(read->model.serialized_training_info.empty());
  EXPECT_EQ(read->record.size(), 11u);

  // castor's own loader reads a checkpoint as a model (inspect, run).
  absl::StatusOr<Model> as_model = LoadAndCheckModel(path);
  ASSERT_TRUE(as_model.ok()) << as_model.status();
  EXPECT_EQ(as_model->serialized_training_info.size(), 1u);
  EXPECT_EQ(*as_model->FindMetadata(training::kCheckpointPolicyNameKey), "mixed_float16");
}

TEST_F(CheckpointTest, RoundTripOfAResnetKeepsItsRunningStatistics) {
  training::Checkpoint checkpoint = TrainedCheckpoint("resnet_opset17", "mixed_bfloat16", 2);
  ASSERT_EQ(checkpoint.state.running_stats.size(), 16u);  // 8 BatchNormalizations
  // Training moved the statistics away from the exported ones.
  Model original = LoadFloat32Sample("resnet_opset17");
  const std::string& mean = checkpoint.state.running_stats[0];
  EXPECT_FALSE(*original.graph->FindValue(mean)->initializer() ==
               *checkpoint.model.graph->FindValue(mean)->initializer());

  const std::string path = (dir_ / "resnet.onnx").string();
  ASSERT_TRUE(training::WriteCheckpoint(checkpoint, path).ok());
  absl::StatusOr<training::Checkpoint> read = training::ReadCheckpoint(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameContents(checkpoint, *read);
  EXPECT_EQ(read->state.running_stats, checkpoint.state.running_stats);
  EXPECT_THAT(training::FindCheckpointInconsistencies(*read), IsEmpty());
  // BatchNormalization is on the deny list: all 8 stay float32.
  int kept_batch_norms = 0;
  for (const std::string& name : read->kept_float32_nodes) {
    const Node* node = read->model.graph->FindNode(name);
    ASSERT_NE(node, nullptr) << name;
    kept_batch_norms += node->op_type() == "BatchNormalization";
  }
  EXPECT_EQ(kept_batch_norms, 8);
}

TEST_F(CheckpointTest, ExternalDataRoundTripAndItsDataFiles) {
  training::Checkpoint checkpoint = TrainedCheckpoint("mlp_opset17", "mixed_bfloat16", 2);
  const fs::path path = dir_ / "mlp.onnx";
  training::CheckpointWriteOptions options;
  options.external_data_threshold_bytes = 1;  // force it
  absl::StatusOr<training::WrittenCheckpoint> written = training::WriteCheckpoint(checkpoint, path.string(), options);
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_NE(written->external_data_path, "");
  const std::string data_name = fs::path(written->external_data_path).filename().string();
  EXPECT_TRUE(std::regex_match(data_name, std::regex(R"(mlp\.onnx\.[0-9a-f]{16}\.data)")))
      << data_name;
  EXPECT_EQ(data_name.substr(9, 16), written->data_digest.substr(7, 16));
  EXPECT_THAT(Files(), ElementsAre("mlp.onnx", data_name));
  // The model file holds the graph and the record; the data file the tensors.
  EXPECT_LT(fs::file_size(path), 64u * 1024);
  EXPECT_GT(written->external_data_bytes, 3 * 669706 * 4);
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(written->external_data_path)),
            written->external_data_bytes);

  absl::StatusOr<training::Checkpoint> read = training::ReadCheckpoint(path.string());
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameContents(checkpoint, *read);
  EXPECT_EQ(read->external_data_file, written->external_data_path);
  EXPECT_THAT(training::FindCheckpointInconsistencies(*read), IsEmpty());

  // A write of other contents to the same path replaces the data file.
  training::Checkpoint later = TrainedCheckpoint("mlp_opset17", "mixed_bfloat16", 3);
  absl::StatusOr<training::WrittenCheckpoint> rewritten = training::WriteCheckpoint(later, path.string(), options);
  ASSERT_TRUE(rewritten.ok()) << rewritten.status();
  EXPECT_NE(rewritten->external_data_path, written->external_data_path);
  EXPECT_THAT(Files(),
              ElementsAre("mlp.onnx", fs::path(rewritten->external_data_path).filename().string()));
  ASSERT_TRUE(training::ReadCheckpoint(path.string()).ok());

  // Without its data file the checkpoint is corrupt, naming the file.
  fs::rename(rewritten->external_data_path, dir_ / "elsewhere.data");
  absl::StatusOr<training::Checkpoint> missing = training::ReadCheckpoint(path.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::IsDataLoss(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr(path.string()));
  EXPECT_THAT(missing.status().message(), HasSubstr("does not exist"));

  // Written inline again: no data file is left.
  ASSERT_TRUE(training::WriteCheckpoint(later, path.string()).ok());
  EXPECT_THAT(Files(), ElementsAre("elsewhere.data", "mlp.onnx"));
  ASSERT_TRUE(training::ReadCheckpoint(path.string()).ok());
}

TEST(TrainingStateJsonTest, EveryFieldRoundTrips) {
  training::TrainingState state;
  state.step = 12;
  state.optimizer_step = 10;
  state.epoch = 3;
  state.position = 384;
  state.seed = std::numeric_limits<uint64_t>::max();  // beyond int64: written as a string
  state.shuffle = false;
  state.drop_last = true;
  state.batch_size = 128;
  state.dataset_size = 60000;
  state.data = "data/train.npz";
  state.loss = "mse";
  state.output = "out";
  state.input = "x";
  state.parameters = {"w", "b"};
  state.running_stats = {"bn.mean"};
  state.optimizer.kind = OptimizerKind::kSgd;
  state.optimizer.momentum = 0.9;
  state.optimizer.nesterov = true;
  state.optimizer.weight_decay = 1e-4;
  state.optimizer.clip_norm = 1.5;
  state.lr_schedule.kind = LrSchedule::Kind::kCosine;
  state.lr_schedule.base_lr = 0.1;
  state.lr_schedule.warmup_steps = 5;
  state.lr_schedule.total_steps = 100;
  state.lr_schedule.min_lr = 1e-5;
  state.loss_scaler = LossScaler().ToJson();
  state.extra.Set("note", Json::String("hello"));
  state.moments["w"]["momentum"] = Tensor(DType::kFloat32, {2});

  const Json json = training::TrainingStateToJson(state);
  EXPECT_EQ(json.Find("seed")->as_string(), "18446744073709551615");
  EXPECT_EQ(json.Find("moments")->items()[0].as_string(), "castor.moment/momentum/w");
  absl::StatusOr<training::TrainingState> back = training::TrainingStateFromJson(*Json::Parse(json.Dump()), "test");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(training::TrainingStateToJson(*back).Dump(), json.Dump());
  EXPECT_EQ(back->seed, state.seed);
  EXPECT_EQ(back->optimizer.momentum, 0.9);
  EXPECT_EQ(back->lr_schedule.min_lr, 1e-5);
  EXPECT_EQ(back->moments.at("w").count("momentum"), 1u);

  Json broken = json;
  broken.Set("step", Json::String("twelve"));
  absl::StatusOr<training::TrainingState> error = training::TrainingStateFromJson(broken, "state");
  ASSERT_FALSE(error.ok());
  EXPECT_EQ(error.status().message(), "state: field 'step' must be an integer");
  broken = json;
  broken.Find("optimizer")->Set("kind", Json::String("lbfgs"));
  EXPECT_THAT(training::TrainingStateFromJson(broken, "state").status().message(),
              HasSubstr("state: optimizer: field 'kind' unknown optimizer 'lbfgs'"));

  std::string parameter, slot;
  EXPECT_TRUE(training::ParseMomentTensorName("castor.moment/m/enc/layer.0/w", &parameter, &slot));
  EXPECT_EQ(slot, "m");
  EXPECT_EQ(parameter, "enc/layer.0/w");
  EXPECT_FALSE(training::ParseMomentTensorName("castor.moment/m", &parameter, &slot));
  EXPECT_FALSE(training::ParseMomentTensorName("fc1.weight", &parameter, &slot));
}

TEST_F(CheckpointTest, WriteRefusesAnInconsistentCheckpointAndWritesNothing) {
  const training::Checkpoint good = TrainedCheckpoint("mlp_opset17", "float32", 1);
  const std::string path = (dir_ / "bad.onnx").string();
  auto refused = [&](training::Checkpoint checkpoint, const std::string& expected) {
    absl::StatusOr<training::WrittenCheckpoint> written = training::WriteCheckpoint(checkpoint, path);
    ASSERT_FALSE(written.ok()) << expected;
    EXPECT_TRUE(absl::IsInvalidArgument(written.status())) << written.status();
    EXPECT_THAT(written.status().message(), HasSubstr(path));
    EXPECT_THAT(written.status().message(), HasSubstr(expected));
    EXPECT_FALSE(fs::exists(path));
  };
  {
    training::Checkpoint c = CopyCheckpoint(good);
    c.state.parameters.push_back("fc9.weight");
    refused(std::move(c), "parameter 'fc9.weight' is not an initializer of the graph");
  }
  {
    training::Checkpoint c = CopyCheckpoint(good);
    c.state.moments["fc1.weight"]["m"] = Tensor(DType::kFloat32, {3});
    refused(std::move(c),
            "moment 'castor.moment/m/fc1.weight' is float32[3]; its parameter is "
            "float32[512,784]");
  }
  {
    training::Checkpoint c = CopyCheckpoint(good);
    c.state.moments["fc1.weight"]["momentum"] = c.state.moments["fc1.weight"]["m"];
    refused(std::move(c), "slot 'momentum' is not a slot of the adam optimizer (slots: m, v)");
  }
  {
    training::Checkpoint c = CopyCheckpoint(good);
    c.state.moments.erase("fc2.bias");
    refused(std::move(c), "parameter 'fc2.bias' has no 'm' moment although 1 update(s)");
  }
  {
    training::Checkpoint c = CopyCheckpoint(good);
    c.state.step = 5;  // 1 update, 0 skipped
    refused(std::move(c),
            "step 5 is not the optimizer's 1 updates plus the loss scaler's 0 "
            "skipped steps");
  }
  {
    training::Checkpoint c = CopyCheckpoint(good);
    std::erase(c.state.parameters, "fc1.bias");
    c.state.moments.erase("fc1.bias");
    c.state.running_stats.push_back("fc1.bias");
    refused(std::move(c), "running statistic 'fc1.bias' is not the running mean or variance");
  }
  {
    // The converted model instead of the float32 graph.
    training::Checkpoint c = CopyCheckpoint(good);
    ASSERT_TRUE(RunAutocast(c.model, *Policy::Builtin("mixed_float16")).ok());
    refused(std::move(c), "a checkpoint holds the float32 graph (StripAutocast");
  }
}

TEST_F(CheckpointTest, CorruptFilesAreDataLossNamingTheFile) {
  const training::Checkpoint checkpoint = TrainedCheckpoint("mlp_opset17", "mixed_float16", 2);
  const fs::path good = dir_ / "good.onnx";
  ASSERT_TRUE(training::WriteCheckpoint(checkpoint, good.string()).ok());
  const std::string bytes = ReadBytes(good);
  const fs::path bad = dir_ / "bad.onnx";
  auto expect_data_loss = [&](const std::string& what, const std::string& message) {
    absl::StatusOr<training::Checkpoint> read = training::ReadCheckpoint(bad.string());
    ASSERT_FALSE(read.ok()) << what;
    EXPECT_TRUE(absl::IsDataLoss(read.status())) << what << ": " << read.status();
    EXPECT_THAT(read.status().message(), HasSubstr(bad.string())) << what;
    EXPECT_THAT(read.status().message(), HasSubstr(message)) << what;
  };
  for (double fraction : {0.0001, 0.1, 0.5, 0.9, 0.9999}) {
    WriteBytes(bad, bytes.substr(0, static_cast<size_t>(bytes.size() * fraction)));
    expect_data_loss(absl::StrCat("truncated to ", fraction), "");
  }
  WriteBytes(bad, bytes.substr(0, bytes.size() - 1));
  expect_data_loss("one byte short", "");

  // One flipped bit in fc2.weight's data.
  const Tensor& weight = *checkpoint.model.graph->FindValue("fc2.weight")->initializer();
  const size_t at = FindTensorBytes(bytes, weight);
  ASSERT_NE(at, std::string::npos);
  std::string flipped = bytes;
  flipped[at + 33] ^= 0x10;
  WriteBytes(bad, flipped);
  expect_data_loss("bit flip in a weight", "data digest mismatch");
  // ... and in a moment.
  const Tensor& moment = checkpoint.state.moments.at("fc1.weight").at("v");
  const size_t moment_at = FindTensorBytes(bytes, moment);
  ASSERT_NE(moment_at, std::string::npos);
  flipped = bytes;
  flipped[moment_at + 7] ^= 0x01;
  WriteBytes(bad, flipped);
  expect_data_loss("bit flip in a moment", "data digest mismatch");

  WriteBytes(bad, ReadBytes(SampleModelPath("mlp_opset17")));
  expect_data_loss("a plain model", "not a castor checkpoint");
  std::mt19937 rng(3);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  WriteBytes(bad, noise);
  expect_data_loss("random bytes", "not a valid ONNX model");
  WriteBytes(bad, "");
  expect_data_loss("empty", "the file is empty");

  absl::StatusOr<training::Checkpoint> missing = training::ReadCheckpoint((dir_ / "missing.onnx").string());
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
}

TEST_F(CheckpointTest, SaveToCheckpointDirKeepsTheNewestK) {
  training::Checkpoint checkpoint = TrainedCheckpoint("mlp_opset17", "float32", 1);
  const fs::path dir = dir_ / "run";
  fs::create_directories(dir);
  WriteBytes(dir / "notes.txt", "mine");
  WriteBytes(dir / "ckpt-1.onnx", "not castor's name pattern");
  WriteBytes(dir / "ckpt-00000002.onnx.tmp.AbC123", "a killed writer's temporary file");
  training::CheckpointWriteOptions external;
  external.external_data_threshold_bytes = 1;
  std::vector<std::string> removed;
  for (int64_t step : {1, 2, 3, 4, 5}) {
    // Steps 3 and 4 use external data: pruning removes their data files too.
    checkpoint.state.step = step;
    checkpoint.state.optimizer_step = step;
    absl::StatusOr<training::SavedCheckpoint> saved = training::SaveToCheckpointDir(
        dir.string(), checkpoint, 2, step == 3 || step == 4 ? external : training::CheckpointWriteOptions{});
    ASSERT_TRUE(saved.ok()) << saved.status();
    EXPECT_EQ(saved->written.path, (dir / training::CheckpointFileName(step)).string());
    removed.insert(removed.end(), saved->removed.begin(), saved->removed.end());
  }
  EXPECT_THAT(removed, ElementsAre((dir / "ckpt-00000001.onnx").string(),
                                   (dir / "ckpt-00000002.onnx").string(),
                                   (dir / "ckpt-00000003.onnx").string()));
  std::vector<std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    files.push_back(entry.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 5u) << ::testing::PrintToString(files);
  EXPECT_EQ(files[0], "ckpt-00000004.onnx");
  EXPECT_TRUE(std::regex_match(files[1], std::regex(R"(ckpt-00000004\.onnx\.[0-9a-f]{16}\.data)")));
  EXPECT_EQ(files[2], "ckpt-00000005.onnx");
  EXPECT_EQ(files[3], "ckpt-1.onnx");
  EXPECT_EQ(files[4], "notes.txt");

  absl::StatusOr<std::vector<training::CheckpointFile>> listed = training::ListCheckpoints(dir.string());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].step, 4);
  EXPECT_EQ((*listed)[1].step, 5);
  EXPECT_EQ(training::CheckpointFileName(123456789), "ckpt-123456789.onnx");
}

TEST_F(CheckpointTest, FindLatestFallsBackFromACorruptNewest) {
  training::Checkpoint checkpoint = TrainedCheckpoint("mlp_opset17", "mixed_bfloat16", 1);
  const fs::path dir = dir_ / "run";
  EXPECT_TRUE(absl::IsNotFound(training::FindLatestCheckpoint(dir.string()).status()));
  fs::create_directories(dir);
  EXPECT_TRUE(absl::IsNotFound(training::FindLatestCheckpoint(dir.string()).status()));
  for (int64_t step : {10, 20, 30}) {
    checkpoint.state.step = step;
    checkpoint.state.optimizer_step = step;
    ASSERT_TRUE(training::SaveToCheckpointDir(dir.string(), checkpoint, 0).ok());
  }
  // A killed writer's temporary file is never taken for a checkpoint.
  WriteBytes(dir / "ckpt-00000040.onnx.tmp.x1y2z3",
             ReadBytes(dir / "ckpt-00000030.onnx").substr(0, 100));

  absl::StatusOr<training::FoundCheckpoint> found = training::FindLatestCheckpoint(dir.string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->path, (dir / "ckpt-00000030.onnx").string());
  EXPECT_EQ(found->checkpoint.state.step, 30);
  EXPECT_THAT(found->skipped, IsEmpty());

  const fs::path newest = dir / "ckpt-00000030.onnx";
  fs::resize_file(newest, fs::file_size(newest) / 2);
  found = training::FindLatestCheckpoint(dir.string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->path, (dir / "ckpt-00000020.onnx").string());
  EXPECT_EQ(found->checkpoint.state.step, 20);
  ASSERT_EQ(found->skipped.size(), 1u);
  EXPECT_THAT(found->skipped[0], HasSubstr(newest.string()));
  EXPECT_THAT(found->skipped[0], HasSubstr("not a valid ONNX model"));

  // A file given directly is read and checked, without fallback.
  EXPECT_TRUE(absl::IsDataLoss(training::FindLatestCheckpoint(newest.string()).status()));
  found = training::FindLatestCheckpoint((dir / "ckpt-00000010.onnx").string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->checkpoint.state.step, 10);

  for (const char* name : {"ckpt-00000010.onnx", "ckpt-00000020.onnx"}) {
    WriteBytes(dir / name, "garbage");
  }
  absl::StatusOr<training::FoundCheckpoint> none = training::FindLatestCheckpoint(dir.string());
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::IsDataLoss(none.status())) << none.status();
  EXPECT_THAT(none.status().message(), HasSubstr("none of its 3 checkpoints is usable"));
}

// kill -9 of a process that writes checkpoints to one path in a loop,
// alternating two contents: after every kill the file at the path reads,
// verifies and is one of the two; at most the one temporary file of the
// killed write is left, and it is never taken for a checkpoint. The child
// reports each completed write through a pipe; the parent waits for 0, 1 or
// 2 of them (so the content changes between kills), then kills after a
// random delay of up to 1.2 writes as the child writes on this machine now
// (the time between its completions), so kills land anywhere in a write.
void KillWhileSaving(const fs::path& dir, int kills, const training::CheckpointWriteOptions& options) {
  training::Checkpoint first = TrainedCheckpoint("resnet_opset17", "mixed_float16", 1);
  training::Checkpoint second = CopyCheckpoint(first);
  second.state.step += 1;
  second.state.optimizer_step += 1;
  second.state.position += 16;
  Tensor& weight =
      *second.model.graph->FindValue(second.state.parameters[0])->mutable_initializer();
  for (int64_t i = 0; i < weight.num_elements(); ++i) weight.data<float>()[i] *= 0.5f;
  const fs::path path = dir / training::CheckpointFileName(7);
  ASSERT_TRUE(training::WriteCheckpoint(first, path.string(), options).ok());

  using Clock = std::chrono::steady_clock;
  const std::regex temp_pattern(R"(ckpt-00000007\.onnx(\.[0-9a-f]{16}\.data)?\.tmp\.\w{6})");
  const std::regex data_pattern(R"(ckpt-00000007\.onnx\.[0-9a-f]{16}\.data)");
  std::mt19937 rng(2024);
  std::uniform_int_distribution<int> completions_to_wait(0, 2);
  std::uniform_real_distribution<double> fraction_of_a_write(0.0, 1.2);
  double child_write_ms = 0;  // running mean of the child's write time
  int write_time_samples = 0;
  int kills_leaving_temp = 0, changes = 0;
  int64_t completed_writes = 0;
  int64_t previous_step = first.state.step;
  for (int kill_index = 0; kill_index < kills; ++kill_index) {
    int completions[2];
    ASSERT_EQ(pipe(completions), 0);
    std::cout.flush();
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(completions[0]);
      for (int k = 0;; ++k) {  // never returns: killed by the parent
        if (training::WriteCheckpoint(k % 2 == 0 ? second : first, path.string(), options).ok()) {
          const char done = 1;
          (void)!write(completions[1], &done, 1);
        }
      }
    }
    close(completions[1]);
    // Wait for the child's completed writes (a minute at most each).
    const int wait_for = completions_to_wait(rng);
    Clock::time_point last_completion = Clock::now();
    for (int k = 0; k < wait_for; ++k) {
      pollfd ready{completions[0], POLLIN, 0};
      ASSERT_EQ(poll(&ready, 1, 60000), 1) << "the writer completed no write in a minute";
      char done = 0;
      ASSERT_EQ(read(completions[0], &done, 1), 1);
      ++completed_writes;
      const Clock::time_point now = Clock::now();
      if (k > 0) {  // a whole write between two completions
        const double ms = std::chrono::duration<double, std::milli>(now - last_completion).count();
        child_write_ms = (child_write_ms * write_time_samples + ms) / (write_time_samples + 1);
        ++write_time_samples;
      }
      last_completion = now;
    }
    const double estimate_ms = write_time_samples > 0 ? child_write_ms : 20.0;
    std::this_thread::sleep_for(std::chrono::microseconds(
        static_cast<int64_t>(1000 * estimate_ms * fraction_of_a_write(rng))));
    ASSERT_EQ(kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status));
    fcntl(completions[0], F_SETFL, O_NONBLOCK);
    char buffer[256];
    for (ssize_t n; (n = read(completions[0], buffer, sizeof(buffer))) > 0;) completed_writes += n;
    close(completions[0]);

    absl::StatusOr<training::Checkpoint> read = training::ReadCheckpoint(path.string());
    ASSERT_TRUE(read.ok()) << "after kill " << kill_index << ": " << read.status();
    ASSERT_THAT(training::FindCheckpointInconsistencies(*read), IsEmpty()) << "after kill " << kill_index;
    const int64_t step = read->state.step;
    ASSERT_TRUE(step == first.state.step || step == second.state.step) << step;
    changes += step != previous_step;
    previous_step = step;

    int temps = 0, data_files = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name == path.filename().string()) continue;
      if (std::regex_match(name, temp_pattern)) {
        ++temps;
      } else if (std::regex_match(name, data_pattern)) {
        ++data_files;
      } else {
        ADD_FAILURE() << "unexpected file " << name << " after kill " << kill_index;
      }
    }
    ASSERT_LE(temps, 1) << "after kill " << kill_index;
    // The data file the model references, and one that a killed write
    // renamed into place before it could rename the model file.
    ASSERT_LE(data_files, read->external_data_file.empty() ? 0 : 2) << "after kill " << kill_index;
    kills_leaving_temp += temps;
    // The temporary file is not a checkpoint of the directory.
    absl::StatusOr<std::vector<training::CheckpointFile>> listed = training::ListCheckpoints(dir.string());
    ASSERT_TRUE(listed.ok());
    ASSERT_EQ(listed->size(), 1u);
    EXPECT_EQ((*listed)[0].path, path.string());
  }
  // Kills landed in the middle of writes, and writes completed between them.
  EXPECT_GT(kills_leaving_temp, 0);
  EXPECT_GT(changes, kills / 10);
  std::cout << "[ kill -9  ] " << kills << " kills (one write: " << child_write_ms
            << " ms): " << completed_writes << " writes completed, " << kills_leaving_temp
            << " kills left the temporary file of an interrupted write, " << changes
            << " found the other content; the file verified after every kill\n";
}

TEST_F(CheckpointTest, KillDuringSaveAlwaysLeavesAVerifiableCheckpoint) {
  KillWhileSaving(dir_, 200, training::CheckpointWriteOptions{});
}

TEST_F(CheckpointTest, KillDuringSaveWithExternalDataAlwaysLeavesAVerifiableCheckpoint) {
  training::CheckpointWriteOptions options;
  options.external_data_threshold_bytes = 1;
  KillWhileSaving(dir_, 100, options);
}

}  // namespace
}  // namespace castor::tools
