// Every ONNX node conformance model (../shared/conformance/onnx-node) and
// every sample model imports, passes the verifier, and gets inferred output
// dtypes and shapes equal to those of the expected output tensors. The
// byte-level import/export round trip is in onnx_io_test.cc.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "passes/verifier.h"

namespace castor {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> ConformanceCases() {
  const fs::path root = fs::path(CASTOR_SHARED_DIR) / "conformance" / "onnx-node";
  std::vector<fs::path> cases;
  if (!fs::is_directory(root)) return cases;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (fs::exists(entry.path() / "model.onnx")) cases.push_back(entry.path());
  }
  std::sort(cases.begin(), cases.end());
  return cases;
}

// Loads, checks opsets and ops, infers types, verifies.
absl::StatusOr<Model> LoadAndInfer(const std::string& path) {
  absl::StatusOr<Model> model = LoadModel(path);
  if (!model.ok()) return model.status();
  if (absl::Status s = CheckOpsets(*model); !s.ok()) return s;
  if (auto missing = UnsupportedOps(*model); !missing.empty()) {
    return absl::UnimplementedError("unsupported op: " + missing[0]);
  }
  if (absl::Status s = InferTypes(*model); !s.ok()) return s;
  if (absl::Status s = VerifyModel(*model); !s.ok()) return s;
  return model;
}

TEST(ConformanceImport, InferredOutputTypesMatchExpectedTensors) {
  const std::vector<fs::path> cases = ConformanceCases();
  ASSERT_EQ(cases.size(), 302u) << "expected the 302 cases of " << CASTOR_SHARED_DIR
                                << "/conformance/onnx-node";
  int checked_outputs = 0;
  for (const fs::path& dir : cases) {
    const std::string name = dir.filename().string();
    SCOPED_TRACE(name);
    absl::StatusOr<Model> model = LoadAndInfer((dir / "model.onnx").string());
    ASSERT_TRUE(model.ok()) << model.status();
    const Graph& graph = *model->graph;
    for (size_t k = 0; k < graph.inputs().size(); ++k) {
      const fs::path pb = dir / "test_data_set_0" / ("input_" + std::to_string(k) + ".pb");
      absl::StatusOr<Tensor> input = LoadTensorProtoFile(pb.string());
      ASSERT_TRUE(input.ok()) << input.status();
      EXPECT_EQ(DTypeName(graph.inputs()[k]->dtype()), std::string(DTypeName(input->dtype())))
          << "input " << k;
    }
    for (size_t k = 0; k < graph.outputs().size(); ++k) {
      const fs::path pb = dir / "test_data_set_0" / ("output_" + std::to_string(k) + ".pb");
      absl::StatusOr<Tensor> expected = LoadTensorProtoFile(pb.string());
      ASSERT_TRUE(expected.ok()) << expected.status();
      const Value* out = graph.outputs()[k];
      EXPECT_EQ(std::string(DTypeName(out->dtype())), std::string(DTypeName(expected->dtype())))
          << "output " << k << " '" << out->name() << "'";
      EXPECT_EQ(out->shape().ToString(), expected->shape().ToString())
          << "output " << k << " '" << out->name() << "'";
      ++checked_outputs;
    }
  }
  EXPECT_GT(checked_outputs, 302);
}

TEST(SampleModels, ImportInferAndVerify) {
  const fs::path models = fs::path(CASTOR_SOURCE_DIR) / "models";
  int count = 0;
  for (const char* name : {"cnn", "mlp", "resnet", "transformer"}) {
    for (int opset : {13, 17}) {
      const std::string file =
          (models / (std::string(name) + "_opset" + std::to_string(opset) + ".onnx")).string();
      SCOPED_TRACE(file);
      absl::StatusOr<Model> model = LoadAndInfer(file);
      ASSERT_TRUE(model.ok()) << model.status();
      ASSERT_EQ(model->graph->outputs().size(), 1u);
      const Value* logits = model->graph->outputs()[0];
      EXPECT_EQ(logits->dtype(), DType::kFloat32);
      EXPECT_EQ(logits->shape().ToString(), "[N,10]");
      // Every value a node computes has a dtype and a known rank.
      for (const Node* node : model->graph->nodes()) {
        for (const Value* v : node->outputs()) {
          EXPECT_NE(v->dtype(), DType::kUndefined) << v->name();
          EXPECT_TRUE(v->shape().rank_known()) << v->name();
        }
      }
      ++count;
    }
  }
  EXPECT_EQ(count, 8);
}

}  // namespace
}  // namespace castor
