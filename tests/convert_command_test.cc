// `castor convert` and the autocast side of `castor inspect`, run in-process
// on the sample CNN: flags and their errors (exit 2), the summary, the
// recorded policy, converting twice (unchanged, identical bytes), the
// refusal under another policy (exit 1, nothing written, an existing output
// untouched), --restart-from-float32, op/node overrides, --save-policy and
// --policy-file; plus golden-text tests of `inspect` and `inspect --why` on
// the converted model (CASTOR_UPDATE_GOLDEN=1 rewrites tests/golden/).
#include "tools/convert_command.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "graph/json.h"
#include "graph/onnx_io.h"
#include "passes/autocast.h"
#include "tests/cli_test_util.h"
#include "tools/inspect_command.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kCnn = std::string(CASTOR_SOURCE_DIR) + "/models/cnn_opset17.onnx";

class ConvertTest : public CliTempDirTest {
 protected:
  ConvertTest() : CliTempDirTest("convert") {}

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  Program Convert(std::vector<std::string> args) { return RunCommand(RunConvert, args); }

  // The converted CNN under `policy` at Path("cnn_<policy>.onnx").
  std::string ConvertCnn(const std::string& policy) {
    const std::string out = Path("cnn_" + policy + ".onnx");
    const Program program = Convert({kCnn, "-o", out, "--policy", policy});
    EXPECT_EQ(program.exit_code, 0) << program.err;
    return out;
  }

  int FilesIn() const {
    int count = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_)) ++count;
    return count;
  }
};

TEST_F(ConvertTest, HelpExplainsTheFlags) {
  const Program help = Convert({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* text : {"usage: castor convert MODEL [flags]", "-o, --output FILE",
                           "--policy", "--fp32-ops", "--lowp-ops", "--fp32-nodes", "--pin-fp32",
                           "--[no-]keep-io-types", "--restart-from-float32", "--save-policy",
                           "mixed_bfloat16"}) {
    EXPECT_THAT(help.out, HasSubstr(text));
  }
}

TEST_F(ConvertTest, BadFlagsAreExit2AndNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::string out = Path("out.onnx");
  const std::vector<Case> cases = {
      {{kCnn}, "missing -o/--output FILE"},
      {{kCnn, "-o", out, "--policy", "mixed_fp16"}, "--policy"},
      {{kCnn, "-o", out, "--fp32-ops", "Relu,Bogus"}, "--fp32-ops Bogus"},
      {{kCnn, "-o", out, "--fp32-nodes", "(["}, "--fp32-nodes (["},
      {{kCnn, "-o", out, "--pin-fp32", "Resize"}, "--pin-fp32 Resize: expected OP:INPUT"},
      {{kCnn, "-o", out, "--fp32-ops", "Relu", "--lowp-ops", "Relu"}, "--lowp-ops Relu"},
      {{kCnn, "-o", out, "--policy", "float32", "--policy-file", "p.json"},
       "give --policy or --policy-file, not both"},
      {{kCnn, "-o", out, "--policy-file", Path("missing.json")}, "missing.json"},
      {{Path("absent.onnx"), "-o", out}, "absent.onnx"},
  };
  for (const Case& c : cases) {
    const Program program = Convert(c.args);
    EXPECT_EQ(program.exit_code, 2) << c.message;
    EXPECT_THAT(program.err, HasSubstr("castor convert: error: "));
    EXPECT_THAT(program.err, HasSubstr(c.message));
  }
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(ConvertTest, ConvertsAndSummarises) {
  const std::string out = Path("cnn16.onnx");
  const Program program = Convert({kCnn, "-o", out, "--policy", "mixed_float16"});
  ASSERT_EQ(program.exit_code, 0) << program.err;
  EXPECT_THAT(program.out, HasSubstr("castor convert: " + kCnn + " -> " + out));
  EXPECT_THAT(program.out, HasSubstr("policy    mixed_float16 (sha256:"));
  EXPECT_THAT(program.out, HasSubstr("compute float16, variables float32, graph outputs float32"));
  EXPECT_THAT(program.out, HasSubstr("casts     6 inserted (4 weight, 0 constant, 2 activation)"));
  EXPECT_THAT(program.out, HasSubstr("nodes     float16 6, float32 1"));
  EXPECT_THAT(program.out,
              HasSubstr("weights   2,775,848 bytes stored (float32 masters), 1,390,504 bytes as "
                        "computed"));
  absl::StatusOr<Model> model = LoadModel(out);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*model->FindMetadata(kPolicyNameKey), "mixed_float16");
  EXPECT_EQ(FilesIn(), 1);  // no temporary file left behind
}

TEST_F(ConvertTest, ConvertingTheOutputAgainChangesNothing) {
  const std::string once = ConvertCnn("mixed_float16");
  const std::string twice = Path("twice.onnx");
  const Program program = Convert({once, "-o", twice, "--policy", "mixed_float16"});
  ASSERT_EQ(program.exit_code, 0) << program.err;
  EXPECT_THAT(program.out, HasSubstr("unchanged: the model already carries this policy's digest"));
  EXPECT_EQ(ReadFile(once), ReadFile(twice));
}

TEST_F(ConvertTest, AnotherPolicyIsRefusedAndAnExistingOutputIsUntouched) {
  const std::string converted = ConvertCnn("mixed_float16");
  const std::string out = Path("precious.onnx");
  { std::ofstream(out) << "the user's file"; }
  const Program refused = Convert({converted, "-o", out, "--policy", "mixed_bfloat16"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("already converted under policy 'mixed_float16'"));
  EXPECT_THAT(refused.err, HasSubstr("under policy 'mixed_bfloat16'"));
  EXPECT_THAT(refused.err, HasSubstr("--restart-from-float32"));
  EXPECT_EQ(ReadFile(out), "the user's file");
  EXPECT_EQ(FilesIn(), 2);

  const Program restarted = Convert(
      {converted, "-o", out, "--policy", "mixed_bfloat16", "--restart-from-float32"});
  ASSERT_EQ(restarted.exit_code, 0) << restarted.err;
  EXPECT_THAT(restarted.out, HasSubstr("6 removed first (restart from the float32 graph)"));
  // Equal to converting the float32 model under mixed_bfloat16 directly.
  EXPECT_EQ(ReadFile(out), ReadFile(ConvertCnn("mixed_bfloat16")));
}

TEST_F(ConvertTest, OpAndNodeOverridesReachTheModel) {
  const std::string out = Path("overridden.onnx");
  const Program program = Convert({kCnn, "-o", out, "--fp32-ops", "MaxPool", "--fp32-nodes",
                                   "/fc1/.*", "--save-policy", Path("policy.json")});
  ASSERT_EQ(program.exit_code, 0) << program.err;
  absl::StatusOr<Model> model = LoadModel(out);
  ASSERT_TRUE(model.ok()) << model.status();
  std::map<std::string, std::string> dtype_of;
  for (const Node* node : model->graph->nodes()) {
    dtype_of[node->name()] = ReadAutocastRecord(*node).dtype;
  }
  EXPECT_EQ(dtype_of["/conv/Conv"], "float16");
  EXPECT_EQ(dtype_of["/pool/MaxPool"], "float32");
  EXPECT_EQ(dtype_of["/fc1/Gemm"], "float32");
  // The saved policy is the recorded one: loading it gives the same digest,
  // and converting with it changes nothing.
  absl::StatusOr<Policy> saved = Policy::LoadFile(Path("policy.json"));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->Digest(), *model->FindMetadata(kPolicyDigestKey));
  const Program again = Convert({out, "-o", Path("again.onnx"), "--policy-file",
                                 Path("policy.json")});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.out, HasSubstr("unchanged"));
}

