// Tests for `castor verify` and `castor export` (tools/verify_command.h,
// tools/export_command.h) on checkpoints of the sample models trained a few
// steps: the summary and its JSON form, exit 0 on a good checkpoint, 2 on
// truncated, bit-flipped, foreign, empty and random files and on missing
// external data, 1 on a tampered policy record (with and without re-sealed
// digests) and on a --policy / --policy-file mismatch; the exported
// inference model (float32 or converted) without training state, giving the
// checkpoint's outputs bit for bit; the subcommands in `castor --help`.
#include <random>

#include "gmock/gmock.h"
#include "graph/onnx_io.h"
#include "graph/version.h"
#include "gtest/gtest.h"
#include "passes/model_loader.h"
#include "tests/checkpoint_test_util.h"
#include "tests/cli_test_util.h"
#include "tools/cli.h"
#include "tools/export_command.h"
#include "tools/inspect_command.h"
#include "training/npy.h"
#include "tools/verify_command.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

using Record = std::vector<std::pair<std::string, std::string>>;

class VerifyExportTest : public CliTempDirTest {
 protected:
  VerifyExportTest() : CliTempDirTest("verify_export") {}

  void SetUp() override {
    CliTempDirTest::SetUp();
    checkpoint_path_ = (dir_ / "ckpt.onnx").string();
    absl::StatusOr<training::WrittenCheckpoint> written = training::WriteCheckpoint(*checkpoint_, checkpoint_path_);
    ASSERT_TRUE(written.ok()) << written.status();
  }

  static void SetUpTestSuite() {
    checkpoint_ = new training::Checkpoint(TrainedCheckpoint("mlp_opset17", "mixed_float16", 3));
  }
  static void TearDownTestSuite() {
    delete checkpoint_;
    checkpoint_ = nullptr;
  }

  Program Verify(std::vector<std::string> args) {
    args.insert(args.begin(), checkpoint_path_);
    return RunCommand(RunVerify, args);
  }
  Program VerifyFile(const fs::path& path) { return RunCommand(RunVerify, {path.string()}); }

  // Exit 2 naming the file and saying why.
  void ExpectCorrupt(const fs::path& path, const std::string& why) {
    const Program p = VerifyFile(path);
    EXPECT_EQ(p.exit_code, kExitBadInput) << why << "\n" << p.out << p.err;
    EXPECT_THAT(p.err, HasSubstr(path.string())) << why;
    EXPECT_THAT(p.err, HasSubstr(why));
    EXPECT_THAT(p.err, HasSubstr("(unreadable or corrupt checkpoint)"));
    EXPECT_EQ(p.out, "");
  }

  static training::Checkpoint* checkpoint_;
  std::string checkpoint_path_;
};

training::Checkpoint* VerifyExportTest::checkpoint_ = nullptr;

TEST_F(VerifyExportTest, AGoodCheckpointVerifiesWithASummary) {
  const Program p = Verify({});
  EXPECT_EQ(p.exit_code, kExitOk) << p.out << p.err;
  EXPECT_EQ(p.err, "");
  const std::string digest = checkpoint_->policy.Digest();
  EXPECT_THAT(p.out, HasSubstr(absl::StrCat("castor verify: ", checkpoint_path_, ": verified\n")));
  EXPECT_THAT(p.out, HasSubstr(absl::StrCat("  policy      mixed_float16  ", digest, "\n")));
  EXPECT_THAT(p.out,
              HasSubstr("  dtypes      compute float16, variables (master weights) float32\n"));
  EXPECT_THAT(p.out, HasSubstr("  parameters  6 tensors, 669,706 elements, all float32\n"));
  EXPECT_THAT(p.out, HasSubstr("  statistics  no BatchNormalization running statistics\n"));
  EXPECT_THAT(p.out, HasSubstr("  progress    step 3 (3 updates applied), epoch 2, position 48 of "
                               "60000, batch 16, seed 1234, shuffled, data fashion-mnist\n"));
  EXPECT_THAT(p.out, HasSubstr("  optimizer   adam, lr 0.001 constant, 12 moment tensors\n"));
  EXPECT_THAT(p.out, HasSubstr("  loss scale  65536, 3 good steps, 0 skipped steps\n"));
  EXPECT_THAT(p.out, HasSubstr(absl::StrCat("  written by  castor ", kCastorVersion,
                                            " (castor.checkpoint/1)\n")));
  EXPECT_THAT(p.out, HasSubstr(absl::StrCat(
                         "  storage     ", WithThousandsSeparators(fs::file_size(checkpoint_path_)),
                         " bytes, one file\n")));
  // fc3 (the logits) stays float32. Flatten reads the float32 input, but
  // it is exact and feeds float16 fc1 only, so it runs in float16 (rule 3b).
  EXPECT_THAT(p.out, HasSubstr("  float32     1 of 6 nodes kept float32 by the policy\n"));
  EXPECT_THAT(p.out, HasSubstr("  training    loss cross-entropy on output logits\n"));
}

