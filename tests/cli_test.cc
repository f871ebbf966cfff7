// The castor program's foundation: the argument parser (tools/args.h), the
// JSON writer, the top-level dispatch (--help, --version, unknown commands
// and flags), and `castor inspect` on malformed input. The program tests run
// the real binary (CASTOR_BINARY) and check its exit code, stdout and
// stderr: bad input must exit 2 with nothing on stdout and one error line
// that names the file and the problem.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "onnx/onnx_pb.h"
#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/blas_core.h"
#include "tools/args.h"
#include "tools/cli.h"
#include "graph/json_writer.h"

extern char** environ;

#include "graph/version.h"
#define CASTOR_VERSION CASTOR_VERSION_STRING

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// ---- running the binary ------------------------------------------------------

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void WriteFile(const fs::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
}

// A fresh directory under the test temp dir.
fs::path MakeTempDir() {
  std::string pattern = (fs::path(::testing::TempDir()) / "castor_cli_XXXXXX").string();
  char* made = mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr) << "mkdtemp " << pattern;
  return fs::path(pattern);
}

// Runs `program args...` with stdout and stderr captured in files (no pipe
// deadlocks), and returns its exit code and output.
RunResult RunProgram(const std::string& program, const std::vector<std::string>& args) {
  const fs::path dir = MakeTempDir();
  const std::string out_path = (dir / "stdout").string();
  const std::string err_path = (dir / "stderr").string();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  pid_t pid;
  RunResult result;
  const int spawn_error = posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_error != 0) {
    ADD_FAILURE() << "cannot start " << program << ": " << std::strerror(spawn_error);
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

RunResult RunCastor(const std::vector<std::string>& args) { return RunProgram(CASTOR_BINARY, args); }

std::string ModelPath(const std::string& name) {
  return (fs::path(CASTOR_SOURCE_DIR) / "models" / name).string();
}

// Bad input: exit 2, nothing on stdout, exactly one "error:" on stderr that
// names `file`.
void ExpectBadInput(const RunResult& result, const std::string& file) {
  EXPECT_EQ(result.exit_code, kExitBadInput) << result.err;
  EXPECT_EQ(result.out, "");
  EXPECT_THAT(result.err, HasSubstr("castor inspect: error: "));
  EXPECT_THAT(result.err, HasSubstr(file));
  const size_t first = result.err.find("error:");
  EXPECT_EQ(result.err.find("error:", first + 1), std::string::npos)
      << "more than one error line:\n" << result.err;
}

// ---- building small ONNX models in C++ ----------------------------------------

void SetFloatType(onnx::ValueInfoProto* info, const std::string& name, std::vector<int64_t> dims) {
  info->set_name(name);
  auto* tensor_type = info->mutable_type()->mutable_tensor_type();
  tensor_type->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) tensor_type->mutable_shape()->add_dim()->set_dim_value(d);
}

onnx::NodeProto* AddNode(onnx::GraphProto* graph, const std::string& op_type,
                         const std::string& name, std::vector<std::string> inputs,
                         std::vector<std::string> outputs) {
  onnx::NodeProto* node = graph->add_node();
  node->set_op_type(op_type);
  node->set_name(name);
  for (const std::string& in : inputs) node->add_input(in);
  for (const std::string& out : outputs) node->add_output(out);
  return node;
}

// A model with input x float[2,3] and output `output` float[2,3], no nodes yet.
onnx::ModelProto EmptyModel(int64_t opset) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.set_producer_name("cli_test");
  onnx::OperatorSetIdProto* import = model.add_opset_import();
  import->set_domain("");
  import->set_version(opset);
  onnx::GraphProto* graph = model.mutable_graph();
  graph->set_name("test_graph");
  SetFloatType(graph->add_input(), "x", {2, 3});
  return model;
}

std::string SaveProto(const onnx::ModelProto& model, const fs::path& path) {
  std::string bytes;
  EXPECT_TRUE(model.SerializeToString(&bytes));
  WriteFile(path, bytes);
  return path.string();
}

// ---- ArgParser ---------------------------------------------------------------

struct ExampleOptions {
  std::string model;
  std::string extra;
  std::string format = "text";
  std::string output;
  int64_t epochs = 3;
  double learning_rate = 0.01;
  bool verbose = false;
  bool fused = true;
  std::vector<std::string> inputs = {"default.bin"};
};

