// `castor inspect` on the sample models: the report rows (node count,
// compute dtypes, parameter totals, op histogram as in models/README.md),
// the text table's content, the JSON document (parsed by Python's json
// module through the real binary) and the DOT graph (rendered by Graphviz's
// `dot -Tsvg` when installed).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "passes/model_loader.h"
#include "tools/cli.h"
#include "tools/inspect_command.h"

extern char** environ;

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

constexpr const char* kPython = "/usr/bin/python3";
constexpr const char* kDot = "/usr/bin/dot";

std::string ModelPath(const std::string& name) {
  return (fs::path(CASTOR_SOURCE_DIR) / "models" / name).string();
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

fs::path MakeTempDir() {
  std::string pattern = (fs::path(::testing::TempDir()) / "castor_inspect_XXXXXX").string();
  EXPECT_NE(mkdtemp(pattern.data()), nullptr) << "mkdtemp " << pattern;
  return fs::path(pattern);
}

// Runs `program args...` with stdin from `stdin_path`, capturing stdout and
// stderr through files.
RunResult RunProgram(const std::string& program, const std::vector<std::string>& args,
                     const std::string& stdin_path = "/dev/null") {
  const fs::path dir = MakeTempDir();
  const std::string out_path = (dir / "stdout").string();
  const std::string err_path = (dir / "stderr").string();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, stdin_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> argv = {const_cast<char*>(program.c_str())};
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  RunResult result;
  pid_t pid;
  const int error = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    ADD_FAILURE() << "cannot start " << program << ": " << std::strerror(error);
    return result;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = ReadFile(out_path);
  result.err = ReadFile(err_path);
  fs::remove_all(dir);
  return result;
}

// The report of a sample model, or a test failure naming the load error.
struct Inspected {
  Model model;
  InspectReport report;
};
std::unique_ptr<Inspected> InspectSample(const std::string& name) {
  absl::StatusOr<Model> model = LoadAndCheckModel(ModelPath(name));
  if (!model.ok()) {
    ADD_FAILURE() << model.status();
    return nullptr;
  }
  auto inspected = std::make_unique<Inspected>();
  inspected->model = std::move(model).value();
  inspected->report = BuildInspectReport(inspected->model, name);
  return inspected;
}

// The line of `text` that contains `needle` ("" if none).
std::string LineWith(const std::string& text, const std::string& needle) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(needle) != std::string::npos) return line;
  }
  return "";
}

// ---- the report rows, per sample model (numbers from models/README.md) ------

struct SampleModel {
  const char* file;
  int nodes;
  int64_t parameters;  // initializer elements, BatchNorm running stats included
  std::vector<std::pair<std::string, int>> top_ops;  // histogram head, in order
};

class InspectSampleTest : public ::testing::TestWithParam<SampleModel> {};

