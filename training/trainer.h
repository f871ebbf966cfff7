// One training step on a backend: the training graph
// (passes/training_graph.h) runs with its outputs left in backend memory,
// then the backend's step kernels (backend/step_kernels.h) unscale and
// check every gradient in one pass, decide the step and move the loss
// scale, apply the optimizer to all float32 master weights at once and
// commit the BatchNormalization running statistics. Weights, optimizer
// moments, the loss scale and the scaler's counters all live in backend
// memory; the host queues the whole step without waiting and reads back
// only what it logs (the StepState, the loss and the model output). On an
// overflow nothing the model holds changes: weights, optimizer moments and
// running statistics stay bit-identical, the scale backs off and the step
// is counted as skipped.
//
// Data parallelism (TrainerOptions::communicator, issue #31): each rank
// steps on its shard of the global batch; before the step kernels the loss
// and every gradient are averaged across the ranks. On a backend with
// device collectives (Backend::device_collectives(): NCCL on CUDA) every
// rank joins their group when the trainer is created
// (distributed/device_group.h), and each step averages the loss and the
// gradients in the backend's memory, as one group queued after the
// backward pass on the backend's stream; the step waits for it (at most
// collective_timeout) before reading its results. Otherwise they go
// through the host, in buckets (distributed/bucketed_allreduce.h): on a
// synchronous backend (the CPU) a gradient joins a bucket as soon as its
// node ran and a full bucket is all-reduced while the backward pass goes
// on, as in PyTorch DDP; elsewhere, or with allreduce_bucket_bytes 0,
// everything is one allreduce after the backward pass. With
// sync_batch_norm the batch-statistics kernels sum their statistics
// across the ranks through the host communicator's thread.
// The step kernels then see the
// same values on every rank, so an inf/NaN on any rank skips the step on
// all of them, the loss scale moves the same way everywhere, and the
// optimizer update is bit-identical on every rank. Such steps are not
// replayed.
//
// Replay (CUDA graphs): on a backend that can record queued work, the
// first step whose batch shapes an earlier step already had is recorded once (the training
// graph and the step kernels, reading its feeds from fixed backend buffers)
// and every later step with those shapes only copies its batch into those
// buffers and replays the recording: no per-node host work at all. Steps
// with other shapes (an epoch's last, smaller batch) run node by node as
// before. A recording that fails (a kernel that must read the device on the
// host, say) is reported in replay_unavailable() and the trainer stays with
// node-by-node steps; one that fails on the batch itself (InvalidArgument:
// a bad label) is not: that step runs node by node and reports the error,
// and a later step records. Feeds must be floating point, apart from the labels,
// which the trainer checks on the host before each replay (a recording
// would not see their values).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "backend/device_collectives.h"
#include "backend/executor.h"
#include "graph/graph.h"
#include "training/loss_scaler.h"
#include "training/optimizer.h"
#include "passes/training_graph.h"
#include "training/distributed/bucketed_allreduce.h"
#include "training/distributed/communicator.h"
#include "training/distributed/device_group.h"

namespace castor::training {

struct TrainerOptions {
  OptimizerOptions optimizer;
  LrSchedule lr;
  LossScalerOptions scaler;
  // On a skipped step, find the first non-finite node (costs one more run).
  bool name_first_non_finite = true;
  // Replay steps as one recording where the backend can (see above).
  bool replay_steps = true;
  // The seed of Dropout's masks (the run's --seed): with the counter, the
  // RNG state the training graph reads (castor.rng).
  uint64_t rng_seed = 0;
  // The group this trainer is one rank of (see above); null: on its own.
  // Must outlive the trainer.
  distributed::Communicator* communicator = nullptr;
  // Data-parallel steps: the size of the gradient buckets all-reduced
  // while the backward pass runs (DDP's default, 25 MiB; the first holds
  // 1 MiB); 0: one allreduce after the backward pass.
  size_t allreduce_bucket_bytes = size_t{25} << 20;
  // Data-parallel steps on a backend with device collectives: average in
  // the backend's memory (see above); false: always through the host.
  bool device_collectives = true;
  // How long the device collectives wait for the other ranks (joining,
  // each step's average) before they fail: the run's --dist-timeout.
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(300)};
  // Data-parallel steps: BatchNormalization's batch statistics (and their
  // gradient sums) over the global batch, summed across the ranks
  // (PyTorch's SyncBatchNorm), instead of each rank's own. Needs a backend
  // that supports_cross_rank_sum (the CPU).
  bool sync_batch_norm = false;
  // Time each node's kernel in the training graph's runs (the executor's
  // time_kernels: the backend waits after each, and steps are not
  // replayed); read them with kernel_times(). For profiling.
  bool time_kernels = false;
};

