// `castor train MODEL --data ...`: converts the model under a policy, builds
// its training graph, and trains it on the CUDA or the CPU backend
// (--backend) with dynamic loss scaling: a live progress line (plain
// periodic lines when stderr is not a terminal), JSONL metrics per step and
// per evaluation and a closing summary record, an evaluation on the test
// split per epoch (or every --eval-every steps), checkpoints in
// --checkpoint-dir that --resume continues bit for bit, and a closing
// summary (policy, how many weights are float32, steps and skipped steps,
// final loss scale, backend, CUDA graph replay, peak memory, step time, test
// loss and accuracy, the last checkpoint).
//
// RunTrain is a few named steps (tools/train_command.cc): parse and check
// the flags; set up or resume (SetUpOrResume: the float32 model, the policy,
// the trainer options, and when resuming the checkpoint's settings); build
// the training graph and load the data; choose the backend, create (and
// restore) the trainer and open the metrics file and checkpoint directory;
// the step loop; the report. The library parts of these steps live in
// training/session.h; what is declared here is the part tests call.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "training/checkpoint.h"
#include "training/session.h"
#include "training/trainer.h"

namespace castor::tools {

// The flags of `castor train`; the member initializers are the defaults.
struct TrainOptions {
  std::string model_path;
  std::string data;    // "": the checkpoint's when resuming, else fashion-mnist
  std::string policy;  // "": the checkpoint's when resuming, else mixed_float16
  std::string policy_file;
  std::string loss = "cross-entropy";
  std::string output = "logits";
  std::string input;  // the model input the images feed; "" = its only input
  // --ignore-index: cross-entropy labels equal to it are not scored (set
  // from ignore_index_arg when the flag is given, or from the checkpoint).
  std::optional<int64_t> ignore_index;
  int64_t ignore_index_arg = 0;
  std::string dump_passes_dir;  // "": no dumps
  // Fine-tuning: parameters whose name matches --freeze, or does not match
  // --train-only, stay fixed (TrainingGraphOptions); "" = not given.
  std::string freeze;
  std::string train_only;
  std::string optimizer = "adam";
  double lr = 1e-3;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  double clip_norm = 0.0;
  std::string schedule = "constant";
  int64_t warmup = 0;
  int64_t step_size = 1000;
  double gamma = 0.1;
  int64_t batch = 128;
  int64_t epochs = 1;
  int64_t max_steps = 0;
  int64_t seed = 0;
  bool shuffle = true;
  int64_t eval_every = 0;
  std::string metrics_path;
  std::string backend = "auto";
  std::string loss_scaling = "auto";
  std::string cuda_graphs = "auto";
  bool tf32 = false;
  int64_t threads = 0;
  std::string checkpoint_dir;
  int64_t save_every = 0;
  int64_t keep = 3;
  std::string resume;
  bool allow_policy_change = false;
  // Data parallelism (issue #31): --nproc N starts N local ranks; the
  // seconds their rendezvous and collectives wait for one another.
  int64_t nproc = 1;
  int64_t dist_timeout = 300;
  // MiB of gradients per allreduce bucket, overlapped with the backward
  // pass (0: one allreduce after it).
  double bucket_mb = 25;
  bool sync_batch_norm = false;  // --sync-batchnorm
  bool profile = false;          // --profile: time each kernel, print where a step goes
};

// A fresh run: the optimizer and learning-rate schedule the flags ask for
// (the schedule's kind and length are set once the step count is known).
training::TrainerOptions TrainerOptionsFromFlags(const TrainOptions& options);

// The flags among `args` that a resumed run ignores because the checkpoint
// decides them ("--lr", "--batch", ...), once per occurrence, in order.
std::vector<std::string> FlagsTheCheckpointDecides(const std::vector<std::string>& args);

// A resumed run continues as it was configured: takes the checkpoint's data
// spec (when --data is not given), loss, output, input, ignore index, batch,
// seed, shuffle, fine-tuning patterns and optimizer into `options`, its checkpoint directory (the checkpoint's
// own, when --checkpoint-dir is not given; `resumed_from` is its path) and
// returns its optimizer and schedule.
training::TrainerOptions TakeCheckpointSettings(const training::TrainingState& saved,
                                                const std::string& resumed_from,
                                                TrainOptions& options);

// What the closing summary reports.
struct TrainSummary {
  std::string policy;         // its name
  std::string compute_dtype;  // "bfloat16"
  int64_t float32_weights = 0;
  int64_t weights = 0;
  // Parameters that train and that --freeze / --train-only keep fixed.
  int64_t trained_tensors = 0;
  int64_t trained_elements = 0;
  int64_t frozen_tensors = 0;
  int64_t frozen_elements = 0;
  int64_t steps = 0;
  int64_t skipped_steps = 0;
  double loss_scale = 0;
  std::string backend;  // training::DescribeBackend
  std::string policy_fit;  // the policy cannot pay there (backend/policy_fit.h); "" if it can
  bool tf32 = false;
  // "off (--cuda-graphs off)", "N of this run's M steps replayed ...", or
  // "none: WHY".
  std::string graph_replay;
  int64_t peak_activation_bytes = 0;
  std::optional<int64_t> peak_device_bytes;  // the CUDA memory pool's peak
  int64_t peak_resident_bytes = 0;
  double mean_step_ms = 0;
  double samples_per_s = 0;
  // Data-parallel runs: what averaged ("Gloo", "NCCL 2.28.9"), bytes
  // all-reduced per step and the mean allreduce time (0 on a run alone).
  std::string allreduce_engine;
  int64_t allreduce_bytes_per_step = 0;
  int allreduce_buckets = 0;
  double mean_allreduce_ms = 0;
  double mean_allreduce_wait_ms = 0;  // of it, after the backward pass
  double seconds = 0;  // the whole run
  std::optional<training::Evaluation> test;  // the last evaluation, if any
  std::string last_checkpoint;               // "" when none
};

// The "summary:" block `castor train` ends with.
std::string RenderTrainSummary(const TrainSummary& summary);

// "45s", "2m05s"; "?" for a negative or non-finite time.
std::string FormatDuration(double seconds);

int RunTrain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace castor::tools
