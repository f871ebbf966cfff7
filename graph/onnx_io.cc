// ONNX import and export for the castor IR (see graph/onnx_io.h).
//
// Import runs in phases so a node may read a value that a later node in the
// file defines: (1) graph inputs and initializers, (2) every node output name
// is collected and checked for duplicate definitions, (3) nodes are created
// in file order (forward references are patched in afterwards), (4) the
// outer values each subgraph attribute reads become implicit inputs,
// (5) value_info and graph outputs apply their declared types, and
// (6) Graph::TopologicalSort puts the nodes in order.
//
// Naming rules that keep import(export(m)) == m:
//   - an unnamed node is named "<OpType>_<k>", a repeated node name gets
//     "<name>_<k>" (k counts up, skipping names any node in the file has);
//   - trailing omitted ("") node outputs are dropped; an omitted output in
//     the middle gets the generated name "<node>_unused_out<k>";
//   - node metadata is NodeProto field 9 (metadata_props, IR 10), which the
//     ONNX 1.12 protobuf classes see as an unknown field.
// Export writes every tensor as raw_data (strings as string_data), so
// external data is inlined; models over protobuf's 2 GB limit are refused.
#include "graph/onnx_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "graph/confined_file.h"
#include "google/protobuf/unknown_field_set.h"
#include "graph/status.h"

namespace castor {
namespace {

static_assert(std::endian::native == std::endian::little,
              "ONNX raw_data is little-endian; castor copies it without byte swapping");

// NodeProto.metadata_props (repeated StringStringEntryProto, IR 10).
constexpr int kNodeMetadataPropsField = 9;
// The IR version written for models that were built in code (ir_version 0).
constexpr int64_t kDefaultIrVersion = 8;
// Protobuf cannot parse or serialize messages of 2 GB or more.
constexpr uint64_t kMaxProtoBytes = INT_MAX;

// The newest ONNX IR version castor reads. IR versions move with ONNX
// releases (IR 8: opsets 15-18, 9: 19-20, 10: 21-22, 11: 23); 13 covers
// the releases up to opset 25, castor's kMaxOnnxOpset. A higher ir_version
// may hold structures castor would misread, so such a model is refused.
constexpr int64_t kMaxIrVersion = 13;

absl::Status Annotate(const absl::Status& status, const std::string& prefix) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

absl::Status ErrnoError(int error_number, const std::string& message) {
  return absl::Status(absl::ErrnoToStatusCode(error_number),
                      absl::StrCat(message, ": ", std::strerror(error_number)));
}

}  // namespace

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, uint64_t max_bytes,
                                          const char* limit_reason) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused
  // below like any file that is not a regular one.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error_number = errno;
    if (error_number == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return ErrnoError(error_number, absl::StrCat("cannot open ", path));
  }
  struct stat info;
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  if (static_cast<uint64_t>(info.st_size) > max_bytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", info.st_size, " bytes is over ",
                                                   limit_reason));
  }
  std::string contents(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = read(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error_number = errno;
      close(fd);
      return ErrnoError(error_number, absl::StrCat("cannot read ", path));
    }
    if (n == 0) break;  // the file shrank while we read it
    done += static_cast<size_t>(n);
  }
  close(fd);
  contents.resize(done);
  return contents;
}

namespace {

// Parses with protobuf's total-bytes limit raised to its 2 GB maximum.
bool ParseLargeMessage(const std::string& bytes, google::protobuf::Message* message) {
  if (bytes.size() > kMaxProtoBytes) return false;
  google::protobuf::io::CodedInputStream stream(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                static_cast<int>(bytes.size()));
  stream.SetTotalBytesLimit(INT_MAX);
  return message->ParseFromCodedStream(&stream) && stream.ConsumedEntireMessage();
}

std::string DirectoryOf(const std::string& path) {
  return std::filesystem::path(path).parent_path().string();
}

// ----------------------------------------------------------------- tensors

std::string TensorLabel(const onnx::TensorProto& proto) {
  return proto.name().empty() ? std::string("tensor") : absl::StrCat("tensor '", proto.name(), "'");
}

// Copies a typed repeated field into the tensor's storage, converting each
// element to the storage type.
template <typename Storage, typename Field>
absl::Status CopyTypedField(const Field& field, const char* field_name, const std::string& label,
                            Tensor& tensor) {
  if (field.size() != tensor.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, " (", DTypeName(tensor.dtype()), ", ", tensor.num_elements(),
        " elements) has ", field.size(), " values in ", field_name));
  }
  Storage* out = tensor.data<Storage>();
  for (int k = 0; k < field.size(); ++k) out[k] = static_cast<Storage>(field.Get(k));
  return absl::OkStatus();
}

