// Graph construction, use lists and topological ordering for the castor IR.
#include "graph/graph.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace castor {

std::string CanonicalDomain(const std::string& domain) {
  return domain == "ai.onnx" ? std::string() : domain;
}

namespace {

// Drops one node named `name` from a Graph's node-name counts.
void ForgetNodeName(absl::flat_hash_map<std::string, int>& counts, const std::string& name) {
  auto it = counts.find(name);
  if (it != counts.end() && --it->second <= 0) counts.erase(it);
}

}  // namespace

// ---------------------------------------------------------------- Node

void Node::set_name(std::string name) {
  if (graph_ != nullptr) {
    ForgetNodeName(graph_->node_name_counts_, name_);
    ++graph_->node_name_counts_[name];
  }
  name_ = std::move(name);
}

void Node::SetInput(int i, Value* value) {
  if (i >= num_inputs()) inputs_.resize(i + 1, nullptr);
  if (Value* old = inputs_[i]) {
    auto& uses = old->uses_;
    uses.erase(std::find(uses.begin(), uses.end(), Use{this, i}));
  }
  inputs_[i] = value;
  if (value) value->uses_.push_back(Use{this, i});
}

void Node::AddInput(Value* value) { SetInput(num_inputs(), value); }

void Node::AddImplicitInput(Value* value) {
  implicit_inputs_.push_back(value);
  value->uses_.push_back(Use{this, -1});
}

const Attribute* Node::attribute(const std::string& name) const {
  for (const Attribute& a : attributes_) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

void Node::SetAttribute(Attribute attribute) {
  for (Attribute& a : attributes_) {
    if (a.name == attribute.name) {
      a = std::move(attribute);
      return;
    }
  }
  attributes_.push_back(std::move(attribute));
}

void Node::RemoveAttribute(const std::string& name) {
  attributes_.erase(std::remove_if(attributes_.begin(), attributes_.end(),
                                   [&](const Attribute& a) { return a.name == name; }),
                    attributes_.end());
}

int64_t Node::GetInt(const std::string& name, int64_t default_value) const {
  const Attribute* a = attribute(name);
  return a && a->kind == AttrKind::kInt ? a->i : default_value;
}

float Node::GetFloat(const std::string& name, float default_value) const {
  const Attribute* a = attribute(name);
  return a && a->kind == AttrKind::kFloat ? a->f : default_value;
}

std::string Node::GetString(const std::string& name, const std::string& default_value) const {
  const Attribute* a = attribute(name);
  return a && a->kind == AttrKind::kString ? a->s : default_value;
}

std::vector<int64_t> Node::GetInts(const std::string& name,
                                   std::vector<int64_t> default_value) const {
  const Attribute* a = attribute(name);
  return a && a->kind == AttrKind::kInts ? a->ints : default_value;
}

void Node::SetMetadata(const std::string& key, const std::string& value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = value;
      return;
    }
  }
  metadata_.emplace_back(key, value);
}

