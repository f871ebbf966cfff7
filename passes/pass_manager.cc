// PassManager and PassDumper (see pass_manager.h).
#include "passes/pass_manager.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "passes/graph_text.h"

namespace castor {

absl::Status PassDumper::Dump(const Model& model, const std::string& stage,
                              const std::string& header) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(dir_, error);
  const fs::path path = fs::path(dir_) / absl::StrFormat("%02d-%s.txt", next_, stage);
  std::ofstream file(path, std::ios::binary);
  file << "# " << header << "\n" << GraphToText(model);
  file.close();
  if (!file) return absl::UnavailableError(absl::StrCat("cannot write the pass dump ", path.string()));
  ++next_;
  return absl::OkStatus();
}

PassManager& PassManager::Add(std::unique_ptr<Pass> pass) {
  passes_.push_back(std::move(pass));
  return *this;
}

absl::Status PassManager::Run(Model& model, PassContext& context) {
  if (options_.dumper != nullptr && options_.dump_input) {
    if (absl::Status s = options_.dumper->Dump(model, "input", "the graph before the first pass");
        !s.ok()) {
      return s;
    }
  }
  for (const std::unique_ptr<Pass>& pass : passes_) {
    if (absl::Status s = pass->Run(model, context); !s.ok()) return s;
    if (options_.verify) {
      VerifyOptions rules;
      rules.rules = pass->rules_after();
      if (absl::Status s = VerifyModel(model, rules); !s.ok()) {
        return absl::InternalError(absl::StrCat("internal error: after the '", pass->name(),
                                                "' pass, ", s.message()));
      }
    }
    if (options_.dumper != nullptr) {
      if (absl::Status s = options_.dumper->Dump(
              model, pass->name(), absl::StrCat("after ", pass->name(), ": ", pass->description()));
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace castor
