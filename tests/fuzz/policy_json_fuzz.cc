// Fuzz target: the policy JSON parser (graph/json.h Json::Parse, then
// passes/policy.h Policy::FromJson, as `castor convert --policy-file` and
// the checkpoint reader use them).
//
// Invariants: parsed JSON dumps and parses back to itself; a policy that
// loads saves as JSON that loads back to the same policy (same digest).
#include <string>

#include "graph/json.h"
#include "passes/policy.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(castor::fuzz::AsBytes(data, size));
  absl::StatusOr<castor::Json> json = castor::Json::Parse(text);
  if (!json.ok()) return 0;
  absl::StatusOr<castor::Json> again = castor::Json::Parse(json->Dump());
  if (!again.ok() || !(*again == *json)) {
    castor::fuzz::Finding("parsed JSON does not parse back to itself after Dump()");
  }
  absl::StatusOr<castor::Policy> policy = castor::Policy::FromJson(*json, "fuzz.json");
  if (!policy.ok()) return 0;
  absl::StatusOr<castor::Policy> reloaded = castor::Policy::FromJson(policy->ToJson(), "saved");
  if (!reloaded.ok()) {
    castor::fuzz::Finding("a loaded policy's own JSON does not load: " +
                          std::string(reloaded.status().message()));
  }
  if (reloaded->Digest() != policy->Digest()) {
    castor::fuzz::Finding("a loaded policy's own JSON loads as a different policy");
  }
  return 0;
}
