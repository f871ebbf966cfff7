// `castor train` (see train_command.h).
//
// RunTrain in order, one function a step: MakeParser and CheckFlags;
// SetUpOrResume (start fresh from MODEL, or resume from a checkpoint: its
// float32 graph and weights, policy, optimizer, schedule, loss scaler and
// data order); PrepareGraphAndData (convert under the policy, build the
// training graph, load the data, count the steps); ChooseBackend,
// CreateTrainer (and restore it), OpenMetrics and OpenCheckpointDir;
// TrainLoop (steps with progress, metrics, evaluations and checkpoints);
// Report (the metrics file's summary record and the printed summary).
//
// A step that fails returns a status whose code says the exit code
// (BadInput: 2, CheckFailed: 1; see ExitCodeOf); RunTrain prints its message.
#include "tools/train_command.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_backend.h"
#include "backend/policy_fit.h"
#include "graph/json.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "graph/status.h"
#include "graph/version.h"
#include "passes/autocast.h"
#include "passes/model_loader.h"
#include "passes/pass_manager.h"
#include "tools/args.h"
#include "tools/cli.h"
#include "tools/kernel_profile.h"
#include "training/checkpoint.h"
#include "training/dataset.h"
#include "training/distributed/communicator.h"
#include "training/distributed/launcher.h"
#include "training/session.h"
#include "training/trainer.h"
#include "training/training_backend.h"

namespace castor::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The process's peak resident set size so far (the kernel's high-water
// mark: data set, weights, libraries and kernel scratch as well as the
// activations); 0 where getrusage fails.
int64_t PeakResidentBytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

// A step's failure, by the exit code it gives.
absl::Status BadInput(absl::string_view message) {  // exit 2
  return absl::InvalidArgumentError(message);
}
absl::Status CheckFailed(absl::string_view message) {  // exit 1
  return absl::FailedPreconditionError(message);
}
int ExitCodeOf(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition ? kExitFailure : kExitBadInput;
}

// Flags a resumed run takes from its checkpoint instead.
constexpr const char* kFlagsTheCheckpointDecides[] = {
    "--loss",     "--output",       "--input",     "--optimizer", "--lr",         "--momentum",
    "--nesterov", "--weight-decay", "--clip-norm", "--schedule",  "--step-size",  "--gamma",
    "--warmup",   "--batch",        "--seed",      "--shuffle",   "--no-shuffle", "--loss-scaling",
    "--ignore-index", "--freeze", "--train-only"};

ArgParser MakeParser(TrainOptions& o) {
  ArgParser parser(
      "castor train",
      "Trains MODEL in mixed precision on a GPU or the CPU: converts it under --policy\n"
      "(float32 master weights; see 'castor convert'), attaches the loss to --output, builds\n"
      "the backward graph, and runs the optimizer with dynamic loss scaling (on by default for\n"
      "mixed_float16: initial scale 65536, x2 every 2000 good steps, x0.5 and the step skipped\n"
      "on inf/NaN gradients, naming the first node that went non-finite). Prints a progress\n"
      "line and a summary; --metrics writes JSONL; --checkpoint-dir saves checkpoints that\n"
      "'castor verify' checks and --resume continues bit for bit.\n"
      "A run whose steps all fail stops with exit 1 and a diagnosis: after 5 steps in a row\n"
      "skipped with an inf/NaN loss in float32 (NaN or inf data, divergence: no loss scale\n"
      "helps), or 5 overflows in a row with the loss scale at its floor.\n"
      "Exit codes: 0 trained; 1 a check failed while running (a step, a stopped run, a\n"
      "checkpoint that is inconsistent); 2 bad input (flags, model, data, checkpoint file),\n"
      "found before the first step where possible.");
  parser
      .AddOptionalPositional("MODEL", "the float32 ONNX model to train (not needed with --resume)",
                             &o.model_path)
      .AddString("data", "SPEC",
                 "fashion-mnist, mnist, a directory of IDX files or train/test.npz, a .npz, or "
                 "IMAGES,LABELS[,TEST_IMAGES,TEST_LABELS] (.npy or IDX); default fashion-mnist, "
                 "or the checkpoint's with --resume. A .npz is x_train, y_train [, x_test, "
                 "y_test] (one model input; integer x stays integer for an integer input), or "
                 "keyed by the model's input names: one array per input (input_ids, "
                 "attention_mask, ...: its rank, its static dims, a dtype that fits: int64 ids "
                 "stay int64, uint8 pixels are scaled to [0, 1]) plus 'labels', and for a test "
                 "split the same names with '_test' appended (input_ids_test, labels_test)",
                 &o.data)
      .AddString("policy", "NAME",
                 absl::StrCat("the autocast policy: ", absl::StrJoin(Policy::BuiltinNames(), ", "),
                              " (default mixed_float16, or the checkpoint's with --resume)"),
                 &o.policy)
      .AddString("policy-file", "FILE", "a policy JSON file (see 'castor convert --save-policy')",
                 &o.policy_file)
      .AddEnum("loss", {"cross-entropy", "mse", "bce", "output"},
               "cross-entropy: softmax cross-entropy on logits with integer class labels; mse: "
               "mean squared error on float targets shaped like the output; bce: binary "
               "cross-entropy with logits, multi-label (torch's BCEWithLogitsLoss: float "
               "targets in [0, 1] shaped like the output, the mean over every element); "
               "output: the model computes its own loss (--output, default its first output, "
               "a float scalar; every input from --data, no labels)",
               &o.loss)
      .AddString("output", "NAME",
                 "the model output the loss is attached to (cross-entropy: logits [N, C] with "
                 "labels [N], or [N, T, V] with labels [N, T], class axis last)",
                 &o.output)
      .AddInt("ignore-index", "N",
              "cross-entropy: labels equal to N count in neither the loss nor its mean nor the "
              "accuracy (PyTorch's default ignore_index is -100; default: none)",
              &o.ignore_index_arg)
      .AddString("freeze", "REGEX",
                 "fine-tuning: keep the parameters (float32 initializers) whose name matches "
                 "REGEX fixed: no gradient, no optimizer state (ECMAScript, searched for "
                 "anywhere in the name: 'conv' matches 'layer1.conv.weight'; ^...$ for whole "
                 "names); a pattern that matches no parameter is an error; the checkpoint "
                 "records it and --resume keeps it",
                 &o.freeze)
      .AddString("train-only", "REGEX",
                 "fine-tuning: train only the parameters whose name matches REGEX (as "
                 "--freeze matches), keep the rest fixed; with --freeze, a parameter trains "
                 "when it matches this and not --freeze",
                 &o.train_only)
      .AddString("input", "NAME",
                 "the model input the images (or integer ids) feed (default: the only one)",
                 &o.input)
      .AddEnum("optimizer", {"sgd", "adam", "adamw"}, "the optimizer", &o.optimizer)
      .AddFloat("lr", "RATE", "learning rate", &o.lr)
      .AddFloat("momentum", "M", "SGD momentum", &o.momentum)
      .AddSwitch("nesterov", "Nesterov momentum (sgd with --momentum > 0)", &o.nesterov)
      .AddFloat("weight-decay", "WD", "L2 (sgd, adam) or decoupled (adamw) weight decay",
                &o.weight_decay)
      .AddFloat("clip-norm", "N", "clip gradients to this global L2 norm (0: off)", &o.clip_norm)
      .AddEnum("schedule", {"constant", "step", "cosine"},
               "learning-rate schedule (step: x --gamma every --step-size steps; cosine: to 0 "
               "at the last step)",
               &o.schedule)
      .AddInt("step-size", "STEPS", "--schedule step: steps between decays", &o.step_size)
      .AddFloat("gamma", "G", "--schedule step: the decay factor", &o.gamma)
      .AddInt("warmup", "STEPS", "linear learning-rate warmup steps", &o.warmup)
      .AddInt("batch", "N",
              "the global batch size: with several ranks (--nproc, or RANK/WORLD_SIZE) each "
              "trains on N / ranks of it and the gradients are averaged (N a multiple of the "
              "ranks)",
              &o.batch)
      .AddInt("epochs", "N", "epochs over the training split", &o.epochs)
      .AddInt("max-steps", "N", "stop after N steps in all, resumed ones included (0: no limit)",
              &o.max_steps)
      .AddInt("seed", "S",
              "seed of the shuffle and of Dropout's masks (a function of the seed, the node, "
              "the step and the element: a checkpoint records the state, --resume continues it)",
              &o.seed)
      .AddSwitch("shuffle", "shuffle the training split every epoch", &o.shuffle)
      .AddInt("eval-every", "K", "also evaluate on the test split every K steps (0: per epoch)",
              &o.eval_every)
      .AddString("metrics", "FILE", "write one JSON object per step and per evaluation",
                 &o.metrics_path)
      .AddString("dump-passes", "DIR",
                 "write the graph before the first pass and after each pass of the pipeline "
                 "(canonicalize, autocast, the training rewrites) as text to DIR/NN-PASS.txt",
                 &o.dump_passes_dir)
      .AddString("checkpoint-dir", "DIR",
                 "save checkpoints there (ckpt-<step>.onnx, written atomically); with --resume "
                 "it defaults to the resumed checkpoint's directory",
                 &o.checkpoint_dir)
      .AddInt("save-every", "N",
              "save every N steps (0: at the end of each epoch); always at "
              "the end",
              &o.save_every)
      .AddInt("keep", "K", "keep the newest K checkpoints (0: all)", &o.keep)
      .AddString("resume", "DIR|FILE",
                 "continue from a checkpoint, or the newest usable one in DIR: its model, "
                 "weights, policy, optimizer and moments, schedule, loss scaler, batch, seed, "
                 "data position and TF32 setting; --data, --epochs, --max-steps, --[no-]tf32 "
                 "and the output flags apply",
                 &o.resume)
      .AddSwitch("allow-policy-change",
                 "with --resume and another --policy: re-run autocast under it and print which "
                 "nodes change dtype",
                 &o.allow_policy_change)
      .AddEnum("backend", {"auto", "cpu", "cuda"},
               "where to train (auto: CUDA when a usable GPU runs every node, else the "
               "CPU, saying why)",
               &o.backend)
      .AddEnum("loss-scaling", {"auto", "on", "off"},
               "dynamic loss scaling (auto: on for mixed_float16 only)", &o.loss_scaling)
      .AddEnum("cuda-graphs", {"auto", "off"},
               "auto: on CUDA, record the step once its batch shape repeats and replay it as a "
               "CUDA graph (an epoch's smaller last batch runs node by node); off: every step "
               "node by node",
               &o.cuda_graphs)
      .AddSwitch("tf32",
                 "on CUDA, float32 MatMul/Gemm/Conv on TF32 tensor cores (products of "
                 "10-bit mantissas, faster) and cuDNN's FFT/Winograd float32 convolutions; "
                 "default: float32 means float32 (with --resume: as the checkpoint ran)",
                 &o.tf32)
      .AddInt("threads", "N", "CPU threads (0: all)", &o.threads)
      .AddSwitch("profile",
                 "time each kernel of the training step and print, after the summary, the "
                 "milliseconds per step by op (and dtype) and the slowest nodes; the backend "
                 "waits after each kernel and CUDA graphs are off, so steps run a little slower",
                 &o.profile)
      .AddInt("nproc", "N",
              "data-parallel: train as N local processes (ranks), each on its share of every "
              "--batch, gradients averaged before the optimizer: on the CPU with Gloo over "
              "127.0.0.1, in buckets all-reduced while the backward pass runs (see "
              "--bucket-mb); on GPUs (--backend cuda) one rank per device, averaged in device "
              "memory with NCCL (libnccl.so.2, loaded when needed) after the backward pass; "
              "progress, "
              "metrics and checkpoints from rank 0. Several hosts: start one castor per rank "
              "with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (torchrun's variables), or "
              "launch with `mpirun -np N -x MASTER_ADDR=HOST castor train ...` (Open MPI, "
              "MPICH; MASTER_PORT defaults to 29500 there); rank 0's port is all the hosts "
              "share",
              &o.nproc)
      .AddSwitch("sync-batchnorm",
                 "data-parallel: BatchNormalization normalises with the statistics of the "
                 "global batch, summed across the ranks in the forward and backward pass (as "
                 "PyTorch's SyncBatchNorm; CPU backend), instead of each rank's own (DDP's "
                 "default); a run on 2 ranks then matches one process on the whole batch",
                 &o.sync_batch_norm)
      .AddFloat("bucket-mb", "MIB",
                "data-parallel: gradients are averaged in buckets of this many MiB (float32), "
                "each all-reduced as soon as the backward pass has filled it, while the pass "
                "goes on, as PyTorch DDP's bucket_cap_mb (the first bucket holds 1 MiB); 0: "
                "one allreduce after the backward pass (default 25); NCCL on GPUs averages all "
                "of them in one group after the backward pass",
                &o.bucket_mb)
      .AddInt("dist-timeout", "SECONDS",
              "data-parallel: how long a rank waits for the others (rendezvous, joining "
              "NCCL, each allreduce; rank 0 writing a checkpoint keeps the others waiting) "
              "before it stops with an error (default 300)",
              &o.dist_timeout)
      .AddExample(
          "castor train models/cnn_opset17.onnx --data fashion-mnist --policy "
          "mixed_bfloat16 --epochs 1 --metrics run.jsonl --checkpoint-dir ckpt")
      .AddExample("castor train --resume ckpt --epochs 2");
  return parser;
}

