// Node attributes of every ONNX attribute type. Kinds use ONNX's
// AttributeProto.AttributeType codes. Subgraphs (If/Loop/Scan bodies),
// sparse tensors and type protos are kept as serialized ONNX protos: castor
// preserves them exactly through import/export but does not execute them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/tensor.h"

namespace castor {

enum class AttrKind : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kInt = 2,
  kString = 3,
  kTensor = 4,
  kGraph = 5,
  kFloats = 6,
  kInts = 7,
  kStrings = 8,
  kTensors = 9,
  kGraphs = 10,
  kSparseTensor = 11,
  kSparseTensors = 12,
  kTypeProto = 13,
  kTypeProtos = 14,
};

// "float", "int", "string", "tensor", "graph", "floats", "ints", ...
const char* AttrKindName(AttrKind kind);

struct Attribute {
  std::string name;
  AttrKind kind = AttrKind::kUndefined;
  std::string doc_string;
  std::string ref_attr_name;  // set inside function bodies only

  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;
  // Serialized onnx.GraphProto / SparseTensorProto / TypeProto, one per
  // element: kGraph/kSparseTensor/kTypeProto hold exactly one.
  std::vector<std::string> serialized;

  static Attribute Float(std::string name, float value);
  static Attribute Int(std::string name, int64_t value);
  static Attribute String(std::string name, std::string value);
  static Attribute Ints(std::string name, std::vector<int64_t> values);
  static Attribute Floats(std::string name, std::vector<float> values);
  static Attribute TensorValue(std::string name, Tensor value);

  bool operator==(const Attribute& other) const;
  bool operator!=(const Attribute& other) const { return !(*this == other); }
  // Compact rendering for tools: "2", "[1,1]", "\"NOTSET\"", "<tensor float32 [3]>".
  std::string ToString() const;
};

}  // namespace castor