// Dropout's RNG state: the masks of a training-graph run are a function of
// (seed, counter, node, element) (backend/common/philox.h); the counter
// counts the runs of the training graph, skipped steps included. A
// checkpoint records it, so a resumed run draws the masks the
// uninterrupted one would have.
struct RngState {
  uint64_t seed = 0;
  int64_t counter = 0;
};

struct StepResult {
  int64_t step = 0;         // steps taken, skipped ones included
  double loss = 0.0;        // unscaled
  bool skipped = false;
  double loss_scale = 1.0;  // the scale this step used
  double lr = 0.0;
  double grad_norm = 0.0;   // global L2 norm of the unscaled gradients (0 when skipped)
  std::string diagnosis;    // from the loss scaler, when the floor is hit repeatedly
  // On a skipped step: the first node whose output went inf/NaN, e.g.
  // "node 'fc1/grad/MatMul' (MatMul) output 'fc1.weight/grad': 12 of 4096
  // elements non-finite"; "" when not searched or not found.
  std::string first_non_finite;
  Tensor output;            // the model output the loss is attached to
  bool replayed = false;    // the step was a replay of the recorded step
  // Data-parallel runs: the bytes this rank all-reduced (the loss and the
  // gradients: as float32 through the host, in their own dtypes in device
  // memory) and how long the allreduce took, waiting for the slowest rank
  // included (on the device: the group's time on the stream); 0 on a run
  // alone.
  int64_t allreduce_bytes = 0;
  double allreduce_seconds = 0.0;
  // Of which the step waited after its backward pass (the part the
  // backward pass did not hide: all of it on the device, where the group
  // runs after the backward pass), and the number of buckets (one group on
  // the device).
  double allreduce_wait_seconds = 0.0;
  int allreduce_buckets = 0;
};