ArgParser MakeParser(ExampleOptions& options) {
  ArgParser parser("castor example", "An example command.");
  parser.AddPositional("MODEL", "the model", &options.model)
      .AddOptionalPositional("EXTRA", "something extra", &options.extra)
      .AddEnum("format", {"text", "json", "dot"}, "output format", &options.format)
      .AddString("output", "FILE", "where to write", &options.output)
      .AddInt("epochs", "N", "how many epochs", &options.epochs)
      .AddFloat("lr", "RATE", "learning rate", &options.learning_rate)
      .AddSwitch("verbose", "say more", &options.verbose)
      .AddSwitch("fused", "use fused kernels", &options.fused)
      .AddRepeated("input", "FILE", "an input file", &options.inputs)
      .AddExample("castor example m.onnx --epochs 5");
  return parser;
}

absl::StatusOr<ParseOutcome> ParseExample(ExampleOptions& options,
                                          const std::vector<std::string>& args) {
  ArgParser parser = MakeParser(options);
  return parser.Parse(args);
}

TEST(ArgParserTest, DefaultsStayWhenNothingIsGiven) {
  ExampleOptions options;
  ASSERT_EQ(ParseExample(options, {"m.onnx"}).value(), ParseOutcome::kRun);
  EXPECT_EQ(options.model, "m.onnx");
  EXPECT_EQ(options.extra, "");
  EXPECT_EQ(options.format, "text");
  EXPECT_EQ(options.epochs, 3);
  EXPECT_DOUBLE_EQ(options.learning_rate, 0.01);
  EXPECT_FALSE(options.verbose);
  EXPECT_TRUE(options.fused);
  EXPECT_EQ(options.inputs, std::vector<std::string>{"default.bin"});
}

TEST(ArgParserTest, ParsesEveryFlagKindInBothForms) {
  ExampleOptions options;
  ASSERT_EQ(ParseExample(options, {"--format=json", "m.onnx", "--output", "out.txt", "--epochs=7",
                                   "--lr", "-0.5", "--verbose", "--no-fused", "--input", "a",
                                   "--input=b", "more"})
                .value(),
            ParseOutcome::kRun);
  EXPECT_EQ(options.model, "m.onnx");
  EXPECT_EQ(options.extra, "more");
  EXPECT_EQ(options.format, "json");
  EXPECT_EQ(options.output, "out.txt");
  EXPECT_EQ(options.epochs, 7);
  EXPECT_DOUBLE_EQ(options.learning_rate, -0.5);
  EXPECT_TRUE(options.verbose);
  EXPECT_FALSE(options.fused);
  // Given values replace the default list.
  EXPECT_EQ(options.inputs, (std::vector<std::string>{"a", "b"}));
}

TEST(ArgParserTest, SwitchAcceptsExplicitBooleans) {
  ExampleOptions options;
  ASSERT_TRUE(ParseExample(options, {"m", "--verbose=true", "--fused=false"}).ok());
  EXPECT_TRUE(options.verbose);
  EXPECT_FALSE(options.fused);
  absl::StatusOr<ParseOutcome> bad = ParseExample(options, {"m", "--verbose=yes"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("--verbose"), HasSubstr("true or false")));
}

TEST(ArgParserTest, DoubleDashEndsFlags) {
  ExampleOptions options;
  ASSERT_TRUE(ParseExample(options, {"--epochs", "2", "--", "--weird-name", "--help"}).ok());
  EXPECT_EQ(options.model, "--weird-name");
  EXPECT_EQ(options.extra, "--help");
  EXPECT_EQ(options.epochs, 2);
}

TEST(ArgParserTest, HelpWinsAnywhereBeforeDoubleDash) {
  ExampleOptions options;
  EXPECT_EQ(ParseExample(options, {"--help"}).value(), ParseOutcome::kHelp);
  EXPECT_EQ(ParseExample(options, {"m", "--bogus", "-h"}).value(), ParseOutcome::kHelp);
}

