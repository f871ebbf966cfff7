// If and Loop (graph/ops/control_flow.cc): the test models in tests/data
// (written by tests/data/generate_subgraph_models.py) load, infer and verify;
// body types are inferred even where the body declares none; malformed
// bodies give errors naming the node; autocast keeps the subgraph nodes and
// the outer values their bodies read in float32 while the MatMuls around
// them go float16; the executor refuses them by name.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/executor.h"
#include "graph/onnx_io.h"
#include "graph/op_registry.h"
#include "graph/shape_inference.h"
#include "passes/autocast.h"
#include "passes/model_loader.h"
#include "passes/policy.h"
#include "passes/verifier.h"

namespace castor {
namespace {

using ::testing::HasSubstr;

std::string DataPath(const std::string& name) {
  return std::string(CASTOR_SOURCE_DIR) + "/tests/data/" + name;
}

onnx::ModelProto ReadProto(const std::string& name) {
  absl::StatusOr<Model> model = LoadModel(DataPath(name));
  EXPECT_TRUE(model.ok()) << model.status();
  absl::StatusOr<onnx::ModelProto> proto = ExportModel(*model);
  EXPECT_TRUE(proto.ok()) << proto.status();
  return *proto;
}

// Imports `proto` and runs type inference; the first error, or OK.
absl::StatusOr<Model> ImportAndInfer(const onnx::ModelProto& proto) {
  absl::StatusOr<Model> model = ImportModel(proto, "", "test model");
  if (!model.ok()) return model.status();
  if (absl::Status s = InferTypes(*model); !s.ok()) return s;
  if (absl::Status s = VerifyModel(*model); !s.ok()) return s;
  return model;
}

onnx::NodeProto* FindNodeProto(onnx::GraphProto* graph, const std::string& name) {
  for (onnx::NodeProto& node : *graph->mutable_node()) {
    if (node.name() == name) return &node;
  }
  ADD_FAILURE() << "no node " << name;
  return nullptr;
}

onnx::GraphProto* GraphAttribute(onnx::NodeProto* node, const std::string& name) {
  for (onnx::AttributeProto& attribute : *node->mutable_attribute()) {
    if (attribute.name() == name) return attribute.mutable_g();
  }
  ADD_FAILURE() << "no attribute " << name;
  return nullptr;
}

// The body of loop_model.onnx's Loop node, to edit.
onnx::GraphProto* LoopBody(onnx::ModelProto& proto) {
  return GraphAttribute(FindNodeProto(proto.mutable_graph(), "loop_node"), "body");
}

void ExpectType(const Value* value, DType dtype, const std::string& shape) {
  ASSERT_NE(value, nullptr);
  EXPECT_EQ(value->dtype(), dtype) << value->name();
  EXPECT_EQ(value->shape().ToString(), shape) << value->name();
}

// ---- registry --------------------------------------------------------------

TEST(ControlFlowRegistry, IfAndLoopAreRegisteredForEverySupportedOpset) {
  for (const char* op : {"If", "Loop"}) {
    const OpDef* def = OpRegistry::Global().Find("", op);
    ASSERT_NE(def, nullptr) << op;
    EXPECT_LE(def->min_opset, kMinOnnxOpset) << op;
    EXPECT_EQ(def->max_opset, kMaxOnnxOpset) << op;
    EXPECT_NE(def->autocast, AutocastCategory::kUnset) << op;
    EXPECT_FALSE(def->autocast_source.empty()) << op;
  }
}

// ---- the checked-in models ---------------------------------------------------

TEST(ControlFlowLoad, IfModelLoadsAndChecks) {
  absl::StatusOr<Model> model = LoadAndCheckModel(DataPath("if_model.onnx"));
  ASSERT_TRUE(model.ok()) << model.status();
  const Node* if_node = model->graph->FindNode("if_node");
  ASSERT_NE(if_node, nullptr);
  EXPECT_EQ(if_node->op_type(), "If");
  std::vector<std::string> implicit;
  for (const Value* v : if_node->implicit_inputs()) implicit.push_back(v->name());
  EXPECT_EQ(implicit, (std::vector<std::string>{"r", "shift"}));
  ExpectType(if_node->output(0), DType::kFloat32, "[2,4]");
  ExpectType(model->graph->FindValue("y"), DType::kFloat32, "[2,3]");
}

TEST(ControlFlowLoad, LoopModelLoadsAndChecks) {
  absl::StatusOr<Model> model = LoadAndCheckModel(DataPath("loop_model.onnx"));
  ASSERT_TRUE(model.ok()) << model.status();
  const Node* loop = model->graph->FindNode("loop_node");
  ASSERT_NE(loop, nullptr);
  std::vector<std::string> implicit;
  for (const Value* v : loop->implicit_inputs()) implicit.push_back(v->name());
  EXPECT_EQ(implicit, (std::vector<std::string>{"r", "half"}));
  ExpectType(loop->output(0), DType::kFloat32, "[2,4]");
  // The scan output gains a leading iteration dim of unknown size.
  ExpectType(loop->output(1), DType::kFloat32, "[?,2,4]");
  ExpectType(model->graph->FindValue("y"), DType::kFloat32, "[2,3]");
}

// ---- body inference ------------------------------------------------------------

TEST(ControlFlowInference, IfBranchTypesAreInferredWhenUndeclared) {
  onnx::ModelProto proto = ReadProto("if_model.onnx");
  onnx::NodeProto* if_node = FindNodeProto(proto.mutable_graph(), "if_node");
  for (const char* branch : {"then_branch", "else_branch"}) {
    GraphAttribute(if_node, branch)->mutable_output(0)->clear_type();
  }
  // The If output's declared type goes too (value_info written by export).
  for (onnx::ValueInfoProto& info : *proto.mutable_graph()->mutable_value_info()) {
    if (info.name() == "chosen") info.clear_type();
  }
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectType(model->graph->FindValue("chosen"), DType::kFloat32, "[2,4]");
}

TEST(ControlFlowInference, IfShapesOfDifferentBranchesAreMerged) {
  onnx::ModelProto proto = ReadProto("if_model.onnx");
  onnx::NodeProto* if_node = FindNodeProto(proto.mutable_graph(), "if_node");
  // then: Concat(r, r) on axis 0 -> [4,4]; else stays [2,4]: merged [?,4].
  onnx::GraphProto* then_branch = GraphAttribute(if_node, "then_branch");
  onnx::NodeProto* concat = then_branch->mutable_node(0);
  concat->set_op_type("Concat");
  concat->set_input(1, "r");
  onnx::AttributeProto* axis = concat->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(0);
  then_branch->mutable_output(0)->clear_type();
  // MatMul after reads the If output, whose first dim is now unknown.
  for (onnx::ValueInfoProto& info : *proto.mutable_graph()->mutable_value_info()) {
    info.clear_type();
  }
  proto.mutable_graph()->mutable_output(0)->clear_type();
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectType(model->graph->FindValue("chosen"), DType::kFloat32, "[?,4]");
  ExpectType(model->graph->FindValue("y"), DType::kFloat32, "[?,3]");

  // Branches of different ranks: unknown rank.
  GraphAttribute(FindNodeProto(proto.mutable_graph(), "if_node"), "else_branch")
      ->mutable_output(0)
      ->set_name("shift");
  model = ImportAndInfer(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectType(model->graph->FindValue("chosen"), DType::kFloat32, "?");
}

TEST(ControlFlowInference, NestedIfReadsValuesTwoScopesUp) {
  onnx::ModelProto proto = ReadProto("if_model.onnx");
  onnx::NodeProto* if_node = FindNodeProto(proto.mutable_graph(), "if_node");
  // else_branch becomes If(flag) { r * shift } else { r + shift }.
  onnx::GraphProto* else_branch = GraphAttribute(if_node, "else_branch");
  onnx::GraphProto then_copy = *GraphAttribute(if_node, "then_branch");
  onnx::GraphProto else_copy = *else_branch;
  else_branch->clear_node();
  onnx::NodeProto* inner = else_branch->add_node();
  inner->set_op_type("If");
  inner->set_name("inner_if");
  inner->add_input("flag");
  inner->add_output("else_out");
  for (auto [name, body] : {std::pair<const char*, onnx::GraphProto*>{"then_branch", &else_copy},
                            std::pair<const char*, onnx::GraphProto*>{"else_branch", &then_copy}}) {
    onnx::AttributeProto* attribute = inner->add_attribute();
    attribute->set_name(name);
    attribute->set_type(onnx::AttributeProto::GRAPH);
    *attribute->mutable_g() = *body;
    attribute->mutable_g()->mutable_output(0)->clear_type();
  }
  else_branch->mutable_output(0)->clear_type();
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectType(model->graph->FindValue("chosen"), DType::kFloat32, "[2,4]");

  // An error inside the inner body names both nodes.
  inner->mutable_attribute(0)->mutable_g()->mutable_node(0)->set_op_type("MatMul");
  inner->mutable_attribute(0)->mutable_g()->mutable_node(0)->set_input(1, "flag");
  absl::StatusOr<Model> bad = ImportAndInfer(proto);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("If node 'if_node': attribute 'else_branch'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("If node 'inner_if': attribute 'then_branch'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("else_mul"));
}

TEST(ControlFlowInference, LoopCarriedShapeThatGrowsIsWidened) {
  onnx::ModelProto proto = ReadProto("loop_model.onnx");
  onnx::NodeProto* loop = FindNodeProto(proto.mutable_graph(), "loop_node");
  onnx::GraphProto* body = GraphAttribute(loop, "body");
  // v_out = Concat(v_in, r) on axis 0: [2,4] -> [4,4] -> ..., so [?,4].
  onnx::NodeProto* mul = body->mutable_node(2);
  mul->set_op_type("Concat");
  mul->set_input(0, "v_in");
  mul->set_input(1, "r");
  onnx::AttributeProto* axis = mul->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(0);
  body->mutable_input(2)->clear_type();  // typed from the node's input h
  body->mutable_output(1)->clear_type();
  body->mutable_output(2)->clear_type();
  for (onnx::ValueInfoProto& info : *proto.mutable_graph()->mutable_value_info()) {
    info.clear_type();
  }
  for (onnx::ValueInfoProto& info : *proto.mutable_graph()->mutable_output()) info.clear_type();
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectType(model->graph->FindValue("v_final"), DType::kFloat32, "[?,4]");
  ExpectType(model->graph->FindValue("steps"), DType::kFloat32, "[?,?,4]");
  ExpectType(model->graph->FindValue("y"), DType::kFloat32, "[?,3]");
}

// ---- errors naming the node ------------------------------------------------------

TEST(ControlFlowErrors, IfBranchesWithDifferentDTypes) {
  onnx::ModelProto proto = ReadProto("if_model.onnx");
  onnx::NodeProto* if_node = FindNodeProto(proto.mutable_graph(), "if_node");
  onnx::GraphProto* else_branch = GraphAttribute(if_node, "else_branch");
  onnx::NodeProto* cast = else_branch->add_node();
  cast->set_op_type("Cast");
  cast->set_name("else_cast");
  cast->add_input("else_out");
  cast->add_output("else_half");
  onnx::AttributeProto* to = cast->add_attribute();
  to->set_name("to");
  to->set_type(onnx::AttributeProto::INT);
  to->set_i(onnx::TensorProto::FLOAT16);
  else_branch->mutable_output(0)->set_name("else_half");
  else_branch->mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(
      onnx::TensorProto::FLOAT16);
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().message(),
            "If node 'if_node': output 0: then_branch output 'then_out' is float32 but "
            "else_branch output 'else_half' is float16; the branches must agree on each dtype");
}

TEST(ControlFlowErrors, IfBranchesWithDifferentOutputCounts) {
  onnx::ModelProto proto = ReadProto("if_model.onnx");
  onnx::NodeProto* if_node = FindNodeProto(proto.mutable_graph(), "if_node");
  *GraphAttribute(if_node, "then_branch")->add_output() =
      GraphAttribute(if_node, "then_branch")->output(0);
  GraphAttribute(if_node, "then_branch")->mutable_output(1)->set_name("r");
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(),
              HasSubstr("If node 'if_node': then_branch has 2 output(s) but else_branch has 1"));
}

TEST(ControlFlowErrors, IfBranchDeclaringAWrongType) {
  onnx::ModelProto proto = ReadProto("if_model.onnx");
  onnx::NodeProto* if_node = FindNodeProto(proto.mutable_graph(), "if_node");
  GraphAttribute(if_node, "then_branch")
      ->mutable_output(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->set_elem_type(onnx::TensorProto::DOUBLE);
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(),
              HasSubstr("If node 'if_node': attribute 'then_branch': Add node 'then_add' output "
                        "'then_out': declared dtype float64 but inferred float32"));
}

TEST(ControlFlowErrors, IfConditionMustBeBool) {
  onnx::ModelProto proto = ReadProto("if_model.onnx");
  proto.mutable_graph()->mutable_input(1)->mutable_type()->mutable_tensor_type()->set_elem_type(
      onnx::TensorProto::FLOAT);
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(),
              HasSubstr("If node 'if_node': input 0 has dtype float32; expected one of bool"));
}