class Trainer {
 public:
  // `model` must already be the training graph BuildTrainingGraph made,
  // with `graph` its description.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(Model model, TrainingGraph graph,
                                                         const TrainerOptions& options,
                                                         Backend& backend);
  ~Trainer();

  // One step on a batch: `inputs` feed the model's inputs by name, `labels`
  // the loss's targets (unused with the model's own loss, kModelOutput).
  absl::StatusOr<StepResult> Step(std::vector<std::pair<std::string, Tensor>> inputs,
                                  Tensor labels);

  // The loss and model output on a batch without changing anything: the
  // forward-only evaluation graph, with BatchNormalization reading its
  // running statistics.
  absl::StatusOr<StepResult> Evaluate(std::vector<std::pair<std::string, Tensor>> inputs,
                                      Tensor labels);

  // Continues a saved run (a checkpoint): the weights and running
  // statistics by name (every name of state_names(), same dtype and dims),
  // the optimizer with its step and moments, the loss scaler, and the
  // number of steps taken. All of it is copied to the backend.
  absl::Status Restore(const std::map<std::string, Tensor>& state, const Optimizer& optimizer,
                       const LossScaler& scaler, int64_t steps);

  // The RNG state the next step's Dropouts draw with, and setting it (a
  // resumed run's, from its checkpoint).
  RngState rng_state() const { return rng_; }
  void set_rng_state(RngState rng) { rng_ = rng; }

  // The largest peak of activation bytes of any step so far (the
  // executor's plan statistics; a replayed step counts its recording's), so
  // an epoch's smaller last batch does not lower it.
  int64_t peak_activation_bytes() const { return peak_activation_bytes_; }

  // The training state copied from the backend: the float32 master weights
  // and BatchNormalization statistics by name, and the optimizer with its
  // step and moments (none before the first update).
  struct Snapshot {
    std::map<std::string, Tensor> state;
    Optimizer optimizer;
  };
  absl::StatusOr<Snapshot> TakeSnapshot() const;

  // The names of the training state: parameters, then running statistics.
  const std::vector<std::string>& state_names() const { return state_names_; }
  // The loss scaler as of the latest step (read back with its result).
  const LossScaler& scaler() const { return scaler_; }
  // Optimizer updates applied (skipped steps do not count).
  int64_t optimizer_step() const { return optimizer_step_; }
  const Model& model() const { return model_; }
  const TrainingGraph& training_graph() const { return graph_; }
  int64_t steps() const { return steps_; }
  // Steps that were replays of the recorded step.
  int64_t replayed_steps() const { return replayed_steps_; }
  // Why steps are not replayed ("" while they are or still may be): turned
  // off, the backend cannot record, or the recording failed (with why).
  const std::string& replay_unavailable() const { return replay_unavailable_; }
  // What averages a data-parallel step: the device collectives' engine
  // ("NCCL 2.28.9") or the host communicator's ("Gloo"); "" on its own.
  std::string allreduce_engine() const;
  // Each training-graph node's kernel time over the steps so far, in run
  // order (empty unless TrainerOptions::time_kernels).
  const std::vector<KernelTime>& kernel_times() const { return executor_->kernel_times(); }

 private:
  // Backend memory the trainer owns (optimizer slots, the StepState).
  using BackendMemory = std::unique_ptr<void, std::function<void(void*)>>;

  Trainer(Model model, TrainingGraph graph, Backend& backend, StepConfig config,
          LossScaler scaler)
      : model_(std::move(model)),
        graph_(std::move(graph)),
        backend_(backend),
        config_(config),
        scaler_(std::move(scaler)) {}

  using Feeds = std::vector<std::pair<std::string, Tensor>>;

  // The recorded step: fixed backend buffers its feeds are copied into
  // (feed order as recorded), the graph outputs it leaves behind (loss,
  // model output, gradients, running statistics) and the work to replay.
  struct RecordedStep {
    std::string signature;  // FeedSignature of the feeds it was recorded with
    std::vector<std::pair<std::string, TensorView>> feeds;
    std::vector<BackendMemory> feed_memory;
    std::vector<TensorView> outputs;
    std::unique_ptr<CapturedWork> work;
  };

  absl::Status Initialize();
  // The graph outputs the last executor run left on the backend.
  absl::StatusOr<std::vector<TensorView>> ExecutorOutputs() const;
  // Whether graph output `index` is averaged across the ranks: the loss
  // and the gradients.
  bool Averaged(int index) const;
  // Hands graph output `index` (if averaged) to the buckets as float32.
  absl::Status StageForAverage(int index, const TensorView& value);
  // Averages the loss and the gradients among `outputs` across the ranks,
  // in place (nothing without a communicator): queues the device group's
  // average, or stages those the backward pass has not handed over yet,
  // waits for the buckets and copies back.
  absl::Status AverageAcrossRanks(const std::vector<TensorView>& outputs);
  // Queues the end of the step on the graph outputs: unscale and decide,
  // the optimizer, the running statistics.
  absl::Status QueueStepEnd(const std::vector<TensorView>& outputs);
  // Waits for the step, reads back what it logs and counts it; on a skipped
  // step, looks for the first non-finite node (an extra run on `inputs`).
  absl::StatusOr<StepResult> FinishStep(const std::vector<TensorView>& outputs, Feeds& inputs,
                                        bool replayed);
  // Records the step on `inputs` (the backend runs nothing yet); on failure
  // nothing is recorded and the backend is as before.
  absl::Status Record(const Feeds& inputs);
  // Copies `inputs` (in the recording's feed order: the caller compared the
  // signatures) into the recording's buffers, checking the labels' range
  // first.
  absl::Status LoadRecordedFeeds(const Feeds& inputs);
  absl::StatusOr<BackendMemory> Allocate(size_t bytes);
  // Writes rng_ into the training graph's castor.rng (when it has one).
  absl::Status WriteRngState();
  // Copies the optimizer's moments (zeros where it has none), the scaler
  // and the optimizer step to the backend.
  absl::Status UploadOptimizerAndScaler(const Optimizer& optimizer);

  Model model_;
  TrainingGraph graph_;
  Backend& backend_;
  StepKernels* kernels_ = nullptr;
  StepConfig config_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Executor> eval_executor_;
  bool eval_stale_ = false;  // the evaluation graph's weights lag the training graph's
  bool name_first_non_finite_ = true;
  bool time_kernels_ = false;
  std::vector<std::string> state_names_;
  // Per parameter (training-graph order): resident weight, slots; the
  // gradient view is filled in each step.
  std::vector<ParameterUpdate> parameters_;
  std::vector<BackendMemory> slot_memory_;
  BackendMemory step_state_;      // a StepState
  float* loss_scale_ = nullptr;   // the training graph's resident loss-scale input
  LossScaler scaler_;             // host copy, refreshed after every step
  int64_t optimizer_step_ = 0;    // host copy
  int64_t steps_ = 0;
  RngState rng_;
  int64_t peak_activation_bytes_ = 0;
  distributed::Communicator* communicator_ = nullptr;
  std::unique_ptr<distributed::BucketedAllreduce> buckets_;  // with a communicator
  // With a communicator, on a backend with device collectives (joined in
  // Create): each step's average, and its bytes.
  std::unique_ptr<DeviceCollectiveGroup> device_group_;
  int64_t device_average_bytes_ = 0;
  std::vector<uint16_t> staged_bits_;  // 16-bit gradients on their way to float32
  bool staging_gradients_ = false;     // the step's run: its outputs go to the buckets
  // Replay: the feed signatures of node-by-node steps that ran (a repeat is
  // recorded), and the recording, declared last so that it goes first (it
  // uses the executor's buffers and the backend's stream).
  std::string replay_unavailable_;
  std::set<std::string> run_signatures_;
  int64_t replayed_steps_ = 0;
  std::unique_ptr<RecordedStep> recorded_;
};

}  // namespace castor::training
