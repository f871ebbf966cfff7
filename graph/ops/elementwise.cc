// Elementwise op definitions: binary arithmetic (Add, Sub, Mul, Div, Pow),
// unary math and activations (Neg, Abs, Sign, Floor, Ceil, Round, Relu, LeakyRelu, HardSigmoid,
// HardSwish, Elu, Selu, Celu, Softplus, Softsign, ThresholdedRelu, Mish,
// PRelu, Sigmoid, Tanh, Gelu, Erf, Exp, Log, Sqrt, Reciprocal, Sin, Cos,
// Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh), the
// comparisons Equal, Less, Greater, LessOrEqual, GreaterOrEqual (bool out),
// the logic And, Or, Xor, Not, Mod, the predicates IsNaN and IsInf, the
// selection Where, the variadic Max/Min/Sum and Clip.
// Binary and variadic ops use ONNX multidirectional (numpy) broadcasting;
// each op's accepted dtypes follow its opset history (bfloat16 from opset 13
// for most, the small integer types of Add..Div from 14, ...).
#include <climits>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/gradient_builder.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

using ops::DTypesSince;

const std::vector<DType> kFloats = {DType::kFloat16, DType::kFloat32, DType::kFloat64};
const std::vector<DType> kBFloat16 = {DType::kBFloat16};
const std::vector<DType> kWideInts = {DType::kInt32, DType::kInt64, DType::kUInt32, DType::kUInt64};
const std::vector<DType> kNarrowInts = {DType::kInt8, DType::kInt16, DType::kUInt8, DType::kUInt16};
const std::vector<DType> kSignedInts = {DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64};
const std::vector<DType> kAllInts = {DType::kInt8,  DType::kInt16,  DType::kInt32,  DType::kInt64,
                                     DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64};

std::vector<DType> Concat(std::vector<DType> a, const std::vector<DType>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Float ops: float16/float/double, bfloat16 from opset `bfloat16_since`.
std::vector<DTypesSince> FloatHistory(int64_t bfloat16_since) {
  return {{1, kFloats}, {bfloat16_since, kBFloat16}};
}

// Add, Sub, Mul, Div: opset 7 wide ints and floats, 13 bfloat16, 14 the
// 8/16-bit integers.
std::vector<DTypesSince> ArithmeticHistory() {
  return {{1, Concat(kFloats, kWideInts)}, {13, kBFloat16}, {14, kNarrowInts}};
}

// Binary ops whose inputs share dtype T and whose output is T (or bool).
InferFn BinaryInfer(std::vector<DTypesSince> history, bool bool_output) {
  return [history = std::move(history), bool_output](InferenceContext& ctx) -> absl::Status {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, ops::DTypesAt(ctx, history)));
    CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 1));
    CASTOR_ASSIGN_OR_RETURN(Shape shape, ops::BroadcastInputs(ctx, 0, 1));
    ctx.SetOutput(0, bool_output ? DType::kBool : ctx.input_dtype(0), std::move(shape));
    return absl::OkStatus();
  };
}

// Binary ops on bool inputs with a bool output (And, Or, Xor).
absl::Status InferLogic(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, {DType::kBool}));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 1));
  CASTOR_ASSIGN_OR_RETURN(Shape shape, ops::BroadcastInputs(ctx, 0, 1));
  ctx.SetOutput(0, DType::kBool, std::move(shape));
  return absl::OkStatus();
}

// Predicates on one input (IsNaN, IsInf): a bool output of the input's shape.
InferFn PredicateInfer(std::vector<DTypesSince> history) {
  return [history = std::move(history)](InferenceContext& ctx) -> absl::Status {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, ops::DTypesAt(ctx, history)));
    ctx.SetOutput(0, DType::kBool, ctx.input_shape(0));
    return absl::OkStatus();
  };
}

// Mod: A and B share a numeric dtype; fmod is 0 or 1.
absl::Status InferMod(InferenceContext& ctx) {
  const int64_t fmod = ctx.GetInt("fmod", 0);
  if (fmod != 0 && fmod != 1) {
    return ctx.Error(absl::StrCat("attribute 'fmod' is ", fmod, "; expected 0 or 1"));
  }
  return BinaryInfer({{1, Concat(kFloats, kAllInts)}, {13, kBFloat16}},
                     /*bool_output=*/false)(ctx);
}

