// KernelContext and KernelTable (see kernel.h).
#include "backend/kernel.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace castor {

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

KernelContext::KernelContext(const Node& node, int64_t opset, Backend& backend,
                             std::vector<const TensorView*> inputs, OutputAllocator& allocator)
    : node_(node),
      opset_(opset),
      backend_(backend),
      inputs_(std::move(inputs)),
      allocator_(allocator),
      outputs_(node.num_outputs()),
      host_copies_(node.num_outputs()) {}

void KernelContext::SetHostCopy(int i, Tensor copy) {
  if (i >= 0 && i < num_outputs()) host_copies_[i] = std::make_shared<const Tensor>(std::move(copy));
}

const TensorView& KernelContext::input(int i) const {
  if (!has_input(i)) {
    std::cerr << "castor: internal error: " << node_.op_type() << " kernel for node '"
              << node_.name() << "' read absent input " << i << "\n";
    std::abort();
  }
  return *inputs_[i];
}

absl::StatusOr<TensorView*> KernelContext::Output(int i, std::vector<int64_t> dims) {
  const Value* value = node_.output(i);
  if (value == nullptr || value->dtype() == DType::kUndefined) {
    return Error(absl::StrCat("output ", i, " has no inferred dtype"));
  }
  return Output(i, value->dtype(), std::move(dims));
}

absl::StatusOr<TensorView*> KernelContext::Output(int i, DType dtype,
                                                  std::vector<int64_t> dims) {
  if (i < 0 || i >= num_outputs()) {
    return Error(absl::StrCat("kernel asked for output ", i, " of ", num_outputs()));
  }
  // The byte size must fit int64 (shapes computed from a model's values
  // can be anything).
  int64_t bytes = static_cast<int64_t>(std::max<size_t>(DTypeSize(dtype), 1));
  for (int64_t d : dims) {
    if (d < 0) return Error(absl::StrCat("negative output dim ", d, " for output ", i));
    if (d > 0 && bytes > std::numeric_limits<int64_t>::max() / d) {
      return Error(absl::StrCat("output ", i, " [", absl::StrJoin(dims, ","), "] ",
                                DTypeName(dtype), " is too large to address"));
    }
    bytes *= d;
  }
  TensorView& out = outputs_[i];
  if (out.data != nullptr) return Error(absl::StrCat("output ", i, " allocated twice"));
  out.dtype = dtype;
  out.dims = std::move(dims);
  absl::StatusOr<void*> data = allocator_.AllocateOutput(i, dtype, out.dims);
  if (!data.ok()) {
    // Name the node and the value: "Conv node 'c1': output 'y' float32
    // [64,256,512,512]: cpu: ... would pass the memory budget ...".
    const Value* value = node_.output(i);
    return absl::Status(data.status().code(),
                        absl::StrCat(node_.op_type(), " node '", node_.name(), "': output '",
                                     value != nullptr ? value->name() : std::to_string(i), "' ",
                                     DTypeName(dtype), " [", absl::StrJoin(out.dims, ","),
                                     "]: ", data.status().message()));
  }
  out.data = *data;
  return &out;
}

absl::Status KernelContext::Error(const std::string& message) const {
  return absl::InvalidArgumentError(
      absl::StrCat(node_.op_type(), " node '", node_.name(), "': ", message));
}

absl::Status KernelContext::Unimplemented(const std::string& message) const {
  return absl::UnimplementedError(
      absl::StrCat(node_.op_type(), " node '", node_.name(), "': ", message));
}

void KernelTable::Register(KernelDef def) {
  auto key = std::make_pair(CanonicalDomain(def.domain), def.op_type);
  kernels_[key].push_back(std::move(def));
}

namespace {
std::string NodeDTypes(const Node& node) {
  std::vector<std::string> parts;
  for (const Value* v : node.inputs()) parts.push_back(v ? DTypeName(v->dtype()) : "-");
  std::string outs;
  for (const Value* v : node.outputs()) {
    absl::StrAppend(&outs, outs.empty() ? "" : ",", v ? DTypeName(v->dtype()) : "-");
  }
  return absl::StrCat("(", absl::StrJoin(parts, ","), ") -> (", outs, ")");
}
}  // namespace

absl::StatusOr<const KernelDef*> KernelTable::Find(const Node& node) const {
  auto it = kernels_.find(std::make_pair(CanonicalDomain(node.domain()), node.op_type()));
  std::string where = absl::StrCat(node.op_type(), " node '", node.name(), "' ",
                                   NodeDTypes(node));
  if (it == kernels_.end()) {
    return absl::UnimplementedError(absl::StrCat(where, ": no kernel for this op"));
  }
  std::vector<std::string> reasons;
  for (const KernelDef& def : it->second) {
    if (!def.supports) return &def;
    absl::Status status = def.supports(node);
    if (status.ok()) return &def;
    reasons.push_back(std::string(status.message()));
  }
  return absl::UnimplementedError(
      absl::StrCat(where, ": no kernel supports it (", absl::StrJoin(reasons, "; "), ")"));
}

bool KernelTable::HasOp(const std::string& domain, const std::string& op_type) const {
  return kernels_.count(std::make_pair(CanonicalDomain(domain), op_type)) > 0;
}

std::vector<std::pair<std::string, std::string>> KernelTable::Ops() const {
  std::vector<std::pair<std::string, std::string>> ops;
  for (const auto& [key, defs] : kernels_) ops.push_back(key);
  return ops;
}

namespace {
bool Contains(const std::vector<DType>& dtypes, DType dtype) {
  for (DType d : dtypes) {
    if (d == dtype) return true;
  }
  return false;
}
std::string Names(const std::vector<DType>& dtypes) {
  std::vector<std::string> names;
  for (DType d : dtypes) names.push_back(DTypeName(d));
  return absl::StrJoin(names, "/");
}
}  // namespace

SupportsFn FloatDTypesIn(std::vector<DType> dtypes) {
  return [dtypes](const Node& node) -> absl::Status {
    auto check = [&](const Value* v) -> absl::Status {
      if (v == nullptr || !IsFloatingPoint(v->dtype()) || Contains(dtypes, v->dtype())) {
        return absl::OkStatus();
      }
      return absl::UnimplementedError(absl::StrCat("'", v->name(), "' is ",
                                                   DTypeName(v->dtype()), ", kernel takes ",
                                                   Names(dtypes)));
    };
    for (const Value* v : node.inputs()) {
      if (absl::Status s = check(v); !s.ok()) return s;
    }
    for (const Value* v : node.outputs()) {
      if (absl::Status s = check(v); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
}

SupportsFn InputDTypeIn(int index, std::vector<DType> dtypes) {
  return [index, dtypes](const Node& node) -> absl::Status {
    const Value* v = node.input(index);
    if (v != nullptr && Contains(dtypes, v->dtype())) return absl::OkStatus();
    return absl::UnimplementedError(absl::StrCat(
        "input ", index, " is ", v ? DTypeName(v->dtype()) : "absent", ", kernel takes ",
        Names(dtypes)));
  };
}

}  // namespace castor
