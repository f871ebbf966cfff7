// Fuzz target: what `castor convert` and `castor run` do with a model before
// any kernel runs: LoadAndCheckModel (import, opsets, supported ops, type
// inference, the verifier), then for each built-in policy the canonicalize
// and autocast passes and the verifier again, then the executor's planning
// (Executor::Create: kernel choice, liveness, resident initializers) on a
// CPU backend held to a 256 MiB budget. Nothing runs, so huge declared
// shapes cost nothing but the checks.
//
// Invariant: a model that loads and that the passes accept converts into a
// model the verifier accepts (convert calls the opposite an internal error).
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/executor.h"
#include "graph/onnx_io.h"
#include "passes/autocast.h"
#include "passes/canonicalize.h"
#include "passes/model_loader.h"
#include "passes/pass_manager.h"
#include "passes/policy.h"
#include "passes/verifier.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr int64_t kMemoryBudget = int64_t{256} << 20;

void Plan(const castor::Model& model, castor::Backend& backend) {
  (void)castor::Executor::Create(model, backend);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static castor::CpuBackend* backend =
      new castor::CpuBackend(castor::CpuBackendOptions{1, kMemoryBudget});
  const std::string path =
      castor::fuzz::WriteScratchFile("model.onnx", castor::fuzz::AsBytes(data, size));
  absl::StatusOr<castor::Model> model = castor::LoadAndCheckModel(path);
  if (!model.ok()) return 0;
  Plan(*model, *backend);

  for (const std::string& name : castor::Policy::BuiltinNames()) {
    absl::StatusOr<castor::Policy> policy = castor::Policy::Builtin(name);
    if (!policy.ok()) castor::fuzz::Finding("built-in policy " + name + " does not load");
    absl::StatusOr<castor::Model> converted = castor::CloneModel(*model);
    if (!converted.ok()) return 0;
    castor::PassManager manager;
    manager.Add(castor::MakeCanonicalizePass()).Add(castor::MakeAutocastPass(*policy));
    castor::PassContext context;
    if (!manager.Run(*converted, context).ok()) continue;
    if (absl::Status verified = castor::VerifyModel(*converted); !verified.ok()) {
      castor::fuzz::Finding("the " + name + " conversion fails the verifier: " +
                            std::string(verified.message()));
    }
    Plan(*converted, *backend);
  }
  return 0;
}
