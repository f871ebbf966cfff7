// `castor conformance` (see conformance_command.h): case discovery, the
// per-case run, the ONNX-runner comparison, expected failures and the report.
#include "tools/conformance_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_backend.h"
#include "backend/executor.h"
#include "graph/onnx_io.h"
#include "graph/status.h"
#include "graph/user_regex.h"
#include "passes/model_loader.h"
#include "passes/unroll_recurrent.h"
#include "tools/args.h"
#include "tools/cli.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;

std::string FormatNumber(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.9g", value);
  return buffer;
}

std::string DimsText(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

// The multi-dimensional index of flat element `flat`.
std::string IndexText(const std::vector<int64_t>& dims, int64_t flat) {
  std::vector<int64_t> index(dims.size());
  for (size_t d = dims.size(); d-- > 0;) {
    index[d] = dims[d] > 0 ? flat % dims[d] : 0;
    flat = dims[d] > 0 ? flat / dims[d] : 0;
  }
  return DimsText(index);
}

absl::Status Mismatch(const std::string& message) { return absl::FailedPreconditionError(message); }

// Integers and bool: element bytes must be equal.
absl::Status CompareExactly(const Tensor& expected, const Tensor& actual) {
  const size_t size = DTypeSize(expected.dtype());
  int64_t differing = 0, first = -1;
  for (int64_t i = 0; i < expected.num_elements(); ++i) {
    if (std::memcmp(expected.raw() + i * size, actual.raw() + i * size, size) != 0) {
      if (first < 0) first = i;
      ++differing;
    }
  }
  if (differing == 0) return absl::OkStatus();
  return Mismatch(absl::StrCat(differing, " of ", expected.num_elements(),
                               " elements differ (exact compare); first at ",
                               IndexText(expected.dims(), first), ": expected ",
                               expected.GetInt64(first), ", got ", actual.GetInt64(first)));
}

// Floats: NaN placement, infinities, then |a - e| <= atol + rtol * |e|.
absl::Status CompareClose(const Tensor& expected, const Tensor& actual, const Tolerance& tol) {
  int64_t differing = 0, first = -1, first_nan = -1;
  double max_abs = 0, max_rel = 0;
  for (int64_t i = 0; i < expected.num_elements(); ++i) {
    const double e = expected.GetDouble(i), a = actual.GetDouble(i);
    if (std::isnan(e) || std::isnan(a)) {
      if (std::isnan(e) != std::isnan(a) && first_nan < 0) first_nan = i;
      continue;
    }
    if (std::isinf(e) || std::isinf(a)) {  // infinities must match exactly
      if (e != a) {
        if (first < 0) first = i;
        ++differing;
      }
      continue;
    }
    const double abs_error = std::fabs(a - e);
    max_abs = std::max(max_abs, abs_error);
    if (e != 0) max_rel = std::max(max_rel, abs_error / std::fabs(e));
    if (abs_error > tol.atol + tol.rtol * std::fabs(e)) {
      if (first < 0) first = i;
      ++differing;
    }
  }
  auto element = [&](int64_t i) {
    return absl::StrCat(IndexText(expected.dims(), i), ": expected ",
                        FormatNumber(expected.GetDouble(i)), ", got ",
                        FormatNumber(actual.GetDouble(i)));
  };
  if (first_nan >= 0)
    return Mismatch(absl::StrCat("NaN placement differs; first at ", element(first_nan)));
  if (differing == 0) return absl::OkStatus();
  return Mismatch(absl::StrCat(
      differing, " of ", expected.num_elements(), " elements differ (rtol=", FormatNumber(tol.rtol),
      ", atol=", FormatNumber(tol.atol), "); first at ", element(first), "; max abs error ",
      FormatNumber(max_abs), ", max rel error ", FormatNumber(max_rel)));
}

// "input_0.pb", "input_1.pb", ... until one is missing.
std::vector<std::string> NumberedFiles(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> files;
  for (int k = 0;; ++k) {
    fs::path path = dir / absl::StrCat(prefix, k, ".pb");
    if (!fs::exists(path)) return files;
    files.push_back(path.string());
  }
}

std::vector<fs::path> DataSets(const fs::path& case_dir) {
  std::vector<fs::path> sets;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(case_dir, error)) {
    if (entry.is_directory() && entry.path().filename().string().rfind("test_data_set_", 0) == 0) {
      sets.push_back(entry.path());
    }
  }
  std::sort(sets.begin(), sets.end());
  return sets;
}

