// Attribute constructors, comparison and printing.
#include "graph/attribute.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace castor {

const char* AttrKindName(AttrKind kind) {
  switch (kind) {
    case AttrKind::kFloat: return "float";
    case AttrKind::kInt: return "int";
    case AttrKind::kString: return "string";
    case AttrKind::kTensor: return "tensor";
    case AttrKind::kGraph: return "graph";
    case AttrKind::kFloats: return "floats";
    case AttrKind::kInts: return "ints";
    case AttrKind::kStrings: return "strings";
    case AttrKind::kTensors: return "tensors";
    case AttrKind::kGraphs: return "graphs";
    case AttrKind::kSparseTensor: return "sparse_tensor";
    case AttrKind::kSparseTensors: return "sparse_tensors";
    case AttrKind::kTypeProto: return "type_proto";
    case AttrKind::kTypeProtos: return "type_protos";
    case AttrKind::kUndefined: break;
  }
  return "undefined";
}

Attribute Attribute::Float(std::string name, float value) {
  Attribute a;
  a.name = std::move(name);
  a.kind = AttrKind::kFloat;
  a.f = value;
  return a;
}

Attribute Attribute::Int(std::string name, int64_t value) {
  Attribute a;
  a.name = std::move(name);
  a.kind = AttrKind::kInt;
  a.i = value;
  return a;
}

Attribute Attribute::String(std::string name, std::string value) {
  Attribute a;
  a.name = std::move(name);
  a.kind = AttrKind::kString;
  a.s = std::move(value);
  return a;
}

Attribute Attribute::Ints(std::string name, std::vector<int64_t> values) {
  Attribute a;
  a.name = std::move(name);
  a.kind = AttrKind::kInts;
  a.ints = std::move(values);
  return a;
}

Attribute Attribute::Floats(std::string name, std::vector<float> values) {
  Attribute a;
  a.name = std::move(name);
  a.kind = AttrKind::kFloats;
  a.floats = std::move(values);
  return a;
}

Attribute Attribute::TensorValue(std::string name, Tensor value) {
  Attribute a;
  a.name = std::move(name);
  a.kind = AttrKind::kTensor;
  a.t = std::move(value);
  return a;
}

bool Attribute::operator==(const Attribute& o) const {
  // Floats compare by bits so NaN attributes round-trip as equal.
  auto same_float = [](float a, float b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
  };
  if (floats.size() != o.floats.size()) return false;
  for (size_t k = 0; k < floats.size(); ++k) {
    if (!same_float(floats[k], o.floats[k])) return false;
  }
  return name == o.name && kind == o.kind && doc_string == o.doc_string &&
         ref_attr_name == o.ref_attr_name && same_float(f, o.f) && i == o.i && s == o.s &&
         t == o.t && ints == o.ints && strings == o.strings && tensors == o.tensors &&
         serialized == o.serialized;
}

std::string Attribute::ToString() const {
  switch (kind) {
    case AttrKind::kFloat: return absl::StrCat(f);
    case AttrKind::kInt: return absl::StrCat(i);
    case AttrKind::kString: return absl::StrCat("\"", s, "\"");
    case AttrKind::kFloats: return absl::StrCat("[", absl::StrJoin(floats, ","), "]");
    case AttrKind::kInts: return absl::StrCat("[", absl::StrJoin(ints, ","), "]");
    case AttrKind::kStrings:
      if (strings.empty()) return "[]";
      return absl::StrCat("[\"", absl::StrJoin(strings, "\",\""), "\"]");
    case AttrKind::kTensor:
      return absl::StrCat("<tensor ", DTypeName(t.dtype()), " ", t.shape().ToString(), ">");
    case AttrKind::kTensors: return absl::StrCat("<", tensors.size(), " tensors>");
    case AttrKind::kGraph: return "<graph>";
    case AttrKind::kGraphs: return absl::StrCat("<", serialized.size(), " graphs>");
    default: return absl::StrCat("<", AttrKindName(kind), ">");
  }
}

}  // namespace castor