TEST(ArgParserTest, UnknownFlagNamesItAndSuggests) {
  ExampleOptions options;
  absl::StatusOr<ParseOutcome> result = ParseExample(options, {"m", "--fromat", "json"});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(),
              AllOf(HasSubstr("unknown flag '--fromat'"), HasSubstr("did you mean '--format'?")));
  // A single dash is a likely typo for two.
  result = ParseExample(options, {"m", "-epochs", "3"});
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("did you mean '--epochs'?"));
  // Nothing close: no suggestion.
  result = ParseExample(options, {"m", "--zzzzzzzz"});
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), Not(HasSubstr("did you mean")));
  // --no- only exists for switches.
  result = ParseExample(options, {"m", "--no-format"});
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("unknown flag '--no-format'"));
}

TEST(ArgParserTest, BadValuesSayWhatWasExpected) {
  ExampleOptions options;
  auto message = [&](const std::vector<std::string>& args) {
    absl::StatusOr<ParseOutcome> result = ParseExample(options, args);
    EXPECT_FALSE(result.ok());
    return std::string(result.status().message());
  };
  EXPECT_THAT(message({"m", "--format", "xml"}),
              AllOf(HasSubstr("--format"), HasSubstr("'xml'"), HasSubstr("text, json, dot")));
  EXPECT_THAT(message({"m", "--epochs", "many"}),
              AllOf(HasSubstr("--epochs"), HasSubstr("an integer"), HasSubstr("'many'")));
  EXPECT_THAT(message({"m", "--lr", "fast"}), AllOf(HasSubstr("--lr"), HasSubstr("a number")));
  EXPECT_THAT(message({"m", "--output"}), AllOf(HasSubstr("--output"), HasSubstr("needs a value")));
  EXPECT_THAT(message({"m", "--output", "--verbose"}), HasSubstr("'--output' needs a value"));
  EXPECT_THAT(message({"m", "--epochs", "1", "--epochs", "2"}), HasSubstr("more than once"));
  EXPECT_THAT(message({"m", "--no-verbose=1"}), HasSubstr("takes no value"));
  EXPECT_THAT(message({}), HasSubstr("missing argument MODEL"));
  EXPECT_THAT(message({"a", "b", "c"}), HasSubstr("unexpected argument 'c'"));
}

TEST(ArgParserTest, HelpListsEveryFlagWithKindAndDefault) {
  ExampleOptions options;
  ArgParser parser = MakeParser(options);
  const std::string help = parser.Help();
  EXPECT_THAT(help, HasSubstr("usage: castor example MODEL [EXTRA] [flags]"));
  EXPECT_THAT(help, HasSubstr("An example command."));
  EXPECT_THAT(help, HasSubstr("--format text|json|dot"));
  EXPECT_THAT(help, HasSubstr("(enum; default: text)"));
  EXPECT_THAT(help, HasSubstr("--output FILE"));
  EXPECT_THAT(help, HasSubstr("(string; default: none)"));
  EXPECT_THAT(help, HasSubstr("(int; default: 3)"));
  EXPECT_THAT(help, HasSubstr("(float; default: 0.01)"));
  EXPECT_THAT(help, HasSubstr("--[no-]verbose"));
  EXPECT_THAT(help, HasSubstr("(switch; default: off)"));
  EXPECT_THAT(help, HasSubstr("(switch; default: on)"));
  EXPECT_THAT(help, HasSubstr("(repeated string; default: default.bin)"));
  EXPECT_THAT(help, HasSubstr("castor example m.onnx --epochs 5"));
}

TEST(ArgParserTest, WasGivenTracksTheCommandLine) {
  ExampleOptions options;
  ArgParser parser = MakeParser(options);
  ASSERT_TRUE(parser.Parse({"m", "--epochs", "3"}).ok());
  EXPECT_TRUE(parser.WasGiven("epochs"));  // even though 3 is the default
  EXPECT_FALSE(parser.WasGiven("lr"));
}

TEST(EditDistanceTest, CountsTranspositionsAsOneEdit) {
  EXPECT_EQ(EditDistance("format", "format"), 0);
  EXPECT_EQ(EditDistance("fromat", "format"), 1);
  EXPECT_EQ(EditDistance("inspct", "inspect"), 1);
  EXPECT_EQ(EditDistance("", "abc"), 3);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
}

