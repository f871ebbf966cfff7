// CPU kernel of Einsum (backend/cpu/einsum.cc, plan in
// backend/common/einsum_plan.h): every equation of
// tests/data/einsum_numpy_reference.txt (numpy.einsum in float64, generated
// by tests/data/make_einsum_reference.py: matmul, attention, outer product,
// trace, diagonal, transpose, sums, ellipsis broadcasting, implicit output,
// three and four operands, bilinear, size-1 broadcasting, empty sums) in
// float32, float64, float16, int32 and int64; a larger attention product
// against a float64 loop; the shape inference; and the errors for malformed
// equations and inputs that do not fit them.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "passes/verifier.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using testing::F32;
using testing::Make;
using testing::RunNodeOf;
using testing::RunOk;
using testing::SingleNode;

struct NumpyCase {
  std::string name, equation;
  std::vector<std::vector<int64_t>> in_dims;
  std::vector<std::vector<double>> inputs;
  std::vector<int64_t> out_dims;
  std::vector<double> out;
};

std::vector<int64_t> DimsAfter(const std::string& line, const std::string& word) {
  std::istringstream words(line);
  std::string head;
  words >> head;
  EXPECT_EQ(head, word) << line;
  std::vector<int64_t> dims;
  int64_t d;
  while (words >> d) dims.push_back(d);
  return dims;
}

std::vector<double> Numbers(const std::string& line) {
  std::istringstream words(line);
  std::vector<double> values;
  double v;
  while (words >> v) values.push_back(v);
  return values;
}

std::vector<NumpyCase> LoadNumpyCases() {
  std::ifstream in(std::string(CASTOR_SOURCE_DIR) + "/tests/data/einsum_numpy_reference.txt");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  std::vector<NumpyCase> cases;
  for (size_t i = 0; i < lines.size();) {
    std::istringstream words(lines[i++]);
    std::string head;
    NumpyCase c;
    words >> head >> c.name >> c.equation;
    EXPECT_EQ(head, "case");
    for (char& ch : c.equation) {
      if (ch == '_') ch = ' ';  // the file writes spaces as '_'
    }
    while (i < lines.size() && lines[i].rfind("in", 0) == 0) {
      c.in_dims.push_back(DimsAfter(lines[i++], "in"));
      c.inputs.push_back(Numbers(lines[i++]));
    }
    c.out_dims = DimsAfter(lines[i++], "out");
    c.out = Numbers(lines[i++]);
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<Attribute> Equation(const std::string& equation) {
  return {Attribute::String("equation", equation)};
}

TEST(CpuEinsum, MatchesNumpyEinsumInEveryDType) {
  const std::vector<NumpyCase> cases = LoadNumpyCases();
  ASSERT_EQ(cases.size(), 25u) << "tests/data/einsum_numpy_reference.txt";
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kInt32,
                      DType::kInt64}) {
    const bool integer = dtype == DType::kInt32 || dtype == DType::kInt64;
    for (const NumpyCase& c : cases) {
      SCOPED_TRACE(c.name + " " + c.equation + " " + DTypeName(dtype));
      // Inputs are multiples of 1/8: exact in every float dtype, and times
      // 8 integers whose result is numpy's times 8^inputs.
      std::vector<Tensor> inputs;
      double scale = 1.0;
      for (size_t i = 0; i < c.inputs.size(); ++i) {
        std::vector<double> values = c.inputs[i];
        if (integer) {
          for (double& v : values) v *= 8;
          scale *= 8;
        }
        inputs.push_back(Make(dtype, c.in_dims[i], values));
      }
      const std::vector<Tensor> y = RunOk("Einsum", inputs, Equation(c.equation), 12);
      ASSERT_EQ(y[0].dtype(), dtype);
      EXPECT_EQ(y[0].dims(), c.out_dims);
      std::vector<double> expected = c.out;
      for (double& v : expected) v *= scale;
      const double tolerance = dtype == DType::kFloat16 ? 1e-3 : dtype == DType::kFloat32 ? 1e-6
                                                                                          : 0.0;
      testing::ExpectNear(expected, y[0], tolerance, tolerance, "Y");
    }
  }
}

// bhqd,bhkd->bhqk and bhqk,bhkd->bhqd at a size where the GEMMs are real,
// against float64 loops over the float32 inputs.
TEST(CpuEinsum, AttentionProductsMatchFloat64Loops) {
  const int64_t b = 2, h = 3, q = 17, k = 19, d = 33;
  const std::vector<double> qv = testing::Random(b * h * q * d, 1);
  const std::vector<double> kv = testing::Random(b * h * k * d, 2);
  const std::vector<double> vv = testing::Random(b * h * k * d, 3);
  const Tensor query = Make(DType::kFloat32, {b, h, q, d}, qv);
  const Tensor key = Make(DType::kFloat32, {b, h, k, d}, kv);
  const Tensor value = Make(DType::kFloat32, {b, h, k, d}, vv);
  const Tensor scores = RunOk("Einsum", {query, key}, Equation("bhqd,bhkd->bhqk"), 12)[0];
  ASSERT_EQ(scores.dims(), (std::vector<int64_t>{b, h, q, k}));
  std::vector<double> expected(b * h * q * k, 0.0);
  for (int64_t bh = 0; bh < b * h; ++bh) {
    for (int64_t i = 0; i < q; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < d; ++p) {
          sum += static_cast<double>(static_cast<float>(qv[(bh * q + i) * d + p])) *
                 static_cast<double>(static_cast<float>(kv[(bh * k + j) * d + p]));
        }
        expected[(bh * q + i) * k + j] = sum;
      }
    }
  }
  testing::ExpectNear(expected, scores, 1e-5, 1e-5, "scores");
  const Tensor out = RunOk("Einsum", {scores, value}, Equation("bhqk,bhkd->bhqd"), 12)[0];
  ASSERT_EQ(out.dims(), (std::vector<int64_t>{b, h, q, d}));
  std::vector<double> expected_out(b * h * q * d, 0.0);
  for (int64_t bh = 0; bh < b * h; ++bh) {
    for (int64_t i = 0; i < q; ++i) {
      for (int64_t p = 0; p < d; ++p) {
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) {
          sum += scores.GetDouble((bh * q + i) * k + j) *
                 static_cast<double>(static_cast<float>(vv[(bh * k + j) * d + p]));
        }
        expected_out[(bh * q + i) * d + p] = sum;
      }
    }
  }
  testing::ExpectNear(expected_out, out, 1e-5, 1e-5, "output");
}

