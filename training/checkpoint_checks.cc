// Checkpoint consistency (see checkpoint.h): the training state against the
// graph (parameters, statistics, moments and their dtypes and shapes), the
// record against the recorded policy (record and policy digests, names and
// dtypes, the nodes kept float32), the nodes a policy keeps float32, and
// the differences between two policies.
#include "training/checkpoint.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "graph/status.h"
#include "graph/version.h"
#include "passes/autocast.h"
#include "training/checkpoint_internal.h"
#include "training/loss_scaler.h"

namespace castor::training {
namespace {

using namespace checkpoint_internal;

// Every BatchNormalization input slot 3/4 reading `value`.
bool ReadByBatchNormStatistic(const Value& value) {
  for (const Use& use : value.uses()) {
    if (use.node->op_type() == "BatchNormalization" && use.node->domain().empty() &&
        (use.index == 3 || use.index == 4)) {
      return true;
    }
  }
  return false;
}

std::vector<std::string> SlotsOf(const OptimizerOptions& options) {
  switch (options.kind) {
    case OptimizerKind::kSgd:
      return options.momentum > 0 ? std::vector<std::string>{"momentum"}
                                  : std::vector<std::string>{};
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return {"m", "v"};
  }
  return {};
}

}  // namespace

namespace checkpoint_internal {

void CheckStateAgainstGraph(const Checkpoint& checkpoint, std::vector<std::string>& problems) {
  const Model& model = checkpoint.model;
  if (model.graph == nullptr) {
    problems.push_back("the checkpoint has no model graph");
    return;
  }
  const Graph& graph = *model.graph;
  const TrainingState& state = checkpoint.state;
  if (const std::string* digest = model.FindMetadata(kPolicyDigestKey)) {
    problems.push_back(absl::StrCat(
        "the model carries an autocast record (", kPolicyDigestKey, " ", *digest,
        "): a checkpoint holds the float32 graph (StripAutocast the converted model)"));
  }
  int inserted_casts = 0;
  for (const Node* node : graph.nodes())
    inserted_casts += node->FindMetadata(kInsertedCastKey) != nullptr;
  if (inserted_casts > 0) {
    problems.push_back(absl::StrCat("the model holds ", inserted_casts,
                                    " Cast(s) inserted by autocast: a checkpoint holds the "
                                    "float32 graph (StripAutocast the converted model)"));
  }

  std::set<std::string> seen;
  auto check_initializer = [&](const std::string& name, const char* what) -> const Value* {
    if (!seen.insert(name).second) {
      problems.push_back(absl::StrCat(what, " ", Quoted(name), " is listed more than once"));
      return nullptr;
    }
    const Value* value = graph.FindValue(name);
    if (value == nullptr || value->initializer() == nullptr) {
      problems.push_back(
          absl::StrCat(what, " ", Quoted(name), " is not an initializer of the graph"));
      return nullptr;
    }
    if (value->initializer()->dtype() != DType::kFloat32) {
      problems.push_back(absl::StrCat(what, " ", Quoted(name), " is ",
                                      DTypeName(value->initializer()->dtype()),
                                      "; master weights and statistics must be float32"));
      return nullptr;
    }
    return value;
  };
  std::map<std::string, const Value*> parameters;
  for (const std::string& name : state.parameters) {
    if (const Value* value = check_initializer(name, "parameter")) parameters[name] = value;
  }
  for (const std::string& name : state.running_stats) {
    const Value* value = check_initializer(name, "running statistic");
    if (value != nullptr && !ReadByBatchNormStatistic(*value)) {
      problems.push_back(absl::StrCat("running statistic ", Quoted(name),
                                      " is not the running mean or variance of a "
                                      "BatchNormalization node"));
    }
  }

  const std::vector<std::string> slots = SlotsOf(state.optimizer);
  for (const auto& [parameter, tensors] : state.moments) {
    auto it = parameters.find(parameter);
    if (it == parameters.end()) {
      problems.push_back(absl::StrCat("optimizer moments of ", Quoted(parameter),
                                      ", which is not a trained parameter of the state"));
      continue;
    }
    const Tensor& weight = *it->second->initializer();
    for (const auto& [slot, tensor] : tensors) {
      const std::string label = absl::StrCat("moment ", Quoted(MomentTensorName(parameter, slot)));
      if (std::find(slots.begin(), slots.end(), slot) == slots.end()) {
        problems.push_back(absl::StrCat(
            label, ": slot ", Quoted(slot), " is not a slot of the ",
            OptimizerKindName(state.optimizer.kind),
            " optimizer (slots: ", slots.empty() ? "none" : absl::StrJoin(slots, ", "), ")"));
      }
      if (tensor.dtype() != DType::kFloat32 || tensor.dims() != weight.dims()) {
        problems.push_back(absl::StrCat(label, " is ", DTypeName(tensor.dtype()),
                                        DimsText(tensor.dims()), "; its parameter is float32",
                                        DimsText(weight.dims())));
      }
    }
  }
  if (state.optimizer_step > 0) {
    for (const auto& [parameter, value] : parameters) {
      auto it = state.moments.find(parameter);
      for (const std::string& slot : slots) {
        if (it == state.moments.end() || !it->second.contains(slot)) {
          problems.push_back(absl::StrCat("parameter ", Quoted(parameter), " has no ", Quoted(slot),
                                          " moment although ", state.optimizer_step,
                                          " update(s) were applied"));
        }
      }
    }
  }

  if (state.step < 0 || state.optimizer_step < 0 || state.epoch < 0 || state.position < 0 ||
      state.batch_size < 0 || state.dataset_size < 0) {
    problems.push_back(absl::StrCat("negative counter in the state: step ", state.step,
                                    ", optimizer_step ", state.optimizer_step, ", epoch ",
                                    state.epoch, ", position ", state.position, ", batch_size ",
                                    state.batch_size, ", dataset_size ", state.dataset_size));
  }
  if (state.dataset_size > 0 && state.position > state.dataset_size) {
    problems.push_back(absl::StrCat("data position ", state.position, " is past the dataset's ",
                                    state.dataset_size, " samples"));
  }
  if (!state.loss_scaler.is_null()) {
    absl::StatusOr<LossScaler> scaler = LossScaler::FromJson(state.loss_scaler);
    if (!scaler.ok()) {
      problems.push_back(std::string(scaler.status().message()));
    } else if (state.step != state.optimizer_step + scaler->skipped_steps()) {
      problems.push_back(absl::StrCat("step ", state.step, " is not the optimizer's ",
                                      state.optimizer_step, " updates plus the loss scaler's ",
                                      scaler->skipped_steps(), " skipped steps"));
    }
  } else if (state.optimizer_step > state.step) {
    problems.push_back(
        absl::StrCat("optimizer_step ", state.optimizer_step, " is larger than step ", state.step));
  }
  if (!state.extra.is_object()) problems.push_back("the state's 'extra' must be a JSON object");
}

}  // namespace checkpoint_internal

namespace {

// What --resume takes from the state besides the counters, checked as
// --resume uses it, so that a checkpoint that verifies also resumes: the
// loss a known kind, the output a graph output, the input a graph input
// (or "" for the only one), the data a --data form (or "", not
// recorded), and the extra
// entries (rng, tf32, ignore_index, freeze, train_only) well formed.
void CheckResumeSettings(const Checkpoint& checkpoint, std::vector<std::string>& problems) {
  const TrainingState& state = checkpoint.state;
  const Graph& graph = *checkpoint.model.graph;
  auto names = [](const std::vector<Value*>& values) {
    std::vector<std::string> result;
    for (const Value* value : values) result.push_back(value->name());
    return result;
  };
  const std::vector<std::string> outputs = names(graph.outputs());
  if (std::find(outputs.begin(), outputs.end(), state.output) == outputs.end()) {
    problems.push_back(absl::StrCat("the state's output ", Quoted(state.output),
                                    " is not a model output (", absl::StrJoin(outputs, ", "),
                                    ")"));
  }
  const std::vector<std::string> inputs = names(graph.inputs());
  if (!state.input.empty() &&
      std::find(inputs.begin(), inputs.end(), state.input) == inputs.end()) {
    problems.push_back(absl::StrCat("the state's input ", Quoted(state.input),
                                    " is not a model input (", absl::StrJoin(inputs, ", "), ")"));
  }
}

// The record checks of FindCheckpointInconsistencies.
void CheckRecord(const Checkpoint& checkpoint, std::vector<std::string>& problems,
                 std::vector<std::string>* notes) {
  const auto& record = checkpoint.record;
  const Policy& policy = checkpoint.policy;
  const std::string* recorded_seal = FindEntry(record, kCheckpointRecordDigestKey);
  const std::string seal = RecordDigest(record);
  if (recorded_seal == nullptr || *recorded_seal != seal) {
    problems.push_back(absl::StrCat(
        "the record digest does not match: a castor.checkpoint.* entry was edited after the "
        "checkpoint was written (recorded ",
        recorded_seal ? *recorded_seal : "nothing", ", computed ", seal, ")"));
  }
  const std::string digest = policy.Digest();
  const std::string* recorded_digest = FindEntry(record, kCheckpointPolicyDigestKey);
  if (recorded_digest == nullptr || *recorded_digest != digest) {
    problems.push_back(absl::StrCat("the policy was modified: the recorded policy digest is ",
                                    recorded_digest ? *recorded_digest : "missing",
                                    " but the recorded policy (", kCheckpointPolicyKey, ", name ",
                                    Quoted(policy.name()), ") has digest ", digest));
  }
  auto compare = [&](const char* key, const std::string& expected, const char* what) {
    const std::string* value = FindEntry(record, key);
    if (value == nullptr || *value != expected) {
      problems.push_back(absl::StrCat(key, " is ", value ? Quoted(*value) : "missing",
                                      " but the recorded policy's ", what, " is ",
                                      Quoted(expected)));
    }
  };
  compare(kCheckpointPolicyNameKey, policy.name(), "name");
  compare(kCheckpointComputeDTypeKey, DTypeName(policy.compute_dtype()), "compute dtype");
  compare(kCheckpointVariableDTypeKey, DTypeName(policy.variable_dtype()), "variable dtype");

  absl::StatusOr<std::vector<std::string>> kept = KeptFloat32Nodes(checkpoint.model, policy);
  if (!kept.ok()) {
    problems.push_back(absl::StrCat(
        "autocast of the stored graph under the recorded policy fails: ", kept.status().message()));
    return;
  }
  if (*kept != checkpoint.kept_float32_nodes) {
    const std::set<std::string> now(kept->begin(), kept->end());
    const std::set<std::string> then(checkpoint.kept_float32_nodes.begin(),
                                     checkpoint.kept_float32_nodes.end());
    std::vector<std::string> differences;
    for (const std::string& name : then) {
      if (!now.contains(name))
        differences.push_back(absl::StrCat(Quoted(name), " recorded float32, now lower"));
    }
    for (const std::string& name : now) {
      if (!then.contains(name))
        differences.push_back(absl::StrCat(Quoted(name), " now float32, not recorded"));
    }
    if (differences.size() > 8) {
      const size_t more = differences.size() - 8;
      differences.resize(8);
      differences.push_back(absl::StrCat("and ", more, " more"));
    }
    std::string text = absl::StrCat(
        "the recorded nodes kept float32 (", checkpoint.kept_float32_nodes.size(),
        ") differ from what autocast under the recorded policy keeps (", kept->size(),
        "): ", differences.empty() ? "same set, different order" : absl::StrJoin(differences, "; "));
    // A checkpoint written before the training graph ran Conv in bfloat16
    // below opset 22 (com.castor Conv) recorded those nodes float32: what
    // autocast keeps without the training forms.
    absl::StatusOr<std::vector<std::string>> kept_without_training_forms =
        KeptFloat32NodesOfGraph(checkpoint.model, policy, /*training_graph_ops=*/false);
    const bool recorded_before_training_forms =
        kept_without_training_forms.ok() &&
        *kept_without_training_forms == checkpoint.kept_float32_nodes;
    if (recorded_before_training_forms) {
      if (notes != nullptr) {
        notes->push_back(absl::StrCat(
            text, " (recorded before castor's training graph ran Conv in ",
            DTypeName(policy.compute_dtype()), " at every opset as com.castor Conv, so this is "
            "expected; resuming computes those nodes in ", DTypeName(policy.compute_dtype()), ")"));
      }
    } else if (checkpoint.castor_version == kCastorVersion) {
      problems.push_back(std::move(text));
    } else if (notes != nullptr) {
      // Expected: another version's autocast pass; the record digest still
      // seals what was recorded.
      notes->push_back(absl::StrCat(text, " (written by castor ", checkpoint.castor_version,
                                    ", checked by castor ", kCastorVersion,
                                    ": the autocast pass changed in between, so this is "
                                    "expected; resuming converts under this version's pass)"));
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<std::string>> KeptFloat32Nodes(const Model& model,
                                                          const Policy& policy) {
  return KeptFloat32NodesOfGraph(model, policy, /*training_graph_ops=*/true);
}

absl::StatusOr<std::vector<std::string>> KeptFloat32NodesOfGraph(const Model& model,
                                                                 const Policy& policy,
                                                                 bool training_graph_ops) {
  CASTOR_ASSIGN_OR_RETURN(Model copy, CloneModel(model));
  CASTOR_RETURN_IF_ERROR(InferTypes(copy));
  AutocastOptions options;
  options.training_graph_ops = training_graph_ops;
  CASTOR_RETURN_IF_ERROR(RunAutocast(copy, policy, options).status());
  std::vector<std::string> kept;
  for (const Node* node : model.graph->nodes()) {
    const Node* converted = copy.graph->FindNode(node->name());
    if (converted == nullptr) continue;
    const AutocastRecord record = ReadAutocastRecord(*converted);
    if (record.inserted_cast.empty() && record.dtype == DTypeName(DType::kFloat32)) {
      kept.push_back(node->name());
    }
  }
  return kept;
}

std::vector<std::string> FindCheckpointInconsistencies(const Checkpoint& checkpoint,
                                                       std::vector<std::string>* notes) {
  std::vector<std::string> problems;
  CheckStateAgainstGraph(checkpoint, problems);
  if (!checkpoint.record.empty() && checkpoint.model.graph != nullptr) {
    CheckRecord(checkpoint, problems, notes);
    CheckResumeSettings(checkpoint, problems);
  }
  return problems;
}

std::vector<std::string> DescribePolicyDifferences(const Policy& recorded, const Policy& expected) {
  std::vector<std::string> lines;
  if (recorded.Digest() == expected.Digest()) return lines;
  if (recorded.name() != expected.name()) {
    lines.push_back(absl::StrCat("name: recorded ", Quoted(recorded.name()), ", expected ",
                                 Quoted(expected.name())));
  }
  if (recorded.compute_dtype() != expected.compute_dtype()) {
    lines.push_back(absl::StrCat("compute_dtype: recorded ", DTypeName(recorded.compute_dtype()),
                                 ", expected ", DTypeName(expected.compute_dtype())));
  }
  if (recorded.keep_io_types() != expected.keep_io_types()) {
    lines.push_back(absl::StrCat("keep_io_types: recorded ",
                                 recorded.keep_io_types() ? "true" : "false", ", expected ",
                                 expected.keep_io_types() ? "true" : "false"));
  }
  auto compare_maps = [&](const std::map<std::string, AutocastCategory>& a,
                          const std::map<std::string, AutocastCategory>& b, const char* field) {
    std::set<std::string> keys;
    for (const auto& [k, v] : a) keys.insert(k);
    for (const auto& [k, v] : b) keys.insert(k);
    for (const std::string& key : keys) {
      auto ia = a.find(key), ib = b.find(key);
      const std::string va = ia == a.end() ? "absent" : AutocastCategoryName(ia->second);
      const std::string vb = ib == b.end() ? "absent" : AutocastCategoryName(ib->second);
      if (va != vb) {
        lines.push_back(absl::StrCat(field, " ", key, ": recorded ", va, ", expected ", vb));
      }
    }
  };
  compare_maps(recorded.op_lists(), expected.op_lists(), "op_lists");
  compare_maps(recorded.op_overrides(), expected.op_overrides(), "op_overrides");
  auto describe_nodes = [](const Policy& p) {
    std::vector<std::string> rules;
    for (const NodeOverride& rule : p.node_overrides()) {
      rules.push_back(absl::StrCat(rule.Describe(), " -> ", AutocastCategoryName(rule.category)));
    }
    return rules;
  };
  if (describe_nodes(recorded) != describe_nodes(expected)) {
    lines.push_back(absl::StrCat("node_overrides: recorded [",
                                 absl::StrJoin(describe_nodes(recorded), "; "), "], expected [",
                                 absl::StrJoin(describe_nodes(expected), "; "), "]"));
  }
  auto describe_pins = [](const Policy& p) {
    std::vector<std::string> pins;
    for (const InputPin& pin : p.pins()) pins.push_back(absl::StrCat(pin.op, ":", pin.input));
    return pins;
  };
  if (describe_pins(recorded) != describe_pins(expected)) {
    lines.push_back(absl::StrCat("pins: recorded [", absl::StrJoin(describe_pins(recorded), ", "),
                                 "], expected [", absl::StrJoin(describe_pins(expected), ", "),
                                 "]"));
  }
  if (lines.empty()) {
    lines.push_back(
        absl::StrCat("digest: recorded ", recorded.Digest(), ", expected ", expected.Digest()));
  }
  return lines;
}

}  // namespace castor::training
