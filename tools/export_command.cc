// `castor export` (see export_command.h).
#include "tools/export_command.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/onnx_io.h"
#include "passes/autocast.h"
#include "passes/policy.h"
#include "passes/verifier.h"
#include "tools/args.h"
#include "training/checkpoint.h"
#include "tools/cli.h"
#include "tools/inspect_command.h"

namespace castor::tools {

int RunExport(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string checkpoint_path, output_path, policy_name, policy_file;
  ArgParser parser(
      "castor export",
      "Writes the inference model of a checkpoint: the float32 graph with the trained weights\n"
      "and BatchNormalization statistics, without the training state (optimizer moments, the\n"
      "castor.checkpoint.* record). With --policy or --policy-file the model is converted by\n"
      "the autocast pass under that policy (as 'castor convert' does); '--policy recorded'\n"
      "uses the policy the checkpoint was trained under. OUT is written atomically and runs in\n"
      "ONNX Runtime. The checkpoint is checked first: exit 2 when it is unreadable or corrupt,\n"
      "1 when it is inconsistent (see 'castor verify').");
  parser.AddPositional("CKPT", "the checkpoint file", &checkpoint_path)
      .AddString("output", "FILE", "where to write the inference model (required)", &output_path)
      .WithShortName('o')
      .AddString("policy", "NAME",
                 absl::StrCat("convert under this built-in policy (",
                              absl::StrJoin(Policy::BuiltinNames(), ", "),
                              ") or 'recorded' (the checkpoint's); default: float32, unconverted"),
                 &policy_name)
      .AddString("policy-file", "FILE", "convert under the policy in this JSON file", &policy_file)
      .AddExample("castor export runs/ckpt-00001000.onnx -o model.onnx")
      .AddExample("castor export ckpt.onnx -o model_bf16.onnx --policy recorded");
  const Command command(parser, out, err);
  if (std::optional<int> done = command.Parse(args)) return *done;
  if (output_path.empty()) {
    return command.Fail(kExitBadInput,
                        "missing -o/--output FILE: where to write the inference model");
  }
  PolicyFlags flags;
  flags.name = policy_name;
  flags.file = policy_file;
  flags.keyword = "recorded";  // the checkpoint's policy, known once it is read
  flags.hint = " (or 'recorded': the checkpoint's policy)";
  absl::StatusOr<std::optional<Policy>> requested = ResolvePolicyFlags(flags);
  if (!requested.ok()) return command.Fail(kExitBadInput, requested.status());
  std::optional<Policy> convert_under = *std::move(requested);

  absl::StatusOr<training::Checkpoint> checkpoint = training::ReadCheckpoint(checkpoint_path);
  if (!checkpoint.ok()) {
    const int code = absl::IsFailedPrecondition(checkpoint.status()) ? kExitFailure : kExitBadInput;
    return command.Fail(code, std::string(checkpoint.status().message()));
  }
  std::vector<std::string> notes;
  if (std::vector<std::string> problems = training::FindCheckpointInconsistencies(*checkpoint, &notes);
      !problems.empty()) {
    return command.Fail(kExitFailure, absl::StrCat(checkpoint_path, " is inconsistent (", problems.size(),
                                           " problem(s); run 'castor verify' for all): ",
                                           problems.front(), "; nothing was written"));
  }
  for (const std::string& note : notes) err << "castor export: note: " << note << "\n";
  if (policy_name == "recorded") convert_under = checkpoint->policy;

  absl::StatusOr<Model> model = training::InferenceModelFromCheckpoint(*checkpoint);
  if (!model.ok()) {
    return command.Fail(kExitBadInput, absl::StrCat(checkpoint_path, ": ", model.status().message()));
  }
  std::string converted;
  if (convert_under.has_value()) {
    absl::StatusOr<AutocastReport> report = RunAutocast(*model, *convert_under);
    if (!report.ok()) {
      return command.Fail(kExitFailure,
                  absl::StrCat(checkpoint_path, ": autocast under ", convert_under->name(),
                               " fails: ", report.status().message()));
    }
    converted =
        absl::StrCat("converted under ", convert_under->name(), " (", convert_under->Digest(),
                     "): ", report->casts_inserted(), " Casts inserted");
  }
  if (absl::Status s = VerifyModel(*model); !s.ok()) {
    return command.Fail(kExitFailure,
                absl::StrCat("internal error: the exported model of ", checkpoint_path,
                             " fails the verifier (", s.message(), "); nothing was written"));
  }
  if (absl::Status s = SaveModel(*model, output_path); !s.ok()) {
    return command.Fail(kExitBadInput, absl::StrCat("cannot write -o ", output_path, ": ", s.message()));
  }
  int64_t parameters = 0;
  for (const std::string& name : checkpoint->state.parameters) {
    if (const Value* value = model->graph->FindValue(name); value && value->initializer()) {
      parameters += value->initializer()->num_elements();
    }
  }
  out << "castor export: " << checkpoint_path << " -> " << output_path << "\n"
      << "  checkpoint  step " << checkpoint->state.step << ", trained under "
      << checkpoint->policy.name() << " (" << checkpoint->policy.Digest() << ")\n"
      << "  model       " << model->graph->num_nodes() << " nodes, "
      << WithThousandsSeparators(parameters) << " trained parameter elements, "
      << (converted.empty() ? std::string("float32 (unconverted)") : converted) << "\n"
      << "  dropped     training state (optimizer moments, castor.checkpoint.* record)\n";
  return kExitOk;
}

}  // namespace castor::tools