// Reads an external-data tensor of `dtype` and `dims` (`needed` bytes):
// the location must name a regular file that resolves, symlinks followed,
// inside the model's directory, and hold the bytes at the offset; only
// then is the tensor allocated.
absl::StatusOr<Tensor> ReadExternalData(const onnx::TensorProto& proto,
                                        const std::string& base_dir, const std::string& label,
                                        DType dtype, std::vector<int64_t> dims, uint64_t needed) {
  std::string location;
  int64_t offset = 0;
  int64_t length = -1;
  for (const onnx::StringStringEntryProto& entry : proto.external_data()) {
    if (entry.key() == "location") {
      location = entry.value();
    } else if (entry.key() == "offset" || entry.key() == "length") {
      int64_t number = 0;
      if (!absl::SimpleAtoi(entry.value(), &number) || number < 0) {
        return absl::InvalidArgumentError(absl::StrCat(label, ": external data ", entry.key(), " '",
                                                       entry.value(),
                                                       "' is not a non-negative integer"));
      }
      (entry.key() == "offset" ? offset : length) = number;
    }
  }
  if (location.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": data_location is EXTERNAL but external_data has no 'location'"));
  }
  if (length >= 0 && static_cast<uint64_t>(length) != needed) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": external data length ", length,
                                                   " does not match the tensor's ", needed,
                                                   " bytes"));
  }
  CASTOR_ASSIGN_OR_RETURN(ConfinedFile file, OpenConfinedFile(base_dir, location,
                                                               absl::StrCat(label, ": external data")));
  const int fd = file.fd;
  const std::string& path = file.path;
  struct stat info;
  if (fstat(fd, &info) != 0) {
    close(fd);
    return ErrnoError(errno, absl::StrCat(label, ": cannot stat external data file ", path));
  }
  if (static_cast<uint64_t>(info.st_size) < needed ||
      static_cast<uint64_t>(offset) > static_cast<uint64_t>(info.st_size) - needed) {
    close(fd);
    return absl::DataLossError(absl::StrCat(label, ": external data file ", path, " has ",
                                            info.st_size, " bytes; the tensor needs ", needed,
                                            " bytes at offset ", offset));
  }
  Tensor tensor(dtype, std::move(dims));
  size_t done = 0;
  while (done < needed) {
    const ssize_t n = pread(fd, tensor.raw() + done, needed - done, offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error_number = n < 0 ? errno : EIO;
      close(fd);
      return ErrnoError(error_number,
                        absl::StrCat(label, ": cannot read external data file ", path));
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  return tensor;
}

// The typed data field that holds a `dtype` tensor's values when it has
// neither raw nor external data: its name and element count ({nullptr, -1}
// for a dtype without one).
std::pair<const char*, int64_t> TypedField(const onnx::TensorProto& proto, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return {"float_data", proto.float_data_size()};
    case DType::kFloat64:
      return {"double_data", proto.double_data_size()};
    case DType::kInt64:
      return {"int64_data", proto.int64_data_size()};
    case DType::kUInt32:
    case DType::kUInt64:
      return {"uint64_data", proto.uint64_data_size()};
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kBool:
      return {"int32_data", proto.int32_data_size()};
    default:
      return {nullptr, -1};
  }
}

// ------------------------------------------------------------ value types

struct ValueType {
  DType dtype = DType::kUndefined;
  Shape shape;
};

const char* TypeKindName(const onnx::TypeProto& type) {
  switch (type.value_case()) {
    case onnx::TypeProto::kTensorType: return "tensor";
    case onnx::TypeProto::kSequenceType: return "sequence";
    case onnx::TypeProto::kMapType: return "map";
    case onnx::TypeProto::kOptionalType: return "optional";
    case onnx::TypeProto::kSparseTensorType: return "sparse tensor";
    case onnx::TypeProto::kOpaqueType: return "opaque";
    default: return "unknown";
  }
}

// The dtype and shape a ValueInfoProto declares; `what` names the value in
// errors ("graph input 'x'"). A missing type means "unknown".
absl::StatusOr<ValueType> ValueTypeFromProto(const onnx::ValueInfoProto& info,
                                             const std::string& what) {
  ValueType result;
  if (!info.has_type() || info.type().value_case() == onnx::TypeProto::VALUE_NOT_SET) {
    return result;
  }
  if (info.type().value_case() != onnx::TypeProto::kTensorType) {
    return absl::UnimplementedError(absl::StrCat(what, " has a ", TypeKindName(info.type()),
                                                 " type; castor supports tensor types only"));
  }
  const onnx::TypeProto::Tensor& tensor_type = info.type().tensor_type();
  if (tensor_type.elem_type() != 0) {
    absl::StatusOr<DType> dtype = DTypeFromOnnx(tensor_type.elem_type());
    if (!dtype.ok()) return Annotate(dtype.status(), absl::StrCat(what, ": "));
    result.dtype = *dtype;
  }
  if (tensor_type.has_shape()) {
    std::vector<Dim> dims;
    for (const onnx::TensorShapeProto::Dimension& dim : tensor_type.shape().dim()) {
      if (dim.has_dim_value() && dim.dim_value() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(what, " has negative dimension ",
                                                       dim.dim_value(), " at axis ", dims.size(),
                                                       "; a dimension is >= 0 or symbolic"));
      }
      if (dim.has_dim_value()) {
        dims.push_back(Dim(dim.dim_value()));
      } else if (dim.has_dim_param() && !dim.dim_param().empty()) {
        dims.push_back(Dim::Symbol(dim.dim_param()));
      } else {
        dims.push_back(Dim::Unknown());
      }
    }
    result.shape = Shape(std::move(dims));
  }
  return result;
}

void FillValueInfo(const Value& value, onnx::ValueInfoProto* info) {
  info->set_name(value.name());
  if (!value.doc_string().empty()) info->set_doc_string(value.doc_string());
  onnx::TypeProto::Tensor* tensor_type = info->mutable_type()->mutable_tensor_type();
  if (value.dtype() != DType::kUndefined) tensor_type->set_elem_type(DTypeToOnnx(value.dtype()));
  if (value.shape().rank_known()) {
    onnx::TensorShapeProto* shape = tensor_type->mutable_shape();
    for (const Dim& dim : value.shape().dims()) {
      onnx::TensorShapeProto::Dimension* out = shape->add_dim();
      if (dim.is_static()) {
        out->set_dim_value(dim.value());
      } else if (dim.is_symbolic()) {
        out->set_dim_param(dim.symbol());
      }
    }
  }
}

// ------------------------------------------------------------- attributes

// Old models may leave AttributeProto.type UNDEFINED; the set field says it.
AttrKind InferAttributeKind(const onnx::AttributeProto& proto) {
  if (proto.has_f()) return AttrKind::kFloat;
  if (proto.has_i()) return AttrKind::kInt;
  if (proto.has_s()) return AttrKind::kString;
  if (proto.has_t()) return AttrKind::kTensor;
  if (proto.has_g()) return AttrKind::kGraph;
  if (proto.has_sparse_tensor()) return AttrKind::kSparseTensor;
  if (proto.has_tp()) return AttrKind::kTypeProto;
  if (proto.floats_size() > 0) return AttrKind::kFloats;
  if (proto.ints_size() > 0) return AttrKind::kInts;
  if (proto.strings_size() > 0) return AttrKind::kStrings;
  if (proto.tensors_size() > 0) return AttrKind::kTensors;
  if (proto.graphs_size() > 0) return AttrKind::kGraphs;
  if (proto.sparse_tensors_size() > 0) return AttrKind::kSparseTensors;
  if (proto.type_protos_size() > 0) return AttrKind::kTypeProtos;
  return AttrKind::kUndefined;
}

