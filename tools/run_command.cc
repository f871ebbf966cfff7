// `castor run` (see run_command.h): flags, input files to feeds, the
// executor run on the CPU backend, the output summary and .npy files.
#include "tools/run_command.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/executor.h"
#include "graph/half.h"
#include "graph/status.h"
#include "passes/model_loader.h"
#include "passes/unroll_recurrent.h"
#include "tools/args.h"
#include "tools/cli.h"
#include "training/npy.h"

namespace castor::tools {
namespace {

struct RunOptions {
  std::string model_path;
  std::vector<std::string> inputs;  // NAME=FILE
  std::string output_dir;
  int64_t threads = 0;
};

std::string FormatNumber(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.6g", value);
  return buffer;
}

// A float32 file feeding a bfloat16 input (what `castor run` writes for
// bfloat16 outputs) is rounded to bfloat16, nearest even.
Tensor AdaptToInput(Tensor tensor, DType input_dtype) {
  if (input_dtype != DType::kBFloat16 || tensor.dtype() != DType::kFloat32) return tensor;
  Tensor narrowed(DType::kBFloat16, tensor.dims());
  for (int64_t i = 0; i < tensor.num_elements(); ++i) {
    narrowed.data<uint16_t>()[i] = FloatToBFloat16Bits(tensor.data<float>()[i]);
  }
  return narrowed;
}

// Reads every --input file; errors name the flag or file.
absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> ReadFeeds(
    const std::vector<std::string>& flags, const Model& model) {
  std::vector<std::pair<std::string, Tensor>> feeds;
  for (const std::string& flag : flags) {
    CASTOR_ASSIGN_OR_RETURN(auto name_and_file, ParseInputFlag(flag));
    const auto& [name, file] = name_and_file;
    CASTOR_ASSIGN_OR_RETURN(Tensor tensor, training::LoadTensorFile(file));
    const Value* input = model.graph->FindValue(name);
    if (input != nullptr && input->is_graph_input()) {
      tensor = AdaptToInput(std::move(tensor), input->dtype());
    }
    feeds.emplace_back(name, std::move(tensor));
  }
  return feeds;
}

absl::Status WriteOutputs(const std::string& dir, const Model& model,
                          const std::vector<Tensor>& outputs) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create --output-dir ", dir, ": ", error.message()));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string path =
        (std::filesystem::path(dir) / (OutputFileName(model.graph->outputs()[i]->name()) + ".npy"))
            .string();
    CASTOR_RETURN_IF_ERROR(training::WriteNpy(path, outputs[i]));
  }
  return absl::OkStatus();
}

ArgParser MakeParser(RunOptions& options) {
  ArgParser parser(
      "castor run",
      "Runs inference with MODEL on the CPU backend. Each graph input without a default\n"
      "is given with --input NAME=FILE, where FILE is a NumPy .npy file or an ONNX\n"
      "TensorProto .pb file; inputs with a default (an initializer) may be overridden the\n"
      "same way. Prints one line per graph output (name, dtype, shape, min/max/mean) and\n"
      "the plan's memory statistics. With --output-dir, writes each output to\n"
      "DIR/<output name>.npy (characters outside [A-Za-z0-9._-] become '_').\n"
      "\n"
      "dtypes: .npy files may hold float32, float16, float64, int64/32/16/8, uint8/16/32/64\n"
      "and bool. NumPy has no bfloat16: bfloat16 outputs are written as float32 ('<f4',\n"
      "exact), and a float32 file given for a bfloat16 input is rounded to bfloat16.\n"
      "\n"
      "exit codes: 0 ran; 1 the model cannot run (a missing kernel, a kernel error);\n"
      "2 bad input (model file, missing/unknown input, wrong dtype or shape, bad flag).");
  parser.AddPositional("MODEL", "the ONNX model file", &options.model_path)
      .AddRepeated("input", "NAME=FILE", "feed graph input NAME from FILE (.npy or .pb)",
                   &options.inputs)
      .AddString("output-dir", "DIR", "write each graph output to DIR/<name>.npy",
                 &options.output_dir)
      .AddInt("threads", "N", "CPU threads (0: all hardware threads)", &options.threads)
      .AddExample("castor run models/mlp_opset17.onnx --input input=x.npy")
      .AddExample(
          "castor run model.onnx --input x=test_data_set_0/input_0.pb --output-dir out "
          "--threads 4");
  return parser;
}

}  // namespace