// Runs one data set; OK or the reason it fails.
absl::Status RunDataSet(const Model& model, Executor& executor, const fs::path& dir) {
  std::vector<const Value*> inputs;
  for (const Value* v : model.graph->inputs()) {
    if (v->initializer() == nullptr) inputs.push_back(v);
  }
  const std::vector<std::string> input_files = NumberedFiles(dir, "input_");
  if (input_files.size() != inputs.size()) {
    return Mismatch(absl::StrCat(input_files.size(), " input files for ", inputs.size(),
                                 " graph inputs without initializer"));
  }
  std::vector<std::pair<std::string, Tensor>> feeds;
  for (size_t k = 0; k < inputs.size(); ++k) {
    CASTOR_ASSIGN_OR_RETURN(Tensor t, LoadTensorProtoFile(input_files[k]));
    feeds.emplace_back(inputs[k]->name(), std::move(t));
  }
  absl::StatusOr<std::vector<Tensor>> outputs = executor.Run(feeds);
  if (!outputs.ok()) return Mismatch(absl::StrCat("run error: ", outputs.status().message()));
  const std::vector<std::string> output_files = NumberedFiles(dir, "output_");
  if (output_files.size() != outputs->size()) {
    return Mismatch(
        absl::StrCat(output_files.size(), " expected outputs, the graph has ", outputs->size()));
  }
  for (size_t k = 0; k < outputs->size(); ++k) {
    CASTOR_ASSIGN_OR_RETURN(Tensor expected, LoadTensorProtoFile(output_files[k]));
    absl::Status s = CompareTensors(expected, (*outputs)[k]);
    if (!s.ok()) {
      return Mismatch(absl::StrCat("output ", k, " ('", model.graph->outputs()[k]->name(),
                                   "'): ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::string Trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r") - begin + 1);
}

struct ConformanceOptions {
  std::string dir;
  std::string expected_failures_path;
  std::string filter;
  bool verbose = false;
  int64_t threads = 0;
  std::string backend = "cpu";
};

ArgParser MakeParser(ConformanceOptions& options) {
  ArgParser parser(
      "castor conformance",
      "Runs every ONNX backend node test case in DIR on a backend: each case is a\n"
      "folder with model.onnx and test_data_set_*/input_K.pb, output_K.pb. Inputs bind to\n"
      "the graph inputs without an initializer, in order; outputs to the graph outputs.\n"
      "Outputs are compared as ONNX's backend test runner does: dtype and shape exactly,\n"
      "then assert_allclose(rtol=1e-3, atol=1e-7) with NaNs in the same places; bool and\n"
      "integers exactly. Prints `FAIL <case>: <reason>` per unexpected failure and a\n"
      "final `N passed, M failed (K expected failures)` line.\n"
      "\n"
      "The expected-failures file has one `case_name  # reason` per line ('#' starts a\n"
      "comment; blank lines are skipped). Listing a case that is not in DIR is an error,\n"
      "and a listed case that passes is reported as unexpectedly passed.\n"
      "\n"
      "exit codes: 0 every failure is listed and no listed case passed; 1 otherwise;\n"
      "2 bad DIR, expected-failures file, or flag (or --backend cuda without a usable GPU).");
  parser.AddPositional("DIR", "the folder of test cases", &options.dir)
      .AddString("expected-failures", "FILE", "cases allowed to fail, one per line with a reason",
                 &options.expected_failures_path)
      .AddString("filter", "REGEX", "run only cases whose name contains a match of REGEX",
                 &options.filter)
      .AddSwitch("verbose", "also print PASS and expected-failure (XFAIL) lines", &options.verbose)
      .AddInt("threads", "N", "CPU threads (0: all hardware threads)", &options.threads)
      .AddEnum("backend", {"cpu", "cuda"},
               "the backend that runs the cases; on cuda, cases of ops without a CUDA kernel "
               "fail as 'missing kernel' and are counted apart",
               &options.backend)
      .AddExample("castor conformance ../shared/conformance/onnx-node")
      .AddExample(
          "castor conformance ../shared/conformance/onnx-node --filter '^test_conv' "
          "--verbose")
      .AddExample(
          "castor conformance DIR --expected-failures "
          "tests/conformance_expected_failures.txt");
  return parser;
}

absl::StatusOr<std::vector<std::string>> CaseNames(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": not a directory of test cases"));
  }
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (entry.is_directory() && fs::exists(entry.path() / "model.onnx")) {
      names.push_back(entry.path().filename().string());
    }
  }
  if (names.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": no test cases (folders with a model.onnx)"));
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::map<std::string, std::string>> LoadExpectedFailures(
    const std::string& path, const std::vector<std::string>& cases) {
  if (path.empty()) return std::map<std::string, std::string>{};
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--expected-failures ", path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  CASTOR_ASSIGN_OR_RETURN(auto expected, ParseExpectedFailures(text.str(), path));
  for (const auto& [name, reason] : expected) {
    if (!std::binary_search(cases.begin(), cases.end(), name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": lists '", name, "', which is not a test case in the folder"));
    }
  }
  return expected;
}

