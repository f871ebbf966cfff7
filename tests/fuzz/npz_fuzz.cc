// Fuzz target: the .npz reader (training/dataset.h ReadNpz: zip local and
// central headers, ZIP64 records, stored and deflated members, CRC-32) and
// the --data form built on it (LoadNpzFile: x_train/y_train, x/y,
// images/labels and their conversions).
#include <string>

#include "training/dataset.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      castor::fuzz::WriteScratchFile("data.npz", castor::fuzz::AsBytes(data, size));
  if (!castor::training::ReadNpz(path).ok()) return 0;
  (void)castor::training::LoadNpzFile(path);
  return 0;
}