// The checks of flag values and combinations that need no file.
absl::Status CheckFlags(const TrainOptions& o) {
  if (o.batch < 1 || o.epochs < 1 || o.max_steps < 0 || o.eval_every < 0 || o.warmup < 0 ||
      o.save_every < 0 || o.keep < 0 || o.step_size < 1) {
    return BadInput(
        "--batch, --epochs and --step-size must be >= 1; --max-steps, "
        "--eval-every, --warmup, --save-every and --keep >= 0");
  }
  // NaN fails every comparison, so each check is written to reject it.
  if (!(std::isfinite(o.lr) && o.lr > 0)) {
    return BadInput(absl::StrCat("--lr ", o.lr, ": expected a finite number > 0"));
  }
  for (const auto& [flag, value] : {std::pair<const char*, double>{"--momentum", o.momentum},
                                    {"--weight-decay", o.weight_decay},
                                    {"--clip-norm", o.clip_norm}}) {
    if (!(std::isfinite(value) && value >= 0)) {
      return BadInput(absl::StrCat(flag, " ", value, ": expected a finite number >= 0"));
    }
  }
  if (!(std::isfinite(o.gamma) && o.gamma > 0)) {
    return BadInput(absl::StrCat("--gamma ", o.gamma, ": expected a finite number > 0"));
  }
  if (absl::Status threads = CheckCpuThreadsFlag(o.threads); !threads.ok()) {
    return BadInput(threads.message());
  }
  if (absl::StatusOr<int64_t> limit = DefaultCpuMemoryLimit(); !limit.ok()) {
    return BadInput(limit.status().message());
  }
  if (o.allow_policy_change && o.resume.empty()) {
    return BadInput("--allow-policy-change only applies with --resume");
  }
  if (o.tf32 && o.backend == "cpu") {
    return BadInput("--tf32 applies to the CUDA backend only; --backend is cpu");
  }
  if (o.nproc < 1 || o.dist_timeout < 1) {
    return BadInput("--nproc and --dist-timeout must be >= 1");
  }
  if (!(o.bucket_mb >= 0 && o.bucket_mb <= 1048576)) {
    return BadInput(absl::StrCat("--bucket-mb ", o.bucket_mb,
                                 ": expected MiB in [0, 1048576] (0: one allreduce after the "
                                 "backward pass)"));
  }
  if (o.ignore_index.has_value() && o.loss != "cross-entropy") {
    return BadInput(absl::StrCat("--ignore-index applies to --loss cross-entropy; --loss is ",
                                 o.loss));
  }
  return absl::OkStatus();
}

// The paths the run writes, checked before any work: --checkpoint-dir
// must not be a file, --metrics not a directory nor in a missing one.
absl::Status CheckOutputPaths(const TrainOptions& o) {
  std::error_code error;
  if (!o.checkpoint_dir.empty() && std::filesystem::exists(o.checkpoint_dir, error) &&
      !std::filesystem::is_directory(o.checkpoint_dir, error)) {
    return BadInput(absl::StrCat("--checkpoint-dir ", o.checkpoint_dir,
                                 " exists and is not a directory"));
  }
  if (!o.metrics_path.empty()) {
    if (std::filesystem::is_directory(o.metrics_path, error)) {
      return BadInput(absl::StrCat("--metrics ", o.metrics_path, " is a directory"));
    }
    const std::filesystem::path parent = std::filesystem::path(o.metrics_path).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent, error)) {
      return BadInput(absl::StrCat("--metrics ", o.metrics_path, ": no directory ",
                                   parent.string()));
    }
  }
  return absl::OkStatus();
}

// Everything a run starts from: the float32 model, the policy, the trainer
// options, and, when resuming, the saved state.
struct Start {
  Start(Model model, Policy policy) : float32_model(std::move(model)), policy(std::move(policy)) {}

  Model float32_model;
  Policy policy;
  std::optional<training::TrainingState> resumed;  // with its moments
  std::string resumed_from;                        // the checkpoint path
  bool policy_changed = false;
  std::optional<bool> checkpoint_tf32;  // whether the resumed checkpoint ran on TF32
  training::TrainerOptions trainer_options;
};

absl::StatusOr<Start> StartFresh(const TrainOptions& o, std::optional<Policy> requested) {
  if (o.model_path.empty()) return BadInput("give MODEL, or --resume with a checkpoint");
  absl::StatusOr<Model> model = LoadAndCheckModel(o.model_path);
  if (!model.ok()) return BadInput(model.status().message());
  Policy policy = requested.has_value() ? *std::move(requested) : *Policy::Builtin("mixed_float16");
  return Start(*std::move(model), std::move(policy));
}

// The refusal to resume under another policy without --allow-policy-change.
std::string PolicyChangeRefusal(const std::string& path, const Policy& recorded,
                                const Policy& requested) {
  std::string message = absl::StrCat(
      "--resume: the checkpoint ", path, " was trained under policy '", recorded.name(), "' (",
      recorded.Digest(), "); the requested policy '", requested.name(), "' (",
      requested.Digest(), ") differs: ",
      absl::StrJoin(training::DescribePolicyDifferences(recorded, requested), "; "));
  absl::StrAppend(&message, "; pass --allow-policy-change to re-run autocast under '",
                  requested.name(), "', or drop --policy to keep '", recorded.name(), "'");
  return message;
}

// Resumes from a checkpoint file or the newest usable one in a directory.
// Refuses another policy than the recorded one unless --allow-policy-change,
// which prints the node-level difference.
absl::StatusOr<Start> StartFromCheckpoint(const TrainOptions& o, std::optional<Policy> requested,
                                          std::ostream& out, std::ostream& err) {
  absl::StatusOr<training::FoundCheckpoint> found = training::FindLatestCheckpoint(o.resume);
  if (!found.ok()) {
    const std::string message = absl::StrCat("--resume: ", found.status().message());
    return found.status().code() == absl::StatusCode::kFailedPrecondition ? CheckFailed(message)
                                                                          : BadInput(message);
  }
  // Newer checkpoints that fail verify are moved aside, so that the run
  // can save into their directory and a later --resume does not meet them.
  for (size_t k = 0; k < found->skipped.size(); ++k) {
    const std::string& path = found->skipped_paths[k];
    if (absl::Status moved = training::MoveCheckpointAside(path); !moved.ok()) {
      return CheckFailed(absl::StrCat("--resume: ", found->skipped[k], "; ", moved.message()));
    }
    err << "castor train: warning: --resume: moved " << path << " aside to " << path
        << training::kMovedAsideSuffix << ": " << found->skipped[k] << "\n";
  }
  training::Checkpoint& checkpoint = found->checkpoint;
  Start start(std::move(checkpoint.model), checkpoint.policy);
  start.resumed = std::move(checkpoint.state);
  start.resumed_from = found->path;
  out << absl::StrFormat("resuming from %s: step %d, epoch %d, policy %s\n", found->path,
                         start.resumed->step, start.resumed->epoch, start.policy.name());
  if (requested.has_value() && requested->Digest() != start.policy.Digest()) {
    if (!o.allow_policy_change) {
      return CheckFailed(PolicyChangeRefusal(found->path, start.policy, *requested));
    }
    absl::StatusOr<std::vector<std::string>> changes =
        training::PolicyChangeByNode(start.float32_model, start.policy, *requested);
    if (!changes.ok()) return CheckFailed(changes.status().message());
    out << absl::StrFormat(
        "policy change %s -> %s (--allow-policy-change): %d nodes change dtype\n",
        start.policy.name(), requested->name(), changes->size());
    for (const std::string& change : *changes) out << "  " << change << "\n";
    start.policy = *std::move(requested);
    start.policy_changed = true;
  }
  return start;
}

