// The `castor` program's top level: the subcommand table, global flags
// (--help, --version), the error line + exit code for bad invocations, and
// what every subcommand shares (Command, ResolvePolicyFlags).
#include "tools/cli.h"

#include "graph/version.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backend/cpu/gemm.h"
#include "backend/cuda_probe.h"
#include "backend/policy_fit.h"
#include "tools/args.h"
#include "tools/conformance_command.h"
#include "tools/convert_command.h"
#include "tools/export_command.h"
#include "tools/inspect_command.h"
#include "tools/run_command.h"
#include "tools/train_command.h"
#include "tools/verify_command.h"

#define CASTOR_VERSION CASTOR_VERSION_STRING

namespace castor::tools {

const std::vector<Subcommand>& Subcommands() {
  // One line per subcommand; `castor --help` lists them in this order.
  static const std::vector<Subcommand> kSubcommands = {
      {"inspect", "show a model's graph: nodes, dtypes, shapes, parameters (text, json or dot)",
       RunInspect},
      {"convert", "rewrite a model for mixed precision under a policy (the autocast pass)",
       RunConvert},
      {"run", "run inference on the CPU backend: inputs from .npy/.pb files, outputs to .npy",
       RunRun},
      {"train", "train a model in mixed precision (autocast, autodiff, optimizer, loss scaling)",
       RunTrain},
      {"verify", "check a checkpoint: digests, float32 master weights, state, the recorded policy",
       RunVerify},
      {"export", "write a checkpoint's inference model (float32, or converted under a policy)",
       RunExport},
      {"conformance", "run ONNX backend node test cases and compare as ONNX's test runner does",
       RunConformance},
  };
  return kSubcommands;
}

std::optional<int> Command::Parse(const std::vector<std::string>& args) const {
  absl::StatusOr<ParseOutcome> outcome = parser_.Parse(args);
  if (!outcome.ok()) return Fail(kExitBadInput, outcome.status());
  if (*outcome == ParseOutcome::kHelp) {
    out_ << parser_.Help();
    return kExitOk;
  }
  return std::nullopt;
}

std::string OneLine(absl::string_view text) {
  std::string line;
  line.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      line += "\\n";
    } else if (c == '\r') {
      line += "\\r";
    } else if (c == '\t') {
      line += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      line += absl::StrFormat("\\x%02x", byte);
    } else {
      line += c;
    }
  }
  return line;
}

int Command::Fail(int code, absl::string_view message) const {
  err_ << parser_.command() << ": error: " << OneLine(message) << "\n";
  return code;
}

absl::StatusOr<std::optional<Policy>> ResolvePolicyFlags(const PolicyFlags& flags) {
  if (!flags.name.empty() && !flags.file.empty()) {
    return absl::InvalidArgumentError("give --policy or --policy-file, not both");
  }
  if (!flags.name.empty() && flags.name != flags.keyword) {
    absl::StatusOr<Policy> builtin = Policy::Builtin(flags.name);
    if (!builtin.ok() && flags.name_the_flag) {
      return absl::Status(builtin.status().code(),
                          absl::StrCat("--policy ", flags.name, ": ", builtin.status().message(),
                                       flags.hint));
    }
    if (!builtin.ok()) return builtin.status();
    return std::optional<Policy>(*std::move(builtin));
  }
  if (!flags.file.empty()) {
    absl::StatusOr<Policy> loaded = Policy::LoadFile(flags.file);
    if (!loaded.ok() && flags.name_the_flag) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("--policy-file: ", loaded.status().message()));
    }
    if (!loaded.ok()) return loaded.status();
    return std::optional<Policy>(*std::move(loaded));
  }
  return std::optional<Policy>();
}

namespace {

const Subcommand* FindSubcommand(const std::string& name) {
  for (const Subcommand& sub : Subcommands()) {
    if (name == sub.name) return &sub;
  }
  return nullptr;
}

int UnknownSubcommand(const std::string& name, std::ostream& err) {
  std::vector<std::string> names;
  for (const Subcommand& sub : Subcommands()) names.push_back(sub.name);
  err << "castor: error: unknown command '" << name << "'";
  if (std::string suggestion = ClosestMatch(name, names); !suggestion.empty()) {
    err << " (did you mean '" << suggestion << "'?)";
  }
  err << "; run 'castor --help' for the list of commands\n";
  return kExitBadInput;
}

}  // namespace

std::string TopLevelHelp() {
  std::string help = absl::StrCat(
      "castor ", CASTOR_VERSION, ": trains ONNX models in mixed precision\n\n",
      "usage: castor COMMAND [arguments] [flags]\n",
      "       castor help COMMAND      (or castor COMMAND --help)\n\n",
      "commands:\n");
  size_t width = 0;
  for (const Subcommand& sub : Subcommands()) width = std::max(width, std::string(sub.name).size());
  for (const Subcommand& sub : Subcommands()) {
    const std::string name = sub.name;
    absl::StrAppend(&help, "  ", name, std::string(width - name.size() + 3, ' '), sub.summary,
                    "\n");
  }
  absl::StrAppend(
      &help,
      "\nglobal flags:\n"
      "  -h, --help   show this help; after a command, that command's help\n"
      "  --version    print castor's version, the CPU's GEMM kernels, whether the CUDA\n"
      "               backend is usable and whether each mixed policy pays on this machine\n"
      "\nexit codes:\n"
      "  0  success\n"
      "  1  the command ran and a check it performs failed\n"
      "  2  bad input: a missing or invalid file, an unknown command or flag, a bad flag value\n"
      "\nexample:\n"
      "  castor inspect models/cnn_opset13.onnx --format dot --output cnn.dot\n");
  return help;
}

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    out << TopLevelHelp();
    return kExitOk;
  }
  const std::string& first = args[0];
  if (first == "help") {
    if (args.size() == 1) {
      out << TopLevelHelp();
      return kExitOk;
    }
    const Subcommand* sub = FindSubcommand(args[1]);
    if (!sub) return UnknownSubcommand(args[1], err);
    return sub->run({"--help"}, out, err);
  }
  if (first == "--version") {
    out << "castor " << CASTOR_VERSION << "\n"
        << "CPU backend: " << cpu::DescribeGemm() << "\n"
        << DescribeCudaProbe(ProbeCuda()) << "\n"
        << DescribePolicyFitForThisMachine();
    return kExitOk;
  }
  if (first.size() > 1 && first[0] == '-') {
    err << "castor: error: unknown flag '" << first << "'";
    if (std::string suggestion = ClosestMatch(first, {"--help", "--version"});
        !suggestion.empty()) {
      err << " (did you mean '" << suggestion << "'?)";
    }
    err << "; run 'castor --help' for usage\n";
    return kExitBadInput;
  }
  const Subcommand* sub = FindSubcommand(first);
  if (!sub) return UnknownSubcommand(first, err);
  return sub->run(std::vector<std::string>(args.begin() + 1, args.end()), out, err);
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const int code = RunCli(args, std::cout, std::cerr);
  std::cout.flush();
  return code;
}

}  // namespace castor::tools
