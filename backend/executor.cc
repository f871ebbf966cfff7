// Executor (see executor.h): graph checks, kernel choice and liveness at
// creation; per-run feed checks, pooled activation buffers, in-place reuse
// and the memory statistics of each shape signature's plan.
#include "backend/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/dims.h"
#include "graph/status.h"

namespace castor {
namespace {

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return buffer;
}

int64_t ByteSize(DType dtype, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n * static_cast<int64_t>(DTypeSize(dtype));
}

bool HasSubgraph(const Node& node) {
  if (!node.implicit_inputs().empty()) return true;
  for (const Attribute& a : node.attributes()) {
    if (a.kind == AttrKind::kGraph || a.kind == AttrKind::kGraphs) return true;
  }
  return false;
}

// The value of a Constant node whose value is a tensor or a number list;
// nullopt for forms left to a kernel (strings, sparse tensors).
std::optional<Tensor> ConstantValue(const Node& node) {
  if (node.op_type() != "Constant" || !CanonicalDomain(node.domain()).empty()) {
    return std::nullopt;
  }
  if (const Attribute* a = node.attribute("value"); a && a->kind == AttrKind::kTensor) {
    if (a->t.dtype() == DType::kString) return std::nullopt;
    return a->t;
  }
  if (const Attribute* a = node.attribute("value_float")) return Tensor::Scalar(a->f);
  if (const Attribute* a = node.attribute("value_floats")) {
    return Tensor::FromVector<float>(DType::kFloat32, {static_cast<int64_t>(a->floats.size())},
                                     a->floats);
  }
  if (const Attribute* a = node.attribute("value_int")) {
    return Tensor::FromVector<int64_t>(DType::kInt64, {}, {a->i});
  }
  if (const Attribute* a = node.attribute("value_ints")) return Tensor::Int64s(a->ints);
  return std::nullopt;
}

}  // namespace

std::string DescribePlanStats(const PlanStats& stats) {
  return absl::StrCat("peak activations ", FormatBytes(stats.peak_activation_bytes), " (",
                      FormatBytes(stats.total_activation_bytes), " without reuse), ",
                      FormatBytes(stats.backend_allocated_bytes), " allocated from the backend, ",
                      stats.buffer_reuses, " buffer reuses, ", stats.in_place_reuses, " in place, ",
                      stats.num_nodes, " nodes");
}

// ---- the buffer pool ---------------------------------------------------------

// Free backend buffers by capacity (rounded up to 64 bytes). A request takes
// the smallest free buffer that fits and is at most twice its size.
class Executor::Pool {
 public:
  explicit Pool(Backend& backend) : backend_(backend) {}
  ~Pool() {
    for (const auto& [data, capacity] : capacity_) backend_.Free(data);
  }

  // `bytes` > 0. Adds the bytes allocated from the backend (0 on reuse).
  absl::StatusOr<void*> Acquire(size_t bytes, int64_t* allocated) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    auto it = free_.lower_bound(rounded);
    if (it != free_.end() && it->first <= 2 * rounded) {
      void* data = it->second;
      free_.erase(it);
      *allocated = 0;
      return data;
    }
    CASTOR_ASSIGN_OR_RETURN(void* data, backend_.Allocate(rounded));
    capacity_[data] = rounded;
    *allocated = static_cast<int64_t>(rounded);
    return data;
  }
  void Release(void* data) { free_.emplace(capacity_.at(data), data); }

 private:
  Backend& backend_;
  std::multimap<size_t, void*> free_;
  std::map<void*, size_t> capacity_;  // every buffer this pool allocated
};

// The buffers of one run, by value id, and the live-activation count.
class Executor::RunState {
 public:
  RunState(size_t num_values, Pool& pool)
      : slots_(num_values), available_(num_values), pool_(pool) {}
  ~RunState() {
    for (size_t id = 0; id < slots_.size(); ++id) Release(static_cast<int>(id));
  }