// Step 1: where the run starts (fresh from MODEL or resumed), and how it is
// configured: a resumed run as its checkpoint was (warning about the flags
// it ignores), a fresh one by the flags. `tf32_given`: --tf32 or --no-tf32
// was on the command line.
absl::StatusOr<Start> SetUpOrResume(TrainOptions& o, bool tf32_given,
                                    const std::vector<std::string>& args, std::ostream& out,
                                    std::ostream& err) {
  PolicyFlags flags;
  flags.name = o.policy;
  flags.file = o.policy_file;
  flags.name_the_flag = false;  // Policy::Builtin's and LoadFile's messages as they are
  absl::StatusOr<std::optional<Policy>> requested = ResolvePolicyFlags(flags);
  if (!requested.ok()) return BadInput(requested.status().message());
  absl::StatusOr<Start> start = o.resume.empty()
                                    ? StartFresh(o, *std::move(requested))
                                    : StartFromCheckpoint(o, *std::move(requested), out, err);
  if (!start.ok()) return start.status();
  if (start->resumed.has_value()) {
    const training::TrainingState& saved = *start->resumed;
    for (const std::string& flag : FlagsTheCheckpointDecides(args)) {
      err << "castor train: warning: " << flag << " is ignored with --resume: the "
          << "checkpoint decides it\n";
    }
    start->trainer_options = TakeCheckpointSettings(saved, start->resumed_from, o);
    if (absl::Status recorded = training::RecordedIgnoreIndex(saved).status(); !recorded.ok()) {
      return BadInput(absl::StrCat("--resume: the checkpoint ", start->resumed_from, " ",
                                   recorded.message()));
    }
    // TF32: the checkpoint's setting unless --tf32 or --no-tf32 is given
    // (a change is warned about once the backend is known, in
    // ChooseBackend).
    absl::StatusOr<bool> recorded_tf32 = training::RecordedTf32(saved);
    if (!recorded_tf32.ok()) {
      return BadInput(absl::StrCat("--resume: the checkpoint ", start->resumed_from, " ",
                                   recorded_tf32.status().message()));
    }
    start->checkpoint_tf32 = *recorded_tf32;
    if (!tf32_given) o.tf32 = *recorded_tf32;
  } else {
    if (o.data.empty()) o.data = "fashion-mnist";
    start->trainer_options = TrainerOptionsFromFlags(o);
  }
  start->trainer_options.replay_steps = o.cuda_graphs == "auto";
  start->trainer_options.time_kernels = o.profile;
  start->trainer_options.scaler.enabled =
      o.loss_scaling == "on" ||
      (o.loss_scaling == "auto" && start->policy.compute_dtype() == DType::kFloat16);
  return start;
}

// The model under the policy, its training graph, the data and the step
// count.
struct Prepared {
  std::string model_name;  // MODEL, or the resumed checkpoint
  Model model;             // converted under the policy
  TrainingGraph graph;
  training::DataSplits data;
  int64_t total = 0;  // steps in all, resumed ones included
};

// Float targets for mse and bce: shaped like the loss input castor.labels
// (the model output; integer 0/1 labels become float32).
absl::Status FitTargets(training::Dataset& split, const Value& labels, const std::string& loss) {
  const std::string source = split.labels_source.empty() ? split.name : split.labels_source;
  Tensor& targets = split.labels;
  if (targets.dtype() != DType::kFloat32) {
    Tensor widened(DType::kFloat32, targets.dims());
    for (int64_t i = 0; i < targets.num_elements(); ++i) {
      widened.data<float>()[i] = static_cast<float>(targets.GetDouble(i));
    }
    targets = std::move(widened);
  }
  const Shape& want = labels.shape();
  bool fits = want.rank() == static_cast<int>(targets.dims().size());
  for (int axis = 1; fits && axis < want.rank(); ++axis) {
    fits = !want[axis].is_static() || want[axis].value() == targets.dims()[axis];
  }
  if (fits) return absl::OkStatus();
  if (want.rank() == 1 && targets.dims().size() == 2 && targets.dims()[1] == 1) {
    targets = Tensor::FromVector<float>(DType::kFloat32, {targets.dims()[0]},
                                        std::vector<float>(targets.data<float>(),
                                                           targets.data<float>() +
                                                               targets.num_elements()));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": targets ", Shape::FromDims(targets.dims()).ToString(), " do not fit --loss ",
      loss, ": it takes float targets shaped like the output, ", want.ToString()));
}

// The data as the model takes it: every split's inputs in the dtype of the
// model input they feed (token ids stay integer; int32 ids widen to an
// int64 input) and, for cross-entropy, labels of the shape the loss reads
// ([N] for logits [N, C], [N, T] for [N, T, V]).
absl::Status FitDataToModel(const TrainOptions& o, const Graph& float32_graph,
                            Prepared& prepared) {
  const Value* input = nullptr;
  for (const Value* candidate : float32_graph.inputs()) {
    if (candidate->name() == o.input) input = candidate;
  }
  const Value* labels = prepared.model.graph->FindValue(kLabelsInput);
  for (training::Dataset* split : {&prepared.data.train, &prepared.data.test}) {
    if (split->size() == 0) continue;
    if (input != nullptr) {
      CASTOR_RETURN_IF_ERROR(training::FitDatasetToInput(*split, o.input, input->dtype()));
      // The samples' shape against the input's static dims, before any
      // step (a mismatch is bad input, exit 2, as in castor run).
      const Shape& want = input->shape();
      const std::vector<int64_t>& have = split->images.dims();
      bool fits = !want.rank_known() || want.rank() == static_cast<int>(have.size());
      for (int axis = 1; fits && want.rank_known() && axis < want.rank(); ++axis) {
        fits = !want[axis].is_static() || want[axis].value() == have[axis];
      }
      if (!fits) {
        return absl::InvalidArgumentError(absl::StrCat(
            split->images_source.empty() ? split->name : split->images_source, ": samples ",
            Shape::FromDims(have).ToString(), " do not fit the model input '", o.input, "' ",
            want.ToString()));
      }
    }
    if (labels == nullptr) continue;
    if (prepared.graph.loss == LossKind::kMeanSquaredError ||
        prepared.graph.loss == LossKind::kBinaryCrossEntropy) {
      CASTOR_RETURN_IF_ERROR(FitTargets(*split, *labels, o.loss));
      continue;
    }
    if (prepared.graph.loss != LossKind::kSoftmaxCrossEntropy) continue;
    if (split->labels.dtype() != DType::kInt64) {
      return absl::InvalidArgumentError(absl::StrCat(
          split->labels_source.empty() ? split->name : split->labels_source, ": labels are ",
          DTypeName(split->labels.dtype()),
          "; cross-entropy takes integer class indices (float targets: --loss mse or bce)"));
    }
    const Shape& want = labels->shape();
    const std::vector<int64_t>& have = split->labels.dims();
    if (want.rank() == 2 && have.size() == 1 && want[1].is_static() && want[1].value() == 1) {
      // [N, 1] labels were read as [N]: the loss of [N, 1, V] logits reads [N, 1].
      Tensor reshaped(split->labels.dtype(), {have[0], 1});
      std::memcpy(reshaped.raw(), split->labels.raw(), split->labels.byte_size());
      split->labels = std::move(reshaped);
      continue;
    }
    bool fits = static_cast<int>(have.size()) == want.rank();
    for (int axis = 1; fits && axis < want.rank(); ++axis) {
      fits = !want[axis].is_static() || want[axis].value() == have[axis];
    }
    if (!fits) {
      const Value* output = prepared.model.graph->FindValue(prepared.graph.model_output);
      return absl::InvalidArgumentError(absl::StrCat(
          split->labels_source.empty() ? split->name : split->labels_source, ": labels ",
          Shape::FromDims(have).ToString(), " do not fit the cross-entropy loss on output '",
          prepared.graph.model_output, "' ",
          output != nullptr ? output->shape().ToString() : std::string(), ": it reads labels ",
          want.ToString(),
          want.rank() >= 2 ? " (one per position; the class axis is the output's last)"
                           : " (one class index per sample)"));
    }
    // Class indices in [0, C) (or the ignore index), C the output's last dim.
    const Value* output = prepared.model.graph->FindValue(prepared.graph.model_output);
    const Shape& logits = output->shape();
    if (logits.rank() < 2 || !logits[logits.rank() - 1].is_static()) continue;
    const int64_t classes = logits[logits.rank() - 1].value();
    const int64_t* label = split->labels.data<int64_t>();
    const int64_t per_sample = std::max<int64_t>(
        1, split->labels.num_elements() / std::max<int64_t>(1, split->labels.dims()[0]));
    for (int64_t p = 0; p < split->labels.num_elements(); ++p) {
      if ((label[p] >= 0 && label[p] < classes) || label[p] == o.ignore_index) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          split->labels_source.empty() ? split->name : split->labels_source, ": label ",
          label[p], " of sample ", p / per_sample,
          per_sample > 1 ? absl::StrCat(" (position ", p % per_sample, ")") : std::string(),
          " is out of range [0, ", classes, "): the output '",
          prepared.graph.model_output, "' ", logits.ToString(), " has ", classes, " classes",
          o.ignore_index.has_value() ? absl::StrCat(" (--ignore-index ", *o.ignore_index, ")")
                                     : std::string()));
    }
  }
  return absl::OkStatus();
}