TEST_F(VerifyExportTest, TheJsonReportCarriesTheSameFacts) {
  const Program p = Verify({"--json"});
  EXPECT_EQ(p.exit_code, kExitOk) << p.err;
  absl::StatusOr<Json> json = Json::Parse(p.out);
  ASSERT_TRUE(json.ok()) << json.status() << "\n" << p.out;
  EXPECT_EQ(json->Find("status")->as_string(), "verified");
  EXPECT_EQ(json->Find("exit_code")->as_int(), 0);
  EXPECT_EQ(json->Find("problems")->size(), 0u);
  EXPECT_EQ(json->Find("policy")->Find("name")->as_string(), "mixed_float16");
  EXPECT_EQ(json->Find("policy")->Find("digest")->as_string(), checkpoint_->policy.Digest());
  EXPECT_EQ(json->Find("policy")->Find("compute_dtype")->as_string(), "float16");
  EXPECT_EQ(json->Find("parameters")->Find("count")->as_int(), 6);
  EXPECT_EQ(json->Find("parameters")->Find("elements")->as_int(), 669706);
  EXPECT_TRUE(json->Find("parameters")->Find("all_float32")->as_bool());
  EXPECT_EQ(json->Find("moment_tensors")->as_int(), 12);
  EXPECT_EQ(json->Find("loss_scaler")->Find("scale")->as_number(), 65536.0);
  EXPECT_EQ(json->Find("loss_scaler")->Find("skipped_steps")->as_int(), 0);
  EXPECT_EQ(json->Find("state")->Find("step")->as_int(), 3);
  EXPECT_EQ(json->Find("state")->Find("position")->as_int(), 48);
  EXPECT_EQ(json->Find("castor_version")->as_string(), kCastorVersion);
  EXPECT_THAT(json->Find("digests")->Find("data")->as_string(), HasSubstr("sha256:"));
}

