// castor train --profile's tables (see kernel_profile.h).
#include "tools/kernel_profile.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graph/dtype.h"
#include "graph/graph.h"

namespace castor {
namespace {

// "MaxPool", or "com.castor.MaxPool" for a castor-domain training form.
std::string QualifiedOp(const Node& node) {
  if (node.domain().empty() || node.domain() == "ai.onnx") return node.op_type();
  return absl::StrCat(node.domain(), ".", node.op_type());
}

std::string FirstOutputDType(const Node& node) {
  for (const Value* output : node.outputs()) {
    if (output != nullptr) return DTypeName(output->dtype());
  }
  return "-";
}

struct Row {
  std::string op;
  std::string dtype;
  int nodes = 0;
  double ms_per_step = 0;
};

}  // namespace

std::string RenderKernelProfile(const std::vector<KernelTime>& times, double mean_step_ms,
                                int top_nodes) {
  std::map<std::pair<std::string, std::string>, Row> by_op;
  std::vector<std::pair<double, const Node*>> by_node;
  double kernel_ms = 0;
  for (const KernelTime& time : times) {
    if (time.runs == 0 || time.node == nullptr) continue;
    const double ms = 1000 * time.seconds / static_cast<double>(time.runs);
    const std::string op = QualifiedOp(*time.node);
    const std::string dtype = FirstOutputDType(*time.node);
    Row& row = by_op[{op, dtype}];
    row.op = op;
    row.dtype = dtype;
    row.nodes += 1;
    row.ms_per_step += ms;
    by_node.emplace_back(ms, time.node);
    kernel_ms += ms;
  }
  if (by_node.empty()) return "";
  std::vector<Row> rows;
  for (auto& [key, row] : by_op) rows.push_back(row);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.ms_per_step > b.ms_per_step; });
  std::stable_sort(by_node.begin(), by_node.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  auto share = [&](double ms) { return kernel_ms > 0 ? 100 * ms / kernel_ms : 0.0; };

  std::string text = absl::StrFormat(
      "kernel time per training step (--profile): %.2f ms in %d nodes' kernels of a "
      "%.2f ms mean step; the rest is the optimizer, loss scaling, the batch's feed and "
      "waits\n",
      kernel_ms, static_cast<int>(by_node.size()), mean_step_ms);
  absl::StrAppendFormat(&text, "  %-40s %-9s %6s %9s %7s\n", "op", "dtype", "nodes", "ms/step",
                        "share");
  for (const Row& row : rows) {
    absl::StrAppendFormat(&text, "  %-40s %-9s %6d %9.3f %6.1f%%\n", row.op, row.dtype, row.nodes,
                          row.ms_per_step, share(row.ms_per_step));
  }
  absl::StrAppendFormat(&text, "the slowest nodes:\n  %-60s %-40s %9s %7s\n", "node", "op",
                        "ms/step", "share");
  const int shown = std::min<int>(top_nodes, static_cast<int>(by_node.size()));
  for (int i = 0; i < shown; ++i) {
    const auto& [ms, node] = by_node[i];
    std::string name = node->name().empty() ? "(unnamed)" : node->name();
    if (name.size() > 60) name = absl::StrCat("...", name.substr(name.size() - 57));
    absl::StrAppendFormat(&text, "  %-60s %-40s %9.3f %6.1f%%\n", name,
                          absl::StrCat(QualifiedOp(*node), " ", FirstOutputDType(*node)), ms,
                          share(ms));
  }
  return text;
}

}  // namespace castor
