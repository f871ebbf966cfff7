// The castor IR: Value, Node, Graph and Model, in SSA form.
//
// Every Value has exactly one definition: a graph input, an initializer (a
// float32 master weight, say), or one output of one Node. Values carry a
// dtype and a possibly symbolic shape. Nodes point at their input Values
// (nullptr marks an omitted optional input, ONNX's empty name) and own their
// output Values; each Value knows its uses, so rewrites are local.
//
// The Graph owns all Nodes and Values. Its node list is kept in topological
// order by the passes (TopologicalSort restores it after insertions).
// Nodes with subgraph attributes (If, Loop, Scan) keep the bodies as
// serialized ONNX; the outer-scope values a body reads are recorded as the
// node's implicit inputs, so liveness and dead-code removal stay correct.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "graph/attribute.h"
#include "graph/dtype.h"
#include "graph/shape.h"
#include "graph/tensor.h"

namespace castor {

class Node;
class Graph;

// A consumer of a value: input slot `index` of `node`; index -1 means an
// implicit (subgraph) input.
struct Use {
  Node* node;
  int index;
  bool operator==(const Use& o) const { return node == o.node && index == o.index; }
};

class Value {
 public:
  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  void set_dtype(DType dtype) { dtype_ = dtype; }
  void set_shape(Shape shape) { shape_ = std::move(shape); }

  // The node that computes this value, or nullptr for graph inputs and
  // initializers.
  Node* producer() const { return producer_; }
  int producer_output() const { return producer_output_; }
  bool is_graph_input() const { return is_graph_input_; }
  bool is_graph_output() const { return graph_output_count_ > 0; }
  // The initializer's data, or nullptr. An initializer may also be a graph
  // input (ONNX's overridable default).
  const Tensor* initializer() const { return initializer_.get(); }
  Tensor* mutable_initializer() { return initializer_.get(); }

  const std::vector<Use>& uses() const { return uses_; }
  const std::string& doc_string() const { return doc_string_; }
  void set_doc_string(std::string doc) { doc_string_ = std::move(doc); }
  // True when the ONNX model listed this value in value_info (export keeps it).
  bool has_value_info() const { return has_value_info_; }
  void set_has_value_info(bool v) { has_value_info_ = v; }

 private:
  friend class Graph;
  friend class Node;
  Value(std::string name) : name_(std::move(name)) {}

  std::string name_;
  DType dtype_ = DType::kUndefined;
  Shape shape_;
  Node* producer_ = nullptr;
  int producer_output_ = -1;
  bool is_graph_input_ = false;
  int graph_output_count_ = 0;
  bool has_value_info_ = false;
  std::unique_ptr<Tensor> initializer_;
  std::vector<Use> uses_;
  std::string doc_string_;
};

class Node {
 public:
  const std::string& name() const { return name_; }
  const std::string& op_type() const { return op_type_; }
  // "" for the default ai.onnx domain.
  const std::string& domain() const { return domain_; }
  const std::string& doc_string() const { return doc_string_; }
  void set_name(std::string name);  // also updates the graph's node-name index
  // Moves the op to another domain (castor's training forms of ONNX ops
  // live in com.castor); the node keeps its inputs, outputs and attributes.
  void set_domain(std::string domain) { domain_ = std::move(domain); }
  void set_doc_string(std::string doc) { doc_string_ = std::move(doc); }

  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  const std::vector<Value*>& implicit_inputs() const { return implicit_inputs_; }
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  // Input `i`, or nullptr when omitted or beyond the last given input.
  Value* input(int i) const { return i < num_inputs() ? inputs_[i] : nullptr; }
  Value* output(int i) const { return i < num_outputs() ? outputs_[i] : nullptr; }

  void SetInput(int i, Value* value);  // grows the input list as needed
  void AddInput(Value* value);
  void AddImplicitInput(Value* value);

  // Attributes keep their import order (export round-trips it).
  const std::vector<Attribute>& attributes() const { return attributes_; }
  const Attribute* attribute(const std::string& name) const;
  bool has_attribute(const std::string& name) const { return attribute(name) != nullptr; }
  void SetAttribute(Attribute attribute);  // replaces one of the same name
  void RemoveAttribute(const std::string& name);
  // Typed reads with a default for absent attributes.
  int64_t GetInt(const std::string& name, int64_t default_value) const;
  float GetFloat(const std::string& name, float default_value) const;
  std::string GetString(const std::string& name, const std::string& default_value) const;
  std::vector<int64_t> GetInts(const std::string& name,
                               std::vector<int64_t> default_value = {}) const;

  // Free-form key/value annotations (provenance of autocast decisions, ...),
  // exported in ONNX's NodeProto.metadata_props where the IR version has it.
  const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }
  void SetMetadata(const std::string& key, const std::string& value);
  const std::string* FindMetadata(const std::string& key) const;
  void RemoveMetadata(const std::string& key);

  Graph* graph() const { return graph_; }