TEST_F(VerifyExportTest, TheExpectedPolicyMustMatch) {
  Program p = Verify({"--policy", "mixed_float16"});
  EXPECT_EQ(p.exit_code, kExitOk) << p.out << p.err;
  EXPECT_THAT(p.out, HasSubstr("  expected    mixed_float16 (sha256:"));
  EXPECT_THAT(p.out, HasSubstr("): matches the record\n"));

  p = Verify({"--policy", "mixed_bfloat16"});
  EXPECT_EQ(p.exit_code, kExitFailure) << p.out << p.err;
  EXPECT_THAT(p.out, HasSubstr(": MISMATCH\n"));
  EXPECT_THAT(p.out,
              HasSubstr("    - name: recorded 'mixed_float16', expected 'mixed_bfloat16'\n"));
  EXPECT_THAT(p.out, HasSubstr("    - compute_dtype: recorded float16, expected bfloat16\n"));
  EXPECT_THAT(p.err, HasSubstr(absl::StrCat("castor verify: error: ", checkpoint_path_,
                                            " does not verify: 2 mismatches; first: name: "
                                            "recorded 'mixed_float16'")));

  // A policy file that differs in one op: Softmax computed in float16.
  Policy custom = *Policy::Builtin("mixed_float16");
  ASSERT_TRUE(custom.OverrideOp("Softmax", AutocastCategory::kAllow).ok());
  const std::string policy_file = (dir_ / "policy.json").string();
  ASSERT_TRUE(custom.SaveFile(policy_file).ok());
  p = Verify({"--policy-file", policy_file, "--json"});
  EXPECT_EQ(p.exit_code, kExitFailure) << p.out << p.err;
  absl::StatusOr<Json> json = Json::Parse(p.out);
  ASSERT_TRUE(json.ok()) << p.out;
  EXPECT_EQ(json->Find("status")->as_string(), "mismatch");
  EXPECT_FALSE(json->Find("expected")->Find("matches")->as_bool());
  std::vector<std::string> differences;
  for (const Json& d : json->Find("expected")->Find("differences")->items()) {
    differences.push_back(d.as_string());
  }
  EXPECT_THAT(differences,
              ::testing::ElementsAre("op_lists Softmax: recorded deny, expected allow",
                                     "op_overrides Softmax: recorded absent, expected allow"));

  p = Verify({"--policy", "mixed_float17"});
  EXPECT_EQ(p.exit_code, kExitBadInput);
  EXPECT_THAT(p.err, HasSubstr("--policy mixed_float17: "));
  p = Verify({"--policy", "float32", "--policy-file", policy_file});
  EXPECT_EQ(p.exit_code, kExitBadInput);
  EXPECT_THAT(p.err, HasSubstr("give --policy or --policy-file, not both"));
}