  bool available(int id) const { return available_[id]; }
  Buffer& slot(int id) { return slots_[id]; }
  const Buffer& slot(int id) const { return slots_[id]; }
  void Set(int id, Buffer buffer) {
    slots_[id] = std::move(buffer);
    available_[id] = true;
  }
  // Returns a pooled buffer to the pool (no-op for others).
  void Release(int id) {
    Buffer& b = slots_[id];
    if (b.pooled && b.data != nullptr) {
      pool_.Release(b.data);
      live_bytes -= ByteSize(b.dtype, b.dims);
    }
    b.pooled = false;
    available_[id] = false;
  }
  // Hands the buffer over to the caller (kept values); the slot no longer owns it.
  Buffer Take(int id) {
    Buffer b = slots_[id];
    slots_[id].pooled = false;
    return b;
  }

  int64_t live_bytes = 0;

 private:
  std::vector<Buffer> slots_;
  std::vector<bool> available_;
  Pool& pool_;
};

// The executor's OutputAllocator for one node: pool buffers, in-place reuse.
class Executor::NodeAllocator : public OutputAllocator {
 public:
  NodeAllocator(Pool& pool, RunState& state, const PlanStep& step, PlanStats& stats)
      : pool_(pool), state_(state), step_(step), stats_(stats) {}
  ~NodeAllocator() override {
    for (void* p : scratch_) pool_.Release(p);
  }

  absl::StatusOr<void*> AllocateOutput(int index, DType dtype,
                                       const std::vector<int64_t>& dims) override {
    const int id = index < static_cast<int>(step_.output_ids.size()) ? step_.output_ids[index] : -1;
    const int64_t bytes = ByteSize(dtype, dims);
    if (id < 0) return AllocateScratch(static_cast<size_t>(bytes));  // an unwanted output
    if (index == 0 && TakeInput0(id, dtype, dims, bytes)) return state_.slot(id).data;
    Buffer buffer{nullptr, dtype, dims, false};
    if (bytes > 0) {
      int64_t allocated = 0;
      CASTOR_ASSIGN_OR_RETURN(buffer.data, pool_.Acquire(static_cast<size_t>(bytes), &allocated));
      buffer.pooled = true;
      stats_.backend_allocated_bytes += allocated;
      if (allocated == 0) ++stats_.buffer_reuses;
      state_.live_bytes += bytes;
      stats_.peak_activation_bytes = std::max(stats_.peak_activation_bytes, state_.live_bytes);
    }
    stats_.total_activation_bytes += bytes;
    state_.Set(id, std::move(buffer));
    return state_.slot(id).data;
  }

  absl::StatusOr<void*> AllocateScratch(size_t bytes) override {
    if (bytes == 0) return nullptr;
    int64_t allocated = 0;
    CASTOR_ASSIGN_OR_RETURN(void* data, pool_.Acquire(bytes, &allocated));
    stats_.backend_allocated_bytes += allocated;
    scratch_.push_back(data);
    return data;
  }

 private:
  // Output 0 takes input 0's buffer when the plan allows it and the two
  // have the same dtype and size, so element i of the output lies where
  // element i of the input did (a bool output over a float input of the
  // same byte size would overwrite elements still to be read).
  bool TakeInput0(int id, DType dtype, const std::vector<int64_t>& dims, int64_t bytes) {
    if (!step_.in_place_candidate || bytes == 0) return false;
    const int in = step_.input_ids[0];
    Buffer& source = state_.slot(in);
    if (!state_.available(in) || !source.pooled || source.dtype != dtype ||
        ByteSize(source.dtype, source.dims) != bytes) {
      return false;
    }
    source.pooled = false;  // ownership moves to the output
    state_.Set(id, Buffer{source.data, dtype, dims, true});
    ++stats_.in_place_reuses;
    stats_.total_activation_bytes += bytes;
    return true;
  }

  Pool& pool_;
  RunState& state_;
  const PlanStep& step_;
  PlanStats& stats_;
  std::vector<void*> scratch_;
};

// ---- creation ----------------------------------------------------------------

Executor::Executor(const Model& model, Backend& backend, ExecutorOptions options)
    : model_(model),
      backend_(backend),
      options_(std::move(options)),
      pool_(std::make_unique<Pool>(backend)) {}

Executor::~Executor() {
  kept_.clear();
  for (auto& [id, buffer] : resident_) {
    if (buffer.data != nullptr) backend_.Free(buffer.data);
  }
}

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(const Model& model, Backend& backend,
                                                           ExecutorOptions options) {
  std::unique_ptr<Executor> executor(new Executor(model, backend, std::move(options)));
  CASTOR_RETURN_IF_ERROR(executor->Initialize());
  return executor;
}