// Step 2: runs the pipeline (passes/pass_manager.h): a fresh model is
// canonicalised (what the checkpoints keep), then converted under the
// policy and rewritten into its training graph; loads the data and counts
// the steps (a fresh run's schedule learns the count).
absl::StatusOr<Prepared> PrepareGraphAndData(TrainOptions& o, Start& start, std::ostream& out) {
  Prepared prepared;
  prepared.model_name = start.resumed.has_value() ? start.resumed_from : o.model_path;
  const std::string& model_name = prepared.model_name;
  PassDumper dumper(o.dump_passes_dir);
  PassManagerOptions manager_options;
  if (!o.dump_passes_dir.empty()) manager_options.dumper = &dumper;
  if (!start.resumed.has_value()) {
    PassManagerOptions import_options = manager_options;
    import_options.dump_input = true;
    PassManager import(import_options);
    AddImportPasses(import);
    PassContext context;
    if (absl::Status s = import.Run(start.float32_model, context); !s.ok()) {
      // A recurrent layer castor cannot unroll (a symbolic sequence length)
      // is the model's input; a pass bug is a check that failed.
      const std::string message = absl::StrCat(model_name, ": ", s.message());
      return absl::IsInvalidArgument(s) ? BadInput(message) : CheckFailed(message);
    }
    for (const std::string& note : context.notes) out << "note: " << note << "\n";
  }
  const Graph& float32_graph = *start.float32_model.graph;
  // An .npz keyed by the model's input names feeds every input (images go
  // to the first); other forms feed one input.
  std::optional<training::DataSplits> named;
  std::error_code error;
  if (absl::EndsWith(o.data, ".npz") && std::filesystem::is_regular_file(o.data, error)) {
    std::vector<training::ModelInputSpec> inputs;
    for (const Value* input : float32_graph.inputs()) {
      training::ModelInputSpec spec{input->name(), input->dtype(), {}, input->initializer() == nullptr};
      for (int axis = 0; axis < input->shape().rank(); ++axis) {
        const Dim& dim = input->shape()[axis];
        spec.dims.push_back(dim.is_static() ? dim.value() : -1);
      }
      inputs.push_back(std::move(spec));
    }
    absl::StatusOr<std::optional<training::DataSplits>> loaded =
        training::LoadNpzByInputNames(o.data, inputs, /*labels_required=*/o.loss != "output");
    if (!loaded.ok()) return BadInput(loaded.status().message());
    named = *std::move(loaded);
    if (named.has_value()) o.input = named->train.images_input;
  }
  if (o.input.empty()) {
    if (float32_graph.inputs().size() != 1) {
      return BadInput(
          "the model has several inputs; name the image input with --input, or give --data an "
          ".npz keyed by the input names (and labels)");
    }
    o.input = float32_graph.inputs()[0]->name();
  } else if (std::none_of(float32_graph.inputs().begin(), float32_graph.inputs().end(),
                          [&o](const Value* input) { return input->name() == o.input; })) {
    std::vector<std::string> names;
    for (const Value* input : float32_graph.inputs()) names.push_back(input->name());
    return BadInput(absl::StrCat("--input ", o.input, ": ", model_name, " has no input '",
                                 o.input, "'; its inputs are ", absl::StrJoin(names, ", ")));
  }
  absl::StatusOr<Model> model = CloneModel(start.float32_model);
  if (!model.ok()) return CheckFailed(model.status().message());
  prepared.model = *std::move(model);
  if (absl::Status inferred = InferTypes(prepared.model); !inferred.ok()) {
    return BadInput(absl::StrCat(model_name, ": ", inferred.message()));
  }
  {
    PassManager convert(manager_options);
    // The training graph may run castor's forms of ops ONNX refuses in the
    // compute dtype at the model's opset (a bfloat16 Conv below opset 22).
    AutocastOptions autocast;
    autocast.training_graph_ops = true;
    convert.Add(MakeAutocastPass(start.policy, autocast));
    PassContext context;
    if (absl::Status s = convert.Run(prepared.model, context); !s.ok()) {
      return CheckFailed(absl::StrCat(model_name, ": ", s.message()));
    }
  }
  if (o.loss == "output" && o.output == "logits" &&
      float32_graph.FindValue("logits") == nullptr && !float32_graph.outputs().empty()) {
    // The model's own loss: its first output unless --output names one.
    o.output = float32_graph.outputs()[0]->name();
  }
  TrainingGraphOptions graph_options;
  graph_options.output = o.output;
  absl::StatusOr<LossKind> loss_kind = ParseLossKind(o.loss);
  if (!loss_kind.ok()) return BadInput(loss_kind.status().message());
  graph_options.loss = *loss_kind;
  graph_options.ignore_index = o.ignore_index;
  graph_options.freeze = o.freeze;
  graph_options.train_only = o.train_only;
  absl::StatusOr<TrainingGraph> graph =
      BuildTrainingGraph(prepared.model, graph_options, manager_options);
  if (!graph.ok()) return BadInput(absl::StrCat(model_name, ": ", graph.status().message()));
  prepared.graph = *std::move(graph);

  if (named.has_value()) {
    prepared.data = *std::move(named);
  } else {
    absl::StatusOr<training::DataSplits> data = training::LoadData(o.data);
    if (!data.ok()) return BadInput(data.status().message());
    prepared.data = *std::move(data);
  }
  if (absl::Status fitted = FitDataToModel(o, float32_graph, prepared); !fitted.ok()) {
    return BadInput(fitted.message());
  }
  if (start.resumed.has_value() && start.resumed->dataset_size != 0 &&
      start.resumed->dataset_size != prepared.data.train.size()) {
    return BadInput(absl::StrFormat(
        "--resume: the checkpoint's data order is over %d training samples (--data %s); "
        "--data %s has %d",
        start.resumed->dataset_size, start.resumed->data, o.data, prepared.data.train.size()));
  }
  prepared.total = training::TotalSteps(prepared.data.train.size(), o.batch, o.epochs,
                                        o.max_steps);
  if (!start.resumed.has_value()) {
    if (o.schedule == "cosine") {
      start.trainer_options.lr.kind = LrSchedule::Kind::kCosine;
      start.trainer_options.lr.total_steps = prepared.total;
    } else if (o.schedule == "step") {
      start.trainer_options.lr.kind = LrSchedule::Kind::kStep;
    }
  }
  return prepared;
}

// The backend, the trainer on it and what the run writes. Built in place
// (the batches point into Prepared's data, the trainer at the backend).
struct Session {
  training::ChosenBackend chosen;
  std::unique_ptr<training::Trainer> trainer;
  std::optional<training::BatchIterator> batches;
  std::ofstream metrics;
  std::optional<training::Checkpoint> checkpoint;  // with --checkpoint-dir
  std::string policy_fit;  // the policy cannot pay on this backend (policy_fit.h); "" if it can
  // This process's place in a data-parallel run (0 of 1 on its own).
  int rank = 0;
  int world_size = 1;
  training::RankPlacement placement;  // this rank's device on a GPU host
  distributed::Communicator* communicator = nullptr;  // null on its own
  Backend& backend() const { return *chosen.backend; }
};

// Step 3a: the backend --backend asks for (noting why auto fell back to
// the CPU), and whether TF32 takes effect on it: from here o.tf32 is what
// took effect, as the summary and the checkpoints record it.
absl::Status ChooseBackend(TrainOptions& o, const Start& start, const Prepared& prepared,
                           Session& session, std::ostream& err) {
  CudaBackendOptions cuda_options;
  cuda_options.allow_tf32 = o.tf32;
  absl::StatusOr<training::ChosenBackend> chosen = training::ChooseTrainingBackend(
      o.backend, static_cast<int>(o.threads), {&prepared.model, prepared.graph.evaluation.get()},
      cuda_options, session.placement);
  if (!chosen.ok()) return BadInput(chosen.status().message());
  session.chosen = *std::move(chosen);
  if (!session.chosen.note.empty()) err << "castor train: " << session.chosen.note << "\n";
  const bool on_cpu = dynamic_cast<CpuBackend*>(&session.backend()) != nullptr;
  session.policy_fit = PolicyFitWarningForThisMachine(
      start.policy.name(), start.policy.compute_dtype(),
      on_cpu ? PolicyFitBackend::kCpu : PolicyFitBackend::kCuda);
  if (!session.policy_fit.empty()) err << "castor train: warning: " << session.policy_fit << "\n";
  const bool tf32_requested = o.tf32;
  if (on_cpu) o.tf32 = false;
  const std::optional<bool>& checkpoint_tf32 = start.checkpoint_tf32;
  if (checkpoint_tf32.has_value() && o.tf32 != *checkpoint_tf32) {
    err << "castor train: warning: the checkpoint trained "
        << (*checkpoint_tf32 ? "with TF32 (--tf32)" : "without TF32") << "; this run goes on "
        << (o.tf32 ? "with TF32 (--tf32)"
                   : on_cpu ? "in exact float32 on the CPU" : "in exact float32 (--no-tf32)")
        << ", so its float32 MatMul/Gemm/Conv round differently from the run so far";
    if (*checkpoint_tf32 && !o.tf32) {
      err << "; its checkpoints record TF32 off (give --tf32 when resuming on a GPU to go back)";
    }
    err << "\n";
  } else if (tf32_requested && on_cpu) {
    err << "castor train: --tf32 has no effect on the CPU\n";
  }
  return absl::OkStatus();
}

