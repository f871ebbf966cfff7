// Wall time of the autocast pass (RunAutocast) on large synthetic graphs, to
// back the claims that the pass is linear in graph size and converts a
// 100,000-node graph in under a second.
//
//   autocast_bench [--sizes 25000,50000,100000] [--runs 5]
//                  [--policies mixed_float16,mixed_bfloat16] [--restart]
//
// Each graph is built in memory with the graph API (no ONNX parsing) from a
// repeated transformer-like block of 13 nodes that exercises all three
// autocast categories, shared weight Casts, activation Casts in both
// directions, Constant Casts and float32 promotion of follow ops:
//
//   Constant c ------------------------------------------------+
//   x -> MatMul(W1) -> Add(b1) -> Relu -> MatMul(W2) -> Softmax  |
//                                  |            |-> ReduceMean   |
//                                  |            '-> Sub(., mean) -> Exp
//                                  |                  Mul(Softmax, Exp) -> p
//                                  '-> Mul(., c) -> q ---------'
//   y = Add(x, Add(p, q))    (residual; y is the next block's x)
//
// Under mixed_float16 a block gets 7 Casts (x, W1, b1, W2, c to float16;
// the second MatMul's output and q to float32). Graph building and type
// inference happen outside the timed region; the timed call is RunAutocast
// alone (including its final whole-graph type inference). Every run
// converts a freshly built graph. Prints, per size and policy: nodes before,
// Casts inserted, nodes per dtype, median/min wall time and median CPU time
// of the runs, wall and CPU time per input node, and the ratio of CPU time
// per node to the smallest size's (about 1.0 everywhere for a linear pass;
// CPU time because wall time on a shared machine includes waiting).
//
// --restart times the other path through RunAutocast instead: each graph is
// first converted (untimed) under the other mixed policy, then the timed call
// converts it with restart_from_float32, which strips castor's Casts
// (StripAutocast) before converting again.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "graph/graph.h"
#include "graph/shape_inference.h"
#include "graph/status.h"
#include "graph/tensor.h"
#include "passes/autocast.h"
#include "passes/policy.h"

namespace castor::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kNodesPerBlock = 13;
constexpr int64_t kTokens = 4;
constexpr int64_t kHidden = 8;

struct BenchOptions {
  std::vector<int64_t> sizes = {25000, 50000, 100000};
  int64_t runs = 5;
  std::vector<std::string> policies = {"mixed_float16", "mixed_bfloat16"};
  bool restart = false;
};

// A float32 tensor with small deterministic values (the pass never reads
// them; they only make the weights real initializers).
Tensor Weight(std::vector<int64_t> dims, int seed) {
  int64_t count = 1;
  for (int64_t d : dims) count *= d;
  std::vector<float> values(count);
  for (int64_t k = 0; k < count; ++k) values[k] = 0.01f * static_cast<float>((k + seed) % 17);
  return Tensor::FromVector(DType::kFloat32, std::move(dims), values);
}

// One block reading `x`; returns the block's output y. Names are explicit
// and unique ("b<k>/..."), as an exporter writes them.
absl::StatusOr<Value*> AddBlock(Graph& graph, Value* x, int block) {
  const std::string p = absl::StrCat("b", block, "/");
  auto node = [&](const std::string& op, const std::vector<Value*>& inputs,
                  const std::string& name) -> absl::StatusOr<Node*> {
    return graph.AddNode(op, inputs, {p + name}, p + op + "_" + name);
  };
  CASTOR_ASSIGN_OR_RETURN(Value * w1, graph.AddInitializer(p + "W1", Weight({kHidden, kHidden}, block)));
  CASTOR_ASSIGN_OR_RETURN(Value * b1, graph.AddInitializer(p + "b1", Weight({kHidden}, block + 1)));
  CASTOR_ASSIGN_OR_RETURN(Value * w2, graph.AddInitializer(p + "W2", Weight({kHidden, kHidden}, block + 2)));

  CASTOR_ASSIGN_OR_RETURN(Node * constant, node("Constant", {}, "scale"));
  constant->SetAttribute(Attribute::TensorValue("value", Tensor::Scalar(0.5f)));
  CASTOR_ASSIGN_OR_RETURN(Node * mm1, node("MatMul", {x, w1}, "mm1"));
  CASTOR_ASSIGN_OR_RETURN(Node * add1, node("Add", {mm1->output(0), b1}, "add_bias"));
  CASTOR_ASSIGN_OR_RETURN(Node * relu, node("Relu", {add1->output(0)}, "relu"));
  CASTOR_ASSIGN_OR_RETURN(Node * mm2, node("MatMul", {relu->output(0), w2}, "mm2"));
  CASTOR_ASSIGN_OR_RETURN(Node * softmax, node("Softmax", {mm2->output(0)}, "softmax"));
  softmax->SetAttribute(Attribute::Int("axis", -1));
  CASTOR_ASSIGN_OR_RETURN(Node * mean, node("ReduceMean", {mm2->output(0)}, "mean"));
  mean->SetAttribute(Attribute::Ints("axes", {-1}));
  mean->SetAttribute(Attribute::Int("keepdims", 1));
  CASTOR_ASSIGN_OR_RETURN(Node * centered, node("Sub", {mm2->output(0), mean->output(0)}, "centered"));
  CASTOR_ASSIGN_OR_RETURN(Node * exp, node("Exp", {centered->output(0)}, "exp"));
  CASTOR_ASSIGN_OR_RETURN(Node * gate, node("Mul", {softmax->output(0), exp->output(0)}, "gate"));
  CASTOR_ASSIGN_OR_RETURN(Node * scaled, node("Mul", {relu->output(0), constant->output(0)}, "scaled"));
  CASTOR_ASSIGN_OR_RETURN(Node * mix, node("Add", {gate->output(0), scaled->output(0)}, "mix"));
  CASTOR_ASSIGN_OR_RETURN(Node * residual, node("Add", {x, mix->output(0)}, "residual"));
  return residual->output(0);
}