absl::StatusOr<Attribute> AttributeFromProto(const onnx::AttributeProto& proto,
                                             const std::string& base_dir) {
  Attribute attribute;
  attribute.name = proto.name();
  attribute.doc_string = proto.doc_string();
  attribute.ref_attr_name = proto.ref_attr_name();
  const int type_code = static_cast<int>(proto.type());
  if (type_code < 0 || type_code > static_cast<int>(AttrKind::kTypeProtos)) {
    return absl::InvalidArgumentError(absl::StrCat("attribute '", proto.name(),
                                                   "' has unknown type code ", type_code));
  }
  attribute.kind = type_code == 0 ? InferAttributeKind(proto) : static_cast<AttrKind>(type_code);
  const std::string prefix = absl::StrCat("attribute '", proto.name(), "': ");
  switch (attribute.kind) {
    case AttrKind::kUndefined: break;
    case AttrKind::kFloat: attribute.f = proto.f(); break;
    case AttrKind::kInt: attribute.i = proto.i(); break;
    case AttrKind::kString: attribute.s = proto.s(); break;
    case AttrKind::kTensor: {
      absl::StatusOr<Tensor> tensor = TensorFromProto(proto.t(), base_dir);
      if (!tensor.ok()) return Annotate(tensor.status(), prefix);
      attribute.t = std::move(*tensor);
      break;
    }
    case AttrKind::kGraph: attribute.serialized = {proto.g().SerializeAsString()}; break;
    case AttrKind::kFloats:
      attribute.floats.assign(proto.floats().begin(), proto.floats().end());
      break;
    case AttrKind::kInts: attribute.ints.assign(proto.ints().begin(), proto.ints().end()); break;
    case AttrKind::kStrings:
      attribute.strings.assign(proto.strings().begin(), proto.strings().end());
      break;
    case AttrKind::kTensors:
      for (const onnx::TensorProto& t : proto.tensors()) {
        absl::StatusOr<Tensor> tensor = TensorFromProto(t, base_dir);
        if (!tensor.ok()) return Annotate(tensor.status(), prefix);
        attribute.tensors.push_back(std::move(*tensor));
      }
      break;
    case AttrKind::kGraphs:
      for (const onnx::GraphProto& g : proto.graphs()) {
        attribute.serialized.push_back(g.SerializeAsString());
      }
      break;
    case AttrKind::kSparseTensor:
      attribute.serialized = {proto.sparse_tensor().SerializeAsString()};
      break;
    case AttrKind::kSparseTensors:
      for (const onnx::SparseTensorProto& s : proto.sparse_tensors()) {
        attribute.serialized.push_back(s.SerializeAsString());
      }
      break;
    case AttrKind::kTypeProto: attribute.serialized = {proto.tp().SerializeAsString()}; break;
    case AttrKind::kTypeProtos:
      for (const onnx::TypeProto& t : proto.type_protos()) {
        attribute.serialized.push_back(t.SerializeAsString());
      }
      break;
  }
  return attribute;
}

// Parses element `index` of attribute.serialized into `out`.
absl::Status ParseSerialized(const Attribute& attribute, size_t index, const char* proto_name,
                             google::protobuf::Message* out) {
  if (index >= attribute.serialized.size() || !out->ParseFromString(attribute.serialized[index])) {
    return absl::InvalidArgumentError(absl::StrCat("attribute '", attribute.name, "' (",
                                                   AttrKindName(attribute.kind), ") element ",
                                                   index, " is not a serialized ", proto_name));
  }
  return absl::OkStatus();
}

