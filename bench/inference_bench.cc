// Inference time of whole ONNX models on castor's CPU backend, through the
// executor (what `castor run` does), at a fixed batch size and thread count.
//
// Two modes:
//   inference_bench --model FILE [--batch 128] [--threads 2] [--input NAME=X.npy]...
//                   [--warmup 5] [--runs 30] [--output-dir DIR] [--profile]
//     Times Executor::Run: `warmup` untimed runs, then `runs` timed ones;
//     prints median/min/mean ms per batch and one machine-readable line
//     `RESULT {...json...}` with every run's time in "times_ms" (read by
//     bench/inference_vs_ort.py). Graph inputs
//     not given with --input are random float32 N(0,1) (seed 0) with every
//     symbolic or unknown dim bound to --batch. --output-dir writes each graph
//     output of the last run as DIR/<name>.npy. --profile then reruns the
//     model with every kernel call timed and prints the time per op type and
//     the slowest nodes (kernel time vs. the whole Run: the rest is executor
//     overhead and feed/output copies).
//   inference_bench [--benchmark_*...] [--batch 128] [--threads 2] [--models-dir models]
//     Google Benchmark over the four opset-17 sample models with random inputs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/backend.h"
#include "backend/cpu/blas_core.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm.h"
#include "backend/executor.h"
#include "benchmark/benchmark.h"
#include "graph/graph.h"
#include "graph/status.h"
#include "graph/tensor.h"
#include "passes/model_loader.h"
#include "tools/args.h"
#include "training/npy.h"
#include "tools/run_command.h"

namespace castor::bench {
namespace {

using Feeds = std::vector<std::pair<std::string, Tensor>>;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model_path;  // empty: Google Benchmark over the sample models
  std::string models_dir = "models";
  std::vector<std::string> inputs;  // NAME=FILE
  std::string output_dir;
  int64_t batch = 128;
  int64_t threads = 0;
  int64_t warmup = 5;
  int64_t runs = 30;
  int64_t seed = 0;
  bool profile = false;
};

double MillisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  if (n == 0) return 0;
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Feeds for every graph input without a default: from --input files, else
// random float32 with symbolic/unknown dims bound to `batch`.
absl::StatusOr<Feeds> MakeFeeds(const Model& model, const std::vector<std::string>& input_flags,
                                int64_t batch, int64_t seed) {
  std::map<std::string, std::string> files;
  for (const std::string& flag : input_flags) {
    CASTOR_ASSIGN_OR_RETURN(auto name_and_file, tools::ParseInputFlag(flag));
    files[name_and_file.first] = name_and_file.second;
  }
  std::mt19937 generator(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Feeds feeds;
  for (const Value* input : model.graph->inputs()) {
    auto file = files.find(input->name());
    if (file != files.end()) {
      CASTOR_ASSIGN_OR_RETURN(Tensor tensor, training::LoadTensorFile(file->second));
      feeds.emplace_back(input->name(), std::move(tensor));
      files.erase(file);
      continue;
    }
    if (input->initializer() != nullptr) continue;  // has a default
    if (input->dtype() != DType::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph input '", input->name(), "' is ", DTypeName(input->dtype()),
                       "; inference_bench generates random float32 inputs only, pass --input ",
                       input->name(), "=FILE.npy"));
    }
    if (!input->shape().rank_known()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "graph input '", input->name(), "' has unknown rank; pass --input ", input->name(),
          "=FILE.npy"));
    }
    std::vector<int64_t> dims;
    for (const Dim& dim : input->shape().dims()) dims.push_back(dim.is_static() ? dim.value() : batch);
    Tensor tensor(DType::kFloat32, dims);
    for (int64_t i = 0; i < tensor.num_elements(); ++i) tensor.data<float>()[i] = normal(generator);
    feeds.emplace_back(input->name(), std::move(tensor));
  }
  if (!files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--input names '", files.begin()->first, "', which is not a graph input"));
  }
  return feeds;
}

// --- per-kernel timing -------------------------------------------------------
//
// A Backend that forwards memory to the CPU backend and whose kernel table
// has, for every op type in the model, one kernel that looks up the CPU
// kernel for the node and times the call. KernelFn is a plain function
// pointer, so the timing kernel finds its ProfilingBackend via
// KernelContext::backend().

struct NodeTime {
  const Node* node = nullptr;
  std::string input_dims;  // concrete, of the first call: "[128,16,28,28] [16,16,3,3]"
  double total_ms = 0;
  int64_t calls = 0;
};

class ProfilingBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<ProfilingBackend>> Create(CpuBackend& cpu,
                                                                  const Model& model) {
    auto backend = std::unique_ptr<ProfilingBackend>(new ProfilingBackend(cpu));
    const KernelTable& inner = cpu.kernels();
    std::map<std::pair<std::string, std::string>, bool> in_place_by_op;
    for (const Node* node : model.graph->nodes()) {
      CASTOR_ASSIGN_OR_RETURN(const KernelDef* def, inner.Find(*node));
      backend->kernel_of_[node] = def;
      // One wrapper per op type: it takes in_place_ok from the op's first node
      // (the sample models are float32 only, one kernel per op type).
      in_place_by_op.emplace(std::make_pair(node->domain(), node->op_type()), def->in_place_ok);
    }
    for (const auto& [op, in_place_ok] : in_place_by_op) {
      KernelDef wrapper;
      wrapper.domain = op.first;
      wrapper.op_type = op.second;
      wrapper.supports = [&inner](const Node& node) { return inner.Find(node).status(); };
      wrapper.run = &ProfilingBackend::TimedKernel;
      wrapper.in_place_ok = in_place_ok;
      backend->table_.Register(std::move(wrapper));
    }
    return backend;
  }

  std::string name() const override { return "cpu+profile"; }
  absl::StatusOr<void*> Allocate(size_t bytes) override { return cpu_.Allocate(bytes); }
  void Free(void* data) override { cpu_.Free(data); }
  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) override {
    return cpu_.CopyFromHost(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return cpu_.CopyToHost(dst, src, bytes);
  }
  absl::Status CopyWithin(void* dst, const void* src, size_t bytes) override {
    return cpu_.CopyWithin(dst, src, bytes);
  }
  const KernelTable& kernels() const override { return table_; }
  absl::Status Synchronize() override { return cpu_.Synchronize(); }

  const std::map<const Node*, NodeTime>& times() const { return times_; }
  void ClearTimes() { times_.clear(); }

 private:
  explicit ProfilingBackend(CpuBackend& cpu) : cpu_(cpu) {}

  static absl::Status TimedKernel(KernelContext& context) {
    auto& self = static_cast<ProfilingBackend&>(context.backend());
    auto def = self.kernel_of_.find(&context.node());
    if (def == self.kernel_of_.end()) {
      return context.Error("inference_bench profiler: no CPU kernel recorded for this node");
    }
    const Clock::time_point start = Clock::now();
    absl::Status status = def->second->run(context);
    NodeTime& time = self.times_[&context.node()];
    if (time.node == nullptr) {
      time.node = &context.node();
      std::vector<std::string> dims;
      for (int i = 0; i < context.num_inputs(); ++i) {
        if (context.has_input(i)) {
          dims.push_back(absl::StrCat("[", absl::StrJoin(context.input(i).dims, ","), "]"));
        }
      }
      time.input_dims = absl::StrJoin(dims, " ");
    }
    time.total_ms += MillisecondsSince(start);
    ++time.calls;
    return status;
  }

  CpuBackend& cpu_;
  KernelTable table_;
  std::map<const Node*, const KernelDef*> kernel_of_;
  std::map<const Node*, NodeTime> times_;
};

std::string Ms(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.3f", value);
  return buffer;
}

// Runs the model `runs` times with every kernel timed; prints per-op-type
// and per-node tables.
absl::Status Profile(const Model& model, CpuBackend& cpu, const Feeds& feeds, int64_t warmup,
                     int64_t runs, std::ostream& out) {
  CASTOR_ASSIGN_OR_RETURN(std::unique_ptr<ProfilingBackend> backend,
                          ProfilingBackend::Create(cpu, model));
  CASTOR_ASSIGN_OR_RETURN(std::unique_ptr<Executor> executor, Executor::Create(model, *backend));
  for (int64_t i = 0; i < warmup; ++i) CASTOR_RETURN_IF_ERROR(executor->Run(feeds).status());
  backend->ClearTimes();
  double run_ms = 0;
  for (int64_t i = 0; i < runs; ++i) {
    const Clock::time_point start = Clock::now();
    CASTOR_RETURN_IF_ERROR(executor->Run(feeds).status());
    run_ms += MillisecondsSince(start);
  }
  const double per_run = 1.0 / static_cast<double>(runs);
  struct OpTime {
    double ms = 0;
    int nodes = 0;
  };
  std::map<std::string, OpTime> by_op;
  std::vector<NodeTime> nodes;
  double kernel_ms = 0;
  for (const auto& [node, time] : backend->times()) {
    OpTime& op = by_op[node->op_type()];
    op.ms += time.total_ms * per_run;
    ++op.nodes;
    kernel_ms += time.total_ms * per_run;
    nodes.push_back(time);
  }
  const double whole_ms = run_ms * per_run;
  out << "profile (" << runs << " runs, mean per batch): Run " << Ms(whole_ms) << " ms, kernels "
      << Ms(kernel_ms) << " ms, executor+copies " << Ms(whole_ms - kernel_ms) << " ms\n";
  std::vector<std::pair<std::string, OpTime>> ops(by_op.begin(), by_op.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  out << "  op type               nodes   ms/batch   % of kernels\n";
  for (const auto& [op, time] : ops) {
    char line[128];
    std::snprintf(line, sizeof(line), "  %-20s %6d %10.3f %10.1f%%\n", op.c_str(), time.nodes,
                  time.ms, kernel_ms > 0 ? 100.0 * time.ms / kernel_ms : 0.0);
    out << line;
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const NodeTime& a, const NodeTime& b) { return a.total_ms > b.total_ms; });
  out << "  slowest nodes:\n";
  for (size_t i = 0; i < std::min<size_t>(8, nodes.size()); ++i) {
    const Node& node = *nodes[i].node;
    char line[256];
    std::snprintf(line, sizeof(line), "    %8.3f ms  %-12s %-28s in %s\n", nodes[i].total_ms * per_run,
                  node.op_type().c_str(), node.name().c_str(), nodes[i].input_dims.c_str());
    out << line;
  }
  return absl::OkStatus();
}

