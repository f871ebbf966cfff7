// Tests for ONNX import/export (graph/onnx_io.h) and the structural model
// comparison (graph/compare.h): round trips of every conformance and sample
// model, the conformance tensor files, hand-built protos for each import
// feature, the error paths, and atomic saving.
#include "graph/onnx_io.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graph/compare.h"
#include "graph/half.h"
#include "gtest/gtest.h"

namespace castor {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kConformanceDir = std::string(CASTOR_SHARED_DIR) + "/conformance/onnx-node";
const std::string kModelsDir = std::string(CASTOR_SOURCE_DIR) + "/models";

// A fresh directory, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "castor_onnx_io_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string Path(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }
  std::vector<std::string> Entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(path_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string path_;
};

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Export -> serialize -> parse -> import.
absl::StatusOr<Model> RoundTrip(const Model& model, std::string* bytes_out = nullptr) {
  absl::StatusOr<onnx::ModelProto> exported = ExportModel(model);
  if (!exported.ok()) return exported.status();
  std::string bytes;
  if (!exported->SerializeToString(&bytes)) return absl::InternalError("serialize failed");
  onnx::ModelProto parsed;
  if (!parsed.ParseFromString(bytes)) return absl::InternalError("parse failed");
  if (bytes_out) *bytes_out = bytes;
  return ImportModel(parsed, "", "reimported");
}

// Round trip plus a second export whose bytes must equal the first's.
void ExpectStableRoundTrip(const Model& model, const std::string& label) {
  std::string first_bytes;
  absl::StatusOr<Model> again = RoundTrip(model, &first_bytes);
  ASSERT_TRUE(again.ok()) << label << ": " << again.status();
  EXPECT_EQ(DescribeModelDifference(model, *again), "") << label;
  absl::StatusOr<onnx::ModelProto> second = ExportModel(*again);
  ASSERT_TRUE(second.ok()) << label << ": " << second.status();
  EXPECT_EQ(second->SerializeAsString(), first_bytes) << label << ": export is not idempotent";
}

// ------------------------------------------------------------ proto builders

// "N" -> dim_param, "28" -> dim_value.
onnx::ValueInfoProto TensorInfo(const std::string& name, int32_t elem_type,
                                const std::vector<std::string>& dims) {
  onnx::ValueInfoProto info;
  info.set_name(name);
  onnx::TypeProto::Tensor* tensor = info.mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(elem_type);
  onnx::TensorShapeProto* shape = tensor->mutable_shape();
  for (const std::string& dim : dims) {
    if (!dim.empty() && std::isdigit(static_cast<unsigned char>(dim[0]))) {
      shape->add_dim()->set_dim_value(std::stoll(dim));
    } else {
      shape->add_dim()->set_dim_param(dim);
    }
  }
  return info;
}

onnx::ModelProto EmptyModel() {
  onnx::ModelProto model;
  model.set_ir_version(8);
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(17);
  model.mutable_graph()->set_name("g");
  return model;
}

onnx::NodeProto* AddNodeProto(onnx::GraphProto* graph, const std::string& op_type,
                              const std::vector<std::string>& inputs,
                              const std::vector<std::string>& outputs,
                              const std::string& name = "") {
  onnx::NodeProto* node = graph->add_node();
  node->set_op_type(op_type);
  if (!name.empty()) node->set_name(name);
  for (const std::string& input : inputs) node->add_input(input);
  for (const std::string& output : outputs) node->add_output(output);
  return node;
}

// x[N,3] float -> Relu -> y
onnx::ModelProto ReluModel() {
  onnx::ModelProto model = EmptyModel();
  onnx::GraphProto* graph = model.mutable_graph();
  *graph->add_input() = TensorInfo("x", onnx::TensorProto::FLOAT, {"N", "3"});
  AddNodeProto(graph, "Relu", {"x"}, {"y"}, "relu");
  *graph->add_output() = TensorInfo("y", onnx::TensorProto::FLOAT, {"N", "3"});
  return model;
}

absl::StatusOr<Model> Import(const onnx::ModelProto& proto, const std::string& base_dir = "") {
  return ImportModel(proto, base_dir, "test.onnx");
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(kConformanceDir, error)) {
    if (fs::exists(entry.path() / "model.onnx")) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// ------------------------------------------------------------- round trips

TEST(OnnxIoRoundTrip, AllConformanceModels) {
  int count = 0;
  for (const std::string& name : CaseNames()) {
    const std::string path = kConformanceDir + "/" + name + "/model.onnx";
    absl::StatusOr<Model> model = LoadModel(path);
    EXPECT_TRUE(model.ok()) << name << ": " << model.status();
    if (!model.ok()) continue;
    EXPECT_EQ(model->graph->num_nodes(), 1) << name;  // every case is one node
    EXPECT_GE(model->ir_version, 6) << name;
    ExpectStableRoundTrip(*model, name);
    ++count;
  }
  EXPECT_EQ(count, 302) << "conformance models under " << kConformanceDir;
}

TEST(OnnxIoRoundTrip, AllSampleModels) {
  struct Expected {
    const char* file;
    const char* sample;
    int nodes;
    int initializers;
  };
  const Expected expected[] = {
      {"cnn_opset13.onnx", "cnn", 7, 6},
      {"cnn_opset17.onnx", "cnn", 7, 6},
      {"mlp_opset13.onnx", "mlp", 6, 6},
      {"mlp_opset17.onnx", "mlp", 6, 6},
      {"resnet_opset13.onnx", "resnet", 29, 42},
      {"resnet_opset17.onnx", "resnet", 29, 42},
      {"transformer_opset13.onnx", "transformer", 140, 39},
      {"transformer_opset17.onnx", "transformer", 90, 39},
  };
  int count = 0;
  for (const Expected& e : expected) {
    absl::StatusOr<Model> model = LoadModel(kModelsDir + "/" + e.file);
    ASSERT_TRUE(model.ok()) << e.file << ": " << model.status();
    const Graph& graph = *model->graph;
    EXPECT_EQ(graph.num_nodes(), e.nodes) << e.file;
    EXPECT_EQ(graph.initializers().size(), static_cast<size_t>(e.initializers)) << e.file;
    ASSERT_NE(model->FindMetadata("castor.sample"), nullptr) << e.file;
    EXPECT_EQ(*model->FindMetadata("castor.sample"), e.sample) << e.file;
    EXPECT_EQ(model->producer_name, "pytorch") << e.file;
    EXPECT_FALSE(model->doc_string.empty()) << e.file;
    ASSERT_EQ(graph.inputs().size(), 1u) << e.file;
    EXPECT_EQ(graph.inputs()[0]->name(), "input");
    EXPECT_EQ(graph.inputs()[0]->dtype(), DType::kFloat32);
    EXPECT_EQ(graph.inputs()[0]->shape().ToString(), "[N,1,28,28]") << e.file;
    ASSERT_EQ(graph.outputs().size(), 1u);
    EXPECT_EQ(graph.outputs()[0]->name(), "logits");
    EXPECT_EQ(graph.outputs()[0]->shape().ToString(), "[N,10]") << e.file;
    for (const Node* node : graph.nodes()) EXPECT_FALSE(node->name().empty()) << e.file;
    ExpectStableRoundTrip(*model, e.file);
    ++count;
  }
  EXPECT_EQ(count, 8);
}

// Each input_K.pb / output_K.pb loads and matches the declared type.
TEST(OnnxIoConformanceData, TensorsMatchDeclaredTypes) {
  int cases = 0;
  int tensors = 0;
  for (const std::string& name : CaseNames()) {
    const std::string dir = kConformanceDir + "/" + name;
    absl::StatusOr<Model> model = LoadModel(dir + "/model.onnx");
    ASSERT_TRUE(model.ok()) << name << ": " << model.status();
    const Graph& graph = *model->graph;
    int found = 0;
    for (const char* kind : {"input", "output"}) {
      const std::vector<Value*>& declared =
          std::string(kind) == "input" ? graph.inputs() : graph.outputs();
      for (int k = 0;; ++k) {
        const std::string path = absl::StrCat(dir, "/test_data_set_0/", kind, "_", k, ".pb");
        if (!fs::exists(path)) {
          EXPECT_EQ(static_cast<size_t>(k), declared.size()) << path;
          break;
        }
        absl::StatusOr<Tensor> tensor = LoadTensorProtoFile(path);
        ASSERT_TRUE(tensor.ok()) << path << ": " << tensor.status();
        ASSERT_LT(static_cast<size_t>(k), declared.size()) << path;
        const Value& value = *declared[k];
        EXPECT_EQ(tensor->dtype(), value.dtype()) << path << " vs " << value.name();
        if (std::optional<std::vector<int64_t>> dims = value.shape().StaticDims()) {
          EXPECT_EQ(tensor->dims(), *dims) << path << " vs " << value.name();
        } else if (value.shape().rank_known()) {
          EXPECT_EQ(static_cast<int>(tensor->dims().size()), value.shape().rank()) << path;
        }
        ++found;
      }
    }
    EXPECT_GE(found, static_cast<int>(graph.outputs().size())) << name;
    EXPECT_GE(graph.outputs().size(), 1u) << name;
    tensors += found;
    ++cases;
  }
  EXPECT_EQ(cases, 302);
  EXPECT_GT(tensors, 2 * 302);
}

// ---------------------------------------------------------------- tensors

TEST(OnnxIoTensors, TypedFieldsOfEveryDType) {
  auto make = [](int32_t type, std::vector<int64_t> dims) {
    onnx::TensorProto t;
    t.set_name("t");
    t.set_data_type(type);
    for (int64_t d : dims) t.add_dims(d);
    return t;
  };
  {
    onnx::TensorProto p = make(onnx::TensorProto::FLOAT, {2});
    p.add_float_data(1.5f);
    p.add_float_data(-2.0f);
    absl::StatusOr<Tensor> t = TensorFromProto(p, "");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->dtype(), DType::kFloat32);
    EXPECT_EQ(t->data<float>()[0], 1.5f);
    EXPECT_EQ(t->data<float>()[1], -2.0f);
  }
  {
    onnx::TensorProto p = make(onnx::TensorProto::DOUBLE, {1});
    p.add_double_data(0.1);
    absl::StatusOr<Tensor> t = TensorFromProto(p, "");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->data<double>()[0], 0.1);
  }
  struct IntCase {
    int32_t type;
    DType dtype;
    std::vector<int32_t> values;
  };
  const IntCase int32_cases[] = {
      {onnx::TensorProto::INT8, DType::kInt8, {-128, 7, 127}},
      {onnx::TensorProto::INT16, DType::kInt16, {-32768, 5, 32767}},
      {onnx::TensorProto::INT32, DType::kInt32, {-2147483647, 0, 2147483647}},
      {onnx::TensorProto::UINT8, DType::kUInt8, {0, 200, 255}},
      {onnx::TensorProto::UINT16, DType::kUInt16, {0, 60000, 65535}},
      {onnx::TensorProto::BOOL, DType::kBool, {1, 0, 1}},
  };
  for (const IntCase& c : int32_cases) {
    onnx::TensorProto p = make(c.type, {3});
    for (int32_t v : c.values) p.add_int32_data(v);
    absl::StatusOr<Tensor> t = TensorFromProto(p, "");
    ASSERT_TRUE(t.ok()) << DTypeName(c.dtype) << ": " << t.status();
    EXPECT_EQ(t->dtype(), c.dtype);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(t->GetInt64(k), c.values[k]) << DTypeName(c.dtype) << " element " << k;
    }
  }
  {
    onnx::TensorProto p = make(onnx::TensorProto::FLOAT16, {2});
    p.add_int32_data(0x3C00);  // 1.0
    p.add_int32_data(0xC000);  // -2.0
    absl::StatusOr<Tensor> t = TensorFromProto(p, "");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->data<uint16_t>()[0], 0x3C00);
    EXPECT_EQ(t->GetDouble(1), -2.0);
  }
  {
    onnx::TensorProto p = make(onnx::TensorProto::BFLOAT16, {2});
    p.add_int32_data(0x3F80);  // 1.0
    p.add_int32_data(0x4040);  // 3.0
    absl::StatusOr<Tensor> t = TensorFromProto(p, "");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->data<uint16_t>()[1], 0x4040);
    EXPECT_EQ(t->GetDouble(0), 1.0);
    EXPECT_EQ(t->GetDouble(1), 3.0);
  }
  {
    onnx::TensorProto p = make(onnx::TensorProto::INT64, {2});
    p.add_int64_data(-(int64_t{1} << 40));
    p.add_int64_data(9);
    absl::StatusOr<Tensor> t = TensorFromProto(p, "");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->ToInt64Vector(), (std::vector<int64_t>{-(int64_t{1} << 40), 9}));
  }
  {
    onnx::TensorProto p = make(onnx::TensorProto::UINT32, {1});
    p.add_uint64_data(4000000000u);
    absl::StatusOr<Tensor> t = TensorFromProto(p, "");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->data<uint32_t>()[0], 4000000000u);
  }
  {
    onnx::TensorProto p = make(onnx::TensorProto::UINT64, {1});
    p.add_uint64_data(uint64_t{1} << 63);
    absl::StatusOr<Tensor> t = TensorFromProto(p, "");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->data<uint64_t>()[0], uint64_t{1} << 63);
  }
  {
    onnx::TensorProto p = make(onnx::TensorProto::STRING, {2});
    p.add_string_data("hello");
    p.add_string_data(std::string("a\0b", 3));
    absl::StatusOr<Tensor> t = TensorFromProto(p, "");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->strings(), (std::vector<std::string>{"hello", std::string("a\0b", 3)}));
    // Export writes strings to string_data and reads back equal.
    onnx::TensorProto out = TensorToProto(*t, "s");
    EXPECT_EQ(out.string_data_size(), 2);
    EXPECT_FALSE(out.has_raw_data());
    absl::StatusOr<Tensor> back = TensorFromProto(out, "");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, *t);
  }
  {  // a scalar from typed data, exported as raw_data, reads back equal
    onnx::TensorProto p = make(onnx::TensorProto::FLOAT, {});
    p.add_float_data(3.25f);
    absl::StatusOr<Tensor> t = TensorFromProto(p, "");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->num_elements(), 1);
    onnx::TensorProto out = TensorToProto(*t, "s");
    EXPECT_EQ(out.raw_data().size(), 4u);
    EXPECT_EQ(out.float_data_size(), 0);
    absl::StatusOr<Tensor> back = TensorFromProto(out, "");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, *t);
  }
}