// PRelu(X, slope): slope broadcasts to X unidirectionally (its shape
// broadcast with X's is X's); the output is X's dtype and shape.
absl::Status InferPRelu(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(
      ctx, 0,
      ops::DTypesAt(ctx, {{1, kFloats},
                          {9, {DType::kInt32, DType::kInt64, DType::kUInt32, DType::kUInt64}},
                          {16, kBFloat16}})));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 1));
  CASTOR_ASSIGN_OR_RETURN(Shape shape, ops::BroadcastInputs(ctx, 0, 1));
  const Shape& x = ctx.input_shape(0);
  const Shape& slope = ctx.input_shape(1);
  bool grows = x.rank_known() && slope.rank_known() && slope.rank() > x.rank();
  for (int k = 0; !grows && x.rank_known() && shape.rank_known() && k < x.rank(); ++k) {
    grows = x[k].is_static() && shape[k].is_static() && x[k].value() != shape[k].value();
  }
  if (grows) {
    return ctx.Error(absl::StrCat("slope ", slope.ToString(), " must broadcast to X ",
                                  x.ToString(), " without growing it (unidirectional)"));
  }
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  return absl::OkStatus();
}

// Unary ops: output = input's dtype and shape. `check` validates attributes.
InferFn UnaryInfer(std::vector<DTypesSince> history,
                   std::function<absl::Status(const InferenceContext&)> check = nullptr) {
  return [history = std::move(history), check](InferenceContext& ctx) -> absl::Status {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, ops::DTypesAt(ctx, history)));
    if (check) CASTOR_RETURN_IF_ERROR(check(ctx));
    ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
    return absl::OkStatus();
  };
}

OpDef MakeOp(const std::string& op_type, int64_t min_opset, int num_inputs,
             const std::string& summary) {
  OpDef def;
  def.op_type = op_type;
  def.min_opset = min_opset;
  def.max_opset = kMaxOnnxOpset;
  def.min_inputs = num_inputs;
  def.max_inputs = num_inputs;
  def.min_outputs = 1;
  def.max_outputs = 1;
  def.summary = summary;
  return def;
}

void RegisterBinary(OpRegistry& registry, const std::string& op_type,
                    std::vector<DTypesSince> history, const std::string& summary) {
  OpDef def = MakeOp(op_type, kMinOnnxOpset, 2, summary);
  def.infer = BinaryInfer(std::move(history), /*bool_output=*/false);
  registry.Register(std::move(def));
}

void RegisterUnary(OpRegistry& registry, const std::string& op_type, int64_t min_opset,
                   std::vector<DTypesSince> history, const std::string& summary) {
  OpDef def = MakeOp(op_type, min_opset, 1, summary);
  def.infer = UnaryInfer(std::move(history));
  registry.Register(std::move(def));
}

// Pow: the exponent may have another dtype than the base (opset 12+); the
// output has the base's dtype and the broadcast shape.
absl::Status InferPow(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(
      ctx, 0,
      ops::DTypesAt(ctx, {{1, kFloats}, {12, {DType::kInt32, DType::kInt64}}, {13, kBFloat16}})));
  if (ctx.opset() < 12) {
    CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 1));
  } else {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(
        ctx, 1, ops::DTypesAt(ctx, {{1, Concat(kFloats, kAllInts)}, {15, kBFloat16}})));
  }
  CASTOR_ASSIGN_OR_RETURN(Shape shape, ops::BroadcastInputs(ctx, 0, 1));
  ctx.SetOutput(0, ctx.input_dtype(0), std::move(shape));
  return absl::OkStatus();
}

absl::Status CheckGeluApproximate(const InferenceContext& ctx) {
  const std::string approximate = ctx.GetString("approximate", "none");
  if (approximate != "none" && approximate != "tanh") {
    return ctx.Error(absl::StrCat("attribute 'approximate' is \"", approximate,
                                  "\"; expected \"none\" or \"tanh\""));
  }
  return absl::OkStatus();
}