// --- standalone timing -------------------------------------------------------

absl::Status TimeModel(const BenchOptions& options, std::ostream& out) {
  if (options.batch < 1 || options.runs < 1 || options.warmup < 0 || options.threads < 0) {
    return absl::InvalidArgumentError(
        "--batch and --runs must be at least 1, --warmup and --threads at least 0");
  }
  CASTOR_ASSIGN_OR_RETURN(Model model, LoadAndCheckModel(options.model_path));
  CASTOR_ASSIGN_OR_RETURN(Feeds feeds, MakeFeeds(model, options.inputs, options.batch, options.seed));
  CpuBackend backend(CpuBackendOptions{static_cast<int>(options.threads)});
  CASTOR_ASSIGN_OR_RETURN(std::unique_ptr<Executor> executor, Executor::Create(model, backend));
  CASTOR_RETURN_IF_ERROR(executor->CheckFeeds(feeds));

  std::vector<Tensor> outputs;
  for (int64_t i = 0; i < options.warmup; ++i) {
    CASTOR_ASSIGN_OR_RETURN(outputs, executor->Run(feeds));
  }
  std::vector<double> times;
  for (int64_t i = 0; i < options.runs; ++i) {
    const Clock::time_point start = Clock::now();
    CASTOR_ASSIGN_OR_RETURN(outputs, executor->Run(feeds));
    times.push_back(MillisecondsSince(start));
  }
  double sum = 0;
  for (double t : times) sum += t;
  const double median = Median(times);
  const double min = *std::min_element(times.begin(), times.end());
  const double mean = sum / static_cast<double>(times.size());

  std::vector<std::string> feed_text;
  for (const auto& [name, tensor] : feeds) {
    feed_text.push_back(absl::StrCat(name, " ", DTypeName(tensor.dtype()), "[",
                                     absl::StrJoin(tensor.dims(), ","), "]"));
  }
  out << "model " << options.model_path << "  threads " << backend.num_threads() << "  inputs "
      << absl::StrJoin(feed_text, ", ") << "\n";
  out << "GEMM: " << castor::cpu::DescribeGemm() << "\n";
  out << "castor cpu: median " << Ms(median) << " ms/batch (min " << Ms(min) << ", mean "
      << Ms(mean) << "; " << options.runs << " runs after " << options.warmup << " warmup)\n";
  out << "plan: " << DescribePlanStats(executor->last_stats()) << "\n";
  out << "RESULT {\"model\": \"" << options.model_path << "\", \"batch\": " << options.batch
      << ", \"threads\": " << backend.num_threads() << ", \"median_ms\": " << median
      << ", \"min_ms\": " << min << ", \"mean_ms\": " << mean << ", \"runs\": " << options.runs
      << ", \"warmup\": " << options.warmup << ", \"times_ms\": [" << absl::StrJoin(times, ", ")
      << "]}\n";

  if (!options.output_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options.output_dir, error);
    if (error) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot create --output-dir ", options.output_dir, ": ", error.message()));
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::string name = tools::OutputFileName(model.graph->outputs()[i]->name());
      CASTOR_RETURN_IF_ERROR(training::WriteNpy(
          (std::filesystem::path(options.output_dir) / (name + ".npy")).string(), outputs[i]));
    }
  }
  if (options.profile) {
    CASTOR_RETURN_IF_ERROR(Profile(model, backend, feeds, options.warmup, options.runs, out));
  }
  return absl::OkStatus();
}

// --- Google Benchmark mode ---------------------------------------------------

struct LoadedModel {
  Model model;
  Feeds feeds;
  std::unique_ptr<Executor> executor;
};

