// Tests for the pass pipeline: the verifier's two rule sets
// (passes/verifier.h), the canonicalize pass (passes/canonicalize.h) on
// hand-built graphs in an exporter's style (no-op Casts, Identity chains,
// dead nodes), `castor convert` accepting such a model, the pass manager
// catching a pass that breaks the graph (passes/pass_manager.h), and the
// golden dumps of the whole pipeline on the sample MLP
// (tests/golden/passes/; CASTOR_UPDATE_GOLDEN=1 rewrites them).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "passes/autocast.h"
#include "passes/canonicalize.h"
#include "passes/graph_text.h"
#include "passes/model_loader.h"
#include "passes/pass_manager.h"
#include "passes/policy.h"
#include "passes/training_graph.h"
#include "passes/verifier.h"
#include "tests/cli_test_util.h"
#include "tools/convert_command.h"
#include "tools/inspect_command.h"

namespace castor {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using tools::Program;
using tools::ReadFile;
using tools::RunCommand;

template <typename T>
T ValueOrDie(absl::StatusOr<T> result) {
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) std::abort();
  return *std::move(result);
}

Node* AddCast(Graph& graph, Value* in, DType to, const std::string& out, const std::string& name) {
  Node* cast = ValueOrDie(graph.AddNode("Cast", {in}, {out}, name));
  cast->SetAttribute(Attribute::Int("to", static_cast<int64_t>(to)));
  return cast;
}

std::vector<std::string> NodeNames(const Model& model) {
  std::vector<std::string> names;
  for (const Node* node : model.graph->nodes()) {
    names.push_back(node->name() + ":" + node->op_type());
  }
  return names;
}

std::vector<std::string> OutputNames(const Model& model) {
  std::vector<std::string> names;
  for (const Value* out : model.graph->outputs()) names.push_back(out->name());
  return names;
}

class CanonicalizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_.ir_version = 8;
    model_.opset_imports = {{"", 17}};
    x_ = ValueOrDie(graph().AddInput("x", DType::kFloat32, Shape({Dim::Symbol("N"), 4})));
  }
  Graph& graph() { return *model_.graph; }
  std::string Problems(VerifyRules rules) {
    VerifyOptions options;
    options.rules = rules;
    absl::Status status = VerifyModel(model_, options);
    return status.ok() ? "" : std::string(status.message());
  }

  // x -> Cast(float32, a no-op) -> Identity -> Identity -> Relu -> Identity -> y
  // plus a dead branch x -> Relu -> Add (nobody reads it).
  void BuildExporterStyleGraph() {
    Node* cast = AddCast(graph(), x_, DType::kFloat32, "x_cast", "/Cast");
    Node* id1 = ValueOrDie(graph().AddNode("Identity", {cast->output(0)}, {"i1"}, "/Identity"));
    Node* id2 = ValueOrDie(graph().AddNode("Identity", {id1->output(0)}, {"i2"}, "/Identity_1"));
    Node* relu = ValueOrDie(graph().AddNode("Relu", {id2->output(0)}, {"r"}, "/Relu"));
    Node* id3 = ValueOrDie(graph().AddNode("Identity", {relu->output(0)}, {"y"}, "/Identity_2"));
    Node* dead = ValueOrDie(graph().AddNode("Relu", {x_}, {"d1"}, "/dead/Relu"));
    ValueOrDie(graph().AddNode("Add", {dead->output(0), dead->output(0)}, {"d2"}, "/dead/Add"));
    graph().AddOutput(id3->output(0));
    ASSERT_TRUE(InferTypes(model_).ok());
  }

  Model model_;
  Value* x_ = nullptr;
};

TEST_F(CanonicalizeTest, ExporterStyleIsValidButNotCastorStyle) {
  BuildExporterStyleGraph();
  EXPECT_EQ(Problems(VerifyRules::kValid), "");
  EXPECT_THAT(Problems(VerifyRules::kCastor),
              HasSubstr("Cast node '/Cast' casts 'x' to float32, the type it already has"));
}