TEST_F(VerifyExportTest, CorruptAndForeignFilesExitTwoNamingTheFile) {
  const std::string bytes = ReadBytes(checkpoint_path_);
  const fs::path bad = dir_ / "bad.onnx";
  for (size_t size : {size_t{0}, size_t{1}, size_t{100}, bytes.size() / 3, bytes.size() / 2,
                      bytes.size() - 4096, bytes.size() - 1}) {
    WriteBytes(bad, bytes.substr(0, size));
    ExpectCorrupt(bad, size == 0 ? "the file is empty" : "");
  }
  // Bit flips in the tensor data of two weights and a moment.
  for (const Tensor* tensor :
       std::vector<const Tensor*>{checkpoint_->model.graph->FindValue("fc1.weight")->initializer(),
                                  checkpoint_->model.graph->FindValue("fc3.bias")->initializer(),
                                  &checkpoint_->state.moments.at("fc2.weight").at("m")}) {
    const size_t at = FindTensorBytes(bytes, *tensor);
    ASSERT_NE(at, std::string::npos);
    std::string flipped = bytes;
    flipped[at + 5] ^= 0x04;
    WriteBytes(bad, flipped);
    ExpectCorrupt(bad,
                  "data digest mismatch: the weights, moments, graph or training state were "
                  "modified or corrupted");
  }
  // A flipped byte in a node name (the graph structure): NodeProto.name
  // "/fc2/Gemm", then op_type (field 4, tag 0x22) "Gemm".
  const size_t node = bytes.find(std::string("/fc2/Gemm\x22\x04Gemm"));
  ASSERT_NE(node, std::string::npos);
  std::string renamed = bytes;
  renamed[node + 1] = 'g';
  WriteBytes(bad, renamed);
  ExpectCorrupt(bad, "data digest mismatch");

  ExpectCorrupt(SampleModelPath("resnet_opset17"),
                "an ONNX model but not a castor checkpoint (no castor.checkpoint.format metadata)");
  std::mt19937 rng(5);
  std::string noise(100000, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  WriteBytes(bad, noise);
  ExpectCorrupt(bad, "not a valid ONNX model");
  WriteBytes(bad, "{\"format\": \"castor.checkpoint/1\"}\n");
  ExpectCorrupt(bad, "not a valid ONNX model");
  ExpectCorrupt(dir_ / "missing.onnx", "no such file");
  ExpectCorrupt(dir_, "is a directory");
}

TEST_F(VerifyExportTest, MissingExternalDataExitsTwo) {
  const fs::path path = dir_ / "external.onnx";
  training::CheckpointWriteOptions options;
  options.external_data_threshold_bytes = 1;
  absl::StatusOr<training::WrittenCheckpoint> written = training::WriteCheckpoint(*checkpoint_, path.string(), options);
  ASSERT_TRUE(written.ok()) << written.status();
  Program p = VerifyFile(path);
  EXPECT_EQ(p.exit_code, kExitOk) << p.out << p.err;
  EXPECT_THAT(
      p.out, HasSubstr(absl::StrCat(" bytes + external data ", written->external_data_path, " (")));

  // Bit flip inside the data file.
  std::string data = ReadBytes(written->external_data_path);
  data[data.size() / 2] ^= 0x01;
  WriteBytes(written->external_data_path, data);
  ExpectCorrupt(path, "data digest mismatch");
  data[data.size() / 2] ^= 0x01;
  // Truncated data file.
  WriteBytes(written->external_data_path, data.substr(0, data.size() - 10));
  ExpectCorrupt(path, "the tensor needs");
  WriteBytes(written->external_data_path, data);
  EXPECT_EQ(VerifyFile(path).exit_code, kExitOk);
  // Renamed, then removed.
  fs::rename(written->external_data_path, dir_ / "renamed.data");
  ExpectCorrupt(
      path, absl::StrCat("external data file ", written->external_data_path, " does not exist"));
  fs::remove(dir_ / "renamed.data");
  ExpectCorrupt(path, "does not exist");
}

// The policy record tampered with in the ways the layers of checks catch.
TEST_F(VerifyExportTest, ATamperedPolicyRecordExitsOne) {
  const std::string pristine = ReadBytes(checkpoint_path_);
  auto policy_json = [](Record& record) -> Json {
    return *Json::Parse(RecordEntry(record, training::kCheckpointPolicyKey));
  };
  // Gemm moved from the allow list to the deny list in the recorded policy.
  auto move_gemm_to_deny = [&](Record& record) {
    Json policy = policy_json(record);
    Json* lists = policy.Find("op_lists");
    Json allow = Json::Array(), deny = *lists->Find("deny");
    for (const Json& op : lists->Find("allow")->items()) {
      if (op.as_string() != "Gemm") allow.Append(op);
    }
    deny.Append(Json::String("Gemm"));
    lists->Set("allow", allow).Set("deny", deny);
    RecordEntry(record, training::kCheckpointPolicyKey) = policy.Dump();
  };
  auto digest_of = [&](Record& record) {
    return Policy::FromJson(policy_json(record), "test")->Digest();
  };
  auto problems_of = [&](const Program& p) {
    absl::StatusOr<Json> json = Json::Parse(p.out);
    std::vector<std::string> problems;
    if (!json.ok()) {
      ADD_FAILURE() << p.out;
      return problems;
    }
    for (const Json& item : json->Find("problems")->items()) problems.push_back(item.as_string());
    return problems;
  };
  const std::string record_seal = "the record digest does not match";
  const std::string policy_modified = "the policy was modified: the recorded policy digest is";
  const std::string kept_differs = "the recorded nodes kept float32";

  // (a) The policy name edited in the policy JSON, nothing re-sealed: the
  // record digest and the policy digest both disagree.
  EditRecord(
      checkpoint_path_,
      [&](Record& record) {
        Json policy = policy_json(record);
        policy.Set("name", Json::String("mixed_float16_certified"));
        policy.Set("compute_dtype", Json::String("float16"));
        RecordEntry(record, training::kCheckpointPolicyKey) = policy.Dump();
      },
      /*reseal=*/false);
  Program p = Verify({"--json"});
  EXPECT_EQ(p.exit_code, kExitFailure) << p.out << p.err;
  std::vector<std::string> problems = problems_of(p);
  ASSERT_EQ(problems.size(), 3u) << p.out;
  EXPECT_THAT(problems[0], HasSubstr(record_seal));
  EXPECT_THAT(problems[1], HasSubstr(policy_modified));
  EXPECT_THAT(problems[1], HasSubstr("name 'mixed_float16_certified'"));
  EXPECT_EQ(problems[2],
            "castor.checkpoint.policy_name is 'mixed_float16' but the recorded "
            "policy's name is 'mixed_float16_certified'");

  // (b) An op-list entry edited and the record digest re-sealed: the policy
  // digest check catches it (and autocast now keeps the Gemms float32).
  WriteBytes(checkpoint_path_, pristine);
  EditRecord(checkpoint_path_, move_gemm_to_deny, /*reseal=*/true);
  p = Verify({"--json"});
  EXPECT_EQ(p.exit_code, kExitFailure) << p.out << p.err;
  problems = problems_of(p);
  ASSERT_EQ(problems.size(), 2u) << p.out;
  EXPECT_THAT(problems[0], HasSubstr(policy_modified));
  EXPECT_THAT(problems[1], HasSubstr(kept_differs));
  EXPECT_THAT(problems[1], HasSubstr("'/fc1/Gemm' now float32, not recorded"));

  // (c) ... and the policy digest recomputed too: the nodes kept float32,
  // recomputed by autocast, no longer match the record.
  WriteBytes(checkpoint_path_, pristine);
  EditRecord(
      checkpoint_path_,
      [&](Record& record) {
        move_gemm_to_deny(record);
        RecordEntry(record, training::kCheckpointPolicyDigestKey) = digest_of(record);
      },
      /*reseal=*/true);
  p = Verify({});
  EXPECT_EQ(p.exit_code, kExitFailure) << p.out << p.err;
  EXPECT_THAT(p.out, HasSubstr(kept_differs));
  EXPECT_THAT(p.out, Not(HasSubstr(policy_modified)));
  EXPECT_THAT(p.out, Not(HasSubstr(record_seal)));

  // (d) The recorded compute dtype field alone, re-sealed.
  WriteBytes(checkpoint_path_, pristine);
  EditRecord(
      checkpoint_path_,
      [&](Record& record) { RecordEntry(record, training::kCheckpointComputeDTypeKey) = "bfloat16"; },
      /*reseal=*/true);
  p = Verify({});
  EXPECT_EQ(p.exit_code, kExitFailure) << p.out << p.err;
  EXPECT_THAT(p.err, HasSubstr("castor.checkpoint.compute_dtype is 'bfloat16' but the recorded "
                               "policy's compute dtype is 'float16'"));

  // (e) A policy JSON that no longer parses as a policy (an unknown op): 1.
  WriteBytes(checkpoint_path_, pristine);
  EditRecord(
      checkpoint_path_,
      [&](Record& record) {
        Json policy = policy_json(record);
        policy.Set("op_overrides", Json::Object().Set("NoSuchOp", Json::String("allow")));
        RecordEntry(record, training::kCheckpointPolicyKey) = policy.Dump();
      },
      /*reseal=*/true);
  p = Verify({});
  EXPECT_EQ(p.exit_code, kExitFailure) << p.out << p.err;
  EXPECT_THAT(p.err, HasSubstr("the recorded policy is not a valid policy"));
  EXPECT_THAT(p.err, HasSubstr("NoSuchOp"));

  // (f) A forgery that rewrites the name everywhere and recomputes every
  // digest is consistent (digests are not signatures): only an expected
  // policy catches it.
  WriteBytes(checkpoint_path_, pristine);
  EditRecord(
      checkpoint_path_,
      [&](Record& record) {
        Json policy = policy_json(record);
        policy.Set("name", Json::String("certified"));
        policy.Set("compute_dtype", Json::String("float16"));
        RecordEntry(record, training::kCheckpointPolicyKey) = policy.Dump();
        RecordEntry(record, training::kCheckpointPolicyNameKey) = "certified";
        RecordEntry(record, training::kCheckpointPolicyDigestKey) = digest_of(record);
      },
      /*reseal=*/true);
  EXPECT_EQ(Verify({}).exit_code, kExitOk);
  p = Verify({"--policy", "mixed_float16"});
  EXPECT_EQ(p.exit_code, kExitFailure);
  EXPECT_THAT(p.out, HasSubstr("name: recorded 'certified', expected 'mixed_float16'"));
}

// Edits of what the data digest covers are corruption (exit 2); so are a
// record that lost an entry and unparseable JSON in it.
TEST_F(VerifyExportTest, AnotherVersionsKeptSetIsANoteNotAProblem) {
  // castor 0.1.0 had no autocast rule 3b, so it kept this MLP's Flatten
  // float32 too. Its checkpoint records that set; this version's pass
  // differs, which verify reports as a note (exit 0), export and resume
  // accept. The same record claiming this version is a mismatch.
  auto record_old_set = [](Record& record) {
    RecordEntry(record, training::kCheckpointKeptFloat32Key) = R"(["/flatten/Flatten","/fc3/Gemm"])";
  };
  EditRecord(
      checkpoint_path_,
      [&](Record& record) {
        record_old_set(record);
        RecordEntry(record, training::kCheckpointCastorVersionKey) = "0.1.0";
      },
      /*reseal=*/true);
  Program p = Verify({});
  EXPECT_EQ(p.exit_code, kExitOk) << p.out << p.err;
  EXPECT_THAT(p.out, HasSubstr("verified"));
  EXPECT_THAT(p.out, HasSubstr("  notes:\n    - the recorded nodes kept float32 (2) differ"));
  EXPECT_THAT(p.out, HasSubstr("'/flatten/Flatten' recorded float32, now lower"));
  EXPECT_THAT(p.out, HasSubstr(absl::StrCat("written by castor 0.1.0, checked by castor ",
                                            kCastorVersion)));
  EXPECT_THAT(p.out, Not(HasSubstr("problems:")));
  absl::StatusOr<Json> json = Json::Parse(Verify({"--json"}).out);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->Find("notes")->items().size(), 1u);
  EXPECT_TRUE(json->Find("problems")->items().empty());

  const std::string exported = (dir_ / "old.onnx").string();
  p = RunCommand(RunExport, {checkpoint_path_, "-o", exported});
  EXPECT_EQ(p.exit_code, kExitOk) << p.out << p.err;
  EXPECT_THAT(p.err, HasSubstr("castor export: note: the recorded nodes kept float32"));
  EXPECT_TRUE(fs::exists(exported));
  EXPECT_TRUE(training::FindLatestCheckpoint(checkpoint_path_).ok());

  EditRecord(
      checkpoint_path_,
      [&](Record& record) { RecordEntry(record, training::kCheckpointCastorVersionKey) = kCastorVersion; },
      /*reseal=*/true);
  p = Verify({});
  EXPECT_EQ(p.exit_code, kExitFailure) << p.out << p.err;
  EXPECT_THAT(p.out, HasSubstr("problems:\n    - the recorded nodes kept float32 (2) differ"));
  EXPECT_FALSE(training::FindLatestCheckpoint(checkpoint_path_).ok());
}

