// The library steps of a training run (see session.h).
#include "training/session.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "graph/json.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "graph/status.h"
#include "passes/autocast.h"

namespace castor::training {
namespace {

// The dtype each node of the float32 `model` computes in under `policy`,
// in the training graph.
absl::StatusOr<std::map<std::string, std::string>> NodeDTypes(const Model& model,
                                                              const Policy& policy) {
  CASTOR_ASSIGN_OR_RETURN(Model converted, CloneModel(model));
  CASTOR_RETURN_IF_ERROR(InferTypes(converted));
  AutocastOptions options;
  options.training_graph_ops = true;
  CASTOR_RETURN_IF_ERROR(RunAutocast(converted, policy, options).status());
  std::map<std::string, std::string> dtypes;
  for (const Node* node : converted.graph->nodes()) {
    if (node->FindMetadata(kInsertedCastKey) != nullptr) continue;
    const std::string* dtype = node->FindMetadata(kNodeDTypeKey);
    dtypes[node->name()] = dtype != nullptr ? *dtype : "-";
  }
  return dtypes;
}

}  // namespace

absl::StatusOr<bool> RecordedTf32(const TrainingState& state) {
  const Json* recorded = state.extra.Find(kTf32StateKey);
  if (recorded == nullptr) return false;
  if (!recorded->is_bool()) {
    return absl::InvalidArgumentError(
        absl::StrCat("records tf32 as ", recorded->Dump(), "; expected true or false"));
  }
  return recorded->as_bool();
}

absl::StatusOr<RngState> RecordedRngState(const TrainingState& state) {
  const Json* recorded = state.extra.Find(kRngStateKey);
  if (recorded == nullptr) return RngState{state.seed, state.step};
  const Json* seed = recorded->is_object() ? recorded->Find("seed") : nullptr;
  const Json* counter = recorded->is_object() ? recorded->Find("counter") : nullptr;
  if (seed == nullptr || counter == nullptr || !seed->is_int() || !counter->is_int() ||
      counter->as_int() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "records rng as ", recorded->Dump(),
        "; expected {\"seed\": integer, \"counter\": integer >= 0}"));
  }
  return RngState{static_cast<uint64_t>(seed->as_int()), counter->as_int()};
}

absl::StatusOr<std::optional<int64_t>> RecordedIgnoreIndex(const TrainingState& state) {
  const Json* recorded = state.extra.Find(kIgnoreIndexStateKey);
  if (recorded == nullptr) return std::optional<int64_t>();
  if (!recorded->is_int()) {
    return absl::InvalidArgumentError(absl::StrCat("records ignore_index as ", recorded->Dump(),
                                                   "; expected an integer"));
  }
  return std::optional<int64_t>(recorded->as_int());
}

int64_t TotalSteps(int64_t train_size, int64_t batch, int64_t epochs, int64_t max_steps) {
  const int64_t per_epoch = (train_size + batch - 1) / batch;
  int64_t total = per_epoch * epochs;
  if (max_steps > 0) total = std::min(total, max_steps);
  return total;
}

absl::StatusOr<std::vector<std::string>> PolicyChangeByNode(const Model& model,
                                                            const Policy& from,
                                                            const Policy& to) {
  CASTOR_ASSIGN_OR_RETURN(auto before, NodeDTypes(model, from));
  CASTOR_ASSIGN_OR_RETURN(auto after, NodeDTypes(model, to));
  std::vector<std::string> changes;
  for (const Node* node : model.graph->nodes()) {
    const std::string& was = before[node->name()];
    const std::string& now = after[node->name()];
    if (was != now) {
      changes.push_back(
          absl::StrCat("node '", node->name(), "' (", node->op_type(), "): ", was, " -> ", now));
    }
  }
  return changes;
}

absl::Status RestoreTrainer(Trainer& trainer, TrainingState& saved, const Model& float32_model,
                            std::optional<bool> scaler_enabled) {
  absl::StatusOr<Optimizer> optimizer =
      Optimizer::Restore(saved.optimizer, saved.optimizer_step, std::move(saved.moments));
  // The scaler keeps its scale and counters (a checkpoint's step count is
  // its updates plus its skipped steps); a policy change only switches it
  // on or off as the new policy's default says.
  Json scaler_state = saved.loss_scaler;
  if (scaler_enabled.has_value() && scaler_state.is_object()) {
    scaler_state.Set("enabled", Json::Bool(*scaler_enabled));
  }
  absl::StatusOr<LossScaler> scaler = LossScaler::FromJson(scaler_state);
  std::map<std::string, Tensor> weights;  // the checkpoint's, by name
  for (const std::string& name : trainer.state_names()) {
    const Value* value = float32_model.graph->FindValue(name);
    if (value != nullptr && value->initializer() != nullptr) {
      weights[name] = *value->initializer();
    }
  }
  if (!optimizer.ok()) return optimizer.status();
  if (!scaler.ok()) return scaler.status();
  CASTOR_ASSIGN_OR_RETURN(const RngState rng, RecordedRngState(saved));
  CASTOR_RETURN_IF_ERROR(
      trainer.Restore(weights, *std::move(optimizer), *std::move(scaler), saved.step));
  trainer.set_rng_state(rng);
  return absl::OkStatus();
}

