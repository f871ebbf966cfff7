// The CUDA kernel table covers the sample models' training: every node of
// the training graph and of the evaluation graph of each sample model under
// each builtin policy has a CUDA kernel; and the same for every model of the
// zoo (tests/zoo/) in the directory CASTOR_ZOO_DIR names (ctest's
// zoo_cuda_kernel_coverage points it at the zoo that zoo_ci generated; by
// hand, at a full zoo). The table is host code, so this test runs in the
// cpu tier, without a GPU: it needs a CUDA build, not a device. In a build
// without CUDA it skips.
// That a kernel computes the right thing is the other cuda_*_test files'
// job, on a GPU. It also checks that the table comes from the CUDA backend's
// module and that a module castor cannot use is refused with the reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "passes/autocast.h"
#include "passes/model_loader.h"
#include "passes/policy.h"
#include "passes/training_graph.h"
#include "tests/cli_test_util.h"

namespace castor {
namespace {

struct Case {
  std::string model, policy;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " " << c.policy; }

class CudaKernelCoverage : public ::testing::TestWithParam<Case> {};

// The table comes from the CUDA backend's module, which a CUDA build loads
// from beside its executables, GPU or not (backend/cuda_loader.cc).
TEST(CudaKernelTable, ComesFromTheModule) {
  if (!CudaBackendCompiled()) GTEST_SKIP() << "castor was built without the CUDA backend";
  absl::StatusOr<const KernelTable*> table = CudaKernelTable();
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(*CudaKernelTable(), *table);  // one table, loaded once
  bool mapped = false;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    mapped = mapped || line.find("/libcastor_cuda.so") != std::string::npos;
  }
  EXPECT_TRUE(mapped) << "libcastor_cuda.so is not mapped after CudaKernelTable()";
}

#if defined(CASTOR_BUILD_ID)
// Runs this test binary, copied into `dir` beside `module_bytes` as
// libcastor_cuda.so, on CudaKernelTable.ComesFromTheModule.
tools::Program RunBesideModule(const std::filesystem::path& dir, const std::string& module_bytes) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::filesystem::read_symlink("/proc/self/exe"), dir / "test");
  std::ofstream(dir / "libcastor_cuda.so", std::ios::binary) << module_bytes;
  tools::Program run = tools::RunCastor(dir, "--gtest_filter=CudaKernelTable.ComesFromTheModule",
                                        (dir / "test").string());
  std::filesystem::remove_all(dir);
  return run;
}