// Where(condition, X, Y): condition bool; X and Y share a dtype; the output
// is the three-way broadcast.
absl::Status InferWhere(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, {DType::kBool}));
  std::vector<DType> values = ops::AllTypes();
  if (ctx.opset() < 16) std::erase(values, DType::kBFloat16);
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, values));
  CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 1, 2));
  CASTOR_ASSIGN_OR_RETURN(Shape shape, ops::BroadcastInputs(ctx, 0, 2));
  ctx.SetOutput(0, ctx.input_dtype(1), std::move(shape));
  return absl::OkStatus();
}

// Max, Min, Sum: one or more inputs of one dtype. Opset 8 introduced
// broadcasting; before it (the -6 versions) all shapes must be equal.
InferFn VariadicInfer(std::vector<DTypesSince> history) {
  return [history = std::move(history)](InferenceContext& ctx) -> absl::Status {
    if (ctx.num_inputs() < 1) return ctx.Error("needs at least one input");
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      if (!ctx.has_input(i)) return ctx.Error(absl::StrCat("input ", i, " is missing"));
    }
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, ops::DTypesAt(ctx, history)));
    CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, ctx.num_inputs() - 1));
    if (ctx.opset() < 8) {
      for (int i = 1; i < ctx.num_inputs(); ++i) {
        const Shape& a = ctx.input_shape(0);
        const Shape& b = ctx.input_shape(i);
        bool differ = a.rank_known() && b.rank_known() && a.rank() != b.rank();
        for (int k = 0; !differ && a.rank_known() && b.rank_known() && k < a.rank(); ++k) {
          differ = a[k].is_static() && b[k].is_static() && a[k].value() != b[k].value();
        }
        if (differ) {
          return ctx.Error(absl::StrCat("before opset 8 all input shapes must be equal; input ", i,
                                        " is ", b.ToString(), ", input 0 is ", a.ToString()));
        }
      }
    }
    CASTOR_ASSIGN_OR_RETURN(Shape shape, ops::BroadcastInputs(ctx, 0, ctx.num_inputs() - 1));
    ctx.SetOutput(0, ctx.input_dtype(0), std::move(shape));
    return absl::OkStatus();
  };
}

// Clip: bounds are float attributes min/max before opset 11 and optional
// scalar inputs from 11 on.
absl::Status InferClip(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(
      ctx, 0, ops::DTypesAt(ctx, {{1, kFloats}, {12, kAllInts}, {13, kBFloat16}})));
  CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "min", 1, 10));
  CASTOR_RETURN_IF_ERROR(ops::CheckAttributeOpsets(ctx, "max", 1, 10));
  if (ctx.opset() < 11) {
    if (ctx.num_inputs() > 1) {
      return ctx.Error(absl::StrCat("min and max are inputs only from opset 11; at opset ",
                                    ctx.opset(), " they are attributes and Clip takes 1 input"));
    }
  } else {
    CASTOR_RETURN_IF_ERROR(ops::RequireSameDType(ctx, 0, 2));
    for (int i = 1; i <= 2; ++i) {
      if (!ctx.has_input(i)) continue;
      const std::optional<int64_t> count = ctx.input_shape(i).NumElements();
      if (count && *count != 1) {
        return ctx.Error(absl::StrCat("input ", i, " (", i == 1 ? "min" : "max",
                                      ") must be a scalar; its shape is ",
                                      ctx.input_shape(i).ToString()));
      }
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
  return absl::OkStatus();
}

}  // namespace

