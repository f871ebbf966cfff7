// `castor convert` (see convert_command.h): flags to a Policy, the autocast
// pass, the verifier, the atomic save and the summary.
#include "tools/convert_command.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "graph/onnx_io.h"
#include "graph/status.h"
#include "passes/autocast.h"
#include "passes/model_loader.h"
#include "passes/pass_manager.h"
#include "passes/verifier.h"
#include "tools/args.h"
#include "tools/cli.h"
#include "tools/inspect_command.h"

namespace castor::tools {
namespace {

// "Exp,Log" and repeated flags alike: every non-empty entry, in order.
std::vector<std::string> SplitLists(const std::vector<std::string>& values) {
  std::vector<std::string> entries;
  for (const std::string& value : values) {
    for (absl::string_view entry : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
      entries.emplace_back(absl::StripAsciiWhitespace(entry));
    }
  }
  return entries;
}

absl::Status NameFlag(const absl::Status& status, const std::string& flag,
                      const std::string& value) {
  return absl::Status(status.code(),
                      absl::StrCat("--", flag, " ", value, ": ", status.message()));
}

std::string FormatBytes(int64_t bytes) {
  return absl::StrCat(WithThousandsSeparators(bytes), " bytes");
}

}  // namespace

absl::StatusOr<Policy> PolicyFromOptions(const ConvertOptions& options) {
  absl::StatusOr<Policy> loaded = options.policy_file.empty()
                                      ? Policy::Builtin(options.policy)
                                      : Policy::LoadFile(options.policy_file);
  if (!loaded.ok()) {
    if (!options.policy_file.empty()) return loaded.status();
    return NameFlag(loaded.status(), "policy", options.policy);
  }
  Policy policy = std::move(loaded).value();
  for (const std::string& op : SplitLists(options.fp32_ops)) {
    if (absl::Status s = policy.OverrideOp(op, AutocastCategory::kDeny); !s.ok()) {
      return NameFlag(s, "fp32-ops", op);
    }
  }
  for (const std::string& op : SplitLists(options.lowp_ops)) {
    if (absl::Status s = policy.OverrideOp(op, AutocastCategory::kAllow); !s.ok()) {
      return NameFlag(s, "lowp-ops", op);
    }
  }
  for (const std::string& pattern : options.fp32_nodes) {
    NodeOverride rule;
    rule.regex = pattern;
    rule.category = AutocastCategory::kDeny;
    if (absl::Status s = policy.OverrideNode(rule); !s.ok()) {
      return NameFlag(s, "fp32-nodes", pattern);
    }
  }
  for (const std::string& pin : SplitLists(options.pins)) {
    const size_t colon = pin.rfind(':');
    int input = -1;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(pin.substr(colon + 1), &input) || input < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pin-fp32 ", pin, ": expected OP:INPUT, e.g. Resize:2 (input index from 0)"));
    }
    if (absl::Status s = policy.PinInput(pin.substr(0, colon), input); !s.ok()) {
      return NameFlag(s, "pin-fp32", pin);
    }
  }
  if (options.keep_io_types_given) policy.set_keep_io_types(options.keep_io_types);
  return policy;
}

std::string RenderConvertSummary(const ConvertOptions& options, const Policy& policy,
                                 const AutocastReport& report) {
  std::string text = absl::StrCat("castor convert: ", options.model_path, " -> ",
                                  options.output_path, "\n");
  absl::StrAppend(&text, "  policy    ", policy.name(), " (", policy.Digest(), ")\n",
                  "            compute ", DTypeName(policy.compute_dtype()), ", variables ",
                  DTypeName(policy.variable_dtype()), ", graph outputs ",
                  policy.keep_io_types() ? "float32" : "as computed", "\n");
  if (report.unchanged) {
    absl::StrAppend(&text, "  unchanged: the model already carries this policy's digest\n");
  } else {
    absl::StrAppend(&text, "  casts     ", report.casts_inserted(), " inserted (",
                    report.weight_casts, " weight, ", report.constant_casts, " constant, ",
                    report.activation_casts, " activation)");
    if (report.constants_lowered > 0) {
      absl::StrAppend(&text, "; ", report.constants_lowered,
                      " Constant(s) stored in the compute dtype instead");
    }
    if (report.casts_removed > 0) {
      absl::StrAppend(&text, "; ", report.casts_removed,
                      " removed first (restart from the float32 graph)");
    }
    absl::StrAppend(&text, "\n");
    std::vector<std::string> per_dtype;
    for (const auto& [dtype, count] : report.nodes_per_dtype) {
      per_dtype.push_back(absl::StrCat(dtype, " ", count));
    }
    absl::StrAppend(&text, "  nodes     ", absl::StrJoin(per_dtype, ", "),
                    "  (\"none\": no float computation, e.g. Shape, Cast)\n");
    absl::StrAppend(&text, "  weights   ", FormatBytes(report.weight_bytes_stored),
                    " stored (float32 masters), ", FormatBytes(report.weight_bytes_computed),
                    " as computed\n");
  }
  for (const std::string& note : report.notes) absl::StrAppend(&text, "  note: ", note, "\n");
  return text;
}