TEST_P(InspectSampleTest, ReportMatchesTheModelsReadme) {
  const SampleModel& sample = GetParam();
  std::unique_ptr<Inspected> inspected = InspectSample(sample.file);
  ASSERT_NE(inspected, nullptr);
  const InspectReport& report = inspected->report;
  EXPECT_EQ(report.nodes.size(), static_cast<size_t>(sample.nodes));
  EXPECT_EQ(report.summary.node_count, sample.nodes);
  EXPECT_EQ(report.summary.parameter_count, sample.parameters);
  EXPECT_EQ(report.summary.parameter_bytes, sample.parameters * 4);  // all float32
  ASSERT_EQ(report.summary.parameters_by_dtype.size(), 1u);
  EXPECT_EQ(report.summary.parameters_by_dtype[0].dtype, DType::kFloat32);
  ASSERT_GE(report.summary.op_histogram.size(), sample.top_ops.size());
  for (size_t i = 0; i < sample.top_ops.size(); ++i) {
    EXPECT_EQ(report.summary.op_histogram[i], sample.top_ops[i]) << "histogram entry " << i;
  }
  int histogram_total = 0;
  for (const auto& [op, count] : report.summary.op_histogram) histogram_total += count;
  EXPECT_EQ(histogram_total, sample.nodes);

  ASSERT_EQ(report.inputs.size(), 1u);
  EXPECT_EQ(report.inputs[0].name, "input");
  EXPECT_EQ(TypeString(report.inputs[0].dtype, report.inputs[0].shape), "float32[N,1,28,28]");
  ASSERT_EQ(report.outputs.size(), 1u);
  EXPECT_EQ(TypeString(report.outputs[0].dtype, report.outputs[0].shape), "float32[N,10]");
  // Every output of every node got a type from inference.
  for (const NodeRow& node : report.nodes) {
    for (const ValueRow& out : node.outputs) {
      EXPECT_NE(out.dtype, DType::kUndefined) << node.name << " -> " << out.name;
      EXPECT_TRUE(out.shape.rank_known()) << node.name << " -> " << out.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, InspectSampleTest,
    ::testing::Values(
        SampleModel{"cnn_opset13.onnx", 7, 693962, {{"Gemm", 2}, {"Relu", 2}, {"Conv", 1}}},
        SampleModel{"cnn_opset17.onnx", 7, 693962, {{"Gemm", 2}, {"Relu", 2}, {"Conv", 1}}},
        SampleModel{"mlp_opset13.onnx", 6, 669706, {{"Gemm", 3}, {"Relu", 2}, {"Flatten", 1}}},
        SampleModel{"mlp_opset17.onnx", 6, 669706, {{"Gemm", 3}, {"Relu", 2}, {"Flatten", 1}}},
        SampleModel{"resnet_opset13.onnx", 29, 38266 + 416,
                    {{"BatchNormalization", 8}, {"Conv", 8}, {"Relu", 7}, {"Add", 3}}},
        SampleModel{"resnet_opset17.onnx", 29, 38266 + 416,
                    {{"BatchNormalization", 8}, {"Conv", 8}, {"Relu", 7}, {"Add", 3}}},
        SampleModel{"transformer_opset13.onnx", 140, 71370,
                    {{"Add", 30}, {"Constant", 27}, {"MatMul", 17}, {"Mul", 11}}},
        SampleModel{"transformer_opset17.onnx", 90, 71370,
                    {{"Add", 20}, {"Constant", 17}, {"MatMul", 17}, {"Reshape", 9}}}),
    [](const ::testing::TestParamInfo<SampleModel>& info) {
      std::string name = info.param.file;
      return name.substr(0, name.find('.'));
    });

// ---- text ---------------------------------------------------------------------

TEST(InspectTextTest, CnnHeaderNodeTableAndSummary) {
  std::unique_ptr<Inspected> inspected = InspectSample("cnn_opset13.onnx");
  ASSERT_NE(inspected, nullptr);
  const std::string text = RenderInspectText(inspected->report);

  EXPECT_THAT(text, ContainsRegex("^file: +cnn_opset13.onnx\n"));
  EXPECT_THAT(text, ContainsRegex("\nir version: +7\n"));
  EXPECT_THAT(text, ContainsRegex("\nproducer: +pytorch 1\\.13"));
  EXPECT_THAT(text, ContainsRegex("\nopsets: +ai.onnx 13\n"));
  EXPECT_THAT(text, ContainsRegex("\ngraph: +torch_jit\n"));

  EXPECT_THAT(text, HasSubstr("\nnodes (7):\n"));
  EXPECT_THAT(text, ContainsRegex("\n  # +name +op +dtype +inputs +outputs +attributes\n"));
  const std::string conv = LineWith(text, "/conv/Conv ");
  EXPECT_THAT(conv, ContainsRegex("^  0 +/conv/Conv +Conv +float32 +input, conv.weight, "
                                  "conv.bias +/conv/Conv_output_0 float32\\[N,32,26,26\\] "));
  EXPECT_THAT(conv, HasSubstr("kernel_shape=[3,3]"));
  EXPECT_THAT(LineWith(text, "/pool/MaxPool "), HasSubstr("float32[N,32,13,13]"));
  EXPECT_THAT(LineWith(text, "/flatten/Flatten "), HasSubstr("float32[N,5408]"));
  EXPECT_THAT(LineWith(text, "/fc2/Gemm "), ContainsRegex("logits float32\\[N,10\\] +.*transB=1"));
  // Columns line up: every node row starts its name at the same offset.
  const size_t name_column = LineWith(text, "  # ").find("name");
  EXPECT_EQ(conv.find("/conv/Conv"), name_column);
  EXPECT_EQ(LineWith(text, "/fc2/Gemm ").find("/fc2/Gemm"), name_column);

  EXPECT_THAT(text, HasSubstr("\ninputs (1):\n  input float32[N,1,28,28]\n"));
  EXPECT_THAT(text, HasSubstr("\noutputs (1):\n  logits float32[N,10]\n"));
  EXPECT_THAT(text, ContainsRegex("\n  fc1.weight +float32\\[128,5408\\] +692,224\n"));

  EXPECT_THAT(text, HasSubstr("\n  nodes: 7\n"));
  EXPECT_THAT(text, ContainsRegex("\n    Gemm +2\n    Relu +2\n    Conv +1\n    Flatten +1\n"
                                  "    MaxPool +1\n"));
  EXPECT_THAT(text, HasSubstr("\n  parameters: 693,962 (2,775,848 bytes)\n"));
  EXPECT_THAT(text, ContainsRegex("\n    float32 +693,962 +2,775,848 bytes\n"));
  EXPECT_THAT(text, HasSubstr("\n  opsets: ai.onnx 13\n"));
}

TEST(InspectTextTest, TransformerShowsConstantsAndSymbolicShapes) {
  std::unique_ptr<Inspected> inspected = InspectSample("transformer_opset17.onnx");
  ASSERT_NE(inspected, nullptr);
  const std::string text = RenderInspectText(inspected->report);
  EXPECT_THAT(text, HasSubstr("\nnodes (90):\n"));
  // A Reshape target constant shows its values; its node computes in int64.
  EXPECT_THAT(LineWith(text, " /Constant "),
              ContainsRegex("Constant +int64 +/Constant_output_0 int64\\[3\\] +"
                            "value=int64\\[3\\]\\{-1,28,28\\}"));
  EXPECT_THAT(LineWith(text, " /Reshape "), HasSubstr("/Reshape_output_0 float32[N,28,28]"));
  EXPECT_THAT(LineWith(text, "/layers.0/attn/Transpose "),
              ContainsRegex("float32\\[N,4,28,16\\] +perm=\\[0,2,1,3\\]$"));
  EXPECT_THAT(LineWith(text, "/layers.0/ln1/LayerNormalization "),
              ContainsRegex("LayerNormalization +float32 .*float32\\[N,28,64\\] +axis=-1"));
  EXPECT_THAT(text, ContainsRegex("\n    Add +20\n    Constant +17\n    MatMul +17\n"
                                  "    Reshape +9\n    Transpose +8\n    Mul +6\n"
                                  "    LayerNormalization +5\n"));
  EXPECT_THAT(text, HasSubstr("\n  parameters: 71,370 (285,480 bytes)\n"));
  EXPECT_THAT(text, HasSubstr("\ninputs (1):\n  input float32[N,1,28,28]\n"));
}

TEST(InspectTextTest, ComputeDTypeIsFirstFloatInputElseFirstOutput) {
  std::unique_ptr<Inspected> inspected = InspectSample("transformer_opset17.onnx");
  ASSERT_NE(inspected, nullptr);
  int int64_nodes = 0;
  for (const NodeRow& node : inspected->report.nodes) {
    if (node.op_type == "Constant") {
      EXPECT_EQ(node.compute_dtype, node.outputs[0].dtype) << node.name;
      int64_nodes += node.compute_dtype == DType::kInt64;
    } else {
      EXPECT_EQ(node.compute_dtype, DType::kFloat32) << node.name;
    }
  }
  EXPECT_EQ(int64_nodes, 9);  // the Reshape targets; the other Constants are float scalars
}

TEST(InspectFormatTest, ThousandsSeparatorsAndTypes) {
  EXPECT_EQ(WithThousandsSeparators(0), "0");
  EXPECT_EQ(WithThousandsSeparators(999), "999");
  EXPECT_EQ(WithThousandsSeparators(1000), "1,000");
  EXPECT_EQ(WithThousandsSeparators(693962), "693,962");
  EXPECT_EQ(WithThousandsSeparators(-1234567), "-1,234,567");
  EXPECT_EQ(TypeString(DType::kBFloat16, Shape({Dim::Symbol("N"), 4, Dim()})),
            "bfloat16[N,4,?]");
  EXPECT_EQ(TypeString(DType::kFloat16, Shape::Scalar()), "float16[]");
  EXPECT_EQ(TypeString(DType::kFloat32, Shape::Unknown()), "float32[...]");
  EXPECT_EQ(QualifiedOpName("", "Conv"), "Conv");
  EXPECT_EQ(QualifiedOpName("com.microsoft", "FusedConv"), "com.microsoft:FusedConv");
}

// ---- JSON, through the binary and Python's parser -------------------------------

class InspectBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override { fs::remove_all(dir_); }

  // `castor inspect MODEL --format F --output FILE`; returns FILE's path.
  std::string InspectTo(const std::string& model, const std::string& format) {
    const std::string output = (dir_ / (model + "." + format)).string();
    RunResult result =
        RunProgram(CASTOR_BINARY, {"inspect", ModelPath(model), "--format", format, "--output", output});
    EXPECT_EQ(result.exit_code, kExitOk) << result.err;
    EXPECT_EQ(result.out, "");
    EXPECT_EQ(result.err, "");
    return output;
  }
  fs::path dir_;
};

TEST_F(InspectBinaryTest, JsonParsesAndHasTheReportContent) {
  if (!fs::exists(kPython)) GTEST_SKIP() << kPython << " is not installed";
  struct Expected {
    std::string model;
    std::string summary;  // what the Python snippet prints
  };
  const std::vector<Expected> cases = {
      {"cnn_opset13.onnx", "7 693962 Conv /conv/Conv N,32,26,26 float32 input N,1,28,28 Gemm 2 [3, 3]"},
      {"transformer_opset17.onnx",
       "90 71370 Constant /Constant 3 int64 input N,1,28,28 Add 20 [-1, 28, 28]"}};
  // Reads the document from stdin, as any consumer would.
  const std::string script =
      "import json, sys\n"
      "d = json.load(sys.stdin)\n"
      "n = d['nodes'][0]\n"
      "o = n['outputs'][0]\n"
      "i = d['inputs'][0]\n"
      "a = n['attributes']\n"
      "attr = a['kernel_shape'] if 'kernel_shape' in a else a['value']['values']\n"
      "h = d['summary']['op_histogram'][0]\n"
      "assert d['summary']['node_count'] == len(d['nodes'])\n"
      "assert d['opsets'][0]['domain'] == 'ai.onnx'\n"
      "print(len(d['nodes']), d['summary']['parameters']['count'], n['op_type'], n['name'],\n"
      "      ','.join(str(x) for x in o['shape']), n['compute_dtype'], i['name'],\n"
      "      ','.join(str(x) for x in i['shape']), h['op'], h['count'], attr)\n";
  for (const Expected& expected : cases) {
    SCOPED_TRACE(expected.model);
    const std::string json = InspectTo(expected.model, "json");
    RunResult parsed = RunProgram(kPython, {"-c", script}, json);
    EXPECT_EQ(parsed.exit_code, 0) << parsed.err;
    EXPECT_EQ(parsed.out, expected.summary + "\n");
  }
}

TEST_F(InspectBinaryTest, JsonOnStdoutMatchesTheRenderer) {
  RunResult result = RunProgram(CASTOR_BINARY, {"inspect", ModelPath("cnn_opset13.onnx"), "--format=json"});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  std::unique_ptr<Inspected> inspected = InspectSample("cnn_opset13.onnx");
  ASSERT_NE(inspected, nullptr);
  inspected->report.file = ModelPath("cnn_opset13.onnx");
  EXPECT_EQ(result.out, RenderInspectJson(inspected->report));
  EXPECT_THAT(result.out, HasSubstr("\"name\": \"/conv/Conv_output_0\""));
}

// ---- DOT ------------------------------------------------------------------------

int CountMatches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), re),
                                        std::sregex_iterator()));
}