TEST_F(ConvertTest, NoKeepIoTypesLowersTheInputs) {
  const std::string out = Path("lowered.onnx");
  const Program program = Convert({kCnn, "-o", out, "--no-keep-io-types"});
  ASSERT_EQ(program.exit_code, 0) << program.err;
  EXPECT_THAT(program.out, HasSubstr("graph outputs as computed"));
  absl::StatusOr<Model> model = LoadModel(out);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->graph->inputs()[0]->dtype(), DType::kFloat16);
  EXPECT_EQ(model->graph->outputs()[0]->dtype(), DType::kFloat16);
}

// ---- golden text of inspect on a converted model ----------------------------

void ExpectGolden(const std::string& name, const std::string& actual) {
  const fs::path golden = fs::path(CASTOR_SOURCE_DIR) / "tests" / "golden" / name;
  if (std::getenv("CASTOR_UPDATE_GOLDEN") != nullptr) {
    fs::create_directories(golden.parent_path());
    std::ofstream(golden, std::ios::binary) << actual;
  }
  ASSERT_TRUE(fs::exists(golden)) << golden << " is missing (CASTOR_UPDATE_GOLDEN=1 writes it)";
  EXPECT_EQ(actual, ReadFile(golden)) << "differs from " << golden
                                      << " (CASTOR_UPDATE_GOLDEN=1 rewrites it)";
}

// The inspect report of a converted model, with the temporary path replaced
// by a stable name.
std::string InspectAs(const std::string& path, const std::string& shown_name,
                      const std::vector<std::string>& flags = {}) {
  std::vector<std::string> args = {path};
  args.insert(args.end(), flags.begin(), flags.end());
  Program program = RunCommand(RunInspect, args);
  EXPECT_EQ(program.exit_code, 0) << program.err;
  for (size_t at; (at = program.out.find(path)) != std::string::npos;) {
    program.out.replace(at, path.size(), shown_name);
  }
  return program.out;
}

TEST_F(ConvertTest, InspectGoldenTextOfTheConvertedCnn) {
  const std::string converted = ConvertCnn("mixed_float16");
  ExpectGolden("inspect_cnn_mixed_float16.txt",
               InspectAs(converted, "cnn_mixed_float16.onnx"));
}