absl::Status AttributeToProto(const Attribute& attribute, onnx::AttributeProto* proto) {
  proto->set_name(attribute.name);
  if (!attribute.doc_string.empty()) proto->set_doc_string(attribute.doc_string);
  if (!attribute.ref_attr_name.empty()) proto->set_ref_attr_name(attribute.ref_attr_name);
  proto->set_type(static_cast<onnx::AttributeProto::AttributeType>(attribute.kind));
  const size_t count = attribute.serialized.size();
  switch (attribute.kind) {
    case AttrKind::kUndefined: break;
    case AttrKind::kFloat: proto->set_f(attribute.f); break;
    case AttrKind::kInt: proto->set_i(attribute.i); break;
    case AttrKind::kString: proto->set_s(attribute.s); break;
    case AttrKind::kTensor: *proto->mutable_t() = TensorToProto(attribute.t, ""); break;
    case AttrKind::kGraph: return ParseSerialized(attribute, 0, "GraphProto", proto->mutable_g());
    case AttrKind::kFloats:
      proto->mutable_floats()->Add(attribute.floats.begin(), attribute.floats.end());
      break;
    case AttrKind::kInts:
      proto->mutable_ints()->Add(attribute.ints.begin(), attribute.ints.end());
      break;
    case AttrKind::kStrings:
      for (const std::string& s : attribute.strings) proto->add_strings(s);
      break;
    case AttrKind::kTensors:
      for (const Tensor& t : attribute.tensors) *proto->add_tensors() = TensorToProto(t, "");
      break;
    case AttrKind::kGraphs:
      for (size_t k = 0; k < count; ++k) {
        CASTOR_RETURN_IF_ERROR(ParseSerialized(attribute, k, "GraphProto", proto->add_graphs()));
      }
      break;
    case AttrKind::kSparseTensor:
      return ParseSerialized(attribute, 0, "SparseTensorProto", proto->mutable_sparse_tensor());
    case AttrKind::kSparseTensors:
      for (size_t k = 0; k < count; ++k) {
        CASTOR_RETURN_IF_ERROR(
            ParseSerialized(attribute, k, "SparseTensorProto", proto->add_sparse_tensors()));
      }
      break;
    case AttrKind::kTypeProto:
      return ParseSerialized(attribute, 0, "TypeProto", proto->mutable_tp());
    case AttrKind::kTypeProtos:
      for (size_t k = 0; k < count; ++k) {
        CASTOR_RETURN_IF_ERROR(
            ParseSerialized(attribute, k, "TypeProto", proto->add_type_protos()));
      }
      break;
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------- subgraphs

void ForEachSubgraph(const onnx::AttributeProto& attribute, auto&& fn) {
  if (attribute.has_g()) fn(attribute.g());
  for (const onnx::GraphProto& g : attribute.graphs()) fn(g);
}

// Names a graph reads but does not define (its inputs, initializers and
// node outputs), through nested subgraphs, in first-use order.
std::vector<std::string> FreeNamesOfGraph(const onnx::GraphProto& graph) {
  absl::flat_hash_set<std::string> defined;
  for (const onnx::ValueInfoProto& input : graph.input()) defined.insert(input.name());
  for (const onnx::TensorProto& init : graph.initializer()) defined.insert(init.name());
  for (const onnx::SparseTensorProto& init : graph.sparse_initializer()) {
    defined.insert(init.values().name());
  }
  for (const onnx::NodeProto& node : graph.node()) {
    for (const std::string& output : node.output()) defined.insert(output);
  }
  std::vector<std::string> free_names;
  absl::flat_hash_set<std::string> seen;
  auto use = [&](const std::string& name) {
    if (!name.empty() && !defined.contains(name) && seen.insert(name).second) {
      free_names.push_back(name);
    }
  };
  for (const onnx::NodeProto& node : graph.node()) {
    for (const std::string& input : node.input()) use(input);
    for (const onnx::AttributeProto& attribute : node.attribute()) {
      ForEachSubgraph(attribute, [&](const onnx::GraphProto& body) {
        for (const std::string& name : FreeNamesOfGraph(body)) use(name);
      });
    }
  }
  for (const onnx::ValueInfoProto& output : graph.output()) use(output.name());
  return free_names;
}

// --------------------------------------------------------------- nodes

// Unique, non-empty node names: a node keeps its name unless an earlier
// node has it; unnamed nodes get "<OpType>_<k>", repeats "<name>_<k>".
std::vector<std::string> AssignNodeNames(const onnx::GraphProto& graph) {
  absl::flat_hash_set<std::string> taken;
  for (const onnx::NodeProto& node : graph.node()) {
    if (!node.name().empty()) taken.insert(node.name());
  }
  absl::flat_hash_set<std::string> given;
  absl::flat_hash_map<std::string, int> counters;
  std::vector<std::string> names;
  for (const onnx::NodeProto& node : graph.node()) {
    if (!node.name().empty() && given.insert(node.name()).second) {
      names.push_back(node.name());
      continue;
    }
    std::string prefix = node.name().empty() ? node.op_type() : node.name();
    if (prefix.empty()) prefix = "node";
    std::string candidate;
    do {
      candidate = absl::StrCat(prefix, "_", counters[prefix]++);
    } while (taken.contains(candidate) || given.contains(candidate));
    given.insert(candidate);
    taken.insert(candidate);
    names.push_back(candidate);
  }
  return names;
}

std::string NodeLabel(const std::string& name, const std::string& op_type) {
  return absl::StrCat("node '", name, "' (", op_type, ")");
}

absl::Status ImportNodeMetadata(const onnx::NodeProto& proto, Node* node) {
  const google::protobuf::UnknownFieldSet& unknown = proto.unknown_fields();
  for (int k = 0; k < unknown.field_count(); ++k) {
    const google::protobuf::UnknownField& field = unknown.field(k);
    if (field.number() != kNodeMetadataPropsField ||
        field.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      continue;
    }
    onnx::StringStringEntryProto entry;
    if (!entry.ParseFromString(field.length_delimited())) {
      return absl::InvalidArgumentError(
          absl::StrCat(NodeLabel(node->name(), node->op_type()),
                       ": metadata_props entry is not a StringStringEntryProto"));
    }
    node->SetMetadata(entry.key(), entry.value());
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------- graph import

// ImportGraph's steps, in order; each names what it refuses.

// (1) Graph inputs and initializers.
absl::Status ImportInputsAndInitializers(const onnx::GraphProto& proto,
                                         const std::string& base_dir, Graph& graph) {
  for (int k = 0; k < proto.input_size(); ++k) {
    const onnx::ValueInfoProto& input = proto.input(k);
    if (input.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("graph input #", k, " has no name"));
    }
    const std::string what = absl::StrCat("graph input '", input.name(), "'");
    CASTOR_ASSIGN_OR_RETURN(ValueType type, ValueTypeFromProto(input, what));
    absl::StatusOr<Value*> value = graph.AddInput(input.name(), type.dtype, type.shape);
    if (!value.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is declared more than once"));
    }
    (*value)->set_doc_string(input.doc_string());
  }
  absl::flat_hash_set<std::string> initializer_names;
  for (int k = 0; k < proto.initializer_size(); ++k) {
    const onnx::TensorProto& init = proto.initializer(k);
    if (init.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("initializer #", k, " has no name"));
    }
    if (!initializer_names.insert(init.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("initializer '", init.name(), "' is defined more than once"));
    }
    absl::StatusOr<Tensor> tensor = TensorFromProto(init, base_dir);
    if (!tensor.ok()) return Annotate(tensor.status(), "initializer: ");
    if (Value* input = graph.FindValue(init.name())) {
      if (input->dtype() != DType::kUndefined && input->dtype() != tensor->dtype()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "graph input '", init.name(), "' is declared ", DTypeName(input->dtype()),
            " but its initializer is ", DTypeName(tensor->dtype())));
      }
      graph.SetInitializerOfInput(input, std::move(*tensor));
    } else {
      CASTOR_RETURN_IF_ERROR(graph.AddInitializer(init.name(), std::move(*tensor)).status());
    }
  }

  return absl::OkStatus();
}

// (2) Every name a node defines (value name -> node index); each value is
// defined once.
absl::StatusOr<absl::flat_hash_map<std::string, int>> MapNodeDefinitions(
    const onnx::GraphProto& proto, const std::vector<std::string>& node_names,
    const Graph& graph) {
  absl::flat_hash_map<std::string, int> defining_node;
  for (int k = 0; k < proto.node_size(); ++k) {
    for (const std::string& output : proto.node(k).output()) {
      if (output.empty()) continue;
      std::string earlier;
      if (Value* v = graph.FindValue(output)) {
        earlier = v->is_graph_input() ? "a graph input" : "an initializer";
      } else if (auto it = defining_node.find(output); it != defining_node.end()) {
        earlier = absl::StrCat("an output of ", NodeLabel(node_names[it->second],
                                                          proto.node(it->second).op_type()));
      }
      if (!earlier.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "value '", output, "' is defined more than once: it is ", earlier, " and an output of ",
            NodeLabel(node_names[k], proto.node(k).op_type())));
      }
      defining_node[output] = k;
    }
  }
  return defining_node;
}

