// The gradient rules: for each differentiable op, how the autodiff pass
// (passes/autodiff.h) turns the gradients of its outputs into gradients of
// its inputs, written with ONNX ops and castor's gradient ops (domain
// com.castor, graph/ops/gradient_ops.cc); and, for each op that has no
// gradient on purpose, the reason. Rules keep dtypes: every input gradient
// has its input's dtype (a Cast's gradient casts back).
//
// Conventions: `dy` is the gradient of output 0; Unbroadcast() sums a
// gradient down to an input that numpy broadcasting expanded. Backward
// values have no types until the pass infers them at the end, so dtypes are
// read from forward values (a gradient has its value's dtype).
#include <algorithm>
#include <cmath>
#include <optional>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/gradient_builder.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/einsum_equation.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

using Rule = absl::Status (*)(GradientBuilder&);

// `grad` (shaped like the node's output) summed down to `input`'s shape;
// provably equal (static or symbolic) shapes mean nothing was broadcast.
// (Autodiff drops the reductions that inference later shows to be
// identities.)
absl::StatusOr<Value*> Unbroadcast(GradientBuilder& g, Value* grad, Value* input) {
  if (g.output(0)->shape().ProvablyEquals(input->shape())) return grad;
  return g.Emit1("ReduceToShapeOf", {grad, input}, {}, kCastorDomain);
}

absl::Status SetUnbroadcast(GradientBuilder& g, int i, Value* grad) {
  if (!g.wants_input_grad(i)) return absl::OkStatus();
  CASTOR_ASSIGN_OR_RETURN(Value * reduced, Unbroadcast(g, grad, g.input(i)));
  g.SetInputGrad(i, reduced);
  return absl::OkStatus();
}

// `fill` (0 unless given) in `like`'s shape and dtype (a float type; pass
// it for a backward value, which has none yet): Expand(fill, Shape(like)).
absl::StatusOr<Value*> ZerosLike(GradientBuilder& g, Value* like, double fill = 0.0,
                                 DType dtype = DType::kUndefined) {
  if (dtype == DType::kUndefined) dtype = like->dtype();
  CASTOR_ASSIGN_OR_RETURN(Value * value, g.Scalar(fill, dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * shape, g.ShapeOf(like));
  return g.Emit1("Expand", {value, shape});
}

// ---- elementwise -------------------------------------------------------------

absl::Status AddGradient(GradientBuilder& g) {
  CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 0, g.output_grad(0)));
  return SetUnbroadcast(g, 1, g.output_grad(0));
}

absl::Status SumGradient(GradientBuilder& g) {
  for (int i = 0; i < g.node().num_inputs(); ++i) {
    CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, i, g.output_grad(0)));
  }
  return absl::OkStatus();
}

absl::Status SubGradient(GradientBuilder& g) {
  CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 0, g.output_grad(0)));
  if (!g.wants_input_grad(1)) return absl::OkStatus();
  CASTOR_ASSIGN_OR_RETURN(Value * negated, g.Emit1("Neg", {g.output_grad(0)}));
  return SetUnbroadcast(g, 1, negated);
}

absl::Status MulGradient(GradientBuilder& g) {
  for (int i : {0, 1}) {
    if (!g.wants_input_grad(i)) continue;
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Mul", {g.output_grad(0), g.input(1 - i)}));
    CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, i, grad));
  }
  return absl::OkStatus();
}

// Y = A / B: dA = dY / B, dB = -dY * Y / B.
absl::Status DivGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * over_b, g.Emit1("Div", {g.output_grad(0), g.input(1)}));
  CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 0, over_b));
  if (!g.wants_input_grad(1)) return absl::OkStatus();
  CASTOR_ASSIGN_OR_RETURN(Value * scaled, g.Emit1("Mul", {over_b, g.output(0)}));
  CASTOR_ASSIGN_OR_RETURN(Value * negated, g.Emit1("Neg", {scaled}));
  return SetUnbroadcast(g, 1, negated);
}

// Y = Mod(A, B) on floats, Y = A - B Q with Q = floor(A / B) (fmod = 0)
// or trunc(A / B) (fmod = 1), Q piecewise constant: dA = dY, dB = -dY Q,
// as PyTorch's remainder and fmod. Q is computed as (A - Y) / B, which is
// Q up to one rounding (ONNX has no Trunc). Integer Mod is never
// differentiated (integer values get no gradients).
absl::Status ModGradient(GradientBuilder& g) {
  CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 0, g.output_grad(0)));
  if (!g.wants_input_grad(1)) return absl::OkStatus();
  CASTOR_ASSIGN_OR_RETURN(Value * multiple, g.Emit1("Sub", {g.input(0), g.output(0)}));
  CASTOR_ASSIGN_OR_RETURN(Value * quotient, g.Emit1("Div", {multiple, g.input(1)}));
  CASTOR_ASSIGN_OR_RETURN(Value * scaled, g.Emit1("Mul", {g.output_grad(0), quotient}));
  CASTOR_ASSIGN_OR_RETURN(Value * negated, g.Emit1("Neg", {scaled}));
  return SetUnbroadcast(g, 1, negated);
}

// Sign, Floor, Ceil, Round: piecewise constant, so dX = 0, as PyTorch
// gives (zeros_like(grad), also where dY is inf or NaN).
absl::Status ZeroGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * zeros, ZerosLike(g, g.input(0)));
  g.SetInputGrad(0, zeros);
  return absl::OkStatus();
}

absl::Status NegGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Neg", {g.output_grad(0)}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status IdentityGradient(GradientBuilder& g) {
  g.SetInputGrad(0, g.output_grad(0));
  return absl::OkStatus();
}

// Y = Cast(X): dX = Cast(dY) back to X's dtype.
absl::Status CastGradient(GradientBuilder& g) {
  Value* x = g.input(0);
  if (x->dtype() == g.output(0)->dtype()) return IdentityGradient(g);
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Cast", {g.output_grad(0)},
                                                {Attribute::Int("to", DTypeToOnnx(x->dtype()))}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status ReluGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("ReluGrad", {g.output_grad(0), g.output(0)}, {},
                                                kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// dX = dY * f(X, Y) for unary ops whose derivative is one product.
absl::Status TimesDerivative(GradientBuilder& g, Value* derivative) {
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Mul", {g.output_grad(0), derivative}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = exp(X): dX = dY * Y.
absl::Status ExpGradient(GradientBuilder& g) { return TimesDerivative(g, g.output(0)); }

// Y = log(X): dX = dY / X.
absl::Status LogGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Div", {g.output_grad(0), g.input(0)}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = sqrt(X): dX = dY / (2 Y).
absl::Status SqrtGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * two, g.Scalar(2.0, g.output(0)->dtype()));
  CASTOR_ASSIGN_OR_RETURN(Value * twice, g.Emit1("Mul", {g.output(0), two}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Div", {g.output_grad(0), twice}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = tanh(X): dX = dY * (1 - Y^2).
absl::Status TanhGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * one, g.Scalar(1.0, g.output(0)->dtype()));
  CASTOR_ASSIGN_OR_RETURN(Value * square, g.Emit1("Mul", {g.output(0), g.output(0)}));
  CASTOR_ASSIGN_OR_RETURN(Value * derivative, g.Emit1("Sub", {one, square}));
  return TimesDerivative(g, derivative);
}

// Y = sigmoid(X): dX = dY * Y * (1 - Y).
absl::Status SigmoidGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * one, g.Scalar(1.0, g.output(0)->dtype()));
  CASTOR_ASSIGN_OR_RETURN(Value * complement, g.Emit1("Sub", {one, g.output(0)}));
  CASTOR_ASSIGN_OR_RETURN(Value * derivative, g.Emit1("Mul", {g.output(0), complement}));
  return TimesDerivative(g, derivative);
}

// Y = erf(X): dX = dY * 2/sqrt(pi) * exp(-X^2).
absl::Status ErfGradient(GradientBuilder& g) {
  const DType dtype = g.input(0)->dtype();
  CASTOR_ASSIGN_OR_RETURN(Value * square, g.Emit1("Mul", {g.input(0), g.input(0)}));
  CASTOR_ASSIGN_OR_RETURN(Value * negated, g.Emit1("Neg", {square}));
  CASTOR_ASSIGN_OR_RETURN(Value * gauss, g.Emit1("Exp", {negated}));
  CASTOR_ASSIGN_OR_RETURN(Value * scale, g.Scalar(2.0 / std::sqrt(M_PI), dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * derivative, g.Emit1("Mul", {gauss, scale}));
  return TimesDerivative(g, derivative);
}

// Y = sin(X): dX = dY * cos(X).
absl::Status SinGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * derivative, g.Emit1("Cos", {g.input(0)}));
  return TimesDerivative(g, derivative);
}

// Y = cos(X): dX = dY * -sin(X).
absl::Status CosGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * sine, g.Emit1("Sin", {g.input(0)}));
  CASTOR_ASSIGN_OR_RETURN(Value * derivative, g.Emit1("Neg", {sine}));
  return TimesDerivative(g, derivative);
}

// Y = tan(X): dX = dY * (1 + Y^2).
absl::Status TanGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * one, g.Scalar(1.0, g.output(0)->dtype()));
  CASTOR_ASSIGN_OR_RETURN(Value * square, g.Emit1("Mul", {g.output(0), g.output(0)}));
  CASTOR_ASSIGN_OR_RETURN(Value * derivative, g.Emit1("Add", {one, square}));
  return TimesDerivative(g, derivative);
}

// Y = sinh(X): dX = dY * cosh(X).
absl::Status SinhGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * derivative, g.Emit1("Cosh", {g.input(0)}));
  return TimesDerivative(g, derivative);
}

// Y = cosh(X): dX = dY * sinh(X).
absl::Status CoshGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * derivative, g.Emit1("Sinh", {g.input(0)}));
  return TimesDerivative(g, derivative);
}

// The inverse functions: dX = dY / f(X) as PyTorch computes it, with
// f(X) = sqrt(1 - X^2) (asin; acos negated), 1 + X^2 (atan), sqrt(X^2 + 1)
// (asinh), sqrt(X^2 - 1) (acosh), 1 - X^2 (atanh). f is `constant` - X^2
// (`subtract_square`) or X^2 + `constant`, square-rooted when `take_root`.
absl::Status InverseFunctionGradient(GradientBuilder& g, double constant, bool subtract_square,
                                     bool take_root, bool negate) {
  const DType dtype = g.input(0)->dtype();
  CASTOR_ASSIGN_OR_RETURN(Value * constant_value, g.Scalar(constant, dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * square, g.Emit1("Mul", {g.input(0), g.input(0)}));
  CASTOR_ASSIGN_OR_RETURN(Value * inner, subtract_square
                                             ? g.Emit1("Sub", {constant_value, square})
                                             : g.Emit1("Add", {square, constant_value}));
  Value* denominator = inner;
  if (take_root) {
    CASTOR_ASSIGN_OR_RETURN(denominator, g.Emit1("Sqrt", {inner}));
  }
  Value* numerator = g.output_grad(0);
  if (negate) {
    CASTOR_ASSIGN_OR_RETURN(numerator, g.Emit1("Neg", {numerator}));
  }
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Div", {numerator, denominator}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status AsinGradient(GradientBuilder& g) {
  return InverseFunctionGradient(g, 1.0, /*subtract_square=*/true, /*take_root=*/true,
                                 /*negate=*/false);
}
absl::Status AcosGradient(GradientBuilder& g) {
  return InverseFunctionGradient(g, 1.0, /*subtract_square=*/true, /*take_root=*/true,
                                 /*negate=*/true);
}
absl::Status AtanGradient(GradientBuilder& g) {
  return InverseFunctionGradient(g, 1.0, /*subtract_square=*/false, /*take_root=*/false,
                                 /*negate=*/false);
}
absl::Status AsinhGradient(GradientBuilder& g) {
  return InverseFunctionGradient(g, 1.0, /*subtract_square=*/false, /*take_root=*/true,
                                 /*negate=*/false);
}
absl::Status AcoshGradient(GradientBuilder& g) {
  return InverseFunctionGradient(g, -1.0, /*subtract_square=*/false, /*take_root=*/true,
                                 /*negate=*/false);
}
absl::Status AtanhGradient(GradientBuilder& g) {
  return InverseFunctionGradient(g, 1.0, /*subtract_square=*/true, /*take_root=*/false,
                                 /*negate=*/false);
}

// Y = A ^ B: dA = dY * B * A^(B-1); dB = dY * Y * log(A).
absl::Status PowGradient(GradientBuilder& g) {
  Value* a = g.input(0);
  Value* b = g.input(1);
  Value* dy = g.output_grad(0);
  if (g.wants_input_grad(0)) {
    Value* b_as_a = b;
    if (b->dtype() != a->dtype()) {
      CASTOR_ASSIGN_OR_RETURN(b_as_a, g.Emit1("Cast", {b}, {Attribute::Int("to", DTypeToOnnx(a->dtype()))}));
    }
    CASTOR_ASSIGN_OR_RETURN(Value * one, g.Scalar(1.0, a->dtype()));
    CASTOR_ASSIGN_OR_RETURN(Value * b_minus_one, g.Emit1("Sub", {b_as_a, one}));
    CASTOR_ASSIGN_OR_RETURN(Value * power, g.Emit1("Pow", {a, b_minus_one}));
    CASTOR_ASSIGN_OR_RETURN(Value * derivative, g.Emit1("Mul", {power, b_as_a}));
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Mul", {dy, derivative}));
    CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 0, grad));
  }
  if (g.wants_input_grad(1)) {
    CASTOR_ASSIGN_OR_RETURN(Value * log_a, g.Emit1("Log", {a}));
    CASTOR_ASSIGN_OR_RETURN(Value * scaled, g.Emit1("Mul", {g.output(0), log_a}));
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Mul", {dy, scaled}));
    if (b->dtype() != a->dtype()) {
      CASTOR_ASSIGN_OR_RETURN(grad, g.Emit1("Cast", {grad}, {Attribute::Int("to", DTypeToOnnx(b->dtype()))}));
    }
    CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 1, grad));
  }
  return absl::OkStatus();
}