TEST(OnnxIoTensors, TypedFieldCountMismatchIsAnError) {
  onnx::TensorProto p;
  p.set_name("weights");
  p.set_data_type(onnx::TensorProto::FLOAT);
  p.add_dims(3);
  p.add_float_data(1);
  p.add_float_data(2);
  absl::StatusOr<Tensor> t = TensorFromProto(p, "");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("'weights'"));
  EXPECT_THAT(t.status().message(), HasSubstr("float_data"));

  onnx::TensorProto complex;
  complex.set_name("c");
  complex.set_data_type(onnx::TensorProto::COMPLEX64);
  EXPECT_EQ(TensorFromProto(complex, "").status().code(), absl::StatusCode::kUnimplemented);
}

TEST(OnnxIoTensors, RawDataIsLittleEndian) {
  onnx::TensorProto p;
  p.set_name("r");
  p.set_data_type(onnx::TensorProto::INT32);
  p.add_dims(2);
  p.set_raw_data(std::string("\x01\x02\x00\x00\xff\xff\xff\xff", 8));
  absl::StatusOr<Tensor> t = TensorFromProto(p, "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->ToInt64Vector(), (std::vector<int64_t>{0x0201, -1}));

  p.set_raw_data(std::string("\x01\x02\x00", 3));
  absl::StatusOr<Tensor> short_tensor = TensorFromProto(p, "");
  ASSERT_FALSE(short_tensor.ok());
  EXPECT_THAT(short_tensor.status().message(), HasSubstr("'r'"));
  EXPECT_THAT(short_tensor.status().message(), HasSubstr("3 bytes of raw_data; expected 8"));
}

onnx::TensorProto ExternalTensor(const std::string& location, int64_t offset, int64_t length) {
  onnx::TensorProto p;
  p.set_name("ext_weight");
  p.set_data_type(onnx::TensorProto::FLOAT);
  p.add_dims(3);
  p.set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* key, const std::string& value) {
    onnx::StringStringEntryProto* e = p.add_external_data();
    e->set_key(key);
    e->set_value(value);
  };
  add("location", location);
  add("offset", std::to_string(offset));
  if (length >= 0) add("length", std::to_string(length));
  return p;
}