std::string SummarizeTensor(const std::string& name, const Tensor& tensor) {
  std::string line = absl::StrCat(name, "  ", DTypeName(tensor.dtype()), "[",
                                  absl::StrJoin(tensor.dims(), ","), "]");
  double min = std::numeric_limits<double>::infinity(), max = -min, sum = 0;
  int64_t nans = 0;
  for (int64_t i = 0; i < tensor.num_elements(); ++i) {
    const double v = tensor.GetDouble(i);
    if (std::isnan(v)) {
      ++nans;
      continue;
    }
    min = std::min(min, v);
    max = std::max(max, v);
    sum += v;
  }
  const int64_t counted = tensor.num_elements() - nans;
  if (counted == 0) {
    absl::StrAppend(&line, "  (no numbers)");
  } else {
    absl::StrAppend(&line, "  min=", FormatNumber(min), " max=", FormatNumber(max),
                    " mean=", FormatNumber(sum / static_cast<double>(counted)));
  }
  if (nans > 0) absl::StrAppend(&line, " nan=", nans);
  return line;
}

absl::StatusOr<std::pair<std::string, std::string>> ParseInputFlag(const std::string& flag) {
  const size_t eq = flag.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == flag.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--input '", flag, "': expected NAME=FILE (e.g. --input x=x.npy)"));
  }
  return std::make_pair(flag.substr(0, eq), flag.substr(eq + 1));
}

std::string OutputFileName(const std::string& value_name) {
  std::string name = value_name;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  }
  if (name.empty() || name == "." || name == "..") name = absl::StrCat("_", name);
  return name;
}

int RunRun(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  RunOptions options;
  ArgParser parser = MakeParser(options);
  const Command command(parser, out, err);
  if (std::optional<int> done = command.Parse(args)) return *done;
  if (absl::Status s = CheckCpuThreadsFlag(options.threads); !s.ok()) {
    return command.Fail(kExitBadInput, s);
  }
  if (absl::StatusOr<int64_t> limit = DefaultCpuMemoryLimit(); !limit.ok()) {
    return command.Fail(kExitBadInput, limit.status());
  }
  absl::StatusOr<Model> model = LoadAndCheckModel(options.model_path);
  if (!model.ok()) return command.Fail(kExitBadInput, model.status());
  // LSTM/GRU/RNN run as the primitive ops they unroll into.
  if (absl::Status s = UnrollRecurrentIfAny(*model); !s.ok()) {
    return command.Fail(absl::IsInternal(s) ? kExitFailure : kExitBadInput,
                        NameFile(s, options.model_path));
  }
  auto feeds = ReadFeeds(options.inputs, *model);
  if (!feeds.ok()) return command.Fail(kExitBadInput, feeds.status());

  CpuBackend backend(CpuBackendOptions{static_cast<int>(options.threads)});
  auto executor = Executor::Create(*model, backend);
  if (!executor.ok()) return command.Fail(kExitFailure, executor.status());
  if (absl::Status s = (*executor)->CheckFeeds(*feeds); !s.ok()) return command.Fail(kExitBadInput, s);
  absl::StatusOr<std::vector<Tensor>> outputs = (*executor)->Run(*feeds);
  if (!outputs.ok()) return command.Fail(kExitFailure, outputs.status());

  for (size_t i = 0; i < outputs->size(); ++i) {
    out << SummarizeTensor(model->graph->outputs()[i]->name(), (*outputs)[i]) << "\n";
  }
  out << "plan: " << DescribePlanStats((*executor)->last_stats()) << "\n";
  if (!options.output_dir.empty()) {
    if (absl::Status s = WriteOutputs(options.output_dir, *model, *outputs); !s.ok()) {
      return command.Fail(kExitBadInput, s);
    }
  }
  return kExitOk;
}

}  // namespace castor::tools