TEST(ControlFlowErrors, LoopBodyWithTooFewOutputs) {
  onnx::ModelProto proto = ReadProto("loop_model.onnx");
  onnx::GraphProto* body = LoopBody(proto);
  body->mutable_output()->DeleteSubrange(1, 2);  // only cond is left
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().message(),
            "Loop node 'loop_node': attribute 'body' has 1 output(s); expected at least 2 "
            "(cond, then one per loop-carried value: the node has 1; then any scan outputs)");
}

TEST(ControlFlowErrors, LoopWithMoreOutputsThanItsBodyGives) {
  onnx::ModelProto proto = ReadProto("loop_model.onnx");
  onnx::GraphProto* body = LoopBody(proto);
  body->mutable_output()->DeleteSubrange(2, 1);  // the scan output goes; the node keeps 'steps'
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().message(),
            "Loop node 'loop_node': the node has 2 outputs but its body gives 1 loop-carried "
            "value(s) and 0 scan output(s)");
}

TEST(ControlFlowErrors, LoopBodyWithWrongInputCount) {
  onnx::ModelProto proto = ReadProto("loop_model.onnx");
  onnx::GraphProto* body = LoopBody(proto);
  *body->add_input() = body->input(2);
  body->mutable_input(3)->set_name("extra");
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(),
              HasSubstr("Loop node 'loop_node': attribute 'body' has 4 input(s); expected 3"));
}