// Step 3b: the trainer on the chosen backend, restored from the checkpoint
// when resuming, and the batches from the data position it saved.
absl::Status CreateTrainer(const TrainOptions& o, Start& start, Prepared& prepared,
                           Session& session) {
  absl::StatusOr<std::unique_ptr<training::Trainer>> created = training::Trainer::Create(
      std::move(prepared.model), prepared.graph, start.trainer_options, session.backend());
  if (!created.ok()) return BadInput(created.status().message());
  session.trainer = *std::move(created);
  int64_t epoch0 = 0, position0 = 0;
  if (start.resumed.has_value()) {
    training::TrainingState& saved = *start.resumed;
    std::optional<bool> scaler_enabled;
    if (start.policy_changed) scaler_enabled = start.trainer_options.scaler.enabled;
    if (absl::Status restored = training::RestoreTrainer(*session.trainer, saved,
                                                         start.float32_model, scaler_enabled);
        !restored.ok()) {
      return BadInput(absl::StrCat("--resume ", start.resumed_from, ": ", restored.message()));
    }
    epoch0 = saved.epoch;
    position0 = saved.position;
  }
  absl::StatusOr<training::BatchIterator> batches = training::BatchIterator::Create(
      prepared.data.train,
      training::BatchOptions{o.batch, o.shuffle, static_cast<uint64_t>(o.seed), false}, epoch0,
      position0);
  if (!batches.ok()) return BadInput(batches.status().message());
  session.batches.emplace(*std::move(batches));
  return absl::OkStatus();
}

// Step 3c: --metrics, appended to when resuming (after dropping the lines
// of steps after the checkpoint), else written afresh.
absl::Status OpenMetrics(const TrainOptions& o, const Start& start, Session& session) {
  if (o.metrics_path.empty()) return absl::OkStatus();
  if (start.resumed.has_value()) {
    // Lines of steps after the checkpoint (written before a crash) and a
    // torn last line would repeat or garble the record: keep the rest.
    if (absl::Status trimmed = training::TrimMetrics(o.metrics_path, start.resumed->step);
        !trimmed.ok()) {
      return BadInput(absl::StrCat("--metrics ", o.metrics_path, ": ", trimmed.message()));
    }
  }
  session.metrics.open(o.metrics_path,
                       start.resumed.has_value() ? std::ios::app : std::ios::trunc);
  if (!session.metrics) return BadInput(absl::StrCat("cannot write --metrics ", o.metrics_path));
  return absl::OkStatus();
}

// Step 3d: --checkpoint-dir. Saving into a directory that holds a later
// checkpoint of another run (or branch) would interleave the two, pruning
// by step would delete this run's files, and a later --resume DIR would
// pick the other's: refused. Later checkpoints that fail verify are moved
// aside to <name>.broken, kept for inspection; temporary files of an
// interrupted save are removed.
absl::Status OpenCheckpointDir(const TrainOptions& o, const Start& start, Session& session,
                               std::ostream& err) {
  if (o.checkpoint_dir.empty()) return absl::OkStatus();
  const int64_t resumed_step = start.resumed.has_value() ? start.resumed->step : 0;
  absl::StatusOr<std::vector<training::CheckpointFile>> existing =
      training::ListCheckpoints(o.checkpoint_dir);
  for (const std::string& removed : training::RemoveInterruptedWrites(o.checkpoint_dir)) {
    err << "castor train: removed " << removed << ", left in --checkpoint-dir "
        << o.checkpoint_dir << " by an interrupted save\n";
  }
  absl::StatusOr<training::FoundCheckpoint> later;
  while (start.resumed.has_value() && existing.ok() && !existing->empty() &&
         existing->back().step > resumed_step &&
         !(later = training::FindLatestCheckpoint(existing->back().path)).ok()) {
    const std::string broken = existing->back().path;
    if (absl::Status moved = training::MoveCheckpointAside(broken); !moved.ok()) {
      return CheckFailed(moved.message());
    }
    err << "castor train: warning: moved " << broken << " aside to " << broken
        << training::kMovedAsideSuffix << ": " << later.status().message() << "\n";
    existing->pop_back();
  }
  if (existing.ok() && !existing->empty() && existing->back().step > resumed_step) {
    return BadInput(absl::StrFormat(
        "--checkpoint-dir %s holds %s, later than the %s; resume from it, or save this run "
        "into another --checkpoint-dir",
        o.checkpoint_dir, existing->back().path,
        start.resumed.has_value() ? absl::StrCat("resumed step ", resumed_step)
                                  : std::string("start of this fresh run")));
  }
  session.checkpoint.emplace(start.policy);
  absl::StatusOr<Model> float32_copy = CloneModel(start.float32_model);
  if (!float32_copy.ok()) return CheckFailed(float32_copy.status().message());
  session.checkpoint->model = *std::move(float32_copy);
  return absl::OkStatus();
}

// The line a run opens with.
std::string RunHeader(const TrainOptions& o, const Start& start, const Prepared& prepared,
                      const Session& session) {
  const Policy& policy = start.policy;
  return absl::StrFormat(
      "castor train: %s on %s (%d train / %d test), policy %s (%s compute), %s lr %g, batch %d%s, "
      "%d steps, loss scaling %s, backend %s\n",
      prepared.model_name, prepared.data.train.name, prepared.data.train.size(),
      prepared.data.test.size(), policy.name(), DTypeName(policy.compute_dtype()), o.optimizer,
      start.trainer_options.lr.base_lr, o.batch,
      session.world_size == 1
          ? std::string()
          : absl::StrFormat(" (%d per rank on %d ranks, %s)", o.batch / session.world_size,
                            session.world_size, session.trainer->allreduce_engine()),
      prepared.total,
      session.trainer->scaler().enabled() ? "on" : "off",
      training::DescribeBackend(session.backend()));
}

// What the loop leaves for the report.
struct LoopTotals {
  Clock::time_point started;
  double step_seconds = 0;
  double allreduce_seconds = 0;
  double allreduce_wait_seconds = 0;
  int64_t allreduce_bytes = 0;  // the last step's
  int allreduce_buckets = 0;    // the last step's
  int64_t seen_total = 0;
  int64_t steps_run = 0;
  std::optional<training::Evaluation> last_eval;
  std::string last_checkpoint;
};

// A run stops (exit 1) after this many steps in a row skipped with an
// inf/NaN float32 loss (no loss scale can help), or when the loss scaler
// diagnoses that many overflows in a row at its floor (LossScalerOptions::
// floor_patience); --help says so.
constexpr int64_t kMaxNonFiniteLosses = 5;

// A step's warnings on stderr: a skipped step (and the first non-finite
// node), the loss scaler's diagnosis, and once, graph replay that stopped
// being available.
void WarnAboutStep(int64_t step, const training::StepResult& r, const training::Trainer& trainer,
                   bool live, bool& replay_warned, std::ostream& err) {
  if (r.skipped) {
    if (live) err << "\n";
    err << absl::StrFormat("castor train: step %d skipped: inf/NaN gradients at loss scale %g",
                           step, r.loss_scale);
    if (!r.first_non_finite.empty()) err << "; first non-finite: " << r.first_non_finite;
    err << "\n";
  }
  if (!r.diagnosis.empty()) {
    err << "castor train: warning: step " << step << ": " << r.diagnosis << "\n";
  }
  if (!replay_warned && !trainer.replay_unavailable().empty()) {  // it was available
    if (live) err << "\n";
    err << "castor train: warning: steps run node by node: " << trainer.replay_unavailable()
        << "\n";
    replay_warned = true;
  }
}

// A step's JSONL metrics line; `n` samples in `dt` seconds.
std::string StepMetricsLine(int64_t step, int64_t epoch, const training::StepResult& r, int64_t n,
                            double dt) {
  // %.9g prints a float32 loss exactly, so resumed runs compare bit for bit.
  return absl::StrFormat(
      "{\"step\":%d,\"epoch\":%d,\"loss\":%.9g,\"loss_scale\":%g,\"skipped\":%s,\"lr\":%g,"
      "\"samples_per_s\":%.1f,\"grad_norm\":%.6g,\"replayed\":%s%s%s}\n",
      step, epoch, r.loss, r.loss_scale, r.skipped ? "true" : "false", r.lr, n / dt, r.grad_norm,
      r.replayed ? "true" : "false",
      r.allreduce_bytes == 0
          ? ""
          : absl::StrFormat(
                ",\"allreduce_bytes\":%d,\"allreduce_buckets\":%d,\"allreduce_ms\":%.3f,"
                "\"allreduce_wait_ms\":%.3f",
                r.allreduce_bytes, r.allreduce_buckets, 1000 * r.allreduce_seconds,
                1000 * r.allreduce_wait_seconds),
      r.first_non_finite.empty()
          ? ""
          : absl::StrCat(",\"first_non_finite\":", Json::String(r.first_non_finite).Dump()));
}

// This rank's rows of global batch `global` (training::RankShard, as
// PyTorch's DistributedSampler splits an epoch); nullopt on its own.
std::optional<training::Batch> RankBatch(const training::Batch& global,
                                         const training::Dataset& train, const TrainOptions& o,
                                         const Session& session) {
  if (session.world_size == 1) return std::nullopt;
  std::vector<int64_t> order;  // read only to pad an epoch's last batch
  if (global.indices.size() % static_cast<size_t>(session.world_size) != 0) {
    order = training::BatchIterator::EpochOrder(
        train.size(),
        training::BatchOptions{o.batch, o.shuffle, static_cast<uint64_t>(o.seed), false},
        global.epoch);
  }
  training::Batch shard = training::GatherBatch(
      train, training::RankShard(global.indices, order, session.rank, session.world_size));
  shard.epoch = global.epoch;
  shard.position = global.position;
  return shard;
}

// The predictions of a step's batch: this rank's rows scored, summed over
// the ranks.
absl::StatusOr<training::Scored> ScoreGlobalBatch(const training::StepResult& r,
                                                  const training::Batch& fed,
                                                  const TrainOptions& o, const Session& session) {
  training::Scored scored = training::ScoreBatch(r.output, fed.labels, o.ignore_index);
  if (session.communicator == nullptr) return scored;
  double counts[2] = {static_cast<double>(scored.correct), static_cast<double>(scored.counted)};
  CASTOR_RETURN_IF_ERROR(session.communicator->AllreduceSum(
      counts, 2, absl::StrCat("the accuracy counts of step ", r.step)));
  return training::Scored{static_cast<int64_t>(counts[0]), static_cast<int64_t>(counts[1])};
}

