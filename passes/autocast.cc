// The autocast pass (see autocast.h for what a converted model records).
//
// Algorithm: after the decisions of steps 1-2, one walk over the nodes in
// topological order paints them (step 3), one in reverse order repaints
// exact follow ops for their readers (3b), one records the decisions and a
// last one inserts the Casts (step 4); linear in graph size:
//
//   1. Policy record. A model whose castor.policy_digest equals the policy's
//      is returned unchanged (converting twice adds nothing). A model
//      converted under another policy is refused, naming both, unless
//      restart_from_float32: then castor's Casts and records are stripped
//      and the float32 graph is converted again. One converted under an
//      earlier definition of the same policy (its name with another digest:
//      an older castor's op lists) is converted again that way, noted.
//   2. Category of every node: Policy::CategoryOf (node override, then op
//      override, then the op lists), then the contextual rules, which only
//      ever force float32:
//        a. a Sqrt whose output is the divisor of a Div, or feeds a
//           Reciprocal, is a normalisation (x / sqrt(var + eps)): deny;
//        b. a node with a subgraph (If, Loop, Scan) or an op castor does not
//           know stays float32, noted; the producer of any value read
//           inside a subgraph stays float32 (the body expects float32);
//        c. keep_io_types: the node producing a graph output runs in
//           float32 (DESIGN rule 4, the Keras float32 final layer).
//   3. Paint (DESIGN rules 1-3), node by node:
//        allow  -> compute dtype, if the op accepts it at the model's opset
//                  (registry inference with 16-bit inputs), else float32
//                  with the op's reason;
//        deny   -> float32;
//        follow -> compute dtype iff every voting input is 16-bit; voting
//                  inputs are the float inputs that are neither weights nor
//                  constants (those are cast to whatever the node needs)
//                  nor pinned. Inputs that disagree promote to float32, as
//                  PyTorch promotes. So chains of follow ops between allow
//                  ops stay 16-bit with no Cast, as grappler paints them;
//        none   -> untouched (Shape, Cast, ...; no float computation).
//      A node painted 16-bit has its float32 outputs retyped.
//  3b. Readers (last node first): a follow node left float32 by its one
//      float input (an activation, not pinned) runs in the compute dtype
//      when its op is exact (it commutes with rounding to 16 bits: data
//      movement, Relu, MaxPool, ...; OpDef::autocast_exact) and every
//      reader of its float outputs computes in the compute dtype. The
//      Cast its readers shared moves to its input: no Cast more, the same
//      forward values (its gradient sees the rounded ones: Relu masks an
//      input in (0, 3e-8) that rounds to 0, MaxPool may meet a tie that
//      rounding made), and its output (which a gradient may keep) is half
//      the size. BatchNormalization -> Relu -> Conv thus stores Relu's
//      output in 16 bits, as grappler paints clear ops next to allow ops.
//   4. Casts (DESIGN rules 5-6): every float input of a painted node whose
//      dtype differs from the node's (float32 for a pinned input or a
//      setting, OpDef::setting_inputs, such as Resize's scales) reads a
//      Cast of its source, one per (source, dtype) shared by all readers and
//      placed before the first. A Constant node every reader needs in the
//      same 16-bit dtype is stored in it instead (no Cast; it is no master
//      weight). A weight is a float32 initializer and keeps
//      being one: its uses in 16-bit share one Cast. A value that a model
//      Cast widened exactly (float16 -> float32) is read from the Cast's
//      16-bit input instead of being cast back, so no Cast chain arises.
//      Model Casts are kept and shared like castor's own; one that became
//      a no-op, duplicates castor's Cast of the same value and dtype, or is
//      no longer read because its readers took its 16-bit input is removed
//      and noted (no Cast to the same type, no orphan).
//   5. Records (DESIGN rule 7): each painted node gets castor.autocast.dtype
//      and .why; each inserted Cast also .cast; the model gets the policy's
//      name, digest and JSON.
//   6. Node order (each inserted Cast just before its first reader) and type
//      inference over the whole graph, which checks every Cast's `to`
//      against its readers (DESIGN rule 8).
#include "passes/autocast.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "graph/gradient_builder.h"
#include "graph/half.h"
#include "graph/onnx_io.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"
#include "graph/status.h"