TEST_F(CanonicalizeTest, FoldsNoOpCastsIdentityChainsAndDeadNodes) {
  BuildExporterStyleGraph();
  CanonicalizeReport report = ValueOrDie(Canonicalize(model_));
  EXPECT_EQ(report.casts_folded, 1);
  EXPECT_EQ(report.identities_folded, 3);
  EXPECT_EQ(report.dead_nodes_removed, 2);
  EXPECT_EQ(report.casts_to_identity, 0);
  // The graph output keeps its name: Relu now computes "y" from x.
  EXPECT_THAT(NodeNames(model_), ElementsAre("/Relu:Relu"));
  EXPECT_THAT(OutputNames(model_), ElementsAre("y"));
  EXPECT_EQ(graph().nodes()[0]->input(0), x_);
  EXPECT_EQ(graph().nodes()[0]->output(0)->name(), "y");
  EXPECT_EQ(graph().FindValue("r"), nullptr);
  EXPECT_EQ(Problems(VerifyRules::kCastor), "");
  // A second run changes nothing.
  EXPECT_FALSE(ValueOrDie(Canonicalize(model_)).changed());
}

TEST_F(CanonicalizeTest, GraphInputsAndOutputsKeepTheirNames) {
  // x -> Identity -> "a" (output); x -> Cast(no-op) -> "b" (output);
  // Relu -> "r" (output) -> Identity -> "c" (output): every one needed.
  ValueOrDie(graph().AddNode("Identity", {x_}, {"a"}, "/IdA"));
  AddCast(graph(), x_, DType::kFloat32, "b", "/CastB");
  Node* relu = ValueOrDie(graph().AddNode("Relu", {x_}, {"r"}, "/Relu"));
  ValueOrDie(graph().AddNode("Identity", {relu->output(0)}, {"c"}, "/IdC"));
  for (const char* name : {"a", "b", "r", "c"}) graph().AddOutput(graph().FindValue(name));
  ASSERT_TRUE(InferTypes(model_).ok());
  CanonicalizeReport report = ValueOrDie(Canonicalize(model_));
  EXPECT_EQ(report.casts_to_identity, 1);
  EXPECT_EQ(report.identities_folded, 0);
  EXPECT_THAT(NodeNames(model_),
              ElementsAre("/IdA:Identity", "/CastB:Identity", "/Relu:Relu", "/IdC:Identity"));
  EXPECT_THAT(OutputNames(model_), ElementsAre("a", "b", "r", "c"));
  EXPECT_EQ(Problems(VerifyRules::kCastor), "");
}

TEST_F(CanonicalizeTest, LeavesTheSampleModelsUnchanged) {
  for (const char* name : {"cnn_opset17", "mlp_opset17", "resnet_opset17", "transformer_opset17",
                           "transformer_opset13"}) {
    const std::string path = std::string(CASTOR_SOURCE_DIR) + "/models/" + name + ".onnx";
    Model model = ValueOrDie(LoadAndCheckModel(path));
    const std::string before = GraphToText(model);
    EXPECT_FALSE(ValueOrDie(Canonicalize(model)).changed()) << name;
    EXPECT_EQ(GraphToText(model), before) << name;
  }
}

TEST_F(CanonicalizeTest, ConvertAcceptsAndCanonicalisesAnExporterStyleModel) {
  BuildExporterStyleGraph();
  const fs::path dir = fs::path(::testing::TempDir()) / "canonicalize_convert";
  fs::create_directories(dir);
  const std::string input = (dir / "exported.onnx").string();
  ASSERT_TRUE(SaveModel(model_, input).ok());
  const std::string output = (dir / "converted.onnx").string();
  const fs::path dumps = dir / "dumps";
  fs::remove_all(dumps);
  const Program program = RunCommand(tools::RunConvert, {input, "-o", output, "--policy",
                                                         "mixed_float16", "--dump-passes",
                                                         dumps.string()});
  ASSERT_EQ(program.exit_code, 0) << program.err;
  EXPECT_THAT(program.out, HasSubstr("note: canonicalize: 1 no-op Cast folded, 3 Identity nodes "
                                     "folded, 2 nodes nobody reads removed"));
  Model converted = ValueOrDie(LoadAndCheckModel(output));
  EXPECT_EQ(VerifyModel(converted), absl::OkStatus());
  EXPECT_THAT(OutputNames(converted), ElementsAre("y"));
  EXPECT_TRUE(fs::exists(dumps / "00-input.txt"));
  // unroll-recurrent runs first (it finds no LSTM/GRU/RNN here), then
  // canonicalize and autocast.
  EXPECT_TRUE(fs::exists(dumps / "01-unroll-recurrent.txt"));
  EXPECT_TRUE(fs::exists(dumps / "02-canonicalize.txt"));
  EXPECT_TRUE(fs::exists(dumps / "03-autocast.txt"));
  EXPECT_THAT(ReadFile(dumps / "00-input.txt"), HasSubstr("/Identity_2 = Identity(r) -> y"));
  EXPECT_THAT(ReadFile(dumps / "02-canonicalize.txt"), HasSubstr("/Relu = Relu(x) -> y"));

  // castor inspect shows the model as it is, or as the canonicalize pass
  // leaves it.
  const Program as_is = RunCommand(tools::RunInspect, {input});
  ASSERT_EQ(as_is.exit_code, 0) << as_is.err;
  EXPECT_THAT(as_is.out, HasSubstr("/Identity_2"));
  const Program canonical = RunCommand(tools::RunInspect, {input, "--canonicalize"});
  ASSERT_EQ(canonical.exit_code, 0) << canonical.err;
  EXPECT_THAT(canonical.out, Not(HasSubstr("/Identity_2")));
  EXPECT_THAT(canonical.out, HasSubstr("note: canonicalize: 1 no-op Cast folded"));
}

