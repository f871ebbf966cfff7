// `castor train` (see train_command.h).
//
// The run in order: parse the flags; start fresh from MODEL or resume from a
// checkpoint (its float32 graph and weights, policy, optimizer, schedule,
// loss scaler and data order); convert under the policy; build the training
// graph and the trainer; loop over batches with progress, metrics,
// evaluations and checkpoints; print the summary.
#include "tools/train_command.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_backend.h"
#include "graph/json.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "graph/status.h"
#include "passes/autocast.h"
#include "passes/canonicalize.h"
#include "passes/pass_manager.h"
#include "tools/args.h"
#include "training/checkpoint.h"
#include "tools/cli.h"
#include "training/dataset.h"
#include "tools/inspect.h"
#include "training/trainer.h"
#include "training/training_backend.h"

namespace castor::tools {
namespace {

struct TrainOptions {
  std::string model_path;
  std::string data;    // "": the checkpoint's when resuming, else fashion-mnist
  std::string policy;  // "": the checkpoint's when resuming, else mixed_float16
  std::string policy_file;
  std::string loss = "cross-entropy";
  std::string output = "logits";
  std::string input;  // the model input the images feed; "" = its only input
  std::string dump_passes_dir;  // "": no dumps
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
};

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string Duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60) : absl::StrFormat("%ds", s);
}

// The process's peak resident set size so far (the kernel's high-water
// mark: data set, weights, libraries and kernel scratch as well as the
// activations); 0 where getrusage fails.
int64_t PeakResidentBytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

// An error with the exit code it gives.
struct Failure {
  int code;
  std::string message;
};

// Correct predictions (argmax of each row of `output` [B, C]) in a batch.
int64_t CountCorrect(const Tensor& output, const Tensor& labels) {
  const int64_t rows = labels.num_elements();
  const int64_t classes = rows > 0 ? output.num_elements() / rows : 0;
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (output.GetDouble(r * classes + c) > output.GetDouble(r * classes + best)) best = c;
    }
    correct += best == labels.data<int64_t>()[r];
  }
  return correct;
}

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

absl::StatusOr<Evaluation> Evaluate(training::Trainer& trainer, const training::Dataset& test, const std::string& input,
                                    int64_t batch) {
  CASTOR_ASSIGN_OR_RETURN(training::BatchIterator batches,
                          training::BatchIterator::Create(test, training::BatchOptions{batch, false, 0, false}));
  double loss_sum = 0;
  int64_t correct = 0, seen = 0;
  while (batches.epoch() == 0) {
    training::Batch b = batches.Next();
    const int64_t n = b.labels.num_elements();
    CASTOR_ASSIGN_OR_RETURN(training::StepResult r, trainer.Evaluate({{input, b.images}}, b.labels));
    loss_sum += r.loss * n;
    correct += CountCorrect(r.output, b.labels);
    seen += n;
  }
  return Evaluation{loss_sum / seen, static_cast<double>(correct) / seen};
}

// The key in TrainingState::extra recording --tf32 as it took effect.
constexpr const char* kTf32StateKey = "tf32";

// Flags a resumed run takes from its checkpoint instead.
constexpr const char* kFlagsTheCheckpointDecides[] = {
    "--loss",     "--output",       "--input",     "--optimizer", "--lr",         "--momentum",
    "--nesterov", "--weight-decay", "--clip-norm", "--schedule",  "--step-size",  "--gamma",
    "--warmup",   "--batch",        "--seed",      "--shuffle",   "--no-shuffle", "--loss-scaling"};

// Keeps the metrics lines of steps up to `step` (JSON objects with a "step"
// at most `step`), dropping later ones and a torn last line; rewritten
// atomically. A missing file is fine.
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
  absl::Status written = WriteFileAtomically(path, kept);
  if (!written.ok()) {
    return absl::Status(written.code(), absl::StrCat("--metrics ", path, ": ", written.message()));
  }
  return absl::OkStatus();
}

// The policy the flags ask for; nullopt when neither --policy nor
// --policy-file is given.
absl::StatusOr<std::optional<Policy>> RequestedPolicy(const TrainOptions& o) {
  if (!o.policy.empty() && !o.policy_file.empty()) {
    return absl::InvalidArgumentError("give --policy or --policy-file, not both");
  }
  if (!o.policy_file.empty()) return Policy::LoadFile(o.policy_file);
  if (!o.policy.empty()) return Policy::Builtin(o.policy);
  return std::nullopt;
}