namespace castor {
namespace {

// The float dtypes the pass moves between; float64 values are left alone.
bool IsAutocastFloat(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

bool HasSubgraph(const Node& node) {
  for (const Attribute& a : node.attributes()) {
    if (a.kind == AttrKind::kGraph || a.kind == AttrKind::kGraphs) return true;
  }
  return false;
}

// A weight (non-overridable initializer) or a Constant node's output: cast
// to whatever its reader needs, never a vote in rule 3.
enum class SourceKind { kWeight, kConstant, kActivation };
SourceKind KindOf(const Value* value) {
  if (value->initializer() && !value->is_graph_input()) return SourceKind::kWeight;
  const Node* producer = value->producer();
  if (producer && producer->op_type() == "Constant" && producer->domain().empty()) {
    return SourceKind::kConstant;
  }
  return SourceKind::kActivation;
}
const char* KindName(SourceKind kind) {
  switch (kind) {
    case SourceKind::kWeight: return "weight";
    case SourceKind::kConstant: return "constant";
    case SourceKind::kActivation: return "activation";
  }
  return "activation";
}

bool IsInsertedCast(const Node& node) { return node.FindMetadata(kInsertedCastKey) != nullptr; }

std::string Quoted(const std::string& name) { return absl::StrCat("'", name, "'"); }

// Whether castor has a form of the op for its training graph that takes
// bfloat16 at every opset (com.castor Conv, ConvTranspose, MaxPool,
// AveragePool, GlobalAveragePool: ONNX accepts their bfloat16 only from
// opset 22; graph/ops/conv.cc, graph/ops/pool.cc).
bool IsTrainingFormOp(const std::string& op_type) {
  return op_type == "Conv" || op_type == "ConvTranspose" || op_type == "MaxPool" ||
         op_type == "AveragePool" || op_type == "GlobalAveragePool";
}

// A node's decision: its dtype (kUndefined: untouched) and why; and
// whether it computes as castor's training form of its op
// (AutocastOptions::training_graph_ops).
struct Decision {
  DType dtype = DType::kUndefined;
  std::string why;
  bool training_form = false;
};

// A step-3b repaint: the reason, the node's list entry (for the rule-3
// reason it gets when its input ends 16-bit too) and its one float input.
struct ReadersDecision {
  std::string why;
  std::string entry;
  const Value* input = nullptr;
};

class AutocastPass {
 public:
  AutocastPass(Model& model, const Policy& policy, const AutocastOptions& options)
      : model_(model),
        graph_(*model.graph),
        policy_(policy),
        options_(options),
        lowp_(policy.compute_dtype()) {}

  absl::StatusOr<AutocastReport> Run() {
    CASTOR_RETURN_IF_ERROR(DecideForcedFloat32());
    if (!policy_.keep_io_types() && policy_.is_mixed()) LowerGraphInputs();
    const std::vector<Node*> original_order = graph_.nodes();
    // Steps 3 and 3b for every node first: a decision depends on its
    // producers' decisions (3) or its readers' (3b), never on Casts, and
    // step 4 then knows what every reader of a value needs.
    absl::flat_hash_map<const Node*, Decision> painted;
    for (Node* node : original_order) {
      CASTOR_ASSIGN_OR_RETURN(Decision decision, Paint(*node));
      if (decision.dtype == DType::kUndefined) {
        ++report_.nodes_per_dtype["none"];
        continue;
      }
      if (decision.training_form) {
        node->set_domain(kCastorDomain);
        if (model_.OpsetVersion(kCastorDomain) == 0) {
          model_.opset_imports.push_back({kCastorDomain, 1});
        }
      }
      RetypeOutputs(*node, decision.dtype);
      decisions_.emplace(node, decision.dtype);
      painted.emplace(node, std::move(decision));
    }
    // Step 3b, readers last to first, so that a chain of exact ops before
    // a 16-bit reader turns 16-bit from its end.
    std::vector<std::pair<Node*, ReadersDecision>> for_readers;
    for (auto it = original_order.rbegin(); it != original_order.rend(); ++it) {
      CASTOR_ASSIGN_OR_RETURN(std::optional<ReadersDecision> repainted, PaintForReaders(**it));
      if (!repainted.has_value()) continue;
      RetypeOutputs(**it, lowp_);
      decisions_[*it] = lowp_;
      painted[*it] = Decision{lowp_, repainted->why};
      for_readers.emplace_back(*it, *std::move(repainted));
    }
    // Along a chain repainted from its end, only the first node reads a
    // float32 value; the rest follow a 16-bit input as rule 3 says.
    for (const auto& [node, repainted] : for_readers) {
      if (repainted.input->dtype() != lowp_) continue;
      painted[node].why = absl::StrCat("rule 3 (follow): ", repainted.entry,
                                       "; its computed float input is ", DTypeName(lowp_),
                                       " (the chain before its ", DTypeName(lowp_),
                                       " reader(s) turned ", DTypeName(lowp_), " by rule 3b)");
    }
    for (Node* node : original_order) {
      auto decided = painted.find(node);
      if (decided == painted.end()) continue;
      Record(*node, decided->second);
      ++report_.nodes_per_dtype[DTypeName(decided->second.dtype)];
    }
    std::vector<Node*> new_order;
    new_order.reserve(original_order.size() * 2);
    for (Node* node : original_order) {
      auto decided = decisions_.find(node);
      if (decided == decisions_.end()) {
        CASTOR_ASSIGN_OR_RETURN(const bool kept, HandleUntouched(*node));
        if (kept) new_order.push_back(node);
        continue;
      }
      CASTOR_RETURN_IF_ERROR(InsertInputCasts(*node, decided->second, new_order));
      new_order.push_back(node);
    }
    CASTOR_RETURN_IF_ERROR(RemoveBypassedModelCasts(new_order));
    CASTOR_RETURN_IF_ERROR(graph_.ReorderNodes(std::move(new_order)));
    CountWeightBytes();
    NoteOpsetRefusals();
    RecordPolicy();
    InferenceOptions inference;
    inference.allow_unknown_ops = true;  // noted in step 2b, left as declared
    absl::Status inferred = InferTypes(model_, inference);
    if (!inferred.ok()) {
      return absl::InternalError(absl::StrCat(
          "autocast produced a graph whose types do not check (a castor bug; please report "
          "it with the model): ",
          inferred.message()));
    }
    return std::move(report_);
  }

 private:
  // Step 2: rules a-c, recorded as float32 reasons keyed by node.
  absl::Status DecideForcedFloat32() {
    const OpRegistry& registry = OpRegistry::Global();
    for (Node* node : graph_.nodes()) {
      if (HasSubgraph(*node)) {
        forced_[node] = "rule 2b: its subgraph is left in float32 (castor does not convert "
                        "If/Loop/Scan bodies)";
        report_.notes.push_back(absl::StrCat(node->op_type(), " node ", Quoted(node->name()),
                                             ": subgraph left in float32"));
        for (Value* in : node->implicit_inputs()) {
          if (Node* producer = in->producer(); producer && !forced_.contains(producer)) {
            forced_[producer] = absl::StrCat("rule 2b: its output ", Quoted(in->name()),
                                             " is read inside the float32 subgraph of node ",
                                             Quoted(node->name()));
          }
        }
      } else if (!registry.Find(node->domain(), node->op_type())) {
        forced_[node] = "rule 2b: op unknown to castor; left in float32";
        report_.notes.push_back(absl::StrCat(OpListKey(node->domain(), node->op_type()),
                                             " node ", Quoted(node->name()),
                                             ": unknown op, left in float32"));
      }
    }
    for (Node* node : graph_.nodes()) {
      if (node->op_type() != "Sqrt" || !node->domain().empty() || forced_.contains(node)) {
        continue;
      }
      for (const Use& use : node->output(0)->uses()) {
        const std::string& op = use.node->op_type();
        if (use.node->domain().empty() &&
            ((op == "Div" && use.index == 1) || op == "Reciprocal")) {
          forced_[node] = absl::StrCat(
              "rule 2a (deny): Sqrt feeding a normalisation (", op, " node ",
              Quoted(use.node->name()), ") stays float32, as grappler keeps it");
          break;
        }
      }
    }
    if (policy_.keep_io_types()) {
      for (Value* out : graph_.outputs()) {
        Node* producer = out->producer();
        if (!producer || forced_.contains(producer)) continue;
        forced_[producer] = absl::StrCat(
            "rule 4: produces graph output ", Quoted(out->name()),
            ", which stays float32 (the float32 final layer; keep_io_types)");
      }
    }
    return absl::OkStatus();
  }

  // --no-keep-io-types: float32 graph inputs become compute-dtype inputs.
  void LowerGraphInputs() {
    std::vector<std::string> lowered;
    for (Value* in : graph_.inputs()) {
      if (in->initializer() || in->dtype() != DType::kFloat32) continue;
      in->set_dtype(lowp_);
      lowered.push_back(in->name());
    }
    if (!lowered.empty()) model_.SetMetadata(kLoweredInputsKey, absl::StrJoin(lowered, ","));
  }

  // Step 3 for one node.
  absl::StatusOr<Decision> Paint(Node& node) {
    CASTOR_ASSIGN_OR_RETURN(CategoryReason reason, policy_.CategoryOf(node));
    const bool has_float_input_or_output = HasFloatInputOrOutput(node);
    if (auto it = forced_.find(&node); it != forced_.end()) {
      // Rule 4 does not apply to nodes doing no float work (a Shape output).
      if (reason.category == AutocastCategory::kNone || !has_float_input_or_output) {
        return Decision{};
      }
      return Decision{DType::kFloat32, it->second};
    }
    switch (reason.category) {
      case AutocastCategory::kNone:
      case AutocastCategory::kUnset:
        return Decision{};
      case AutocastCategory::kDeny: {
        if (!has_float_input_or_output) return Decision{};
        std::string why = absl::StrCat("rule 2 (deny): ", reason.rule, ": ", reason.entry);
        const OpDef* def = OpRegistry::Global().Find(node.domain(), node.op_type());
        if (policy_.is_mixed() && def != nullptr && def->autocast_output_in_input_dtype &&
            node.input(0) != nullptr && node.input(0)->dtype() == lowp_) {
          absl::StrAppend(&why, "; its input came in ", DTypeName(lowp_),
                          ", so its output counts as ", DTypeName(lowp_),
                          " for the nodes that follow it (they read it through one Cast)");
        }
        return Decision{DType::kFloat32, std::move(why)};
      }
      case AutocastCategory::kAllow: {
        if (!has_float_input_or_output) return Decision{};
        std::string why = absl::StrCat("rule 1 (allow): ", reason.rule, ": ", reason.entry);
        if (!policy_.is_mixed()) return Decision{DType::kFloat32, why + "; policy computes in float32"};
        return LowpIfAccepted(node, std::move(why));
      }
      case AutocastCategory::kFollow:
        return PaintFollow(node, reason);
    }
    return Decision{};
  }

  // A node painted 16-bit makes 16-bit values; one painted float32 in a
  // model that computed it 16-bit makes float32 ones (a graph output among
  // them changes its declared type, noted).
  void RetypeOutputs(Node& node, DType dtype) {
    for (Value* out : node.outputs()) {
      if (!IsAutocastFloat(out->dtype()) || out->dtype() == dtype) continue;
      if (dtype != DType::kFloat32 && out->dtype() != DType::kFloat32) continue;
      if (out->is_graph_output()) {
        report_.notes.push_back(absl::StrCat("graph output ", Quoted(out->name()), " was ",
                                             DTypeName(out->dtype()), " in the model and is now ",
                                             DTypeName(dtype), " (its producer ",
                                             Quoted(node.name()), " computes in ",
                                             DTypeName(dtype), ")"));
      }
      out->set_dtype(dtype);
    }
  }

  bool HasFloatInputOrOutput(const Node& node) const {
    for (const Value* in : node.inputs()) {
      if (in && IsAutocastFloat(in->dtype())) return true;
    }
    for (const Value* out : node.outputs()) {
      if (IsAutocastFloat(out->dtype())) return true;
    }
    return false;
  }

  // Whether `value` is the first output of a node painted float32 whose op
  // hands it on in the dtype its first input arrived in (OpDef::
  // autocast_output_in_input_dtype), that input being in the compute dtype:
  // then it votes for the compute dtype in rule 3, and its readers that
  // compute in it read it through one Cast.
  bool HandedOnInComputeDType(const Value* value) const {
    const Node* producer = value->producer();
    if (!policy_.is_mixed() || producer == nullptr || value->producer_output() != 0) {
      return false;
    }
    const OpDef* def = OpRegistry::Global().Find(producer->domain(), producer->op_type());
    auto decided = decisions_.find(producer);
    if (def == nullptr || !def->autocast_output_in_input_dtype || decided == decisions_.end() ||
        decided->second != DType::kFloat32) {
      return false;
    }
    const Value* data = producer->input(0);
    return data != nullptr && data->dtype() == lowp_;
  }

  absl::StatusOr<Decision> PaintFollow(Node& node, const CategoryReason& reason) {
    const std::string entry = absl::StrCat(reason.rule, ": ", reason.entry);
    int voters = 0;
    const Value* float32_voter = nullptr;
    std::vector<std::string> handed_on;  // float32 inputs that vote for the compute dtype
    for (int i = 0; i < node.num_inputs(); ++i) {
      const Value* in = node.input(i);
      if (!in || !IsAutocastFloat(in->dtype()) || KindOf(in) != SourceKind::kActivation ||
          StaysFloat32(node, i)) {
        continue;
      }
      ++voters;
      if (in->dtype() == lowp_) continue;
      if (HandedOnInComputeDType(in)) {
        handed_on.push_back(absl::StrCat(Quoted(in->name()), " (", in->producer()->op_type(),
                                         " computes in float32 and hands its output on in ",
                                         DTypeName(lowp_), ", the dtype its input came in)"));
      } else if (!float32_voter) {
        float32_voter = in;
      }
    }
    if (voters == 0) {
      if (!HasFloatInputOrOutput(node)) return Decision{};
      return Decision{DType::kFloat32,
                      absl::StrCat("rule 3 (follow): ", entry,
                                   "; no computed float input to follow (only weights or "
                                   "constants), so float32")};
    }
    if (!policy_.is_mixed()) {
      return Decision{DType::kFloat32,
                      absl::StrCat("rule 3 (follow): ", entry, "; policy computes in float32")};
    }
    if (float32_voter) {
      return Decision{DType::kFloat32,
                      absl::StrCat("rule 3 (follow): ", entry, "; input ",
                                   Quoted(float32_voter->name()), " is ",
                                   DTypeName(float32_voter->dtype()),
                                   ", so the inputs do not all agree on ", DTypeName(lowp_),
                                   " and the node promotes to float32")};
    }
    std::string why = absl::StrCat("rule 3 (follow): ", entry, "; all ", voters,
                                   " computed float input(s) are ", DTypeName(lowp_));
    if (!handed_on.empty()) {
      absl::StrAppend(&why, ", counting ", absl::StrJoin(handed_on, " and "));
    }
    return LowpIfAccepted(node, std::move(why));
  }

  // Step 3b for one node: a follow node painted float32 only because its
  // one float input is float32 runs in the compute dtype instead when its
  // op is exact (OpDef::autocast_exact: it commutes with the rounding) and
  // every reader of its float outputs computes in the compute dtype. Its
  // readers would read a Cast of its output; it reads a Cast of its input
  // instead: no Cast more, the same forward values (BatchNormalization ->
  // Relu -> Conv stores Relu's output, which its gradient keeps, in 16
  // bits).
  // Returns the node's new reason, its list entry and its float input, or
  // nullopt to keep float32.
  absl::StatusOr<std::optional<ReadersDecision>> PaintForReaders(Node& node) {
    auto decided = decisions_.find(&node);
    if (!policy_.is_mixed() || decided == decisions_.end() ||
        decided->second != DType::kFloat32 || forced_.contains(&node)) {
      return std::nullopt;
    }
    CASTOR_ASSIGN_OR_RETURN(CategoryReason reason, policy_.CategoryOf(node));
    const OpDef* def = OpRegistry::Global().Find(node.domain(), node.op_type());
    if (reason.category != AutocastCategory::kFollow || !def || !def->autocast_exact) {
      return std::nullopt;
    }
    const Value* input = nullptr;
    for (int i = 0; i < node.num_inputs(); ++i) {
      const Value* in = node.input(i);
      if (!in || !IsAutocastFloat(in->dtype())) continue;
      if (input != nullptr || KindOf(in) != SourceKind::kActivation ||
          StaysFloat32(node, i)) {
        return std::nullopt;  // a second float input would need a Cast of its own
      }
      input = in;
    }
    if (input == nullptr) return std::nullopt;
    int readers = 0;
    for (const Value* out : node.outputs()) {
      if (!IsAutocastFloat(out->dtype())) continue;
      if (out->is_graph_output()) return std::nullopt;
      for (const Use& use : out->uses()) {
        auto reader = decisions_.find(use.node);
        if (reader == decisions_.end() || reader->second != lowp_ ||
            StaysFloat32(*use.node, use.index)) {
          return std::nullopt;
        }
        ++readers;
      }
    }
    if (readers == 0 || !AcceptsInputsIn(node, lowp_).ok()) return std::nullopt;
    std::string entry = absl::StrCat(reason.rule, ": ", reason.entry);
    std::string why = absl::StrCat(
        "rule 3 (follow, exact): ", entry, "; its input ", Quoted(input->name()), " is ",
        DTypeName(input->dtype()), ", but all ", readers, " reader(s) of its output compute in ",
        DTypeName(lowp_), ", so it does too: the Cast moves to its input (no Cast more, the same "
        "forward values, its output stored in 16 bits)");
    return ReadersDecision{std::move(why), std::move(entry), input};
  }

  // An input that keeps float32 whatever its node computes in: pinned by the
  // policy (--pin-fp32), or a setting rather than a value (OpDef::
  // setting_inputs: Dropout's ratio, Resize's roi and scales, which Resize
  // takes only in float32), so no Cast is placed on it.
  bool StaysFloat32(const Node& node, int input) const {
    if (policy_.IsPinned(node, input)) return true;
    const OpDef* def = OpRegistry::Global().Find(node.domain(), node.op_type());
    return def != nullptr && def->IsSettingInput(input);
  }

  // Whether the op's inference accepts the node's float inputs in `dtype`
  // (float32 where pinned) at the model's opset. Inputs are retyped for the
  // probe and restored.
  absl::Status AcceptsInputsIn(Node& node, DType dtype) {
    std::vector<std::pair<Value*, DType>> saved;
    for (int i = 0; i < node.num_inputs(); ++i) {
      Value* in = node.input(i);
      if (!in || !IsAutocastFloat(in->dtype())) continue;
      const DType target = StaysFloat32(node, i) ? DType::kFloat32 : dtype;
      if (in->dtype() == target) continue;
      saved.emplace_back(in, in->dtype());
      in->set_dtype(target);
    }
    absl::Status accepted = CheckNodeInference(model_, node);
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) it->first->set_dtype(it->second);
    return accepted;
  }

  // The compute dtype when the op accepts it; float32 (with the op's
  // objection) otherwise.
  absl::StatusOr<Decision> LowpIfAccepted(Node& node, std::string why) {
    absl::Status as_lowp = AcceptsInputsIn(node, lowp_);
    if (as_lowp.ok()) return Decision{lowp_, std::move(why)};
    // An objection that float32 inputs share is not about the dtype (a
    // shape input the probe cannot see); the final inference decides. The
    // probe retypes the inputs to float32: a producer already painted
    // 16-bit (a bfloat16 Gemm before a HardSwish that takes bfloat16 only
    // from opset 22) must not make the dtype objection look like another.
    if (!AcceptsInputsIn(node, DType::kFloat32).ok()) return Decision{lowp_, std::move(why)};
    const int64_t opset = model_.OpsetVersion(node.domain());
    const std::string op = OpListKey(node.domain(), node.op_type());
    const bool has_training_form = node.domain().empty() && IsTrainingFormOp(node.op_type());
    if (has_training_form && options_.training_graph_ops) {
      // castor's form takes every float type at every opset and checks the
      // same shapes, so the float32 probe above stands for it too. The Run
      // loop moves the node to castor's domain.
      ++report_.training_forms[op];
      return Decision{
          lowp_,
          absl::StrCat(why, "; ONNX ", op, " does not accept ", DTypeName(lowp_), " at opset ",
                       opset, ", so castor's training graph runs it as ", kCastorDomain, " ", op,
                       " (opset 22's ", op, ", which does, at any opset) in ", DTypeName(lowp_),
                       "; a file 'castor convert' writes keeps ONNX ", op, " in float32"),
          /*training_form=*/true};
    }
    ++refused_by_opset_[{op, opset}];
    if (has_training_form) {
      ++report_.float32_here_lowp_in_training[op];
      return Decision{
          DType::kFloat32,
          absl::StrCat(why, "; ONNX ", op, " does not accept ", DTypeName(lowp_), " at opset ",
                       opset, " (", as_lowp.message(),
                       "), so float32 in this file (valid ONNX that ONNX Runtime runs); "
                       "'castor train' runs it in ", DTypeName(lowp_), " all the same, as ",
                       kCastorDomain, " ", op, " (opset 22's ", op,
                       " at any opset) inside its training graph only")};
    }
    return Decision{DType::kFloat32,
                    absl::StrCat(why, "; but the op does not accept ", DTypeName(lowp_),
                                 " at opset ", opset, " (", as_lowp.message(),
                                 "), so float32")};
  }

  // A node left as it is; only a model Cast may change. Returns false when
  // the node was removed (a Cast that became a no-op, or a duplicate of
  // castor's own Cast of the same value and dtype).
  absl::StatusOr<bool> HandleUntouched(Node& node) {
    if (node.op_type() != "Cast" || !node.domain().empty() || !node.input(0)) {
      return true;
    }
    Value* in = node.input(0);
    Value* out = node.output(0);
    auto to = DTypeFromOnnx(static_cast<int32_t>(node.GetInt("to", 0)));
    if (!to.ok() || out->is_graph_output()) return true;
    if (*to == in->dtype()) {
      report_.notes.push_back(absl::StrCat("model Cast ", Quoted(node.name()), " to ",
                                           DTypeName(*to), " became a no-op (its input is now ",
                                           DTypeName(in->dtype()), ") and was removed"));
      CASTOR_RETURN_IF_ERROR(RemoveModelCast(node, in));
      return false;
    }
    if (!IsAutocastFloat(in->dtype()) || !IsAutocastFloat(*to)) return true;
    // The model's Cast is the one Cast of (input, dtype) later readers share,
    // unless castor already cast that value for an earlier reader.
    auto [shared, first] = casts_.emplace(std::make_pair(in, *to), out);
    if (first) return true;
    report_.notes.push_back(absl::StrCat("model Cast ", Quoted(node.name()),
                                         " duplicated castor's Cast of ", Quoted(in->name()),
                                         " to ", DTypeName(*to),
                                         " and was removed; its readers share castor's"));
    CASTOR_RETURN_IF_ERROR(RemoveModelCast(node, shared->second));
    return false;
  }

  // The node is destroyed: callers must drop every pointer to it.
  absl::Status RemoveModelCast(Node& cast, Value* replacement) {
    graph_.ReplaceAllUsesWith(cast.output(0), replacement);
    return graph_.RemoveNode(&cast);
  }

  // Model Casts whose readers all moved to the Cast's 16-bit input (step 4)
  // would be orphans: removed and noted.
  // Runs after the walk (no node is created after it), so dropping the
  // removed nodes from `order` leaves no dangling pointer.
  absl::Status RemoveBypassedModelCasts(std::vector<Node*>& order) {
    for (Node* cast : bypassed_) {
      if (!cast->output(0)->uses().empty() || cast->output(0)->is_graph_output()) continue;
      report_.notes.push_back(absl::StrCat(
          "model Cast ", Quoted(cast->name()), " is no longer read (its readers take its ",
          DTypeName(cast->input(0)->dtype()), " input directly) and was removed"));
      order.erase(std::find(order.begin(), order.end(), cast));
      CASTOR_RETURN_IF_ERROR(graph_.RemoveNode(cast));
    }
    return absl::OkStatus();
  }

  // Step 4 for one node computing in `dtype`.
  absl::Status InsertInputCasts(Node& node, DType dtype, std::vector<Node*>& order) {
    for (int i = 0; i < node.num_inputs(); ++i) {
      Value* in = node.input(i);
      if (!in || !IsAutocastFloat(in->dtype())) continue;
      const DType target = StaysFloat32(node, i) ? DType::kFloat32 : dtype;
      if (in->dtype() == target) continue;
      CASTOR_ASSIGN_OR_RETURN(Value * cast, CastOf(in, target, node, order));
      node.SetInput(i, cast);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value*> CastOf(Value* source, DType target, const Node& first_reader,
                                std::vector<Node*>& order) {
    // A model Cast that widened a `target` value exactly: read its input.
    if (Node* producer = source->producer();
        producer && producer->op_type() == "Cast" && producer->domain().empty() &&
        producer->input(0) && producer->input(0)->dtype() == target &&
        IsLowPrecisionFloat(target) && source->dtype() == DType::kFloat32) {
      if (!std::count(bypassed_.begin(), bypassed_.end(), producer)) bypassed_.push_back(producer);
      return producer->input(0);
    }
    auto key = std::make_pair(source, target);
    if (auto it = casts_.find(key); it != casts_.end()) return it->second;
    if (LowerConstantInPlace(source, target)) return source;
    const std::string suffix = absl::StrCat("_to_", DTypeName(target));
    const std::string value_name = graph_.UniqueName(absl::StrCat(source->name(), suffix));
    const std::string node_name = graph_.UniqueName(absl::StrCat("Cast_", value_name));
    CASTOR_ASSIGN_OR_RETURN(Node * cast, graph_.AddNode("Cast", {source}, {value_name}, node_name));
    cast->SetAttribute(Attribute::Int("to", DTypeToOnnx(target)));
    cast->output(0)->set_dtype(target);
    cast->output(0)->set_shape(source->shape());
    const SourceKind kind = KindOf(source);
    switch (kind) {
      case SourceKind::kWeight: ++report_.weight_casts; break;
      case SourceKind::kConstant: ++report_.constant_casts; break;
      case SourceKind::kActivation: ++report_.activation_casts; break;
    }
    std::string why;
    if (kind == SourceKind::kWeight) {
      why = absl::StrCat("rule 5: weight ", Quoted(source->name()),
                         " stays a float32 master copy; this one Cast feeds every reader that "
                         "computes in ", DTypeName(target), " (first: node ",
                         Quoted(first_reader.name()), ")");
    } else {
      why = absl::StrCat("rule 6: ", KindName(kind), " ", Quoted(source->name()), " is ",
                         DTypeName(source->dtype()), " and node ", Quoted(first_reader.name()),
                         " (and any later reader needing ", DTypeName(target),
                         ") computes in ", DTypeName(target));
    }
    cast->SetMetadata(kNodeDTypeKey, DTypeName(target));
    cast->SetMetadata(kNodeWhyKey, why);
    cast->SetMetadata(kInsertedCastKey, KindName(kind));
    cast->set_doc_string(absl::StrCat("inserted by castor autocast: ", why));
    casts_.emplace(key, cast->output(0));
    order.push_back(cast);
    return cast->output(0);
  }

  // The dtype reader `node` needs at input `index`: its decision (float32
  // when pinned), or the value's own dtype for a node left untouched.
  DType NeededBy(const Node& node, int index, const Value& value) const {
    auto decided = decisions_.find(&node);
    if (decided == decisions_.end()) return value.dtype();
    return StaysFloat32(node, index) ? DType::kFloat32 : decided->second;
  }

  // A Constant node's float32 tensor that every reader needs in `target`
  // (and that is no graph output) is stored in `target` instead of being
  // cast: a Constant is not a master weight.
  bool LowerConstantInPlace(Value* source, DType target) {
    Node* constant = source->producer();
    if (KindOf(source) != SourceKind::kConstant || source->is_graph_output() ||
        !IsLowPrecisionFloat(target)) {
      return false;
    }
    const Attribute* value = constant->attribute("value");
    if (value == nullptr || value->kind != AttrKind::kTensor ||
        value->t.dtype() != DType::kFloat32) {
      return false;
    }
    for (const Use& use : source->uses()) {
      if (use.index < 0 || NeededBy(*use.node, use.index, *source) != target) return false;
    }
    const Tensor& wide = value->t;
    // StripAutocast restores the exact float32 values from the record, so
    // only small constants (scales, epsilons) are lowered.
    constexpr int64_t kMaxLoweredElements = 64;
    if (wide.num_elements() > kMaxLoweredElements) return false;
    std::vector<std::string> original;
    for (int64_t i = 0; i < wide.num_elements(); ++i) {
      original.push_back(absl::StrFormat("%.9g", wide.data<float>()[i]));
    }
    constant->SetMetadata(kLoweredConstantKey, absl::StrJoin(original, ","));
    Tensor narrow(target, wide.dims());
    for (int64_t i = 0; i < wide.num_elements(); ++i) {
      const float x = wide.data<float>()[i];
      narrow.data<uint16_t>()[i] =
          target == DType::kFloat16 ? FloatToHalfBits(x) : FloatToBFloat16Bits(x);
    }
    constant->SetAttribute(Attribute::TensorValue("value", std::move(narrow)));
    source->set_dtype(target);
    ++report_.constants_lowered;
    const std::string why = absl::StrCat(
        "rule 5: constant ", Quoted(source->name()), " is read only in ", DTypeName(target),
        ", so it is stored in ", DTypeName(target), " instead of being cast (not a master weight)");
    constant->SetMetadata(kNodeDTypeKey, DTypeName(target));
    constant->SetMetadata(kNodeWhyKey, why);
    return true;
  }

  void Record(Node& node, const Decision& decision) {
    node.SetMetadata(kNodeDTypeKey, DTypeName(decision.dtype));
    node.SetMetadata(kNodeWhyKey, decision.why);
  }

  void CountWeightBytes() {
    for (const Value* weight : graph_.initializers()) {
      if (!IsAutocastFloat(weight->dtype()) || weight->is_graph_input()) continue;
      const int64_t elements = weight->initializer()->num_elements();
      const int64_t stored = elements * static_cast<int64_t>(DTypeSize(weight->dtype()));
      report_.weight_bytes_stored += stored;
      bool read_directly = false;
      for (const Use& use : weight->uses()) {
        if (!IsInsertedCast(*use.node)) read_directly = true;
      }
      if (read_directly) report_.weight_bytes_computed += stored;
      for (DType target : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
        if (casts_.contains(std::make_pair(const_cast<Value*>(weight), target))) {
          report_.weight_bytes_computed += elements * static_cast<int64_t>(DTypeSize(target));
        }
      }
    }
  }

  // One note per op that stayed float32 because its schema at the model's
  // opset has no 16-bit type (e.g. Conv takes bfloat16 only from opset 22).
  // Ops with a training form say where they compute in the compute dtype.
  void NoteOpsetRefusals() {
    for (const auto& [op_and_opset, count] : refused_by_opset_) {
      const auto& [op, opset] = op_and_opset;
      const char* s = count == 1 ? "" : "s";
      if (report_.float32_here_lowp_in_training.contains(op)) {
        report_.notes.push_back(absl::StrCat(
            count, " ", op, " node", s, " stay", count == 1 ? "s" : "", " float32 in this file (",
            op, " accepts ", DTypeName(lowp_), " only from opset 22; the model is opset ", opset,
            ") and compute", count == 1 ? "s" : "", " in ", DTypeName(lowp_),
            " in 'castor train' as ", kCastorDomain, " ", op,
            " ('castor inspect --why NODE' says so per node)"));
        continue;
      }
      report_.notes.push_back(absl::StrCat(
          count, " ", op, " node", s, " stay", count == 1 ? "s" : "",
          " float32: ", op, " does not accept ", DTypeName(lowp_), " at opset ",
          opset, " (a later opset may; 'castor inspect --why NODE' shows the "
          "check)"));
    }
    for (const auto& [op, count] : report_.training_forms) {
      report_.notes.push_back(absl::StrCat(
          count, " ", op, " node", count == 1 ? "" : "s", " compute", count == 1 ? "s" : "",
          " in ", DTypeName(lowp_), " as ", kCastorDomain, " ", op, " (the training graph's form; ",
          "ONNX ", op, " accepts ", DTypeName(lowp_), " only from opset 22)"));
    }
  }

  void RecordPolicy() {
    model_.SetMetadata(kPolicyNameKey, policy_.name());
    model_.SetMetadata(kPolicyDigestKey, policy_.Digest());
    model_.SetMetadata(kPolicyJsonKey, policy_.ToJson().Dump());
    model_.SetMetadata(kComputeDTypeKey, DTypeName(policy_.compute_dtype()));
  }

  Model& model_;
  Graph& graph_;
  const Policy& policy_;
  const AutocastOptions options_;
  const DType lowp_;
  AutocastReport report_;
  absl::flat_hash_map<const Node*, std::string> forced_;
  absl::flat_hash_map<std::pair<Value*, DType>, Value*> casts_;
  // Step 3's dtype of every painted node.
  absl::flat_hash_map<const Node*, DType> decisions_;
  // Model Casts that step 4 read through, in the order met.
  std::vector<Node*> bypassed_;
  // Ops (OpListKey) painted 16-bit but refused by their schema, with counts.
  std::map<std::pair<std::string, int64_t>, int> refused_by_opset_;
};

void EraseModelMetadata(Model& model, const std::string& key) {
  auto& props = model.metadata_props;
  for (auto it = props.begin(); it != props.end();) {
    it = it->first == key ? props.erase(it) : it + 1;
  }
}

}  // namespace

AutocastRecord ReadAutocastRecord(const Node& node) {
  AutocastRecord record;
  if (const std::string* dtype = node.FindMetadata(kNodeDTypeKey)) record.dtype = *dtype;
  if (const std::string* why = node.FindMetadata(kNodeWhyKey)) record.why = *why;
  if (const std::string* cast = node.FindMetadata(kInsertedCastKey)) record.inserted_cast = *cast;
  return record;
}

namespace {

// A Constant the pass stored in 16 bits gets its float32 values back.
absl::Status RestoreLoweredConstant(Node& constant, const std::string& original) {
  const Attribute* value = constant.attribute("value");
  std::vector<float> values;
  for (absl::string_view text : absl::StrSplit(original, ',')) {
    float x = 0;
    if (!absl::SimpleAtof(text, &x)) {
      return absl::DataLossError(absl::StrCat("Constant node '", constant.name(), "': ",
                                              kLoweredConstantKey, " is not a list of numbers"));
    }
    values.push_back(x);
  }
  if (value == nullptr || value->kind != AttrKind::kTensor ||
      value->t.num_elements() != static_cast<int64_t>(values.size())) {
    return absl::DataLossError(absl::StrCat("Constant node '", constant.name(), "': ",
                                            kLoweredConstantKey, " does not match its value"));
  }
  constant.SetAttribute(Attribute::TensorValue(
      "value", Tensor::FromVector<float>(DType::kFloat32, value->t.dims(), values)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> StripAutocast(Model& model) {
  Graph& graph = *model.graph;
  int removed = 0;
  const std::vector<Node*> nodes = graph.nodes();
  for (Node* node : nodes) {
    if (!IsInsertedCast(*node)) continue;
    graph.ReplaceAllUsesWith(node->output(0), node->input(0));
    CASTOR_RETURN_IF_ERROR(graph.RemoveNode(node));
    ++removed;
  }
  for (Node* node : graph.nodes()) {
    // castor's training form of an op (training_graph_ops) is the ONNX op again.
    if (node->domain() == kCastorDomain && IsTrainingFormOp(node->op_type())) {
      node->set_domain("");
    }
    if (const std::string* original = node->FindMetadata(kLoweredConstantKey)) {
      CASTOR_RETURN_IF_ERROR(RestoreLoweredConstant(*node, *original));
      node->RemoveMetadata(kLoweredConstantKey);
    }
    node->RemoveMetadata(kNodeDTypeKey);
    node->RemoveMetadata(kNodeWhyKey);
    // Outputs are re-inferred from float32 inputs below.
    for (Value* out : node->outputs()) {
      if (IsLowPrecisionFloat(out->dtype())) out->set_dtype(DType::kUndefined);
    }
  }
  if (const std::string* lowered = model.FindMetadata(kLoweredInputsKey)) {
    for (absl::string_view name : absl::StrSplit(*lowered, ',')) {
      if (Value* in = graph.FindValue(std::string(name)); in && in->is_graph_input()) {
        in->set_dtype(DType::kFloat32);
      }
    }
  }
  for (const char* key : {kPolicyNameKey, kPolicyDigestKey, kPolicyJsonKey, kComputeDTypeKey,
                          kLoweredInputsKey}) {
    EraseModelMetadata(model, key);
  }
  InferenceOptions inference;
  inference.allow_unknown_ops = true;
  CASTOR_RETURN_IF_ERROR(InferTypes(model, inference));
  return removed;
}

absl::StatusOr<AutocastReport> RunAutocast(Model& model, const Policy& policy,
                                           const AutocastOptions& options) {
  int casts_removed = 0;
  std::string redefined_note;
  if (const std::string* digest = model.FindMetadata(kPolicyDigestKey)) {
    const std::string* name = model.FindMetadata(kPolicyNameKey);
    const std::string old_name = name ? *name : "(unnamed)";
    if (*digest == policy.Digest()) {
      AutocastReport report;
      report.unchanged = true;
      report.notes.push_back(absl::StrCat("already converted under policy '", policy.name(),
                                          "' (", *digest, "); nothing to do"));
      return report;
    }
    // The same policy name under another digest: the file was converted
    // under an earlier definition of this policy (another castor version's
    // op lists, or an edited policy file of that name). Its float32 graph
    // comes back exactly, so it is converted again from there, noted.
    const bool redefined = name != nullptr && *name == policy.name();
    if (redefined && !options.restart_from_float32) {
      redefined_note = absl::StrCat(
          "the model was converted under an earlier definition of policy '", policy.name(),
          "' (", *digest, "; this castor's is ", policy.Digest(),
          "): converted again from its float32 graph");
    }
    if (!options.restart_from_float32 && !redefined) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the model was already converted under policy '", old_name, "' (", *digest,
          "); refusing to convert it under policy '", policy.name(), "' (", policy.Digest(),
          "): its nodes already carry the first policy's dtypes. Ask to start again from the "
          "float32 graph (castor convert --restart-from-float32) to strip castor's Casts and "
          "convert under '",
          policy.name(), "'"));
    }
    CASTOR_ASSIGN_OR_RETURN(casts_removed, StripAutocast(model));
    // Export and import the float32 graph so the conversion starts from the
    // state a file gives (names castor used before are free again): the
    // result equals converting the original float32 model.
    CASTOR_ASSIGN_OR_RETURN(onnx::ModelProto float32_graph, ExportModel(model));
    CASTOR_ASSIGN_OR_RETURN(model, ImportModel(float32_graph, "", "the float32 graph"));
    InferenceOptions inference;
    inference.allow_unknown_ops = true;
    CASTOR_RETURN_IF_ERROR(InferTypes(model, inference));
  }
  AutocastPass pass(model, policy, options);
  CASTOR_ASSIGN_OR_RETURN(AutocastReport report, pass.Run());
  report.casts_removed = casts_removed;
  if (!redefined_note.empty()) report.notes.insert(report.notes.begin(), redefined_note);
  return report;
}

namespace {

class AutocastPassAdapter : public Pass {
 public:
  AutocastPassAdapter(const Policy& policy, AutocastOptions options, AutocastReport* report)
      : policy_(policy), options_(options), report_(report) {}
  std::string name() const override { return "autocast"; }
  std::string description() const override {
    return absl::StrCat("gives each node a compute dtype under policy '", policy_.name(),
                        "' and inserts the fewest Casts that make it so");
  }
  absl::Status Run(Model& model, PassContext& context) override {
    (void)context;
    CASTOR_ASSIGN_OR_RETURN(AutocastReport report, RunAutocast(model, policy_, options_));
    if (report_ != nullptr) *report_ = std::move(report);
    return absl::OkStatus();
  }

 private:
  const Policy& policy_;
  AutocastOptions options_;
  AutocastReport* report_;
};

}  // namespace

std::unique_ptr<Pass> MakeAutocastPass(const Policy& policy, AutocastOptions options,
                                       AutocastReport* report) {
  return std::make_unique<AutocastPassAdapter>(policy, options, report);
}

}  // namespace castor
