// `castor train` (see train_command.h).
#include "tools/train_command.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_probe.h"
#include "graph/json.h"
#include "graph/status.h"
#include "passes/autocast.h"
#include "tools/args.h"
#include "tools/cli.h"
#include "tools/dataset.h"
#include "tools/inspect.h"
#include "tools/trainer.h"

namespace castor::tools {
namespace {

struct TrainOptions {
  std::string model_path;
  std::string data = "fashion-mnist";
  std::string policy = "mixed_float16";
  std::string loss = "cross-entropy";
  std::string output = "logits";
  std::string input;  // the model input the images feed; "" = its only input
  std::string optimizer = "adam";
  double lr = 1e-3;
  double momentum = 0.0;
  double weight_decay = 0.0;
  double clip_norm = 0.0;
  std::string schedule = "constant";
  int64_t warmup = 0;
  int64_t batch = 128;
  int64_t epochs = 1;
  int64_t max_steps = 0;
  int64_t seed = 0;
  bool shuffle = true;
  int64_t eval_every = 0;
  std::string metrics_path;
  std::string backend = "auto";
  std::string loss_scaling = "auto";
  int64_t threads = 0;
};

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string Duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60) : absl::StrFormat("%ds", s);
}

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

absl::StatusOr<Evaluation> Evaluate(Trainer& trainer, const Dataset& test,
                                    const std::string& input, int64_t batch) {
  CASTOR_ASSIGN_OR_RETURN(BatchIterator batches,
                          BatchIterator::Create(test, BatchOptions{batch, false, 0, false}));
  double loss_sum = 0;
  int64_t correct = 0, seen = 0;
  while (batches.epoch() == 0) {
    Batch b = batches.Next();
    const int64_t n = b.labels.num_elements();
    CASTOR_ASSIGN_OR_RETURN(StepResult r, trainer.Evaluate({{input, b.images}}, b.labels));
    loss_sum += r.loss * n;
    correct += CountCorrect(r.output, b.labels);
    seen += n;
  }
  return Evaluation{loss_sum / seen, static_cast<double>(correct) / seen};
}

}  // namespace

