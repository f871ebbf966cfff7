// Test helpers for kernels: build a one-node model, infer its types, run the
// node on a backend with host tensors and compare results; the shared CPU
// backend, tensor makers and readers, tolerance checks, and a walker that
// runs the ONNX node conformance cases of a set of ops.
//
//   SingleNode n("Add", {a, b}, {}, /*opset=*/17);
//   ASSERT_OK_AND_ASSIGN-style: auto out = n.Run(backend);  // std::vector<Tensor>
//   std::vector<Tensor> y = RunOk("Add", {F32({2}, {1, 2}), F32({}, {3})});
//
// Test files pull the helpers they use in with `using testing::Name;`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/kernel.h"
#include "backend/run_node.h"
#include "graph/graph.h"
#include "graph/half.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "graph/tensor.h"
#include "gtest/gtest.h"

namespace castor {

// gtest printing of a Tensor: dtype, dims and the first 24 elements.
inline void PrintTo(const Tensor& t, std::ostream* os) {
  *os << DTypeName(t.dtype()) << " " << t.shape().ToString() << " {";
  for (int64_t i = 0; i < std::min<int64_t>(t.num_elements(), 24); ++i) {
    *os << (i ? ", " : "") << t.GetDouble(i);
  }
  *os << (t.num_elements() > 24 ? ", ...}" : "}");
}

}  // namespace castor

namespace castor::testing {

class SingleNode {
 public:
  // `inputs[i]` with dtype kUndefined is an omitted optional input. Inputs are
  // graph inputs (not initializers) unless `constant_inputs` lists their index.
  SingleNode(const std::string& op_type, std::vector<Tensor> inputs,
             std::vector<Attribute> attributes, int64_t opset, int num_outputs = 1,
             const std::string& domain = "", std::vector<int> constant_inputs = {})
      : inputs_(std::move(inputs)) {
    model_.ir_version = 8;
    model_.opset_imports.push_back({"", domain.empty() ? opset : 17});
    if (!domain.empty()) model_.opset_imports.push_back({domain, opset});
    opset_ = opset;
    Graph& g = *model_.graph;
    std::vector<Value*> values;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      if (inputs_[i].dtype() == DType::kUndefined) {
        values.push_back(nullptr);
        continue;
      }
      std::string name = absl::StrCat("in", i);
      bool constant = false;
      for (int c : constant_inputs) constant |= (c == static_cast<int>(i));
      absl::StatusOr<Value*> v =
          constant ? g.AddInitializer(name, inputs_[i])
                   : g.AddInput(name, inputs_[i].dtype(), inputs_[i].shape());
      status_ = v.status();
      if (!status_.ok()) return;
      values.push_back(*v);
    }
    std::vector<std::string> outs;
    for (int i = 0; i < num_outputs; ++i) outs.push_back(absl::StrCat("out", i));
    absl::StatusOr<Node*> node = g.AddNode(op_type, values, outs, "node", domain);
    status_ = node.status();
    if (!status_.ok()) return;
    node_ = *node;
    for (Attribute& a : attributes) node_->SetAttribute(std::move(a));
    for (Value* out : node_->outputs()) g.AddOutput(out);
    status_ = InferTypes(model_);
  }

  const absl::Status& status() const { return status_; }
  const Node& node() const { return *node_; }
  Model& model() { return model_; }

  absl::StatusOr<std::vector<Tensor>> Run(Backend& backend) {
    if (!status_.ok()) return status_;
    std::vector<const Tensor*> ptrs;
    for (const Tensor& t : inputs_) ptrs.push_back(t.dtype() == DType::kUndefined ? nullptr : &t);
    return RunNode(backend, *node_, opset_, ptrs);
  }

 private:
  Model model_;
  std::vector<Tensor> inputs_;
  Node* node_ = nullptr;
  int64_t opset_ = 0;
  absl::Status status_;
};

// ---- Status and backend ----------------------------------------------------------