TEST(InspectDotTest, OneNodePerOpAndTypedEdges) {
  std::unique_ptr<Inspected> inspected = InspectSample("cnn_opset13.onnx");
  ASSERT_NE(inspected, nullptr);
  const std::string dot = RenderInspectDot(inspected->report);
  EXPECT_THAT(dot, testing::StartsWith("digraph \"torch_jit\" {\n"));
  EXPECT_EQ(CountMatches(dot, "\n  n[0-9]+ \\["), 7);
  EXPECT_EQ(CountMatches(dot, "\n  i[0-9]+ \\[shape=invhouse"), 1);
  EXPECT_EQ(CountMatches(dot, "\n  o[0-9]+ \\[shape=house"), 1);
  // Initializers: one small note per consuming node (Conv, Gemm, Gemm).
  EXPECT_EQ(CountMatches(dot, "\n  w[0-9]+ \\[shape=note"), 3);
  EXPECT_THAT(dot, HasSubstr("label=\"conv.weight float32[32,1,3,3]\\lconv.bias float32[32]\\l\""));
  EXPECT_THAT(dot, HasSubstr("n0 [shape=box, fillcolor=\"#c6dbef\", "
                             "label=\"Conv\\n/conv/Conv\\nfloat32[N,32,26,26]\"]"));
  EXPECT_THAT(dot, ContainsRegex("i0 -> n0 \\[label=\"float32\\[N,1,28,28\\]\""));
  EXPECT_THAT(dot, ContainsRegex("n0 -> n1 \\[label=\"float32\\[N,32,26,26\\]\""));
  EXPECT_THAT(dot, ContainsRegex("n6 -> o0 \\[label=\"float32\\[N,10\\]\""));
  // Data edges: 7 node inputs that are activations, plus the graph output.
  EXPECT_EQ(CountMatches(dot, "\n  [ino][0-9]+ -> [no][0-9]+ \\[label="), 8);
  EXPECT_THAT(dot, testing::EndsWith("}\n"));
}