struct Tally {
  int passed = 0, failed = 0, expected_failed = 0, unexpected_passes = 0;
  int missing_kernel = 0;  // failures because the backend has no kernel for an op
};

void Report(const CaseResult& result, const std::map<std::string, std::string>& expected,
            const std::string& expected_path, bool verbose, Tally& tally, std::ostream& out) {
  auto listed = expected.find(result.name);
  if (result.passed) {
    ++tally.passed;
    if (listed != expected.end()) {
      ++tally.unexpected_passes;
      out << "UNEXPECTED PASS " << result.name << ": listed in " << expected_path << " as failing ("
          << listed->second << "); remove it from the list\n";
    } else if (verbose) {
      out << "PASS " << result.name << "\n";
    }
    return;
  }
  ++tally.failed;
  if (listed != expected.end()) {
    ++tally.expected_failed;
    if (verbose) out << "XFAIL " << result.name << ": " << result.reason << "\n";
    return;
  }
  out << "FAIL " << result.name << ": " << result.reason << "\n";
}

}  // namespace

absl::Status CompareTensors(const Tensor& expected, const Tensor& actual,
                            const Tolerance& tolerance) {
  if (expected.dtype() != actual.dtype()) {
    return Mismatch(absl::StrCat("dtype ", DTypeName(expected.dtype()), " expected, got ",
                                 DTypeName(actual.dtype())));
  }
  if (expected.dims() != actual.dims()) {
    return Mismatch(absl::StrCat("shape ", DimsText(expected.dims()), " expected, got ",
                                 DimsText(actual.dims())));
  }
  if (expected.dtype() == DType::kString) {
    return expected.strings() == actual.strings() ? absl::OkStatus()
                                                  : Mismatch("string elements differ");
  }
  if (IsFloatingPoint(expected.dtype())) return CompareClose(expected, actual, tolerance);
  return CompareExactly(expected, actual);
}

absl::StatusOr<std::map<std::string, std::string>> ParseExpectedFailures(
    const std::string& text, const std::string& source) {
  std::map<std::string, std::string> expected;
  std::stringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    const size_t hash = line.find('#');
    const std::string name = Trim(line.substr(0, hash));
    if (name.empty()) continue;  // blank or comment
    const std::string where = absl::StrCat(source, ":", number, ": ");
    if (name.find_first_of(" \t") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "'", name, "' is not one case name (one case per line)"));
    }
    const std::string reason = hash == std::string::npos ? "" : Trim(line.substr(hash + 1));
    if (reason.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "'", name, "' needs a reason: '", name, "  # why it fails'"));
    }
    if (!expected.emplace(name, reason).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, "'", name, "' is listed twice"));
    }
  }
  return expected;
}

