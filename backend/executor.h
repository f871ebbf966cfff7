// The executor: runs a whole (type-inferred) Model on a Backend.
//
// At creation it checks the graph once: nodes in topological order, no
// subgraph ops (If/Loop/Scan), a kernel for every node (all missing ones are
// listed in one Unimplemented error), and it computes liveness (the last
// node that reads each value). Initializers and folded Constant nodes are
// uploaded once and stay resident on the backend; later work (training) reads
// and updates them by name (ResidentTensor, UpdateResident, AssignResident).
//
// Run() takes host feeds, checks them against the graph inputs (name, dtype,
// rank, static dims), and executes the plan for the feeds' shape signature
// (the concrete dims of every graph input). Plans are cached per signature;
// kernel choice and liveness do not depend on shapes, while memory does, so
// each plan records the memory statistics of its runs. RunOnBackend does
// what Run does but leaves the outputs in backend memory and returns without
// waiting, so a trainer can queue the rest of a step behind it.
//
// Memory: activations come from a size-bucketed free pool of backend
// buffers; a value's buffer returns to the pool after its last consumer ran
// (never graph inputs, initializers, graph outputs or kept values, which
// live until the run ends). A kernel registered `in_place_ok` writes output 0
// into input 0's buffer when input 0 dies at that node, is an activation (not
// a graph input, initializer, graph output or kept value) and has output 0's
// byte size. The pool keeps its buffers across runs, so a second run with the
// same signature allocates nothing from the backend.
#pragma once

#include <cstdint>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "backend/kernel.h"
#include "graph/graph.h"
#include "graph/tensor.h"