absl::Status RegisterSampleBenchmarks(const BenchOptions& options, CpuBackend& backend,
                                      std::vector<std::unique_ptr<LoadedModel>>& loaded) {
  for (const char* name : {"cnn", "mlp", "resnet", "transformer"}) {
    const std::string path =
        (std::filesystem::path(options.models_dir) / absl::StrCat(name, "_opset17.onnx")).string();
    auto entry = std::make_unique<LoadedModel>();
    CASTOR_ASSIGN_OR_RETURN(entry->model, LoadAndCheckModel(path));
    CASTOR_ASSIGN_OR_RETURN(entry->feeds, MakeFeeds(entry->model, {}, options.batch, options.seed));
    CASTOR_ASSIGN_OR_RETURN(entry->executor, Executor::Create(entry->model, backend));
    LoadedModel* model = entry.get();
    const int64_t batch = options.batch;
    benchmark::RegisterBenchmark(
        absl::StrCat("Inference/", name, "/batch:", batch, "/threads:", backend.num_threads())
            .c_str(),
        [model, batch](benchmark::State& state) {
          for (auto _ : state) {
            absl::StatusOr<std::vector<Tensor>> outputs = model->executor->Run(model->feeds);
            if (!outputs.ok()) {
              state.SkipWithError(std::string(outputs.status().message()).c_str());
              break;
            }
            benchmark::DoNotOptimize(outputs->data());
          }
          state.SetItemsProcessed(state.iterations() * batch);
        })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    loaded.push_back(std::move(entry));
  }
  return absl::OkStatus();
}

tools::ArgParser MakeParser(BenchOptions& options) {
  tools::ArgParser parser(
      "inference_bench",
      "Inference time of an ONNX model on castor's CPU backend (Executor::Run), in ms per\n"
      "batch. With --model: median of --runs timed runs after --warmup, a `RESULT {json}`\n"
      "line, optional outputs (--output-dir) and per-kernel profile (--profile). Without\n"
      "--model: Google Benchmark over the four opset-17 sample models in --models-dir\n"
      "(--benchmark_* flags apply). Inputs not given are random float32 N(0,1), every\n"
      "symbolic dim bound to --batch.");
  parser.AddString("model", "FILE", "the ONNX model to time", &options.model_path)
      .AddString("models-dir", "DIR", "sample models for the Google Benchmark mode",
                 &options.models_dir)
      .AddRepeated("input", "NAME=FILE", "feed graph input NAME from FILE (.npy or .pb)",
                   &options.inputs)
      .AddString("output-dir", "DIR", "write the outputs of the last run to DIR/<name>.npy",
                 &options.output_dir)
      .AddInt("batch", "N", "value of every symbolic/unknown input dim", &options.batch)
      .AddInt("threads", "N", "CPU backend threads (0: all hardware threads)", &options.threads)
      .AddInt("warmup", "N", "untimed runs first", &options.warmup)
      .AddInt("runs", "N", "timed runs", &options.runs)
      .AddInt("seed", "N", "seed of the random inputs", &options.seed)
      .AddSwitch("profile", "also time every kernel call and print the slowest ops",
                 &options.profile)
      .AddExample("inference_bench --model models/mlp_opset17.onnx --threads 2 --profile")
      .AddExample("inference_bench --threads 2 --benchmark_min_time=2");
  return parser;
}

int Main(int argc, char** argv) {
  BenchOptions options;
  tools::ArgParser parser = MakeParser(options);
  static std::string help_text;
  help_text = parser.Help();
  benchmark::Initialize(&argc, argv, [] {
    std::cout << help_text << "\nGoogle Benchmark flags (--benchmark_filter=REGEX, ...) are also "
                              "accepted.\n";
  });
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<tools::ParseOutcome> outcome = parser.Parse(args);
  if (!outcome.ok()) {
    std::cerr << "inference_bench: error: " << outcome.status().message() << "\n";
    return 2;
  }
  if (*outcome == tools::ParseOutcome::kHelp) {
    std::cout << parser.Help();
    return 0;
  }
  if (!options.model_path.empty()) {
    if (absl::Status status = TimeModel(options, std::cout); !status.ok()) {
      std::cerr << "inference_bench: error: " << status.message() << "\n";
      return 1;
    }
    return 0;
  }
  CpuBackend backend(CpuBackendOptions{static_cast<int>(options.threads)});
  std::vector<std::unique_ptr<LoadedModel>> loaded;
  if (absl::Status status = RegisterSampleBenchmarks(options, backend, loaded); !status.ok()) {
    std::cerr << "inference_bench: error: " << status.message() << "\n";
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace castor::bench

int main(int argc, char** argv) {
  castor::cpu::RestartWithBestBlasCore(argv);  // may re-exec with OPENBLAS_CORETYPE set
  return castor::bench::Main(argc, argv);
}