// Step 4: the steps from the trainer's next one to `prepared.total`, with
// the progress line (redrawn in place when stderr is a terminal, else
// about ten plain lines), metrics, evaluations and checkpoints.
absl::StatusOr<LoopTotals> TrainLoop(const TrainOptions& o, const Start& start,
                                     const Prepared& prepared, Session& session,
                                     std::ostream& out, std::ostream& err) {
  training::Trainer& trainer = *session.trainer;
  training::BatchIterator& batches = *session.batches;
  const int64_t total = prepared.total;
  const bool live = isatty(STDERR_FILENO) != 0;
  const int64_t first_step = trainer.steps() + 1;
  if (first_step > total) {
    out << absl::StrFormat("nothing to do: the checkpoint is at step %d of %d\n", first_step - 1,
                           total);
  }
  LoopTotals totals;
  totals.started = Clock::now();
  double loss_ema = 0;
  int64_t correct = 0, seen = 0, samples = 0;
  bool replay_warned = !trainer.replay_unavailable().empty();  // warn when recording fails
  const training::RunSettings settings{o.data,  o.loss,    o.output,
                                       o.input, o.batch,   static_cast<uint64_t>(o.seed),
                                       o.shuffle, o.tf32, o.ignore_index,
                                       o.freeze, o.train_only, session.world_size,
                                       o.sync_batch_norm && session.world_size > 1};
  auto evaluate = [&](int64_t epoch) -> absl::Status {
    if (!prepared.data.has_test()) return absl::OkStatus();
    CASTOR_ASSIGN_OR_RETURN(training::Evaluation eval,
                            training::Evaluate(trainer, prepared.data.test, o.input, o.batch,
                                               o.ignore_index));
    totals.last_eval = eval;
    if (live) err << "\n";
    const bool scored = !std::isnan(eval.accuracy);
    out << absl::StrFormat("eval  epoch %d step %d: test loss %.4f%s\n", epoch, trainer.steps(),
                           eval.loss,
                           scored ? absl::StrFormat(", test accuracy %.2f%%", 100 * eval.accuracy)
                                  : std::string());
    if (session.metrics.is_open()) {
      session.metrics << absl::StrFormat(
          "{\"epoch\":%d,\"step\":%d,\"test_loss\":%.6g,\"test_accuracy\":%s}\n", epoch,
          trainer.steps(), eval.loss,
          scored ? absl::StrFormat("%.6g", eval.accuracy) : std::string("null"));
    }
    return absl::OkStatus();
  };
  auto save = [&]() -> absl::Status {
    training::Checkpoint& checkpoint = *session.checkpoint;
    CASTOR_RETURN_IF_ERROR(training::RecordTrainingState(
        trainer, batches, prepared.data.train, start.trainer_options, settings, checkpoint));
    CASTOR_ASSIGN_OR_RETURN(training::SavedCheckpoint saved,
                            training::SaveToCheckpointDir(o.checkpoint_dir, checkpoint, o.keep));
    totals.last_checkpoint = saved.written.path;
    if (live) err << "\n";
    out << absl::StrFormat(
        "checkpoint step %d: %s (%.1f MiB)%s\n", trainer.steps(), saved.written.path,
        saved.written.file_bytes / 1048576.0,
        saved.removed.empty() ? "" : absl::StrCat(", removed ", saved.removed.size(), " older"));
    return absl::OkStatus();
  };
  int64_t non_finite_losses = 0;  // steps in a row skipped with an inf/NaN loss
  for (int64_t step = first_step; step <= total; ++step) {
    training::Batch b = batches.Next();
    const std::optional<training::Batch> shard = RankBatch(b, prepared.data.train, o, session);
    const training::Batch& fed = shard.has_value() ? *shard : b;  // this rank's rows
    const int64_t epoch = b.epoch;
    const auto t0 = Clock::now();
    absl::StatusOr<training::StepResult> r =
        trainer.Step(training::BatchFeeds(fed, o.input), fed.labels);
    if (!r.ok()) return CheckFailed(absl::StrCat("step ", step, ": ", r.status().message()));
    const double dt = Seconds(Clock::now() - t0);
    totals.step_seconds += dt;
    totals.allreduce_seconds += r->allreduce_seconds;
    totals.allreduce_wait_seconds += r->allreduce_wait_seconds;
    totals.allreduce_bytes = r->allreduce_bytes;
    totals.allreduce_buckets = r->allreduce_buckets;
    ++totals.steps_run;
    // Samples (sequences, for token models) for the throughput and scored
    // positions (tokens, with [N, T] labels) for the accuracy, of the
    // global batch.
    const int64_t n = static_cast<int64_t>(b.indices.size());
    absl::StatusOr<training::Scored> scored = ScoreGlobalBatch(*r, fed, o, session);
    if (!scored.ok()) return CheckFailed(scored.status().message());
    correct += scored->correct;
    seen += scored->counted;
    samples += n;
    totals.seen_total += n;
    loss_ema = totals.steps_run == 1 ? r->loss : 0.95 * loss_ema + 0.05 * r->loss;
    WarnAboutStep(step, *r, trainer, live, replay_warned, err);
    if (session.metrics.is_open()) session.metrics << StepMetricsLine(step, epoch, *r, n, dt);
    // A run in which every step is skipped learns nothing: stop it with the
    // diagnosis (see --help) instead of finishing with exit 0.
    non_finite_losses = r->skipped && !std::isfinite(r->loss) ? non_finite_losses + 1 : 0;
    if (non_finite_losses >= kMaxNonFiniteLosses || !r->diagnosis.empty()) {
      return CheckFailed(absl::StrCat(
          "step ", step, ": stopped: ",
          non_finite_losses >= kMaxNonFiniteLosses
              ? absl::StrCat("the loss itself was inf/NaN in float32 for ", non_finite_losses,
                             " steps in a row, each skipped: loss scaling cannot help; look for "
                             "NaN or inf in the data (--data ", o.data,
                             ") or lower the learning rate")
              : r->diagnosis,
          r->first_non_finite.empty() ? "" : absl::StrCat("; first non-finite: ",
                                                         r->first_non_finite)));
    }
    const double elapsed = Seconds(Clock::now() - totals.started);
    const std::string line = absl::StrFormat(
        "step %d/%d  loss %.4f  %s  scale %g  %.0f samples/s  eta %s", step, total, loss_ema,
        seen > 0 ? absl::StrFormat("acc %.2f%%", 100.0 * correct / seen) : std::string("acc -"),
        r->loss_scale, samples / totals.step_seconds,
        FormatDuration(elapsed / totals.steps_run * (total - step)));
    if (live) {
      err << "\r" << line << "\033[K" << std::flush;
    } else if (totals.steps_run == 1 || step == total ||
               step % std::max<int64_t>(1, total / 10) == 0) {
      err << line << "\n";
    }
    const bool epoch_done = batches.epoch() > epoch;
    if ((o.eval_every > 0 && step % o.eval_every == 0) || epoch_done || step == total) {
      if (absl::Status s = evaluate(epoch); !s.ok()) return CheckFailed(s.message());
      correct = seen = samples = 0;
    }
    const bool save_now = o.save_every > 0 ? step % o.save_every == 0 : epoch_done;
    if (session.checkpoint.has_value() && (save_now || step == total)) {
      if (absl::Status s = save(); !s.ok()) {
        return CheckFailed(absl::StrCat("step ", step, ": saving a checkpoint in ",
                                        o.checkpoint_dir, ": ", s.message()));
      }
    }
  }
  if (live) err << "\n";
  return totals;
}