// Y = 1 / X: dX = -dY * Y^2.
absl::Status ReciprocalGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * square, g.Emit1("Mul", {g.output(0), g.output(0)}));
  CASTOR_ASSIGN_OR_RETURN(Value * scaled, g.Emit1("Mul", {g.output_grad(0), square}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Neg", {scaled}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// The elementwise rules below test signs with ReluGrad(dY, V) = dY where
// V > 0, else 0: there are no Greater, Less or Sign kernels, and Equal on
// floats exists only from opset 11 while these ops are older.

// Y = |X|: dX = dY * sign(X), 0 at X = 0 (as PyTorch):
// ReluGrad(dY, X) - ReluGrad(dY, -X).
absl::Status AbsGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * negated, g.Emit1("Neg", {g.input(0)}));
  CASTOR_ASSIGN_OR_RETURN(Value * positive, g.Emit1("ReluGrad", {g.output_grad(0), g.input(0)}, {},
                                                    kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * negative, g.Emit1("ReluGrad", {g.output_grad(0), negated}, {},
                                                    kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Sub", {positive, negative}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = LeakyRelu(X): dX = dY where X > 0, alpha * dY where X <= 0 (PyTorch's
// side at 0): P + alpha * (dY - P) with P = ReluGrad(dY, X), exact on both
// sides.
absl::Status LeakyReluGradient(GradientBuilder& g) {
  const DType dtype = g.input(0)->dtype();
  CASTOR_ASSIGN_OR_RETURN(Value * alpha, g.Scalar(g.node().GetFloat("alpha", 0.01f), dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * positive, g.Emit1("ReluGrad", {g.output_grad(0), g.input(0)}, {},
                                                    kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * rest, g.Emit1("Sub", {g.output_grad(0), positive}));
  CASTOR_ASSIGN_OR_RETURN(Value * scaled, g.Emit1("Mul", {rest, alpha}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Add", {positive, scaled}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = HardSigmoid(X) = clamp(Z, 0, 1), Z = alpha X + beta: dX = alpha dY
// where 0 < Z < 1, else 0 (strictly inside, as PyTorch's
// hardsigmoid_backward: at x = -3 and x = 3 it gives 0):
// ReluGrad(ReluGrad(alpha dY, Z), 1 - Z).
absl::Status HardSigmoidGradient(GradientBuilder& g) {
  const DType dtype = g.input(0)->dtype();
  CASTOR_ASSIGN_OR_RETURN(Value * alpha, g.Scalar(g.node().GetFloat("alpha", 0.2f), dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * beta, g.Scalar(g.node().GetFloat("beta", 0.5f), dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * one, g.Scalar(1.0, dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * scaled_x, g.Emit1("Mul", {g.input(0), alpha}));
  CASTOR_ASSIGN_OR_RETURN(Value * z, g.Emit1("Add", {scaled_x, beta}));
  CASTOR_ASSIGN_OR_RETURN(Value * below_one, g.Emit1("Sub", {one, z}));
  CASTOR_ASSIGN_OR_RETURN(Value * scaled, g.Emit1("Mul", {g.output_grad(0), alpha}));
  CASTOR_ASSIGN_OR_RETURN(Value * above_zero,
                          g.Emit1("ReluGrad", {scaled, z}, {}, kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * grad,
                          g.Emit1("ReluGrad", {above_zero, below_one}, {}, kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = HardSwish(X) = X clamp(X + 3, 0, 6) / 6: dX = 0 where X < -3,
// dY (X / 3 + 1/2) where -3 <= X <= 3, dY where X > 3. Both ends of the
// middle piece are closed, as in PyTorch's hardswish_backward (at x = -3
// it gives -dY / 2, at x = 3 it gives 3 dY / 2). With M = dY (X / 3 + 1/2):
// dX = M - ReluGrad(M, -3 - X) - ReluGrad(M, X - 3) + ReluGrad(dY, X - 3),
// each term exactly M, dY or 0.
absl::Status HardSwishGradient(GradientBuilder& g) {
  Value* x = g.input(0);
  Value* dy = g.output_grad(0);
  const DType dtype = x->dtype();
  CASTOR_ASSIGN_OR_RETURN(Value * three, g.Scalar(3.0, dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * minus_three, g.Scalar(-3.0, dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * half, g.Scalar(0.5, dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * third, g.Emit1("Div", {x, three}));
  CASTOR_ASSIGN_OR_RETURN(Value * slope, g.Emit1("Add", {third, half}));
  CASTOR_ASSIGN_OR_RETURN(Value * middle, g.Emit1("Mul", {dy, slope}));
  CASTOR_ASSIGN_OR_RETURN(Value * below_gap, g.Emit1("Sub", {minus_three, x}));  // > 0: X < -3
  CASTOR_ASSIGN_OR_RETURN(Value * above_gap, g.Emit1("Sub", {x, three}));        // > 0: X > 3
  CASTOR_ASSIGN_OR_RETURN(Value * middle_below,
                          g.Emit1("ReluGrad", {middle, below_gap}, {}, kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * middle_above,
                          g.Emit1("ReluGrad", {middle, above_gap}, {}, kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * dy_above,
                          g.Emit1("ReluGrad", {dy, above_gap}, {}, kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * inside, g.Emit1("Sub", {middle, middle_below}));
  CASTOR_ASSIGN_OR_RETURN(Value * closed, g.Emit1("Sub", {inside, middle_above}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Add", {closed, dy_above}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// The exponential family below splits dY with P = ReluGrad(dY, X) (dY where
// X > 0) and N = dY - P (dY where X <= 0, PyTorch's side of the kink at 0,
// as elu_backward), and reads the negative side's derivative off Y, so no
// exp(X) can overflow for large X:
// Elu: Y = alpha (e^X - 1), dY/dX = alpha e^X = Y + alpha;
// Selu: Y = gamma alpha (e^X - 1), dY/dX = Y + gamma alpha (positive side gamma);
// Celu: Y = alpha (e^(X/alpha) - 1), dY/dX = e^(X/alpha) = Y / alpha + 1.
absl::Status ExponentialUnitGradient(GradientBuilder& g, double positive_slope,
                                     double output_scale, double offset) {
  const DType dtype = g.input(0)->dtype();
  Value* dy = g.output_grad(0);
  CASTOR_ASSIGN_OR_RETURN(Value * positive, g.Emit1("ReluGrad", {dy, g.input(0)}, {},
                                                    kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * negative, g.Emit1("Sub", {dy, positive}));
  Value* y = g.output(0);
  if (output_scale != 1.0) {
    CASTOR_ASSIGN_OR_RETURN(Value * scale, g.Scalar(output_scale, dtype));
    CASTOR_ASSIGN_OR_RETURN(y, g.Emit1("Mul", {y, scale}));
  }
  CASTOR_ASSIGN_OR_RETURN(Value * shift, g.Scalar(offset, dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * slope, g.Emit1("Add", {y, shift}));
  CASTOR_ASSIGN_OR_RETURN(Value * negative_grad, g.Emit1("Mul", {negative, slope}));
  if (positive_slope != 1.0) {
    CASTOR_ASSIGN_OR_RETURN(Value * gain, g.Scalar(positive_slope, dtype));
    CASTOR_ASSIGN_OR_RETURN(positive, g.Emit1("Mul", {positive, gain}));
  }
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Add", {positive, negative_grad}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status EluGradient(GradientBuilder& g) {
  const double alpha = g.node().GetFloat("alpha", 1.0f);
  return ExponentialUnitGradient(g, 1.0, 1.0, alpha);
}

absl::Status SeluGradient(GradientBuilder& g) {
  const double alpha = g.node().GetFloat("alpha", 1.67326319217681884765625f);
  const double gamma = g.node().GetFloat("gamma", 1.05070102214813232421875f);
  return ExponentialUnitGradient(g, gamma, 1.0, gamma * alpha);
}

absl::Status CeluGradient(GradientBuilder& g) {
  const double alpha = g.node().GetFloat("alpha", 1.0f);
  return ExponentialUnitGradient(g, 1.0, 1.0 / alpha, 1.0);
}

// Y = ln(1 + e^X): dX = dY * sigmoid(X).
absl::Status SoftplusGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * sigmoid, g.Emit1("Sigmoid", {g.input(0)}));
  return TimesDerivative(g, sigmoid);
}

// Y = X / (1 + |X|): dX = dY / (1 + |X|)^2.
absl::Status SoftsignGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * one, g.Scalar(1.0, g.input(0)->dtype()));
  CASTOR_ASSIGN_OR_RETURN(Value * magnitude, g.Emit1("Abs", {g.input(0)}));
  CASTOR_ASSIGN_OR_RETURN(Value * denominator, g.Emit1("Add", {magnitude, one}));
  CASTOR_ASSIGN_OR_RETURN(Value * square, g.Emit1("Mul", {denominator, denominator}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Div", {g.output_grad(0), square}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = X where X > alpha, else 0: dX = dY where X > alpha (PyTorch's
// threshold_backward passes nothing at X == alpha): ReluGrad(dY, X - alpha).
absl::Status ThresholdedReluGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * alpha,
                          g.Scalar(g.node().GetFloat("alpha", 1.0f), g.input(0)->dtype()));
  CASTOR_ASSIGN_OR_RETURN(Value * margin, g.Emit1("Sub", {g.input(0), alpha}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("ReluGrad", {g.output_grad(0), margin}, {},
                                                kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = X tanh(softplus(X)): with T = tanh(softplus(X)) and S = sigmoid(X),
// dX = dY (T + X S (1 - T^2)), PyTorch's mish_backward.
absl::Status MishGradient(GradientBuilder& g) {
  Value* x = g.input(0);
  CASTOR_ASSIGN_OR_RETURN(Value * one, g.Scalar(1.0, x->dtype()));
  CASTOR_ASSIGN_OR_RETURN(Value * softplus, g.Emit1("Softplus", {x}));
  CASTOR_ASSIGN_OR_RETURN(Value * t, g.Emit1("Tanh", {softplus}));
  CASTOR_ASSIGN_OR_RETURN(Value * s, g.Emit1("Sigmoid", {x}));
  CASTOR_ASSIGN_OR_RETURN(Value * t_square, g.Emit1("Mul", {t, t}));
  CASTOR_ASSIGN_OR_RETURN(Value * sech_square, g.Emit1("Sub", {one, t_square}));
  CASTOR_ASSIGN_OR_RETURN(Value * xs, g.Emit1("Mul", {x, s}));
  CASTOR_ASSIGN_OR_RETURN(Value * chain, g.Emit1("Mul", {xs, sech_square}));
  CASTOR_ASSIGN_OR_RETURN(Value * derivative, g.Emit1("Add", {t, chain}));
  return TimesDerivative(g, derivative);
}

// Y = PRelu(X, slope): with P = ReluGrad(dY, X) and N = dY - P (X <= 0,
// PyTorch's side at 0): dX = P + N slope; dslope = N X summed to the
// slope's shape.
absl::Status PReluGradient(GradientBuilder& g) {
  Value* x = g.input(0);
  Value* slope = g.input(1);
  CASTOR_ASSIGN_OR_RETURN(Value * positive, g.Emit1("ReluGrad", {g.output_grad(0), x}, {},
                                                    kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * negative, g.Emit1("Sub", {g.output_grad(0), positive}));
  if (g.wants_input_grad(0)) {
    CASTOR_ASSIGN_OR_RETURN(Value * scaled, g.Emit1("Mul", {negative, slope}));
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Add", {positive, scaled}));
    g.SetInputGrad(0, grad);
  }
  if (g.wants_input_grad(1)) {
    CASTOR_ASSIGN_OR_RETURN(Value * product, g.Emit1("Mul", {negative, x}));
    CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 1, product));
  }
  return absl::OkStatus();
}

// Y = Clip(X, min, max) (bounds as attributes before opset 11, optional
// inputs from 11): dX = dY where min < X < max, else 0 (a bound-equal X
// gets 0, as PyTorch's hardtanh/relu6, which export as Clip; torch.clamp
// would pass it): ReluGrad(ReluGrad(dY, X - min), max - X). A trainable
// bound gets dY where X is beyond it, summed to its shape.
absl::Status ClipGradient(GradientBuilder& g) {
  const Node& node = g.node();
  Value* x = g.input(0);
  const DType dtype = x->dtype();
  Value* dy = g.output_grad(0);
  Value* min = nullptr;
  Value* max = nullptr;
  if (g.opset() < 11) {
    if (node.attribute("min") != nullptr) {
      CASTOR_ASSIGN_OR_RETURN(min, g.Scalar(node.GetFloat("min", 0.0f), dtype));
    }
    if (node.attribute("max") != nullptr) {
      CASTOR_ASSIGN_OR_RETURN(max, g.Scalar(node.GetFloat("max", 0.0f), dtype));
    }
  } else {
    min = g.input(1);
    max = g.input(2);
  }
  Value* above_min = nullptr;  // X - min
  Value* below_max = nullptr;  // max - X
  if (min != nullptr) {
    CASTOR_ASSIGN_OR_RETURN(above_min, g.Emit1("Sub", {x, min}));
  }
  if (max != nullptr) {
    CASTOR_ASSIGN_OR_RETURN(below_max, g.Emit1("Sub", {max, x}));
  }
  if (g.wants_input_grad(0)) {
    Value* grad = dy;
    for (Value* margin : {above_min, below_max}) {
      if (margin == nullptr) continue;
      CASTOR_ASSIGN_OR_RETURN(grad, g.Emit1("ReluGrad", {grad, margin}, {}, kCastorDomain));
    }
    g.SetInputGrad(0, grad);
  }
  for (int bound : {1, 2}) {
    if (!g.wants_input_grad(bound)) continue;
    // X beyond the bound: min - X > 0, or X - max > 0.
    CASTOR_ASSIGN_OR_RETURN(Value * beyond, g.Emit1("Neg", {bound == 1 ? above_min : below_max}));
    CASTOR_ASSIGN_OR_RETURN(Value * clipped, g.Emit1("ReluGrad", {dy, beyond}, {}, kCastorDomain));
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("ReduceToShapeOf", {clipped, g.input(bound)}, {},
                                                  kCastorDomain));
    g.SetInputGrad(bound, grad);
  }
  return absl::OkStatus();
}

// Y = Where(C, A, B): dA = dY where C, dB = dY where not C, each summed to
// its input's shape.
absl::Status WhereGradient(GradientBuilder& g) {
  const DType dtype = g.output(0)->dtype();
  CASTOR_ASSIGN_OR_RETURN(Value * zero, g.Scalar(0.0, dtype));
  if (g.wants_input_grad(1)) {
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Where", {g.input(0), g.output_grad(0), zero}));
    CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 1, grad));
  }
  if (g.wants_input_grad(2)) {
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Where", {g.input(0), zero, g.output_grad(0)}));
    CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 2, grad));
  }
  return absl::OkStatus();
}

// 1 where `value` equals `extreme` (its max or min over some inputs or
// axes, broadcast to `ones`' shape), else 0: 1 - ReluGrad(ones, gap) with
// gap = extreme - value (max) or value - extreme (min), never negative.
absl::StatusOr<Value*> ExtremeMask(GradientBuilder& g, Value* value, Value* extreme, Value* ones,
                                   bool max) {
  CASTOR_ASSIGN_OR_RETURN(Value * gap, max ? g.Emit1("Sub", {extreme, value})
                                           : g.Emit1("Sub", {value, extreme}));
  CASTOR_ASSIGN_OR_RETURN(Value * not_extreme, g.Emit1("ReluGrad", {ones, gap}, {}, kCastorDomain));
  return g.Emit1("Sub", {ones, not_extreme});
}

// Y = Max(X_0, ..., X_n) or Min (broadcasting): each input equal to Y takes
// an equal share of dY: dX_i = dY * [X_i == Y] / #{j : X_j == Y}, summed to
// X_i's shape. For two inputs that is PyTorch's torch.maximum/minimum
// convention (a tie splits the gradient half and half).
absl::Status MaxMinGradient(GradientBuilder& g) {
  const int n = g.node().num_inputs();
  if (n == 1) return IdentityGradient(g);
  const bool max = g.node().op_type() == "Max";
  CASTOR_ASSIGN_OR_RETURN(Value * ones, ZerosLike(g, g.output(0), 1.0));
  std::vector<Value*> masks;
  for (int i = 0; i < n; ++i) {
    CASTOR_ASSIGN_OR_RETURN(Value * mask, ExtremeMask(g, g.input(i), g.output(0), ones, max));
    masks.push_back(mask);
  }
  CASTOR_ASSIGN_OR_RETURN(Value * ties, g.Emit1("Sum", masks));
  CASTOR_ASSIGN_OR_RETURN(Value * share, g.Emit1("Div", {g.output_grad(0), ties}));
  for (int i = 0; i < n; ++i) {
    if (!g.wants_input_grad(i)) continue;
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Mul", {share, masks[i]}));
    CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, i, grad));
  }
  return absl::OkStatus();
}

// Y = Gelu(X) (ONNX's, opset 20, or castor's form at any opset).
// approximate="none": Y = X * Phi(X), dX = dY * (Phi(X) + X * phi(X)),
// Phi(x) = (1 + erf(x / sqrt 2)) / 2, phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
// approximate="tanh": Y = X (1 + tanh(u)) / 2, u = c (X + k X^3),
// dX = dY * ((1 + t) / 2 + X (1 - t^2) c (1 + 3 k X^2) / 2), t = tanh(u),
// c = sqrt(2 / pi), k = 0.044715. One GeluGrad node (com.castor) computes
// it in float32 in one pass (math::GeluGradOp), where the formula as ONNX
// ops took a dozen elementwise nodes, each rounding in a 16-bit dtype.
absl::Status GeluGradient(GradientBuilder& g) {
  const std::string approximate = g.node().GetString("approximate", "none");
  if (approximate != "none" && approximate != "tanh") {
    return absl::InvalidArgumentError(
        absl::StrCat("attribute 'approximate' is \"", approximate, "\"; expected none or tanh"));
  }
  CASTOR_ASSIGN_OR_RETURN(
      Value * grad, g.Emit1("GeluGrad", {g.output_grad(0), g.input(0)},
                            {Attribute::String("approximate", approximate)}, kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// ---- matrix products -----------------------------------------------------------

// `value` with its last two axes swapped.
absl::StatusOr<Value*> SwapLastAxes(GradientBuilder& g, Value* value) {
  const int rank = value->shape().rank();
  std::vector<int64_t> perm(rank);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[rank - 1], perm[rank - 2]);
  return g.Emit1("Transpose", {value}, {Attribute::Ints("perm", perm)});
}

// MatMul's K (A [..., M, K] @ B [K, N]): A's last dim, or B's first where
// only B's is static (an exporter's computed Reshape leaves A's unknown;
// MatMul requires the two equal). 0 when neither is known.
int64_t SharedK(const GradientBuilder& g) {
  const Shape& a = g.input(0)->shape();
  const Shape& b = g.input(1)->shape();
  if (a[a.rank() - 1].is_static()) return a[a.rank() - 1].value();
  return b[0].is_static() ? b[0].value() : 0;
}

// True when MatMul's B is one matrix [K, N] shared by every batch of a
// rank > 2 A [..., M, K] (a linear layer applied to a sequence), with K and
// N static and non-zero and Gemm's C optional (opset 11+): then dB is one
// Gemm over the folded batch (SharedMatrixGradient).
bool SharedMatrixGradientAsOneGemm(const GradientBuilder& g) {
  const Shape& a = g.input(0)->shape();
  const Shape& b = g.input(1)->shape();
  // (K and N must also be non-zero: Reshape reads a 0 in its shape as "copy
  // this dim", not as a size.)
  return g.opset() >= 11 && a.rank() > 2 && b.rank() == 2 && SharedK(g) > 0 &&
         b[1].is_static() && b[1].value() > 0;
}

// dB = sum over the batches of A_i^T dY_i = A'^T dY' with A' = A viewed as
// [batch * M, K] and dY' = dY as [batch * M, N]: one Gemm (transA), where
// the general rule makes a transposed copy of A, runs one small product
// per batch and sums the products over the batch (rounding each to a
// 16-bit dtype on the way). Here every sum accumulates in float32 once.
absl::StatusOr<Value*> SharedMatrixGradient(GradientBuilder& g) {
  const int64_t k = SharedK(g);
  const int64_t n = g.input(1)->shape()[1].value();
  CASTOR_ASSIGN_OR_RETURN(Value * a_rows_shape, g.Int64s({-1, k}));
  CASTOR_ASSIGN_OR_RETURN(Value * dy_rows_shape, g.Int64s({-1, n}));
  CASTOR_ASSIGN_OR_RETURN(Value * a_rows, g.Emit1("Reshape", {g.input(0), a_rows_shape}));
  CASTOR_ASSIGN_OR_RETURN(Value * dy_rows,
                          g.Emit1("Reshape", {g.output_grad(0), dy_rows_shape}));
  return g.Emit1("Gemm", {a_rows, dy_rows}, {Attribute::Int("transA", 1)});
}

// Y = A @ B (rank >= 2, batch dims broadcast): dA = dY @ B^T, dB = A^T @ dY
// (for a B shared by every batch, one Gemm: SharedMatrixGradient).
absl::Status MatMulGradient(GradientBuilder& g) {
  Value* a = g.input(0);
  Value* b = g.input(1);
  if (a->shape().rank() < 2 || b->shape().rank() < 2) {
    return absl::UnimplementedError(absl::StrCat(
        "MatMul with a 1-D input (ranks ", a->shape().rank(), " and ", b->shape().rank(),
        ") has no gradient rule yet; reshape the vector to a matrix"));
  }
  if (g.wants_input_grad(0)) {
    CASTOR_ASSIGN_OR_RETURN(Value * b_t, SwapLastAxes(g, b));
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("MatMul", {g.output_grad(0), b_t}));
    if (b->shape().rank() == 2) {
      g.SetInputGrad(0, grad);  // B has no batch axes to broadcast A's: dY @ B^T is A's shape
    } else {
      CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 0, grad));
    }
  }
  if (g.wants_input_grad(1)) {
    if (SharedMatrixGradientAsOneGemm(g)) {
      CASTOR_ASSIGN_OR_RETURN(Value * grad, SharedMatrixGradient(g));
      g.SetInputGrad(1, grad);
      return absl::OkStatus();
    }
    CASTOR_ASSIGN_OR_RETURN(Value * a_t, SwapLastAxes(g, a));
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("MatMul", {a_t, g.output_grad(0)}));
    CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 1, grad));
  }
  return absl::OkStatus();
}

// Y = alpha * op(A) @ op(B) + beta * C, op = optional transpose. Each input
// gradient is one Gemm with the transposes arranged so no Transpose node is
// needed (with a zero C below opset 11, where C is not optional).
absl::Status GemmGradient(GradientBuilder& g) {
  const Node& node = g.node();
  const bool trans_a = node.GetInt("transA", 0) != 0;
  const bool trans_b = node.GetInt("transB", 0) != 0;
  const float alpha = node.GetFloat("alpha", 1.0f);
  const float beta = node.GetFloat("beta", 1.0f);
  Value* a = g.input(0);
  Value* b = g.input(1);
  Value* dy = g.output_grad(0);
  auto gemm = [&](Value* left, Value* right, bool t_left, bool t_right) -> absl::StatusOr<Value*> {
    std::vector<Attribute> attributes = {Attribute::Float("alpha", alpha),
                                         Attribute::Int("transA", t_left),
                                         Attribute::Int("transB", t_right)};
    if (g.opset() >= 11) return g.Emit1("Gemm", {left, right}, std::move(attributes));
    // Below opset 11 Gemm's C is required: a zero scalar, weighted 0.
    CASTOR_ASSIGN_OR_RETURN(Value * zero, g.Scalar(0.0f, g.output(0)->dtype()));
    attributes.push_back(Attribute::Float("beta", 0.0f));
    return g.Emit1("Gemm", {left, right, zero}, std::move(attributes));
  };
  if (g.wants_input_grad(0)) {
    // dA = dY B^T (no transposes), with op(B) and op(A) folded in.
    absl::StatusOr<Value*> grad = trans_a ? (trans_b ? gemm(b, dy, true, true)
                                                     : gemm(b, dy, false, true))
                                          : (trans_b ? gemm(dy, b, false, false)
                                                     : gemm(dy, b, false, true));
    CASTOR_RETURN_IF_ERROR(grad.status());
    g.SetInputGrad(0, *grad);
  }
  if (g.wants_input_grad(1)) {
    absl::StatusOr<Value*> grad = trans_b ? (trans_a ? gemm(dy, a, true, true)
                                                     : gemm(dy, a, true, false))
                                          : (trans_a ? gemm(a, dy, false, false)
                                                     : gemm(a, dy, true, false));
    CASTOR_RETURN_IF_ERROR(grad.status());
    g.SetInputGrad(1, *grad);
  }
  if (g.wants_input_grad(2)) {
    Value* grad = dy;
    if (beta != 1.0f) {
      CASTOR_ASSIGN_OR_RETURN(Value * scale, g.Scalar(beta, g.output(0)->dtype()));
      CASTOR_ASSIGN_OR_RETURN(grad, g.Emit1("Mul", {dy, scale}));
    }
    CASTOR_RETURN_IF_ERROR(SetUnbroadcast(g, 2, grad));
  }
  return absl::OkStatus();
}

// Y = Einsum(X_0, ..., X_n-1) by an equation: dX_i = Einsum(dY, the other
// inputs -> the subscripts of X_i), every term linear in X_i. Ranks must be
// known: "..." is spelled out with letters the equation leaves free. A
// label only X_i has (summed away in the forward) is missing from the
// backward terms, so the backward Einsum leaves its axis out and
// Unsqueeze + Expand(Shape(X_i)) put it back; a dim of X_i that the
// forward broadcast (size 1, or "..." dims X_i lacks) is summed back by
// ReduceToShapeOf. A subscript repeated within X_i (a diagonal) has no rule.
absl::Status EinsumGradient(GradientBuilder& g) {
  const Node& node = g.node();
  const int n = node.num_inputs();
  CASTOR_ASSIGN_OR_RETURN(EinsumEquation equation,
                          ParseEinsumEquation(node.GetString("equation", ""), n));
  std::vector<int64_t> ranks;
  for (int i = 0; i < n; ++i) {
    if (!g.input(i)->shape().rank_known()) {
      return absl::UnimplementedError(
          absl::StrCat("input ", i, "'s rank is unknown; Einsum's gradient needs every rank"));
    }
    ranks.push_back(g.input(i)->shape().rank());
  }
  CASTOR_ASSIGN_OR_RETURN(EinsumAxes axes, ResolveEinsumAxes(equation, ranks));
  // Each "..." dim gets a letter no term uses.
  std::vector<bool> used(kEinsumLetters, false);
  for (const std::vector<int>& term : equation.inputs) {
    for (int label : term) {
      if (label != kEinsumEllipsis) used[label] = true;
    }
  }
  std::vector<int> letter_of(kEinsumLetters + axes.ellipsis_rank);
  std::iota(letter_of.begin(), letter_of.begin() + kEinsumLetters, 0);
  int free_letter = 0;
  for (int j = 0; j < axes.ellipsis_rank; ++j) {
    while (free_letter < kEinsumLetters && used[free_letter]) ++free_letter;
    if (free_letter == kEinsumLetters) {
      return absl::UnimplementedError(absl::StrCat(
          "\"...\" spans ", axes.ellipsis_rank, " dims and the equation leaves too few letters "
          "free to spell them out for the gradient"));
    }
    letter_of[kEinsumLetters + j] = free_letter++;
  }
  auto term_text = [&](const std::vector<int>& labels) {
    std::string text;
    for (int label : labels) text += EinsumLabelText(letter_of[label]);
    return text;
  };
  // The static size of each label where every dim of it is static.
  std::vector<int64_t> label_size(letter_of.size(), 1);
  std::vector<bool> label_static(letter_of.size(), true);
  for (int i = 0; i < n; ++i) {
    const Shape& shape = g.input(i)->shape();
    for (int axis = 0; axis < shape.rank(); ++axis) {
      const int label = axes.inputs[i][axis];
      if (!shape[axis].is_static()) {
        label_static[label] = false;
      } else if (shape[axis].value() != 1) {
        label_size[label] = shape[axis].value();
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    if (!g.wants_input_grad(i)) continue;
    const std::vector<int>& own = axes.inputs[i];
    std::vector<int> kept;       // labels of X_i the backward Einsum gives, in X_i's order
    std::vector<int64_t> added;  // axes of X_i for the labels only X_i has
    bool broadcast = false;  // whether the backward result needs ReduceToShapeOf
    for (size_t axis = 0; axis < own.size(); ++axis) {
      const int label = own[axis];
      for (size_t earlier = 0; earlier < axis; ++earlier) {
        if (own[earlier] == label) {
          return absl::UnimplementedError(absl::StrCat(
              "no gradient for input ", i, ": its subscripts '",
              EinsumTermText(equation.inputs[i]), "' repeat '", EinsumLabelText(letter_of[label]),
              "' (a diagonal)"));
        }
      }
      bool elsewhere = std::count(axes.output.begin(), axes.output.end(), label) > 0;
      for (int j = 0; j < n && !elsewhere; ++j) {
        elsewhere = j != i && std::count(axes.inputs[j].begin(), axes.inputs[j].end(), label) > 0;
      }
      if (!elsewhere) {
        added.push_back(static_cast<int64_t>(axis));
        continue;
      }
      kept.push_back(label);
      const Dim& dim = g.input(i)->shape()[static_cast<int>(axis)];
      if (!label_static[label] || !dim.is_static() || dim.value() != label_size[label]) {
        broadcast = true;
      }
    }
    // The backward Einsum's "..." dims: as many as the forward output's.
    for (int label : axes.output) {
      if (label >= kEinsumLetters && std::count(own.begin(), own.end(), label) == 0) {
        broadcast = true;
      }
    }
    std::string backward = term_text(axes.output);
    std::vector<Value*> inputs = {g.output_grad(0)};
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      backward += "," + term_text(axes.inputs[j]);
      inputs.push_back(g.input(j));
    }
    // Broadcast "..." dims of the output that X_i lacks stay in the
    // backward result (leading), for ReduceToShapeOf to sum.
    std::vector<int> result = kept;
    std::vector<int> leading;
    for (int label : axes.output) {
      if (label >= kEinsumLetters && std::count(own.begin(), own.end(), label) == 0) {
        leading.push_back(label);
      }
    }
    result.insert(result.begin(), leading.begin(), leading.end());
    backward += "->" + term_text(result);
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Einsum", inputs,
                                                  {Attribute::String("equation", backward)}));
    if (!added.empty()) {
      for (int64_t& axis : added) axis += static_cast<int64_t>(leading.size());
      if (g.opset() < 13) {  // Unsqueeze's axes are an attribute before opset 13
        CASTOR_ASSIGN_OR_RETURN(grad,
                                g.Emit1("Unsqueeze", {grad}, {Attribute::Ints("axes", added)}));
      } else {
        CASTOR_ASSIGN_OR_RETURN(Value * axes_value, g.Int64s(added));
        CASTOR_ASSIGN_OR_RETURN(grad, g.Emit1("Unsqueeze", {grad, axes_value}));
      }
      CASTOR_ASSIGN_OR_RETURN(Value * shape, g.ShapeOf(g.input(i)));
      CASTOR_ASSIGN_OR_RETURN(grad, g.Emit1("Expand", {grad, shape}));
    }
    if (broadcast) {
      CASTOR_ASSIGN_OR_RETURN(grad, g.Emit1("ReduceToShapeOf", {grad, g.input(i)}, {},
                                            kCastorDomain));
    }
    g.SetInputGrad(i, grad);
  }
  return absl::OkStatus();
}

// ---- shape and data movement -------------------------------------------------------

// Reshape, Flatten, Squeeze, Unsqueeze: dX = Reshape(dY, Shape(X)).
absl::Status ReshapeLikeInputGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * shape, g.ShapeOf(g.input(0)));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Reshape", {g.output_grad(0), shape}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status TransposeGradient(GradientBuilder& g) {
  const int rank = g.input(0)->shape().rank();
  std::vector<int64_t> perm = g.node().GetInts("perm", {});
  if (perm.empty()) {  // default: reverse the axes
    for (int i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Transpose", {g.output_grad(0)},
                                                {Attribute::Ints("perm", inverse)}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// The tensor a value always holds when the graph fixes it: a Constant
// node's value or an initializer that is not also a graph input (ONNX lets
// a caller override those); nullptr otherwise.
const Tensor* ConstantTensor(const Value* value) {
  if (value == nullptr) return nullptr;
  if (value->initializer() != nullptr && !value->is_graph_input()) return value->initializer();
  const Node* producer = value->producer();
  if (producer != nullptr && producer->op_type() == "Constant" && producer->domain().empty()) {
    const Attribute* attribute = producer->attribute("value");
    if (attribute != nullptr && attribute->kind == AttrKind::kTensor) return &attribute->t;
  }
  return nullptr;
}

// A 0-D int64 Constant (Range's and Gather's scalar operands).
absl::StatusOr<Value*> Int64Scalar(GradientBuilder& g, int64_t value) {
  CASTOR_ASSIGN_OR_RETURN(Value * out, g.Emit1("Constant", {}));
  out->producer()->SetAttribute(
      Attribute::TensorValue("value", Tensor::FromVector<int64_t>(DType::kInt64, {}, {value})));
  return out;
}

// `axis` in [0, rank), or an error naming the node's attribute.
absl::StatusOr<int64_t> NormalizedAxis(int64_t axis, int rank) {
  if (rank < 0) return absl::UnimplementedError("the input's rank is unknown");
  const int64_t normalized = axis < 0 ? axis + rank : axis;
  if (normalized < 0 || normalized >= rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("axis ", axis, " is out of range for rank ", rank));
  }
  return normalized;
}

// ReduceSum(value, axes, keepdims) written for the model's ONNX opset (axes
// an attribute before 13, an input from 13); empty `axes` reduces every
// axis.
absl::StatusOr<Value*> EmitReduceSum(GradientBuilder& g, Value* value,
                                     const std::vector<int64_t>& axes, bool keepdims) {
  std::vector<Attribute> attributes = {Attribute::Int("keepdims", keepdims ? 1 : 0)};
  if (axes.empty()) return g.Emit1("ReduceSum", {value}, attributes);
  if (g.onnx_opset() < 13) {
    attributes.push_back(Attribute::Ints("axes", axes));
    return g.Emit1("ReduceSum", {value}, attributes);
  }
  CASTOR_ASSIGN_OR_RETURN(Value * axes_value, g.Int64s(axes));
  return g.Emit1("ReduceSum", {value, axes_value}, attributes);
}

// Y = Concat(X_0, ..., X_n; axis): dX_i = the i-th piece of Split(dY) on
// axis, sized like X_i (static sizes; from opset 13 sizes read at run time).
absl::Status ConcatGradient(GradientBuilder& g) {
  const Node& node = g.node();
  const int n = node.num_inputs();
  if (n == 1) return IdentityGradient(g);
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis,
                          NormalizedAxis(node.GetInt("axis", 0), g.output(0)->shape().rank()));
  std::vector<int64_t> sizes;
  for (int i = 0; i < n; ++i) {
    const Shape& shape = g.input(i)->shape();
    if (!shape.rank_known() || !shape[axis].is_static()) break;
    sizes.push_back(shape[axis].value());
  }
  std::vector<Value*> pieces;
  if (static_cast<int>(sizes.size()) == n && g.opset() < 13) {
    CASTOR_ASSIGN_OR_RETURN(pieces, g.Emit("Split", {g.output_grad(0)}, n,
                                           {Attribute::Int("axis", axis),
                                            Attribute::Ints("split", sizes)}));
  } else {
    Value* split = nullptr;
    if (static_cast<int>(sizes.size()) == n) {
      CASTOR_ASSIGN_OR_RETURN(split, g.Int64s(sizes));
    } else if (g.opset() >= 13) {
      // Gather(Shape(X_i), [axis]) for each input, concatenated.
      CASTOR_ASSIGN_OR_RETURN(Value * at_axis, g.Int64s({axis}));
      std::vector<Value*> dims;
      for (int i = 0; i < n; ++i) {
        CASTOR_ASSIGN_OR_RETURN(Value * shape, g.ShapeOf(g.input(i)));
        CASTOR_ASSIGN_OR_RETURN(Value * dim, g.Emit1("Gather", {shape, at_axis}));
        dims.push_back(dim);
      }
      CASTOR_ASSIGN_OR_RETURN(split, g.Emit1("Concat", dims, {Attribute::Int("axis", 0)}));
    } else {
      return absl::UnimplementedError(absl::StrCat(
          "Concat inputs of unknown size along axis ", axis,
          " before opset 13 (Split's sizes are an attribute there)"));
    }
    CASTOR_ASSIGN_OR_RETURN(pieces, g.Emit("Split", {g.output_grad(0), split}, n,
                                           {Attribute::Int("axis", axis)}));
  }
  for (int i = 0; i < n; ++i) g.SetInputGrad(i, pieces[i]);
  return absl::OkStatus();
}

// Y_0..Y_n = Split(X; axis): dX = Concat(dY_0, ..., dY_n; axis), zeros
// standing in for outputs no gradient reaches.
absl::Status SplitGradient(GradientBuilder& g) {
  const Node& node = g.node();
  CASTOR_ASSIGN_OR_RETURN(const int64_t axis,
                          NormalizedAxis(node.GetInt("axis", 0), g.input(0)->shape().rank()));
  std::vector<Value*> pieces;
  for (int i = 0; i < node.num_outputs(); ++i) {
    Value* grad = g.output_grad(i);
    if (grad == nullptr) {
      CASTOR_ASSIGN_OR_RETURN(grad, ZerosLike(g, g.output(i)));
    }
    pieces.push_back(grad);
  }
  if (pieces.size() == 1) {
    g.SetInputGrad(0, pieces[0]);
    return absl::OkStatus();
  }
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Concat", pieces, {Attribute::Int("axis", axis)}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// The values of a small integer tensor known before the graph runs: a
// constant, or one that only reshapes or joins constants (exporters write
// a Slice's axes as Unsqueeze(Constant), or Concat of such pieces). Values
// keep their order through Unsqueeze, Squeeze, Reshape, Flatten, Identity
// and an integer Cast; Concat of rank <= 1 pieces joins them. nullopt
// otherwise (a value computed from the data, such as Shape of a tensor
// whose dims are only known at run time).
std::optional<std::vector<int64_t>> KnownInt64s(const Value* value, int depth = 0) {
  if (value == nullptr || depth > 16) return std::nullopt;
  if (value->dtype() != DType::kInt64 && value->dtype() != DType::kInt32) return std::nullopt;
  if (const Tensor* constant = ConstantTensor(value)) return constant->ToInt64Vector();
  const Node* producer = value->producer();
  if (producer == nullptr || !producer->domain().empty() || producer->num_inputs() == 0) {
    return std::nullopt;
  }
  const std::string& op = producer->op_type();
  if (op == "Unsqueeze" || op == "Squeeze" || op == "Reshape" || op == "Flatten" ||
      op == "Identity" || op == "Cast") {
    return KnownInt64s(producer->input(0), depth + 1);
  }
  if (op == "Concat") {
    std::vector<int64_t> joined;
    for (int i = 0; i < producer->num_inputs(); ++i) {
      const Value* piece = producer->input(i);
      if (piece == nullptr || !piece->shape().rank_known() || piece->shape().rank() > 1) {
        return std::nullopt;
      }
      std::optional<std::vector<int64_t>> values = KnownInt64s(piece, depth + 1);
      if (!values.has_value()) return std::nullopt;
      joined.insert(joined.end(), values->begin(), values->end());
    }
    return joined;
  }
  return std::nullopt;
}

// Element k of a Slice parameter (starts, ends, axes or steps): from the
// attribute before opset 10, else from the input when its values are known
// before the graph runs (KnownInt64s).
struct SliceParam {
  bool constant = false;        // the input's values are known
  std::vector<int64_t> values;  // the attribute's or the known input's values
  Value* value = nullptr;       // the input (opset 10+), if present
  bool known() const { return value == nullptr || constant; }
};

SliceParam ReadSliceParam(const GradientBuilder& g, const char* name, int input) {
  SliceParam param;
  if (g.opset() < 10) {
    param.values = g.node().GetInts(name, {});
    return param;
  }
  param.value = g.input(input);
  if (std::optional<std::vector<int64_t>> known = KnownInt64s(param.value)) {
    param.constant = true;
    param.values = *std::move(known);
  }
  return param;
}

// The indices Slice takes along an axis of `dim` elements (ONNX's
// clamping: negative bounds count from the end; steps may be negative).
std::vector<int64_t> SliceIndices(int64_t start, int64_t end, int64_t step, int64_t dim) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
  } else {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
  }
  std::vector<int64_t> indices;
  for (int64_t i = start; step > 0 ? i < end : i > end; i += step) indices.push_back(i);
  return indices;
}

// Y = Slice(X; starts, ends, axes, steps): a slice is one Gather per
// sliced axis (with the indices the slice takes there), so dX is one
// GatherGrad (a scatter-add into zeros) per axis, last axis first. The
// indices are constants when the bounds and the axis length are known;
// otherwise (opset 11+) they are Slice(Range(0, dim), start, end, step) at
// run time, so the Slice kernel itself does the clamping. Any step works.
absl::Status SliceGradient(GradientBuilder& g) {
  Value* x = g.input(0);
  const int rank = x->shape().rank();
  if (!x->shape().rank_known()) return absl::UnimplementedError("the input's rank is unknown");
  SliceParam starts = ReadSliceParam(g, "starts", 1);
  SliceParam ends = ReadSliceParam(g, "ends", 2);
  SliceParam axes = ReadSliceParam(g, "axes", 3);
  SliceParam steps = ReadSliceParam(g, "steps", 4);
  if (!axes.known()) {
    return absl::UnimplementedError("its axes (input 3) are computed at run time, not constants");
  }
  int64_t count = static_cast<int64_t>(starts.values.size());
  if (!starts.known()) {
    const Shape& shape = starts.value->shape();
    if (!shape.rank_known() || shape.rank() != 1 || !shape[0].is_static()) {
      return absl::UnimplementedError("the number of sliced axes (starts' length) is unknown");
    }
    count = shape[0].value();
  }
  std::vector<int64_t> axis_list = axes.values;
  if (axes.value == nullptr && axis_list.empty()) {
    for (int64_t k = 0; k < count; ++k) axis_list.push_back(k);
  }
  struct Step {
    int64_t axis;
    Value* indices;
  };
  std::vector<Step> plan;
  for (int64_t k = 0; k < static_cast<int64_t>(axis_list.size()); ++k) {
    CASTOR_ASSIGN_OR_RETURN(const int64_t axis, NormalizedAxis(axis_list[k], rank));
    const Dim& dim = x->shape()[axis];
    if (starts.known() && ends.known() && steps.known() && dim.is_static()) {
      const int64_t step = steps.values.empty() && steps.value == nullptr ? 1 : steps.values[k];
      if (step == 0) return absl::InvalidArgumentError("a slice step is 0");
      std::vector<int64_t> indices =
          SliceIndices(starts.values[k], ends.values[k], step, dim.value());
      bool whole = static_cast<int64_t>(indices.size()) == dim.value();
      for (size_t i = 0; whole && i < indices.size(); ++i) whole = indices[i] == static_cast<int64_t>(i);
      if (whole) continue;  // this axis is taken whole: nothing to scatter
      CASTOR_ASSIGN_OR_RETURN(Value * constant, g.Int64s(indices));
      plan.push_back({axis, constant});
      continue;
    }
    if (g.opset() < 11) {
      return absl::UnimplementedError(
          "slice bounds only known at run time before opset 11 (no Range to index them)");
    }
    // One element of a 1-D parameter, as a 1-D tensor of one element.
    auto element = [&](const SliceParam& param, int64_t fallback) -> absl::StatusOr<Value*> {
      if (param.value == nullptr) return g.Int64s({fallback});
      if (param.constant) return g.Int64s({param.values[k]});
      CASTOR_ASSIGN_OR_RETURN(Value * from, g.Int64s({k}));
      CASTOR_ASSIGN_OR_RETURN(Value * to, g.Int64s({k + 1}));
      return g.Emit1("Slice", {param.value, from, to});
    };
    CASTOR_ASSIGN_OR_RETURN(Value * start, element(starts, 0));
    CASTOR_ASSIGN_OR_RETURN(Value * end, element(ends, 0));
    CASTOR_ASSIGN_OR_RETURN(Value * step, element(steps, 1));
    CASTOR_ASSIGN_OR_RETURN(Value * shape, g.ShapeOf(x));
    CASTOR_ASSIGN_OR_RETURN(Value * at_axis, Int64Scalar(g, axis));
    CASTOR_ASSIGN_OR_RETURN(Value * length, g.Emit1("Gather", {shape, at_axis}));
    CASTOR_ASSIGN_OR_RETURN(Value * zero, Int64Scalar(g, 0));
    CASTOR_ASSIGN_OR_RETURN(Value * one, Int64Scalar(g, 1));
    CASTOR_ASSIGN_OR_RETURN(Value * iota, g.Emit1("Range", {zero, length, one}));
    CASTOR_ASSIGN_OR_RETURN(Value * first_axis, g.Int64s({0}));
    CASTOR_ASSIGN_OR_RETURN(Value * indices,
                            g.Emit1("Slice", {iota, start, end, first_axis, step}));
    plan.push_back({axis, indices});
  }
  if (plan.empty()) return IdentityGradient(g);
  // The forward slice as a chain of Gathers: X = Z_0 -> Z_1 -> ... -> Y;
  // GatherGrad reads each Z_k's shape.
  std::vector<Value*> gathered = {x};
  for (size_t k = 0; k + 1 < plan.size(); ++k) {
    CASTOR_ASSIGN_OR_RETURN(Value * next,
                            g.Emit1("Gather", {gathered.back(), plan[k].indices},
                                    {Attribute::Int("axis", plan[k].axis)}));
    gathered.push_back(next);
  }
  Value* grad = g.output_grad(0);
  for (size_t k = plan.size(); k-- > 0;) {
    CASTOR_ASSIGN_OR_RETURN(grad, g.Emit1("GatherGrad", {grad, plan[k].indices, gathered[k]},
                                          {Attribute::Int("axis", plan[k].axis)}, kCastorDomain));
  }
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = Expand(X, shape): dX = dY summed back to X's shape.
absl::Status ExpandGradient(GradientBuilder& g) { return SetUnbroadcast(g, 0, g.output_grad(0)); }

// Y = Tile(X, repeats), X of shape [d_0, ..., d_n-1]: dY viewed as
// [r_0, d_0, r_1, d_1, ...] summed over the r axes.
absl::Status TileGradient(GradientBuilder& g) {
  Value* x = g.input(0);
  const Shape& shape = x->shape();
  if (!shape.rank_known()) return absl::UnimplementedError("the input's rank is unknown");
  const int rank = shape.rank();
  if (rank == 0) return IdentityGradient(g);
  const Tensor* repeats = ConstantTensor(g.input(1));
  std::optional<std::vector<int64_t>> dims = shape.StaticDims();
  Value* interleaved = nullptr;
  if (repeats != nullptr && dims.has_value()) {
    const std::vector<int64_t> r = repeats->ToInt64Vector();
    std::vector<int64_t> view;
    for (int a = 0; a < rank; ++a) {
      view.push_back(r[a]);
      view.push_back((*dims)[a]);
    }
    CASTOR_ASSIGN_OR_RETURN(interleaved, g.Int64s(view));
  } else {
    // Concat([repeats as a column, Shape(X) as a column], axis 1), flattened.
    CASTOR_ASSIGN_OR_RETURN(Value * column, g.Int64s({-1, 1}));
    CASTOR_ASSIGN_OR_RETURN(Value * r, g.Emit1("Reshape", {g.input(1), column}));
    CASTOR_ASSIGN_OR_RETURN(Value * x_shape, g.ShapeOf(x));
    CASTOR_ASSIGN_OR_RETURN(Value * d, g.Emit1("Reshape", {x_shape, column}));
    CASTOR_ASSIGN_OR_RETURN(Value * pairs, g.Emit1("Concat", {r, d}, {Attribute::Int("axis", 1)}));
    CASTOR_ASSIGN_OR_RETURN(Value * flat, g.Int64s({-1}));
    CASTOR_ASSIGN_OR_RETURN(interleaved, g.Emit1("Reshape", {pairs, flat}));
  }
  CASTOR_ASSIGN_OR_RETURN(Value * viewed, g.Emit1("Reshape", {g.output_grad(0), interleaved}));
  std::vector<int64_t> repeat_axes;
  for (int a = 0; a < rank; ++a) repeat_axes.push_back(2 * a);
  CASTOR_ASSIGN_OR_RETURN(Value * grad, EmitReduceSum(g, viewed, repeat_axes, false));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = Pad(X, pads) in constant mode: dX = Pad(dY, -pads), which crops what
// was padded (and zero-pads what negative pads cropped).
absl::Status PadGradient(GradientBuilder& g) {
  const Node& node = g.node();
  const std::string mode = node.GetString("mode", "constant");
  if (mode != "constant") {
    return absl::UnimplementedError(absl::StrCat(
        "Pad in mode '", mode, "' (only constant mode has a gradient rule; ", mode,
        " mode would need a gradient kernel that folds the mirrored/copied border back)"));
  }
  if (g.wants_input_grad(2)) {
    return absl::UnimplementedError("a gradient for Pad's constant_value (input 2)");
  }
  const auto constant_mode = Attribute::String("mode", "constant");
  if (g.opset() < 11) {
    std::vector<int64_t> pads = node.GetInts("pads", {});
    for (int64_t& p : pads) p = -p;
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Pad", {g.output_grad(0)},
                                                  {constant_mode, Attribute::Ints("pads", pads)}));
    g.SetInputGrad(0, grad);
    return absl::OkStatus();
  }
  Value* negated = nullptr;
  if (const Tensor* pads = ConstantTensor(g.input(1))) {
    std::vector<int64_t> values = pads->ToInt64Vector();
    for (int64_t& p : values) p = -p;
    CASTOR_ASSIGN_OR_RETURN(negated, g.Int64s(values));
  } else {
    CASTOR_ASSIGN_OR_RETURN(Value * zero, g.Int64s({0}));
    CASTOR_ASSIGN_OR_RETURN(negated, g.Emit1("Sub", {zero, g.input(1)}));  // pads are int64
  }
  std::vector<Value*> inputs = {g.output_grad(0), negated};
  if (g.input(3) != nullptr) inputs = {g.output_grad(0), negated, nullptr, g.input(3)};  // axes
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Pad", inputs, {constant_mode}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// dX = dY * mask / (1 - ratio) for a Dropout node that draws, the mask read
// from the node's output 1 (the one the forward pass drew). `ratio` is the
// ratio input (nullptr: 0.5); `training_mode`, when given, a flag known only
// at run time: the scale becomes Where(training_mode, 1 / (1 - ratio), 1)
// (the mask is all true in inference).
absl::Status DrawnDropoutGradient(GradientBuilder& g, Value* ratio, Value* training_mode) {
  const Node& node = g.node();
  Value* dy = g.output_grad(0);
  const DType dtype = g.input(0)->dtype();
  Value* scale = nullptr;
  const Tensor* ratio_value = ratio == nullptr ? nullptr : ConstantTensor(ratio);
  const bool ratio_known = ratio == nullptr || ratio_value != nullptr;
  const double r = ratio == nullptr ? 0.5 : ratio_value != nullptr ? ratio_value->GetDouble(0) : 0;
  if (ratio_known) {
    if (r == 0.0) return IdentityGradient(g);  // keeps every element, unscaled
    if (!(r > 0.0 && r < 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("ratio ", r, " is outside [0, 1)"));
    }
  }
  if (node.num_outputs() < 2 || node.output(1) == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        node.op_type(), " in training mode without its mask output: the mask it drew is needed "
        "for the gradient (give the node a second output)"));
  }
  if (ratio_known) {
    CASTOR_ASSIGN_OR_RETURN(scale, g.Scalar(1.0 / (1.0 - r), dtype));
  } else {
    CASTOR_ASSIGN_OR_RETURN(Value * one, g.Scalar(1.0, dtype));
    if (ratio->dtype() != dtype) {
      CASTOR_ASSIGN_OR_RETURN(ratio, g.Emit1("Cast", {ratio}, {Attribute::Int("to", DTypeToOnnx(dtype))}));
    }
    CASTOR_ASSIGN_OR_RETURN(Value * keep, g.Emit1("Sub", {one, ratio}));
    CASTOR_ASSIGN_OR_RETURN(scale, g.Emit1("Div", {one, keep}));
  }
  if (training_mode != nullptr) {
    CASTOR_ASSIGN_OR_RETURN(Value * one, g.Scalar(1.0, dtype));
    CASTOR_ASSIGN_OR_RETURN(scale, g.Emit1("Where", {training_mode, scale, one}));
  }
  CASTOR_ASSIGN_OR_RETURN(Value * zero, g.Scalar(0.0, dtype));
  CASTOR_ASSIGN_OR_RETURN(Value * scaled, g.Emit1("Mul", {dy, scale}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Where", {node.output(1), scaled, zero}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y[, mask] = Dropout(X[, ratio, training_mode]). The kernels drop only
// from opset 12 with training_mode true (before 12, and with it false or
// absent, Y = X and the mask is all true): then DrawnDropoutGradient;
// otherwise dX = dY. A training_mode known only at run time scales by
// Where(training_mode, 1 / (1 - ratio), 1).
absl::Status DropoutGradient(GradientBuilder& g) {
  if (g.opset() < 12 || g.input(2) == nullptr) return IdentityGradient(g);
  const Tensor* training = ConstantTensor(g.input(2));
  if (training != nullptr && training->num_elements() == 1 && training->GetInt64(0) == 0) {
    return IdentityGradient(g);
  }
  return DrawnDropoutGradient(g, g.input(1), training == nullptr ? g.input(2) : nullptr);
}

// castor's DropoutTraining (the training graph's Dropout): Y, mask =
// DropoutTraining(X, ratio, rng) always draws, so dX = dY * mask / (1 -
// ratio) as Dropout's in training mode.
absl::Status DropoutTrainingGradient(GradientBuilder& g) {
  return DrawnDropoutGradient(g, g.input(1), /*training_mode=*/nullptr);
}

// ---- reductions ------------------------------------------------------------------------

// Which axes a Reduce* node reduces: the axes attribute, else its axes
// input (ReduceSum 13+, the others 18+; read as constants when they are),
// else all of them, unless noop_with_empty_axes makes it the identity.
struct ReducedAxes {
  std::vector<int64_t> axes;  // empty with value == nullptr: every axis
  Value* value = nullptr;     // an axes input known only at run time
  bool noop = false;
  bool all() const { return axes.empty() && value == nullptr; }
};

ReducedAxes ReadReducedAxes(const GradientBuilder& g) {
  const Node& node = g.node();
  ReducedAxes spec;
  spec.axes = node.GetInts("axes", {});
  if (spec.axes.empty() && node.input(1) != nullptr) {
    if (const Tensor* constant = ConstantTensor(node.input(1))) {
      spec.axes = constant->ToInt64Vector();
    } else {
      spec.value = node.input(1);
    }
  }
  spec.noop = spec.all() && node.GetInt("noop_with_empty_axes", 0) != 0;
  return spec;
}

// `value` (shaped like the node's output) with the reduced axes put back as
// size 1 when keepdims is 0, so it broadcasts against X.
absl::StatusOr<Value*> RestoreReducedAxes(GradientBuilder& g, const ReducedAxes& spec,
                                          Value* value) {
  if (g.node().GetInt("keepdims", 1) != 0) return value;
  std::vector<int64_t> axes = spec.axes;
  if (spec.all()) {
    const int rank = g.input(0)->shape().rank();
    if (!g.input(0)->shape().rank_known()) {
      return absl::UnimplementedError("the input's rank is unknown");
    }
    for (int i = 0; i < rank; ++i) axes.push_back(i);
  }
  if (g.opset() < 13) {  // Unsqueeze's axes are an attribute before opset 13
    return g.Emit1("Unsqueeze", {value}, {Attribute::Ints("axes", axes)});
  }
  Value* axes_value = spec.value;
  if (axes_value == nullptr) {
    CASTOR_ASSIGN_OR_RETURN(axes_value, g.Int64s(axes));
  }
  return g.Emit1("Unsqueeze", {value, axes_value});
}

// ReduceSum(value) over the node's reduced axes, keeping them.
absl::StatusOr<Value*> ReduceSumKept(GradientBuilder& g, const ReducedAxes& spec, Value* value) {
  if (spec.value != nullptr) {  // an axes input exists, so opset >= 13
    return g.Emit1("ReduceSum", {value, spec.value}, {Attribute::Int("keepdims", 1)});
  }
  return EmitReduceSum(g, value, spec.axes, true);
}

// ReduceSum / ReduceMean: dY (with the reduced axes restored) expanded to X,
// divided by the number of reduced elements for the mean.
absl::Status ReduceGradient(GradientBuilder& g, bool mean) {
  Value* x = g.input(0);
  const ReducedAxes spec = ReadReducedAxes(g);
  if (spec.noop) return IdentityGradient(g);
  CASTOR_ASSIGN_OR_RETURN(Value * dy, RestoreReducedAxes(g, spec, g.output_grad(0)));
  CASTOR_ASSIGN_OR_RETURN(Value * shape, g.ShapeOf(x));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Expand", {dy, shape}));
  if (mean) {
    // count = Size(X) / Size(Y), as a scalar of X's dtype.
    CASTOR_ASSIGN_OR_RETURN(Value * x_size, g.Emit1("Size", {x}));
    CASTOR_ASSIGN_OR_RETURN(Value * y_size, g.Emit1("Size", {g.output(0)}));
    const auto to = Attribute::Int("to", DTypeToOnnx(DType::kFloat32));
    CASTOR_ASSIGN_OR_RETURN(Value * x_count, g.Emit1("Cast", {x_size}, {to}));
    CASTOR_ASSIGN_OR_RETURN(Value * y_count, g.Emit1("Cast", {y_size}, {to}));
    CASTOR_ASSIGN_OR_RETURN(Value * fraction, g.Emit1("Div", {y_count, x_count}));
    if (x->dtype() != DType::kFloat32) {
      CASTOR_ASSIGN_OR_RETURN(fraction, g.Emit1("Cast", {fraction},
                                                {Attribute::Int("to", DTypeToOnnx(x->dtype()))}));
    }
    CASTOR_ASSIGN_OR_RETURN(grad, g.Emit1("Mul", {grad, fraction}));
  }
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status ReduceSumGradient(GradientBuilder& g) { return ReduceGradient(g, false); }
absl::Status ReduceMeanGradient(GradientBuilder& g) { return ReduceGradient(g, true); }

// ReduceMax / ReduceMin: dY shared evenly by the elements equal to the
// extreme (as torch.amax/amin; torch.max(dim) would give it all to one
// index): dX = mask * dY / ReduceSum(mask), mask = [X == Y] (ExtremeMask).
absl::Status ReduceExtremeGradient(GradientBuilder& g) {
  const ReducedAxes spec = ReadReducedAxes(g);
  if (spec.noop) return IdentityGradient(g);
  const bool max = g.node().op_type() == "ReduceMax";
  Value* x = g.input(0);
  CASTOR_ASSIGN_OR_RETURN(Value * y, RestoreReducedAxes(g, spec, g.output(0)));
  CASTOR_ASSIGN_OR_RETURN(Value * dy, RestoreReducedAxes(g, spec, g.output_grad(0)));
  CASTOR_ASSIGN_OR_RETURN(Value * ones, ZerosLike(g, x, 1.0));
  CASTOR_ASSIGN_OR_RETURN(Value * mask, ExtremeMask(g, x, y, ones, max));
  CASTOR_ASSIGN_OR_RETURN(Value * ties, ReduceSumKept(g, spec, mask));
  CASTOR_ASSIGN_OR_RETURN(Value * share, g.Emit1("Div", {dy, ties}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Mul", {mask, share}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = GlobalMaxPool(X), [N, C, D1, ...] -> [N, C, 1, ...]: ReduceMax over
// the spatial axes with keepdims, so the same rule (ties share evenly).
absl::Status GlobalMaxPoolGradient(GradientBuilder& g) {
  Value* x = g.input(0);
  if (!x->shape().rank_known() || x->shape().rank() < 3) {
    return absl::UnimplementedError("the input's rank is unknown or below 3");
  }
  std::vector<int64_t> spatial;
  for (int a = 2; a < x->shape().rank(); ++a) spatial.push_back(a);
  CASTOR_ASSIGN_OR_RETURN(Value * ones, ZerosLike(g, x, 1.0));
  CASTOR_ASSIGN_OR_RETURN(Value * mask, ExtremeMask(g, x, g.output(0), ones, /*max=*/true));
  CASTOR_ASSIGN_OR_RETURN(Value * ties, EmitReduceSum(g, mask, spatial, true));
  CASTOR_ASSIGN_OR_RETURN(Value * share, g.Emit1("Div", {g.output_grad(0), ties}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Mul", {mask, share}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = ReduceL2(X) = sqrt(sum X^2): dX = X * dY / Y, 0 where Y = 0 (as
// PyTorch's norm): X * ReluGrad(dY, Y) / (Y + [Y == 0]), Y never negative.
absl::Status ReduceL2Gradient(GradientBuilder& g) {
  const ReducedAxes spec = ReadReducedAxes(g);
  Value* x = g.input(0);
  Value* y = g.output(0);  // with noop_with_empty_axes, Y = |X| elementwise
  Value* dy = g.output_grad(0);
  if (!spec.noop) {
    CASTOR_ASSIGN_OR_RETURN(y, RestoreReducedAxes(g, spec, y));
    CASTOR_ASSIGN_OR_RETURN(dy, RestoreReducedAxes(g, spec, dy));
  }
  CASTOR_ASSIGN_OR_RETURN(Value * ones, ZerosLike(g, y, 1.0, x->dtype()));
  CASTOR_ASSIGN_OR_RETURN(Value * positive, g.Emit1("ReluGrad", {ones, y}, {}, kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * is_zero, g.Emit1("Sub", {ones, positive}));
  CASTOR_ASSIGN_OR_RETURN(Value * safe, g.Emit1("Add", {y, is_zero}));
  CASTOR_ASSIGN_OR_RETURN(Value * kept, g.Emit1("ReluGrad", {dy, y}, {}, kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * ratio, g.Emit1("Div", {kept, safe}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Mul", {x, ratio}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = ReduceSumSquare(X): dX = 2 X dY.
absl::Status ReduceSumSquareGradient(GradientBuilder& g) {
  const ReducedAxes spec = ReadReducedAxes(g);
  Value* dy = g.output_grad(0);  // with noop_with_empty_axes, Y = X^2 elementwise
  if (!spec.noop) {
    CASTOR_ASSIGN_OR_RETURN(dy, RestoreReducedAxes(g, spec, dy));
  }
  CASTOR_ASSIGN_OR_RETURN(Value * two, g.Scalar(2.0, g.input(0)->dtype()));
  CASTOR_ASSIGN_OR_RETURN(Value * twice, g.Emit1("Mul", {g.input(0), two}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Mul", {twice, dy}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = ReduceL1(X) = sum |X|: dX = dY * sign(X) (0 at 0, as Abs).
absl::Status ReduceL1Gradient(GradientBuilder& g) {
  const ReducedAxes spec = ReadReducedAxes(g);
  Value* x = g.input(0);
  Value* dy = g.output_grad(0);
  if (!spec.noop) {
    CASTOR_ASSIGN_OR_RETURN(dy, RestoreReducedAxes(g, spec, dy));
    CASTOR_ASSIGN_OR_RETURN(Value * shape, g.ShapeOf(x));
    CASTOR_ASSIGN_OR_RETURN(dy, g.Emit1("Expand", {dy, shape}));
  }
  CASTOR_ASSIGN_OR_RETURN(Value * negated, g.Emit1("Neg", {x}));
  CASTOR_ASSIGN_OR_RETURN(Value * positive, g.Emit1("ReluGrad", {dy, x}, {}, kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * negative, g.Emit1("ReluGrad", {dy, negated}, {}, kCastorDomain));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Sub", {positive, negative}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = ReduceLogSumExp(X): dX = dY * exp(X - Y).
absl::Status ReduceLogSumExpGradient(GradientBuilder& g) {
  const ReducedAxes spec = ReadReducedAxes(g);
  if (spec.noop) return IdentityGradient(g);
  CASTOR_ASSIGN_OR_RETURN(Value * y, RestoreReducedAxes(g, spec, g.output(0)));
  CASTOR_ASSIGN_OR_RETURN(Value * dy, RestoreReducedAxes(g, spec, g.output_grad(0)));
  CASTOR_ASSIGN_OR_RETURN(Value * shifted, g.Emit1("Sub", {g.input(0), y}));
  CASTOR_ASSIGN_OR_RETURN(Value * softmax, g.Emit1("Exp", {shifted}));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Mul", {softmax, dy}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// ---- ops with a castor gradient op ------------------------------------------------------

// Copies the forward node's attributes (those the gradient op shares).
std::vector<Attribute> SharedAttributes(const Node& node, const std::vector<std::string>& names) {
  std::vector<Attribute> attributes;
  for (const std::string& name : names) {
    if (const Attribute* attribute = node.attribute(name)) attributes.push_back(*attribute);
  }
  return attributes;
}

absl::Status ConvGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(
      std::vector<Value*> grads,
      g.Emit("ConvGrad", {g.output_grad(0), g.input(0), g.input(1)}, 3,
             SharedAttributes(g.node(), {"auto_pad", "dilations", "group", "kernel_shape", "pads",
                                         "strides"}),
             kCastorDomain));
  for (int i = 0; i < 3; ++i) g.SetInputGrad(i, grads[i]);
  return absl::OkStatus();
}

// ConvTranspose's pads as the `pads` attribute of the Conv it is the
// adjoint of, [begins..., ends...]: the node's own (VALID: none), or, with
// auto_pad SAME_* or output_shape, resolved for X's static spatial dims as
// the kernels resolve them (ops::ResolveConvTransposeAxis).
absl::StatusOr<std::vector<int64_t>> ConvTransposeAsConvPads(const Node& node, const Value* x,
                                                              const Value* w) {
  int n = 0;
  if (x->shape().rank_known()) {
    n = x->shape().rank() - 2;
  } else if (w->shape().rank_known()) {
    n = w->shape().rank() - 2;
  } else {
    return absl::FailedPreconditionError("the rank of X and W is unknown");
  }
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  const bool resolved = node.has_attribute("output_shape") || auto_pad == "SAME_UPPER" ||
                        auto_pad == "SAME_LOWER";
  if (!resolved) {
    if (auto_pad == "VALID") return std::vector<int64_t>(2 * n, 0);
    return node.GetInts("pads", std::vector<int64_t>(2 * n, 0));
  }
  std::vector<int64_t> output_shape = node.GetInts("output_shape", {});
  if (static_cast<int>(output_shape.size()) == n + 2) {  // the full [N, C, ...] form
    output_shape.erase(output_shape.begin(), output_shape.begin() + 2);
  }
  const std::vector<int64_t> strides = node.GetInts("strides", std::vector<int64_t>(n, 1));
  const std::vector<int64_t> dilations = node.GetInts("dilations", std::vector<int64_t>(n, 1));
  const std::vector<int64_t> output_padding =
      node.GetInts("output_padding", std::vector<int64_t>(n, 0));
  std::vector<int64_t> kernel = node.GetInts("kernel_shape", {});
  const std::optional<std::vector<int64_t>> x_dims = x->shape().StaticDims();
  std::optional<std::vector<int64_t>> w_dims = w->shape().StaticDims();
  if (kernel.empty() && w_dims.has_value()) kernel.assign(w_dims->begin() + 2, w_dims->end());
  if (!x_dims.has_value() || static_cast<int>(kernel.size()) != n) {
    return absl::UnimplementedError(absl::StrCat(
        "with auto_pad ", auto_pad, node.has_attribute("output_shape") ? " and output_shape" : "",
        " its pads depend on X's spatial dims, which are not static here; export it with "
        "explicit pads"));
  }
  std::vector<int64_t> pads(2 * n, 0);
  for (int i = 0; i < n; ++i) {
    const ops::ConvTransposeAxis axis = ops::ResolveConvTransposeAxis(
        (*x_dims)[2 + i], (kernel[i] - 1) * dilations[i] + 1, strides[i], output_padding[i],
        auto_pad,
        output_shape.empty() ? std::nullopt : std::optional<int64_t>(output_shape[i]), 0, 0);
    pads[i] = axis.pad_begin;
    pads[n + i] = axis.pad_end;
  }
  return pads;
}

// Y = ConvTranspose(X, W, B) is the adjoint, with respect to its input, of
// the Conv from Y's space to X's with the same W (as stored: [C, M/group,
// k...] is that Conv's [out, in/group, k...]), strides, dilations, group and
// pads. So
//   dX = Conv(dY, W),
//   dW = ConvGrad(X, dY, W)'s dW (that Conv's filter gradient: its input
//        dY, the gradient of its output X),
//   dB = dY summed over every axis but the channels,
// all in the forward node's domain and dtype (castor's forms compute in
// bfloat16 at any opset).
absl::Status ConvTransposeGradient(GradientBuilder& g) {
  const Node& node = g.node();
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int64_t> pads,
                          ConvTransposeAsConvPads(node, g.input(0), g.input(1)));
  std::vector<Attribute> conv_attributes =
      SharedAttributes(node, {"dilations", "group", "kernel_shape", "strides"});
  conv_attributes.push_back(Attribute::Ints("pads", pads));
  Value* dy = g.output_grad(0);
  if (g.wants_input_grad(0)) {
    CASTOR_ASSIGN_OR_RETURN(Value * dx,
                            g.Emit1("Conv", {dy, g.input(1)}, conv_attributes, node.domain()));
    g.SetInputGrad(0, dx);
  }
  if (g.wants_input_grad(1)) {
    CASTOR_ASSIGN_OR_RETURN(std::vector<Value*> conv_grads,
                            g.Emit("ConvGrad", {g.input(0), dy, g.input(1)}, 3, conv_attributes,
                                   kCastorDomain));
    g.SetInputGrad(1, conv_grads[1]);
  }
  if (g.input(2) != nullptr && g.wants_input_grad(2)) {
    const Shape& y_shape = g.output(0)->shape();
    if (!y_shape.rank_known()) {
      return absl::FailedPreconditionError("the rank of its output is unknown (needed for dB)");
    }
    std::vector<int64_t> axes = {0};
    for (int axis = 2; axis < y_shape.rank(); ++axis) axes.push_back(axis);
    CASTOR_ASSIGN_OR_RETURN(Value * db, EmitReduceSum(g, dy, axes, false));
    g.SetInputGrad(2, db);
  }
  return absl::OkStatus();
}

absl::Status MaxPoolGradient(GradientBuilder& g) {
  if (g.output_grad(1) != nullptr) {
    return absl::UnimplementedError("a gradient through MaxPool's Indices output");
  }
  CASTOR_ASSIGN_OR_RETURN(
      Value * grad,
      g.Emit1("MaxPoolGrad", {g.output_grad(0), g.input(0)},
              SharedAttributes(g.node(), {"auto_pad", "ceil_mode", "dilations", "kernel_shape",
                                          "pads", "storage_order", "strides"}),
              kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status AveragePoolGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(
      Value * grad,
      g.Emit1("AveragePoolGrad", {g.output_grad(0), g.input(0)},
              SharedAttributes(g.node(), {"auto_pad", "ceil_mode", "count_include_pad",
                                          "kernel_shape", "pads", "strides"}),
              kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status GlobalAveragePoolGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("GlobalAveragePoolGrad",
                                                {g.output_grad(0), g.input(0)}, {}, kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Training-mode BatchNormalization (and castor's BatchNormalizationTraining,
// the form the training graph gives it): gradients of X, scale and B; the
// running statistics (inputs 3 and 4) are state, not parameters. A
// BatchNormalizationTraining whose output 3 (the batch mean, float32) is
// there hands it to the gradient, which then skips its own pass over X for
// the mean (the same float32 values: both compute it from X alike); one
// with relu = 1 hands its output (the Relu's) over as relu_output, and the
// gradient op applies the Relu's gradient to dY as it reads it (the bits of
// ReluGrad in front, without its pass over the tensors).
absl::Status BatchNormalizationGradient(GradientBuilder& g) {
  const Node& node = g.node();
  if (node.GetInt("training_mode", 0) == 0 && node.num_outputs() == 1) {
    return absl::FailedPreconditionError(
        "BatchNormalization in inference mode (training_mode=0) is not differentiated; the "
        "training graph builder switches it to training mode first");
  }
  if (g.wants_input_grad(3) || g.wants_input_grad(4)) {
    return absl::InvalidArgumentError(
        "its running mean/variance (inputs 3 and 4) are training state, not parameters");
  }
  std::vector<Value*> inputs = {g.output_grad(0), g.input(0), g.input(1)};
  const bool saved_mean = node.domain() == kCastorDomain && node.num_outputs() > 3 &&
                          node.output(3) != nullptr &&
                          node.output(3)->dtype() == DType::kFloat32;
  const bool relu = node.GetInt("relu", 0) != 0;
  if (saved_mean || relu) inputs.push_back(saved_mean ? g.output(3) : nullptr);
  if (relu) inputs.push_back(g.output(0));
  CASTOR_ASSIGN_OR_RETURN(std::vector<Value*> grads,
                          g.Emit("BatchNormalizationGrad", inputs, 3,
                                 SharedAttributes(node, {"epsilon"}), kCastorDomain));
  for (int i = 0; i < 3; ++i) g.SetInputGrad(i, grads[i]);
  return absl::OkStatus();
}

absl::Status LayerNormalizationGradient(GradientBuilder& g) {
  if (g.output_grad(1) != nullptr || g.output_grad(2) != nullptr) {
    return absl::UnimplementedError("a gradient through LayerNormalization's Mean/InvStdDev");
  }
  CASTOR_ASSIGN_OR_RETURN(
      std::vector<Value*> grads,
      g.Emit("LayerNormalizationGrad", {g.output_grad(0), g.input(0), g.input(1)}, 3,
             SharedAttributes(g.node(), {"axis", "epsilon"}), kCastorDomain));
  for (int i = 0; i < 3; ++i) g.SetInputGrad(i, grads[i]);
  return absl::OkStatus();
}

// InstanceNormalization: gradients of X, scale and B (the statistics are
// recomputed from X by the gradient op).
absl::Status InstanceNormalizationGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(
      std::vector<Value*> grads,
      g.Emit("InstanceNormalizationGrad", {g.output_grad(0), g.input(0), g.input(1)}, 3,
             SharedAttributes(g.node(), {"epsilon"}), kCastorDomain));
  for (int i = 0; i < 3; ++i) g.SetInputGrad(i, grads[i]);
  return absl::OkStatus();
}

absl::Status SoftmaxGradient(GradientBuilder& g) {
  if (g.opset() < 13) {
    return absl::UnimplementedError("Softmax before opset 13 (coerced 2-D semantics)");
  }
  CASTOR_ASSIGN_OR_RETURN(Value * grad,
                          g.Emit1("SoftmaxGrad", {g.output_grad(0), g.output(0)},
                                  SharedAttributes(g.node(), {"axis"}), kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status LogSoftmaxGradient(GradientBuilder& g) {
  if (g.opset() < 13) {
    return absl::UnimplementedError("LogSoftmax before opset 13 (coerced 2-D semantics)");
  }
  CASTOR_ASSIGN_OR_RETURN(Value * grad,
                          g.Emit1("LogSoftmaxGrad", {g.output_grad(0), g.output(0)},
                                  SharedAttributes(g.node(), {"axis"}), kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status SoftmaxCrossEntropyLossGradient(GradientBuilder& g) {
  if (g.output_grad(1) != nullptr) {
    return absl::UnimplementedError("a gradient through SoftmaxCrossEntropyLoss's log_prob");
  }
  if (g.wants_input_grad(2)) {
    return absl::InvalidArgumentError("class weights (input 2) are not trainable");
  }
  std::vector<Value*> inputs = {g.output_grad(0), g.input(0), g.input(1)};
  if (g.input(2) != nullptr) inputs.push_back(g.input(2));
  CASTOR_ASSIGN_OR_RETURN(Value * grad,
                          g.Emit1("SoftmaxCrossEntropyLossGrad", inputs,
                                  SharedAttributes(g.node(), {"reduction", "ignore_index"}),
                                  kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status GatherGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * grad,
                          g.Emit1("GatherGrad", {g.output_grad(0), g.input(1), g.input(0)},
                                  SharedAttributes(g.node(), {"axis"}), kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = GatherND(data, indices): dData = GatherNDGrad (dY's slices
// scatter-added into zeros at the index tuples).
absl::Status GatherNDGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * grad,
                          g.Emit1("GatherNDGrad", {g.output_grad(0), g.input(1), g.input(0)},
                                  SharedAttributes(g.node(), {"batch_dims"}), kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = GatherElements(data, indices): dData = GatherElementsGrad (dY
// scatter-added into zeros along the axis).
absl::Status GatherElementsGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(Value * grad,
                          g.Emit1("GatherElementsGrad", {g.output_grad(0), g.input(1), g.input(0)},
                                  SharedAttributes(g.node(), {"axis"}), kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = ScatterND(data, indices, updates) / ScatterElements(...): with
// reduction none, dData = dY with the written positions zeroed (the same
// scatter of zeros) and dUpdates = dY gathered at them (GatherND /
// GatherElements); with reduction add, dData = dY. Duplicate indices
// (reduction none) leave which update wins unspecified, as ONNX does.
// `gather` and `attributes` name the matching gather and its attributes.
absl::Status ScatterGradient(GradientBuilder& g, const char* gather,
                             const std::vector<std::string>& attributes) {
  const std::string reduction = g.node().GetString("reduction", "none");
  if (reduction != "none" && reduction != "add") {
    return absl::UnimplementedError(absl::StrCat("a gradient through ", g.node().op_type(),
                                                 " with reduction \"", reduction, "\""));
  }
  Value* dy = g.output_grad(0);
  if (g.wants_input_grad(0)) {
    if (reduction == "add") {
      g.SetInputGrad(0, dy);
    } else {
      CASTOR_ASSIGN_OR_RETURN(Value * zeros, ZerosLike(g, g.input(2)));
      CASTOR_ASSIGN_OR_RETURN(Value * grad,
                              g.Emit1(g.node().op_type(), {dy, g.input(1), zeros},
                                      SharedAttributes(g.node(), attributes)));
      g.SetInputGrad(0, grad);
    }
  }
  if (g.wants_input_grad(2)) {
    CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1(gather, {dy, g.input(1)},
                                                  SharedAttributes(g.node(), attributes)));
    g.SetInputGrad(2, grad);
  }
  return absl::OkStatus();
}

absl::Status ScatterNDGradient(GradientBuilder& g) { return ScatterGradient(g, "GatherND", {}); }

absl::Status ScatterElementsGradient(GradientBuilder& g) {
  return ScatterGradient(g, "GatherElements", {"axis"});
}

// Y = Trilu(X, k): Y is X masked, so dX = Trilu(dY, k) (the same mask).
absl::Status TriluGradient(GradientBuilder& g) {
  std::vector<Value*> inputs = {g.output_grad(0)};
  if (g.node().num_inputs() > 1 && g.input(1) != nullptr) inputs.push_back(g.input(1));
  CASTOR_ASSIGN_OR_RETURN(Value * grad,
                          g.Emit1("Trilu", inputs, SharedAttributes(g.node(), {"upper"})));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = CumSum(X, axis): Y[j] sums X[i] over i <= j (i < j when exclusive),
// so dX[i] sums dY[j] over j >= i (j > i): the cumulative sum of dY in the
// other direction, with the same `exclusive`.
absl::Status CumSumGradient(GradientBuilder& g) {
  std::vector<Attribute> attributes = SharedAttributes(g.node(), {"exclusive"});
  attributes.push_back(Attribute::Int("reverse", g.node().GetInt("reverse", 0) != 0 ? 0 : 1));
  CASTOR_ASSIGN_OR_RETURN(Value * grad,
                          g.Emit1("CumSum", {g.output_grad(0), g.input(1)}, std::move(attributes)));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = Resize(X, [roi,] scales[, sizes]): dX = ResizeGrad(dY, X, scales,
// sizes), the adjoint of the interpolation, with Resize-10's implicit
// coordinate rule made explicit (asymmetric, nearest_mode "simple").
absl::Status ResizeGradient(GradientBuilder& g) {
  const Node& node = g.node();
  const bool opset10 = g.opset() < 11;
  std::vector<Attribute> attributes =
      SharedAttributes(node, {"mode", "axes", "antialias", "keep_aspect_ratio_policy"});
  attributes.push_back(Attribute::String(
      "coordinate_transformation_mode",
      opset10 ? "asymmetric" : node.GetString("coordinate_transformation_mode", "half_pixel")));
  attributes.push_back(Attribute::String(
      "nearest_mode", opset10 ? "simple" : node.GetString("nearest_mode", "round_prefer_floor")));
  const int scales_at = opset10 ? 1 : 2;
  Value* scales = node.num_inputs() > scales_at ? g.input(scales_at) : nullptr;
  Value* sizes = !opset10 && node.num_inputs() > 3 ? g.input(3) : nullptr;
  std::vector<Value*> inputs = {g.output_grad(0), g.input(0), scales};
  if (sizes != nullptr) inputs.push_back(sizes);
  CASTOR_ASSIGN_OR_RETURN(Value * grad,
                          g.Emit1("ResizeGrad", inputs, std::move(attributes), kCastorDomain));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

// Y = DepthToSpace(X) (DCR) and Y = SpaceToDepth(X) are each other's
// inverse permutations, so each one's gradient is the other applied to dY.
// DepthToSpace CRD: dX = dY viewed as [N, C', H, b, W, b], transposed back
// to [N, C', b, b, H, W] (needs static C, H, W; N may be symbolic).
absl::Status DepthToSpaceGradient(GradientBuilder& g) {
  const int64_t b = g.node().GetInt("blocksize", 1);
  Value* dy = g.output_grad(0);
  if (g.node().GetString("mode", "DCR") == "DCR") {
    CASTOR_ASSIGN_OR_RETURN(Value * grad,
                            g.Emit1("SpaceToDepth", {dy}, {Attribute::Int("blocksize", b)}));
    g.SetInputGrad(0, grad);
    return absl::OkStatus();
  }
  const std::optional<std::vector<int64_t>> x = [&]() -> std::optional<std::vector<int64_t>> {
    const Shape& shape = g.input(0)->shape();
    if (!shape.rank_known() || shape.rank() != 4) return std::nullopt;
    for (int a = 1; a < 4; ++a) {
      if (!shape[a].is_static()) return std::nullopt;
    }
    return std::vector<int64_t>{0, shape[1].value(), shape[2].value(), shape[3].value()};
  }();
  if (!x) return absl::UnimplementedError("DepthToSpace CRD with C, H, W not static");
  const int64_t depth = (*x)[1] / (b * b), h = (*x)[2], w = (*x)[3];
  CASTOR_ASSIGN_OR_RETURN(Value * view_shape, g.Int64s({0, depth, h, b, w, b}));
  CASTOR_ASSIGN_OR_RETURN(Value * view, g.Emit1("Reshape", {dy, view_shape}));
  CASTOR_ASSIGN_OR_RETURN(Value * moved, g.Emit1("Transpose", {view},
                                                 {Attribute::Ints("perm", {0, 1, 3, 5, 2, 4})}));
  CASTOR_ASSIGN_OR_RETURN(Value * x_shape, g.Int64s(*x));
  CASTOR_ASSIGN_OR_RETURN(Value * grad, g.Emit1("Reshape", {moved, x_shape}));
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

absl::Status SpaceToDepthGradient(GradientBuilder& g) {
  CASTOR_ASSIGN_OR_RETURN(
      Value * grad,
      g.Emit1("DepthToSpace", {g.output_grad(0)},
              {Attribute::Int("blocksize", g.node().GetInt("blocksize", 1))}));  // mode DCR
  g.SetInputGrad(0, grad);
  return absl::OkStatus();
}

struct RuleEntry {
  const char* op_type;
  Rule rule;
};

constexpr RuleEntry kRules[] = {
    {"Add", AddGradient},
    {"Sub", SubGradient},
    {"Mul", MulGradient},
    {"Div", DivGradient},
    {"Mod", ModGradient},
    {"Sum", SumGradient},
    {"Neg", NegGradient},
    {"Sign", ZeroGradient},
    {"Floor", ZeroGradient},
    {"Ceil", ZeroGradient},
    {"Round", ZeroGradient},
    {"Identity", IdentityGradient},
    {"Cast", CastGradient},
    {"Relu", ReluGradient},
    {"Exp", ExpGradient},
    {"Sin", SinGradient},
    {"Cos", CosGradient},
    {"Tan", TanGradient},
    {"Asin", AsinGradient},
    {"Acos", AcosGradient},
    {"Atan", AtanGradient},
    {"Sinh", SinhGradient},
    {"Cosh", CoshGradient},
    {"Asinh", AsinhGradient},
    {"Acosh", AcoshGradient},
    {"Atanh", AtanhGradient},
    {"Log", LogGradient},
    {"Sqrt", SqrtGradient},
    {"Tanh", TanhGradient},
    {"Sigmoid", SigmoidGradient},
    {"Erf", ErfGradient},
    {"Pow", PowGradient},
    {"Reciprocal", ReciprocalGradient},
    {"Abs", AbsGradient},
    {"LeakyRelu", LeakyReluGradient},
    {"HardSigmoid", HardSigmoidGradient},
    {"HardSwish", HardSwishGradient},
    {"Elu", EluGradient},
    {"Selu", SeluGradient},
    {"Celu", CeluGradient},
    {"Softplus", SoftplusGradient},
    {"Softsign", SoftsignGradient},
    {"ThresholdedRelu", ThresholdedReluGradient},
    {"Mish", MishGradient},
    {"PRelu", PReluGradient},
    {"Clip", ClipGradient},
    {"Where", WhereGradient},
    {"Max", MaxMinGradient},
    {"Min", MaxMinGradient},
    {"Gelu", GeluGradient},
    {"Dropout", DropoutGradient},
    {"MatMul", MatMulGradient},
    {"Gemm", GemmGradient},
    {"Einsum", EinsumGradient},
    {"Reshape", ReshapeLikeInputGradient},
    {"Flatten", ReshapeLikeInputGradient},
    {"Squeeze", ReshapeLikeInputGradient},
    {"Unsqueeze", ReshapeLikeInputGradient},
    {"Transpose", TransposeGradient},
    {"Concat", ConcatGradient},
    {"Split", SplitGradient},
    {"Slice", SliceGradient},
    {"Expand", ExpandGradient},
    {"Tile", TileGradient},
    {"Pad", PadGradient},
    {"Trilu", TriluGradient},
    {"DepthToSpace", DepthToSpaceGradient},
    {"SpaceToDepth", SpaceToDepthGradient},
    {"Resize", ResizeGradient},
    {"ReduceSum", ReduceSumGradient},
    {"ReduceMean", ReduceMeanGradient},
    {"ReduceMax", ReduceExtremeGradient},
    {"ReduceMin", ReduceExtremeGradient},
    {"ReduceL2", ReduceL2Gradient},
    {"ReduceSumSquare", ReduceSumSquareGradient},
    {"ReduceL1", ReduceL1Gradient},
    {"ReduceLogSumExp", ReduceLogSumExpGradient},
    {"CumSum", CumSumGradient},
    {"Conv", ConvGradient},
    {"ConvTranspose", ConvTransposeGradient},
    {"MaxPool", MaxPoolGradient},
    {"AveragePool", AveragePoolGradient},
    {"GlobalAveragePool", GlobalAveragePoolGradient},
    {"GlobalMaxPool", GlobalMaxPoolGradient},
    {"BatchNormalization", BatchNormalizationGradient},
    {"LayerNormalization", LayerNormalizationGradient},
    {"InstanceNormalization", InstanceNormalizationGradient},
    {"Softmax", SoftmaxGradient},
    {"LogSoftmax", LogSoftmaxGradient},
    {"SoftmaxCrossEntropyLoss", SoftmaxCrossEntropyLossGradient},
    {"Gather", GatherGradient},
    {"GatherND", GatherNDGradient},
    {"ScatterND", ScatterNDGradient},
    {"GatherElements", GatherElementsGradient},
    {"ScatterElements", ScatterElementsGradient},
};

struct NoGradientEntry {
  const char* domain;
  const char* op_type;
  const char* reason;
};

constexpr NoGradientEntry kNoGradient[] = {
    {"", "Shape", "its output is an integer shape"},
    {"", "Size", "its output is an integer count"},
    {"", "Constant", "it has no inputs"},
    {"", "ConstantOfShape", "its only input is an integer shape"},
    {"", "Range", "its output does not depend smoothly on its inputs (integer steps)"},
    {"", "Equal", "its output is boolean"},
    {"", "Less", "its output is boolean"},
    {"", "Greater", "its output is boolean"},
    {"", "LessOrEqual", "its output is boolean"},
    {"", "GreaterOrEqual", "its output is boolean"},
    {"", "And", "its inputs and output are boolean"},
    {"", "Or", "its inputs and output are boolean"},
    {"", "Xor", "its inputs and output are boolean"},
    {"", "Not", "its input and output are boolean"},
    {"", "IsNaN", "its output is boolean"},
    {"", "IsInf", "its output is boolean"},
    {"", "ArgMax", "its output is an integer index"},
    {"", "ArgMin", "its output is an integer index"},
    {"", "LSTM", "the unroll-recurrent pass rewrites it into primitive ops before autodiff"},
    {"", "GRU", "the unroll-recurrent pass rewrites it into primitive ops before autodiff"},
    {"", "RNN", "the unroll-recurrent pass rewrites it into primitive ops before autodiff"},
    {kTrainingDomain, "Adam", "an optimizer update is not differentiated"},
    {kTrainingDomain, "Adagrad", "an optimizer update is not differentiated"},
    {kTrainingDomain, "Momentum", "an optimizer update is not differentiated"},
};

}  // namespace

void AssignGradientRules(OpRegistry& registry) {
  for (const RuleEntry& entry : kRules) registry.SetGradient("", entry.op_type, entry.rule);
  // castor's own forward op: BatchNormalization as the training graph runs it.
  registry.SetGradient(kCastorDomain, "BatchNormalizationTraining", BatchNormalizationGradient);
  // castor's own forward op: Conv as the training graph runs it in bfloat16
  // below opset 22 (graph/ops/conv.cc).
  registry.SetGradient(kCastorDomain, "Conv", ConvGradient);
  registry.SetGradient(kCastorDomain, "ConvTranspose", ConvTransposeGradient);
  // ... and the pools (graph/ops/pool.cc).
  registry.SetGradient(kCastorDomain, "MaxPool", MaxPoolGradient);
  registry.SetGradient(kCastorDomain, "AveragePool", AveragePoolGradient);
  registry.SetGradient(kCastorDomain, "GlobalAveragePool", GlobalAveragePoolGradient);
  // ... and Gelu (graph/ops/elementwise.cc; the fuse-gelu pass writes it).
  registry.SetGradient(kCastorDomain, "Gelu", GeluGradient);
  // ... and LayerNormalization with float32 parameters around a 16-bit X
  // (graph/ops/normalization.cc; the fold-layernorm-casts pass writes it).
  registry.SetGradient(kCastorDomain, "LayerNormalization", LayerNormalizationGradient);
  // castor's copy of the loss, for models below opset 12.
  registry.SetGradient(kCastorDomain, "SoftmaxCrossEntropyLoss",
                       SoftmaxCrossEntropyLossGradient);
  // Float inputs that set how an op works rather than feed its values, as
  // PyTorch's dropout p: never trained.
  registry.SetSettingInputs("", "Dropout", {1});
  registry.SetSettingInputs("", "Resize", {1, 2});  // roi, scales (scales at opset 10)
  // castor's own forward op: Dropout as the training graph runs it.
  registry.SetGradient(kCastorDomain, "DropoutTraining", DropoutTrainingGradient);
  registry.SetSettingInputs(kCastorDomain, "DropoutTraining", {1});
  for (const NoGradientEntry& entry : kNoGradient) {
    registry.SetNoGradient(entry.domain, entry.op_type, entry.reason);
  }
}

}  // namespace castor