TEST(OnnxIoTensors, ExternalData) {
  TempDir dir;
  const float values[3] = {1.5f, -2.5f, 8.0f};
  std::string data(8, 'x');  // 8 bytes of padding before the tensor
  data.append(reinterpret_cast<const char*>(values), sizeof values);
  WriteBytes(dir.Path("weights.bin"), data);

  onnx::ModelProto model = EmptyModel();
  onnx::GraphProto* graph = model.mutable_graph();
  *graph->add_initializer() = ExternalTensor("weights.bin", 8, 12);
  AddNodeProto(graph, "Relu", {"ext_weight"}, {"y"}, "relu");
  *graph->add_output() = TensorInfo("y", onnx::TensorProto::FLOAT, {"3"});
  WriteBytes(dir.Path("model.onnx"), model.SerializeAsString());

  absl::StatusOr<Model> loaded = LoadModel(dir.Path("model.onnx"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Value* weight = loaded->graph->FindValue("ext_weight");
  ASSERT_NE(weight, nullptr);
  ASSERT_NE(weight->initializer(), nullptr);
  EXPECT_EQ(weight->initializer()->dims(), (std::vector<int64_t>{3}));
  EXPECT_EQ(weight->initializer()->data<float>()[0], 1.5f);
  EXPECT_EQ(weight->initializer()->data<float>()[2], 8.0f);
  // Export inlines the data as raw_data.
  absl::StatusOr<onnx::ModelProto> exported = ExportModel(*loaded);
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->graph().initializer(0).data_location(), onnx::TensorProto::DEFAULT);
  EXPECT_EQ(exported->graph().initializer(0).raw_data(), data.substr(8));
  ExpectStableRoundTrip(*loaded, "external data");

  // A missing file.
  *model.mutable_graph()->mutable_initializer(0) = ExternalTensor("missing.bin", 0, -1);
  WriteBytes(dir.Path("model.onnx"), model.SerializeAsString());
  absl::StatusOr<Model> missing = LoadModel(dir.Path("model.onnx"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.bin"));
  EXPECT_THAT(missing.status().message(), HasSubstr("'ext_weight'"));

  // An offset past the end of the file (24 bytes; 12 needed at 16).
  *model.mutable_graph()->mutable_initializer(0) = ExternalTensor("weights.bin", 16, 12);
  WriteBytes(dir.Path("model.onnx"), model.SerializeAsString());
  absl::StatusOr<Model> out_of_range = LoadModel(dir.Path("model.onnx"));
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(out_of_range.status().message(), HasSubstr("'ext_weight'"));
  EXPECT_THAT(out_of_range.status().message(), HasSubstr("weights.bin has 20 bytes"));
  EXPECT_THAT(out_of_range.status().message(), HasSubstr("offset 16"));

  // A length that does not match the tensor.
  *model.mutable_graph()->mutable_initializer(0) = ExternalTensor("weights.bin", 0, 16);
  absl::StatusOr<Model> bad_length = Import(model, dir.path());
  ASSERT_FALSE(bad_length.ok());
  EXPECT_THAT(bad_length.status().message(), HasSubstr("length 16"));

  // Paths leaving the model's directory are refused.
  for (const std::string& location : {std::string("../weights.bin"), dir.Path("weights.bin")}) {
    *model.mutable_graph()->mutable_initializer(0) = ExternalTensor(location, 8, 12);
    absl::StatusOr<Model> escaped = Import(model, dir.path());
    ASSERT_FALSE(escaped.ok()) << location;
    EXPECT_EQ(escaped.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(escaped.status().message(), HasSubstr(location));
  }
}

// A tensor declaring far more elements than its data holds is refused
// before anything is allocated (each case would otherwise allocate 4 TiB and
// abort on std::bad_alloc): raw, typed, string and external data.
TEST(OnnxIoTensors, DeclaredSizeIsCheckedBeforeAllocating) {
  const int64_t huge = int64_t{1} << 40;
  onnx::TensorProto raw;
  raw.set_name("bias");
  raw.set_data_type(onnx::TensorProto::FLOAT);
  raw.add_dims(huge);
  raw.set_raw_data(std::string(40, '\0'));
  absl::StatusOr<Tensor> t = TensorFromProto(raw, "");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(),
              HasSubstr("'bias' (float32, 1099511627776 elements) has 40 bytes of raw_data; "
                        "expected 4398046511104"));

  onnx::TensorProto typed;
  typed.set_name("w");
  typed.set_data_type(onnx::TensorProto::FLOAT);
  typed.add_dims(huge);
  typed.add_float_data(1);
  t = TensorFromProto(typed, "");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("has 1 values in float_data"));

  onnx::TensorProto strings;
  strings.set_name("s");
  strings.set_data_type(onnx::TensorProto::STRING);
  strings.add_dims(huge);
  strings.add_string_data("a");
  t = TensorFromProto(strings, "");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("has 1 values in string_data"));

  TempDir dir;
  WriteBytes(dir.Path("weights.bin"), std::string(40, 'x'));
  onnx::TensorProto external = ExternalTensor("weights.bin", 0, -1);
  external.set_dims(0, huge);
  t = TensorFromProto(external, dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(t.status().message(),
              HasSubstr("weights.bin has 40 bytes; the tensor needs 4398046511104 bytes"));

  // Past 2^62 bytes the count itself is refused (no overflow to 0 bytes).
  onnx::TensorProto overflow;
  overflow.set_name("o");
  overflow.set_data_type(onnx::TensorProto::FLOAT);
  overflow.add_dims(int64_t{1} << 62);
  overflow.add_dims(4);
  t = TensorFromProto(overflow, "");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("'o' is too large"));
}

// External data is read from regular files inside the model's directory
// only, symlinks followed: a directory link `etc -> /etc` beside the model
// does not let `etc/passwd` through, and a FIFO is refused, not waited on.
TEST(OnnxIoTensors, ExternalDataStaysInsideTheModelsDirectory) {
  TempDir outside;
  WriteBytes(outside.Path("secret.bin"), std::string(12, 's'));
  TempDir dir;
  fs::create_directory_symlink(outside.path(), dir.Path("etc"));
  absl::StatusOr<Tensor> t = TensorFromProto(ExternalTensor("etc/secret.bin", 0, 12), dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("'etc/secret.bin' resolves to "));
  EXPECT_THAT(t.status().message(), HasSubstr("outside the model's directory"));

  fs::create_symlink(outside.Path("secret.bin"), dir.Path("link.bin"));
  t = TensorFromProto(ExternalTensor("link.bin", 0, 12), dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("outside the model's directory"));

  // A link that stays inside is fine.
  WriteBytes(dir.Path("real.bin"), std::string(12, '\0'));
  fs::create_symlink("real.bin", dir.Path("alias.bin"));
  t = TensorFromProto(ExternalTensor("alias.bin", 0, 12), dir.path());
  EXPECT_TRUE(t.ok()) << t.status();

  ASSERT_EQ(mkfifo(dir.Path("fifo.bin").c_str(), 0600), 0);
  t = TensorFromProto(ExternalTensor("fifo.bin", 0, 12), dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("fifo.bin is not a regular file"));
}

TEST(OnnxIoErrors, ModelThatIsNotARegularFile) {
  TempDir dir;
  ASSERT_EQ(mkfifo(dir.Path("model.onnx").c_str(), 0600), 0);
  absl::StatusOr<Model> loaded = LoadModel(dir.Path("model.onnx"));  // must not block
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("model.onnx: not a regular file"));
  loaded = LoadModel(dir.path());
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("not a regular file"));
}