TEST(ControlFlowErrors, LoopCarriedValueChangingDType) {
  onnx::ModelProto proto = ReadProto("loop_model.onnx");
  onnx::GraphProto* body = LoopBody(proto);
  onnx::NodeProto* cast = body->add_node();
  cast->set_op_type("Cast");
  cast->set_name("body_cast");
  cast->add_input("v_out");
  cast->add_output("v_double");
  onnx::AttributeProto* to = cast->add_attribute();
  to->set_name("to");
  to->set_type(onnx::AttributeProto::INT);
  to->set_i(onnx::TensorProto::DOUBLE);
  body->mutable_output(1)->set_name("v_double");
  body->mutable_output(1)->clear_type();
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().message(),
            "Loop node 'loop_node': body output 1 'v_double' is float64 but loop-carried input 2 "
            "'h' is float32; a loop-carried value keeps its dtype");
}

TEST(ControlFlowErrors, LoopTripCountMustBeInt64) {
  onnx::ModelProto proto = ReadProto("loop_model.onnx");
  for (onnx::TensorProto& init : *proto.mutable_graph()->mutable_initializer()) {
    if (init.name() != "trip_count") continue;
    init.set_data_type(onnx::TensorProto::INT32);
    init.set_raw_data(std::string("\x03\x00\x00\x00", 4));
  }
  absl::StatusOr<Model> model = ImportAndInfer(proto);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(),
              HasSubstr("Loop node 'loop_node': input 0 has dtype int32; expected one of int64"));
}