TEST(EditDistanceTest, ClosestMatchOnlySuggestsLikelyTypos) {
  const std::vector<std::string> commands = {"inspect", "convert", "train", "verify"};
  EXPECT_EQ(ClosestMatch("inspct", commands), "inspect");
  EXPECT_EQ(ClosestMatch("trian", commands), "train");
  EXPECT_EQ(ClosestMatch("convret", commands), "convert");
  EXPECT_EQ(ClosestMatch("xyz", commands), "");
  EXPECT_EQ(ClosestMatch("bench", commands), "");
}

// ---- JsonWriter --------------------------------------------------------------

TEST(JsonWriterTest, EscapesStrings) {
  EXPECT_EQ(JsonWriter::Quote("plain"), "\"plain\"");
  EXPECT_EQ(JsonWriter::Quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonWriter::Quote("line\nnext\ttab\r"), "\"line\\nnext\\ttab\\r\"");
  EXPECT_EQ(JsonWriter::Quote(std::string("\x01\x1f", 2)), "\"\\u0001\\u001f\"");
  EXPECT_EQ(JsonWriter::Quote("caf\xc3\xa9"), "\"caf\xc3\xa9\"");  // UTF-8 passes through
}

TEST(JsonWriterTest, CompactNesting) {
  JsonWriter json(/*indent=*/0);
  json.BeginObject()
      .Key("name").String("cnn")
      .Key("nodes").Int(7)
      .Key("ratio").Double(0.25)
      .Key("bad").Double(std::numeric_limits<double>::quiet_NaN())
      .Key("ok").Bool(true)
      .Key("none").Null()
      .Key("dims").BeginArray().String("N").Int(1).Int(28).EndArray()
      .Key("empty").BeginObject().EndObject()
      .Key("list").BeginArray().EndArray()
      .EndObject();
  EXPECT_TRUE(json.complete());
  EXPECT_EQ(json.str(),
            "{\"name\":\"cnn\",\"nodes\":7,\"ratio\":0.25,\"bad\":null,\"ok\":true,\"none\":null,"
            "\"dims\":[\"N\",1,28],\"empty\":{},\"list\":[]}");
}

TEST(JsonWriterTest, PrettyPrintsWithIndentation) {
  JsonWriter json;
  json.BeginObject().Key("a").BeginArray().Int(1).Int(2).EndArray().Key("b").Double(1e-7).EndObject();
  EXPECT_EQ(json.str(), "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": 1e-07\n}\n");
}

TEST(JsonWriterTest, DoublesRoundTrip) {
  JsonWriter json(0);
  json.BeginArray().Double(0.1).Double(1.0 / 3.0).Double(-2.5e300).EndArray();
  EXPECT_EQ(json.str(), "[0.1,0.3333333333333333,-2.5e+300]");
}

TEST(JsonWriterDeathTest, MisuseAborts) {
  EXPECT_DEATH(
      {
        JsonWriter json;
        json.BeginObject().Int(1);
      },
      "JsonWriter misuse");
  EXPECT_DEATH(
      {
        JsonWriter json;
        json.BeginArray().EndObject();
      },
      "JsonWriter misuse");
}

// ---- top level ---------------------------------------------------------------

TEST(CliTest, HelpListsCommandsFlagsAndExitCodes) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--help"}, {"-h"}, {}, {"help"}}) {
    RunResult result = RunCastor(args);
    EXPECT_EQ(result.exit_code, kExitOk) << (args.empty() ? "" : args[0]);
    EXPECT_EQ(result.err, "");
    EXPECT_THAT(result.out, HasSubstr("usage: castor COMMAND"));
    EXPECT_THAT(result.out, testing::ContainsRegex("\n  inspect +show a model's graph"));
    EXPECT_THAT(result.out, AllOf(HasSubstr("--version"), HasSubstr("--help")));
    EXPECT_THAT(result.out, AllOf(HasSubstr("0  success"), HasSubstr("1  the command ran"),
                                  HasSubstr("2  bad input")));
    EXPECT_THAT(result.out, HasSubstr("castor inspect models/cnn_opset13.onnx"));
  }
}