TEST(OnnxIoErrors, UnknownIrVersionAndNegativeDims) {
  TempDir dir;
  onnx::ModelProto model = ReluModel();
  model.set_ir_version(99);
  WriteBytes(dir.Path("model.onnx"), model.SerializeAsString());
  absl::StatusOr<Model> loaded = LoadModel(dir.Path("model.onnx"));
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("IR version 99 is newer than castor knows"));

  model = ReluModel();
  model.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()
      ->mutable_shape()->mutable_dim(1)->set_dim_value(-3);
  absl::StatusOr<Model> negative = Import(model);
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.status().message(), HasSubstr("has negative dimension -3 at axis 1"));
  EXPECT_THAT(negative.status().message(), HasSubstr("'x'"));
}

// ------------------------------------------------------------------ import

TEST(OnnxIoImport, InitializerThatIsAlsoGraphInput) {
  onnx::ModelProto proto = EmptyModel();
  onnx::GraphProto* graph = proto.mutable_graph();
  *graph->add_input() = TensorInfo("x", onnx::TensorProto::FLOAT, {"N", "2"});
  *graph->add_input() = TensorInfo("bias", onnx::TensorProto::FLOAT, {"2"});
  onnx::TensorProto* bias = graph->add_initializer();
  bias->set_name("bias");
  bias->set_data_type(onnx::TensorProto::FLOAT);
  bias->add_dims(2);
  bias->add_float_data(0.5f);
  bias->add_float_data(0.25f);
  onnx::TensorProto* scale = graph->add_initializer();  // not an input
  scale->set_name("scale");
  scale->set_data_type(onnx::TensorProto::FLOAT);
  scale->add_float_data(3.0f);
  AddNodeProto(graph, "Add", {"x", "bias"}, {"a"}, "add");
  AddNodeProto(graph, "Mul", {"a", "scale"}, {"y"}, "mul");
  *graph->add_output() = TensorInfo("y", onnx::TensorProto::FLOAT, {"N", "2"});

  absl::StatusOr<Model> model = Import(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  const Graph& g = *model->graph;
  ASSERT_EQ(g.inputs().size(), 2u);
  EXPECT_EQ(g.inputs()[1]->name(), "bias");
  EXPECT_TRUE(g.inputs()[1]->is_graph_input());
  ASSERT_NE(g.inputs()[1]->initializer(), nullptr);
  EXPECT_EQ(g.inputs()[1]->initializer()->data<float>()[1], 0.25f);
  ASSERT_EQ(g.initializers().size(), 2u);
  EXPECT_EQ(g.initializers()[0]->name(), "bias");
  EXPECT_EQ(g.initializers()[1]->name(), "scale");
  EXPECT_FALSE(g.initializers()[1]->is_graph_input());
  EXPECT_EQ(g.initializers()[1]->shape(), Shape::Scalar());

  absl::StatusOr<onnx::ModelProto> exported = ExportModel(*model);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->graph().input_size(), 2);
  EXPECT_EQ(exported->graph().input(1).name(), "bias");
  EXPECT_EQ(exported->graph().input(1).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
  ASSERT_EQ(exported->graph().initializer_size(), 2);
  EXPECT_EQ(exported->graph().initializer(0).name(), "bias");
  ExpectStableRoundTrip(*model, "initializer input");

  // A declared dtype that contradicts the initializer is refused.
  graph->mutable_input(1)->mutable_type()->mutable_tensor_type()->set_elem_type(
      onnx::TensorProto::INT64);
  absl::StatusOr<Model> mismatch = Import(proto);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_THAT(mismatch.status().message(), HasSubstr("'bias'"));
}

TEST(OnnxIoImport, ValueInfoKept) {
  onnx::ModelProto proto = ReluModel();
  onnx::GraphProto* graph = proto.mutable_graph();
  graph->mutable_node(0)->set_output(0, "r");
  AddNodeProto(graph, "Neg", {"r"}, {"y"}, "neg");
  *graph->add_value_info() = TensorInfo("r", onnx::TensorProto::FLOAT, {"N", "3"});
  graph->mutable_value_info(0)->set_doc_string("relu output");
  *graph->add_value_info() = TensorInfo("nowhere", onnx::TensorProto::FLOAT, {"1"});  // ignored

  absl::StatusOr<Model> model = Import(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  const Value* r = model->graph->FindValue("r");
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->has_value_info());
  EXPECT_EQ(r->dtype(), DType::kFloat32);
  EXPECT_EQ(r->shape().ToString(), "[N,3]");
  EXPECT_EQ(r->doc_string(), "relu output");
  EXPECT_EQ(model->graph->FindValue("nowhere"), nullptr);
  EXPECT_FALSE(model->graph->FindValue("y")->has_value_info());

  absl::StatusOr<onnx::ModelProto> exported = ExportModel(*model);
  ASSERT_TRUE(exported.ok());
  ASSERT_EQ(exported->graph().value_info_size(), 1);
  EXPECT_EQ(exported->graph().value_info(0).name(), "r");
  EXPECT_EQ(exported->graph().value_info(0).type().tensor_type().shape().dim(0).dim_param(), "N");
  ExpectStableRoundTrip(*model, "value_info");
}

TEST(OnnxIoImport, GraphOutputsMayBeInputsOrInitializers) {
  onnx::ModelProto proto = ReluModel();
  onnx::GraphProto* graph = proto.mutable_graph();
  onnx::TensorProto* w = graph->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::INT64);
  w->add_dims(1);
  w->add_int64_data(11);
  *graph->add_output() = TensorInfo("x", onnx::TensorProto::FLOAT, {"N", "3"});
  *graph->add_output() = TensorInfo("w", onnx::TensorProto::INT64, {"1"});
  absl::StatusOr<Model> model = Import(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<Value*>& outputs = model->graph->outputs();
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_TRUE(outputs[1]->is_graph_input());
  EXPECT_TRUE(outputs[1]->is_graph_output());
  ASSERT_NE(outputs[2]->initializer(), nullptr);
  EXPECT_EQ(outputs[2]->initializer()->GetInt64(0), 11);
  ExpectStableRoundTrip(*model, "outputs that are inputs");

  // The comparison reports a changed initializer element.
  absl::StatusOr<Model> changed = Import(proto);
  ASSERT_TRUE(changed.ok());
  changed->graph->FindValue("w")->mutable_initializer()->data<int64_t>()[0] = 12;
  EXPECT_EQ(DescribeModelDifference(*model, *changed),
            "initializer 0 'w': initializer element 0 differs: 11 vs 12");
}

TEST(OnnxIoImport, MetadataAndDocStringsKept) {
  onnx::ModelProto proto = ReluModel();
  proto.set_producer_name("unit-test");
  proto.set_producer_version("1.2.3");
  proto.set_domain("org.castor");
  proto.set_model_version(42);
  proto.set_doc_string("model doc");
  auto* entry = proto.add_metadata_props();
  entry->set_key("author");
  entry->set_value("castor");
  proto.mutable_opset_import(0)->set_domain("ai.onnx");  // canonicalised to ""
  auto* training_opset = proto.add_opset_import();
  training_opset->set_domain("ai.onnx.preview.training");
  training_opset->set_version(1);
  onnx::GraphProto* graph = proto.mutable_graph();
  graph->set_doc_string("graph doc");
  graph->mutable_input(0)->set_doc_string("the input");
  graph->mutable_node(0)->set_doc_string("node doc");
  graph->mutable_output(0)->set_doc_string("the output");
  onnx::FunctionProto* function = proto.add_functions();
  function->set_name("MyFunction");
  function->set_domain("custom");
  onnx::TrainingInfoProto* training = proto.add_training_info();
  training->mutable_algorithm()->set_name("step");

  absl::StatusOr<Model> model = Import(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->producer_name, "unit-test");
  EXPECT_EQ(model->producer_version, "1.2.3");
  EXPECT_EQ(model->domain, "org.castor");
  EXPECT_EQ(model->model_version, 42);
  EXPECT_EQ(model->doc_string, "model doc");
  ASSERT_NE(model->FindMetadata("author"), nullptr);
  EXPECT_EQ(*model->FindMetadata("author"), "castor");
  EXPECT_EQ(model->OpsetVersion(""), 17);
  EXPECT_EQ(model->opset_imports[0].domain, "");
  EXPECT_EQ(model->OpsetVersion("ai.onnx.preview.training"), 1);
  EXPECT_EQ(model->graph->doc_string(), "graph doc");
  EXPECT_EQ(model->graph->inputs()[0]->doc_string(), "the input");
  EXPECT_EQ(model->graph->outputs()[0]->doc_string(), "the output");
  EXPECT_EQ(model->graph->nodes()[0]->doc_string(), "node doc");
  ASSERT_EQ(model->serialized_functions.size(), 1u);
  ASSERT_EQ(model->serialized_training_info.size(), 1u);

  absl::StatusOr<onnx::ModelProto> exported = ExportModel(*model);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->functions(0).name(), "MyFunction");
  EXPECT_EQ(exported->training_info(0).algorithm().name(), "step");
  EXPECT_EQ(exported->metadata_props(0).value(), "castor");
  EXPECT_EQ(exported->graph().node(0).doc_string(), "node doc");
  ExpectStableRoundTrip(*model, "metadata");

  // The comparison sees a changed doc string.
  absl::StatusOr<Model> other = Import(proto);
  ASSERT_TRUE(other.ok());
  other->graph->nodes()[0]->set_doc_string("changed");
  EXPECT_EQ(DescribeModelDifference(*model, *other),
            "node 0 'relu': doc_string \"node doc\" vs \"changed\"");
}