TEST_F(VerifyExportTest, AnEditedStateOrABrokenRecordExitsTwo) {
  const std::string pristine = ReadBytes(checkpoint_path_);
  EditRecord(
      checkpoint_path_,
      [](Record& record) {
        Json state = *Json::Parse(RecordEntry(record, training::kCheckpointStateKey));
        state.Set("position", Json::Int(0));
        RecordEntry(record, training::kCheckpointStateKey) = state.Dump();
      },
      /*reseal=*/true);
  ExpectCorrupt(checkpoint_path_, "data digest mismatch");

  WriteBytes(checkpoint_path_, pristine);
  EditRecord(
      checkpoint_path_,
      [](Record& record) {
        std::erase_if(record, [](const auto& e) { return e.first == training::kCheckpointKeptFloat32Key; });
      },
      /*reseal=*/true);
  ExpectCorrupt(checkpoint_path_,
                "the checkpoint record is incomplete: "
                "castor.checkpoint.kept_float32_nodes is missing");

  WriteBytes(checkpoint_path_, pristine);
  EditRecord(
      checkpoint_path_,
      [](Record& record) { RecordEntry(record, training::kCheckpointPolicyKey) = "{\"name\": "; },
      /*reseal=*/false);
  ExpectCorrupt(checkpoint_path_, "castor.checkpoint.policy is not valid JSON");

  WriteBytes(checkpoint_path_, pristine);
  EditRecord(
      checkpoint_path_,
      [](Record& record) { RecordEntry(record, training::kCheckpointFormatKey) = "castor.checkpoint/9"; },
      /*reseal=*/true);
  ExpectCorrupt(checkpoint_path_, "checkpoint format 'castor.checkpoint/9'; this castor");
}