TEST(CliTest, EveryTableEntryIsListedInHelp) {
  std::ostringstream out, err;
  ASSERT_EQ(RunCli({"--help"}, out, err), kExitOk);
  ASSERT_FALSE(Subcommands().empty());
  for (const Subcommand& sub : Subcommands()) {
    EXPECT_THAT(out.str(), HasSubstr(std::string("  ") + sub.name)) << sub.name;
    EXPECT_THAT(out.str(), HasSubstr(sub.summary));
  }
}

TEST(CliTest, VersionPrintsVersionAndCudaLine) {
  RunResult result = RunCastor({"--version"});
  EXPECT_EQ(result.exit_code, kExitOk);
  EXPECT_THAT(result.out, testing::StartsWith(std::string("castor ") + CASTOR_VERSION + "\n"));
  EXPECT_THAT(result.out, HasSubstr("CUDA backend: "));
  EXPECT_THAT(result.out, HasSubstr("CPU backend: OpenBLAS "));
}

// --version says whether mixed_bfloat16's GEMMs run on AMX tiles
// (backend/cpu/amx_gemm.h): exactly where this CPU and OS allow them and
// CASTOR_AMX=off does not turn them off.
TEST(CliTest, VersionSaysWhetherBFloat16GemmsRunOnAmx) {
  RunResult result = RunCastor({"--version"});
  EXPECT_EQ(result.exit_code, kExitOk);
  if (cpu::AmxBf16Available()) {  // (CASTOR_AMX, if set, reaches the binary too)
    EXPECT_THAT(result.out, HasSubstr("; AMX for bfloat16 GEMMs"));
  } else {
    // (The policy-fit lines may say the CPU has no AMX.)
    EXPECT_THAT(result.out, Not(HasSubstr("; AMX for")));
    EXPECT_THAT(result.out, Not(HasSubstr("on its AMX")));
  }
  if (!cpu::AmxBf16Supported()) return;
  // CASTOR_AMX=off turns it off.
  RunResult off = RunProgram("env", {"CASTOR_AMX=off", CASTOR_BINARY, "--version"});
  EXPECT_EQ(off.exit_code, kExitOk);
  EXPECT_THAT(off.out, HasSubstr("CPU backend: OpenBLAS "));
  EXPECT_THAT(off.out, Not(HasSubstr("; AMX for")));
  EXPECT_THAT(off.out, Not(HasSubstr("on its AMX")));
}

// OpenBLAS 0.3.21 runs its generic SSE3 kernels on CPUs it does not know;
// castor restarts itself with OPENBLAS_CORETYPE set when the CPU can do
// better (backend/cpu/blas_core.h), unless the user chose a core.
TEST(CliTest, GemmsDoNotRunOnGenericKernelsWhenTheCpuHasAvx) {
  const std::string best = cpu::BestBlasCoreForThisCpu();
  if (best.empty()) GTEST_SKIP() << "this CPU has no AVX: the generic kernels are right";
  const char* chosen = std::getenv("OPENBLAS_CORETYPE");
  if (chosen != nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE=" << chosen << " is set for the tests";
  RunResult result = RunCastor({"--version"});
  EXPECT_EQ(result.exit_code, kExitOk);
  EXPECT_THAT(result.out, HasSubstr("CPU backend: OpenBLAS "));
  EXPECT_THAT(result.out, Not(HasSubstr("OpenBLAS Prescott kernels")));
}

TEST(CliTest, AChosenOpenBlasCoreIsKept) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "OpenBLAS's Prescott kernels exist on x86-64 only";
#endif
  RunResult result = RunProgram("env", {"OPENBLAS_CORETYPE=Prescott", CASTOR_BINARY, "--version"});
  EXPECT_EQ(result.exit_code, kExitOk);
  EXPECT_THAT(result.out, HasSubstr("CPU backend: OpenBLAS Prescott kernels"));
  const std::string best = cpu::BestBlasCoreForThisCpu();
  if (!best.empty()) {
    EXPECT_THAT(result.out, HasSubstr("with OPENBLAS_CORETYPE=Prescott; this CPU can run " + best));
  }
}