// If node whose branches read outer values; the else branch nests another If.
onnx::ModelProto IfModel() {
  onnx::ModelProto proto = EmptyModel();
  onnx::GraphProto* graph = proto.mutable_graph();
  *graph->add_input() = TensorInfo("cond", onnx::TensorProto::BOOL, {});
  *graph->add_input() = TensorInfo("x", onnx::TensorProto::FLOAT, {"2"});
  *graph->add_input() = TensorInfo("y", onnx::TensorProto::FLOAT, {"2"});
  AddNodeProto(graph, "Neg", {"x"}, {"neg_x"}, "neg");
  onnx::NodeProto* if_node = AddNodeProto(graph, "If", {"cond"}, {"out"}, "branch");

  onnx::AttributeProto* then_attr = if_node->add_attribute();
  then_attr->set_name("then_branch");
  then_attr->set_type(onnx::AttributeProto::GRAPH);
  onnx::GraphProto* then_graph = then_attr->mutable_g();
  then_graph->set_name("then");
  AddNodeProto(then_graph, "Identity", {"neg_x"}, {"then_out"});
  *then_graph->add_output() = TensorInfo("then_out", onnx::TensorProto::FLOAT, {"2"});

  onnx::AttributeProto* else_attr = if_node->add_attribute();
  else_attr->set_name("else_branch");
  else_attr->set_type(onnx::AttributeProto::GRAPH);
  onnx::GraphProto* else_graph = else_attr->mutable_g();
  else_graph->set_name("else");
  onnx::NodeProto* inner_if = AddNodeProto(else_graph, "If", {"cond"}, {"else_out"});
  for (const char* branch : {"then_branch", "else_branch"}) {
    onnx::AttributeProto* a = inner_if->add_attribute();
    a->set_name(branch);
    a->set_type(onnx::AttributeProto::GRAPH);
    onnx::GraphProto* body = a->mutable_g();
    body->set_name(branch);
    // The inner body reads y from two scopes up and its own local value.
    AddNodeProto(body, "Neg", {"y"}, {"local"});
    AddNodeProto(body, "Identity", {"local"}, {"inner_out"});
    *body->add_output() = TensorInfo("inner_out", onnx::TensorProto::FLOAT, {"2"});
  }
  *else_graph->add_output() = TensorInfo("else_out", onnx::TensorProto::FLOAT, {"2"});
  *graph->add_output() = TensorInfo("out", onnx::TensorProto::FLOAT, {"2"});
  return proto;
}