// A float32 opset-17 model of about `target_nodes` nodes (whole blocks),
// with inferred types, as LoadModel would leave it.
absl::StatusOr<std::unique_ptr<Model>> BuildModel(int64_t target_nodes) {
  auto model = std::make_unique<Model>();
  model->ir_version = 8;
  model->opset_imports = {OpsetImport{"", 17}};
  model->producer_name = "castor autocast_bench";
  Graph& graph = *model->graph;
  graph.set_name("autocast_bench");
  CASTOR_ASSIGN_OR_RETURN(
      Value * x, graph.AddInput("input", DType::kFloat32,
                                Shape({Dim::Symbol("N"), Dim(kTokens), Dim(kHidden)})));
  const int64_t blocks = std::max<int64_t>(1, target_nodes / kNodesPerBlock);
  for (int64_t k = 0; k < blocks; ++k) {
    CASTOR_ASSIGN_OR_RETURN(x, AddBlock(graph, x, static_cast<int>(k)));
  }
  graph.AddOutput(x);
  CASTOR_RETURN_IF_ERROR(InferTypes(*model));
  return model;
}

// CPU time of this process in milliseconds (the pass is single-threaded, so
// on a shared machine this is the pass's own cost; wall time adds waiting).
double CpuMilliseconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  if (n == 0) return 0;
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

struct Measurement {
  std::string policy;
  int64_t nodes_before = 0;
  int64_t nodes_after = 0;
  int casts_inserted = 0;
  int weight_casts = 0;
  int constant_casts = 0;
  int activation_casts = 0;
  std::map<std::string, int> nodes_per_dtype;
  double build_ms = 0;  // median, untimed part: BuildModel
  double median_ms = 0;
  double min_ms = 0;
  double median_cpu_ms = 0;
};

absl::StatusOr<Measurement> Measure(int64_t size, const std::string& policy_name, int64_t runs,
                                    bool restart) {
  CASTOR_ASSIGN_OR_RETURN(Policy policy, Policy::Builtin(policy_name));
  CASTOR_ASSIGN_OR_RETURN(
      Policy first_policy,
      Policy::Builtin(policy_name == "mixed_float16" ? "mixed_bfloat16" : "mixed_float16"));
  AutocastOptions autocast_options;
  autocast_options.restart_from_float32 = restart;
  Measurement m;
  m.policy = policy_name;
  std::vector<double> times;
  std::vector<double> cpu_times;
  std::vector<double> build_times;
  for (int64_t run = 0; run < runs; ++run) {
    const Clock::time_point build_start = Clock::now();
    CASTOR_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, BuildModel(size));
    build_times.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - build_start).count());
    const int64_t nodes_before = model->graph->num_nodes();
    if (restart) {
      absl::StatusOr<AutocastReport> first = RunAutocast(*model, first_policy);
      if (!first.ok()) {
        return absl::InternalError(absl::StrCat("RunAutocast (", first_policy.name(), ", ",
                                                nodes_before, " nodes, before --restart): ",
                                                first.status().message()));
      }
    }

    const double cpu_start = CpuMilliseconds();
    const Clock::time_point start = Clock::now();
    absl::StatusOr<AutocastReport> report = RunAutocast(*model, policy, autocast_options);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    cpu_times.push_back(CpuMilliseconds() - cpu_start);
    if (!report.ok()) {
      return absl::InternalError(absl::StrCat("RunAutocast (", policy_name, ", ", nodes_before,
                                              " nodes): ", report.status().message()));
    }
    times.push_back(ms);

    // The result must be what the block design says, or the timing means
    // nothing: every inserted Cast is in the graph.
    int casts_in_graph = 0;
    for (const Node* node : model->graph->nodes()) casts_in_graph += node->op_type() == "Cast";
    if (casts_in_graph != report->casts_inserted()) {
      return absl::InternalError(absl::StrCat("report says ", report->casts_inserted(),
                                              " Casts inserted but the graph has ",
                                              casts_in_graph));
    }
    m.nodes_before = nodes_before;
    m.nodes_after = model->graph->num_nodes();
    m.casts_inserted = report->casts_inserted();
    m.weight_casts = report->weight_casts;
    m.constant_casts = report->constant_casts;
    m.activation_casts = report->activation_casts;
    m.nodes_per_dtype = report->nodes_per_dtype;
  }
  m.build_ms = Median(build_times);
  m.median_ms = Median(times);
  m.min_ms = *std::min_element(times.begin(), times.end());
  m.median_cpu_ms = Median(cpu_times);
  return m;
}