// Step 5: the metrics file's summary record and the printed summary.
absl::Status Report(const TrainOptions& o, const Start& start, Session& session,
                    const LoopTotals& totals, std::ostream& out) {
  const training::Trainer& trainer = *session.trainer;
  const Policy& policy = start.policy;
  TrainSummary summary;
  summary.mean_step_ms = 1000 * totals.step_seconds / std::max<int64_t>(1, totals.steps_run);
  summary.samples_per_s = totals.seen_total / std::max(totals.step_seconds, 1e-9);
  summary.allreduce_engine = trainer.allreduce_engine();
  summary.allreduce_bytes_per_step = totals.allreduce_bytes;
  summary.allreduce_buckets = totals.allreduce_buckets;
  summary.mean_allreduce_ms =
      1000 * totals.allreduce_seconds / std::max<int64_t>(1, totals.steps_run);
  summary.mean_allreduce_wait_ms =
      1000 * totals.allreduce_wait_seconds / std::max<int64_t>(1, totals.steps_run);
  // Device memory: the CUDA pool's peak (activations, weights, workspaces).
  absl::StatusOr<DeviceMemoryStats> device_memory = CudaMemoryStats(session.backend());
  if (device_memory.ok()) summary.peak_device_bytes = device_memory->peak_in_use_bytes;
  summary.peak_resident_bytes = PeakResidentBytes();
  summary.peak_activation_bytes = trainer.peak_activation_bytes();
  if (session.metrics.is_open()) {
    session.metrics << absl::StrFormat(
        "{\"summary\":true,\"backend\":%s,\"tf32\":%s,\"policy\":%s,\"steps\":%d,"
        "\"skipped\":%d,\"step_time_ms\":%.3f,\"samples_per_s\":%.1f,\"steps_run\":%d,"
        "\"replayed_steps\":%d,\"peak_activation_bytes\":%d,\"peak_resident_bytes\":%d%s%s}\n",
        Json::String(session.backend().name()).Dump(), o.tf32 ? "true" : "false",
        Json::String(policy.name()).Dump(), trainer.steps(), trainer.scaler().skipped_steps(),
        summary.mean_step_ms, summary.samples_per_s, totals.steps_run, trainer.replayed_steps(),
        summary.peak_activation_bytes, summary.peak_resident_bytes,
        device_memory.ok()
            ? absl::StrCat(",\"peak_device_memory_bytes\":", device_memory->peak_in_use_bytes)
            : "",
        summary.allreduce_bytes_per_step == 0
            ? ""
            : absl::StrFormat(
                  ",\"allreduce_engine\":%s,\"allreduce_bytes_per_step\":%d,"
                  "\"allreduce_buckets\":%d,\"allreduce_ms\":%.3f,\"allreduce_wait_ms\":%.3f",
                  Json::String(summary.allreduce_engine).Dump(),
                  summary.allreduce_bytes_per_step, summary.allreduce_buckets,
                  summary.mean_allreduce_ms, summary.mean_allreduce_wait_ms));
    if (!session.metrics.flush()) {
      return CheckFailed(absl::StrCat("writing --metrics ", o.metrics_path, " failed"));
    }
  }
  summary.policy = policy.name();
  summary.compute_dtype = DTypeName(policy.compute_dtype());
  for (const std::string& name : trainer.state_names()) {
    summary.float32_weights += trainer.model().graph->FindValue(name)->dtype() == DType::kFloat32;
  }
  summary.weights = static_cast<int64_t>(trainer.state_names().size());
  auto elements = [&](const std::string& name) {
    const Value* value = trainer.model().graph->FindValue(name);
    return value != nullptr && value->initializer() != nullptr
               ? value->initializer()->num_elements()
               : int64_t{0};
  };
  for (const auto& [parameter, gradient] : trainer.training_graph().gradients) {
    ++summary.trained_tensors;
    summary.trained_elements += elements(parameter);
  }
  for (const std::string& parameter : trainer.training_graph().frozen) {
    ++summary.frozen_tensors;
    summary.frozen_elements += elements(parameter);
  }
  summary.steps = trainer.steps();
  summary.skipped_steps = trainer.scaler().skipped_steps();
  summary.loss_scale = trainer.scaler().scale();
  summary.backend = training::DescribeBackend(session.backend());
  summary.policy_fit = session.policy_fit;
  summary.tf32 = o.tf32;
  summary.graph_replay =
      o.cuda_graphs == "off" ? std::string("off (--cuda-graphs off)")
      : trainer.replay_unavailable().empty()
          ? absl::StrFormat("%d of this run's %d steps replayed as a CUDA graph",
                            trainer.replayed_steps(), totals.steps_run)
          : absl::StrCat("none: ", trainer.replay_unavailable());
  summary.seconds = Seconds(Clock::now() - totals.started);
  summary.test = totals.last_eval;
  summary.last_checkpoint = totals.last_checkpoint;
  out << RenderTrainSummary(summary);
  if (o.profile) out << RenderKernelProfile(trainer.kernel_times(), summary.mean_step_ms);
  return absl::OkStatus();
}

// --- data parallelism (issue #31) ---------------------------------------------

// This process's data-parallel group: from RANK/WORLD_SIZE/MASTER_* (see
// training/distributed/communicator.h), or on its own (rank 0 of 1, no
// communicator).
struct DataParallelGroup {
  std::unique_ptr<distributed::Communicator> communicator;
  int rank = 0;
  int world_size = 1;
  training::RankPlacement placement;  // on this host
  // `status` with "rank R of N: " in front, in a group (unless it names
  // this rank already).
  absl::Status Named(const absl::Status& status) const {
    const std::string prefix = distributed::RankPrefix(rank, world_size);
    if (world_size == 1 || absl::StrContains(status.message(), prefix)) return status;
    return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
  }
};

// `castor train --nproc N`: the same command as N local ranks.
int LaunchRanks(const TrainOptions& o, const std::vector<std::string>& args, std::ostream& err) {
  absl::StatusOr<std::string> executable = distributed::CurrentExecutable();
  if (!executable.ok()) {
    err << "castor train: --nproc: " << executable.status().message() << "\n";
    return kExitFailure;
  }
  // A rank that fails makes the others fail their next collective within
  // the timeout; any still running after that (and a margin) are killed.
  const std::chrono::milliseconds grace = std::chrono::seconds(o.dist_timeout + 10);
  return distributed::LaunchLocalRanks(*executable, distributed::WithoutNprocFlag(args),
                                       static_cast<int>(o.nproc), grace, err);
}

// Joins the group the environment describes (a bad configuration is
// BadInput on every rank that sees it).
absl::StatusOr<DataParallelGroup> JoinDataParallelGroup(const TrainOptions& o) {
  DataParallelGroup group;
  absl::StatusOr<std::optional<distributed::DistributedConfig>> config =
      distributed::ConfigFromEnvironment(std::chrono::seconds(o.dist_timeout));
  if (!config.ok()) return BadInput(config.status().message());
  if (!config->has_value()) return group;
  group.rank = (*config)->rank;
  group.world_size = (*config)->world_size;
  group.placement = {(*config)->local_rank, (*config)->local_world_size};
  absl::StatusOr<std::unique_ptr<distributed::Communicator>> communicator =
      distributed::Connect(**config);
  if (!communicator.ok()) {
    return communicator.status().code() == absl::StatusCode::kUnavailable
               ? CheckFailed(communicator.status().message())
               : BadInput(communicator.status().message());
  }
  group.communicator = *std::move(communicator);
  return group;
}

// --batch is the global batch: every rank gets the same share of it.
absl::Status CheckGlobalBatch(const TrainOptions& o, const DataParallelGroup& group) {
  if (o.batch % group.world_size == 0) return absl::OkStatus();
  return BadInput(absl::StrCat("--batch ", o.batch, " (the global batch) is not a multiple of the ",
                               group.world_size, " ranks: each rank trains on batch / ranks"));
}

// FNV-1a, for comparing what the ranks start from.
uint64_t Fingerprint(const void* data, size_t bytes, uint64_t hash = 1469598103934665603ull) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}
uint64_t Fingerprint(const std::string& text, uint64_t hash = 1469598103934665603ull) {
  return Fingerprint(text.data(), text.size(), hash);
}

// Every rank must start from the same castor, settings, data and weights,
// or the ranks would drift apart (or wait on each other forever): each
// compares its fingerprints with rank 0's, and all of them stop (exit 2)
// when any differs, the differing rank naming what.
absl::Status CheckRanksAgree(const TrainOptions& o, const Prepared& prepared, Session& session,
                             DataParallelGroup& group) {
  if (group.communicator == nullptr) return absl::OkStatus();
  const char* names[] = {"castor version", "training settings (flags or checkpoint)",
                         "training data", "model weights and training state"};
  uint64_t mine[4];
  mine[0] = Fingerprint(std::string(kCastorVersion));
  mine[1] = Fingerprint(absl::StrCat(o.batch, "|", o.seed, "|", o.shuffle, "|", o.loss, "|",
                                     o.output, "|", o.input, "|", prepared.total, "|",
                                     o.optimizer, "|", o.lr, "|", o.freeze, "|", o.train_only,
                                     "|", o.bucket_mb, "|", o.sync_batch_norm));
  const training::Dataset& train = prepared.data.train;
  mine[2] = Fingerprint(train.labels.raw(), train.labels.byte_size(),
                        Fingerprint(train.images.raw(), train.images.byte_size()));
  absl::StatusOr<training::Trainer::Snapshot> snapshot = session.trainer->TakeSnapshot();
  if (!snapshot.ok()) return CheckFailed(snapshot.status().message());
  uint64_t state = Fingerprint(absl::StrCat(session.trainer->steps()));
  for (const auto& [name, tensor] : snapshot->state) {
    state = Fingerprint(tensor.raw(), tensor.byte_size(), Fingerprint(name, state));
  }
  mine[3] = state;
  uint64_t rank0[4];
  std::memcpy(rank0, mine, sizeof(mine));
  CASTOR_RETURN_IF_ERROR(group.communicator->Broadcast(rank0, sizeof(rank0), 0, "fingerprints"));
  std::string differs;
  for (int k = 0; k < 4; ++k) {
    if (mine[k] != rank0[k]) absl::StrAppend(&differs, differs.empty() ? "" : ", ", names[k]);
  }
  double disagreeing = differs.empty() ? 0 : 1;
  CASTOR_RETURN_IF_ERROR(group.communicator->AllreduceSum(&disagreeing, 1, "the agreement check"));
  if (!differs.empty()) {
    return BadInput(absl::StrCat("this rank's ", differs,
                                 " differ(s) from rank 0's: every rank must run the same castor "
                                 "on the same model, data and flags"));
  }
  if (disagreeing > 0) {
    return BadInput(absl::StrCat(disagreeing, " rank(s) start from another castor version, "
                                 "settings, data or weights than rank 0 (their errors say which)"));
  }
  return absl::OkStatus();
}

// A checkpoint of another world size continues with the same global batch
// and data position; say so.
void NoteWorldSizeChange(const Start& start, const DataParallelGroup& group, std::ostream& err) {
  if (!start.resumed.has_value()) return;
  const Json* recorded = start.resumed->extra.Find(training::kWorldSizeStateKey);
  const int64_t saved = recorded != nullptr && recorded->is_int() ? recorded->as_int() : 1;
  if (saved == group.world_size) return;
  err << "castor train: the checkpoint trained on " << saved << " rank(s); this run has "
      << group.world_size << ": it continues with the same global batch and data order (the "
      << "per-rank batch and the gradients' summation order change)\n";
}

// A checkpoint whose ranks synchronised BatchNormalization, resumed
// without --sync-batchnorm (or the reverse): its statistics change; say so.
void NoteSyncBatchNormChange(const TrainOptions& o, const Start& start,
                             const DataParallelGroup& group, std::ostream& err) {
  if (!start.resumed.has_value()) return;
  const Json* recorded = start.resumed->extra.Find(training::kSyncBatchNormStateKey);
  const bool saved = recorded != nullptr && recorded->is_bool() && recorded->as_bool();
  const bool now = o.sync_batch_norm && group.world_size > 1;
  if (saved == now) return;
  err << "castor train: the checkpoint's run "
      << (saved ? "synchronised BatchNormalization across its ranks (--sync-batchnorm)"
                : "used each rank's own BatchNormalization statistics")
      << "; this run " << (now ? "synchronises them" : "does not")
      << ", so its BatchNormalization statistics differ from the run so far\n";
}

}  // namespace

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60) : absl::StrFormat("%ds", s);
}