// ---- autocast ------------------------------------------------------------------

const std::string* NodeDType(const Model& model, const std::string& node) {
  const Node* n = model.graph->FindNode(node);
  EXPECT_NE(n, nullptr) << node;
  return n ? n->FindMetadata(kNodeDTypeKey) : nullptr;
}

// The subgraph node is float32 or untouched, and every float value it reads
// (inputs and implicit inputs) is float32.
void ExpectSubgraphNodeStaysFloat32(const Model& model, const std::string& name) {
  const Node* node = model.graph->FindNode(name);
  ASSERT_NE(node, nullptr);
  if (const std::string* dtype = node->FindMetadata(kNodeDTypeKey)) {
    EXPECT_EQ(*dtype, "float32") << name;
  }
  for (const Value* in : node->inputs()) {
    if (in && IsFloatingPoint(in->dtype())) {
      EXPECT_EQ(in->dtype(), DType::kFloat32) << name << " input " << in->name();
    }
  }
  for (const Value* in : node->implicit_inputs()) {
    EXPECT_EQ(in->dtype(), DType::kFloat32) << name << " reads " << in->name();
  }
  for (const Value* out : node->outputs()) {
    EXPECT_EQ(out->dtype(), DType::kFloat32) << name << " output " << out->name();
  }
}

