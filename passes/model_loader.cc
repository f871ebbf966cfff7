// Reading a user's ONNX model (see model_loader.h).
#include "passes/model_loader.h"

#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "passes/canonicalize.h"
#include "passes/unroll_recurrent.h"
#include "passes/verifier.h"

namespace castor {

absl::Status NameFile(const absl::Status& status, const std::string& path) {
  if (status.ok() || absl::StrContains(status.message(), path)) return status;
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

PassManager& AddImportPasses(PassManager& manager) {
  return manager.Add(MakeUnrollRecurrentPass()).Add(MakeCanonicalizePass());
}

absl::StatusOr<Model> LoadAndCheckModel(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a directory, not an ONNX model file"));
  }
  absl::StatusOr<Model> loaded = LoadModel(path);
  if (!loaded.ok()) return NameFile(loaded.status(), path);
  Model model = std::move(loaded).value();

  if (absl::Status s = CheckOpsets(model); !s.ok()) return NameFile(s, path);
  // Every unsupported op at once, so one run tells the whole story.
  if (std::vector<std::string> unsupported = UnsupportedOps(model); !unsupported.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        path, ": ", unsupported.size(), " unsupported op type", unsupported.size() == 1 ? "" : "s",
        ": ", absl::StrJoin(unsupported, "; ")));
  }
  if (absl::Status s = InferTypes(model); !s.ok()) return NameFile(s, path);
  // The rules every valid graph meets; an exporter's style (a no-op Cast)
  // is no reason to refuse a model (the canonicalize pass folds it).
  VerifyOptions rules;
  rules.rules = VerifyRules::kValid;
  if (absl::Status s = VerifyModel(model, rules); !s.ok()) return NameFile(s, path);
  return model;
}

}  // namespace castor