absl::Status Executor::Initialize() {
  CASTOR_RETURN_IF_ERROR(IndexValues());
  CASTOR_RETURN_IF_ERROR(BuildSteps());
  ComputeLiveness();
  if (options_.time_kernels) {
    for (const PlanStep& step : steps_) kernel_times_.push_back(KernelTime{step.node});
  }
  return absl::OkStatus();
}

int Executor::ValueId(const Value* value) const {
  if (value == nullptr) return -1;
  auto it = value_ids_.find(value);
  return it == value_ids_.end() ? -1 : it->second;
}

// Numbers every value (inputs, initializers, node outputs) and checks that
// each node reads only values defined before it.
absl::Status Executor::IndexValues() {
  const Graph& graph = *model_.graph;
  auto add = [this](const Value* v) {
    if (v != nullptr && value_ids_.emplace(v, static_cast<int>(values_.size())).second) {
      values_.push_back(v);
    }
  };
  for (const Value* v : graph.inputs()) add(v);
  for (const Value* v : graph.initializers()) add(v);
  for (const Node* node : graph.nodes()) {
    for (const Value* in : node->inputs()) {
      if (in != nullptr && value_ids_.count(in) == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat(node->op_type(), " node '", node->name(), "' reads '", in->name(),
                         "' before any node defines it: the graph is not in topological order"));
      }
    }
    for (const Value* out : node->outputs()) {
      if (out != nullptr && out->dtype() == DType::kUndefined) {
        return absl::FailedPreconditionError(
            absl::StrCat(node->op_type(), " node '", node->name(), "': output '", out->name(),
                         "' has no inferred dtype; run InferTypes on the model first"));
      }
      add(out);
    }
  }
  for (const Value* v : graph.outputs()) {
    if (ValueId(v) < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("graph output '", v->name(), "' is not defined by any node or input"));
    }
  }
  return absl::OkStatus();
}

// Small integer tensors keep a host copy beside the backend's (see
// TensorView::host_data): shapes, axes and labels, read on the host by
// device kernels that plan with them.
namespace {

constexpr int64_t kHostCopyElements = int64_t{1} << 16;

// `view.host_data` holds the elements (a host tensor, or the host copy a
// backend feed brings along).
std::shared_ptr<const Tensor> HostCopyOfView(const TensorView& view) {
  if ((view.host_data == nullptr && view.num_elements() > 0) ||
      (view.dtype != DType::kInt64 && view.dtype != DType::kInt32) ||
      view.num_elements() > kHostCopyElements) {
    return nullptr;
  }
  auto copy = std::make_shared<Tensor>(view.dtype, view.dims);
  if (copy->byte_size() > 0) std::memcpy(copy->raw(), view.host_data, copy->byte_size());
  return copy;
}

std::shared_ptr<const Tensor> HostCopyOf(const Tensor& tensor) {
  return HostCopyOfView(TensorView{nullptr, tensor.dtype(), tensor.dims(), tensor.raw()});
}

}  // namespace

absl::Status Executor::UploadResident(int id, const Tensor& tensor) {
  if (tensor.dtype() == DType::kString) {
    return absl::UnimplementedError(
        absl::StrCat("'", values_[id]->name(), "': string tensors are not supported"));
  }
  Buffer buffer{nullptr, tensor.dtype(), tensor.dims(), false, HostCopyOf(tensor)};
  if (tensor.byte_size() > 0) {
    CASTOR_ASSIGN_OR_RETURN(buffer.data, backend_.Allocate(tensor.byte_size()));
    resident_[id] = buffer;  // owned from here on, freed by the destructor
    CASTOR_RETURN_IF_ERROR(backend_.CopyFromHost(buffer.data, tensor.raw(), tensor.byte_size()));
  }
  resident_[id] = std::move(buffer);
  return absl::OkStatus();
}