// The dtype each node of the float32 `model` computes in under `policy`.
absl::StatusOr<std::map<std::string, std::string>> NodeDTypes(const Model& model,
                                                              const Policy& policy) {
  CASTOR_ASSIGN_OR_RETURN(Model converted, CloneModel(model));
  CASTOR_RETURN_IF_ERROR(InferTypes(converted));
  CASTOR_RETURN_IF_ERROR(RunAutocast(converted, policy).status());
  std::map<std::string, std::string> dtypes;
  for (const Node* node : converted.graph->nodes()) {
    if (node->FindMetadata(kInsertedCastKey) != nullptr) continue;
    const std::string* dtype = node->FindMetadata(kNodeDTypeKey);
    dtypes[node->name()] = dtype != nullptr ? *dtype : "-";
  }
  return dtypes;
}

// "node 'conv1': float16 -> bfloat16" for every node whose dtype differs.
absl::StatusOr<std::vector<std::string>> PolicyChangeByNode(const Model& model, const Policy& from,
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

// Everything a run starts from: the float32 model, the policy, and, when
// resuming, the saved state.
struct Start {
  Model float32_model;
  Policy policy;
  std::optional<training::TrainingState> resumed;  // with its moments
  std::string resumed_from;              // the checkpoint path
  bool policy_changed = false;
};

absl::StatusOr<Start> StartFresh(const TrainOptions& o, std::optional<Policy> requested) {
  if (o.model_path.empty()) {
    return absl::InvalidArgumentError("give MODEL, or --resume with a checkpoint");
  }
  CASTOR_ASSIGN_OR_RETURN(Model model, LoadAndCheckModel(o.model_path));
  Policy policy = requested.has_value() ? *std::move(requested) : *Policy::Builtin("mixed_float16");
  return Start{std::move(model), std::move(policy), std::nullopt, "", false};
}

// Resumes from a checkpoint file or the newest usable one in a directory.
// Refuses another policy than the recorded one unless --allow-policy-change,
// which prints the node-level difference.
std::variant<Start, Failure> StartFromCheckpoint(const TrainOptions& o,
                                                 std::optional<Policy> requested, std::ostream& out,
                                                 std::ostream& err) {
  absl::StatusOr<training::FoundCheckpoint> found = training::FindLatestCheckpoint(o.resume);
  if (!found.ok()) {
    return Failure{found.status().code() == absl::StatusCode::kFailedPrecondition ? kExitFailure
                                                                                  : kExitBadInput,
                   absl::StrCat("--resume: ", found.status().message())};
  }
  for (const std::string& skipped : found->skipped) {
    err << "castor train: warning: --resume skipped " << skipped << "\n";
  }
  training::Checkpoint& checkpoint = found->checkpoint;
  Start start{std::move(checkpoint.model), checkpoint.policy, std::move(checkpoint.state),
              found->path, false};
  out << absl::StrFormat("resuming from %s: step %d, epoch %d, policy %s\n", found->path,
                         start.resumed->step, start.resumed->epoch, start.policy.name());
  if (requested.has_value() && requested->Digest() != start.policy.Digest()) {
    if (!o.allow_policy_change) {
      std::string message = absl::StrCat(
          "--resume: the checkpoint ", found->path, " was trained under policy '",
          start.policy.name(), "' (", start.policy.Digest(), "); the requested policy '",
          requested->name(), "' (", requested->Digest(), ") differs:");
      for (const std::string& line : training::DescribePolicyDifferences(start.policy, *requested)) {
        absl::StrAppend(&message, "\n  ", line);
      }
      absl::StrAppend(&message, "\npass --allow-policy-change to re-run autocast under '",
                      requested->name(), "', or drop --policy to keep '", start.policy.name(), "'");
      return Failure{kExitFailure, message};
    }
    absl::StatusOr<std::vector<std::string>> changes =
        PolicyChangeByNode(start.float32_model, start.policy, *requested);
    if (!changes.ok()) return Failure{kExitFailure, std::string(changes.status().message())};
    out << absl::StrFormat(
        "policy change %s -> %s (--allow-policy-change): %d nodes change dtype\n",
        start.policy.name(), requested->name(), changes->size());
    for (const std::string& change : *changes) out << "  " << change << "\n";
    start.policy = *std::move(requested);
    start.policy_changed = true;
  }
  return start;
}

// The float32 model (weights replaced by the trainer's) and the state to save.
absl::StatusOr<training::SavedCheckpoint> SaveCheckpoint(const TrainOptions& o, training::Checkpoint& checkpoint,
                                               const training::Trainer& trainer, const training::BatchIterator& batches,
                                               const training::Dataset& train,
                                               const training::TrainerOptions& trainer_options) {
  CASTOR_ASSIGN_OR_RETURN(training::Trainer::Snapshot snapshot, trainer.TakeSnapshot());
  CASTOR_RETURN_IF_ERROR(training::SetInitializers(checkpoint.model, snapshot.state));
  training::TrainingState& state = checkpoint.state;
  state.step = trainer.steps();
  state.optimizer_step = snapshot.optimizer.step();
  state.epoch = batches.epoch();
  state.position = batches.position();
  state.seed = static_cast<uint64_t>(o.seed);
  state.shuffle = o.shuffle;
  state.drop_last = false;
  state.batch_size = o.batch;
  state.dataset_size = train.size();
  state.data = o.data;
  state.loss = o.loss;
  state.output = o.output;
  state.input = o.input;
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
  state.extra.Set(kTf32StateKey, Json::Bool(o.tf32));
  return training::SaveToCheckpointDir(o.checkpoint_dir, checkpoint, o.keep);
}

}  // namespace