TEST_F(VerifyExportTest, ExportWritesTheFloat32InferenceModel) {
  const std::string out = (dir_ / "model.onnx").string();
  Program p = RunCommand(RunExport, {checkpoint_path_, "-o", out});
  ASSERT_EQ(p.exit_code, kExitOk) << p.out << p.err;
  EXPECT_THAT(p.out, HasSubstr(absl::StrCat("castor export: ", checkpoint_path_, " -> ", out)));
  EXPECT_THAT(p.out, HasSubstr("  checkpoint  step 3, trained under mixed_float16 (sha256:"));
  EXPECT_THAT(p.out, HasSubstr("669,706 trained parameter elements, float32 (unconverted)"));

  absl::StatusOr<Model> model = LoadAndCheckModel(out);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(model->serialized_training_info.empty());
  for (const auto& [key, value] : model->metadata_props) {
    EXPECT_THAT(key, Not(HasSubstr("castor.checkpoint"))) << key;
    EXPECT_THAT(key, Not(HasSubstr("castor.policy"))) << key;
  }
  EXPECT_NE(model->FindMetadata("castor.sample"), nullptr);
  for (const Value* value : checkpoint_->model.graph->initializers()) {
    const Value* exported = model->graph->FindValue(value->name());
    ASSERT_NE(exported, nullptr);
    EXPECT_TRUE(*exported->initializer() == *value->initializer()) << value->name();
  }
  EXPECT_LT(fs::file_size(out), fs::file_size(checkpoint_path_) / 2);  // no moments

  // The exported model and the checkpoint itself compute the same outputs.
  Tensor images(DType::kFloat32, {4, 1, 28, 28});
  for (int64_t i = 0; i < images.num_elements(); ++i) {
    images.data<float>()[i] = static_cast<float>((i * 37) % 101) / 101.0f;
  }
  ASSERT_TRUE(training::WriteNpy((dir_ / "x.npy").string(), images).ok());
  for (const std::string& model_path : {out, checkpoint_path_}) {
    const std::string outputs = (dir_ / fs::path(model_path).stem()).string();
    const Program run = RunCastor(
        dir_, absl::StrCat("run ", model_path, " --input input=", (dir_ / "x.npy").string(),
                           " --output-dir ", outputs));
    ASSERT_EQ(run.exit_code, 0) << run.err;
  }
  const std::string exported_logits = ReadBytes(dir_ / "model" / "logits.npy");
  EXPECT_FALSE(exported_logits.empty());
  EXPECT_EQ(exported_logits, ReadBytes(dir_ / "ckpt" / "logits.npy"));
}