 private:
  friend class Graph;
  Node() = default;

  Graph* graph_ = nullptr;
  std::string name_;
  std::string op_type_;
  std::string domain_;
  std::string doc_string_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  std::vector<Value*> implicit_inputs_;
  std::vector<Attribute> attributes_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  const std::string& doc_string() const { return doc_string_; }
  void set_doc_string(std::string doc) { doc_string_ = std::move(doc); }

  // Definitions. Names must be unique in the graph; an error names the clash.
  absl::StatusOr<Value*> AddInput(const std::string& name, DType dtype, Shape shape);
  absl::StatusOr<Value*> AddInitializer(const std::string& name, Tensor tensor);
  // Turns an existing graph input into an input with a default (initializer).
  void SetInitializerOfInput(Value* input, Tensor tensor);
  // Appends a node; its outputs are new values with these names (which must
  // be unique; "" asks for a fresh name). Inputs may be nullptr (omitted).
  absl::StatusOr<Node*> AddNode(const std::string& op_type, const std::vector<Value*>& inputs,
                                const std::vector<std::string>& output_names,
                                const std::string& node_name = "",
                                const std::string& domain = "");
  void AddOutput(Value* value);
  void ClearOutputs();
  void SetOutput(int i, Value* value);

  // Graph inputs in order, including those with initializers (defaults).
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  // Initializers in import/creation order (whether or not they are inputs).
  const std::vector<Value*>& initializers() const { return initializers_; }
  // Nodes in their current order (topological after TopologicalSort).
  const std::vector<Node*>& nodes() const { return node_order_; }
  int num_nodes() const { return static_cast<int>(node_order_.size()); }

  Value* FindValue(const std::string& name) const;
  Node* FindNode(const std::string& name) const;  // by node name, linear
  // A name not yet used by any value or node: `prefix`, else `prefix_1`, ...
  std::string UniqueName(const std::string& prefix);

  // Points every use of `from` (node inputs, implicit inputs and graph
  // outputs) at `to`.
  void ReplaceAllUsesWith(Value* from, Value* to);
  // Gives `value` a new name, which must be free (a pass that folds a node
  // into its input hands the input the name a graph output must keep).
  absl::Status RenameValue(Value* value, const std::string& name);
  // Removes a node whose outputs have no uses and are not graph outputs.
  absl::Status RemoveNode(Node* node);
  // Removes an unused initializer or value without producer.
  absl::Status RemoveInitializer(Value* value);
  // Stable topological order (keeps the current order where it is already
  // valid). Fails, naming a node on the cycle, if the graph has a cycle or a
  // node reads a value that nothing defines.
  absl::Status TopologicalSort();
  // Replaces the node order by `order`, which must hold every node exactly
  // once (a pass that builds a topological order itself, placing inserted
  // nodes next to their readers, uses this instead of TopologicalSort).
  absl::Status ReorderNodes(std::vector<Node*> order);

 private:
  friend class Node;  // Node::set_name keeps node_name_counts_
  Value* NewValue(const std::string& name);
  absl::Status CheckNameFree(const std::string& name) const;

  std::string name_;
  std::string doc_string_;
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Node*> node_order_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  std::vector<Value*> initializers_;
  absl::flat_hash_map<std::string, Value*> values_by_name_;
  absl::flat_hash_map<std::string, int> name_counters_;
  // Node name -> number of nodes with that name, so UniqueName is O(1)
  // (kept by AddNode, RemoveNode and Node::set_name).
  absl::flat_hash_map<std::string, int> node_name_counts_;
  int64_t next_node_id_ = 0;
};

struct OpsetImport {
  std::string domain;  // "" for ai.onnx
  int64_t version = 0;
  bool operator==(const OpsetImport& o) const {
    return domain == o.domain && version == o.version;
  }
};

// A whole ONNX model: the main graph plus model-level metadata. Parts castor
// does not interpret (local functions, training_info) are kept as serialized
// protos so export writes them back unchanged.
struct Model {
  int64_t ir_version = 0;
  std::vector<OpsetImport> opset_imports;
  std::string producer_name;
  std::string producer_version;
  std::string domain;
  int64_t model_version = 0;
  std::string doc_string;
  std::vector<std::pair<std::string, std::string>> metadata_props;
  std::vector<std::string> serialized_functions;      // onnx.FunctionProto
  std::vector<std::string> serialized_training_info;  // onnx.TrainingInfoProto
  std::unique_ptr<Graph> graph = std::make_unique<Graph>();

  // Opset version imported for `domain` ("" and "ai.onnx" are the same), or
  // 0 when the model does not import it.
  int64_t OpsetVersion(const std::string& domain) const;
  const std::string* FindMetadata(const std::string& key) const;
  void SetMetadata(const std::string& key, const std::string& value);
};

// The canonical domain name: "ai.onnx" -> "".
std::string CanonicalDomain(const std::string& domain);

}  // namespace castor