// The value of `result`; a failure is reported and aborts the test binary.
template <typename T>
T ValueOrDie(absl::StatusOr<T> result) {
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) std::abort();
  return *std::move(result);
}

// The test binary's CPU backend, created on first use and never destroyed.
// It runs at least 4 threads (every hardware thread on larger machines), so
// the threaded kernel paths run even on a small machine.
inline CpuBackend& Cpu() {
  static CpuBackend* backend = new CpuBackend(CpuBackendOptions{
      std::max(4, static_cast<int>(std::thread::hardware_concurrency()))});
  return *backend;
}

// ---- Tensor makers and readers ---------------------------------------------------

// Tensors of one dtype holding `values` (16-bit floats: each value rounded
// once to the dtype; Bool: 0/1 bytes).
inline Tensor F32(std::vector<int64_t> dims, const std::vector<float>& values) {
  return Tensor::FromVector(DType::kFloat32, std::move(dims), values);
}
inline Tensor F64(std::vector<int64_t> dims, const std::vector<double>& values) {
  return Tensor::FromVector(DType::kFloat64, std::move(dims), values);
}
inline Tensor F16(std::vector<int64_t> dims, const std::vector<float>& values) {
  std::vector<uint16_t> bits;
  for (float f : values) bits.push_back(FloatToHalfBits(f));
  return Tensor::FromVector(DType::kFloat16, std::move(dims), bits);
}
inline Tensor BF16(std::vector<int64_t> dims, const std::vector<float>& values) {
  std::vector<uint16_t> bits;
  for (float f : values) bits.push_back(FloatToBFloat16Bits(f));
  return Tensor::FromVector(DType::kBFloat16, std::move(dims), bits);
}
inline Tensor I32(std::vector<int64_t> dims, const std::vector<int32_t>& values) {
  return Tensor::FromVector(DType::kInt32, std::move(dims), values);
}
inline Tensor I64(std::vector<int64_t> dims, const std::vector<int64_t>& values) {
  return Tensor::FromVector(DType::kInt64, std::move(dims), values);
}
inline Tensor I8(std::vector<int64_t> dims, const std::vector<int8_t>& values) {
  return Tensor::FromVector(DType::kInt8, std::move(dims), values);
}
inline Tensor U8(std::vector<int64_t> dims, const std::vector<uint8_t>& values) {
  return Tensor::FromVector(DType::kUInt8, std::move(dims), values);
}
inline Tensor Bool(std::vector<int64_t> dims, const std::vector<uint8_t>& values) {
  return Tensor::FromVector(DType::kBool, std::move(dims), values);
}

// A tensor of `dtype` (float or int32/int64) holding `values`, each rounded
// to the dtype.
inline Tensor Make(DType dtype, const std::vector<int64_t>& dims,
                   const std::vector<double>& values) {
  Tensor t(dtype, dims);
  if (static_cast<int64_t>(values.size()) != t.num_elements()) {
    ADD_FAILURE() << "Make: " << values.size() << " values for " << t.num_elements()
                  << " elements";
    return t;
  }
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    const double v = values[i];
    switch (dtype) {
      case DType::kFloat32: t.data<float>()[i] = static_cast<float>(v); break;
      case DType::kFloat64: t.data<double>()[i] = v; break;
      case DType::kFloat16: t.data<uint16_t>()[i] = FloatToHalfBits(static_cast<float>(v)); break;
      case DType::kBFloat16:
        t.data<uint16_t>()[i] = FloatToBFloat16Bits(static_cast<float>(v));
        break;
      case DType::kInt32: t.data<int32_t>()[i] = static_cast<int32_t>(v); break;
      case DType::kInt64: t.data<int64_t>()[i] = static_cast<int64_t>(v); break;
      default: ADD_FAILURE() << "Make: unsupported dtype " << DTypeName(dtype); break;
    }
  }
  return t;
}

// Every element of `t` as a double.
inline std::vector<double> Values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.num_elements()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = t.GetDouble(static_cast<int64_t>(i));
  return v;
}