TEST_F(ConvertTest, InspectWhyGoldenTextForEachKindOfDecision) {
  const std::string converted = ConvertCnn("mixed_float16");
  std::string text;
  for (const char* node : {"/conv/Conv", "/Relu", "/fc2/Gemm", "Cast_fc1.weight_to_float16",
                           "Cast_/Relu_1_output_0_to_float32"}) {
    text += InspectAs(converted, "cnn_mixed_float16.onnx", {"--why", node}) + "\n";
  }
  ExpectGolden("inspect_why_cnn_mixed_float16.txt", text);
}

TEST_F(ConvertTest, InspectWhyOnAnUnconvertedModelAndAnUnknownNode) {
  const std::string plain = InspectAs(kCnn, "cnn.onnx", {"--why", "/conv/Conv"});
  EXPECT_THAT(plain, HasSubstr("no autocast record: the model was not converted"));
  EXPECT_THAT(plain, HasSubstr("policy   none recorded"));
  const Program missing = RunCommand(RunInspect, {kCnn, "--why", "/conv/Cnv"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("no node named '/conv/Cnv' (did you mean '/conv/Conv'?)"));
}

TEST_F(ConvertTest, InspectJsonAndDotCarryTheAutocastRecord) {
  const std::string converted = ConvertCnn("mixed_bfloat16");
  absl::StatusOr<Json> json = Json::Parse(InspectAs(converted, "cnn.onnx", {"--format", "json"}));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->Find("policy")->Find("name")->as_string(), "mixed_bfloat16");
  EXPECT_THAT(json->Find("policy")->Find("digest")->as_string(), ::testing::StartsWith("sha256:"));
  // Conv and MaxPool take bfloat16 only from opset 22, so the first Cast is
  // of the float32 MaxPool output, read by Flatten, which runs in bfloat16
  // for its bfloat16 reader Gemm (rule 3b).
  const Json* cast = nullptr;
  for (const Json& node : json->Find("nodes")->items()) {
    if (!cast && node.Find("op_type")->as_string() == "Cast") cast = &node;
  }
  ASSERT_NE(cast, nullptr);
  EXPECT_EQ(cast->Find("compute_dtype")->as_string(), "bfloat16");
  EXPECT_EQ(cast->Find("autocast")->Find("inserted_cast")->as_string(), "activation");
  EXPECT_THAT(cast->Find("autocast")->Find("why")->as_string(),
              HasSubstr("rule 6: activation '/pool/MaxPool_output_0' is float32 and node "
                        "'/flatten/Flatten' (and any later reader needing bfloat16) computes in "
                        "bfloat16"));
  const Json& autocast = *json->Find("summary")->Find("autocast");
  EXPECT_EQ(autocast.Find("inserted_casts")->as_int(), 4);
  // Flatten, fc1 and its Relu; Conv, its Relu, MaxPool and fc2 (the logits).
  EXPECT_EQ(autocast.Find("nodes_per_dtype")->Find("bfloat16")->as_int(), 3);
  EXPECT_EQ(autocast.Find("nodes_per_dtype")->Find("float32")->as_int(), 4);
  const std::string dot = InspectAs(converted, "cnn.onnx", {"--format", "dot"});
  EXPECT_THAT(dot, HasSubstr("peripheries=2, tooltip=\"rule 5: weight"));
  EXPECT_THAT(dot, HasSubstr("tooltip=\"rule 1 (allow): op list: allow list: Conv"));
  // The Conv stays ONNX and float32 in the file (ONNX Runtime runs it) and
  // says that castor's training graph runs it in bfloat16.
  EXPECT_THAT(dot, HasSubstr("ONNX Conv does not accept bfloat16 at opset 17"));
  EXPECT_THAT(dot, HasSubstr("'castor train' runs it in bfloat16 all the same, as com.castor "
                             "Conv"));
  const std::string why = InspectAs(converted, "cnn.onnx", {"--why", "/conv/Conv"});
  EXPECT_THAT(why, HasSubstr("dtype    float32"));
  EXPECT_THAT(why, HasSubstr("so float32 in this file (valid ONNX that ONNX Runtime runs); "
                             "'castor train' runs it in bfloat16 all the same, as com.castor Conv "
                             "(opset 22's Conv at any opset) inside its training graph only"));
}

TEST_F(ConvertTest, SummarySaysWhereTheConvsComputeInBfloat16) {
  const Program program =
      Convert({kCnn, "-o", Path("cnn_bf16.onnx"), "--policy", "mixed_bfloat16"});
  ASSERT_EQ(program.exit_code, 0) << program.err;
  EXPECT_THAT(program.out,
              HasSubstr("note: 1 Conv node stays float32 in this file (Conv accepts bfloat16 only "
                        "from opset 22; the model is opset 17) and computes in bfloat16 in "
                        "'castor train' as com.castor Conv ('castor inspect --why NODE' says so "
                        "per node)"));
}

}  // namespace
}  // namespace castor::tools