TEST(CpuEinsum, InfersShapesWithSymbolsAndBroadcasting) {
  Model model;
  model.ir_version = 8;
  model.opset_imports.push_back({"", 12});
  Graph& g = *model.graph;
  Value* a = g.AddInput("a", DType::kFloat32, Shape({Dim::Symbol("B"), 1, 3, 4})).value();
  Value* b = g.AddInput("b", DType::kFloat32, Shape({5, 4, Dim::Symbol("N")})).value();
  Node* node = g.AddNode("Einsum", {a, b}, {"y"}, "node").value();
  node->SetAttribute(Attribute::String("equation", "...ij,...jk->...ik"));
  g.AddOutput(node->output(0));
  ASSERT_TRUE(InferTypes(model).ok());
  EXPECT_EQ(node->output(0)->shape(), Shape({Dim::Symbol("B"), 5, 3, Dim::Symbol("N")}));
  EXPECT_EQ(node->output(0)->dtype(), DType::kFloat32);
}

// The error of an Einsum node over `inputs` with `equation` (empty when it
// ran), which must name the node.
std::string ErrorOf(const std::string& equation, std::vector<Tensor> inputs) {
  std::vector<Attribute> attributes;
  if (!equation.empty()) attributes = Equation(equation);
  absl::StatusOr<std::vector<Tensor>> result = RunNodeOf("Einsum", std::move(inputs),
                                                         attributes, 12);
  if (result.ok()) return "";
  const std::string message(result.status().message());
  EXPECT_NE(message.find("Einsum node 'node'"), std::string::npos) << message;
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << message;
  return message;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CpuEinsum, RejectsMalformedEquationsNamingTheNode) {
  const Tensor m23 = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor m45 = F32({4, 5}, std::vector<float>(20, 1.0f));
  const Tensor m33 = F32({3, 3}, std::vector<float>(9, 1.0f));
  EXPECT_TRUE(Has(ErrorOf("ij,jk->ik", {m23}), "2 input term(s) for 1 input(s)"));
  EXPECT_TRUE(Has(ErrorOf("ij->ii", {m23}), "output subscript 'i' appears more than once"));
  EXPECT_TRUE(Has(ErrorOf("ij->k", {m23}), "output subscript 'k' appears in no input"));
  EXPECT_TRUE(Has(ErrorOf("i.j->ij", {m23}), "'.' that is not part of \"...\""));
  EXPECT_TRUE(Has(ErrorOf("......->", {m23}), "\"...\" more than once"));
  EXPECT_TRUE(Has(ErrorOf("ij->i->j", {m23}), "\"->\" more than once"));
  EXPECT_TRUE(Has(ErrorOf("i1->i", {m23}), "the character '1'"));
  EXPECT_TRUE(Has(ErrorOf("ij->j,i", {m23}), "more than one output term"));
  EXPECT_TRUE(Has(ErrorOf("ij->...ij", {m23}), "the output has \"...\" but no input has"));
  EXPECT_TRUE(Has(ErrorOf("ijk->i", {m23}), "input 0 has rank 2 but its subscripts 'ijk'"));
  EXPECT_TRUE(Has(ErrorOf("ij...k->i", {m23}), "name at least 3 axes"));
  EXPECT_TRUE(Has(ErrorOf("ij,jk->ik", {m23, m45}),
                  "subscript 'j' labels sizes 3 (input 0 axis 1) and 4 (input 1 axis 0)"));
  EXPECT_TRUE(Has(ErrorOf("ii->i", {m23}), "repeats subscript 'i' (a diagonal)"));
  EXPECT_TRUE(Has(ErrorOf("", {m33}), "equation"));
  // Not an Einsum dtype in ONNX (bfloat16), and inputs of different dtypes.
  EXPECT_FALSE(ErrorOf("ij->ji", {Make(DType::kBFloat16, {2, 2}, {1, 2, 3, 4})}).empty());
  EXPECT_FALSE(ErrorOf("ij,jk->ik", {m33, Make(DType::kFloat64, {3, 3}, std::vector<double>(9, 1.0))})
                   .empty());
  // Einsum came with opset 12: the verifier refuses it in an opset 11 model.
  SingleNode old("Einsum", {m23}, Equation("ij->ji"), 11);
  const absl::Status verified = VerifyModel(old.model());
  EXPECT_FALSE(verified.ok());
  EXPECT_NE(std::string(verified.message()).find("Einsum"), std::string::npos) << verified;
}

}  // namespace
}  // namespace castor