TEST(InspectDotTest, ColoursByDtypeAndCastsStandOut) {
  InspectReport report;
  report.graph_name = "g \"quoted\"";
  report.inputs = {{"x", DType::kFloat32, Shape({4}), true, false}};
  NodeRow cast{0, "to_half", "Cast", "", DType::kFloat32, {report.inputs[0]},
               {{"x_half", DType::kFloat16, Shape({4}), true, false}}, {}, "", ""};
  NodeRow relu{1, "relu", "Relu", "", DType::kFloat16, {cast.outputs[0]},
               {{"y", DType::kFloat16, Shape({4}), true, false}}, {}, "", ""};
  NodeRow bf{2, "bf", "Relu", "", DType::kBFloat16, {},
             {{"z", DType::kBFloat16, Shape({4}), true, false}}, {}, "", ""};
  NodeRow inserted = cast;
  inserted.index = 3;
  inserted.outputs[0].name = "x_half_inserted";
  inserted.autocast_why = "rule 6: activation 'x' is float32";
  inserted.inserted_cast = "activation";
  report.nodes = {cast, relu, bf, inserted};
  const std::string dot = RenderInspectDot(report);
  EXPECT_THAT(dot, HasSubstr("digraph \"g \\\"quoted\\\"\""));
  EXPECT_THAT(dot, HasSubstr("n0 [shape=box, style=\"filled,bold\", color=\"#cb181d\", "
                             "fillcolor=\"#fcbba1\""));
  EXPECT_THAT(dot, HasSubstr("n1 [shape=box, fillcolor=\"#fdd0a2\""));  // float16
  EXPECT_THAT(dot, HasSubstr("n2 [shape=box, fillcolor=\"#c7e9c0\""));  // bfloat16
  EXPECT_THAT(dot, HasSubstr("n0 -> n1 [label=\"float16[4]\", tooltip=\"x_half\", color=\"#d94801\"]"));
  // A Cast the autocast pass inserted: double border and its reason as tooltip.
  EXPECT_THAT(dot, HasSubstr("fillcolor=\"#fcbba1\", peripheries=2, tooltip=\"rule 6: activation "
                             "'x' is float32\", label=\"Cast\\nto_half"));
  EXPECT_THAT(dot, Not(HasSubstr("n0 [shape=box, style=\"filled,bold\", color=\"#cb181d\", "
                                 "fillcolor=\"#fcbba1\", peripheries")));
}

