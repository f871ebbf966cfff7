// Structural model comparison (see graph/compare.h). Each helper returns ""
// for "equal" or the first difference; callers prefix where it was found.
#include "graph/compare.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace castor {
namespace {

std::string Quote(const std::string& s) { return absl::StrCat("\"", s, "\""); }

// Compares one field; returns "<what> <a> vs <b>" when they differ.
template <typename T>
std::string CompareField(const char* what, const T& a, const T& b) {
  if (a == b) return "";
  if constexpr (std::is_same_v<T, std::string>) {
    return absl::StrCat(what, " ", Quote(a), " vs ", Quote(b));
  } else {
    return absl::StrCat(what, " ", a, " vs ", b);
  }
}

std::string Prefixed(const std::string& prefix, const std::string& difference) {
  return difference.empty() ? "" : absl::StrCat(prefix, difference);
}

std::string ValueName(const Value* value) { return value ? value->name() : std::string(); }

std::string NameList(const std::vector<Value*>& values) {
  std::vector<std::string> names;
  for (const Value* v : values) names.push_back(ValueName(v));
  return absl::StrCat("[", absl::StrJoin(names, ", "), "]");
}

std::string PairList(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::vector<std::string> items;
  for (const auto& [key, value] : pairs) items.push_back(absl::StrCat(key, "=", Quote(value)));
  return absl::StrCat("{", absl::StrJoin(items, ", "), "}");
}

std::string OpsetList(const std::vector<OpsetImport>& opsets) {
  std::vector<std::string> items;
  for (const OpsetImport& o : opsets) {
    items.push_back(absl::StrCat(o.domain.empty() ? "ai.onnx" : o.domain, ":", o.version));
  }
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

std::string CompareBytesList(const char* what, const std::vector<std::string>& a,
                             const std::vector<std::string>& b) {
  if (a.size() != b.size()) return absl::StrCat(what, " count ", a.size(), " vs ", b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k] != b[k]) {
      return absl::StrCat(what, " ", k, " differs (", a[k].size(), " vs ", b[k].size(),
                          " serialized bytes)");
    }
  }
  return "";
}

// dtype, shape, doc string and value_info flag of a value.
std::string DescribeValueTypeDifference(const Value& a, const Value& b) {
  if (a.dtype() != b.dtype()) {
    return absl::StrCat("dtype ", DTypeName(a.dtype()), " vs ", DTypeName(b.dtype()));
  }
  if (a.shape() != b.shape()) {
    return absl::StrCat("shape ", a.shape().ToString(), " vs ", b.shape().ToString());
  }
  if (a.has_value_info() != b.has_value_info()) {
    return absl::StrCat("has_value_info ", a.has_value_info(), " vs ", b.has_value_info());
  }
  return CompareField("doc_string", a.doc_string(), b.doc_string());
}

std::string DescribeInitializerDifference(const Value& a, const Value& b) {
  if ((a.initializer() == nullptr) != (b.initializer() == nullptr)) {
    return absl::StrCat("initializer ", a.initializer() ? "present" : "absent", " vs ",
                        b.initializer() ? "present" : "absent");
  }
  if (a.initializer() == nullptr) return "";
  return Prefixed("initializer ", DescribeTensorDifference(*a.initializer(), *b.initializer()));
}

std::string DescribeAttributeDifference(const Attribute& a, const Attribute& b) {
  if (a == b) return "";
  const std::string prefix = absl::StrCat("attribute '", a.name, "' ");
  if (a.name != b.name) return absl::StrCat("attribute name '", a.name, "' vs '", b.name, "'");
  if (a.kind != b.kind) {
    return absl::StrCat(prefix, "kind ", AttrKindName(a.kind), " vs ", AttrKindName(b.kind));
  }
  if (a.doc_string != b.doc_string) {
    return absl::StrCat(prefix, CompareField("doc_string", a.doc_string, b.doc_string));
  }
  if (a.ref_attr_name != b.ref_attr_name) {
    return absl::StrCat(prefix, CompareField("ref_attr_name", a.ref_attr_name, b.ref_attr_name));
  }
  if (std::string d = DescribeTensorDifference(a.t, b.t); !d.empty()) {
    return absl::StrCat(prefix, "tensor ", d);
  }
  if (a.tensors.size() != b.tensors.size()) {
    return absl::StrCat(prefix, "tensor count ", a.tensors.size(), " vs ", b.tensors.size());
  }
  for (size_t k = 0; k < a.tensors.size(); ++k) {
    if (std::string d = DescribeTensorDifference(a.tensors[k], b.tensors[k]); !d.empty()) {
      return absl::StrCat(prefix, "tensor ", k, " ", d);
    }
  }
  if (std::string d = CompareBytesList("serialized element", a.serialized, b.serialized);
      !d.empty()) {
    return absl::StrCat(prefix, d);
  }
  const std::string shown_a = a.ToString();
  const std::string shown_b = b.ToString();
  if (shown_a != shown_b) return absl::StrCat(prefix, shown_a, " vs ", shown_b);
  return absl::StrCat(prefix, "values differ (same rendering ", shown_a, ")");
}