namespace castor {

struct ExecutorOptions {
  // Values (by name) whose buffers stay on the backend after Run until the
  // next Run starts; read them with KeptValue / KeptValueToHost.
  std::vector<std::string> keep_values;
  // Time every node's kernel, the backend synchronised after each (so an
  // asynchronous backend's work counts where it ran, at the cost of its
  // overlap); read the sums with KernelTimes. For profiling, not training.
  bool time_kernels = false;
};

// One node's kernel time summed over the runs since the executor was
// created (ExecutorOptions::time_kernels).
struct KernelTime {
  const Node* node = nullptr;
  int64_t runs = 0;
  double seconds = 0;
};

// Memory statistics of one run (bytes are exact tensor sizes, not rounded).
struct PlanStats {
  int num_nodes = 0;
  // Largest total size of activation buffers alive at once (node outputs,
  // graph outputs included; feeds and resident tensors excluded).
  int64_t peak_activation_bytes = 0;
  // Sum of all activation sizes: what the run would need with no reuse.
  int64_t total_activation_bytes = 0;
  // Bytes newly allocated from the backend during the run (pool misses).
  int64_t backend_allocated_bytes = 0;
  // Outputs written into their input 0's buffer.
  int in_place_reuses = 0;
  // Outputs given a buffer from the free pool instead of a new allocation.
  int buffer_reuses = 0;
};

// A node output holding infinities or NaNs (Executor::FindFirstNonFinite).
struct NonFiniteOutput {
  std::string node;     // the node's name
  std::string op_type;
  std::string value;    // the output's name
  int64_t non_finite = 0;  // elements that are inf or NaN
  int64_t elements = 0;
};

// "peak activations 1.2 MiB (3.4 MiB without reuse), 5 buffer reuses, ...".
std::string DescribePlanStats(const PlanStats& stats);

// Kernel choice and liveness for one node (shape-independent).
struct PlanStep {
  const Node* node = nullptr;
  const KernelDef* kernel = nullptr;
  int64_t opset = 0;
  std::vector<int> input_ids;       // value ids; -1 for an omitted input
  std::vector<int> output_ids;      // value ids; -1 for an omitted output
  std::vector<int> dying_ids;       // activations whose last reader is this node
  std::vector<bool> kept_outputs;   // per output: pinned (graph output, keep_values)
  bool in_place_candidate = false;  // kernel in_place_ok and input 0 may be taken
};

class Executor {
 public:
  // `model` must be type-inferred and must outlive the executor.
  static absl::StatusOr<std::unique_ptr<Executor>> Create(const Model& model, Backend& backend,
                                                          ExecutorOptions options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs the graph; returns the graph outputs on the host in graph-output
  // order. Feeds name graph inputs (inputs with an initializer may be fed to
  // override it).
  absl::StatusOr<std::vector<Tensor>> Run(const std::vector<std::pair<std::string, Tensor>>& feeds);

  // Runs the graph like Run but leaves the graph outputs in backend memory
  // and does not wait for the backend: the call returns once the work is
  // queued. Read the outputs with OutputView until the next run starts.
  absl::Status RunOnBackend(const std::vector<std::pair<std::string, Tensor>>& feeds);
  // RunOnBackend on feeds already in backend memory (say, the fixed buffers
  // a recorded step reads): they are used in place, not copied, and must
  // stay as they are until the run's work is done. A feed's host_data, when
  // set, is its host copy (kernels that plan with small integer tensors read
  // it instead of waiting for the device); the same checks as for host feeds.
  absl::Status RunOnBackendWithBackendFeeds(
      const std::vector<std::pair<std::string, TensorView>>& feeds);
  // Graph output `index` (graph-output order) of the last RunOnBackend.
  absl::StatusOr<TensorView> OutputView(int index) const;

  // Called during RunOnBackend each time a node has produced a graph
  // output, with the output's index (graph-output order) and its buffer,
  // before the next node runs: a data-parallel trainer starts averaging a
  // gradient while the rest of the backward pass runs. On an asynchronous
  // backend (Backend::synchronous() false) the buffer holds the value only
  // once the backend's queue gets there. An error stops the run. Outputs no
  // node produces (an input or initializer listed as an output) are not
  // reported. An empty function removes the observer.
  using OutputObserver = std::function<absl::Status(int output_index, const TensorView& value)>;
  void SetOutputObserver(OutputObserver observer);
  // Returns the last run's outputs and kept values to the buffer pool
  // before the next run would (their views become invalid).
  void ReleaseOutputs() { ReleaseKept(); }

  // Runs the graph like Run, but after each node copies its float outputs
  // to the host and stops at the first that holds an inf or NaN: the first
  // in execution (topological) order. nullopt when every output is finite.
  // A diagnostic: the copies make it several times slower than Run. Like
  // Run, it releases the kept values of the previous run.
  absl::StatusOr<std::optional<NonFiniteOutput>> FindFirstNonFinite(
      const std::vector<std::pair<std::string, Tensor>>& feeds);

  // The checks Run does on feeds, without running: unknown or duplicate
  // names, missing inputs (all listed), dtype, rank and static dims. Errors
  // are InvalidArgument and name the input and what was expected.
  absl::Status CheckFeeds(const std::vector<std::pair<std::string, Tensor>>& feeds) const;

  // Resident tensors: initializers and folded Constant outputs, by value name.
  absl::StatusOr<TensorView> ResidentTensor(const std::string& name) const;
  std::vector<std::string> ResidentNames() const;
  // Overwrites a resident tensor from the host (same dtype and dims).
  absl::Status UpdateResident(const std::string& name, const Tensor& tensor);
  // Overwrites a resident tensor from a backend buffer (e.g. a kept value).
  absl::Status AssignResident(const std::string& name, const TensorView& source);

  // A value listed in ExecutorOptions::keep_values, from the last Run.
  absl::StatusOr<TensorView> KeptValue(const std::string& name) const;
  absl::StatusOr<Tensor> KeptValueToHost(const std::string& name) const;

  // Number of distinct input shape signatures planned so far.
  int num_plans() const { return static_cast<int>(plans_.size()); }
  // Statistics of the most recent run (zeros before the first).
  const PlanStats& last_stats() const { return last_stats_; }
  const std::vector<PlanStep>& steps() const { return steps_; }
  // Per node in run order (empty unless ExecutorOptions::time_kernels).
  const std::vector<KernelTime>& kernel_times() const { return kernel_times_; }

 private:
  struct Buffer {
    void* data = nullptr;
    DType dtype = DType::kUndefined;
    std::vector<int64_t> dims;
    bool pooled = false;  // returns to the pool when released
    std::shared_ptr<const Tensor> host = nullptr;  // a host copy (TensorView::host_data)
  };
  // A feed as the run sees it: a host tensor to copy in, or a buffer
  // already on the backend.
  struct Feed {
    const std::string* name = nullptr;
    DType dtype = DType::kUndefined;
    const std::vector<int64_t>* dims = nullptr;
    const Tensor* host = nullptr;
    const TensorView* on_backend = nullptr;
  };
  static std::vector<Feed> HostFeeds(const std::vector<std::pair<std::string, Tensor>>& feeds);
  struct Plan {
    PlanStats stats;  // of the latest run with this signature
    int runs = 0;
  };
  class Pool;
  class RunState;
  class NodeAllocator;

  Executor(const Model& model, Backend& backend, ExecutorOptions options);
  absl::Status Initialize();
  absl::Status IndexValues();
  absl::Status BuildSteps();
  absl::Status UploadResident(int id, const Tensor& tensor);
  void ComputeLiveness();
  // Called after each node ran; returning true stops the run.
  using StepObserver = std::function<absl::StatusOr<bool>(const PlanStep&, const RunState&)>;
  absl::Status CheckFeedList(const std::vector<Feed>& feeds) const;
  absl::Status FeedInputs(const std::vector<Feed>& feeds, RunState& state, PlanStats& stats);
  absl::Status RunSteps(RunState& state, PlanStats& stats, const StepObserver& observer = {});
  // Run (host_outputs set) or RunOnBackend (nullptr).
  absl::Status Execute(const std::vector<Feed>& feeds, std::vector<Tensor>* host_outputs);
  absl::Status CheckOutputs(const PlanStep& step, const RunState& state) const;
  absl::StatusOr<std::vector<Tensor>> DownloadOutputs(const RunState& state) const;
  void ReleaseKept();
  absl::StatusOr<Buffer*> MutableResident(const std::string& name);
  int ValueId(const Value* value) const;

  const Model& model_;
  Backend& backend_;
  ExecutorOptions options_;
  std::unique_ptr<Pool> pool_;

  std::vector<const Value*> values_;  // by value id
  std::map<const Value*, int> value_ids_;
  std::vector<int> last_use_;       // by value id: step index, -1 = none
  std::vector<bool> pinned_;        // never released mid-run
  std::map<int, Buffer> resident_;  // value id -> buffer
  std::vector<PlanStep> steps_;
  std::map<std::vector<std::vector<int64_t>>, Plan> plans_;
  std::map<int, Buffer> kept_;  // value id -> buffer of the last run
  OutputObserver output_observer_;
  std::map<int, std::vector<int>> graph_output_indices_;  // value id -> its output indices
  bool outputs_kept_ = false;   // the last run was RunOnBackend: kept_ holds the outputs
  PlanStats last_stats_;
  std::vector<KernelTime> kernel_times_;  // by step index, with time_kernels
};

}  // namespace castor