int RunTrain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  TrainOptions o;
  ArgParser parser(
      "castor train",
      "Trains MODEL in mixed precision on the CPU backend: converts it under --policy\n"
      "(float32 master weights; see 'castor convert'), attaches the loss to --output, builds\n"
      "the backward graph, and runs the optimizer with dynamic loss scaling (on by default for\n"
      "mixed_float16: initial scale 65536, x2 every 2000 good steps, x0.5 and the step skipped\n"
      "on inf/NaN gradients). Prints a progress line and a summary; --metrics writes JSONL.");
  parser.AddPositional("MODEL", "the float32 ONNX model to train", &o.model_path)
      .AddString("data", "SPEC",
                 "fashion-mnist, mnist, a directory of IDX files or train/test.npz, a .npz, or "
                 "IMAGES,LABELS[,TEST_IMAGES,TEST_LABELS] (.npy or IDX)",
                 &o.data)
      .AddEnum("policy", Policy::BuiltinNames(), "the autocast policy", &o.policy)
      .AddEnum("loss", {"cross-entropy", "mse", "output"},
               "cross-entropy on logits with integer labels, mse, or the output is the loss",
               &o.loss)
      .AddString("output", "NAME", "the model output the loss is attached to", &o.output)
      .AddString("input", "NAME", "the model input the images feed (default: the only one)",
                 &o.input)
      .AddEnum("optimizer", {"sgd", "adam", "adamw"}, "the optimizer", &o.optimizer)
      .AddFloat("lr", "RATE", "learning rate", &o.lr)
      .AddFloat("momentum", "M", "SGD momentum", &o.momentum)
      .AddFloat("weight-decay", "WD", "L2 (sgd, adam) or decoupled (adamw) weight decay",
                &o.weight_decay)
      .AddFloat("clip-norm", "N", "clip gradients to this global L2 norm (0: off)", &o.clip_norm)
      .AddEnum("schedule", {"constant", "cosine"}, "learning-rate schedule", &o.schedule)
      .AddInt("warmup", "STEPS", "linear learning-rate warmup steps", &o.warmup)
      .AddInt("batch", "N", "batch size", &o.batch)
      .AddInt("epochs", "N", "epochs over the training split", &o.epochs)
      .AddInt("max-steps", "N", "stop after N steps (0: no limit)", &o.max_steps)
      .AddInt("seed", "S", "shuffle seed", &o.seed)
      .AddSwitch("shuffle", "shuffle the training split every epoch", &o.shuffle)
      .AddInt("eval-every", "K", "also evaluate on the test split every K steps (0: per epoch)",
              &o.eval_every)
      .AddString("metrics", "FILE", "write one JSON object per step and per evaluation",
                 &o.metrics_path)
      .AddEnum("backend", {"auto", "cpu", "cuda"},
               "where to train (auto: CUDA once its training backend exists and a GPU is "
               "usable; today the CPU)",
               &o.backend)
      .AddEnum("loss-scaling", {"auto", "on", "off"},
               "dynamic loss scaling (auto: on for mixed_float16 only)", &o.loss_scaling)
      .AddInt("threads", "N", "CPU threads (0: all)", &o.threads)
      .AddExample("castor train models/cnn_opset17.onnx --data fashion-mnist --policy "
                  "mixed_bfloat16 --epochs 1 --metrics run.jsonl");

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
  if (o.batch < 1 || o.epochs < 1 || o.max_steps < 0 || o.eval_every < 0 || o.warmup < 0) {
    return fail(kExitBadInput, "--batch and --epochs must be >= 1; --max-steps, --eval-every "
                               "and --warmup >= 0");
  }
  if (o.backend == "cuda") {
    return fail(kExitBadInput, absl::StrCat("--backend cuda: the CUDA training backend is not "
                                            "built yet; ", DescribeCudaProbe(ProbeCuda()),
                                            "; use --backend cpu"));
  }

  absl::StatusOr<Policy> policy = Policy::Builtin(o.policy);
  if (!policy.ok()) return fail(kExitBadInput, std::string(policy.status().message()));
  absl::StatusOr<Model> model = LoadAndCheckModel(o.model_path);
  if (!model.ok()) return fail(kExitBadInput, std::string(model.status().message()));
  if (o.input.empty()) {
    if (model->graph->inputs().size() != 1) {
      return fail(kExitBadInput, "the model has several inputs; name the image input with --input");
    }
    o.input = model->graph->inputs()[0]->name();
  }
  absl::StatusOr<AutocastReport> converted = RunAutocast(*model, *policy);
  if (!converted.ok()) {
    return fail(kExitFailure, absl::StrCat(o.model_path, ": ", converted.status().message()));
  }
  TrainingGraphOptions graph_options;
  graph_options.output = o.output;
  graph_options.loss = *ParseLossKind(o.loss);
  absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(*model, graph_options);
  if (!graph.ok()) return fail(kExitBadInput, absl::StrCat(o.model_path, ": ", graph.status().message()));

  absl::StatusOr<DataSplits> data = LoadData(o.data);
  if (!data.ok()) return fail(kExitBadInput, std::string(data.status().message()));

  TrainerOptions trainer_options;
  trainer_options.optimizer.kind = *ParseOptimizerKind(o.optimizer);
  trainer_options.optimizer.momentum = o.momentum;
  trainer_options.optimizer.weight_decay = o.weight_decay;
  trainer_options.optimizer.clip_norm = o.clip_norm;
  trainer_options.lr.base_lr = o.lr;
  trainer_options.lr.warmup_steps = o.warmup;
  trainer_options.scaler.enabled = o.loss_scaling == "on" ||
                                   (o.loss_scaling == "auto" && policy->compute_dtype() == DType::kFloat16);
  const int64_t per_epoch = (data->train.size() + o.batch - 1) / o.batch;
  int64_t total = per_epoch * o.epochs;
  if (o.max_steps > 0) total = std::min(total, o.max_steps);
  if (o.schedule == "cosine") {
    trainer_options.lr.kind = LrSchedule::Kind::kCosine;
    trainer_options.lr.total_steps = total;
  }
  CpuBackend backend(CpuBackendOptions{static_cast<int>(o.threads)});
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(*std::move(model), *graph, trainer_options, backend);
  if (!trainer.ok()) return fail(kExitBadInput, std::string(trainer.status().message()));
  absl::StatusOr<BatchIterator> batches = BatchIterator::Create(
      data->train, BatchOptions{o.batch, o.shuffle, static_cast<uint64_t>(o.seed), false});
  if (!batches.ok()) return fail(kExitBadInput, std::string(batches.status().message()));

  std::ofstream metrics;
  if (!o.metrics_path.empty()) {
    metrics.open(o.metrics_path);
    if (!metrics) return fail(kExitBadInput, absl::StrCat("cannot write --metrics ", o.metrics_path));
  }
  const bool live = isatty(STDERR_FILENO) != 0;
  out << absl::StrFormat(
      "castor train: %s on %s (%d train / %d test), policy %s (%s compute), %s lr %g, batch %d, "
      "%d steps, loss scaling %s, backend cpu%s\n",
      o.model_path, data->train.name, data->train.size(), data->test.size(), policy->name(),
      DTypeName(policy->compute_dtype()), o.optimizer, o.lr, o.batch, total,
      trainer_options.scaler.enabled ? "on" : "off",
      o.backend == "auto" ? " (auto: the CUDA training backend is not built yet)" : "");

  const auto started = Clock::now();
  double step_seconds = 0, loss_ema = 0;
  int64_t correct = 0, seen = 0;
  Evaluation last_eval;
  bool evaluated = false;
  auto evaluate = [&](int64_t epoch) -> absl::Status {
    if (!data->has_test()) return absl::OkStatus();
    CASTOR_ASSIGN_OR_RETURN(last_eval, Evaluate(**trainer, data->test, o.input, o.batch));
    evaluated = true;
    if (live) err << "\n";
    out << absl::StrFormat("eval  epoch %d step %d: test loss %.4f, test accuracy %.2f%%\n",
                           epoch, (*trainer)->steps(), last_eval.loss, 100 * last_eval.accuracy);
    if (metrics.is_open()) {
      metrics << absl::StrFormat(
          "{\"epoch\":%d,\"step\":%d,\"test_loss\":%.6g,\"test_accuracy\":%.6g}\n", epoch,
          (*trainer)->steps(), last_eval.loss, last_eval.accuracy);
    }
    return absl::OkStatus();
  };
  for (int64_t step = 1; step <= total; ++step) {
    Batch b = batches->Next();
    const int64_t epoch = b.epoch;
    const auto t0 = Clock::now();
    absl::StatusOr<StepResult> r = (*trainer)->Step({{o.input, b.images}}, b.labels);
    if (!r.ok()) return fail(kExitFailure, absl::StrCat("step ", step, ": ", r.status().message()));
    const double dt = Seconds(Clock::now() - t0);
    step_seconds += dt;
    const int64_t n = b.labels.num_elements();
    correct += CountCorrect(r->output, b.labels);
    seen += n;
    loss_ema = step == 1 ? r->loss : 0.95 * loss_ema + 0.05 * r->loss;
    if (r->skipped) {
      if (live) err << "\n";
      err << absl::StrFormat("castor train: step %d skipped: inf/NaN gradients at loss scale %g",
                             step, r->loss_scale);
      if (!r->first_non_finite.empty()) err << "; first non-finite: " << r->first_non_finite;
      err << "\n";
    }
    if (!r->diagnosis.empty()) err << "castor train: warning: step " << step << ": " << r->diagnosis << "\n";
    if (metrics.is_open()) {
      metrics << absl::StrFormat(
          "{\"step\":%d,\"epoch\":%d,\"loss\":%.6g,\"loss_scale\":%g,\"skipped\":%s,\"lr\":%g,"
          "\"samples_per_s\":%.1f,\"grad_norm\":%.6g%s}\n",
          step, epoch, r->loss, r->loss_scale, r->skipped ? "true" : "false", r->lr, n / dt,
          r->grad_norm,
          r->first_non_finite.empty()
              ? ""
              : absl::StrCat(",\"first_non_finite\":", Json::String(r->first_non_finite).Dump()));
    }
    const double elapsed = Seconds(Clock::now() - started);
    const std::string line = absl::StrFormat(
        "step %d/%d  loss %.4f  acc %.2f%%  scale %g  %.0f samples/s  eta %s", step, total,
        loss_ema, 100.0 * correct / seen, r->loss_scale, seen / step_seconds,
        Duration(elapsed / step * (total - step)));
    if (live) {
      err << "\r" << line << "\033[K" << std::flush;
    } else if (step == 1 || step == total || step % std::max<int64_t>(1, total / 10) == 0) {
      err << line << "\n";
    }
    const bool epoch_done = batches->epoch() > epoch || step == total;
    if ((o.eval_every > 0 && step % o.eval_every == 0) || epoch_done) {
      if (absl::Status s = evaluate(epoch); !s.ok()) return fail(kExitFailure, std::string(s.message()));
      correct = seen = 0;
    }
  }
  if (live) err << "\n";

  int64_t float32_weights = 0;
  for (const auto& [name, tensor] : (*trainer)->state()) float32_weights += tensor.dtype() == DType::kFloat32;
  out << "summary:\n"
      << absl::StrFormat("  policy          %s (%s compute, float32 variables)\n", policy->name(),
                         DTypeName(policy->compute_dtype()))
      << absl::StrFormat("  weights         %d of %d tensors float32 (master weights and BN statistics)\n",
                         float32_weights, (*trainer)->state().size())
      << absl::StrFormat("  steps           %d, %d skipped\n", (*trainer)->steps(),
                         (*trainer)->scaler().skipped_steps())
      << absl::StrFormat("  loss scale      %g (final)\n", (*trainer)->scaler().scale())
      << absl::StrFormat("  peak memory     %.1f MiB of activations\n",
                         (*trainer)->peak_activation_bytes() / 1048576.0)
      << absl::StrFormat("  step time       %.1f ms (mean), %s in all\n",
                         1000 * step_seconds / std::max<int64_t>(1, (*trainer)->steps()),
                         Duration(Seconds(Clock::now() - started)));
  if (evaluated) {
    out << absl::StrFormat("  test            loss %.4f, accuracy %.2f%%\n", last_eval.loss,
                           100 * last_eval.accuracy);
  }
  return kExitOk;
}

}  // namespace castor::tools