// A module castor cannot use is refused with the reason: a file that is no
// library, and this build's module with another build directory's id.
TEST(CudaKernelTable, RefusesAModuleItCannotUse) {
  const std::filesystem::path here = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  std::string bytes = tools::ReadFile(here / "libcastor_cuda.so");
  ASSERT_FALSE(bytes.empty());
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("castor_module_test_" + std::to_string(getpid()));

  tools::Program run = RunBesideModule(dir, "not a shared library");
  EXPECT_NE(run.exit_code, 0) << run.out;
  EXPECT_NE(
      run.out.find("cannot load the CUDA backend module " + (dir / "libcastor_cuda.so").string()),
      std::string::npos)
      << run.out;

  const std::string id = CASTOR_BUILD_ID;
  const size_t at = bytes.find(id);
  ASSERT_NE(at, std::string::npos) << "the module does not carry this build's id";
  const std::string other(id.size(), id[0] == 'a' ? 'b' : 'a');
  bytes.replace(at, id.size(), other);
  run = RunBesideModule(dir, bytes);
  EXPECT_NE(run.exit_code, 0) << run.out;
  EXPECT_NE(run.out.find("is from another build (castor "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find(", build " + other + "; this is castor "), std::string::npos) << run.out;
}
#endif

// The nodes of `model`'s training graph under `policy` (autocast, then the
// training rewrites, as `castor train` runs them) and of its evaluation
// graph that the CUDA table has no kernel for, one error line each; fills
// `*nodes` with the count of nodes looked up.
absl::StatusOr<std::vector<std::string>> NodesWithoutCudaKernel(const KernelTable& table,
                                                                Model model,
                                                                const std::string& policy,
                                                                int* nodes) {
  if (policy != "float32") {
    AutocastOptions autocast;
    autocast.training_graph_ops = true;  // as castor train: com.castor Conv in bfloat16
    absl::StatusOr<AutocastReport> report =
        RunAutocast(model, *Policy::Builtin(policy), autocast);
    if (!report.ok()) return report.status();
  }
  absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(model, TrainingGraphOptions{});
  if (!graph.ok()) return graph.status();
  std::vector<std::string> missing;
  *nodes = 0;
  for (const Model* m : std::vector<const Model*>{&model, graph->evaluation.get()}) {
    for (const Node* node : m->graph->nodes()) {
      ++*nodes;
      absl::StatusOr<const KernelDef*> kernel = table.Find(*node);
      if (!kernel.ok()) missing.push_back(std::string(kernel.status().message()));
    }
  }
  return missing;
}

TEST_P(CudaKernelCoverage, EveryTrainingNodeHasACudaKernel) {
  if (!CudaBackendCompiled()) GTEST_SKIP() << "castor was built without the CUDA backend";
  // A CUDA build must load its module here, GPU or not.
  absl::StatusOr<const KernelTable*> table = CudaKernelTable();
  ASSERT_TRUE(table.ok()) << table.status();
  const Case& c = GetParam();
  absl::StatusOr<Model> model =
      LoadModel(std::string(CASTOR_SOURCE_DIR) + "/models/" + c.model + ".onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(InferTypes(*model).ok());
  int nodes = 0;
  absl::StatusOr<std::vector<std::string>> missing =
      NodesWithoutCudaKernel(**table, *std::move(model), c.policy, &nodes);
  ASSERT_TRUE(missing.ok()) << missing.status();
  for (const std::string& line : *missing) ADD_FAILURE() << line;
  EXPECT_GT(nodes, 10);
}

// The zoo's models that tests/zoo/expected_failures.txt lists ("name:
// reason" lines): some cannot train on the CPU either (an unsupported op),
// others only miss a tolerance of the harness. A listed model whose training
// graph cannot be built is reported, not failed; every model that builds is
// checked.
std::vector<std::string> ZooExpectedFailures() {
  std::vector<std::string> names;
  std::ifstream in(std::string(CASTOR_SOURCE_DIR) + "/tests/zoo/expected_failures.txt");
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (line.empty() || line[0] == '#' || colon == std::string::npos) continue;
    names.push_back(line.substr(0, colon));
  }
  return names;
}

TEST(CudaKernelCoverageZoo, EveryTrainingNodeOfEveryZooModelHasACudaKernel) {
  if (!CudaBackendCompiled()) GTEST_SKIP() << "castor was built without the CUDA backend";
  const char* zoo = std::getenv("CASTOR_ZOO_DIR");
  if (zoo == nullptr || *zoo == '\0') {
    GTEST_SKIP() << "CASTOR_ZOO_DIR is not set (ctest's zoo_cuda_kernel_coverage sets it)";
  }
  absl::StatusOr<const KernelTable*> table = CudaKernelTable();
  ASSERT_TRUE(table.ok()) << table.status();
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator(zoo)) {
    if (entry.path().extension() == ".onnx") paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) GTEST_SKIP() << "no .onnx model in " << zoo << " (zoo_ci did not generate)";
  const std::vector<std::string> expected_failures = ZooExpectedFailures();
  int checked = 0;
  for (const std::filesystem::path& path : paths) {
    const std::string name = path.stem().string();
    const bool listed = std::find(expected_failures.begin(), expected_failures.end(), name) !=
                        expected_failures.end();
    absl::StatusOr<Model> model = LoadAndCheckModel(path.string());
    if (!model.ok() && listed) {
      std::cout << name << ": an expected failure (tests/zoo/expected_failures.txt): "
                << model.status().message() << "\n";
      continue;
    }
    ASSERT_TRUE(model.ok()) << model.status();
    PassManager import;  // as castor train imports it (LSTM/GRU unrolled)
    AddImportPasses(import);
    PassContext context;
    ASSERT_TRUE(import.Run(*model, context).ok()) << name;
    for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
      absl::StatusOr<Model> copy = CloneModel(*model);
      ASSERT_TRUE(copy.ok()) << copy.status();
      ASSERT_TRUE(InferTypes(*copy).ok()) << name;
      int nodes = 0;
      absl::StatusOr<std::vector<std::string>> missing =
          NodesWithoutCudaKernel(**table, *std::move(copy), policy, &nodes);
      if (!missing.ok() && listed) {
        std::cout << name << " " << policy << ": an expected failure: "
                  << missing.status().message() << "\n";
        continue;
      }
      ASSERT_TRUE(missing.ok()) << name << " " << policy << ": " << missing.status();
      for (const std::string& line : *missing) ADD_FAILURE() << name << " " << policy << ": " << line;
      std::cout << name << " " << policy << ": " << nodes << " nodes, " << missing->size()
                << " without a CUDA kernel\n";
    }
    ++checked;
  }
  EXPECT_GT(checked, 0) << "every model in " << zoo << " is an expected failure";
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const char* model : {"mlp", "cnn", "resnet", "transformer"}) {
    for (const char* opset : {"_opset13", "_opset17"}) {
      for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
        cases.push_back({std::string(model) + opset, policy});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(SampleModels, CudaKernelCoverage, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.model + "_" + info.param.policy;
                         });

}  // namespace
}  // namespace castor