int RunTrain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  TrainOptions o;
  ArgParser parser(
      "castor train",
      "Trains MODEL in mixed precision on a GPU or the CPU: converts it under --policy\n"
      "(float32 master weights; see 'castor convert'), attaches the loss to --output, builds\n"
      "the backward graph, and runs the optimizer with dynamic loss scaling (on by default for\n"
      "mixed_float16: initial scale 65536, x2 every 2000 good steps, x0.5 and the step skipped\n"
      "on inf/NaN gradients, naming the first node that went non-finite). Prints a progress\n"
      "line and a summary; --metrics writes JSONL; --checkpoint-dir saves checkpoints that\n"
      "'castor verify' checks and --resume continues bit for bit.");
  parser
      .AddOptionalPositional("MODEL", "the float32 ONNX model to train (not needed with --resume)",
                             &o.model_path)
      .AddString("data", "SPEC",
                 "fashion-mnist, mnist, a directory of IDX files or train/test.npz, a .npz, or "
                 "IMAGES,LABELS[,TEST_IMAGES,TEST_LABELS] (.npy or IDX); default fashion-mnist, "
                 "or the checkpoint's with --resume",
                 &o.data)
      .AddString("policy", "NAME",
                 absl::StrCat("the autocast policy: ", absl::StrJoin(Policy::BuiltinNames(), ", "),
                              " (default mixed_float16, or the checkpoint's with --resume)"),
                 &o.policy)
      .AddString("policy-file", "FILE", "a policy JSON file (see 'castor convert --save-policy')",
                 &o.policy_file)
      .AddEnum("loss", {"cross-entropy", "mse", "output"},
               "cross-entropy on logits with integer labels, mse, or the output is the loss",
               &o.loss)
      .AddString("output", "NAME", "the model output the loss is attached to", &o.output)
      .AddString("input", "NAME", "the model input the images feed (default: the only one)",
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
      .AddInt("batch", "N", "batch size", &o.batch)
      .AddInt("epochs", "N", "epochs over the training split", &o.epochs)
      .AddInt("max-steps", "N", "stop after N steps in all, resumed ones included (0: no limit)",
              &o.max_steps)
      .AddInt("seed", "S", "shuffle seed", &o.seed)
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
      .AddExample(
          "castor train models/cnn_opset17.onnx --data fashion-mnist --policy "
          "mixed_bfloat16 --epochs 1 --metrics run.jsonl --checkpoint-dir ckpt")
      .AddExample("castor train --resume ckpt --epochs 2");

  auto fail = [&err](int code, const std::string& message) {
    err << "castor train: error: " << message << "\n";
    return code;
  };
  absl::StatusOr<ParseOutcome> outcome = parser.Parse(args);
  if (!outcome.ok()) return fail(kExitBadInput, std::string(outcome.status().message()));
  if (*outcome == ParseOutcome::kHelp) {
    out << parser.Help();
    return kExitOk;
  }
  if (o.batch < 1 || o.epochs < 1 || o.max_steps < 0 || o.eval_every < 0 || o.warmup < 0 ||
      o.save_every < 0 || o.keep < 0 || o.step_size < 1) {
    return fail(kExitBadInput,
                "--batch, --epochs and --step-size must be >= 1; --max-steps, "
                "--eval-every, --warmup, --save-every and --keep >= 0");
  }
  if (o.allow_policy_change && o.resume.empty()) {
    return fail(kExitBadInput, "--allow-policy-change only applies with --resume");
  }
  if (o.tf32 && o.backend == "cpu") {
    return fail(kExitBadInput, "--tf32 applies to the CUDA backend only; --backend is cpu");
  }

  // Where the run starts.
  absl::StatusOr<std::optional<Policy>> requested = RequestedPolicy(o);
  if (!requested.ok()) return fail(kExitBadInput, std::string(requested.status().message()));
  std::optional<Start> start;
  if (o.resume.empty()) {
    absl::StatusOr<Start> fresh = StartFresh(o, *std::move(requested));
    if (!fresh.ok()) return fail(kExitBadInput, std::string(fresh.status().message()));
    start = *std::move(fresh);
  } else {
    std::variant<Start, Failure> resumed = StartFromCheckpoint(o, *std::move(requested), out, err);
    if (Failure* failure = std::get_if<Failure>(&resumed))
      return fail(failure->code, failure->message);
    start = std::get<Start>(std::move(resumed));
  }
  const Policy& policy = start->policy;
  training::TrainerOptions trainer_options;
  std::optional<bool> checkpoint_tf32;  // whether the resumed checkpoint ran on TF32
  if (start->resumed.has_value()) {
    // The run continues as it was configured.
    const training::TrainingState& saved = *start->resumed;
    for (const std::string& arg : args) {
      for (const char* flag : kFlagsTheCheckpointDecides) {
        if (arg == flag || arg.rfind(absl::StrCat(flag, "="), 0) == 0) {
          err << "castor train: warning: " << flag << " is ignored with --resume: the "
              << "checkpoint decides it\n";
        }
      }
    }
    if (o.data.empty()) o.data = saved.data;
    // TF32: the checkpoint's setting unless --tf32 or --no-tf32 is given
    // (a change is warned about once the backend is known, below).
    // Checkpoints from before it was recorded count as without.
    const Json* saved_tf32 = saved.extra.Find(kTf32StateKey);
    if (saved_tf32 != nullptr && !saved_tf32->is_bool()) {
      return fail(kExitBadInput,
                  absl::StrCat("--resume: the checkpoint ", start->resumed_from,
                               " records tf32 as ", saved_tf32->Dump(), "; expected true or false"));
    }
    checkpoint_tf32 = saved_tf32 != nullptr && saved_tf32->as_bool();
    if (!parser.WasGiven("tf32")) o.tf32 = *checkpoint_tf32;
    if (o.checkpoint_dir.empty()) {
      o.checkpoint_dir = std::filesystem::path(start->resumed_from).parent_path().string();
      if (o.checkpoint_dir.empty()) o.checkpoint_dir = ".";
    }
    o.loss = saved.loss;
    o.output = saved.output;
    o.input = saved.input;
    o.batch = saved.batch_size;
    o.seed = static_cast<int64_t>(saved.seed);
    o.shuffle = saved.shuffle;
    o.optimizer = OptimizerKindName(saved.optimizer.kind);
    trainer_options.optimizer = saved.optimizer;
    trainer_options.lr = saved.lr_schedule;
  } else {
    if (o.data.empty()) o.data = "fashion-mnist";
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
  }
  trainer_options.replay_steps = o.cuda_graphs == "auto";
  trainer_options.scaler.enabled =
      o.loss_scaling == "on" ||
      (o.loss_scaling == "auto" && policy.compute_dtype() == DType::kFloat16);

  // The pipeline (passes/pass_manager.h): a fresh model is canonicalised
  // (what the checkpoints keep), then converted under the policy and
  // rewritten into its training graph.
  const std::string model_name = start->resumed.has_value() ? start->resumed_from : o.model_path;
  PassDumper dumper(o.dump_passes_dir);
  PassManagerOptions manager_options;
  if (!o.dump_passes_dir.empty()) manager_options.dumper = &dumper;
  if (!start->resumed.has_value()) {
    PassManagerOptions import_options = manager_options;
    import_options.dump_input = true;
    PassManager import(import_options);
    import.Add(MakeCanonicalizePass());
    PassContext context;
    if (absl::Status s = import.Run(start->float32_model, context); !s.ok()) {
      return fail(kExitFailure, absl::StrCat(model_name, ": ", s.message()));
    }
    for (const std::string& note : context.notes) out << "note: " << note << "\n";
  }

  // The model under the policy, its training graph and the data.
  const Graph& float32_graph = *start->float32_model.graph;
  if (o.input.empty()) {
    if (float32_graph.inputs().size() != 1) {
      return fail(kExitBadInput, "the model has several inputs; name the image input with --input");
    }
    o.input = float32_graph.inputs()[0]->name();
  }
  absl::StatusOr<Model> model = CloneModel(start->float32_model);
  if (!model.ok()) return fail(kExitFailure, std::string(model.status().message()));
  if (absl::Status inferred = InferTypes(*model); !inferred.ok()) {
    return fail(kExitBadInput, absl::StrCat(model_name, ": ", inferred.message()));
  }
  {
    PassManager convert(manager_options);
    convert.Add(MakeAutocastPass(policy));
    PassContext context;
    if (absl::Status s = convert.Run(*model, context); !s.ok()) {
      return fail(kExitFailure, absl::StrCat(model_name, ": ", s.message()));
    }
  }
  TrainingGraphOptions graph_options;
  graph_options.output = o.output;
  absl::StatusOr<LossKind> loss_kind = ParseLossKind(o.loss);
  if (!loss_kind.ok()) return fail(kExitBadInput, std::string(loss_kind.status().message()));
  graph_options.loss = *loss_kind;
  absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(*model, graph_options, manager_options);
  if (!graph.ok())
    return fail(kExitBadInput, absl::StrCat(model_name, ": ", graph.status().message()));

  absl::StatusOr<training::DataSplits> data = training::LoadData(o.data);
  if (!data.ok()) return fail(kExitBadInput, std::string(data.status().message()));
  if (start->resumed.has_value() && start->resumed->dataset_size != 0 &&
      start->resumed->dataset_size != data->train.size()) {
    return fail(
        kExitBadInput,
        absl::StrFormat(
            "--resume: the checkpoint's data order is over %d training samples (--data %s); "
            "--data %s has %d",
            start->resumed->dataset_size, start->resumed->data, o.data, data->train.size()));
  }
  const int64_t per_epoch = (data->train.size() + o.batch - 1) / o.batch;
  int64_t total = per_epoch * o.epochs;
  if (o.max_steps > 0) total = std::min(total, o.max_steps);
  if (!start->resumed.has_value()) {
    if (o.schedule == "cosine") {
      trainer_options.lr.kind = LrSchedule::Kind::kCosine;
      trainer_options.lr.total_steps = total;
    } else if (o.schedule == "step") {
      trainer_options.lr.kind = LrSchedule::Kind::kStep;
    }
  }

  CudaBackendOptions cuda_options;
  cuda_options.allow_tf32 = o.tf32;
  absl::StatusOr<training::ChosenBackend> chosen =
      training::ChooseTrainingBackend(o.backend, static_cast<int>(o.threads),
                            {&*model, graph->evaluation.get()}, cuda_options);
  if (!chosen.ok()) return fail(kExitBadInput, std::string(chosen.status().message()));
  if (!chosen->note.empty()) err << "castor train: " << chosen->note << "\n";
  Backend& backend = *chosen->backend;
  const bool on_cpu = dynamic_cast<CpuBackend*>(&backend) != nullptr;
  // From here o.tf32 is what takes effect: the summary and the checkpoints
  // record it.
  const bool tf32_requested = o.tf32;
  if (on_cpu) o.tf32 = false;
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
  absl::StatusOr<std::unique_ptr<training::Trainer>> created =
      training::Trainer::Create(*std::move(model), *graph, trainer_options, backend);
  if (!created.ok()) return fail(kExitBadInput, std::string(created.status().message()));
  training::Trainer& trainer = **created;
  int64_t epoch0 = 0, position0 = 0;
  if (start->resumed.has_value()) {
    training::TrainingState& saved = *start->resumed;
    absl::StatusOr<Optimizer> optimizer =
        Optimizer::Restore(saved.optimizer, saved.optimizer_step, std::move(saved.moments));
    // The scaler keeps its scale and counters (a checkpoint's step count is
    // its updates plus its skipped steps); a policy change only switches it
    // on or off as the new policy's default says.
    Json scaler_state = saved.loss_scaler;
    if (start->policy_changed && scaler_state.is_object()) {
      scaler_state.Set("enabled", Json::Bool(trainer_options.scaler.enabled));
    }
    absl::StatusOr<LossScaler> scaler = LossScaler::FromJson(scaler_state);
    std::map<std::string, Tensor> weights;  // the checkpoint's, by name
    for (const std::string& name : trainer.state_names()) {
      const Value* saved = start->float32_model.graph->FindValue(name);
      if (saved != nullptr && saved->initializer() != nullptr) {
        weights[name] = *saved->initializer();
      }
    }
    absl::Status restored = !optimizer.ok() ? optimizer.status()
                            : !scaler.ok()  ? scaler.status()
                                            : trainer.Restore(weights, *std::move(optimizer),
                                                              *std::move(scaler), saved.step);
    if (!restored.ok()) {
      return fail(kExitBadInput,
                  absl::StrCat("--resume ", start->resumed_from, ": ", restored.message()));
    }
    epoch0 = saved.epoch;
    position0 = saved.position;
  }
  absl::StatusOr<training::BatchIterator> batches = training::BatchIterator::Create(
      data->train, training::BatchOptions{o.batch, o.shuffle, static_cast<uint64_t>(o.seed), false}, epoch0,
      position0);
  if (!batches.ok()) return fail(kExitBadInput, std::string(batches.status().message()));

  std::ofstream metrics;
  if (!o.metrics_path.empty() && start->resumed.has_value()) {
    // Lines of steps after the checkpoint (written before a crash) and a
    // torn last line would repeat or garble the record: keep the rest.
    if (absl::Status trimmed = TrimMetrics(o.metrics_path, start->resumed->step); !trimmed.ok()) {
      return fail(kExitBadInput, std::string(trimmed.message()));
    }
  }
  if (!o.metrics_path.empty()) {
    metrics.open(o.metrics_path, start->resumed.has_value() ? std::ios::app : std::ios::trunc);
    if (!metrics)
      return fail(kExitBadInput, absl::StrCat("cannot write --metrics ", o.metrics_path));
  }
  std::optional<training::Checkpoint> checkpoint;
  if (!o.checkpoint_dir.empty()) {
    // Saving into a directory that holds a later checkpoint of another run
    // (or branch) would interleave the two, pruning by step would delete
    // this run's files, and a later --resume DIR would pick the other's.
    // Later checkpoints that do not read (--resume skipped them) are moved
    // aside to <name>.broken, kept for inspection.
    const int64_t resumed_step = start->resumed.has_value() ? start->resumed->step : 0;
    absl::StatusOr<std::vector<training::CheckpointFile>> existing = training::ListCheckpoints(o.checkpoint_dir);
    while (start->resumed.has_value() && existing.ok() && !existing->empty() &&
           existing->back().step > resumed_step && !training::ReadCheckpoint(existing->back().path).ok()) {
      const std::string broken = existing->back().path;
      std::error_code error;
      std::filesystem::rename(broken, broken + ".broken", error);
      if (error)
        return fail(kExitFailure,
                    absl::StrCat("cannot move ", broken, " aside: ", error.message()));
      err << "castor train: warning: moved the unreadable " << broken << " aside to " << broken
          << ".broken\n";
      existing->pop_back();
    }
    if (existing.ok() && !existing->empty() && existing->back().step > resumed_step) {
      return fail(
          kExitBadInput,
          absl::StrFormat(
              "--checkpoint-dir %s holds %s, later than the %s; resume from it, or save this run "
              "into another --checkpoint-dir",
              o.checkpoint_dir, existing->back().path,
              start->resumed.has_value() ? absl::StrCat("resumed step ", resumed_step)
                                         : std::string("start of this fresh run")));
    }
  }
  if (!o.checkpoint_dir.empty()) {
    checkpoint.emplace(policy);
    absl::StatusOr<Model> float32_copy = CloneModel(start->float32_model);
    if (!float32_copy.ok()) return fail(kExitFailure, std::string(float32_copy.status().message()));
    checkpoint->model = *std::move(float32_copy);
  }
  const bool live = isatty(STDERR_FILENO) != 0;
  const int64_t first_step = trainer.steps() + 1;
  out << absl::StrFormat(
      "castor train: %s on %s (%d train / %d test), policy %s (%s compute), %s lr %g, batch %d, "
      "%d steps, loss scaling %s, backend %s\n",
      model_name, data->train.name, data->train.size(), data->test.size(), policy.name(),
      DTypeName(policy.compute_dtype()), o.optimizer, trainer_options.lr.base_lr, o.batch, total,
      trainer.scaler().enabled() ? "on" : "off", training::DescribeBackend(backend));
  if (first_step > total) {
    out << absl::StrFormat("nothing to do: the checkpoint is at step %d of %d\n", first_step - 1,
                           total);
  }

  const auto started = Clock::now();
  double step_seconds = 0, loss_ema = 0;
  int64_t correct = 0, seen = 0, seen_total = 0, steps_run = 0;
  Evaluation last_eval;
  bool evaluated = false;
  bool replay_warned = !trainer.replay_unavailable().empty();  // warn when recording fails
  std::string last_checkpoint;
  auto evaluate = [&](int64_t epoch) -> absl::Status {
    if (!data->has_test()) return absl::OkStatus();
    CASTOR_ASSIGN_OR_RETURN(last_eval, Evaluate(trainer, data->test, o.input, o.batch));
    evaluated = true;
    if (live) err << "\n";
    out << absl::StrFormat("eval  epoch %d step %d: test loss %.4f, test accuracy %.2f%%\n", epoch,
                           trainer.steps(), last_eval.loss, 100 * last_eval.accuracy);
    if (metrics.is_open()) {
      metrics << absl::StrFormat(
          "{\"epoch\":%d,\"step\":%d,\"test_loss\":%.6g,\"test_accuracy\":%.6g}\n", epoch,
          trainer.steps(), last_eval.loss, last_eval.accuracy);
    }
    return absl::OkStatus();
  };
  auto save = [&]() -> absl::Status {
    CASTOR_ASSIGN_OR_RETURN(training::SavedCheckpoint saved, SaveCheckpoint(o, *checkpoint, trainer, *batches,
                                                                  data->train, trainer_options));
    last_checkpoint = saved.written.path;
    if (live) err << "\n";
    out << absl::StrFormat(
        "checkpoint step %d: %s (%.1f MiB)%s\n", trainer.steps(), saved.written.path,
        saved.written.file_bytes / 1048576.0,
        saved.removed.empty() ? "" : absl::StrCat(", removed ", saved.removed.size(), " older"));
    return absl::OkStatus();
  };
  for (int64_t step = first_step; step <= total; ++step) {
    training::Batch b = batches->Next();
    const int64_t epoch = b.epoch;
    const auto t0 = Clock::now();
    absl::StatusOr<training::StepResult> r = trainer.Step({{o.input, b.images}}, b.labels);
    if (!r.ok()) return fail(kExitFailure, absl::StrCat("step ", step, ": ", r.status().message()));
    const double dt = Seconds(Clock::now() - t0);
    step_seconds += dt;
    ++steps_run;
    const int64_t n = b.labels.num_elements();
    correct += CountCorrect(r->output, b.labels);
    seen += n;
    seen_total += n;
    loss_ema = steps_run == 1 ? r->loss : 0.95 * loss_ema + 0.05 * r->loss;
    if (r->skipped) {
      if (live) err << "\n";
      err << absl::StrFormat("castor train: step %d skipped: inf/NaN gradients at loss scale %g",
                             step, r->loss_scale);
      if (!r->first_non_finite.empty()) err << "; first non-finite: " << r->first_non_finite;
      err << "\n";
    }
    if (!r->diagnosis.empty())
      err << "castor train: warning: step " << step << ": " << r->diagnosis << "\n";
    if (!replay_warned && !trainer.replay_unavailable().empty()) {  // it was available
      if (live) err << "\n";
      err << "castor train: warning: steps run node by node: " << trainer.replay_unavailable()
          << "\n";
      replay_warned = true;
    }
    if (metrics.is_open()) {
      // %.9g prints a float32 loss exactly, so resumed runs compare bit for bit.
      metrics << absl::StrFormat(
          "{\"step\":%d,\"epoch\":%d,\"loss\":%.9g,\"loss_scale\":%g,\"skipped\":%s,\"lr\":%g,"
          "\"samples_per_s\":%.1f,\"grad_norm\":%.6g,\"replayed\":%s%s}\n",
          step, epoch, r->loss, r->loss_scale, r->skipped ? "true" : "false", r->lr, n / dt,
          r->grad_norm, r->replayed ? "true" : "false",
          r->first_non_finite.empty()
              ? ""
              : absl::StrCat(",\"first_non_finite\":", Json::String(r->first_non_finite).Dump()));
    }
    const double elapsed = Seconds(Clock::now() - started);
    const std::string line =
        absl::StrFormat("step %d/%d  loss %.4f  acc %.2f%%  scale %g  %.0f samples/s  eta %s", step,
                        total, loss_ema, 100.0 * correct / seen, r->loss_scale, seen / step_seconds,
                        Duration(elapsed / steps_run * (total - step)));
    if (live) {
      err << "\r" << line << "\033[K" << std::flush;
    } else if (steps_run == 1 || step == total || step % std::max<int64_t>(1, total / 10) == 0) {
      err << line << "\n";
    }
    const bool epoch_done = batches->epoch() > epoch;
    if ((o.eval_every > 0 && step % o.eval_every == 0) || epoch_done || step == total) {
      if (absl::Status s = evaluate(epoch); !s.ok())
        return fail(kExitFailure, std::string(s.message()));
      correct = seen = 0;
    }
    const bool save_now = o.save_every > 0 ? step % o.save_every == 0 : epoch_done;
    if (checkpoint.has_value() && (save_now || step == total)) {
      if (absl::Status s = save(); !s.ok()) {
        return fail(kExitFailure, absl::StrCat("step ", step, ": saving a checkpoint in ",
                                               o.checkpoint_dir, ": ", s.message()));
      }
    }
  }
  if (live) err << "\n";

  const double mean_step_ms = 1000 * step_seconds / std::max<int64_t>(1, steps_run);
  const double samples_per_s = seen_total / std::max(step_seconds, 1e-9);
  // Device memory: the CUDA pool's peak (activations, weights, workspaces).
  absl::StatusOr<DeviceMemoryStats> device_memory = CudaMemoryStats(backend);
  const int64_t peak_resident_bytes = PeakResidentBytes();
  if (metrics.is_open()) {
    metrics << absl::StrFormat(
        "{\"summary\":true,\"backend\":%s,\"tf32\":%s,\"policy\":%s,\"steps\":%d,"
        "\"skipped\":%d,\"step_time_ms\":%.3f,\"samples_per_s\":%.1f,\"steps_run\":%d,"
        "\"replayed_steps\":%d,\"peak_activation_bytes\":%d,\"peak_resident_bytes\":%d%s}\n",
        Json::String(backend.name()).Dump(), o.tf32 ? "true" : "false",
        Json::String(policy.name()).Dump(), trainer.steps(),
        trainer.scaler().skipped_steps(), mean_step_ms, samples_per_s, steps_run,
        trainer.replayed_steps(),
        trainer.peak_activation_bytes(), peak_resident_bytes,
        device_memory.ok()
            ? absl::StrCat(",\"peak_device_memory_bytes\":", device_memory->peak_in_use_bytes)
            : "");
    if (!metrics.flush()) {
      return fail(kExitFailure, absl::StrCat("writing --metrics ", o.metrics_path, " failed"));
    }
  }
  int64_t float32_weights = 0;
  for (const std::string& name : trainer.state_names())
    float32_weights += trainer.model().graph->FindValue(name)->dtype() == DType::kFloat32;
  out << "summary:\n"
      << absl::StrFormat("  policy          %s (%s compute, float32 variables)\n", policy.name(),
                         DTypeName(policy.compute_dtype()))
      << absl::StrFormat(
             "  weights         %d of %d tensors float32 (master weights and BN statistics)\n",
             float32_weights, trainer.state_names().size())
      << absl::StrFormat("  steps           %d, %d skipped\n", trainer.steps(),
                         trainer.scaler().skipped_steps())
      << absl::StrFormat("  loss scale      %g (final)\n", trainer.scaler().scale())
      << absl::StrFormat("  backend         %s%s\n", training::DescribeBackend(backend),
                         o.tf32 ? ", TF32 for float32 MatMul/Gemm/Conv" : "")
      << absl::StrFormat(
             "  graph replay    %s\n",
             o.cuda_graphs == "off" ? std::string("off (--cuda-graphs off)")
             : trainer.replay_unavailable().empty()
                 ? absl::StrFormat("%d of this run's %d steps replayed as a CUDA graph",
                                   trainer.replayed_steps(), steps_run)
                 : absl::StrCat("none: ", trainer.replay_unavailable()))
      << absl::StrFormat("  peak memory     %.1f MiB of activations%s; process %.0f MiB "
                         "resident\n",
                         trainer.peak_activation_bytes() / 1048576.0,
                         device_memory.ok()
                             ? absl::StrFormat("; %.1f MiB of device memory",
                                               device_memory->peak_in_use_bytes / 1048576.0)
                             : "",
                         peak_resident_bytes / 1048576.0)
      << absl::StrFormat("  step time       %.1f ms (mean), %.0f samples/s, %s in all\n",
                         mean_step_ms, samples_per_s, Duration(Seconds(Clock::now() - started)));
  if (evaluated) {
    out << absl::StrFormat("  test            loss %.4f, accuracy %.2f%%\n", last_eval.loss,
                           100 * last_eval.accuracy);
  }
  if (!last_checkpoint.empty()) {
    out << absl::StrFormat("  checkpoint      %s (check it: castor verify %s)\n", last_checkpoint,
                           last_checkpoint);
  }
  return kExitOk;
}

}  // namespace castor::tools
