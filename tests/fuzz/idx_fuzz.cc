// Fuzz target: the IDX readers (training/dataset.h ReadIdxImages,
// ReadIdxLabels), plain and gzip-compressed (chosen by the gzip magic), and
// the FILES-list reader that tells .npy from IDX (ReadArrayFile).
#include <string>

#include "training/dataset.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      castor::fuzz::WriteScratchFile("data-idx-ubyte", castor::fuzz::AsBytes(data, size));
  (void)castor::training::ReadIdxImages(path);
  (void)castor::training::ReadIdxLabels(path);
  (void)castor::training::ReadArrayFile(path, /*as_labels=*/true);
  return 0;
}