TEST_F(CanonicalizeTest, TheTrainingPipelineTakesAnExporterStyleModel) {
  // x -> Cast(no-op) -> Identity -> MatMul(w) -> Identity -> logits, and a
  // dead Relu: what `castor train` refused before the canonicalize pass.
  Node* cast = AddCast(graph(), x_, DType::kFloat32, "x_cast", "/Cast");
  Node* id = ValueOrDie(graph().AddNode("Identity", {cast->output(0)}, {"x_id"}, "/Identity"));
  Value* w = ValueOrDie(graph().AddInitializer("w", Tensor(DType::kFloat32, {4, 3})));
  Node* matmul = ValueOrDie(graph().AddNode("MatMul", {id->output(0), w}, {"mm"}, "/MatMul"));
  ValueOrDie(graph().AddNode("Relu", {matmul->output(0)}, {"unused"}, "/Relu"));
  Node* out = ValueOrDie(graph().AddNode("Identity", {matmul->output(0)}, {"logits"}, "/Out"));
  graph().AddOutput(out->output(0));
  ASSERT_TRUE(InferTypes(model_).ok());
  const Policy policy = ValueOrDie(Policy::Builtin("mixed_bfloat16"));
  PassManager manager;
  manager.Add(MakeCanonicalizePass()).Add(MakeAutocastPass(policy));
  TrainingGraph training;
  AddTrainingPasses(manager, TrainingGraphOptions{}, &training);
  PassContext context;
  ASSERT_EQ(manager.Run(model_, context), absl::OkStatus());
  ASSERT_EQ(training.gradients.size(), 1u);
  EXPECT_EQ(training.gradients[0].first, "w");
  EXPECT_THAT(context.notes, ElementsAre("canonicalize: 1 no-op Cast folded, 2 Identity nodes "
                                         "folded, 1 node nobody reads removed"));
}

// ---------------------------------------------------------------------------
// The pass manager.

class PassManagerTest : public CanonicalizeTest {};

TEST_F(PassManagerTest, CatchesAPassThatBreaksTheGraph) {
  Node* relu = ValueOrDie(graph().AddNode("Relu", {x_}, {"r"}, "/Relu"));
  graph().AddOutput(relu->output(0));
  ASSERT_TRUE(InferTypes(model_).ok());
  PassManager manager;
  int ran = 0;
  manager.Add(std::make_unique<FunctionPass>("harmless", "does nothing",
                                             [&ran](Model&, PassContext&) {
                                               ++ran;
                                               return absl::OkStatus();
                                             }));
  manager.Add(std::make_unique<FunctionPass>(
      "breaker", "adds a Cast to the type its input has", [&ran](Model& model, PassContext&) {
        ++ran;
        Graph& graph = *model.graph;
        AddCast(graph, graph.FindValue("r"), DType::kFloat32, "r_again", "/Cast");
        return InferTypes(model);
      }));
  manager.Add(std::make_unique<FunctionPass>("never", "not reached", [&ran](Model&, PassContext&) {
    ++ran;
    return absl::OkStatus();
  }));
  PassContext context;
  absl::Status status = manager.Run(model_, context);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("after the 'breaker' pass"));
  EXPECT_THAT(status.message(), HasSubstr("the type it already has"));
  EXPECT_EQ(ran, 2);
}