TEST_F(VerifyExportTest, ExportConvertsUnderAPolicy) {
  const std::string recorded = (dir_ / "recorded.onnx").string();
  Program p = RunCommand(RunExport, {checkpoint_path_, "-o", recorded, "--policy", "recorded"});
  ASSERT_EQ(p.exit_code, kExitOk) << p.out << p.err;
  EXPECT_THAT(p.out, HasSubstr("converted under mixed_float16 (sha256:"));
  absl::StatusOr<Model> model = LoadAndCheckModel(recorded);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*model->FindMetadata(kPolicyDigestKey), checkpoint_->policy.Digest());
  int casts = 0;
  for (const Node* node : model->graph->nodes()) casts += node->op_type() == "Cast";
  EXPECT_GT(casts, 0);

  const std::string bf16 = (dir_ / "bf16.onnx").string();
  p = RunCommand(RunExport, {checkpoint_path_, "-o", bf16, "--policy", "mixed_bfloat16"});
  ASSERT_EQ(p.exit_code, kExitOk) << p.out << p.err;
  model = LoadAndCheckModel(bf16);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*model->FindMetadata(kPolicyNameKey), "mixed_bfloat16");

  // An external-data checkpoint exports to one inline file.
  training::CheckpointWriteOptions options;
  options.external_data_threshold_bytes = 1;
  const std::string external = (dir_ / "external.onnx").string();
  ASSERT_TRUE(training::WriteCheckpoint(*checkpoint_, external, options).ok());
  const std::string inline_model = (dir_ / "inline.onnx").string();
  p = RunCommand(RunExport, {external, "-o", inline_model});
  ASSERT_EQ(p.exit_code, kExitOk) << p.out << p.err;
  EXPECT_GT(fs::file_size(inline_model), 669706u * 4);
}