const std::string* Node::FindMetadata(const std::string& key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Node::RemoveMetadata(const std::string& key) {
  std::erase_if(metadata_, [&](const auto& entry) { return entry.first == key; });
}

// ---------------------------------------------------------------- Graph

Value* Graph::NewValue(const std::string& name) {
  values_.push_back(std::unique_ptr<Value>(new Value(name)));
  Value* value = values_.back().get();
  values_by_name_[name] = value;
  return value;
}

absl::Status Graph::CheckNameFree(const std::string& name) const {
  if (name.empty()) return absl::InvalidArgumentError("a value needs a non-empty name");
  if (values_by_name_.contains(name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("value '", name, "' is defined more than once (SSA: one definition per value)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value*> Graph::AddInput(const std::string& name, DType dtype, Shape shape) {
  if (absl::Status s = CheckNameFree(name); !s.ok()) return s;
  Value* value = NewValue(name);
  value->dtype_ = dtype;
  value->shape_ = std::move(shape);
  value->is_graph_input_ = true;
  inputs_.push_back(value);
  return value;
}

absl::StatusOr<Value*> Graph::AddInitializer(const std::string& name, Tensor tensor) {
  if (absl::Status s = CheckNameFree(name); !s.ok()) return s;
  Value* value = NewValue(name);
  SetInitializerOfInput(value, std::move(tensor));
  return value;
}

void Graph::SetInitializerOfInput(Value* value, Tensor tensor) {
  value->dtype_ = tensor.dtype();
  value->shape_ = tensor.shape();
  if (!value->initializer_) initializers_.push_back(value);
  value->initializer_ = std::make_unique<Tensor>(std::move(tensor));
}

absl::StatusOr<Node*> Graph::AddNode(const std::string& op_type,
                                     const std::vector<Value*>& inputs,
                                     const std::vector<std::string>& output_names,
                                     const std::string& node_name, const std::string& domain) {
  std::vector<std::string> names = output_names;
  // Explicit names must be free and distinct from each other; fresh names
  // ("") must also avoid the explicit names of this same node.
  absl::flat_hash_set<std::string> explicit_names;
  for (const std::string& name : names) {
    if (name.empty()) continue;
    absl::Status s = CheckNameFree(name);
    // One name cannot clash with itself: the set is only built for several.
    if (s.ok() && names.size() > 1 && !explicit_names.insert(name).second) {
      s = absl::AlreadyExistsError(
          absl::StrCat("value '", name, "' is named twice among one node's outputs"));
    }
    if (!s.ok()) {
      return absl::AlreadyExistsError(absl::StrCat(s.message(), " (output of ", op_type,
                                                    " node '", node_name, "')"));
    }
  }
  for (std::string& name : names) {
    if (!name.empty()) continue;
    const std::string prefix = absl::StrCat(node_name.empty() ? op_type : node_name, "_out");
    do {
      name = UniqueName(prefix);
    } while (explicit_names.contains(name));
  }
  nodes_.push_back(std::unique_ptr<Node>(new Node()));
  Node* node = nodes_.back().get();
  node->graph_ = this;
  node->op_type_ = op_type;
  node->domain_ = CanonicalDomain(domain);
  node->name_ = node_name;
  ++node_name_counts_[node_name];
  for (Value* input : inputs) node->AddInput(input);
  for (size_t k = 0; k < names.size(); ++k) {
    Value* out = NewValue(names[k]);
    out->producer_ = node;
    out->producer_output_ = static_cast<int>(k);
    node->outputs_.push_back(out);
  }
  node_order_.push_back(node);
  ++next_node_id_;
  return node;
}

void Graph::AddOutput(Value* value) {
  outputs_.push_back(value);
  ++value->graph_output_count_;
}

void Graph::ClearOutputs() {
  for (Value* v : outputs_) --v->graph_output_count_;
  outputs_.clear();
}

void Graph::SetOutput(int i, Value* value) {
  --outputs_[i]->graph_output_count_;
  outputs_[i] = value;
  ++value->graph_output_count_;
}

Value* Graph::FindValue(const std::string& name) const {
  auto it = values_by_name_.find(name);
  return it == values_by_name_.end() ? nullptr : it->second;
}

Node* Graph::FindNode(const std::string& name) const {
  if (!node_name_counts_.contains(name)) return nullptr;
  for (Node* node : node_order_) {
    if (node->name() == name) return node;
  }
  return nullptr;
}

std::string Graph::UniqueName(const std::string& prefix) {
  auto taken = [&](const std::string& name) {
    return values_by_name_.contains(name) || node_name_counts_.contains(name);
  };
  // A prefix asked for the first time is itself the answer when free.
  auto [entry, first_time] = name_counters_.try_emplace(prefix, 0);
  if (first_time && !taken(prefix)) return prefix;
  int& counter = entry->second;
  std::string candidate;
  do {
    candidate = absl::StrCat(prefix, "_", ++counter);
  } while (taken(candidate));
  return candidate;
}

void Graph::ReplaceAllUsesWith(Value* from, Value* to) {
  if (from == to) return;
  const std::vector<Use> uses = from->uses_;
  for (const Use& use : uses) {
    if (use.index >= 0) {
      use.node->SetInput(use.index, to);
    } else {
      auto& implicit = use.node->implicit_inputs_;
      std::replace(implicit.begin(), implicit.end(), from, to);
      to->uses_.push_back(use);
    }
  }
  from->uses_.erase(std::remove_if(from->uses_.begin(), from->uses_.end(),
                                   [](const Use& u) { return u.index < 0; }),
                    from->uses_.end());
  for (size_t k = 0; k < outputs_.size(); ++k) {
    if (outputs_[k] == from) SetOutput(static_cast<int>(k), to);
  }
}

absl::Status Graph::RenameValue(Value* value, const std::string& name) {
  if (value->name_ == name) return absl::OkStatus();
  if (absl::Status s = CheckNameFree(name); !s.ok()) return s;
  values_by_name_.erase(value->name_);
  value->name_ = name;
  values_by_name_[name] = value;
  return absl::OkStatus();
}

absl::Status Graph::RemoveNode(Node* node) {
  for (Value* out : node->outputs_) {
    if (!out->uses_.empty() || out->is_graph_output()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot remove node '", node->name_, "' (", node->op_type_,
                       "): its output '", out->name_, "' is still used"));
    }
  }
  for (int i = 0; i < node->num_inputs(); ++i) node->SetInput(i, nullptr);
  for (Value* v : node->implicit_inputs_) {
    auto& uses = v->uses_;
    uses.erase(std::find(uses.begin(), uses.end(), Use{node, -1}));
  }
  for (Value* out : node->outputs_) {
    values_by_name_.erase(out->name_);
    values_.erase(std::find_if(values_.begin(), values_.end(),
                               [&](const auto& p) { return p.get() == out; }));
  }
  ForgetNodeName(node_name_counts_, node->name_);
  node_order_.erase(std::find(node_order_.begin(), node_order_.end(), node));
  nodes_.erase(std::find_if(nodes_.begin(), nodes_.end(),
                            [&](const auto& p) { return p.get() == node; }));
  return absl::OkStatus();
}

absl::Status Graph::RemoveInitializer(Value* value) {
  if (!value->uses_.empty() || value->is_graph_output() || value->producer_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove value '", value->name_, "': it is still used"));
  }
  initializers_.erase(std::remove(initializers_.begin(), initializers_.end(), value),
                      initializers_.end());
  inputs_.erase(std::remove(inputs_.begin(), inputs_.end(), value), inputs_.end());
  values_by_name_.erase(value->name_);
  values_.erase(std::find_if(values_.begin(), values_.end(),
                             [&](const auto& p) { return p.get() == value; }));
  return absl::OkStatus();
}

absl::Status Graph::ReorderNodes(std::vector<Node*> order) {
  if (order.size() != node_order_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ReorderNodes: ", order.size(),
                                                   " nodes given, the graph has ",
                                                   node_order_.size()));
  }
  absl::flat_hash_set<const Node*> seen;
  for (const Node* node : order) {
    if (node == nullptr || node->graph_ != this || !seen.insert(node).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ReorderNodes: node '", node ? node->name_ : "(null)",
          "' is repeated or not in this graph"));
    }
  }
  node_order_ = std::move(order);
  return absl::OkStatus();
}

