// `castor verify` (see verify_command.h): read, check, compare, summarize.
#include "tools/verify_command.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "training/loss_scaler.h"
#include "passes/policy.h"
#include "tools/args.h"
#include "tools/cli.h"
#include "tools/inspect_command.h"

namespace castor::tools {
namespace {

int64_t FileSize(const std::string& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  return error ? -1 : static_cast<int64_t>(size);
}

std::string Plural(int64_t n, const char* singular, const char* plural) {
  return absl::StrCat(WithThousandsSeparators(n), " ", n == 1 ? singular : plural);
}

std::string FormatNumber(double value) { return absl::StrFormat("%.6g", value); }

}  // namespace

CheckpointSummary SummarizeCheckpoint(const training::Checkpoint& checkpoint, const std::string& path) {
  CheckpointSummary summary;
  summary.file = path;
  summary.file_bytes = FileSize(path);
  summary.external_data_file = checkpoint.external_data_file;
  if (!summary.external_data_file.empty()) {
    summary.external_data_bytes = FileSize(summary.external_data_file);
  }
  summary.castor_version = checkpoint.castor_version;
  summary.policy_name = checkpoint.policy.name();
  summary.policy_digest = checkpoint.policy.Digest();
  summary.compute_dtype = DTypeName(checkpoint.policy.compute_dtype());
  summary.variable_dtype = DTypeName(checkpoint.policy.variable_dtype());
  const Graph& graph = *checkpoint.model.graph;
  summary.node_count = graph.num_nodes();
  summary.kept_float32_nodes = static_cast<int>(checkpoint.kept_float32_nodes.size());
  for (const std::string& name : checkpoint.state.parameters) {
    ++summary.parameters;
    const Value* value = graph.FindValue(name);
    const Tensor* tensor = value ? value->initializer() : nullptr;
    if (tensor == nullptr || tensor->dtype() != DType::kFloat32) {
      summary.parameters_all_float32 = false;
    }
    if (tensor != nullptr) summary.parameter_elements += tensor->num_elements();
  }
  for (const std::string& name : checkpoint.state.running_stats) {
    ++summary.running_stats;
    const Value* value = graph.FindValue(name);
    if (value != nullptr && value->initializer() != nullptr) {
      summary.running_stat_elements += value->initializer()->num_elements();
    }
  }
  for (const auto& [parameter, slots] : checkpoint.state.moments) {
    summary.moment_tensors += static_cast<int64_t>(slots.size());
  }
  summary.state = checkpoint.state;
  for (auto& [parameter, slots] : summary.state.moments) {
    for (auto& [slot, tensor] : slots) tensor = Tensor();  // the names are enough
  }
  if (checkpoint.state.loss_scaler.is_object()) {
    absl::StatusOr<LossScaler> scaler = LossScaler::FromJson(checkpoint.state.loss_scaler);
    if (scaler.ok()) {
      summary.has_loss_scaler = true;
      summary.loss_scaling_enabled = scaler->enabled();
      summary.loss_scale = scaler->scale();
      summary.good_steps = scaler->good_steps();
      summary.skipped_steps = scaler->skipped_steps();
    }
  }
  if (const std::string* digest = training::FindCheckpointRecord(checkpoint, training::kCheckpointDataDigestKey)) {
    summary.data_digest = *digest;
  }
  if (const std::string* digest = training::FindCheckpointRecord(checkpoint, training::kCheckpointRecordDigestKey)) {
    summary.record_digest = *digest;
  }
  return summary;
}

VerifyResult VerifyCheckpointFile(const std::string& path, const Policy* expected) {
  VerifyResult result;
  absl::StatusOr<training::Checkpoint> checkpoint = training::ReadCheckpoint(path);
  if (!checkpoint.ok()) {
    // An edited record whose policy no longer parses is a mismatch; every
    // other failure means the file is unreadable or corrupt.
    result.exit_code =
        absl::IsFailedPrecondition(checkpoint.status()) ? kExitFailure : kExitBadInput;
    result.error = std::string(checkpoint.status().message());
    if (result.exit_code == kExitFailure) result.problems.push_back(result.error);
    return result;
  }
  result.summary = SummarizeCheckpoint(*checkpoint, path);
  result.problems = training::FindCheckpointInconsistencies(*checkpoint, &result.notes);
  if (expected != nullptr) {
    result.expected_policy = absl::StrCat(expected->name(), " (", expected->Digest(), ")");
    result.policy_differences = training::DescribePolicyDifferences(checkpoint->policy, *expected);
  }
  result.exit_code =
      result.problems.empty() && result.policy_differences.empty() ? kExitOk : kExitFailure;
  return result;
}

std::string RenderVerifyText(const VerifyResult& result) {
  if (!result.summary.has_value()) {
    std::string text = absl::StrCat("castor verify: MISMATCH\n");
    for (const std::string& problem : result.problems)
      absl::StrAppend(&text, "  - ", problem, "\n");
    return text;
  }
  const CheckpointSummary& s = *result.summary;
  const training::TrainingState& st = s.state;
  std::string text = absl::StrCat("castor verify: ", s.file, ": ",
                                  result.exit_code == kExitOk ? "verified" : "MISMATCH", "\n");
  auto line = [&text](const char* label, const std::string& value) {
    absl::StrAppend(&text, "  ", absl::StrFormat("%-12s", label), value, "\n");
  };
  line("policy", absl::StrCat(s.policy_name, "  ", s.policy_digest));
  line("dtypes", absl::StrCat("compute ", s.compute_dtype, ", variables (master weights) ",
                              s.variable_dtype));
  line("parameters", absl::StrCat(Plural(s.parameters, "tensor", "tensors"), ", ",
                                  Plural(s.parameter_elements, "element", "elements"), ", ",
                                  s.parameters_all_float32 ? "all float32" : "NOT all float32"));
  line("statistics",
       s.running_stats == 0
           ? std::string("no BatchNormalization running statistics")
           : absl::StrCat(Plural(s.running_stats,
                                 "BatchNormalization running "
                                 "statistic",
                                 "BatchNormalization running statistics"),
                          ", ", Plural(s.running_stat_elements, "element", "elements")));
  line("float32", absl::StrCat(s.kept_float32_nodes, " of ", s.node_count,
                               " nodes kept float32 by the policy"));
  line("progress",
       absl::StrCat("step ", st.step, " (", st.optimizer_step, " updates applied), epoch ",
                    st.epoch, ", position ", st.position,
                    st.dataset_size > 0 ? absl::StrCat(" of ", st.dataset_size) : "", ", batch ",
                    st.batch_size, ", seed ", st.seed, st.shuffle ? ", shuffled" : ", in order",
                    st.data.empty() ? "" : absl::StrCat(", data ", st.data)));
  line("optimizer",
       absl::StrCat(OptimizerKindName(st.optimizer.kind), ", lr ",
                    FormatNumber(st.lr_schedule.base_lr), " ", LrScheduleKindName(st.lr_schedule.kind), ", ",
                    Plural(s.moment_tensors, "moment tensor", "moment tensors")));
  if (s.has_loss_scaler) {
    line("loss scale", absl::StrCat(FormatNumber(s.loss_scale),
                                    s.loss_scaling_enabled ? "" : " (dynamic scaling off)", ", ",
                                    Plural(s.good_steps, "good step", "good steps"), ", ",
                                    Plural(s.skipped_steps, "skipped step", "skipped steps")));
  } else {
    line("loss scale", "not recorded");
  }
  line("training", absl::StrCat("loss ", st.loss.empty() ? "?" : st.loss, " on output ",
                                st.output.empty() ? "?" : st.output));
  line("written by", absl::StrCat("castor ", s.castor_version, " (", training::kCheckpointFormat, ")"));
  line("storage", s.external_data_file.empty()
                      ? absl::StrCat(WithThousandsSeparators(s.file_bytes), " bytes, one file")
                      : absl::StrCat(WithThousandsSeparators(s.file_bytes),
                                     " bytes + external data ", s.external_data_file, " (",
                                     WithThousandsSeparators(s.external_data_bytes), " bytes)"));
  line("digests", absl::StrCat("data ", s.data_digest));
  line("", absl::StrCat("record ", s.record_digest));
  if (!result.expected_policy.empty()) {
    line("expected",
         absl::StrCat(result.expected_policy, ": ",
                      result.policy_differences.empty() ? "matches the record" : "DIFFERS"));
    for (const std::string& difference : result.policy_differences) {
      absl::StrAppend(&text, "    - ", difference, "\n");
    }
  }
  if (!result.notes.empty()) {
    absl::StrAppend(&text, "  notes:\n");
    for (const std::string& note : result.notes) absl::StrAppend(&text, "    - ", note, "\n");
  }
  if (!result.problems.empty()) {
    absl::StrAppend(&text, "  problems:\n");
    for (const std::string& problem : result.problems)
      absl::StrAppend(&text, "    - ", problem, "\n");
  }
  return text;
}

Json VerifyResultToJson(const VerifyResult& result) {
  Json json = Json::Object();
  const char* status = result.exit_code == kExitOk        ? "verified"
                       : result.exit_code == kExitFailure ? "mismatch"
                                                          : "corrupt";
  json.Set("status", Json::String(status));
  json.Set("exit_code", Json::Int(result.exit_code));
  if (!result.error.empty()) json.Set("error", Json::String(result.error));
  Json problems = Json::Array();
  for (const std::string& p : result.problems) problems.Append(Json::String(p));
  json.Set("problems", std::move(problems));
  Json notes = Json::Array();
  for (const std::string& n : result.notes) notes.Append(Json::String(n));
  json.Set("notes", std::move(notes));
  if (!result.expected_policy.empty()) {
    Json expected = Json::Object();
    expected.Set("policy", Json::String(result.expected_policy));
    expected.Set("matches", Json::Bool(result.policy_differences.empty()));
    Json differences = Json::Array();
    for (const std::string& d : result.policy_differences) differences.Append(Json::String(d));
    expected.Set("differences", std::move(differences));
    json.Set("expected", std::move(expected));
  }
  if (!result.summary.has_value()) return json;
  const CheckpointSummary& s = *result.summary;
  json.Set("file", Json::String(s.file));
  json.Set("file_bytes", Json::Int(s.file_bytes));
  if (!s.external_data_file.empty()) {
    json.Set("external_data_file", Json::String(s.external_data_file));
    json.Set("external_data_bytes", Json::Int(s.external_data_bytes));
  }
  json.Set("castor_version", Json::String(s.castor_version));
  json.Set("format", Json::String(training::kCheckpointFormat));
  Json policy = Json::Object();
  policy.Set("name", Json::String(s.policy_name));
  policy.Set("digest", Json::String(s.policy_digest));
  policy.Set("compute_dtype", Json::String(s.compute_dtype));
  policy.Set("variable_dtype", Json::String(s.variable_dtype));
  json.Set("policy", std::move(policy));
  json.Set("nodes", Json::Int(s.node_count));
  json.Set("kept_float32_nodes", Json::Int(s.kept_float32_nodes));
  Json parameters = Json::Object();
  parameters.Set("count", Json::Int(s.parameters));
  parameters.Set("elements", Json::Int(s.parameter_elements));
  parameters.Set("all_float32", Json::Bool(s.parameters_all_float32));
  json.Set("parameters", std::move(parameters));
  Json stats = Json::Object();
  stats.Set("count", Json::Int(s.running_stats));
  stats.Set("elements", Json::Int(s.running_stat_elements));
  json.Set("running_stats", std::move(stats));
  json.Set("moment_tensors", Json::Int(s.moment_tensors));
  Json scaler = Json::Object();
  if (s.has_loss_scaler) {
    scaler.Set("enabled", Json::Bool(s.loss_scaling_enabled));
    scaler.Set("scale", Json::Number(s.loss_scale));
    scaler.Set("good_steps", Json::Int(s.good_steps));
    scaler.Set("skipped_steps", Json::Int(s.skipped_steps));
  }
  json.Set("loss_scaler", s.has_loss_scaler ? std::move(scaler) : Json());
  json.Set("state", training::TrainingStateToJson(s.state));
  Json digests = Json::Object();
  digests.Set("data", Json::String(s.data_digest));
  digests.Set("record", Json::String(s.record_digest));
  json.Set("digests", std::move(digests));
  return json;
}

int RunVerify(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string checkpoint_path, policy_name, policy_file;
  bool json = false;
  ArgParser parser(
      "castor verify",
      "Checks a checkpoint: the castor.checkpoint.* record is present and consistent, the data\n"
      "digest over the graph, weights, BatchNormalization statistics, optimizer moments and\n"
      "training state matches, every master weight is float32, the state matches the graph,\n"
      "and autocast of the stored float32 graph under the recorded policy keeps the recorded\n"
      "nodes float32. With --policy or --policy-file, the recorded policy must also equal the\n"
      "expected one (the differing fields are listed). Prints a summary: policy, dtypes,\n"
      "parameters, step, loss scale, skipped steps.\n"
      "Exit 0: verified; 1: a mismatch (what differs is listed); 2: unreadable or corrupt\n"
      "(truncated, bit-flipped, not a castor checkpoint, missing external data).");
  parser
      .AddPositional("CKPT", "the checkpoint file (castor train --checkpoint-dir)",
                     &checkpoint_path)
      .AddString("policy", "NAME",
                 absl::StrCat("the built-in policy the checkpoint must record (",
                              absl::StrJoin(Policy::BuiltinNames(), ", "), ")"),
                 &policy_name)
      .AddString("policy-file", "FILE",
                 "the policy file (castor convert --save-policy) the checkpoint must record",
                 &policy_file)
      .AddSwitch("json", "print the report as one JSON object", &json)
      .AddExample("castor verify runs/ckpt-00001000.onnx --policy mixed_bfloat16")
      .AddExample("castor verify ckpt.onnx --policy-file policy.json --json");
  const Command command(parser, out, err);
  if (std::optional<int> done = command.Parse(args)) return *done;
  PolicyFlags flags;
  flags.name = policy_name;
  flags.file = policy_file;
  absl::StatusOr<std::optional<Policy>> expected = ResolvePolicyFlags(flags);
  if (!expected.ok()) return command.Fail(kExitBadInput, expected.status());

  const VerifyResult result =
      VerifyCheckpointFile(checkpoint_path, expected->has_value() ? &**expected : nullptr);
  if (json) {
    out << VerifyResultToJson(result).Dump(2) << "\n";
  } else if (result.summary.has_value()) {
    out << RenderVerifyText(result);
  }
  if (result.exit_code == kExitBadInput) {
    return command.Fail(kExitBadInput, absl::StrCat(result.error, " (unreadable or corrupt checkpoint)"));
  }
  if (result.exit_code == kExitFailure) {
    const size_t count = result.problems.size() + result.policy_differences.size();
    std::string first =
        !result.problems.empty() ? result.problems.front() : result.policy_differences.front();
    return command.Fail(kExitFailure,
                absl::StrCat(checkpoint_path, " does not verify: ", count,
                             count == 1 ? " mismatch" : " mismatches", "; first: ", first));
  }
  return kExitOk;
}

}  // namespace castor::tools