TEST(OnnxIoImport, IfSubgraphReadsOuterValues) {
  const onnx::ModelProto proto = IfModel();
  absl::StatusOr<Model> model = Import(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  const Node* if_node = model->graph->FindNode("branch");
  ASSERT_NE(if_node, nullptr);
  std::vector<std::string> implicit;
  for (const Value* v : if_node->implicit_inputs()) implicit.push_back(v->name());
  EXPECT_EQ(implicit, (std::vector<std::string>{"neg_x", "cond", "y"}));
  // neg_x's use list includes the implicit use, so Neg stays live.
  const Value* neg_x = model->graph->FindValue("neg_x");
  ASSERT_EQ(neg_x->uses().size(), 1u);
  EXPECT_EQ(neg_x->uses()[0].index, -1);
  const Attribute* then_branch = if_node->attribute("then_branch");
  ASSERT_NE(then_branch, nullptr);
  EXPECT_EQ(then_branch->kind, AttrKind::kGraph);
  ASSERT_EQ(then_branch->serialized.size(), 1u);
  EXPECT_EQ(then_branch->serialized[0], proto.graph().node(1).attribute(0).g().SerializeAsString());

  absl::StatusOr<onnx::ModelProto> exported = ExportModel(*model);
  ASSERT_TRUE(exported.ok()) << exported.status();
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(exported->graph().node(1).attribute(k).g().SerializeAsString(),
              proto.graph().node(1).attribute(k).g().SerializeAsString())
        << "subgraph " << k << " bytes changed";
  }
  ExpectStableRoundTrip(*model, "If");

  // A subgraph reading a name nobody defines is an error naming it.
  onnx::ModelProto bad = proto;
  onnx::GraphProto* bad_body =
      bad.mutable_graph()->mutable_node(1)->mutable_attribute(0)->mutable_g();
  bad_body->mutable_node(0)->set_input(0, "ghost");
  absl::StatusOr<Model> failed = Import(bad);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(failed.status().message(), HasSubstr("'ghost'"));
  EXPECT_THAT(failed.status().message(), HasSubstr("'branch'"));
}

TEST(OnnxIoImport, NodeMetadataRoundTrip) {
  // A newer-IR model: NodeProto field 9 (metadata_props) is unknown to the
  // ONNX 1.12 classes.
  onnx::ModelProto proto = ReluModel();
  onnx::StringStringEntryProto entry;
  entry.set_key("castor.autocast");
  entry.set_value("allow: MatMul");
  proto.mutable_graph()->mutable_node(0)->mutable_unknown_fields()->AddLengthDelimited(
      9, entry.SerializeAsString());
  onnx::ModelProto reparsed;
  ASSERT_TRUE(reparsed.ParseFromString(proto.SerializeAsString()));
  absl::StatusOr<Model> model = Import(reparsed);
  ASSERT_TRUE(model.ok()) << model.status();
  Node* node = model->graph->nodes()[0];
  ASSERT_NE(node->FindMetadata("castor.autocast"), nullptr);
  EXPECT_EQ(*node->FindMetadata("castor.autocast"), "allow: MatMul");

  node->SetMetadata("castor.why", "rule 4");
  absl::StatusOr<onnx::ModelProto> exported = ExportModel(*model);
  ASSERT_TRUE(exported.ok());
  const google::protobuf::UnknownFieldSet& unknown = exported->graph().node(0).unknown_fields();
  ASSERT_EQ(unknown.field_count(), 2);
  EXPECT_EQ(unknown.field(1).number(), 9);
  onnx::StringStringEntryProto written;
  ASSERT_TRUE(written.ParseFromString(unknown.field(1).length_delimited()));
  EXPECT_EQ(written.key(), "castor.why");
  EXPECT_EQ(written.value(), "rule 4");
  ExpectStableRoundTrip(*model, "node metadata");

  absl::StatusOr<Model> plain = Import(ReluModel());
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT(DescribeModelDifference(*plain, *model), HasSubstr("node 0 'relu': metadata {}"));
}