TEST_F(VerifyExportTest, ExportRefusesBadCheckpointsAndFlags) {
  const std::string out = (dir_ / "model.onnx").string();
  const fs::path bad = dir_ / "bad.onnx";
  WriteBytes(bad, ReadBytes(checkpoint_path_).substr(0, 5000));
  Program p = RunCommand(RunExport, {bad.string(), "-o", out});
  EXPECT_EQ(p.exit_code, kExitBadInput);
  EXPECT_THAT(p.err, HasSubstr(bad.string()));

  EditRecord(
      checkpoint_path_,
      [](Record& record) { RecordEntry(record, training::kCheckpointPolicyNameKey) = "float32"; },
      /*reseal=*/false);
  p = RunCommand(RunExport, {checkpoint_path_, "-o", out});
  EXPECT_EQ(p.exit_code, kExitFailure);
  EXPECT_THAT(p.err, HasSubstr("is inconsistent"));
  EXPECT_THAT(p.err, HasSubstr("nothing was written"));
  EXPECT_FALSE(fs::exists(out));

  p = RunCommand(RunExport, {checkpoint_path_});
  EXPECT_EQ(p.exit_code, kExitBadInput);
  EXPECT_THAT(p.err, HasSubstr("missing -o/--output FILE"));
  p = RunCommand(RunExport, {checkpoint_path_, "-o", out, "--policy", "fp8"});
  EXPECT_EQ(p.exit_code, kExitBadInput);
  EXPECT_THAT(p.err, HasSubstr("--policy fp8: "));
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(VerifyExportTest, TheBinaryListsAndRunsBothCommands) {
  Program p = RunCastor(dir_, "--help");
  EXPECT_EQ(p.exit_code, 0);
  EXPECT_THAT(p.out, HasSubstr("  verify "));
  EXPECT_THAT(p.out, HasSubstr("  export "));
  p = RunCastor(dir_, "verify --help");
  EXPECT_EQ(p.exit_code, 0);
  EXPECT_THAT(p.out, HasSubstr("usage: castor verify CKPT"));
  p = RunCastor(dir_, "verify " + checkpoint_path_ + " --policy mixed_float16");
  EXPECT_EQ(p.exit_code, 0) << p.err;
  p = RunCastor(dir_, "verify " + SampleModelPath("mlp_opset17"));
  EXPECT_EQ(p.exit_code, 2);
  p = RunCastor(dir_, "export " + checkpoint_path_ + " -o " + (dir_ / "m.onnx").string());
  EXPECT_EQ(p.exit_code, 0) << p.err;
}

}  // namespace
}  // namespace castor::tools