// The raw 16-bit patterns of a float16/bfloat16 tensor.
inline std::vector<uint16_t> Bits(const Tensor& t) {
  return std::vector<uint16_t>(t.data<uint16_t>(), t.data<uint16_t>() + t.num_elements());
}

// The values as float32 would store them after one rounding to `dtype`.
inline std::vector<double> RoundTo(DType dtype, const std::vector<double>& values) {
  return Values(Make(dtype, {static_cast<int64_t>(values.size())}, values));
}

// ---- Test data -------------------------------------------------------------------

// The number of elements of a tensor of `dims`.
inline int64_t Count(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// The row-major index (one entry per dim) of flat element `flat` of `dims`.
inline std::vector<int64_t> Unravel(int64_t flat, const std::vector<int64_t>& dims) {
  std::vector<int64_t> index(dims.size());
  for (size_t d = dims.size(); d-- > 0;) {
    index[d] = flat % dims[d];
    flat /= dims[d];
  }
  return index;
}

// `n` values uniform in [-1, 1), or small integers in [-3, 3] when `integers`
// (deterministic for a seed).
inline std::vector<double> Random(int64_t n, unsigned seed, bool integers = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = integers ? small(rng) : real(rng);
  return v;
}

// `n` deterministic float32 values spread over offset + [-scale, scale].
inline std::vector<float> Ramp(int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v[i] = offset + scale * static_cast<float>((i * 37) % 101 - 50) / 50.0f;
  }
  return v;
}

// ---- Running one node ------------------------------------------------------------

// Host memory for a kernel called directly (KernelContext): one buffer per
// output index, reused across calls (timing then sees the kernel only),
// and a record of which outputs the kernel allocated.
class HostOutputAllocator : public OutputAllocator {
 public:
  absl::StatusOr<void*> AllocateOutput(int index, DType dtype,
                                       const std::vector<int64_t>& dims) override {
    std::vector<char>& buffer = outputs_[index];
    buffer.resize(static_cast<size_t>(Count(dims)) * DTypeSize(dtype));
    return static_cast<void*>(buffer.data());
  }
  absl::StatusOr<void*> AllocateScratch(size_t bytes) override {
    scratch_.emplace_back(bytes);
    return static_cast<void*>(scratch_.back().data());
  }
  bool allocated(int index) const { return outputs_.count(index) > 0; }
  const float* floats(int index) const {
    return reinterpret_cast<const float*>(outputs_.at(index).data());
  }

 private:
  std::map<int, std::vector<char>> outputs_;
  std::vector<std::vector<char>> scratch_;
};


// Builds and runs one node (see SingleNode) on the CPU backend.
inline absl::StatusOr<std::vector<Tensor>> RunNodeOf(const std::string& op,
                                                     std::vector<Tensor> inputs,
                                                     std::vector<Attribute> attributes,
                                                     int64_t opset, int outputs = 1,
                                                     const std::string& domain = "",
                                                     std::vector<int> constant_inputs = {}) {
  SingleNode node(op, std::move(inputs), std::move(attributes), opset, outputs, domain,
                  std::move(constant_inputs));
  if (!node.status().ok()) return node.status();
  return node.Run(Cpu());
}

// Runs one node on the CPU backend and expects success; returns its
// outputs (`outputs` empty tensors after reporting a failure).
inline std::vector<Tensor> RunOk(const std::string& op, std::vector<Tensor> inputs,
                                 std::vector<Attribute> attributes = {}, int64_t opset = 17,
                                 int outputs = 1, const std::string& domain = "") {
  absl::StatusOr<std::vector<Tensor>> result =
      RunNodeOf(op, std::move(inputs), std::move(attributes), opset, outputs, domain);
  EXPECT_TRUE(result.ok()) << op << ": " << result.status();
  if (!result.ok()) return std::vector<Tensor>(outputs);
  return *std::move(result);
}