TEST(CliTest, SubcommandHelp) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"inspect", "--help"}, {"help", "inspect"}, {"inspect", "-h"}}) {
    RunResult result = RunCastor(args);
    EXPECT_EQ(result.exit_code, kExitOk);
    EXPECT_THAT(result.out, HasSubstr("usage: castor inspect MODEL [flags]"));
    EXPECT_THAT(result.out, HasSubstr("--format text|json|dot"));
    EXPECT_THAT(result.out, HasSubstr("(enum; default: text)"));
    EXPECT_THAT(result.out, HasSubstr("--output FILE"));
  }
}

TEST(CliTest, UnknownCommandSuggestsTheClosest) {
  RunResult result = RunCastor({"inspct", "model.onnx"});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_EQ(result.out, "");
  EXPECT_THAT(result.err, HasSubstr("castor: error: unknown command 'inspct'"));
  EXPECT_THAT(result.err, HasSubstr("did you mean 'inspect'?"));

  result = RunCastor({"frobnicate"});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_THAT(result.err, HasSubstr("unknown command 'frobnicate'"));
  EXPECT_THAT(result.err, Not(HasSubstr("did you mean")));

  result = RunCastor({"help", "inspcet"});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_THAT(result.err, HasSubstr("did you mean 'inspect'?"));
}

TEST(CliTest, UnknownGlobalFlag) {
  RunResult result = RunCastor({"--verison"});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_EQ(result.out, "");
  EXPECT_THAT(result.err, AllOf(HasSubstr("unknown flag '--verison'"),
                                HasSubstr("did you mean '--version'?")));
}

TEST(CliTest, InspectFlagErrors) {
  const std::string model = ModelPath("cnn_opset13.onnx");
  RunResult result = RunCastor({"inspect", model, "--format", "xml"});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_EQ(result.out, "");
  EXPECT_THAT(result.err, AllOf(HasSubstr("castor inspect: error: "), HasSubstr("'xml'"),
                                HasSubstr("allowed values: text, json, dot")));

  result = RunCastor({"inspect", model, "--fromat", "json"});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_THAT(result.err, AllOf(HasSubstr("unknown flag '--fromat'"),
                                HasSubstr("did you mean '--format'?")));

  result = RunCastor({"inspect", model, "--output"});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_THAT(result.err, HasSubstr("flag '--output' needs a value"));

  result = RunCastor({"inspect"});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_THAT(result.err, HasSubstr("missing argument MODEL"));
}

// ---- inspect on malformed input -------------------------------------------------

class InspectBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(InspectBadInputTest, MissingFile) {
  const std::string path = (dir_ / "does_not_exist.onnx").string();
  RunResult result = RunCastor({"inspect", path});
  ExpectBadInput(result, path);
  EXPECT_THAT(result.err, testing::ContainsRegex("no such file|not found|No such file"));
}

TEST_F(InspectBadInputTest, Directory) {
  const std::string path = dir_.string();
  RunResult result = RunCastor({"inspect", path});
  ExpectBadInput(result, path);
  EXPECT_THAT(result.err, HasSubstr("is a directory"));
}

TEST_F(InspectBadInputTest, RandomBytes) {
  std::mt19937 rng(1234);
  std::string bytes(4096, '\0');
  for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
  const std::string path = (dir_ / "random.onnx").string();
  WriteFile(path, bytes);
  RunResult result = RunCastor({"inspect", path});
  ExpectBadInput(result, path);
  EXPECT_THAT(result.err, HasSubstr("not a valid ONNX model"));
}

TEST_F(InspectBadInputTest, TextFile) {
  const std::string path = (dir_ / "notes.onnx").string();
  WriteFile(path, "This is a text file, not a model.\nSecond line.\n");
  RunResult result = RunCastor({"inspect", path});
  ExpectBadInput(result, path);
  EXPECT_THAT(result.err, HasSubstr("not a valid ONNX model"));
}

TEST_F(InspectBadInputTest, TruncatedModel) {
  const std::string whole = ReadFile(ModelPath("cnn_opset13.onnx"));
  ASSERT_GT(whole.size(), 1000u);
  const std::string path = (dir_ / "truncated.onnx").string();
  WriteFile(path, whole.substr(0, whole.size() / 2));
  RunResult result = RunCastor({"inspect", path});
  ExpectBadInput(result, path);
  EXPECT_THAT(result.err, testing::ContainsRegex("truncated|not a valid ONNX model"));
}

