// The library steps of one training run that `castor train` strings
// together (tools/train_command.cc keeps the flags and the printing):
// the number of steps, the node-level effect of a policy change on resume,
// restoring a trainer from a checkpoint's state and recording its state for
// the next checkpoint, evaluation on the test split, and trimming the
// metrics file back to a resumed step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/tensor.h"
#include "passes/policy.h"
#include "training/checkpoint.h"
#include "training/dataset.h"
#include "training/trainer.h"

namespace castor::training {

// The key in TrainingState::extra recording whether float32
// MatMul/Gemm/Conv ran on TF32 (--tf32 on CUDA).
inline constexpr char kTf32StateKey[] = "tf32";
// The key in TrainingState::extra recording the cross-entropy ignore index
// (--ignore-index); absent when none was given.
inline constexpr char kIgnoreIndexStateKey[] = "ignore_index";

// The key in TrainingState::extra recording Dropout's RNG state (an object
// {"seed": S, "counter": C}, Trainer::rng_state()).
inline constexpr char kRngStateKey[] = "rng";
// The keys in TrainingState::extra recording the fine-tuning patterns
// (--freeze, --train-only); absent when not given.
inline constexpr char kFreezeStateKey[] = "freeze";
inline constexpr char kTrainOnlyStateKey[] = "train_only";
// The key in TrainingState::extra recording the world size of a
// data-parallel run (ranks); absent for a run on its own.
inline constexpr char kWorldSizeStateKey[] = "world_size";
// The key recording that BatchNormalization's statistics were synchronised
// across the ranks (--sync-batchnorm); absent when not.
inline constexpr char kSyncBatchNormStateKey[] = "sync_batchnorm";

// A checkpoint's Dropout RNG state. A checkpoint written before it was
// recorded gets {the run's seed, the checkpoint's step}: the state this
// castor reaches after that many steps (its Dropouts drew with the older
// per-node MT19937 scheme, the same mask every step). InvalidArgument
// "records rng as V; expected ..." when the entry is malformed.
absl::StatusOr<RngState> RecordedRngState(const TrainingState& state);

// Whether a checkpoint's run used TF32; false for checkpoints from before it
// was recorded. InvalidArgument "records tf32 as V; expected true or false"
// when the entry is not a bool.
absl::StatusOr<bool> RecordedTf32(const TrainingState& state);

// A checkpoint's ignore index; none when it records none. InvalidArgument
// "records ignore_index as V; expected an integer" when it is not one.
absl::StatusOr<std::optional<int64_t>> RecordedIgnoreIndex(const TrainingState& state);

// Steps a run takes in all: ceil(train_size / batch) per epoch, `epochs`
// epochs, at most `max_steps` when positive.
int64_t TotalSteps(int64_t train_size, int64_t batch, int64_t epochs, int64_t max_steps);

// "node 'conv1' (Conv): float16 -> bfloat16" for every node of the float32
// `model` whose autocast dtype differs between the two policies, in graph
// order ("-" for a node autocast gives no dtype).
absl::StatusOr<std::vector<std::string>> PolicyChangeByNode(const Model& model,
                                                            const Policy& from,
                                                            const Policy& to);

// Puts a checkpoint's state into a freshly created `trainer`: the weights
// and statistics of `float32_model` for every state name it holds, the
// optimizer with its step and moments (moved out of `saved`), the loss
// scaler with its scale and counters, the step count and Dropout's RNG
// state (RecordedRngState). When
// `scaler_enabled` is set (a policy change), the scaler is switched on or
// off as it says and keeps the rest.
absl::Status RestoreTrainer(Trainer& trainer, TrainingState& saved, const Model& float32_model,
                            std::optional<bool> scaler_enabled);

// How a run was set up, as its checkpoints record it.
struct RunSettings {
  std::string data;    // the --data spec
  std::string loss;    // "cross-entropy", "mse" or "output"
  std::string output;  // the model output the loss is attached to
  std::string input;   // the model input the images feed
  int64_t batch = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  bool tf32 = false;  // as it took effect
  std::optional<int64_t> ignore_index;  // the cross-entropy ignore index
  std::string freeze;      // --freeze ("" when not given)
  std::string train_only;  // --train-only ("" when not given)
  int world_size = 1;      // data-parallel ranks (recorded when > 1)
  bool sync_batch_norm = false;  // --sync-batchnorm on several ranks (recorded when set)
};

// The checkpoint's model gets the trainer's weights and statistics, its
// state the step, data position, settings, optimizer, schedule, loss scaler
// and moments: what a resumed run needs to continue bit for bit.
absl::Status RecordTrainingState(const Trainer& trainer, const BatchIterator& batches,
                                 const Dataset& train, const TrainerOptions& trainer_options,
                                 const RunSettings& settings, Checkpoint& checkpoint);

// Correct predictions (argmax of each row of `output` [B, C]) in a batch.
// With per-position labels [B, T, ...] and output [B, T, ..., C] (class axis
// last) each position is a row: token accuracy.
int64_t CountCorrect(const Tensor& output, const Tensor& labels);

// The predictions a batch scores: `counted` rows (label positions whose
// label is not `ignore_index`), `correct` of them right (as CountCorrect).
struct Scored {
  int64_t correct = 0;
  int64_t counted = 0;
};
Scored ScoreBatch(const Tensor& output, const Tensor& labels,
                  std::optional<int64_t> ignore_index);

struct Evaluation {
  double loss = 0;
  double accuracy = 0;  // NaN for float targets (mse, bce): no classes to score
};

// Mean loss and accuracy over the whole `test` split, in order, in batches
// of `batch`, `input` fed the images (or ids). Both are over label
// positions (tokens, for [N, T] labels) not equal to `ignore_index`.
absl::StatusOr<Evaluation> Evaluate(Trainer& trainer, const Dataset& test,
                                    const std::string& input, int64_t batch,
                                    std::optional<int64_t> ignore_index = std::nullopt);

// Keeps the metrics lines of steps up to `step` (JSON objects with a "step"
// at most `step`), dropping later ones and a torn last line; rewritten
// atomically. A missing file is fine.
absl::Status TrimMetrics(const std::string& path, int64_t step);

}  // namespace castor::training