// (3) Nodes in file order; inputs defined by later nodes are patched at the
// end. Omitted outputs before a given one get generated names.
absl::StatusOr<std::vector<Node*>> ImportNodes(const onnx::GraphProto& proto,
                                               const std::string& base_dir,
                                               const std::vector<std::string>& node_names,
                                               absl::flat_hash_map<std::string, int> defining_node,
                                               Graph& graph) {
  auto name_taken = [&](const std::string& name) {
    return graph.FindValue(name) != nullptr || defining_node.contains(name);
  };
  struct ForwardInput {
    Node* node;
    int index;
    std::string name;
  };
  std::vector<ForwardInput> forward_inputs;
  std::vector<Node*> nodes;
  for (int k = 0; k < proto.node_size(); ++k) {
    const onnx::NodeProto& node_proto = proto.node(k);
    const std::string label = NodeLabel(node_names[k], node_proto.op_type());
    std::vector<Value*> inputs;
    std::vector<std::pair<int, std::string>> later_inputs;
    for (int j = 0; j < node_proto.input_size(); ++j) {
      const std::string& name = node_proto.input(j);
      Value* value = name.empty() ? nullptr : graph.FindValue(name);
      if (!name.empty() && value == nullptr) {
        if (!defining_node.contains(name)) {
          return absl::InvalidArgumentError(
              absl::StrCat(label, " input '", name,
                           "' is not defined by any graph input, initializer or node output"));
        }
        later_inputs.emplace_back(j, name);
      }
      inputs.push_back(value);
    }
    std::vector<std::string> outputs(node_proto.output().begin(), node_proto.output().end());
    while (!outputs.empty() && outputs.back().empty()) outputs.pop_back();
    for (size_t j = 0; j < outputs.size(); ++j) {
      if (!outputs[j].empty()) continue;
      std::string generated = absl::StrCat(node_names[k], "_unused_out", j);
      for (int suffix = 1; name_taken(generated); ++suffix) {
        generated = absl::StrCat(node_names[k], "_unused_out", j, "_", suffix);
      }
      defining_node[generated] = k;
      outputs[j] = generated;
    }
    absl::StatusOr<Node*> node =
        graph.AddNode(node_proto.op_type(), inputs, outputs, node_names[k], node_proto.domain());
    if (!node.ok()) return Annotate(node.status(), absl::StrCat(label, ": "));
    (*node)->set_doc_string(node_proto.doc_string());
    for (const onnx::AttributeProto& attribute_proto : node_proto.attribute()) {
      absl::StatusOr<Attribute> attribute = AttributeFromProto(attribute_proto, base_dir);
      if (!attribute.ok()) return Annotate(attribute.status(), absl::StrCat(label, " "));
      (*node)->SetAttribute(std::move(*attribute));
    }
    CASTOR_RETURN_IF_ERROR(ImportNodeMetadata(node_proto, *node));
    for (auto& [index, name] : later_inputs) forward_inputs.push_back({*node, index, name});
    nodes.push_back(*node);
  }
  for (const ForwardInput& forward : forward_inputs) {
    forward.node->SetInput(forward.index, graph.FindValue(forward.name));
  }
  return nodes;
}

// (4) Outer values read by subgraph attributes become implicit inputs.
absl::Status AddSubgraphImplicitInputs(const onnx::GraphProto& proto,
                                       const std::vector<std::string>& node_names,
                                       const std::vector<Node*>& nodes, Graph& graph) {
  for (int k = 0; k < proto.node_size(); ++k) {
    absl::flat_hash_set<std::string> added;
    for (const onnx::AttributeProto& attribute : proto.node(k).attribute()) {
      absl::Status status;
      ForEachSubgraph(attribute, [&](const onnx::GraphProto& body) {
        for (const std::string& name : FreeNamesOfGraph(body)) {
          if (!status.ok() || !added.insert(name).second) continue;
          Value* value = graph.FindValue(name);
          if (value == nullptr) {
            status = absl::InvalidArgumentError(absl::StrCat(
                NodeLabel(node_names[k], proto.node(k).op_type()), " subgraph attribute '",
                attribute.name(), "' reads '", name,
                "', which neither the subgraph nor the outer graph defines"));
            continue;
          }
          nodes[k]->AddImplicitInput(value);
        }
      });
      CASTOR_RETURN_IF_ERROR(status);
    }
  }

  return absl::OkStatus();
}

// (5) Declared types: value_info, then graph outputs.
absl::Status ImportDeclaredTypes(const onnx::GraphProto& proto, Graph& graph) {
  absl::flat_hash_set<std::string> output_names;
  for (const onnx::ValueInfoProto& output : proto.output()) output_names.insert(output.name());
  for (const onnx::ValueInfoProto& info : proto.value_info()) {
    Value* value = graph.FindValue(info.name());
    // value_info for an unknown name is harmless; inputs and outputs carry
    // their own declared types.
    if (value == nullptr || value->is_graph_input() || output_names.contains(info.name())) continue;
    CASTOR_ASSIGN_OR_RETURN(ValueType type,
                            ValueTypeFromProto(info, absl::StrCat("value '", info.name(), "'")));
    if (value->initializer() == nullptr) {
      value->set_dtype(type.dtype);
      value->set_shape(type.shape);
    }
    value->set_doc_string(info.doc_string());
    value->set_has_value_info(true);
  }
  for (const onnx::ValueInfoProto& output : proto.output()) {
    const std::string what = absl::StrCat("graph output '", output.name(), "'");
    Value* value = graph.FindValue(output.name());
    if (value == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " is not defined by any graph input, initializer or node output"));
    }
    CASTOR_ASSIGN_OR_RETURN(ValueType type, ValueTypeFromProto(output, what));
    if (value->initializer() == nullptr) {
      if (type.dtype != DType::kUndefined) value->set_dtype(type.dtype);
      if (type.shape.rank_known()) value->set_shape(type.shape);
    }
    if (!output.doc_string().empty()) value->set_doc_string(output.doc_string());
    graph.AddOutput(value);
  }

  return absl::OkStatus();
}

