// ONNX import and export for the castor IR.
//
// Import accepts any IR version the protobuf parses (castor tests IR 6-13),
// opset imports per domain, initializers from typed fields, raw_data and
// external data files (resolved next to the model), graph inputs that are
// also initializers, value_info, metadata_props and doc strings. Subgraph
// attributes are kept as serialized GraphProtos, and the outer-scope values
// they read become the node's implicit inputs.
//
// Export writes valid ONNX: nodes in topological order, unique names,
// types on every graph input and output, and import(export(m)) equals m.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "onnx/onnx_pb.h"

namespace castor {

// Reads and imports a model file. Errors name the file and say what is
// wrong: NotFound (missing file), DataLoss (not a ModelProto, truncated),
// InvalidArgument (a node input that no one defines, a duplicate
// definition, an unsupported element type, ...).
absl::StatusOr<Model> LoadModel(const std::string& path);

// Imports a parsed ModelProto. External data paths resolve against
// `base_dir` ("" = current directory). `source` names the model in errors.
absl::StatusOr<Model> ImportModel(const onnx::ModelProto& proto, const std::string& base_dir,
                                  const std::string& source);

// Exports a model; fails if the graph is not in topological order or names
// clash.
absl::StatusOr<onnx::ModelProto> ExportModel(const Model& model);

// A deep copy of `model` (exported and imported again, so it is exactly
// what a save and load would give). `model` must be exportable.
absl::StatusOr<Model> CloneModel(const Model& model);

// Exports and writes atomically: a temporary file in the same directory,
// fsync, rename over `path`, fsync the directory. `path` is never left
// partially written.
absl::Status SaveModel(const Model& model, const std::string& path);

// Tensor conversion (typed fields, raw_data or external data).
absl::StatusOr<Tensor> TensorFromProto(const onnx::TensorProto& proto,
                                       const std::string& base_dir);
onnx::TensorProto TensorToProto(const Tensor& tensor, const std::string& name);

// Reads a whole file; NotFound when it does not exist, InvalidArgument when
// it is a directory or larger than `max_bytes` (checked before reading:
// "<path>: N bytes is over <limit_reason>").
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, uint64_t max_bytes,
                                          const char* limit_reason);

// Reads a serialized TensorProto file (.pb), as in the ONNX test data.
absl::StatusOr<Tensor> LoadTensorProtoFile(const std::string& path);

// Writes `contents` to `path` atomically (see SaveModel).
absl::Status WriteFileAtomically(const std::string& path, std::string_view contents);

}  // namespace castor