void RegisterElementwiseOps(OpRegistry& registry) {
  RegisterBinary(registry, "Add", ArithmeticHistory(), "A + B, numpy broadcasting");
  RegisterBinary(registry, "Sub", ArithmeticHistory(), "A - B, numpy broadcasting");
  RegisterBinary(registry, "Mul", ArithmeticHistory(), "A * B, numpy broadcasting");
  RegisterBinary(registry, "Div", ArithmeticHistory(),
                 "A / B, numpy broadcasting (integer division truncates)");
  {
    OpDef def = MakeOp("Pow", kMinOnnxOpset, 2,
                       "X ^ Y, numpy broadcasting; Y may have another dtype (opset 12+)");
    def.infer = InferPow;
    registry.Register(std::move(def));
  }

  RegisterUnary(registry, "Neg", kMinOnnxOpset,
                {{1, Concat(kFloats, kSignedInts)}, {13, kBFloat16}}, "-X");
  RegisterUnary(registry, "Abs", kMinOnnxOpset, {{1, Concat(kFloats, kAllInts)}, {13, kBFloat16}},
                "|X|");
  RegisterUnary(registry, "Sign", 9, {{1, Concat(kFloats, kAllInts)}, {13, kBFloat16}},
                "-1, 0 or 1 by the sign of X (NaN stays NaN)");
  RegisterUnary(registry, "Floor", kMinOnnxOpset, FloatHistory(13), "the largest integer <= X");
  RegisterUnary(registry, "Ceil", kMinOnnxOpset, FloatHistory(13), "the smallest integer >= X");
  RegisterUnary(registry, "Round", 11, FloatHistory(22),
                "X rounded to the nearest integer, halves to even");
  RegisterUnary(registry, "Relu", kMinOnnxOpset, {{1, kFloats}, {13, kBFloat16}, {14, kSignedInts}},
                "max(X, 0)");
  {
    OpDef def = MakeOp("LeakyRelu", kMinOnnxOpset, 1, "X if X >= 0 else alpha * X");
    def.attributes = {{"alpha", AttrKind::kFloat, false}};  // default 0.01
    def.infer = UnaryInfer(FloatHistory(16));
    registry.Register(std::move(def));
  }
  {
    OpDef def = MakeOp("HardSigmoid", kMinOnnxOpset, 1, "max(0, min(1, alpha * X + beta))");
    def.attributes = {{"alpha", AttrKind::kFloat, false},  // default 0.2
                      {"beta", AttrKind::kFloat, false}};  // default 0.5
    def.infer = UnaryInfer(FloatHistory(22));
    registry.Register(std::move(def));
  }
  RegisterUnary(registry, "HardSwish", 14, FloatHistory(22), "X * max(0, min(1, X / 6 + 1/2))");
  {
    OpDef def = MakeOp("Elu", kMinOnnxOpset, 1, "X if X > 0 else alpha * (exp(X) - 1)");
    def.attributes = {{"alpha", AttrKind::kFloat, false}};  // default 1
    def.infer = UnaryInfer(FloatHistory(22));
    registry.Register(std::move(def));
  }
  {
    OpDef def =
        MakeOp("Selu", kMinOnnxOpset, 1, "gamma * (X if X > 0 else alpha * (exp(X) - 1))");
    def.attributes = {{"alpha", AttrKind::kFloat, false},   // default 1.67326...
                      {"gamma", AttrKind::kFloat, false}};  // default 1.05070...
    def.infer = UnaryInfer(FloatHistory(22));
    registry.Register(std::move(def));
  }
  {
    OpDef def =
        MakeOp("Celu", 12, 1, "max(0, X) + min(0, alpha * (exp(X / alpha) - 1)), float32 only");
    def.attributes = {{"alpha", AttrKind::kFloat, false}};  // default 1
    def.infer = UnaryInfer({{1, {DType::kFloat32}}});
    registry.Register(std::move(def));
  }
  RegisterUnary(registry, "Softplus", kMinOnnxOpset, FloatHistory(22), "ln(1 + exp(X))");
  RegisterUnary(registry, "Softsign", kMinOnnxOpset, FloatHistory(22), "X / (1 + |X|)");
  {
    OpDef def = MakeOp("ThresholdedRelu", 10, 1, "X if X > alpha else 0");
    def.attributes = {{"alpha", AttrKind::kFloat, false}};  // default 1
    def.infer = UnaryInfer(FloatHistory(22));
    registry.Register(std::move(def));
  }
  RegisterUnary(registry, "Mish", 18, FloatHistory(22), "X * tanh(ln(1 + exp(X)))");
  {
    OpDef def = MakeOp("PRelu", kMinOnnxOpset, 2,
                       "X if X >= 0 else slope * X; slope broadcasts to X (unidirectional)");
    def.infer = InferPRelu;
    registry.Register(std::move(def));
  }
  RegisterUnary(registry, "Sigmoid", kMinOnnxOpset, FloatHistory(13), "1 / (1 + exp(-X))");
  RegisterUnary(registry, "Tanh", kMinOnnxOpset, FloatHistory(13), "tanh(X)");
  // ONNX's Gelu (opset 20), and castor's form of it for the training graph
  // at any model opset (the fuse-gelu pass writes it for the erf pattern
  // exporters emit before opset 20: passes/training_graph.cc).
  for (const std::string domain : {"", kCastorDomain}) {
    const bool onnx = domain.empty();
    OpDef def = MakeOp("Gelu", onnx ? 20 : 1, 1,
                       onnx ? "0.5 * X * (1 + erf(X / sqrt(2))), or its tanh approximation"
                            : "0.5 * X * (1 + erf(X / sqrt(2))), or its tanh approximation "
                              "(castor's form for the training graph: ONNX opset 20's op at "
                              "any model opset)");
    def.domain = domain;
    if (!onnx) def.max_opset = 1;
    def.attributes = {{"approximate", AttrKind::kString, false}};  // "none" | "tanh"
    def.infer = UnaryInfer({{1, Concat(kFloats, kBFloat16)}}, CheckGeluApproximate);
    registry.Register(std::move(def));
  }
  RegisterUnary(registry, "Erf", 9, {{1, Concat(kFloats, kAllInts)}, {13, kBFloat16}},
                "the error function erf(X)");
  RegisterUnary(registry, "Exp", kMinOnnxOpset, FloatHistory(13), "e ^ X");
  RegisterUnary(registry, "Log", kMinOnnxOpset, FloatHistory(13), "natural logarithm ln(X)");
  RegisterUnary(registry, "Sqrt", kMinOnnxOpset, FloatHistory(13), "square root of X");
  RegisterUnary(registry, "Reciprocal", kMinOnnxOpset, FloatHistory(13), "1 / X");
  // Trigonometric (opset 7) and hyperbolic (opset 9) functions; bfloat16
  // from opset 22. Positional encodings and rotary embeddings compute them.
  RegisterUnary(registry, "Sin", 7, FloatHistory(22), "sine of X (radians)");
  RegisterUnary(registry, "Cos", 7, FloatHistory(22), "cosine of X (radians)");
  RegisterUnary(registry, "Tan", 7, FloatHistory(22), "tangent of X (radians)");
  RegisterUnary(registry, "Asin", 7, FloatHistory(22), "arcsine of X, in [-pi/2, pi/2]");
  RegisterUnary(registry, "Acos", 7, FloatHistory(22), "arccosine of X, in [0, pi]");
  RegisterUnary(registry, "Atan", 7, FloatHistory(22), "arctangent of X, in (-pi/2, pi/2)");
  RegisterUnary(registry, "Sinh", 9, FloatHistory(22), "hyperbolic sine of X");
  RegisterUnary(registry, "Cosh", 9, FloatHistory(22), "hyperbolic cosine of X");
  RegisterUnary(registry, "Asinh", 9, FloatHistory(22), "inverse hyperbolic sine of X");
  RegisterUnary(registry, "Acosh", 9, FloatHistory(22), "inverse hyperbolic cosine of X (X >= 1)");
  RegisterUnary(registry, "Atanh", 9, FloatHistory(22), "inverse hyperbolic tangent of X (|X| < 1)");

  {
    OpDef def = MakeOp("Equal", kMinOnnxOpset, 2, "A == B as bool, numpy broadcasting");
    def.infer = BinaryInfer({{1, {DType::kBool, DType::kInt32, DType::kInt64}},
                             {11, Concat(kFloats, kAllInts)},
                             {13, kBFloat16},
                             {19, {DType::kString}}},
                            /*bool_output=*/true);
    def.autocast = AutocastCategory::kNone;  // a comparison, not a float computation
    registry.Register(std::move(def));
  }
  // Less/Greater: floats at opset 7, every integer type from 9, bfloat16
  // from 13; LessOrEqual/GreaterOrEqual (opset 12): bfloat16 from 16.
  const std::vector<DTypesSince> less_history = {
      {1, kFloats}, {9, kAllInts}, {13, kBFloat16}};
  const std::vector<DTypesSince> less_equal_history = {
      {1, Concat(kFloats, kAllInts)}, {16, kBFloat16}};
  for (const auto& [op, since, relation] :
       std::vector<std::tuple<std::string, int64_t, std::string>>{
           {"Less", kMinOnnxOpset, "<"},
           {"Greater", kMinOnnxOpset, ">"},
           {"LessOrEqual", 12, "<="},
           {"GreaterOrEqual", 12, ">="}}) {
    OpDef def =
        MakeOp(op, since, 2, absl::StrCat("A ", relation, " B as bool, numpy broadcasting"));
    def.infer = BinaryInfer(since == 12 ? less_equal_history : less_history, /*bool_output=*/true);
    registry.Register(std::move(def));
  }
  for (const auto& [op, summary] : std::vector<std::pair<std::string, std::string>>{
           {"And", "A and B of bool tensors, numpy broadcasting"},
           {"Or", "A or B of bool tensors, numpy broadcasting"},
           {"Xor", "A xor B of bool tensors, numpy broadcasting"}}) {
    OpDef def = MakeOp(op, kMinOnnxOpset, 2, summary);
    def.infer = InferLogic;
    registry.Register(std::move(def));
  }
  RegisterUnary(registry, "Not", kMinOnnxOpset, {{1, {DType::kBool}}}, "not X of a bool tensor");
  {
    OpDef def = MakeOp("Mod", 10, 2,
                       "remainder of A / B, numpy broadcasting: the divisor's sign (fmod = 0) "
                       "or the dividend's (fmod = 1, C fmod)");
    def.attributes = {{"fmod", AttrKind::kInt, false}};  // default 0
    def.infer = InferMod;
    registry.Register(std::move(def));
  }
  {
    OpDef def = MakeOp("IsNaN", 9, 1, "X is NaN, as bool");
    def.infer = PredicateInfer({{1, kFloats}, {13, kBFloat16}});
    registry.Register(std::move(def));
  }
  {
    OpDef def = MakeOp("IsInf", 10, 1, "X is +inf (detect_positive) or -inf (detect_negative)");
    def.attributes = {{"detect_negative", AttrKind::kInt, false},   // default 1
                      {"detect_positive", AttrKind::kInt, false}};  // default 1
    def.infer = PredicateInfer({{1, {DType::kFloat32, DType::kFloat64}},
                                {20, {DType::kFloat16, DType::kBFloat16}}});
    registry.Register(std::move(def));
  }
  {
    OpDef def =
        MakeOp("Where", 9, 3, "condition ? X : Y elementwise, three-way numpy broadcasting");
    def.infer = InferWhere;
    registry.Register(std::move(def));
  }

  const std::vector<DTypesSince> min_max_history = {{1, kFloats}, {12, kAllInts}, {13, kBFloat16}};
  for (const char* op : {"Max", "Min"}) {
    OpDef def =
        MakeOp(op, kMinOnnxOpset, 1,
               absl::StrCat("elementwise ", op == std::string("Max") ? "maximum" : "minimum",
                            " of one or more inputs, numpy broadcasting (opset 8+)"));
    def.max_inputs = INT_MAX;
    def.infer = VariadicInfer(min_max_history);
    registry.Register(std::move(def));
  }
  {
    OpDef def = MakeOp("Sum", kMinOnnxOpset, 1,
                       "elementwise sum of one or more inputs, numpy broadcasting (opset 8+)");
    def.max_inputs = INT_MAX;
    def.infer = VariadicInfer(FloatHistory(13));
    registry.Register(std::move(def));
  }
  {
    OpDef def =
        MakeOp("Clip", kMinOnnxOpset, 1,
               "min(max(X, min), max); bounds are attributes before opset 11, inputs after");
    def.max_inputs = 3;
    def.attributes = {{"min", AttrKind::kFloat, false}, {"max", AttrKind::kFloat, false}};
    def.infer = InferClip;
    registry.Register(std::move(def));
  }
}

}  // namespace castor