// Folds Constants, uploads initializers and picks a kernel per node. Every
// node without a kernel is reported in one error.
absl::Status Executor::BuildSteps() {
  for (const Value* v : model_.graph->initializers()) {
    CASTOR_RETURN_IF_ERROR(UploadResident(ValueId(v), *v->initializer()));
  }
  std::vector<std::string> missing;
  std::set<std::string> missing_ops;
  for (const Node* node : model_.graph->nodes()) {
    if (HasSubgraph(*node)) {
      return absl::UnimplementedError(
          absl::StrCat(node->op_type(), " node '", node->name(),
                       "': ops with subgraphs (If, Loop, Scan) are not supported by the executor"));
    }
    if (std::optional<Tensor> constant = ConstantValue(*node)) {
      CASTOR_RETURN_IF_ERROR(UploadResident(ValueId(node->output(0)), *constant));
      continue;
    }
    absl::StatusOr<const KernelDef*> kernel = backend_.kernels().Find(*node);
    if (!kernel.ok()) {
      missing_ops.insert(node->domain().empty()
                             ? node->op_type()
                             : absl::StrCat(node->domain(), ":", node->op_type()));
      missing.push_back(std::string(kernel.status().message()));
      continue;
    }
    PlanStep step;
    step.node = node;
    step.kernel = *kernel;
    step.opset = model_.OpsetVersion(node->domain());
    for (const Value* in : node->inputs()) step.input_ids.push_back(ValueId(in));
    for (const Value* out : node->outputs()) step.output_ids.push_back(ValueId(out));
    steps_.push_back(std::move(step));
  }
  if (!missing.empty()) {
    return absl::UnimplementedError(
        absl::StrCat("backend '", backend_.name(), "' has no kernel for ", missing.size(), " node",
                     missing.size() == 1 ? "" : "s", " (op", missing_ops.size() == 1 ? " " : "s ",
                     absl::StrJoin(missing_ops, ", "), "): ", absl::StrJoin(missing, "; ")));
  }
  for (const std::string& name : options_.keep_values) {
    if (ValueId(model_.graph->FindValue(name)) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("keep_values names '", name, "', which is not a value of the graph"));
    }
  }
  return absl::OkStatus();
}

// Last reader of each value, the values pinned for the whole run, and where
// each activation dies and whether in-place reuse is possible.
void Executor::ComputeLiveness() {
  const size_t n = values_.size();
  last_use_.assign(n, -1);
  pinned_.assign(n, false);
  for (const Value* v : model_.graph->inputs()) pinned_[ValueId(v)] = true;
  for (const Value* v : model_.graph->outputs()) pinned_[ValueId(v)] = true;
  for (const auto& [id, buffer] : resident_) pinned_[id] = true;
  for (const std::string& name : options_.keep_values) {
    pinned_[ValueId(model_.graph->FindValue(name))] = true;
  }
  for (size_t s = 0; s < steps_.size(); ++s) {
    for (int id : steps_[s].input_ids) {
      if (id >= 0) last_use_[id] = static_cast<int>(s);
    }
  }
  for (size_t s = 0; s < steps_.size(); ++s) {
    PlanStep& step = steps_[s];
    std::set<int> dying;
    for (int id : step.input_ids) {
      if (id >= 0 && !pinned_[id] && last_use_[id] == static_cast<int>(s)) dying.insert(id);
    }
    for (int id : step.output_ids) {
      if (id >= 0 && !pinned_[id] && last_use_[id] < 0) dying.insert(id);  // never read
    }
    step.dying_ids.assign(dying.begin(), dying.end());
    step.kept_outputs.clear();
    for (int id : step.output_ids) step.kept_outputs.push_back(id >= 0 && pinned_[id]);
    const int in0 = step.input_ids.empty() ? -1 : step.input_ids[0];
    step.in_place_candidate = step.kernel->in_place_ok && in0 >= 0 && dying.count(in0) > 0 &&
                              std::count(step.input_ids.begin(), step.input_ids.end(), in0) == 1 &&
                              !step.output_ids.empty() && step.output_ids[0] >= 0;
  }
}

// ---- running -----------------------------------------------------------------

std::vector<Executor::Feed> Executor::HostFeeds(
    const std::vector<std::pair<std::string, Tensor>>& feeds) {
  std::vector<Feed> list;
  for (const auto& [name, tensor] : feeds) {
    list.push_back(Feed{&name, tensor.dtype(), &tensor.dims(), &tensor, nullptr});
  }
  return list;
}

absl::Status Executor::CheckFeeds(const std::vector<std::pair<std::string, Tensor>>& feeds) const {
  return CheckFeedList(HostFeeds(feeds));
}

