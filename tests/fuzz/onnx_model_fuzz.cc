// Fuzz target: the ONNX model reader (graph/onnx_io.h LoadModel), bytes ->
// loaded Model, external data included.
//
// The model is written to <scratch>/model/model.onnx. Beside it lies
// weights.bin (4 KiB, byte i = i % 251) that external data may read; one
// level up lies secret.bin, reachable through the symlink model/up -> ..
// and through "../secret.bin". Invariant: no loaded initializer ever holds
// the secret's bytes (external data is confined to the model's directory,
// symlinks followed), unless the model's own bytes hold them: libFuzzer
// learns the secret from the comparisons below and writes it into inputs
// as raw initializer data. A loaded model must also export.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "graph/graph.h"
#include "graph/onnx_io.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr char kSecret[] = "castor-fuzz-secret: never inside a model";

struct ModelDir {
  std::string dir;
  ModelDir() {
    using castor::fuzz::ScratchDir;
    dir = ScratchDir() + "/model";
    std::filesystem::create_directories(dir);
    std::string weights(4096, '\0');
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<char>(i % 251);
    castor::fuzz::WriteScratchFile("model/weights.bin", weights);
    std::string secret;
    while (secret.size() < 4096) secret += kSecret;
    castor::fuzz::WriteScratchFile("secret.bin", secret);
    std::error_code ignored;
    std::filesystem::create_directory_symlink("..", dir + "/up", ignored);
  }
};

// The first 16 consecutive bytes of the secret (an offset may cut into it)
// that `tensor` holds; empty when none.
std::string_view SecretIn(const castor::Tensor& tensor) {
  const size_t n = std::strlen(kSecret);
  const std::string_view bytes(reinterpret_cast<const char*>(tensor.raw()), tensor.byte_size());
  for (size_t start = 0; start + 16 <= n; ++start) {
    const std::string_view window(kSecret + start, 16);
    if (bytes.find(window) != std::string_view::npos) return window;
  }
  return {};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ModelDir model_dir;
  const std::string path =
      castor::fuzz::WriteScratchFile("model/model.onnx", castor::fuzz::AsBytes(data, size));
  absl::StatusOr<castor::Model> model = castor::LoadModel(path);
  if (!model.ok()) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  for (const castor::Value* value : model->graph->initializers()) {
    if (value->initializer() == nullptr || value->initializer()->dtype() == castor::DType::kString) {
      continue;
    }
    const std::string_view window = SecretIn(*value->initializer());
    if (!window.empty() && input.find(window) == std::string_view::npos) {
      castor::fuzz::Finding("initializer '" + value->name() +
                            "' holds bytes of a file outside the model's directory");
    }
  }
  (void)castor::ExportModel(*model);
  return 0;
}