// Runs one node on the CPU backend and expects success; returns its output
// 0 (an empty tensor after reporting a failure).
inline Tensor RunOp(const std::string& op, std::vector<Tensor> inputs,
                    std::vector<Attribute> attributes = {}, int64_t opset = 17) {
  return RunOk(op, std::move(inputs), std::move(attributes), opset)[0];
}

// Leaves a freed buffer of `dims` and `dtype` full of NaN, where the
// allocator is likely to hand out the next buffer of that size: a kernel
// run just after that fails to write some output element shows a NaN
// there. (Make the kernel's inputs first, so that they do not take it.)
inline void PoisonFreedMemory(DType dtype, const std::vector<int64_t>& dims) {
  int64_t count = 1;
  for (int64_t d : dims) count *= d;
  const std::vector<double> nans(static_cast<size_t>(count),
                                 std::numeric_limits<double>::quiet_NaN());
  RunOp("Identity", {Make(dtype, dims, nans)});
}

// ---- Comparing -------------------------------------------------------------------

// Byte-identical tensors (same dtype and dims).
inline bool SameBits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.dims() == b.dims() &&
         std::memcmp(a.raw(), b.raw(), a.byte_size()) == 0;
}

// Expects every element of `actual` within atol + rtol * |expected| of
// `expected` (reports the first five that are not); `what` names the check.
inline void ExpectNear(const std::vector<double>& expected, const Tensor& actual, double rtol,
                       double atol, const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(expected.size()), actual.num_elements()) << what;
  int bad = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double a = actual.GetDouble(static_cast<int64_t>(i));
    if (!(std::fabs(a - expected[i]) <= atol + rtol * std::fabs(expected[i]))) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << ": element " << i << " is " << a << ", expected "
                      << expected[i];
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// Compares `got` with `expected`: same dtype and dims; floats within
// atol + rtol * |expected| (NaN matches NaN, equal infinities match), other
// dtypes exactly.
inline absl::Status CompareTensors(const Tensor& got, const Tensor& expected, double rtol,
                                   double atol) {
  if (got.dtype() != expected.dtype() || got.dims() != expected.dims()) {
    return absl::InternalError(
        absl::StrCat("got ", DTypeName(got.dtype()), " ", got.shape().ToString(), ", expected ",
                     DTypeName(expected.dtype()), " ", expected.shape().ToString()));
  }
  for (int64_t i = 0; i < got.num_elements(); ++i) {
    if (IsFloatingPoint(got.dtype())) {
      const double g = got.GetDouble(i), e = expected.GetDouble(i);
      if (std::isnan(e) && std::isnan(g)) continue;
      if (g == e) continue;
      if (!(std::fabs(g - e) <= atol + rtol * std::fabs(e))) {
        return absl::InternalError(absl::StrCat("element ", i, ": got ", g, ", expected ", e));
      }
    } else if (got.GetInt64(i) != expected.GetInt64(i)) {
      return absl::InternalError(absl::StrCat("element ", i, ": got ", got.GetInt64(i),
                                              ", expected ", expected.GetInt64(i)));
    }
  }
  return absl::OkStatus();
}

// ---- ONNX node conformance cases -------------------------------------------------

// The folder of the ONNX node conformance cases: <case>/model.onnx and
// <case>/test_data_set_0/{input,output}_K.pb.
inline std::filesystem::path ConformanceRoot() {
  return std::filesystem::path(CASTOR_SHARED_DIR) / "conformance" / "onnx-node";
}