std::string DescribeNodeDifference(const Node& a, const Node& b) {
  if (std::string d = CompareField("name", a.name(), b.name()); !d.empty()) return d;
  if (std::string d = CompareField("op_type", a.op_type(), b.op_type()); !d.empty()) return d;
  if (std::string d = CompareField("domain", a.domain(), b.domain()); !d.empty()) return d;
  if (NameList(a.inputs()) != NameList(b.inputs())) {
    return absl::StrCat("inputs ", NameList(a.inputs()), " vs ", NameList(b.inputs()));
  }
  if (NameList(a.outputs()) != NameList(b.outputs())) {
    return absl::StrCat("outputs ", NameList(a.outputs()), " vs ", NameList(b.outputs()));
  }
  if (NameList(a.implicit_inputs()) != NameList(b.implicit_inputs())) {
    return absl::StrCat("implicit inputs ", NameList(a.implicit_inputs()), " vs ",
                        NameList(b.implicit_inputs()));
  }
  for (int k = 0; k < a.num_outputs(); ++k) {
    const Value& va = *a.outputs()[k];
    if (std::string d = DescribeValueTypeDifference(va, *b.outputs()[k]); !d.empty()) {
      return absl::StrCat("output '", va.name(), "' ", d);
    }
  }
  const size_t common = std::min(a.attributes().size(), b.attributes().size());
  for (size_t k = 0; k < common; ++k) {
    if (std::string d = DescribeAttributeDifference(a.attributes()[k], b.attributes()[k]);
        !d.empty()) {
      return d;
    }
  }
  if (a.attributes().size() != b.attributes().size()) {
    const auto& longer = a.attributes().size() > b.attributes().size() ? a : b;
    return absl::StrCat("attribute count ", a.attributes().size(), " vs ",
                        b.attributes().size(), " (first extra: '",
                        longer.attributes()[common].name, "')");
  }
  if (std::string d = CompareField("doc_string", a.doc_string(), b.doc_string()); !d.empty()) {
    return d;
  }
  if (a.metadata() != b.metadata()) {
    return absl::StrCat("metadata ", PairList(a.metadata()), " vs ", PairList(b.metadata()));
  }
  return "";
}

std::string DescribeGraphDifference(const Graph& a, const Graph& b) {
  if (std::string d = CompareField("graph name", a.name(), b.name()); !d.empty()) return d;
  if (std::string d = CompareField("graph doc_string", a.doc_string(), b.doc_string());
      !d.empty()) {
    return d;
  }
  if (NameList(a.inputs()) != NameList(b.inputs())) {
    return absl::StrCat("graph inputs ", NameList(a.inputs()), " vs ", NameList(b.inputs()));
  }
  for (size_t k = 0; k < a.inputs().size(); ++k) {
    const Value& va = *a.inputs()[k];
    const Value& vb = *b.inputs()[k];
    const std::string prefix = absl::StrCat("graph input ", k, " '", va.name(), "': ");
    if (std::string d = DescribeValueTypeDifference(va, vb); !d.empty()) return prefix + d;
    if (std::string d = DescribeInitializerDifference(va, vb); !d.empty()) return prefix + d;
  }
  if (NameList(a.initializers()) != NameList(b.initializers())) {
    return absl::StrCat("initializers ", NameList(a.initializers()), " vs ",
                        NameList(b.initializers()));
  }
  for (size_t k = 0; k < a.initializers().size(); ++k) {
    const Value& va = *a.initializers()[k];
    const Value& vb = *b.initializers()[k];
    const std::string prefix = absl::StrCat("initializer ", k, " '", va.name(), "': ");
    if (std::string d = DescribeValueTypeDifference(va, vb); !d.empty()) return prefix + d;
    if (std::string d = DescribeInitializerDifference(va, vb); !d.empty()) return prefix + d;
  }
  const int common = std::min(a.num_nodes(), b.num_nodes());
  for (int k = 0; k < common; ++k) {
    const Node& na = *a.nodes()[k];
    if (std::string d = DescribeNodeDifference(na, *b.nodes()[k]); !d.empty()) {
      return absl::StrCat("node ", k, " '", na.name(), "': ", d);
    }
  }
  if (a.num_nodes() != b.num_nodes()) {
    const Graph& longer = a.num_nodes() > b.num_nodes() ? a : b;
    return absl::StrCat("node count ", a.num_nodes(), " vs ", b.num_nodes(), " (first extra: '",
                        longer.nodes()[common]->name(), "' ", longer.nodes()[common]->op_type(),
                        ")");
  }
  if (NameList(a.outputs()) != NameList(b.outputs())) {
    return absl::StrCat("graph outputs ", NameList(a.outputs()), " vs ", NameList(b.outputs()));
  }
  for (size_t k = 0; k < a.outputs().size(); ++k) {
    const Value& va = *a.outputs()[k];
    if (std::string d = DescribeValueTypeDifference(va, *b.outputs()[k]); !d.empty()) {
      return absl::StrCat("graph output ", k, " '", va.name(), "': ", d);
    }
  }
  return "";
}

}  // namespace