absl::Status ImportGraph(const onnx::GraphProto& proto, const std::string& base_dir,
                         Graph& graph) {
  graph.set_name(proto.name());
  graph.set_doc_string(proto.doc_string());
  if (proto.sparse_initializer_size() > 0) {
    return absl::UnimplementedError(absl::StrCat(
        "sparse initializer '", proto.sparse_initializer(0).values().name(),
        "' is not supported; store it as a dense initializer"));
  }
  CASTOR_RETURN_IF_ERROR(ImportInputsAndInitializers(proto, base_dir, graph));
  const std::vector<std::string> node_names = AssignNodeNames(proto);
  CASTOR_ASSIGN_OR_RETURN(auto defining_node, MapNodeDefinitions(proto, node_names, graph));
  CASTOR_ASSIGN_OR_RETURN(std::vector<Node*> nodes,
                          ImportNodes(proto, base_dir, node_names, std::move(defining_node), graph));
  CASTOR_RETURN_IF_ERROR(AddSubgraphImplicitInputs(proto, node_names, nodes, graph));
  CASTOR_RETURN_IF_ERROR(ImportDeclaredTypes(proto, graph));
  // (6) Topological order.
  return graph.TopologicalSort();
}

// ------------------------------------------------------------- graph export

absl::Status ExportGraph(const Graph& graph, onnx::GraphProto* proto) {
  proto->set_name(graph.name());
  if (!graph.doc_string().empty()) proto->set_doc_string(graph.doc_string());
  absl::flat_hash_set<const Value*> defined;
  for (const Value* input : graph.inputs()) {
    FillValueInfo(*input, proto->add_input());
    defined.insert(input);
  }
  for (const Value* init : graph.initializers()) {
    *proto->add_initializer() = TensorToProto(*init->initializer(), init->name());
    defined.insert(init);
  }
  absl::flat_hash_set<std::string> node_names;
  for (const Node* node : graph.nodes()) {
    const std::string label = NodeLabel(node->name(), node->op_type());
    if (!node->name().empty() && !node_names.insert(node->name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("node name '", node->name(), "' is used by more than one node"));
    }
    onnx::NodeProto* node_proto = proto->add_node();
    auto check_defined = [&](const Value* value, const char* kind) {
      if (defined.contains(value)) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat(
          label, " ", kind, " '", value->name(),
          "' is not defined before the node: the node order is not topological (run "
          "Graph::TopologicalSort) or nothing defines the value"));
    };
    for (const Value* input : node->inputs()) {
      if (input == nullptr) {
        node_proto->add_input("");
        continue;
      }
      CASTOR_RETURN_IF_ERROR(check_defined(input, "input"));
      node_proto->add_input(input->name());
    }
    for (const Value* input : node->implicit_inputs()) {
      CASTOR_RETURN_IF_ERROR(check_defined(input, "subgraph (implicit) input"));
    }
    for (const Value* output : node->outputs()) {
      node_proto->add_output(output->name());
      defined.insert(output);
    }
    if (!node->name().empty()) node_proto->set_name(node->name());
    node_proto->set_op_type(node->op_type());
    if (!node->domain().empty()) node_proto->set_domain(node->domain());
    if (!node->doc_string().empty()) node_proto->set_doc_string(node->doc_string());
    for (const Attribute& attribute : node->attributes()) {
      absl::Status status = AttributeToProto(attribute, node_proto->add_attribute());
      if (!status.ok()) return Annotate(status, absl::StrCat(label, " "));
    }
    for (const auto& [key, value] : node->metadata()) {
      onnx::StringStringEntryProto entry;
      entry.set_key(key);
      entry.set_value(value);
      node_proto->mutable_unknown_fields()->AddLengthDelimited(kNodeMetadataPropsField,
                                                               entry.SerializeAsString());
    }
  }
  for (const Value* output : graph.outputs()) {
    if (!defined.contains(output)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "graph output '", output->name(), "' is not defined by any input, initializer or node"));
    }
    FillValueInfo(*output, proto->add_output());
  }
  auto add_value_info = [&](const Value* value) {
    if (value->has_value_info() && !value->is_graph_input() && !value->is_graph_output()) {
      FillValueInfo(*value, proto->add_value_info());
    }
  };
  for (const Value* init : graph.initializers()) add_value_info(init);
  for (const Node* node : graph.nodes()) {
    for (const Value* output : node->outputs()) add_value_info(output);
  }
  return absl::OkStatus();
}

}  // namespace

// ===================================================================== API