TEST_F(InspectBadInputTest, UnknownOpsAreAllListedAtOnce) {
  onnx::ModelProto model = EmptyModel(13);
  onnx::GraphProto* graph = model.mutable_graph();
  AddNode(graph, "FooOp", "first_foo", {"x"}, {"a"});
  AddNode(graph, "BarOp", "the_bar", {"a"}, {"b"});
  AddNode(graph, "FooOp", "second_foo", {"b"}, {"output"});
  SetFloatType(graph->add_output(), "output", {2, 3});
  const std::string path = SaveProto(model, dir_ / "unknown_ops.onnx");
  RunResult result = RunCastor({"inspect", path});
  ExpectBadInput(result, path);
  EXPECT_THAT(result.err, HasSubstr("2 unsupported op types"));
  EXPECT_THAT(result.err, HasSubstr("FooOp: nodes 'first_foo', 'second_foo'"));
  EXPECT_THAT(result.err, HasSubstr("BarOp: node 'the_bar'"));
}

TEST_F(InspectBadInputTest, DanglingInput) {
  onnx::ModelProto model = EmptyModel(13);
  onnx::GraphProto* graph = model.mutable_graph();
  AddNode(graph, "Add", "add_ghost", {"x", "ghost_value"}, {"output"});
  SetFloatType(graph->add_output(), "output", {2, 3});
  const std::string path = SaveProto(model, dir_ / "dangling.onnx");
  RunResult result = RunCastor({"inspect", path});
  ExpectBadInput(result, path);
  EXPECT_THAT(result.err, HasSubstr("ghost_value"));
}

TEST_F(InspectBadInputTest, OpsetOutOfRange) {
  for (int64_t opset : {99, 3}) {
    onnx::ModelProto model = EmptyModel(opset);
    onnx::GraphProto* graph = model.mutable_graph();
    AddNode(graph, "Relu", "relu", {"x"}, {"output"});
    SetFloatType(graph->add_output(), "output", {2, 3});
    const std::string path = SaveProto(model, dir_ / ("opset" + std::to_string(opset) + ".onnx"));
    RunResult result = RunCastor({"inspect", path});
    SCOPED_TRACE(opset);
    ExpectBadInput(result, path);
    EXPECT_THAT(result.err, HasSubstr("opset " + std::to_string(opset)));
    EXPECT_THAT(result.err, HasSubstr("supports opsets 7 to 25"));
  }
}

TEST_F(InspectBadInputTest, ValidSmallModelSucceeds) {
  // The same builder with nothing wrong: proves the failures above come
  // from the defects, not from the builder.
  onnx::ModelProto model = EmptyModel(13);
  onnx::GraphProto* graph = model.mutable_graph();
  AddNode(graph, "Relu", "relu", {"x"}, {"output"});
  SetFloatType(graph->add_output(), "output", {2, 3});
  const std::string path = SaveProto(model, dir_ / "ok.onnx");
  RunResult result = RunCastor({"inspect", path});
  EXPECT_EQ(result.exit_code, kExitOk) << result.err;
  EXPECT_EQ(result.err, "");
  EXPECT_THAT(result.out, testing::ContainsRegex("0 +relu +Relu +float32 +x +output float32\\[2,3\\]"));
}

TEST_F(InspectBadInputTest, OutputFileIsWrittenInsteadOfStdout) {
  onnx::ModelProto model = EmptyModel(13);
  AddNode(model.mutable_graph(), "Relu", "relu", {"x"}, {"output"});
  SetFloatType(model.mutable_graph()->add_output(), "output", {2, 3});
  const std::string path = SaveProto(model, dir_ / "ok.onnx");
  const std::string report = (dir_ / "report.json").string();
  RunResult result = RunCastor({"inspect", path, "--format=json", "--output", report});
  EXPECT_EQ(result.exit_code, kExitOk) << result.err;
  EXPECT_EQ(result.out, "");
  EXPECT_THAT(ReadFile(report), HasSubstr("\"op_type\": \"Relu\""));

  // An unwritable destination is bad input too.
  const std::string unwritable = (dir_ / "no_such_dir" / "report.txt").string();
  result = RunCastor({"inspect", path, "--output", unwritable});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_THAT(result.err, HasSubstr(unwritable));
}

}  // namespace
}  // namespace castor::tools