std::string DescribeTensorDifference(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    return absl::StrCat("dtype ", DTypeName(a.dtype()), " vs ", DTypeName(b.dtype()));
  }
  if (a.dims() != b.dims()) {
    return absl::StrCat("dims [", absl::StrJoin(a.dims(), ","), "] vs [",
                        absl::StrJoin(b.dims(), ","), "]");
  }
  for (size_t k = 0; k < a.strings().size() && k < b.strings().size(); ++k) {
    if (a.strings()[k] != b.strings()[k]) {
      return absl::StrCat("element ", k, " differs: ", Quote(a.strings()[k]), " vs ",
                          Quote(b.strings()[k]));
    }
  }
  if (a.strings().size() != b.strings().size()) {
    return absl::StrCat("string count ", a.strings().size(), " vs ", b.strings().size());
  }
  if (a.byte_size() != b.byte_size()) {
    return absl::StrCat("byte size ", a.byte_size(), " vs ", b.byte_size());
  }
  if (a.byte_size() == 0 || std::memcmp(a.raw(), b.raw(), a.byte_size()) == 0) return "";
  const size_t element_size = std::max<size_t>(DTypeSize(a.dtype()), 1);
  for (size_t offset = 0; offset < a.byte_size(); ++offset) {
    if (a.raw()[offset] != b.raw()[offset]) {
      const int64_t element = static_cast<int64_t>(offset / element_size);
      return absl::StrCat("element ", element, " differs: ", a.GetDouble(element), " vs ",
                          b.GetDouble(element));
    }
  }
  return "";
}

std::string DescribeModelDifference(const Model& a, const Model& b) {
  if (std::string d = CompareField("ir_version", a.ir_version, b.ir_version); !d.empty()) return d;
  if (!(a.opset_imports == b.opset_imports)) {
    return absl::StrCat("opset imports ", OpsetList(a.opset_imports), " vs ",
                        OpsetList(b.opset_imports));
  }
  if (std::string d = CompareField("producer_name", a.producer_name, b.producer_name); !d.empty()) {
    return d;
  }
  if (std::string d = CompareField("producer_version", a.producer_version, b.producer_version);
      !d.empty()) {
    return d;
  }
  if (std::string d = CompareField("model domain", a.domain, b.domain); !d.empty()) return d;
  if (std::string d = CompareField("model_version", a.model_version, b.model_version); !d.empty()) {
    return d;
  }
  if (std::string d = CompareField("model doc_string", a.doc_string, b.doc_string); !d.empty()) {
    return d;
  }
  if (a.metadata_props != b.metadata_props) {
    return absl::StrCat("model metadata_props ", PairList(a.metadata_props), " vs ",
                        PairList(b.metadata_props));
  }
  if (std::string d = CompareBytesList("model function", a.serialized_functions,
                                       b.serialized_functions);
      !d.empty()) {
    return d;
  }
  if (std::string d = CompareBytesList("training_info", a.serialized_training_info,
                                       b.serialized_training_info);
      !d.empty()) {
    return d;
  }
  if ((a.graph == nullptr) != (b.graph == nullptr)) {
    return absl::StrCat("graph ", a.graph ? "present" : "absent", " vs ",
                        b.graph ? "present" : "absent");
  }
  if (a.graph == nullptr) return "";
  return DescribeGraphDifference(*a.graph, *b.graph);
}

}  // namespace castor