TEST(OnnxIoImport, NodeNamesMadeUnique) {
  onnx::ModelProto proto = EmptyModel();
  onnx::GraphProto* graph = proto.mutable_graph();
  *graph->add_input() = TensorInfo("x", onnx::TensorProto::FLOAT, {"4"});
  AddNodeProto(graph, "Relu", {"x"}, {"a"});              // -> Relu_1 (Relu_0 is taken below)
  AddNodeProto(graph, "Neg", {"a"}, {"b"}, "dup");         // keeps dup
  AddNodeProto(graph, "Neg", {"b"}, {"c"}, "dup");         // -> dup_0
  AddNodeProto(graph, "Relu", {"c"}, {"d"}, "Relu_0");     // keeps its name
  AddNodeProto(graph, "Relu", {"d"}, {"e"});               // -> Relu_2
  *graph->add_output() = TensorInfo("e", onnx::TensorProto::FLOAT, {"4"});
  absl::StatusOr<Model> model = Import(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> names;
  for (const Node* node : model->graph->nodes()) names.push_back(node->name());
  EXPECT_EQ(names, (std::vector<std::string>{"Relu_1", "dup", "dup_0", "Relu_0", "Relu_2"}));
  ExpectStableRoundTrip(*model, "node names");
}

TEST(OnnxIoImport, ForwardReferencesAndOmittedOptionals) {
  onnx::ModelProto proto = EmptyModel();
  onnx::GraphProto* graph = proto.mutable_graph();
  *graph->add_input() = TensorInfo("x", onnx::TensorProto::FLOAT, {"4"});
  // File order is reversed: the consumer comes before its producer.
  AddNodeProto(graph, "Clip", {"r", "", "hi"}, {"y"}, "clip");  // min omitted
  AddNodeProto(graph, "Relu", {"x"}, {"r"}, "relu");
  AddNodeProto(graph, "Constant", {}, {"hi"}, "const")->add_attribute()->CopyFrom([] {
    onnx::AttributeProto a;
    a.set_name("value_float");
    a.set_type(onnx::AttributeProto::FLOAT);
    a.set_f(6.0f);
    return a;
  }());
  // An omitted output in the middle gets a generated name; trailing ones are dropped.
  AddNodeProto(graph, "Split", {"y"}, {"s0", "", "s2", "", ""}, "split");
  *graph->add_output() = TensorInfo("s2", onnx::TensorProto::FLOAT, {"1"});
  absl::StatusOr<Model> model = Import(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> order;
  for (const Node* node : model->graph->nodes()) order.push_back(node->name());
  EXPECT_EQ(order, (std::vector<std::string>{"relu", "const", "clip", "split"}));
  const Node* clip = model->graph->FindNode("clip");
  ASSERT_EQ(clip->num_inputs(), 3);
  EXPECT_EQ(clip->input(0)->name(), "r");
  EXPECT_EQ(clip->input(1), nullptr);
  EXPECT_EQ(clip->input(2)->name(), "hi");
  const Node* split = model->graph->FindNode("split");
  ASSERT_EQ(split->num_outputs(), 3);
  EXPECT_EQ(split->output(1)->name(), "split_unused_out1");
  EXPECT_EQ(split->output(2)->name(), "s2");

  absl::StatusOr<onnx::ModelProto> exported = ExportModel(*model);
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->graph().node(2).input(1), "");
  ExpectStableRoundTrip(*model, "forward references");
}

TEST(OnnxIoImport, EveryAttributeKindRoundTrips) {
  onnx::ModelProto proto = ReluModel();
  onnx::NodeProto* node = proto.mutable_graph()->mutable_node(0);
  auto add = [&](const char* name, onnx::AttributeProto::AttributeType type) {
    onnx::AttributeProto* a = node->add_attribute();
    a->set_name(name);
    a->set_type(type);
    return a;
  };
  add("f", onnx::AttributeProto::FLOAT)->set_f(0.5f);
  add("i", onnx::AttributeProto::INT)->set_i(-7);
  add("s", onnx::AttributeProto::STRING)->set_s("NOTSET");
  onnx::TensorProto* t = add("t", onnx::AttributeProto::TENSOR)->mutable_t();
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(2);
  t->add_int64_data(4);
  t->add_int64_data(5);
  add("g", onnx::AttributeProto::GRAPH)->mutable_g()->set_name("body");
  auto* floats = add("floats", onnx::AttributeProto::FLOATS);
  floats->add_floats(1.0f);
  floats->add_floats(-0.0f);
  auto* ints = add("ints", onnx::AttributeProto::INTS);
  ints->add_ints(1);
  ints->add_ints(2);
  auto* strings = add("strings", onnx::AttributeProto::STRINGS);
  strings->add_strings("a");
  strings->add_strings("bc");
  onnx::TensorProto* t2 = add("tensors", onnx::AttributeProto::TENSORS)->add_tensors();
  t2->set_data_type(onnx::TensorProto::FLOAT);
  t2->add_float_data(9.0f);
  auto* graphs = add("graphs", onnx::AttributeProto::GRAPHS);
  graphs->add_graphs()->set_name("g0");
  graphs->add_graphs()->set_name("g1");
  onnx::SparseTensorProto* sparse =
      add("sparse", onnx::AttributeProto::SPARSE_TENSOR)->mutable_sparse_tensor();
  sparse->add_dims(4);
  sparse->mutable_values()->set_data_type(onnx::TensorProto::FLOAT);
  add("tp", onnx::AttributeProto::TYPE_PROTO)->mutable_tp()->mutable_tensor_type()->set_elem_type(
      onnx::TensorProto::FLOAT16);
  // An old-style attribute: type UNDEFINED, the value tells the kind.
  onnx::AttributeProto* untyped = node->add_attribute();
  untyped->set_name("old_ints");
  untyped->add_ints(3);
  add("documented", onnx::AttributeProto::INT)->set_doc_string("attr doc");

  absl::StatusOr<Model> model = Import(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  const Node& n = *model->graph->nodes()[0];
  ASSERT_EQ(n.attributes().size(), 14u);
  EXPECT_EQ(n.GetFloat("f", 0), 0.5f);
  EXPECT_EQ(n.GetInt("i", 0), -7);
  EXPECT_EQ(n.GetString("s", ""), "NOTSET");
  EXPECT_EQ(n.attribute("t")->t.ToInt64Vector(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(n.attribute("g")->kind, AttrKind::kGraph);
  EXPECT_EQ(n.attribute("floats")->floats, (std::vector<float>{1.0f, -0.0f}));
  EXPECT_EQ(n.GetInts("ints"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(n.attribute("strings")->strings, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(n.attribute("tensors")->tensors.at(0).GetDouble(0), 9.0);
  EXPECT_EQ(n.attribute("graphs")->serialized.size(), 2u);
  EXPECT_EQ(n.attribute("sparse")->kind, AttrKind::kSparseTensor);
  EXPECT_EQ(n.attribute("tp")->kind, AttrKind::kTypeProto);
  EXPECT_EQ(n.attribute("old_ints")->kind, AttrKind::kInts);
  EXPECT_EQ(n.GetInts("old_ints"), (std::vector<int64_t>{3}));
  EXPECT_EQ(n.attribute("documented")->doc_string, "attr doc");

  absl::StatusOr<onnx::ModelProto> exported = ExportModel(*model);
  ASSERT_TRUE(exported.ok()) << exported.status();
  const onnx::NodeProto& out = exported->graph().node(0);
  EXPECT_EQ(out.attribute(9).graphs(1).name(), "g1");
  EXPECT_EQ(out.attribute(11).tp().tensor_type().elem_type(), onnx::TensorProto::FLOAT16);
  EXPECT_EQ(out.attribute(12).type(), onnx::AttributeProto::INTS);
  ExpectStableRoundTrip(*model, "attributes");

  // The comparison names a changed attribute value.
  absl::StatusOr<Model> changed = Import(proto);
  ASSERT_TRUE(changed.ok());
  changed->graph->nodes()[0]->SetAttribute(Attribute::Ints("ints", {1, 3}));
  EXPECT_EQ(DescribeModelDifference(*model, *changed),
            "node 0 'relu': attribute 'ints' [1,2] vs [1,3]");
}

TEST(OnnxIoImport, NonTensorGraphInputIsUnimplemented) {
  onnx::ModelProto proto = ReluModel();
  onnx::ValueInfoProto* seq = proto.mutable_graph()->add_input();
  seq->set_name("sequence_in");
  onnx::TypeProto* element = seq->mutable_type()->mutable_sequence_type()->mutable_elem_type();
  element->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  absl::StatusOr<Model> model = Import(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(model.status().message(), HasSubstr("'sequence_in'"));
  EXPECT_THAT(model.status().message(), HasSubstr("sequence"));
}

TEST(OnnxIoImport, SparseInitializerIsUnimplemented) {
  onnx::ModelProto proto = ReluModel();
  onnx::SparseTensorProto* sparse = proto.mutable_graph()->add_sparse_initializer();
  sparse->mutable_values()->set_name("sparse_w");
  absl::StatusOr<Model> model = Import(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(model.status().message(), HasSubstr("'sparse_w'"));
}

// ------------------------------------------------------------------ errors

TEST(OnnxIoErrors, MissingFile) {
  const std::string path = "/nonexistent/castor/model.onnx";
  absl::StatusOr<Model> model = LoadModel(path);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(model.status().message(), HasSubstr(path));
  EXPECT_EQ(LoadTensorProtoFile(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(OnnxIoErrors, EmptyTruncatedAndRandomFiles) {
  TempDir dir;
  const std::string empty = dir.Path("empty.onnx");
  WriteBytes(empty, "");
  absl::StatusOr<Model> model = LoadModel(empty);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(model.status().message(), HasSubstr(empty));
  EXPECT_THAT(model.status().message(), HasSubstr("not a valid ONNX model"));

  const std::string whole = ReadBytes(kModelsDir + "/cnn_opset13.onnx");
  ASSERT_GT(whole.size(), 1000u);
  const std::string truncated = dir.Path("truncated.onnx");
  WriteBytes(truncated, whole.substr(0, whole.size() / 2));
  model = LoadModel(truncated);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(model.status().message(), HasSubstr(truncated));

  // A TensorProto parses as a protobuf message, but it is not a model.
  const std::string tensor_file = kConformanceDir + "/test_abs/test_data_set_0/input_0.pb";
  model = LoadModel(tensor_file);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(model.status().message(), HasSubstr(tensor_file));
  EXPECT_THAT(model.status().message(), HasSubstr("not a valid ONNX model"));

  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    std::string bytes(64 + trial * 97, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
    const std::string random = dir.Path(absl::StrCat("random", trial, ".onnx"));
    WriteBytes(random, bytes);
    model = LoadModel(random);
    ASSERT_FALSE(model.ok()) << random;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss) << model.status();
    EXPECT_THAT(model.status().message(), HasSubstr(random));
  }

  // A tensor file that is not a TensorProto.
  const std::string bad_tensor = dir.Path("bad.pb");
  WriteBytes(bad_tensor, "\xff\xff\xff");
  absl::StatusOr<Tensor> tensor = LoadTensorProtoFile(bad_tensor);
  ASSERT_FALSE(tensor.ok());
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(tensor.status().message(), HasSubstr(bad_tensor));
}

TEST(OnnxIoErrors, DanglingInputNamesNodeAndValue) {
  TempDir dir;
  onnx::ModelProto proto = ReluModel();
  proto.mutable_graph()->mutable_node(0)->set_input(0, "nobody");
  const std::string path = dir.Path("dangling.onnx");
  WriteBytes(path, proto.SerializeAsString());
  absl::StatusOr<Model> model = LoadModel(path);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(),
            absl::StrCat(path, ": node 'relu' (Relu) input 'nobody' is not defined by any graph "
                               "input, initializer or node output"));
}

TEST(OnnxIoErrors, DuplicateDefinitionsAndUndefinedOutputs) {
  onnx::ModelProto proto = ReluModel();
  AddNodeProto(proto.mutable_graph(), "Neg", {"x"}, {"y"}, "neg");
  absl::StatusOr<Model> model = Import(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("value 'y' is defined more than once"));
  EXPECT_THAT(model.status().message(), HasSubstr("'neg'"));

  onnx::ModelProto shadow = ReluModel();
  shadow.mutable_graph()->mutable_node(0)->set_output(0, "x");
  model = Import(shadow);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(),
              HasSubstr("'x' is defined more than once: it is a graph input"));

  onnx::ModelProto no_output = ReluModel();
  no_output.mutable_graph()->mutable_output(0)->set_name("missing_output");
  model = Import(no_output);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("'missing_output'"));

  onnx::ModelProto cycle = ReluModel();
  cycle.mutable_graph()->mutable_node(0)->set_input(0, "z");
  AddNodeProto(cycle.mutable_graph(), "Neg", {"y"}, {"z"}, "neg");
  model = Import(cycle);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("cycle"));

  onnx::ModelProto no_graph = ReluModel();
  no_graph.clear_graph();
  model = Import(no_graph);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("test.onnx: the model has no graph"));
}

// ------------------------------------------------------------------ export

TEST(OnnxIoExport, NonTopologicalOrderIsAnError) {
  Model model;
  Graph& graph = *model.graph;
  Value* x = *graph.AddInput("x", DType::kFloat32, Shape{4});
  Node* first = *graph.AddNode("Relu", {x}, {"a"}, "first");
  Node* second = *graph.AddNode("Neg", {x}, {"b"}, "second");
  first->SetInput(0, second->output(0));  // first now reads a later value
  graph.AddOutput(first->output(0));
  absl::StatusOr<onnx::ModelProto> exported = ExportModel(model);
  ASSERT_FALSE(exported.ok());
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(exported.status().message(), HasSubstr("node 'first' (Relu) input 'b'"));
  ASSERT_TRUE(graph.TopologicalSort().ok());
  exported = ExportModel(model);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->ir_version(), 8);  // a model built in code
  EXPECT_EQ(exported->graph().node(0).name(), "second");
}

// -------------------------------------------------------------------- save

TEST(OnnxIoSave, WritesAtomicallyAndReimportsEqual) {
  absl::StatusOr<Model> model = LoadModel(kModelsDir + "/resnet_opset17.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  TempDir dir;
  const std::string path = dir.Path("saved.onnx");
  WriteBytes(path, "old contents");
  ASSERT_TRUE(SaveModel(*model, path).ok());
  EXPECT_EQ(dir.Entries(), (std::vector<std::string>{"saved.onnx"}));  // no temp files left
  absl::StatusOr<Model> again = LoadModel(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(DescribeModelDifference(*model, *again), "");

  const std::string missing_dir = dir.Path("no_such_dir");
  absl::Status status = SaveModel(*model, missing_dir + "/saved.onnx");
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(missing_dir + "/saved.onnx"));
  EXPECT_FALSE(fs::exists(missing_dir));
  EXPECT_EQ(dir.Entries(), (std::vector<std::string>{"saved.onnx"}));

  // A model that cannot be exported leaves the existing file untouched.
  const std::string before = ReadBytes(path);
  Model broken;
  Value* x = *broken.graph->AddInput("x", DType::kFloat32, Shape{1});
  Node* a = *broken.graph->AddNode("Relu", {x}, {"a"}, "a");
  Node* b = *broken.graph->AddNode("Relu", {x}, {"b"}, "b");
  a->SetInput(0, b->output(0));
  status = SaveModel(broken, path);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(path));
  EXPECT_EQ(ReadBytes(path), before);
  EXPECT_EQ(dir.Entries(), (std::vector<std::string>{"saved.onnx"}));
}

}  // namespace
}  // namespace castor