// Runs the single node of conformance case `dir` (its loaded `model`) on
// `backend`: infers types, feeds input_K.pb to graph input K (initializers
// as they are), and compares every graph output with output_K.pb (rtol
// 1e-3, atol 1e-7; see CompareTensors).
inline absl::Status RunConformanceCase(Backend& backend, const std::filesystem::path& dir,
                                       Model& model) {
  if (absl::Status s = InferTypes(model); !s.ok()) {
    return absl::InternalError(absl::StrCat("InferTypes: ", s.message()));
  }
  const Graph& graph = *model.graph;
  if (graph.num_nodes() != 1) return absl::InternalError("not a single-node model");
  const Node& node = *graph.nodes()[0];
  const std::filesystem::path data = dir / "test_data_set_0";
  std::vector<Tensor> graph_inputs;
  for (size_t k = 0; k < graph.inputs().size(); ++k) {
    absl::StatusOr<Tensor> t =
        LoadTensorProtoFile((data / ("input_" + std::to_string(k) + ".pb")).string());
    if (!t.ok()) return t.status();
    graph_inputs.push_back(*std::move(t));
  }
  std::vector<const Tensor*> inputs;
  for (const Value* v : node.inputs()) {
    const Tensor* tensor = nullptr;
    for (size_t k = 0; v != nullptr && k < graph.inputs().size(); ++k) {
      if (graph.inputs()[k] == v) tensor = &graph_inputs[k];
    }
    if (v != nullptr && tensor == nullptr) tensor = v->initializer();
    if (v != nullptr && tensor == nullptr) {
      return absl::InternalError(absl::StrCat("no data for node input '", v->name(), "'"));
    }
    inputs.push_back(tensor);
  }
  absl::StatusOr<std::vector<Tensor>> outputs =
      RunNode(backend, node, model.OpsetVersion(node.domain()), inputs);
  if (!outputs.ok()) return outputs.status();
  for (size_t k = 0; k < graph.outputs().size(); ++k) {
    absl::StatusOr<Tensor> expected =
        LoadTensorProtoFile((data / ("output_" + std::to_string(k) + ".pb")).string());
    if (!expected.ok()) return expected.status();
    int slot = -1;
    for (int o = 0; o < node.num_outputs(); ++o) {
      if (node.output(o) == graph.outputs()[k]) slot = o;
    }
    if (slot < 0 || slot >= static_cast<int>(outputs->size())) {
      return absl::InternalError(absl::StrCat("graph output ", k, " is not the node's"));
    }
    absl::Status s = CompareTensors((*outputs)[slot], *expected, 1e-3, 1e-7);
    if (!s.ok()) return absl::InternalError(absl::StrCat("output ", k, ": ", s.message()));
  }
  return absl::OkStatus();
}

// What RunConformanceCasesOf found: single-node cases that passed, those
// that failed ("<case>: <why>"), and multi-node cases (not run).
struct ConformanceSummary {
  int passed = 0;
  std::vector<std::string> failures;
  std::vector<std::string> multi_node;

  int ran() const { return passed + static_cast<int>(failures.size()); }
};

// Runs, in name order, every conformance case whose model loads and has
// nodes, all of them of an op in `ops`; cases of more than one node are
// only listed. Nothing is found when ConformanceRoot() is missing.
inline ConformanceSummary RunConformanceCasesOf(Backend& backend,
                                                const std::set<std::string>& ops) {
  ConformanceSummary summary;
  const std::filesystem::path root = ConformanceRoot();
  if (!std::filesystem::is_directory(root)) return summary;
  std::vector<std::filesystem::path> dirs;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    dirs.push_back(entry.path());
  }
  std::sort(dirs.begin(), dirs.end());
  for (const std::filesystem::path& dir : dirs) {
    absl::StatusOr<Model> model = LoadModel((dir / "model.onnx").string());
    if (!model.ok()) continue;
    const Graph& graph = *model->graph;
    bool ours = !graph.nodes().empty();
    for (const Node* n : graph.nodes()) ours = ours && ops.count(n->op_type()) > 0;
    if (!ours) continue;
    const std::string name = dir.filename().string();
    if (graph.num_nodes() != 1) {
      summary.multi_node.push_back(name);
      continue;
    }
    absl::Status status = RunConformanceCase(backend, dir, *model);
    if (status.ok()) {
      ++summary.passed;
    } else {
      summary.failures.push_back(absl::StrCat(name, ": ", status.message()));
    }
  }
  return summary;
}

}  // namespace castor::testing