training::TrainerOptions TrainerOptionsFromFlags(const TrainOptions& o) {
  training::TrainerOptions trainer_options;
  absl::StatusOr<OptimizerKind> kind = ParseOptimizerKind(o.optimizer);
  trainer_options.optimizer.kind = *kind;
  trainer_options.optimizer.momentum = o.momentum;
  trainer_options.optimizer.nesterov = o.nesterov;
  trainer_options.optimizer.weight_decay = o.weight_decay;
  trainer_options.optimizer.clip_norm = o.clip_norm;
  trainer_options.lr.base_lr = o.lr;
  trainer_options.lr.warmup_steps = o.warmup;
  trainer_options.lr.step_size = o.step_size;
  trainer_options.lr.gamma = o.gamma;
  trainer_options.rng_seed = static_cast<uint64_t>(o.seed);
  return trainer_options;
}

std::vector<std::string> FlagsTheCheckpointDecides(const std::vector<std::string>& args) {
  std::vector<std::string> given;
  for (const std::string& arg : args) {
    for (const char* flag : kFlagsTheCheckpointDecides) {
      if (arg == flag || arg.rfind(absl::StrCat(flag, "="), 0) == 0) given.push_back(flag);
    }
  }
  return given;
}

training::TrainerOptions TakeCheckpointSettings(const training::TrainingState& saved,
                                                const std::string& resumed_from,
                                                TrainOptions& o) {
  if (o.data.empty()) o.data = saved.data;
  if (o.checkpoint_dir.empty()) {
    o.checkpoint_dir = std::filesystem::path(resumed_from).parent_path().string();
    if (o.checkpoint_dir.empty()) o.checkpoint_dir = ".";
  }
  o.loss = saved.loss;
  o.output = saved.output;
  o.input = saved.input;
  absl::StatusOr<std::optional<int64_t>> ignore_index = training::RecordedIgnoreIndex(saved);
  o.ignore_index = ignore_index.ok() ? *ignore_index : std::nullopt;
  const Json* freeze = saved.extra.Find(training::kFreezeStateKey);
  const Json* train_only = saved.extra.Find(training::kTrainOnlyStateKey);
  o.freeze = freeze != nullptr && freeze->is_string() ? freeze->as_string() : "";
  o.train_only = train_only != nullptr && train_only->is_string() ? train_only->as_string() : "";
  o.batch = saved.batch_size;
  o.seed = static_cast<int64_t>(saved.seed);
  o.shuffle = saved.shuffle;
  o.optimizer = OptimizerKindName(saved.optimizer.kind);
  training::TrainerOptions trainer_options;
  trainer_options.optimizer = saved.optimizer;
  trainer_options.lr = saved.lr_schedule;
  trainer_options.rng_seed = saved.seed;  // RestoreTrainer sets the recorded RNG state
  return trainer_options;
}

std::string RenderTrainSummary(const TrainSummary& s) {
  std::string text = absl::StrCat(
      "summary:\n",
      absl::StrFormat("  policy          %s (%s compute, float32 variables)\n", s.policy,
                      s.compute_dtype),
      absl::StrFormat(
          "  weights         %d of %d tensors float32 (master weights and BN statistics)\n",
          s.float32_weights, s.weights),
      absl::StrFormat("  parameters      %d tensors (%d elements) train, %d (%d elements) "
                      "frozen\n",
                      s.trained_tensors, s.trained_elements, s.frozen_tensors,
                      s.frozen_elements),
      absl::StrFormat("  steps           %d, %d skipped\n", s.steps, s.skipped_steps),
      absl::StrFormat("  loss scale      %g (final)\n", s.loss_scale),
      absl::StrFormat("  backend         %s%s\n", s.backend,
                      s.tf32 ? ", TF32 for float32 MatMul/Gemm/Conv" : ""),
      s.policy_fit.empty() ? "" : absl::StrFormat("  policy fit      %s\n", s.policy_fit),
      absl::StrFormat("  graph replay    %s\n", s.graph_replay),
      absl::StrFormat("  peak memory     %.1f MiB of activations%s; process %.0f MiB "
                      "resident\n",
                      s.peak_activation_bytes / 1048576.0,
                      s.peak_device_bytes.has_value()
                          ? absl::StrFormat("; %.1f MiB of device memory",
                                            *s.peak_device_bytes / 1048576.0)
                          : "",
                      s.peak_resident_bytes / 1048576.0),
      absl::StrFormat("  step time       %.1f ms (mean), %.0f samples/s, %s in all\n",
                      s.mean_step_ms, s.samples_per_s, FormatDuration(s.seconds)),
      s.allreduce_bytes_per_step == 0
          ? ""
          : absl::StrFormat("  allreduce       %s: %.2f MiB per step in %d bucket(s), %.1f ms "
                            "(mean; waiting for the slowest rank included), of which %.1f ms "
                            "(%.0f%% of the step) after the backward pass\n",
                            s.allreduce_engine, s.allreduce_bytes_per_step / 1048576.0,
                            s.allreduce_buckets,
                            s.mean_allreduce_ms, s.mean_allreduce_wait_ms,
                            s.mean_step_ms > 0 ? 100 * s.mean_allreduce_wait_ms / s.mean_step_ms
                                               : 0));
  if (s.test.has_value()) {
    absl::StrAppend(&text,
                    absl::StrFormat("  test            loss %.4f%s\n", s.test->loss,
                                    std::isnan(s.test->accuracy)
                                        ? std::string()
                                        : absl::StrFormat(", accuracy %.2f%%",
                                                          100 * s.test->accuracy)));
  }
  if (!s.last_checkpoint.empty()) {
    absl::StrAppend(&text,
                    absl::StrFormat("  checkpoint      %s (check it: castor verify %s)\n",
                                    s.last_checkpoint, s.last_checkpoint));
  }
  return text;
}

int RunTrain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  TrainOptions o;
  ArgParser parser = MakeParser(o);
  const Command command(parser, out, err);
  if (std::optional<int> done = command.Parse(args)) return *done;
  if (parser.WasGiven("ignore-index")) o.ignore_index = o.ignore_index_arg;
  auto fail = [&command](const absl::Status& status) {
    return command.Fail(ExitCodeOf(status), status);
  };
  if (absl::Status s = CheckFlags(o); !s.ok()) return fail(s);
  if (absl::Status s = CheckOutputPaths(o); !s.ok()) return fail(s);
  if (o.nproc > 1) {
    for (const distributed::Launcher& launcher : distributed::Launchers()) {
      for (const char* variable : {launcher.rank_variable, launcher.world_size_variable}) {
        if (std::getenv(variable) != nullptr) {
          return fail(BadInput(absl::StrCat("--nproc starts its own ranks, but ", variable,
                                            " is set (by ", launcher.name,
                                            "?): give one or the other")));
        }
      }
    }
    if (!distributed::CollectivesAvailable()) {
      return fail(BadInput("--nproc: this castor was built without Gloo (install libgloo-dev "
                           "and rebuild)"));
    }
    return LaunchRanks(o, args, err);
  }
  absl::StatusOr<DataParallelGroup> group = JoinDataParallelGroup(o);
  if (!group.ok()) return fail(group.status());
  // In a data-parallel run only rank 0 prints, but for errors.
  std::ostream quiet(nullptr);
  std::ostream& shown_out = group->rank == 0 ? out : quiet;
  std::ostream& shown_err = group->rank == 0 ? err : quiet;
  auto fail_here = [&](const absl::Status& status) { return fail(group->Named(status)); };
  absl::StatusOr<Start> start =
      SetUpOrResume(o, parser.WasGiven("tf32"), args, shown_out, shown_err);
  if (!start.ok()) return fail_here(start.status());
  if (absl::Status s = CheckGlobalBatch(o, *group); !s.ok()) return fail_here(s);
  NoteWorldSizeChange(*start, *group, shown_err);
  start->trainer_options.communicator = group->communicator.get();
  start->trainer_options.allreduce_bucket_bytes =
      static_cast<size_t>(std::llround(o.bucket_mb * 1048576.0));
  start->trainer_options.sync_batch_norm = o.sync_batch_norm;
  start->trainer_options.collective_timeout = std::chrono::seconds(o.dist_timeout);
  NoteSyncBatchNormChange(o, *start, *group, shown_err);
  absl::StatusOr<Prepared> prepared = PrepareGraphAndData(o, *start, shown_out);
  if (!prepared.ok()) return fail_here(prepared.status());
  Session session;
  session.rank = group->rank;
  session.world_size = group->world_size;
  session.placement = group->placement;
  session.communicator = group->communicator.get();
  if (session.rank != 0) {  // metrics and checkpoints come from rank 0
    o.metrics_path.clear();
    o.checkpoint_dir.clear();
  }
  if (absl::Status s = ChooseBackend(o, *start, *prepared, session, shown_err); !s.ok()) {
    return fail_here(s);
  }
  if (absl::Status s = CreateTrainer(o, *start, *prepared, session); !s.ok()) return fail_here(s);
  if (absl::Status s = CheckRanksAgree(o, *prepared, session, *group); !s.ok()) {
    return fail_here(s);
  }
  if (absl::Status s = OpenMetrics(o, *start, session); !s.ok()) return fail_here(s);
  if (absl::Status s = OpenCheckpointDir(o, *start, session, shown_err); !s.ok()) {
    return fail_here(s);
  }
  shown_out << RunHeader(o, *start, *prepared, session);
  absl::StatusOr<LoopTotals> totals =
      TrainLoop(o, *start, *prepared, session, shown_out, shown_err);
  if (!totals.ok()) {
    // A fresh run that failed before its first step leaves no empty file.
    if (session.metrics.is_open() && !start->resumed.has_value() && session.metrics.tellp() == 0) {
      session.metrics.close();
      std::error_code ignored;
      std::filesystem::remove(o.metrics_path, ignored);
    }
    return fail_here(totals.status());
  }
  if (absl::Status s = Report(o, *start, session, *totals, shown_out); !s.ok()) {
    return fail_here(s);
  }
  return kExitOk;
}

}  // namespace castor::tools
