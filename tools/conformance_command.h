// `castor conformance DIR`: runs ONNX backend node test cases
// (DIR/<case>/model.onnx + test_data_set_*/input_K.pb, output_K.pb) on the
// CPU backend, or the CUDA one with --backend cuda (where a case whose op has
// no CUDA kernel fails as a missing kernel, counted apart), and compares the
// outputs the way ONNX's backend test runner does (onnx/backend/test/runner): dtype and shape exactly, then
// np.testing.assert_allclose(rtol=1e-3, atol=1e-7) semantics — NaNs must sit
// in the same places, infinities must match, bool and integers compare
// exactly. Inputs bind to the graph inputs that have no initializer, in
// order; outputs bind to the graph outputs in order.
//
// An expected-failures file lists cases that cannot pass (one
// `case_name  # reason` per line); the run exits 0 only when every failure
// is listed, and a listed case that passes (or is not in DIR) is an error,
// so the list stays honest.
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "graph/tensor.h"

namespace castor::tools {

struct Tolerance {
  double rtol = 1e-3;
  double atol = 1e-7;
};

// OK when `actual` matches `expected`; otherwise a FailedPrecondition whose
// message says why: the dtype or shape, or the number of differing elements,
// the first one (index, expected, actual) and the max abs/rel error.
absl::Status CompareTensors(const Tensor& expected, const Tensor& actual,
                            const Tolerance& tolerance = {});

// Parses an expected-failures file: case name -> reason. Blank lines and
// lines starting with '#' are skipped; every entry needs a `# reason`.
// Errors name `source` and the line.
absl::StatusOr<std::map<std::string, std::string>> ParseExpectedFailures(const std::string& text,
                                                                         const std::string& source);

struct CaseResult {
  std::string name;
  bool passed = false;
  std::string reason;  // why it failed
};

// Runs one case directory (every test_data_set_*) on `backend`.
CaseResult RunConformanceCase(const std::string& case_dir, Backend& backend);

int RunConformance(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace castor::tools