constexpr const char* kMissingKernel = "missing kernel: ";

CaseResult RunConformanceCase(const std::string& case_dir, Backend& backend) {
  CaseResult result;
  result.name = fs::path(case_dir).filename().string();
  absl::StatusOr<Model> model = LoadAndCheckModel((fs::path(case_dir) / "model.onnx").string());
  if (!model.ok()) {
    result.reason = absl::StrCat("load error: ", model.status().message());
    return result;
  }
  if (absl::Status s = UnrollRecurrentIfAny(*model); !s.ok()) {  // LSTM/GRU/RNN
    result.reason = absl::StrCat("load error: ", s.message());
    return result;
  }
  auto executor = Executor::Create(*model, backend);
  if (!executor.ok()) {
    const bool missing = executor.status().code() == absl::StatusCode::kUnimplemented;
    result.reason =
        absl::StrCat(missing ? kMissingKernel : "plan error: ", executor.status().message());
    return result;
  }
  const std::vector<fs::path> sets = DataSets(case_dir);
  if (sets.empty()) {
    result.reason = "no test_data_set_* folder";
    return result;
  }
  for (const fs::path& set : sets) {
    absl::Status s = RunDataSet(*model, **executor, set);
    if (!s.ok()) {
      result.reason = sets.size() == 1 ? std::string(s.message())
                                       : absl::StrCat(set.filename().string(), ": ", s.message());
      return result;
    }
  }
  result.passed = true;
  return result;
}

int RunConformance(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  ConformanceOptions options;
  ArgParser parser = MakeParser(options);
  const Command command(parser, out, err);
  if (std::optional<int> done = command.Parse(args)) return *done;
  absl::StatusOr<std::regex> filter = CompileUserRegex(options.filter);
  if (!filter.ok()) {
    return command.Fail(kExitBadInput, absl::StrCat("--filter '", options.filter,
                                                    "' is not a valid regex: ",
                                                    filter.status().message()));
  }
  if (absl::Status s = CheckCpuThreadsFlag(options.threads); !s.ok()) {
    return command.Fail(kExitBadInput, s);
  }
  absl::StatusOr<std::vector<std::string>> cases = CaseNames(options.dir);
  if (!cases.ok()) return command.Fail(kExitBadInput, cases.status());
  auto expected = LoadExpectedFailures(options.expected_failures_path, *cases);
  if (!expected.ok()) return command.Fail(kExitBadInput, expected.status());

  std::unique_ptr<Backend> backend;
  if (options.backend == "cuda") {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend();
    if (!cuda.ok()) {
      return command.Fail(kExitBadInput,
                          absl::StrCat("--backend cuda: ", cuda.status().message()));
    }
    backend = *std::move(cuda);
  } else {
    backend = std::make_unique<CpuBackend>(CpuBackendOptions{static_cast<int>(options.threads)});
  }
  Tally tally;
  for (const std::string& name : *cases) {
    if (!std::regex_search(name, *filter)) continue;
    CaseResult result = RunConformanceCase((fs::path(options.dir) / name).string(), *backend);
    if (!result.passed && absl::StartsWith(result.reason, kMissingKernel)) ++tally.missing_kernel;
    Report(result, *expected, options.expected_failures_path, options.verbose, tally, out);
    out.flush();
  }
  out << tally.passed << " passed, " << tally.failed << " failed";
  if (!expected->empty()) out << " (" << tally.expected_failed << " expected failures)";
  if (tally.missing_kernel > 0) {
    out << ", " << tally.missing_kernel << " of the failures for a missing " << options.backend
        << " kernel";
  }
  if (tally.unexpected_passes > 0) out << ", " << tally.unexpected_passes << " unexpectedly passed";
  out << "\n";
  const bool clean = tally.failed == tally.expected_failed && tally.unexpected_passes == 0;
  return clean ? kExitOk : kExitFailure;
}

}  // namespace castor::tools
