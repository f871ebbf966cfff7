// Fuzz target: the .npy reader (training/npy.h ParseNpy) and the array
// conversions `castor train` applies to what it read (ImagesFromArray,
// LabelsFromArray).
//
// Invariant: a tensor that parses serializes, and parses back to itself.
#include <string>

#include "training/dataset.h"
#include "training/npy.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<castor::Tensor> tensor =
      castor::training::ParseNpy(castor::fuzz::AsBytes(data, size), "fuzz.npy");
  if (!tensor.ok()) return 0;
  absl::StatusOr<std::string> bytes = castor::training::SerializeNpy(*tensor);
  if (!bytes.ok()) castor::fuzz::Finding("a parsed .npy does not serialize: " + bytes.status().ToString());
  absl::StatusOr<castor::Tensor> again = castor::training::ParseNpy(*bytes, "fuzz.npy (written)");
  if (!again.ok() || !(*again == *tensor)) {
    castor::fuzz::Finding("a parsed .npy does not read back as itself after SerializeNpy");
  }
  (void)castor::training::ImagesFromArray(*tensor, "fuzz.npy");
  (void)castor::training::LabelsFromArray(*tensor, "fuzz.npy");
  return 0;
}
