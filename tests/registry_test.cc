// The op registry's completeness: every op the project promises is
// registered with a schema and inference, and the slots later work fills
// (autocast category, gradient rule) are tracked in tests/registry_gaps.txt.
// The test fails both when a gap is filled without updating that file and
// when a new op arrives with unlisted gaps, so the list is always true.
#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "graph/op_registry.h"
#include "onnx/defs/schema.h"

namespace castor {
namespace {

// Every op type in ../shared/conformance (see its README) plus the extras
// the Foundation issue names.
const char* const kRequiredOps[] = {
    "Add", "Sub", "Mul", "Div", "Neg", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Gelu", "Erf",
    "Exp", "Log", "Sqrt", "Pow", "Reciprocal", "Abs", "MatMul", "Gemm", "Conv", "ConvTranspose",
    "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization", "LayerNormalization",
    "Softmax", "LogSoftmax", "Reshape", "Flatten", "Transpose", "Concat", "Split", "Slice",
    "Squeeze", "Unsqueeze", "Gather", "ReduceMean", "ReduceSum", "ReduceMax", "Cast", "Identity",
    "Dropout", "Where", "Equal", "Expand", "Shape", "Constant", "SoftmaxCrossEntropyLoss",
    "NegativeLogLikelihoodLoss", "Clip", "Max", "Min", "Sum"};
const char* const kRequiredTrainingOps[] = {"Adagrad", "Adam", "Momentum"};

std::string QualifiedName(const OpDef& def) {
  return def.domain.empty() ? def.op_type : def.domain + "." + def.op_type;
}

TEST(OpRegistry, HasEveryRequiredOp) {
  const OpRegistry& registry = OpRegistry::Global();
  for (const char* op : kRequiredOps) {
    EXPECT_NE(registry.Find("", op), nullptr) << op;
    EXPECT_NE(registry.Find("ai.onnx", op), nullptr) << op << " via the ai.onnx spelling";
  }
  for (const char* op : kRequiredTrainingOps) {
    EXPECT_NE(registry.Find(kTrainingDomain, op), nullptr) << op;
  }
  EXPECT_EQ(registry.Find("", "NoSuchOp"), nullptr);
}

TEST(OpRegistry, EveryOpHasSchemaAndInference) {
  for (const OpDef* def : OpRegistry::Global().All()) {
    SCOPED_TRACE(QualifiedName(*def));
    EXPECT_TRUE(static_cast<bool>(def->infer));
    EXPECT_FALSE(def->summary.empty());
    EXPECT_LE(def->min_inputs, def->max_inputs);
    EXPECT_LE(def->min_outputs, def->max_outputs);
    EXPECT_GE(def->min_outputs, 1);
    EXPECT_LE(def->min_opset, def->max_opset);
    EXPECT_LE(def->max_opset, def->domain.empty() ? kMaxOnnxOpset : 1);
    std::set<std::string> names;
    for (const AttrSpec& spec : def->attributes) {
      EXPECT_TRUE(names.insert(spec.name).second) << "attribute listed twice: " << spec.name;
    }
  }
}

// "<op> autocast" / "<op> gradient" for each unfilled slot, sorted.
std::set<std::string> ActualGaps() {
  std::set<std::string> gaps;
  for (const OpDef* def : OpRegistry::Global().All()) {
    if (def->autocast == AutocastCategory::kUnset) gaps.insert(QualifiedName(*def) + " autocast");
    if (!def->gradient && def->no_gradient_reason.empty()) {
      gaps.insert(QualifiedName(*def) + " gradient");
    }
  }
  return gaps;
}

std::set<std::string> ListedGaps() {
  std::ifstream in(std::string(CASTOR_SOURCE_DIR) + "/tests/registry_gaps.txt");
  EXPECT_TRUE(in.good()) << "cannot read tests/registry_gaps.txt";
  std::set<std::string> gaps;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    gaps.insert(line.substr(0, line.find("  ")));  // text after two spaces is a comment
  }
  return gaps;
}

// The verifier refuses an attribute an op's schema does not list (ONNX's
// checker does the same), so every attribute ONNX defines for an op must be
// in castor's schema, or a valid model using it would be refused. Checked
// against the ONNX library's schemas (libonnx-dev: opsets up to its newest,
// 17 for ONNX 1.12) at every opset castor registers the op for.
TEST(OpRegistry, SchemasListEveryAttributeOnnxDefines) {
  const int max_known = onnx::OpSchemaRegistry::DomainToVersionRange::Instance()
                            .Map()
                            .at(onnx::ONNX_DOMAIN)
                            .second;
  int checked = 0;
  for (const OpDef* def : OpRegistry::Global().All()) {
    if (!def->domain.empty()) continue;
    for (int64_t opset = def->min_opset; opset <= std::min<int64_t>(def->max_opset, max_known);
         ++opset) {
      const onnx::OpSchema* schema =
          onnx::OpSchemaRegistry::Schema(def->op_type, static_cast<int>(opset), onnx::ONNX_DOMAIN);
      if (schema == nullptr) continue;
      ++checked;
      for (const auto& [name, attribute] : schema->attributes()) {
        bool listed = false;
        for (const AttrSpec& spec : def->attributes) listed = listed || spec.name == name;
        EXPECT_TRUE(listed) << def->op_type << " at opset " << opset << ": ONNX defines attribute '"
                            << name << "', castor's schema (graph/ops/) does not list it";
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(OpRegistry, GapsMatchTheCheckedInList) {
  const std::set<std::string> actual = ActualGaps();
  const std::set<std::string> listed = ListedGaps();
  std::ostringstream unlisted, filled;
  for (const std::string& gap : actual) {
    if (!listed.contains(gap)) unlisted << "  " << gap << "\n";
  }
  for (const std::string& gap : listed) {
    if (!actual.contains(gap)) filled << "  " << gap << "\n";
  }
  EXPECT_TRUE(unlisted.str().empty())
      << "ops missing a part that tests/registry_gaps.txt does not list:\n" << unlisted.str()
      << "Fill each part (graph/ops/README.md, 'Adding an op'): an autocast category is one "
         "entry in graph/ops/autocast_table.cc; a gradient is a rule in "
         "graph/ops/gradient_rules.cc (kRules) or the reason there is none (kNoGradient). "
         "A part left open on purpose is listed in tests/registry_gaps.txt.\n";
  EXPECT_TRUE(filled.str().empty())
      << "tests/registry_gaps.txt lists gaps that are now filled (remove them):\n"
      << filled.str();
  std::cout << "registry: " << OpRegistry::Global().All().size() << " ops, " << actual.size()
            << " open slots (autocast category / gradient rule)\n";
}

}  // namespace
}  // namespace castor
