// Matrix product op definitions: MatMul (numpy matmul semantics: 1-D
// operands are promoted to matrices and the added axis removed again, the
// leading batch dims broadcast) and Gemm (Y = alpha * A' * B' + beta * C with
// optional transposes, C unidirectionally broadcast to [M, N], optional from
// opset 11).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

const std::vector<DType> kFloats = {DType::kFloat16, DType::kFloat32, DType::kFloat64};
const std::vector<DType> kWideInts = {DType::kInt32, DType::kInt64, DType::kUInt32, DType::kUInt64};

// Float types from opset 1, the 32/64-bit integers from 9, bfloat16 from 13
// (the MatMul and Gemm histories agree).
std::vector<DType> MatrixDTypes(const InferenceContext& ctx) {
  return ops::DTypesAt(ctx, {{1, kFloats}, {9, kWideInts}, {13, {DType::kBFloat16}}});
}

// The contraction dims must agree when both are static.
absl::Status CheckInnerDims(const InferenceContext& ctx, const Dim& k_a, const Dim& k_b) {
  if (k_a.is_static() && k_b.is_static() && k_a.value() != k_b.value()) {
    return ctx.Error(absl::StrCat("inner dimensions differ: A ", ctx.input_shape(0).ToString(),
                                  " contracts over ", k_a.value(), ", B ",
                                  ctx.input_shape(1).ToString(), " over ", k_b.value()));
  }
  return absl::OkStatus();
}

// A dim known on one side and unknown on the other takes the known one.
Dim Unify(const Dim& a, const Dim& b) { return a.is_unknown() ? b : a; }

absl::Status InferMatMul(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, MatrixDTypes(ctx)));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 1));
  const Shape& a = ctx.input_shape(0);
  const Shape& b = ctx.input_shape(1);
  const DType dtype = ctx.input_dtype(0);
  if ((a.rank_known() && a.rank() == 0) || (b.rank_known() && b.rank() == 0)) {
    return ctx.Error(
        absl::StrCat("operands must have rank >= 1; A is ", a.ToString(), ", B is ", b.ToString()));
  }
  if (!a.rank_known() || !b.rank_known()) {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  // numpy: a 1-D A is a row [1, K], a 1-D B a column [K, 1]; the added
  // axis is dropped from the result.
  const bool a_vector = a.rank() == 1;
  const bool b_vector = b.rank() == 1;
  const Dim k_a = a[a.rank() - 1];
  const Dim k_b = b_vector ? b[0] : b[b.rank() - 2];
  CASTOR_RETURN_IF_ERROR(CheckInnerDims(ctx, k_a, k_b));

  const Shape a_batch(std::vector<Dim>(a.dims().begin(), a.dims().end() - (a_vector ? 1 : 2)));
  const Shape b_batch(std::vector<Dim>(b.dims().begin(), b.dims().end() - (b_vector ? 1 : 2)));
  absl::StatusOr<Shape> batch = ops::BroadcastShapes(a_batch, b_batch);
  if (!batch.ok()) {
    return ctx.Error(absl::StrCat("batch dimensions of A ", a.ToString(), " and B ", b.ToString(),
                                  " do not broadcast"));
  }
  std::vector<Dim> dims = batch->dims();
  if (!a_vector) dims.push_back(a[a.rank() - 2]);
  if (!b_vector) dims.push_back(b[b.rank() - 1]);
  ctx.SetOutput(0, dtype, Shape(std::move(dims)));
  return absl::OkStatus();
}

absl::Status InferGemm(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, MatrixDTypes(ctx)));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 2));
  if (!ctx.has_input(2) && ctx.opset() < 11) {
    return ctx.Error(absl::StrCat(
        "input C is optional only from opset 11; the model imports opset ", ctx.opset()));
  }
  const Shape& a = ctx.input_shape(0);
  const Shape& b = ctx.input_shape(1);
  for (int i = 0; i < 2; ++i) {
    const Shape& s = ctx.input_shape(i);
    if (s.rank_known() && s.rank() != 2) {
      return ctx.Error(absl::StrCat("input ", i, " (", i == 0 ? "A" : "B",
                                    ") must be 2-D; its shape is ", s.ToString()));
    }
  }
  const bool trans_a = ctx.GetInt("transA", 0) != 0;
  const bool trans_b = ctx.GetInt("transB", 0) != 0;
  Dim m, k_a, k_b, n;
  if (a.rank_known()) {
    m = a[trans_a ? 1 : 0];
    k_a = a[trans_a ? 0 : 1];
  }
  if (b.rank_known()) {
    k_b = b[trans_b ? 1 : 0];
    n = b[trans_b ? 0 : 1];
  }
  CASTOR_RETURN_IF_ERROR(CheckInnerDims(ctx, k_a, k_b));
  if (ctx.has_input(2)) {
    const Shape& c = ctx.input_shape(2);
    const Shape target({m, n});
    if (!ops::UnidirectionalBroadcastable(c, target)) {
      return ctx.Error(
          absl::StrCat("input C ", c.ToString(),
                       " does not broadcast to the product's shape [M,N] = ", target.ToString()));
    }
    // A C dim other than 1 pins an unknown M or N.
    if (c.rank_known() && c.rank() >= 1 && c[c.rank() - 1].is_static() &&
        c[c.rank() - 1].value() != 1) {
      n = Unify(n, c[c.rank() - 1]);
    }
    if (c.rank_known() && c.rank() == 2 && c[0].is_static() && c[0].value() != 1) {
      m = Unify(m, c[0]);
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape({m, n}));
  return absl::OkStatus();
}

}  // namespace

void RegisterMatMulOps(OpRegistry& registry) {
  {
    OpDef def;
    def.op_type = "MatMul";
    def.min_opset = kMinOnnxOpset;
    def.max_opset = kMaxOnnxOpset;
    def.min_inputs = 2;
    def.max_inputs = 2;
    def.infer = InferMatMul;
    def.summary = "matrix product with numpy.matmul semantics (1-D operands, batch broadcasting)";
    registry.Register(std::move(def));
  }
  {
    OpDef def;
    def.op_type = "Gemm";
    def.min_opset = kMinOnnxOpset;
    def.max_opset = kMaxOnnxOpset;
    def.min_inputs = 2;  // C is required before opset 11 (checked by inference)
    def.max_inputs = 3;
    def.attributes = {{"alpha", AttrKind::kFloat, false},  // default 1.0
                      {"beta", AttrKind::kFloat, false},   // default 1.0
                      {"transA", AttrKind::kInt, false},   // default 0
                      {"transB", AttrKind::kInt, false}};  // default 0
    def.infer = InferGemm;
    def.summary = "Y = alpha * A' * B' + beta * C for 2-D A, B (optionally transposed)";
    registry.Register(std::move(def));
  }
}

}  // namespace castor