absl::StatusOr<Tensor> TensorFromProto(const onnx::TensorProto& proto,
                                       const std::string& base_dir) {
  const std::string label = TensorLabel(proto);
  absl::StatusOr<DType> dtype = DTypeFromOnnx(proto.data_type());
  if (!dtype.ok()) return Annotate(dtype.status(), absl::StrCat(label, ": "));
  if (proto.has_segment()) {
    return absl::UnimplementedError(absl::StrCat(label, ": segmented tensors are not supported"));
  }
  std::vector<int64_t> dims(proto.dims().begin(), proto.dims().end());
  const uint64_t element_size = std::max<size_t>(DTypeSize(*dtype), 1);
  uint64_t elements = 1;
  for (int64_t dim : dims) {
    if (dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat(label, " has negative dimension ", dim));
    }
    if (dim != 0 && elements > (uint64_t{1} << 62) / element_size / static_cast<uint64_t>(dim)) {
      return absl::InvalidArgumentError(absl::StrCat(label, " is too large"));
    }
    elements *= static_cast<uint64_t>(dim);
  }
  // Nothing is allocated before the data the file holds is known to fill
  // the declared shape: a 40-byte tensor declaring [2^40] is refused here.
  const bool external = proto.data_location() == onnx::TensorProto::EXTERNAL;
  if (*dtype == DType::kString) {
    if (external || proto.has_raw_data()) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": string tensors must store their values in string_data"));
    }
    if (static_cast<uint64_t>(proto.string_data_size()) != elements) {
      return absl::InvalidArgumentError(absl::StrCat(label, " (string, ", elements,
                                                     " elements) has ", proto.string_data_size(),
                                                     " values in string_data"));
    }
    Tensor tensor(*dtype, std::move(dims));
    tensor.strings().assign(proto.string_data().begin(), proto.string_data().end());
    return tensor;
  }
  const uint64_t bytes = elements * DTypeSize(*dtype);
  if (external) return ReadExternalData(proto, base_dir, label, *dtype, std::move(dims), bytes);
  if (proto.has_raw_data()) {
    if (proto.raw_data().size() != bytes) {
      return absl::InvalidArgumentError(absl::StrCat(label, " (", DTypeName(*dtype), ", ",
                                                     elements, " elements) has ",
                                                     proto.raw_data().size(),
                                                     " bytes of raw_data; expected ", bytes));
    }
    Tensor tensor(*dtype, std::move(dims));
    if (bytes > 0) std::memcpy(tensor.raw(), proto.raw_data().data(), bytes);
    return tensor;
  }
  const auto [field_name, field_size] = TypedField(proto, *dtype);
  if (field_name != nullptr && static_cast<uint64_t>(field_size) != elements) {
    return absl::InvalidArgumentError(absl::StrCat(label, " (", DTypeName(*dtype), ", ", elements,
                                                   " elements) has ", field_size, " values in ",
                                                   field_name));
  }
  Tensor tensor(*dtype, std::move(dims));
  absl::Status status;
  switch (*dtype) {
    case DType::kFloat32:
      status = CopyTypedField<float>(proto.float_data(), "float_data", label, tensor);
      break;
    case DType::kFloat64:
      status = CopyTypedField<double>(proto.double_data(), "double_data", label, tensor);
      break;
    case DType::kInt64:
      status = CopyTypedField<int64_t>(proto.int64_data(), "int64_data", label, tensor);
      break;
    case DType::kUInt32:
      status = CopyTypedField<uint32_t>(proto.uint64_data(), "uint64_data", label, tensor);
      break;
    case DType::kUInt64:
      status = CopyTypedField<uint64_t>(proto.uint64_data(), "uint64_data", label, tensor);
      break;
    case DType::kInt8:
      status = CopyTypedField<int8_t>(proto.int32_data(), "int32_data", label, tensor);
      break;
    case DType::kInt16:
      status = CopyTypedField<int16_t>(proto.int32_data(), "int32_data", label, tensor);
      break;
    case DType::kInt32:
      status = CopyTypedField<int32_t>(proto.int32_data(), "int32_data", label, tensor);
      break;
    case DType::kUInt8:
      status = CopyTypedField<uint8_t>(proto.int32_data(), "int32_data", label, tensor);
      break;
    case DType::kUInt16:
    case DType::kFloat16:  // 16-bit patterns in int32_data
    case DType::kBFloat16:
      status = CopyTypedField<uint16_t>(proto.int32_data(), "int32_data", label, tensor);
      break;
    case DType::kBool:
      status = CopyTypedField<uint8_t>(proto.int32_data(), "int32_data", label, tensor);
      for (int64_t k = 0; status.ok() && k < tensor.num_elements(); ++k) {
        tensor.data<uint8_t>()[k] = tensor.data<uint8_t>()[k] != 0 ? 1 : 0;
      }
      break;
    default:
      status = absl::UnimplementedError(
          absl::StrCat(label, ": element type ", DTypeName(*dtype), " has no typed data field"));
  }
  if (!status.ok()) return status;
  return tensor;
}

onnx::TensorProto TensorToProto(const Tensor& tensor, const std::string& name) {
  onnx::TensorProto proto;
  if (!name.empty()) proto.set_name(name);
  proto.set_data_type(DTypeToOnnx(tensor.dtype()));
  for (int64_t dim : tensor.dims()) proto.add_dims(dim);
  if (tensor.dtype() == DType::kString) {
    for (const std::string& s : tensor.strings()) proto.add_string_data(s);
  } else {
    proto.set_raw_data(reinterpret_cast<const char*>(tensor.raw()), tensor.byte_size());
  }
  return proto;
}

absl::StatusOr<Tensor> LoadTensorProtoFile(const std::string& path) {
  CASTOR_ASSIGN_OR_RETURN(
      std::string bytes,
      ReadWholeFile(path, kMaxProtoBytes, "protobuf's 2 GB limit for one TensorProto"));
  onnx::TensorProto proto;
  if (!ParseLargeMessage(bytes, &proto) || proto.data_type() == 0) {
    return absl::DataLossError(absl::StrCat(
        path, ": not a valid ONNX TensorProto (",
        bytes.empty() ? "the file is empty" : "unparseable, truncated or without data_type", ")"));
  }
  absl::StatusOr<Tensor> tensor = TensorFromProto(proto, DirectoryOf(path));
  if (!tensor.ok()) return Annotate(tensor.status(), absl::StrCat(path, ": "));
  return tensor;
}

absl::StatusOr<Model> ImportModel(const onnx::ModelProto& proto, const std::string& base_dir,
                                  const std::string& source) {
  if (!proto.has_graph()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the model has no graph"));
  }
  Model model;
  model.ir_version = proto.ir_version();
  for (const onnx::OperatorSetIdProto& opset : proto.opset_import()) {
    model.opset_imports.push_back(OpsetImport{CanonicalDomain(opset.domain()), opset.version()});
  }
  model.producer_name = proto.producer_name();
  model.producer_version = proto.producer_version();
  model.domain = proto.domain();
  model.model_version = proto.model_version();
  model.doc_string = proto.doc_string();
  for (const onnx::StringStringEntryProto& entry : proto.metadata_props()) {
    model.metadata_props.emplace_back(entry.key(), entry.value());
  }
  for (const onnx::FunctionProto& function : proto.functions()) {
    model.serialized_functions.push_back(function.SerializeAsString());
  }
  for (const onnx::TrainingInfoProto& info : proto.training_info()) {
    model.serialized_training_info.push_back(info.SerializeAsString());
  }
  CASTOR_RETURN_IF_ERROR(
      Annotate(ImportGraph(proto.graph(), base_dir, *model.graph), absl::StrCat(source, ": ")));
  return model;
}