TEST_F(InspectBinaryTest, DotRendersWithGraphviz) {
  if (!fs::exists(kDot)) GTEST_SKIP() << kDot << " (Graphviz) is not installed";
  for (const auto& [model, nodes] : std::vector<std::pair<std::string, int>>{
           {"cnn_opset13.onnx", 7}, {"transformer_opset17.onnx", 90}}) {
    SCOPED_TRACE(model);
    const std::string dot_file = InspectTo(model, "dot");
    const std::string dot = ReadFile(dot_file);
    EXPECT_THAT(dot, testing::StartsWith("digraph "));
    EXPECT_EQ(CountMatches(dot, "\n  n[0-9]+ \\["), nodes);
    const std::string svg_file = (dir_ / (model + ".svg")).string();
    RunResult rendered = RunProgram(kDot, {"-Tsvg", dot_file, "-o", svg_file});
    EXPECT_EQ(rendered.exit_code, 0) << rendered.err;
    EXPECT_EQ(rendered.err, "");
    const std::string svg = ReadFile(svg_file);
    EXPECT_THAT(svg, HasSubstr("<svg"));
    // Graphviz writes one <g class="node"> per DOT node; ops are among them.
    EXPECT_GE(CountMatches(svg, "class=\"node\""), nodes);
  }
}

}  // namespace
}  // namespace castor::tools