int RunConvert(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  ConvertOptions options;
  ArgParser parser(
      "castor convert",
      "Rewrites MODEL so each node computes in the dtype the policy gives it (the autocast\n"
      "pass): allow-list ops (MatMul, Gemm, Conv, ...) in the compute dtype, deny-list ops\n"
      "(Softmax, reductions, normalisations, losses, ...) in float32, follow ops (elementwise,\n"
      "pooling, data movement) in the dtype their inputs agree on. Weights stay float32\n"
      "initializers with one shared Cast each; graph outputs stay float32. Every node records\n"
      "its dtype and the rule behind it (see 'castor inspect OUT --why NODE'); the model\n"
      "records the policy's name and digest. OUT is written atomically.\n"
      "Converting again under the same policy changes nothing; under another policy it is\n"
      "refused (exit 1) unless --restart-from-float32.");
  parser.AddPositional("MODEL", "the float32 ONNX model to convert", &options.model_path)
      .AddString("output", "FILE", "where to write the converted model (required)",
                 &options.output_path)
      .WithShortName('o')
      .AddEnum("policy", Policy::BuiltinNames(),
               "built-in policy: compute dtype float32, float16 or bfloat16", &options.policy)
      .AddString("policy-file", "FILE",
                 "load the policy from a JSON file instead (see --save-policy for the format)",
                 &options.policy_file)
      .AddRepeated("fp32-ops", "OP[,OP...]", "ops to keep in float32 (moved to the deny list)",
                   &options.fp32_ops)
      .AddRepeated("lowp-ops", "OP[,OP...]",
                   "ops to compute in the 16-bit dtype (moved to the allow list)",
                   &options.lowp_ops)
      .AddRepeated("fp32-nodes", "REGEX",
                   "nodes whose whole name matches REGEX (ECMAScript) stay float32",
                   &options.fp32_nodes)
      .AddRepeated("pin-fp32", "OP:INPUT", "that input of every OP node stays float32",
                   &options.pins)
      .AddSwitch("keep-io-types",
                 "graph outputs and the nodes producing them stay float32 (default: the "
                 "policy's setting, on for the built-ins); --no-keep-io-types also lowers graph "
                 "inputs read only in 16-bit",
                 &options.keep_io_types)
      .AddSwitch("restart-from-float32",
                 "the model was converted under another policy: strip castor's Casts and "
                 "records and convert the float32 graph again",
                 &options.restart_from_float32)
      .AddString("save-policy", "FILE", "also write the resolved policy as JSON to FILE",
                 &options.save_policy_path)
      .AddString("dump-passes", "DIR",
                 "write the graph before the first pass and after each pass as text to "
                 "DIR/NN-PASS.txt",
                 &options.dump_passes_dir)
      .AddExample("castor convert models/cnn_opset13.onnx -o cnn_fp16.onnx --policy mixed_float16")
      .AddExample("castor convert model.onnx -o model_bf16.onnx --policy mixed_bfloat16 "
                  "--fp32-ops Erf --fp32-nodes 'head/.*'");

  const Command command(parser, out, err);
  if (std::optional<int> done = command.Parse(args)) return *done;
  if (options.output_path.empty()) {
    return command.Fail(kExitBadInput, "missing -o/--output FILE: where to write the converted model");
  }
  if (parser.WasGiven("policy") && !options.policy_file.empty()) {
    return command.Fail(kExitBadInput, "give --policy or --policy-file, not both");
  }
  options.keep_io_types_given = parser.WasGiven("keep-io-types");

  absl::StatusOr<Policy> policy = PolicyFromOptions(options);
  if (!policy.ok()) return command.Fail(kExitBadInput, std::string(policy.status().message()));
  absl::StatusOr<Model> model = LoadAndCheckModel(options.model_path);
  if (!model.ok()) return command.Fail(kExitBadInput, std::string(model.status().message()));

  AutocastOptions autocast;
  autocast.restart_from_float32 = options.restart_from_float32;
  // The pipeline: canonicalize the imported model, then autocast.
  PassDumper dumper(options.dump_passes_dir);
  PassManagerOptions manager_options;
  if (!options.dump_passes_dir.empty()) {
    manager_options.dumper = &dumper;
    manager_options.dump_input = true;
  }
  AutocastReport report;
  PassManager manager(manager_options);
  AddImportPasses(manager).Add(MakeAutocastPass(*policy, autocast, &report));
  PassContext context;
  if (absl::Status ran = manager.Run(*model, context); !ran.ok()) {
    // A refusal (converted under another policy) or a pass bug is a check
    // that failed.
    const int code = absl::IsFailedPrecondition(ran) || absl::IsInternal(ran) ? kExitFailure
                                                                                : kExitBadInput;
    return command.Fail(code, absl::StrCat(options.model_path, ": ", ran.message()));
  }
  report.notes.insert(report.notes.begin(), context.notes.begin(), context.notes.end());
  // The verifier stands between a pass bug and a broken file on disk.
  if (absl::Status s = VerifyModel(*model); !s.ok()) {
    return command.Fail(kExitFailure, absl::StrCat("internal error: the converted model of ",
                                           options.model_path, " fails the verifier (",
                                           s.message(), "); nothing was written"));
  }
  if (absl::Status s = SaveModel(*model, options.output_path); !s.ok()) {
    return command.Fail(kExitBadInput, absl::StrCat("cannot write -o ", options.output_path, ": ",
                                            s.message()));
  }
  if (!options.save_policy_path.empty()) {
    if (absl::Status s = policy->SaveFile(options.save_policy_path); !s.ok()) {
      return command.Fail(kExitBadInput, absl::StrCat("cannot write --save-policy ",
                                              options.save_policy_path, ": ", s.message()));
    }
  }
  out << RenderConvertSummary(options, *policy, report);
  return kExitOk;
}

}  // namespace castor::tools
