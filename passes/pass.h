// A whole-graph pass that describes itself (DESIGN.md, "Core abstractions":
// `name()`, `description()`, `Run`). The pass manager (pass_manager.h) runs
// a list of them, verifies the graph after each and can dump it.
//
// A pass takes what it needs and fills what it reports through the object
// that made it (MakeAutocastPass(policy, options, &report), ...), so the
// context below holds only what every pass may add to: notes for the user.
//
// Run works on the Model (not only its Graph): passes read the opset
// imports and write model metadata (autocast records its policy there).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "graph/graph.h"
#include "passes/verifier.h"

namespace castor {

struct PassContext {
  // Things the user should know, one line each, prefixed by the pass name
  // ("canonicalize: folded 2 no-op Casts").
  std::vector<std::string> notes;
};

class Pass {
 public:
  virtual ~Pass() = default;
  // Short, kebab-case: "canonicalize", "autocast", "autodiff"; it names the
  // dump file and the pass in errors.
  virtual std::string name() const = 0;
  // One sentence: what the pass does to the graph.
  virtual std::string description() const = 0;
  virtual absl::Status Run(Model& model, PassContext& context) = 0;
  // The verifier rules the graph meets after this pass: castor's own
  // passes produce graphs that meet the strict ones (the default); a pass
  // over an imported model promises only what every valid graph meets.
  virtual VerifyRules rules_after() const { return VerifyRules::kCastor; }
};

// A pass made of a function (for the steps of a bigger rewrite that share
// state through the function's captures).
class FunctionPass : public Pass {
 public:
  using RunFunction = std::function<absl::Status(Model&, PassContext&)>;
  FunctionPass(std::string name, std::string description, RunFunction run,
               VerifyRules rules_after = VerifyRules::kCastor)
      : name_(std::move(name)),
        description_(std::move(description)),
        run_(std::move(run)),
        rules_after_(rules_after) {}
  std::string name() const override { return name_; }
  std::string description() const override { return description_; }
  absl::Status Run(Model& model, PassContext& context) override { return run_(model, context); }
  VerifyRules rules_after() const override { return rules_after_; }

 private:
  std::string name_;
  std::string description_;
  RunFunction run_;
  VerifyRules rules_after_;
};

}  // namespace castor