absl::StatusOr<std::vector<int64_t>> ParseSizes(const std::string& text) {
  std::vector<int64_t> sizes;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t size = 0;
    if (!absl::SimpleAtoi(part, &size) || size < kNodesPerBlock) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sizes: expected comma-separated node counts >= ", kNodesPerBlock, ", got '", text,
          "'"));
    }
    sizes.push_back(size);
  }
  return sizes;
}

absl::StatusOr<BenchOptions> ParseArgs(int argc, char** argv) {
  BenchOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--restart") {
      options.restart = true;
      continue;
    }
    if (flag == "-h" || flag == "--help") {
      std::printf(
          "usage: autocast_bench [--sizes 25000,50000,100000] [--runs 5]\n"
          "                      [--policies mixed_float16,mixed_bfloat16] [--restart]\n");
      std::exit(0);
    }
    if (i + 1 >= argc) {
      return absl::InvalidArgumentError(absl::StrCat("flag ", flag, " needs a value"));
    }
    const std::string value = argv[++i];
    if (flag == "--sizes") {
      CASTOR_ASSIGN_OR_RETURN(options.sizes, ParseSizes(value));
    } else if (flag == "--runs") {
      if (!absl::SimpleAtoi(value, &options.runs) || options.runs < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--runs: expected a positive integer, got '", value, "'"));
      }
    } else if (flag == "--policies") {
      options.policies = absl::StrSplit(value, ',');
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag '", flag, "' (expected --sizes, --runs, --policies or --restart)"));
    }
  }
  return options;
}

std::string DTypeCounts(const std::map<std::string, int>& counts) {
  std::string text;
  for (const auto& [dtype, count] : counts) {
    absl::StrAppend(&text, text.empty() ? "" : " ", dtype, ":", count);
  }
  return text;
}

int Main(int argc, char** argv) {
  absl::StatusOr<BenchOptions> options = ParseArgs(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "autocast_bench: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  std::printf("autocast pass (RunAutocast%s) on synthetic graphs, %lld run(s) each, median\n\n",
              options->restart ? " with restart_from_float32 of a converted graph" : "",
              static_cast<long long>(options->runs));
  std::printf("| policy | nodes | casts inserted (weight/const/act) | nodes after | "
              "nodes per dtype | build ms | pass ms (median) | pass ms (min) | pass CPU ms (median) | "
              "us / node | CPU us / node | CPU per node vs smallest |\n");
  std::printf("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const std::string& policy : options->policies) {
    double first_per_node = 0;
    for (int64_t size : options->sizes) {
      absl::StatusOr<Measurement> m = Measure(size, policy, options->runs, options->restart);
      if (!m.ok()) {
        std::fprintf(stderr, "autocast_bench: %s\n", std::string(m.status().message()).c_str());
        return 1;
      }
      const double us_per_node = 1000.0 * m->median_ms / static_cast<double>(m->nodes_before);
      const double cpu_us_per_node =
          1000.0 * m->median_cpu_ms / static_cast<double>(m->nodes_before);
      if (first_per_node == 0) first_per_node = cpu_us_per_node;
      std::printf("| %s | %lld | %d (%d/%d/%d) | %lld | %s | %.1f | %.1f | %.1f | %.1f | %.3f | %.3f | "
                  "%.2f |\n",
                  policy.c_str(), static_cast<long long>(m->nodes_before), m->casts_inserted,
                  m->weight_casts, m->constant_casts, m->activation_casts,
                  static_cast<long long>(m->nodes_after), DTypeCounts(m->nodes_per_dtype).c_str(),
                  m->build_ms, m->median_ms, m->min_ms, m->median_cpu_ms, us_per_node,
                  cpu_us_per_node, cpu_us_per_node / first_per_node);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace castor::bench

int main(int argc, char** argv) { return castor::bench::Main(argc, argv); }