TEST_F(PassManagerTest, CatchesABrokenOrderAndKeepsAPassError) {
  Node* relu = ValueOrDie(graph().AddNode("Relu", {x_}, {"r"}, "/Relu"));
  Node* relu2 = ValueOrDie(graph().AddNode("Relu", {relu->output(0)}, {"s"}, "/Relu_1"));
  graph().AddOutput(relu2->output(0));
  ASSERT_TRUE(InferTypes(model_).ok());
  {
    PassManager manager;
    manager.Add(std::make_unique<FunctionPass>(
        "reorder", "puts the reader first", [](Model& model, PassContext&) {
          std::vector<Node*> order(model.graph->nodes().rbegin(), model.graph->nodes().rend());
          return model.graph->ReorderNodes(std::move(order));
        }));
    PassContext context;
    absl::Status status = manager.Run(model_, context);
    EXPECT_THAT(status.message(), HasSubstr("after the 'reorder' pass"));
    EXPECT_THAT(status.message(), HasSubstr("not in topological order"));
  }
  {
    PassManager manager;
    manager.Add(std::make_unique<FunctionPass>("refuses", "fails", [](Model&, PassContext&) {
      return absl::InvalidArgumentError("the pass's own message");
    }));
    PassContext context;
    absl::Status status = manager.Run(model_, context);
    EXPECT_EQ(status, absl::InvalidArgumentError("the pass's own message"));
  }
}

TEST_F(PassManagerTest, AnImportPassMayLeaveTheExportersStyle) {
  BuildExporterStyleGraph();
  PassManager manager;
  manager.Add(std::make_unique<FunctionPass>(
      "keep", "keeps the style", [](Model&, PassContext&) { return absl::OkStatus(); },
      VerifyRules::kValid));
  PassContext context;
  EXPECT_EQ(manager.Run(model_, context), absl::OkStatus());
}

// ---------------------------------------------------------------------------
// Golden dumps of the whole pipeline on the sample MLP under mixed_float16.

void ExpectGolden(const fs::path& golden, const std::string& actual) {
  if (std::getenv("CASTOR_UPDATE_GOLDEN") != nullptr) {
    fs::create_directories(golden.parent_path());
    std::ofstream(golden, std::ios::binary) << actual;
  }
  ASSERT_TRUE(fs::exists(golden)) << golden << " is missing (CASTOR_UPDATE_GOLDEN=1 writes it)";
  EXPECT_EQ(actual, ReadFile(golden)) << "differs from " << golden
                                      << " (CASTOR_UPDATE_GOLDEN=1 rewrites it)";
}

TEST(PipelineGoldenTest, DumpsOfTheSampleMlpUnderMixedFloat16) {
  const fs::path dumps = fs::path(::testing::TempDir()) / "pipeline_golden";
  fs::remove_all(dumps);
  Model model = ValueOrDie(
      LoadAndCheckModel(std::string(CASTOR_SOURCE_DIR) + "/models/mlp_opset17.onnx"));
  const Policy policy = ValueOrDie(Policy::Builtin("mixed_float16"));
  PassDumper dumper(dumps.string());
  PassManagerOptions options;
  options.dumper = &dumper;
  options.dump_input = true;
  PassManager manager(options);
  manager.Add(MakeCanonicalizePass()).Add(MakeAutocastPass(policy));
  TrainingGraph training;
  AddTrainingPasses(manager, TrainingGraphOptions{}, &training);
  PassContext context;
  ASSERT_EQ(manager.Run(model, context), absl::OkStatus());
  EXPECT_TRUE(context.notes.empty());

  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dumps)) {
    files.push_back(entry.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  EXPECT_THAT(files, ElementsAre("00-input.txt", "01-canonicalize.txt", "02-autocast.txt",
                                 "03-evaluation-graph.txt", "04-batchnorm-training.txt",
                                 "05-pool-before-relu.txt", "06-fold-batchnorm-casts.txt",
                                 "07-fold-layernorm-casts.txt", "08-fuse-batchnorm-relu.txt",
                                 "09-fuse-gelu.txt", "10-attach-loss.txt", "11-autodiff.txt",
                                 "12-step-outputs.txt"));
  const fs::path golden = fs::path(CASTOR_SOURCE_DIR) / "tests/golden/passes/mlp_mixed_float16";
  for (const std::string& file : files) ExpectGolden(golden / file, ReadFile(dumps / file));
}

}  // namespace
}  // namespace castor