void ExpectMentions(const AutocastReport& report, const std::string& text) {
  bool found = false;
  for (const std::string& note : report.notes) found |= note.find(text) != std::string::npos;
  EXPECT_TRUE(found) << "no note mentions " << text;
}

TEST(ControlFlowAutocast, IfModelUnderMixedFloat16) {
  absl::StatusOr<Model> model = LoadAndCheckModel(DataPath("if_model.onnx"));
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<Policy> policy = Policy::Builtin("mixed_float16");
  ASSERT_TRUE(policy.ok()) << policy.status();
  absl::StatusOr<AutocastReport> report = RunAutocast(*model, *policy);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_NE(NodeDType(*model, "matmul_before"), nullptr);
  EXPECT_EQ(*NodeDType(*model, "matmul_before"), "float16");
  ASSERT_NE(NodeDType(*model, "matmul_after"), nullptr);
  EXPECT_EQ(*NodeDType(*model, "matmul_after"), "float16");
  // Relu's output is read inside the branches: it stays float32.
  ASSERT_NE(NodeDType(*model, "relu"), nullptr);
  EXPECT_EQ(*NodeDType(*model, "relu"), "float32");
  ExpectSubgraphNodeStaysFloat32(*model, "if_node");
  ExpectMentions(*report, "If node 'if_node': subgraph left in float32");
  EXPECT_TRUE(VerifyModel(*model).ok()) << VerifyModel(*model);
}

TEST(ControlFlowAutocast, LoopModelUnderMixedFloat16) {
  absl::StatusOr<Model> model = LoadAndCheckModel(DataPath("loop_model.onnx"));
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<Policy> policy = Policy::Builtin("mixed_float16");
  ASSERT_TRUE(policy.ok()) << policy.status();
  absl::StatusOr<AutocastReport> report = RunAutocast(*model, *policy);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_NE(NodeDType(*model, "matmul_before"), nullptr);
  EXPECT_EQ(*NodeDType(*model, "matmul_before"), "float16");
  ASSERT_NE(NodeDType(*model, "matmul_after"), nullptr);
  EXPECT_EQ(*NodeDType(*model, "matmul_after"), "float16");
  // The loop-carried initial value h is float16 now; the Loop reads a
  // float32 Cast of it.
  EXPECT_EQ(model->graph->FindValue("h")->dtype(), DType::kFloat16);
  ExpectSubgraphNodeStaysFloat32(*model, "loop_node");
  ExpectMentions(*report, "Loop node 'loop_node': subgraph left in float32");
  EXPECT_TRUE(VerifyModel(*model).ok()) << VerifyModel(*model);
  // The converted model round-trips through ONNX export and import.
  absl::StatusOr<onnx::ModelProto> exported = ExportModel(*model);
  ASSERT_TRUE(exported.ok()) << exported.status();
  absl::StatusOr<Model> again = ImportAndInfer(*exported);
  EXPECT_TRUE(again.ok()) << again.status();
}

// ---- execution ----------------------------------------------------------------

TEST(ControlFlowExecution, CpuExecutorRefusesSubgraphNodesByName) {
  absl::StatusOr<Model> model = LoadAndCheckModel(DataPath("loop_model.onnx"));
  ASSERT_TRUE(model.ok()) << model.status();
  CpuBackend backend;
  absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Create(*model, backend);
  ASSERT_FALSE(executor.ok());
  EXPECT_THAT(executor.status().message(),
              HasSubstr("Loop node 'loop_node': ops with subgraphs (If, Loop, Scan) are not "
                        "supported by the executor"));
}

}  // namespace
}  // namespace castor
