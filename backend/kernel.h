// The one signature every kernel of every backend shares.
//
// A kernel is `absl::Status Fn(KernelContext&)`. It reads its node's
// attributes and inputs from the context, asks the context for each output
// buffer once it knows the output's dims (so data-dependent shapes such as
// Reshape's or Range's need no special planning), and writes the result.
// The context is backend-neutral: TensorView::data points into the memory of
// the backend that runs the kernel (host memory for the CPU backend, device
// memory for CUDA); `backend()` gives backend-specific services (threads,
// stream, scratch).
//
// Kernels are registered per (domain, op_type) in a KernelTable, with a
// `supports` predicate saying which dtypes (or attribute values) the kernel
// handles; the executor picks the first registered kernel that supports a
// node, so a specialised kernel (e.g. float32 GEMM through BLAS) is
// registered before a generic one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graph/dtype.h"
#include "graph/graph.h"

namespace castor {

class Backend;

// A dense row-major tensor in some backend's memory. Does not own `data`.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> dims;
  // A host copy of the same elements when the executor has one (small
  // integer tensors: shapes, axes, labels), so a device kernel that needs
  // the values on the host reads them without waiting for the device.
  // Valid while the kernel runs.
  const void* host_data = nullptr;

  int64_t num_elements() const;
  size_t byte_size() const { return static_cast<size_t>(num_elements()) * DTypeSize(dtype); }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

// Allocates output buffers for one kernel call. Implemented by the executor
// (buffer reuse by liveness, in-place aliasing) and by test harnesses.
class OutputAllocator {
 public:
  virtual ~OutputAllocator() = default;
  // Memory for output `index` of the running node, `bytes` long (may be 0).
  virtual absl::StatusOr<void*> AllocateOutput(int index, DType dtype,
                                               const std::vector<int64_t>& dims) = 0;
  // Temporary memory valid until the kernel returns.
  virtual absl::StatusOr<void*> AllocateScratch(size_t bytes) = 0;
};

class KernelContext {
 public:
  // `inputs[i]` is nullptr for an omitted optional input.
  KernelContext(const Node& node, int64_t opset, Backend& backend,
                std::vector<const TensorView*> inputs, OutputAllocator& allocator);

  const Node& node() const { return node_; }
  // Opset version of the node's domain in the model.
  int64_t opset() const { return opset_; }
  Backend& backend() const { return backend_; }

  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  bool has_input(int i) const { return i < num_inputs() && inputs_[i] != nullptr; }
  // Input `i`; calling it for an absent input is a programming error.
  const TensorView& input(int i) const;

  int num_outputs() const { return node_.num_outputs(); }
  // Whether the graph has a value for optional output `i` (ONNX leaves
  // unwanted optional outputs out or names them "").
  bool has_output(int i) const { return node_.output(i) != nullptr; }
  // Whether anything reads output `i`: a node (or subgraph) uses its value,
  // it is a graph output, or the caller keeps it (SetKeptOutputs). The
  // autodiff emits every output of a gradient op, and the graph cannot
  // leave one out in the middle (ConvGrad's dX of the input image is output
  // 0), so gradient kernels skip the outputs nothing reads.
  bool output_read(int i) const {
    const Value* value = node_.output(i);
    return value != nullptr && (!value->uses().empty() || value->is_graph_output() ||
                                (i < static_cast<int>(kept_outputs_.size()) && kept_outputs_[i]));
  }
  // Outputs the caller reads after the run although no node does (the
  // executor's keep_values), indexed like the outputs.
  void SetKeptOutputs(std::vector<bool> kept) { kept_outputs_ = std::move(kept); }
  // Allocates output `i` with `dims` and the dtype inferred for the node's
  // output value. Call at most once per output.
  absl::StatusOr<TensorView*> Output(int i, std::vector<int64_t> dims);
  // Same, with an explicit dtype (for outputs whose value has no inferred type).
  absl::StatusOr<TensorView*> Output(int i, DType dtype, std::vector<int64_t> dims);
  absl::StatusOr<void*> Scratch(size_t bytes) { return allocator_.AllocateScratch(bytes); }
  // The outputs allocated so far (index = output slot).
  const std::vector<TensorView>& outputs() const { return outputs_; }
  // Hands the executor a host copy of output `i` (values the kernel had on
  // the host anyway, e.g. Shape's), which later kernels see as host_data.
  void SetHostCopy(int i, Tensor copy);
  const std::shared_ptr<const Tensor>& host_copy(int i) const { return host_copies_[i]; }

  // Attribute reads with defaults (see Node).
  int64_t GetInt(const std::string& name, int64_t default_value) const {
    return node_.GetInt(name, default_value);
  }
  float GetFloat(const std::string& name, float default_value) const {
    return node_.GetFloat(name, default_value);
  }
  std::string GetString(const std::string& name, const std::string& default_value) const {
    return node_.GetString(name, default_value);
  }
  std::vector<int64_t> GetInts(const std::string& name,
                               std::vector<int64_t> default_value = {}) const {
    return node_.GetInts(name, std::move(default_value));
  }

  // InvalidArgument / Unimplemented errors prefixed with "<op> node '<name>': ".
  absl::Status Error(const std::string& message) const;
  absl::Status Unimplemented(const std::string& message) const;

 private:
  const Node& node_;
  int64_t opset_;
  Backend& backend_;
  std::vector<const TensorView*> inputs_;
  OutputAllocator& allocator_;
  std::vector<TensorView> outputs_;
  std::vector<std::shared_ptr<const Tensor>> host_copies_;
  std::vector<bool> kept_outputs_;
};

using KernelFn = absl::Status (*)(KernelContext&);
// OK when the kernel handles this node (its input/output dtypes, attribute
// values), else an error saying what it does not handle.
using SupportsFn = std::function<absl::Status(const Node&)>;

struct KernelDef {
  std::string domain;  // "" = ai.onnx
  std::string op_type;
  SupportsFn supports;  // empty: handles every node of this op type
  KernelFn run = nullptr;
  // Output 0 may share input 0's buffer (elementwise ops that read each
  // element before writing it). The executor decides whether it does, and
  // does only when output 0 has input 0's dtype and byte size.
  bool in_place_ok = false;
};

// The kernels of one backend.
class KernelTable {
 public:
  void Register(KernelDef def);
  // The first registered kernel that supports `node`, or an Unimplemented
  // error naming the node, op and dtypes and each candidate's reason.
  absl::StatusOr<const KernelDef*> Find(const Node& node) const;
  bool HasOp(const std::string& domain, const std::string& op_type) const;
  // (domain, op_type) pairs with at least one kernel, sorted.
  std::vector<std::pair<std::string, std::string>> Ops() const;

 private:
  std::map<std::pair<std::string, std::string>, std::vector<KernelDef>> kernels_;
};

// A SupportsFn accepting nodes whose float inputs and outputs (all of those
// with a float dtype) are among `dtypes`; non-float inputs are not checked.
SupportsFn FloatDTypesIn(std::vector<DType> dtypes);
// A SupportsFn accepting nodes whose input `index` has one of `dtypes`.
SupportsFn InputDTypeIn(int index, std::vector<DType> dtypes);

}  // namespace castor