absl::Status RecordTrainingState(const Trainer& trainer, const BatchIterator& batches,
                                 const Dataset& train, const TrainerOptions& trainer_options,
                                 const RunSettings& settings, Checkpoint& checkpoint) {
  CASTOR_ASSIGN_OR_RETURN(Trainer::Snapshot snapshot, trainer.TakeSnapshot());
  CASTOR_RETURN_IF_ERROR(SetInitializers(checkpoint.model, snapshot.state));
  TrainingState& state = checkpoint.state;
  state.step = trainer.steps();
  state.optimizer_step = snapshot.optimizer.step();
  state.epoch = batches.epoch();
  state.position = batches.position();
  state.seed = settings.seed;
  state.shuffle = settings.shuffle;
  state.drop_last = false;
  state.batch_size = settings.batch;
  state.dataset_size = train.size();
  state.data = settings.data;
  state.loss = settings.loss;
  state.output = settings.output;
  state.input = settings.input;
  state.parameters.clear();
  for (const auto& [parameter, gradient] : trainer.training_graph().gradients) {
    state.parameters.push_back(parameter);
  }
  state.running_stats.clear();
  for (const auto& [statistic, updated] : trainer.training_graph().running_stats) {
    state.running_stats.push_back(statistic);
  }
  state.optimizer = trainer_options.optimizer;
  state.lr_schedule = trainer_options.lr;
  state.loss_scaler = trainer.scaler().ToJson();
  state.moments = snapshot.optimizer.state();
  // Whether float32 MatMul/Gemm/Conv ran on TF32 (--tf32 on CUDA): a resumed
  // run continues the same way unless told otherwise.
  state.extra.Set(kTf32StateKey, Json::Bool(settings.tf32));
  if (settings.ignore_index.has_value()) {
    state.extra.Set(kIgnoreIndexStateKey, Json::Int(*settings.ignore_index));
  }
  // Fine-tuning: the parameters that train are state.parameters; the
  // patterns that chose them, so that a resumed run keeps the others fixed.
  if (!settings.freeze.empty()) state.extra.Set(kFreezeStateKey, Json::String(settings.freeze));
  if (settings.world_size > 1) state.extra.Set(kWorldSizeStateKey, Json::Int(settings.world_size));
  if (settings.sync_batch_norm) state.extra.Set(kSyncBatchNormStateKey, Json::Bool(true));
  if (!settings.train_only.empty()) {
    state.extra.Set(kTrainOnlyStateKey, Json::String(settings.train_only));
  }
  // Dropout's masks continue where they were.
  Json rng = Json::Object();
  rng.Set("seed", Json::Int(static_cast<int64_t>(trainer.rng_state().seed)));
  rng.Set("counter", Json::Int(trainer.rng_state().counter));
  state.extra.Set(kRngStateKey, std::move(rng));
  return absl::OkStatus();
}

Scored ScoreBatch(const Tensor& output, const Tensor& labels,
                  std::optional<int64_t> ignore_index) {
  Scored scored;
  if (labels.dtype() != DType::kInt64) return scored;  // float targets: no classes to score
  const int64_t rows = labels.num_elements();
  const int64_t classes = rows > 0 ? output.num_elements() / rows : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t label = labels.data<int64_t>()[r];
    if (ignore_index.has_value() && label == *ignore_index) continue;
    ++scored.counted;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (output.GetDouble(r * classes + c) > output.GetDouble(r * classes + best)) best = c;
    }
    scored.correct += best == label;
  }
  return scored;
}

int64_t CountCorrect(const Tensor& output, const Tensor& labels) {
  return ScoreBatch(output, labels, std::nullopt).correct;
}

absl::StatusOr<Evaluation> Evaluate(Trainer& trainer, const Dataset& test,
                                    const std::string& input, int64_t batch,
                                    std::optional<int64_t> ignore_index) {
  CASTOR_ASSIGN_OR_RETURN(BatchIterator batches,
                          BatchIterator::Create(test, BatchOptions{batch, false, 0, false}));
  double loss_sum = 0;
  int64_t correct = 0, seen = 0, elements = 0;
  while (batches.epoch() == 0) {
    Batch b = batches.Next();
    CASTOR_ASSIGN_OR_RETURN(StepResult r, trainer.Evaluate(BatchFeeds(b, input), b.labels));
    const Scored scored = ScoreBatch(r.output, b.labels, ignore_index);
    // The batch's loss is the mean over its counted positions (a batch
    // with none has a NaN mean and adds nothing).
    if (b.labels.dtype() != DType::kInt64) {
      // Float targets (mse, bce): the loss is a mean over elements; the
      // model's own loss (no labels): a mean over the batch's samples.
      const int64_t weight = b.labels.dtype() == DType::kUndefined
                                 ? static_cast<int64_t>(b.indices.size())
                                 : b.labels.num_elements();
      loss_sum += r.loss * weight;
      elements += weight;
      continue;
    }
    if (scored.counted > 0) loss_sum += r.loss * scored.counted;
    correct += scored.correct;
    seen += scored.counted;
  }
  if (elements > 0) return Evaluation{loss_sum / elements, std::nan("")};
  return Evaluation{loss_sum / seen, static_cast<double>(correct) / seen};
}

absl::Status TrimMetrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return absl::OkStatus();
  std::string kept, line;
  while (std::getline(in, line)) {
    absl::StatusOr<Json> json = Json::Parse(line);
    if (!json.ok() || !json->is_object()) continue;
    const Json* line_step = json->Find("step");
    if (line_step != nullptr && line_step->is_int() && line_step->as_int() <= step) {
      absl::StrAppend(&kept, line, "\n");
    }
  }
  return WriteFileAtomically(path, kept);
}

}  // namespace castor::training