absl::Status Executor::CheckFeedList(const std::vector<Feed>& feeds) const {
  std::vector<std::string> problems;
  std::set<std::string> fed;
  std::vector<std::string> input_names;
  for (const Value* v : model_.graph->inputs()) input_names.push_back(v->name());
  for (const Feed& feed : feeds) {
    const std::string& name = *feed.name;
    const std::vector<int64_t>& dims = *feed.dims;
    const Value* input = model_.graph->FindValue(name);
    if (input == nullptr || !input->is_graph_input()) {
      problems.push_back(absl::StrCat("unknown feed '", name, "': the graph inputs are ",
                                      absl::StrJoin(input_names, ", ")));
      continue;
    }
    if (!fed.insert(name).second)
      problems.push_back(absl::StrCat("input '", name, "' is fed twice"));
    if (feed.dtype != input->dtype()) {
      problems.push_back(absl::StrCat("input '", name, "': fed ", DTypeName(feed.dtype),
                                      ", the model expects ", DTypeName(input->dtype())));
    }
    const Shape& shape = input->shape();
    if (!shape.rank_known()) continue;
    if (shape.rank() != static_cast<int>(dims.size())) {
      problems.push_back(absl::StrCat("input '", name, "': fed rank ", dims.size(), " ",
                                      common::DimsToString(dims), ", the model expects rank ",
                                      shape.rank(), " ", shape.ToString()));
      continue;
    }
    for (int d = 0; d < shape.rank(); ++d) {
      if (shape[d].is_static() && shape[d].value() != dims[d]) {
        problems.push_back(absl::StrCat("input '", name, "': dim ", d, " is ", dims[d],
                                        ", the model expects ", shape[d].value(), " (shape ",
                                        shape.ToString(), ", fed ", common::DimsToString(dims),
                                        ")"));
      }
    }
  }
  std::vector<std::string> missing;
  for (const Value* v : model_.graph->inputs()) {
    if (v->initializer() == nullptr && fed.count(v->name()) == 0) {
      missing.push_back(
          absl::StrCat("'", v->name(), "' (", DTypeName(v->dtype()), v->shape().ToString(), ")"));
    }
  }
  if (!missing.empty()) {
    problems.push_back(absl::StrCat("missing feed for graph input",
                                    missing.size() == 1 ? " " : "s ",
                                    absl::StrJoin(missing, ", ")));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
}

absl::Status Executor::FeedInputs(const std::vector<Feed>& feeds, RunState& state,
                                  PlanStats& stats) {
  CASTOR_RETURN_IF_ERROR(CheckFeedList(feeds));
  ReleaseKept();
  stats.num_nodes = static_cast<int>(steps_.size());
  for (const auto& [id, buffer] : resident_) state.Set(id, buffer);
  for (const Feed& feed : feeds) {
    const int id = ValueId(model_.graph->FindValue(*feed.name));
    if (feed.on_backend != nullptr) {  // used in place, never pooled
      const TensorView& view = *feed.on_backend;
      state.Set(id, Buffer{view.data, view.dtype, view.dims, false, HostCopyOfView(view)});
      continue;
    }
    const Tensor& tensor = *feed.host;
    Buffer buffer{nullptr, tensor.dtype(), tensor.dims(), false, HostCopyOf(tensor)};
    if (tensor.byte_size() > 0) {
      int64_t allocated = 0;
      CASTOR_ASSIGN_OR_RETURN(buffer.data, pool_->Acquire(tensor.byte_size(), &allocated));
      buffer.pooled = true;
      stats.backend_allocated_bytes += allocated;
    }
    state.Set(id, buffer);
    if (buffer.data != nullptr) {
      CASTOR_RETURN_IF_ERROR(backend_.CopyFromHost(buffer.data, tensor.raw(), tensor.byte_size()));
    }
  }
  state.live_bytes = 0;  // feeds are not activations
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> Executor::Run(
    const std::vector<std::pair<std::string, Tensor>>& feeds) {
  std::vector<Tensor> outputs;
  CASTOR_RETURN_IF_ERROR(Execute(HostFeeds(feeds), &outputs));
  return outputs;
}

absl::Status Executor::RunOnBackend(const std::vector<std::pair<std::string, Tensor>>& feeds) {
  return Execute(HostFeeds(feeds), nullptr);
}

absl::Status Executor::RunOnBackendWithBackendFeeds(
    const std::vector<std::pair<std::string, TensorView>>& feeds) {
  std::vector<Feed> list;
  for (const auto& [name, view] : feeds) {
    if (view.data == nullptr && view.num_elements() > 0) {
      return absl::InvalidArgumentError(absl::StrCat("feed '", name, "' has no backend buffer"));
    }
    list.push_back(Feed{&name, view.dtype, &view.dims, nullptr, &view});
  }
  return Execute(list, nullptr);
}

absl::Status Executor::Execute(const std::vector<Feed>& feeds, std::vector<Tensor>* host_outputs) {
  PlanStats stats;
  RunState state(values_.size(), *pool_);
  CASTOR_RETURN_IF_ERROR(FeedInputs(feeds, state, stats));
  std::vector<std::vector<int64_t>> signature;
  for (const Value* v : model_.graph->inputs()) signature.push_back(state.slot(ValueId(v)).dims);
  Plan& plan = plans_[signature];
  StepObserver report_outputs;
  if (output_observer_ && host_outputs == nullptr) {
    report_outputs = [this](const PlanStep& step, const RunState& run) -> absl::StatusOr<bool> {
      for (int id : step.output_ids) {
        auto indices = graph_output_indices_.find(id);
        if (id < 0 || !run.available(id) || indices == graph_output_indices_.end()) continue;
        const Buffer& b = run.slot(id);
        for (int index : indices->second) {
          CASTOR_RETURN_IF_ERROR(output_observer_(index, TensorView{b.data, b.dtype, b.dims}));
        }
      }
      return false;  // never stops the run
    };
  }
  CASTOR_RETURN_IF_ERROR(RunSteps(state, stats, report_outputs));
  if (host_outputs != nullptr) {
    CASTOR_RETURN_IF_ERROR(backend_.Synchronize());
    CASTOR_ASSIGN_OR_RETURN(*host_outputs, DownloadOutputs(state));
  } else {
    for (const Value* v : model_.graph->outputs()) {
      const int id = ValueId(v);
      if (!state.available(id)) {
        return absl::InternalError(absl::StrCat("graph output '", v->name(), "' was not computed"));
      }
      if (!kept_.contains(id)) kept_[id] = state.Take(id);  // an output listed twice
    }
    outputs_kept_ = true;
  }
  for (const std::string& name : options_.keep_values) {
    const int id = ValueId(model_.graph->FindValue(name));
    if (state.available(id) && !kept_.contains(id)) kept_[id] = state.Take(id);
  }
  plan.stats = stats;
  ++plan.runs;
  last_stats_ = stats;
  return absl::OkStatus();
}

void Executor::SetOutputObserver(OutputObserver observer) {
  output_observer_ = std::move(observer);
  graph_output_indices_.clear();
  const std::vector<Value*>& outputs = model_.graph->outputs();
  for (size_t k = 0; k < outputs.size(); ++k) {
    graph_output_indices_[ValueId(outputs[k])].push_back(static_cast<int>(k));
  }
}

absl::StatusOr<TensorView> Executor::OutputView(int index) const {
  const std::vector<Value*>& outputs = model_.graph->outputs();
  if (index < 0 || index >= static_cast<int>(outputs.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("output ", index, " of a graph with ", outputs.size(), " outputs"));
  }
  auto it = outputs_kept_ ? kept_.find(ValueId(outputs[index])) : kept_.end();
  if (it == kept_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("output '", outputs[index]->name(), "' has no value: no RunOnBackend yet"));
  }
  return TensorView{it->second.data, it->second.dtype, it->second.dims};
}

absl::StatusOr<std::optional<NonFiniteOutput>> Executor::FindFirstNonFinite(
    const std::vector<std::pair<std::string, Tensor>>& feeds) {
  PlanStats stats;
  RunState state(values_.size(), *pool_);
  CASTOR_RETURN_IF_ERROR(FeedInputs(HostFeeds(feeds), state, stats));
  std::optional<NonFiniteOutput> found;
  auto check = [&](const PlanStep& step, const RunState& run) -> absl::StatusOr<bool> {
    for (int id : step.output_ids) {
      if (id < 0 || !run.available(id) || !IsFloatingPoint(run.slot(id).dtype)) continue;
      const Buffer& b = run.slot(id);
      Tensor host(b.dtype, b.dims);
      if (host.byte_size() == 0) continue;
      CASTOR_RETURN_IF_ERROR(backend_.Synchronize());
      CASTOR_RETURN_IF_ERROR(backend_.CopyToHost(host.raw(), b.data, host.byte_size()));
      int64_t non_finite = 0;
      for (int64_t i = 0; i < host.num_elements(); ++i) {
        non_finite += !std::isfinite(host.GetDouble(i));
      }
      if (non_finite > 0) {
        found = NonFiniteOutput{step.node->name(), step.node->op_type(), values_[id]->name(),
                                non_finite, host.num_elements()};
        return true;
      }
    }
    return false;
  };
  CASTOR_RETURN_IF_ERROR(RunSteps(state, stats, check));
  CASTOR_RETURN_IF_ERROR(backend_.Synchronize());
  return found;
}

absl::Status Executor::RunSteps(RunState& state, PlanStats& stats, const StepObserver& observer) {
  for (size_t step_index = 0; step_index < steps_.size(); ++step_index) {
    const PlanStep& step = steps_[step_index];
    const Node& node = *step.node;
    std::vector<const TensorView*> inputs(step.input_ids.size(), nullptr);
    std::vector<TensorView> views(step.input_ids.size());
    for (size_t i = 0; i < step.input_ids.size(); ++i) {
      const int id = step.input_ids[i];
      if (id < 0) continue;
      if (!state.available(id)) {
        return absl::InternalError(absl::StrCat(node.op_type(), " node '", node.name(),
                                                "': input '", values_[id]->name(),
                                                "' was not produced by its node's kernel"));
      }
      const Buffer& b = state.slot(id);
      views[i] = TensorView{b.data, b.dtype, b.dims, b.host ? b.host->raw() : nullptr};
      inputs[i] = &views[i];
    }
    {
      NodeAllocator allocator(*pool_, state, step, stats);
      KernelContext context(node, step.opset, backend_, inputs, allocator);
      context.SetKeptOutputs(step.kept_outputs);
      const auto started = options_.time_kernels ? std::chrono::steady_clock::now()
                                                 : std::chrono::steady_clock::time_point{};
      CASTOR_RETURN_IF_ERROR(step.kernel->run(context));
      if (options_.time_kernels) {
        CASTOR_RETURN_IF_ERROR(backend_.Synchronize());
        KernelTime& time = kernel_times_[step_index];
        time.runs += 1;
        time.seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      }
      for (size_t k = 0; k < step.output_ids.size(); ++k) {
        const int id = step.output_ids[k];
        if (id >= 0 && state.available(id) && context.host_copy(static_cast<int>(k)) != nullptr) {
          state.slot(id).host = context.host_copy(static_cast<int>(k));
        }
      }
    }
    CASTOR_RETURN_IF_ERROR(CheckOutputs(step, state));
    if (observer) {
      CASTOR_ASSIGN_OR_RETURN(const bool stop, observer(step, state));
      if (stop) return absl::OkStatus();
    }
    for (int id : step.dying_ids) state.Release(id);
  }
  return absl::OkStatus();
}

// Each needed output was produced, with the inferred dtype and static dims
// (a mismatch is a kernel or inference bug, reported before it spreads).
absl::Status Executor::CheckOutputs(const PlanStep& step, const RunState& state) const {
  const Node& node = *step.node;
  for (size_t k = 0; k < step.output_ids.size(); ++k) {
    const int id = step.output_ids[k];
    if (id < 0) continue;
    const Value* v = values_[id];
    auto error = [&](const std::string& what) {
      return absl::InternalError(absl::StrCat(node.op_type(), " node '", node.name(), "': output ",
                                              k, " ('", v->name(), "') ", what));
    };
    if (!state.available(id)) {
      if (!v->uses().empty() || v->is_graph_output())
        return error("was not produced by the kernel");
      continue;
    }
    const Buffer& b = state.slot(id);
    if (b.dtype != v->dtype()) {
      return error(
          absl::StrCat("is ", DTypeName(b.dtype), ", inference said ", DTypeName(v->dtype())));
    }
    const Shape& shape = v->shape();
    bool dims_agree = !shape.rank_known() || shape.rank() == static_cast<int>(b.dims.size());
    for (int d = 0; dims_agree && shape.rank_known() && d < shape.rank(); ++d) {
      dims_agree = !shape[d].is_static() || shape[d].value() == b.dims[d];
    }
    if (!dims_agree) {
      return error(absl::StrCat("has dims ", common::DimsToString(b.dims), ", inference said ",
                                shape.ToString()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> Executor::DownloadOutputs(const RunState& state) const {
  std::vector<Tensor> outputs;
  for (const Value* v : model_.graph->outputs()) {
    const int id = ValueId(v);
    if (!state.available(id)) {
      return absl::InternalError(absl::StrCat("graph output '", v->name(), "' was not computed"));
    }
    const Buffer& b = state.slot(id);
    Tensor t(b.dtype, b.dims);
    if (t.byte_size() > 0)
      CASTOR_RETURN_IF_ERROR(backend_.CopyToHost(t.raw(), b.data, t.byte_size()));
    outputs.push_back(std::move(t));
  }
  return outputs;
}

void Executor::ReleaseKept() {
  for (auto& [id, buffer] : kept_) {
    if (buffer.pooled && buffer.data != nullptr) pool_->Release(buffer.data);
  }
  kept_.clear();
  outputs_kept_ = false;
}

// ---- resident and kept tensors -------------------------------------------------

absl::StatusOr<Executor::Buffer*> Executor::MutableResident(const std::string& name) {
  auto it = resident_.find(ValueId(model_.graph->FindValue(name)));
  if (it == resident_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no resident tensor '", name,
                     "' (resident tensors are initializers and Constant outputs)"));
  }
  return &it->second;
}

absl::StatusOr<TensorView> Executor::ResidentTensor(const std::string& name) const {
  CASTOR_ASSIGN_OR_RETURN(Buffer * b, const_cast<Executor*>(this)->MutableResident(name));
  return TensorView{b->data, b->dtype, b->dims};
}

std::vector<std::string> Executor::ResidentNames() const {
  std::vector<std::string> names;
  for (const auto& [id, buffer] : resident_) names.push_back(values_[id]->name());
  return names;
}

absl::Status Executor::UpdateResident(const std::string& name, const Tensor& tensor) {
  CASTOR_ASSIGN_OR_RETURN(Buffer * b, MutableResident(name));
  if (tensor.dtype() != b->dtype || tensor.dims() != b->dims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resident tensor '", name, "' is ", DTypeName(b->dtype), common::DimsToString(b->dims),
        ", update is ", DTypeName(tensor.dtype()), common::DimsToString(tensor.dims())));
  }
  b->host = HostCopyOf(tensor);
  return backend_.CopyFromHost(b->data, tensor.raw(), tensor.byte_size());
}

absl::Status Executor::AssignResident(const std::string& name, const TensorView& source) {
  CASTOR_ASSIGN_OR_RETURN(Buffer * b, MutableResident(name));
  if (source.dtype != b->dtype || source.dims != b->dims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resident tensor '", name, "' is ", DTypeName(b->dtype), common::DimsToString(b->dims),
        ", source is ", DTypeName(source.dtype), common::DimsToString(source.dims)));
  }
  b->host = nullptr;  // the new values are on the backend only
  return backend_.CopyWithin(b->data, source.data, source.byte_size());
}

absl::StatusOr<TensorView> Executor::KeptValue(const std::string& name) const {
  const int id = ValueId(model_.graph->FindValue(name));
  if (std::find(options_.keep_values.begin(), options_.keep_values.end(), name) ==
      options_.keep_values.end()) {
    return absl::NotFoundError(absl::StrCat("'", name, "' is not in ExecutorOptions::keep_values"));
  }
  auto it = kept_.find(id);
  if (it == kept_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("'", name, "' has no value: no run yet"));
  }
  return TensorView{it->second.data, it->second.dtype, it->second.dims};
}

absl::StatusOr<Tensor> Executor::KeptValueToHost(const std::string& name) const {
  CASTOR_ASSIGN_OR_RETURN(TensorView view, KeptValue(name));
  Tensor t(view.dtype, view.dims);
  if (t.byte_size() > 0)
    CASTOR_RETURN_IF_ERROR(backend_.CopyToHost(t.raw(), view.data, t.byte_size()));
  return t;
}

}  // namespace castor