absl::StatusOr<Model> LoadModel(const std::string& path) {
  CASTOR_ASSIGN_OR_RETURN(
      std::string bytes,
      ReadWholeFile(path, kMaxProtoBytes,
                    "protobuf's 2 GB limit; large weights must use ONNX external data"));
  if (bytes.empty()) {
    return absl::DataLossError(absl::StrCat(path, ": not a valid ONNX model (the file is empty)"));
  }
  onnx::ModelProto proto;
  if (!ParseLargeMessage(bytes, &proto)) {
    return absl::DataLossError(absl::StrCat(
        path, ": not a valid ONNX model (protobuf parsing failed: truncated or not a ModelProto)"));
  }
  // Random bytes sometimes parse as a protobuf message; a real model has an
  // IR version, a graph and (IR 3+) opset imports.
  if (proto.ir_version() <= 0 || !proto.has_graph() || proto.opset_import_size() == 0) {
    return absl::DataLossError(absl::StrCat(
        path, ": not a valid ONNX model (parsed, but ",
        proto.ir_version() <= 0 ? "ir_version is missing"
        : !proto.has_graph()    ? "it has no graph"
                                : "it has no opset_import",
        ")"));
  }
  if (proto.ir_version() > kMaxIrVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": IR version ", proto.ir_version(), " is newer than castor knows (IR 3..",
        kMaxIrVersion, "); re-export with an older ONNX, or update castor"));
  }
  return ImportModel(proto, DirectoryOf(path), path);
}

absl::StatusOr<onnx::ModelProto> ExportModel(const Model& model) {
  onnx::ModelProto proto;
  proto.set_ir_version(model.ir_version != 0 ? model.ir_version : kDefaultIrVersion);
  for (const OpsetImport& opset : model.opset_imports) {
    onnx::OperatorSetIdProto* out = proto.add_opset_import();
    if (!CanonicalDomain(opset.domain).empty()) out->set_domain(opset.domain);
    out->set_version(opset.version);
  }
  if (!model.producer_name.empty()) proto.set_producer_name(model.producer_name);
  if (!model.producer_version.empty()) proto.set_producer_version(model.producer_version);
  if (!model.domain.empty()) proto.set_domain(model.domain);
  if (model.model_version != 0) proto.set_model_version(model.model_version);
  if (!model.doc_string.empty()) proto.set_doc_string(model.doc_string);
  for (const auto& [key, value] : model.metadata_props) {
    onnx::StringStringEntryProto* entry = proto.add_metadata_props();
    entry->set_key(key);
    entry->set_value(value);
  }
  for (size_t k = 0; k < model.serialized_functions.size(); ++k) {
    if (!proto.add_functions()->ParseFromString(model.serialized_functions[k])) {
      return absl::InvalidArgumentError(
          absl::StrCat("model local function #", k, " is not a serialized FunctionProto"));
    }
  }
  for (size_t k = 0; k < model.serialized_training_info.size(); ++k) {
    if (!proto.add_training_info()->ParseFromString(model.serialized_training_info[k])) {
      return absl::InvalidArgumentError(
          absl::StrCat("training_info #", k, " is not a serialized TrainingInfoProto"));
    }
  }
  if (model.graph == nullptr) return absl::InvalidArgumentError("the model has no graph");
  CASTOR_RETURN_IF_ERROR(ExportGraph(*model.graph, proto.mutable_graph()));
  return proto;
}

absl::StatusOr<Model> CloneModel(const Model& model) {
  CASTOR_ASSIGN_OR_RETURN(onnx::ModelProto proto, ExportModel(model));
  return ImportModel(proto, "", "a copy of the model");
}

absl::Status SaveModel(const Model& model, const std::string& path) {
  absl::StatusOr<onnx::ModelProto> proto = ExportModel(model);
  if (!proto.ok()) return Annotate(proto.status(), absl::StrCat("cannot save ", path, ": "));
  const size_t size = proto->ByteSizeLong();
  if (size > kMaxProtoBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot save ", path, ": the model serializes to ", size,
        " bytes, over protobuf's 2 GB limit; large weights must use ONNX external data"));
  }
  std::string bytes;
  if (!proto->SerializeToString(&bytes)) {
    return absl::InternalError(
        absl::StrCat("cannot save ", path, ": protobuf serialization failed"));
  }
  return WriteFileAtomically(path, bytes);
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  if (path.empty()) return absl::InvalidArgumentError("cannot write a file with an empty path");
  std::string directory = DirectoryOf(path);
  if (directory.empty()) directory = ".";
  std::string temp_path = absl::StrCat(path, ".tmp.XXXXXX");
  const int fd = mkstemp(temp_path.data());
  if (fd < 0) {
    return ErrnoError(errno, absl::StrCat("cannot write ", path,
                                          ": cannot create a temporary file in directory ",
                                          directory));
  }
  bool fd_open = true;
  auto fail = [&](int error_number, const char* what) {
    if (fd_open) close(fd);
    unlink(temp_path.c_str());
    return ErrnoError(error_number,
                      absl::StrCat("cannot write ", path, ": ", what, " ", temp_path));
  };
  if (fchmod(fd, 0644) != 0) return fail(errno, "cannot set the permissions of");
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(n < 0 ? errno : EIO, "cannot write to");
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return fail(errno, "cannot fsync");
  fd_open = false;
  if (close(fd) != 0) return fail(errno, "cannot close");
  if (rename(temp_path.c_str(), path.c_str()) != 0) return fail(errno, "cannot rename over it");
  // Make the rename durable.
  const int dir_fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || fsync(dir_fd) != 0) {
    const int error_number = errno;
    if (dir_fd >= 0) close(dir_fd);
    return ErrnoError(error_number, absl::StrCat("wrote ", path, " but cannot fsync directory ",
                                                 directory));
  }
  close(dir_fd);
  return absl::OkStatus();
}

}  // namespace castor