absl::Status Graph::TopologicalSort() {
  // Kahn's algorithm, taking ready nodes in their current order so an
  // already-sorted graph keeps its order exactly.
  absl::flat_hash_map<const Node*, int> position;
  absl::flat_hash_map<const Node*, int> pending;  // unmet producer edges
  for (size_t k = 0; k < node_order_.size(); ++k) position[node_order_[k]] = static_cast<int>(k);
  auto for_each_input = [](const Node* node, auto&& fn) {
    for (Value* v : node->inputs_) {
      if (v) fn(v);
    }
    for (Value* v : node->implicit_inputs_) fn(v);
  };
  for (Node* node : node_order_) {
    int count = 0;
    for_each_input(node, [&](Value* v) {
      if (v->producer_) ++count;
    });
    pending[node] = count;
  }
  // Min-heap on original position keeps the result stable.
  std::vector<std::pair<int, Node*>> ready;
  auto push = [&](Node* n) {
    ready.emplace_back(-position[n], n);
    std::push_heap(ready.begin(), ready.end());
  };
  for (Node* node : node_order_) {
    if (pending[node] == 0) push(node);
  }
  std::vector<Node*> order;
  order.reserve(node_order_.size());
  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end());
    Node* node = ready.back().second;
    ready.pop_back();
    order.push_back(node);
    for (Value* out : node->outputs_) {
      for (const Use& use : out->uses_) {
        if (--pending[use.node] == 0) push(use.node);
      }
    }
  }
  if (order.size() != node_order_.size()) {
    // Every unplaced node waits on an unplaced producer, so walking back
    // through unplaced producers from any of them must revisit a node: that
    // node is on a cycle (a node merely downstream of a cycle is not named).
    Node* node = nullptr;
    for (Node* n : node_order_) {
      if (pending[n] > 0) {
        node = n;
        break;
      }
    }
    absl::flat_hash_set<const Node*> visited;
    while (visited.insert(node).second) {
      Node* next = nullptr;
      const Value* foreign = nullptr;  // produced by a node not in this graph
      for_each_input(node, [&](Value* v) {
        if (!v->producer_ || next) return;
        auto it = pending.find(v->producer_);
        if (it == pending.end()) {
          foreign = v;
        } else if (it->second > 0) {
          next = v->producer_;
        }
      });
      if (!next) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node '", node->name_, "' (", node->op_type_, ") reads value '",
            foreign ? foreign->name_ : std::string("?"), "' that no node of this graph defines"));
      }
      node = next;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "graph has a cycle through node '", node->name_, "' (", node->op_type_, ")"));
  }
  node_order_ = std::move(order);
  return absl::OkStatus();
}

// ---------------------------------------------------------------- Model

int64_t Model::OpsetVersion(const std::string& domain) const {
  const std::string canonical = CanonicalDomain(domain);
  for (const OpsetImport& op : opset_imports) {
    if (CanonicalDomain(op.domain) == canonical) return op.version;
  }
  return 0;
}

const std::string* Model::FindMetadata(const std::string& key) const {
  for (const auto& [k, v] : metadata_props) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Model::SetMetadata(const std::string& key, const std::string& value) {
  for (auto& [k, v] : metadata_props) {
    if (k == key) {
      v = value;
      return;
    }
  }
  metadata_props.emplace_back(key, value);
}

}  // namespace castor
