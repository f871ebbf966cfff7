// Ops that change a tensor's shape but not its data: Reshape, Flatten,
// Transpose, Squeeze, Unsqueeze, Expand, and the shape readers Shape and
// Size. Shape() seeds the "shape value" of its output with the input's
// (possibly symbolic) dims; Reshape and Expand read their target from the
// shape value, so a target computed as Shape -> Gather -> Concat keeps
// symbolic dims like the batch size N.
#include <algorithm>
#include <climits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/op_registry.h"
#include "graph/ops/all_ops.h"
#include "graph/ops/op_helpers.h"
#include "graph/status.h"

namespace castor {
namespace {

// A product of dims: a static factor times symbols (with multiplicity);
// `known` is false when a factor is an unknown dim.
struct DimProduct {
  int64_t factor = 1;
  std::map<std::string, int> symbols;
  bool known = true;

  void Multiply(const Dim& d) {
    if (d.is_static()) {
      factor *= d.value();
    } else if (d.is_symbolic()) {
      ++symbols[d.symbol()];
    } else {
      known = false;
    }
  }
  // The product as one Dim: a number, a lone symbol, or unknown. A static
  // zero factor makes the product 0 whatever the other factors are.
  Dim ToDim() const {
    if (factor == 0) return Dim(0);
    if (!known) return Dim::Unknown();
    if (symbols.empty()) return Dim(factor);
    if (factor == 1 && symbols.size() == 1 && symbols.begin()->second == 1) {
      return Dim::Symbol(symbols.begin()->first);
    }
    return Dim::Unknown();
  }
};

DimProduct ProductOf(const std::vector<Dim>& dims, size_t begin, size_t end) {
  DimProduct product;
  for (size_t i = begin; i < end && i < dims.size(); ++i) product.Multiply(dims[i]);
  return product;
}

std::vector<DType> AllTypesAt(const InferenceContext& ctx) {
  return ops::WithBFloat16Since(ctx, ops::AllTypes(), 13);
}

// Checks input `i` is a 1-D tensor (when its rank is known); `what` names it.
absl::Status Require1D(const InferenceContext& ctx, int i, const char* what) {
  const Shape& shape = ctx.input_shape(i);
  if (shape.rank_known() && shape.rank() != 1) {
    return ctx.Error(absl::StrCat("input ", i, " (", what, ") must be 1-D; got shape ",
                                  shape.ToString()));
  }
  return absl::OkStatus();
}

// The static length of 1-D input `i`, or -1.
int64_t StaticLength(const InferenceContext& ctx, int i) {
  const Shape& shape = ctx.input_shape(i);
  if (shape.rank_known() && shape.rank() == 1 && shape[0].is_static()) return shape[0].value();
  return -1;
}

// Passes input 0's shape value through when the output is a scalar or 1-D
// (the same elements, re-viewed).
void ForwardShapeValue(InferenceContext& ctx, const Shape& output) {
  const auto& value = ctx.input_shape_value(0);
  if (value && output.rank_known() && output.rank() <= 1) ctx.SetOutputShapeValue(0, *value);
}

// ---- Reshape -----------------------------------------------------------------

// One entry of a Reshape target before resolution.
struct TargetEntry {
  enum Kind { kNumber, kSymbol, kUnknown } kind;
  int64_t number = 0;
  Dim symbol;
};

absl::Status InferReshape(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt64}));
  CASTOR_RETURN_IF_ERROR(Require1D(ctx, 1, "shape"));
  if (ctx.opset() < 14 && ctx.has_attribute("allowzero")) {
    return ctx.Error(absl::StrCat("attribute 'allowzero' exists from opset 14; the model imports "
                                  "opset ",
                                  ctx.opset()));
  }
  const bool allowzero = ctx.GetInt("allowzero", 0) != 0;
  const Shape& input = ctx.input_shape(0);
  const DType dtype = ctx.input_dtype(0);

  std::vector<TargetEntry> target;
  if (const Tensor* constant = ctx.input_constant(1)) {
    for (int64_t v : constant->ToInt64Vector()) target.push_back({TargetEntry::kNumber, v, {}});
  } else if (const auto& value = ctx.input_shape_value(1)) {
    for (const Dim& d : *value) {
      if (d.is_static()) {
        target.push_back({TargetEntry::kNumber, d.value(), {}});
      } else if (d.is_symbolic()) {
        target.push_back({TargetEntry::kSymbol, 0, d});
      } else {
        target.push_back({TargetEntry::kUnknown, 0, {}});
      }
    }
  } else if (int64_t length = StaticLength(ctx, 1); length >= 0) {
    target.assign(length, {TargetEntry::kUnknown, 0, {}});
  } else {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }

  // Resolve what each entry says on its own; remember the slots that need
  // the element count (a -1, or an entry whose value is unknown).
  std::vector<Dim> dims(target.size());
  std::vector<int> unresolved;
  int minus_one_at = -1;
  bool has_literal_zero = false;
  for (int i = 0; i < static_cast<int>(target.size()); ++i) {
    const TargetEntry& e = target[i];
    if (e.kind == TargetEntry::kSymbol) {
      dims[i] = e.symbol;
    } else if (e.kind == TargetEntry::kUnknown) {
      unresolved.push_back(i);
    } else if (e.number == -1) {
      if (minus_one_at >= 0) {
        return ctx.Error(absl::StrCat("the target shape has more than one -1 (entries ",
                                      minus_one_at, " and ", i, ")"));
      }
      minus_one_at = i;
      unresolved.push_back(i);
    } else if (e.number < -1) {
      return ctx.Error(absl::StrCat("target shape entry ", i, " is ", e.number,
                                    "; entries must be >= -1"));
    } else if (e.number == 0 && !allowzero) {
      if (input.rank_known()) {
        if (i >= input.rank()) {
          return ctx.Error(absl::StrCat("target shape entry ", i,
                                        " is 0 (copy the input dim) but the input has rank ",
                                        input.rank()));
        }
        dims[i] = input[i];
      }
      if (dims[i].is_unknown()) unresolved.push_back(i);
    } else {
      has_literal_zero |= e.number == 0;
      dims[i] = Dim(e.number);
    }
  }
  if (allowzero && has_literal_zero && minus_one_at >= 0) {
    return ctx.Error("with allowzero=1 the target shape may not hold both 0 and -1");
  }

  const bool input_known = input.rank_known();
  DimProduct in = input_known ? ProductOf(input.dims(), 0, input.rank()) : DimProduct{};
  if (!input_known) in.known = false;
  if (unresolved.size() == 1) {
    const int slot = unresolved[0];
    DimProduct others;
    for (int i = 0; i < static_cast<int>(dims.size()); ++i) {
      if (i != slot) others.Multiply(dims[i]);
    }
    if (in.known && others.known) {
      bool symbols_divide = true;
      std::map<std::string, int> rest = in.symbols;
      for (const auto& [symbol, count] : others.symbols) {
        rest[symbol] -= count;
        if (rest[symbol] < 0) symbols_divide = false;
        if (rest[symbol] == 0) rest.erase(symbol);
      }
      if (others.factor == 0) {
        if (slot == minus_one_at && in.factor != 0) {
          return ctx.Error(absl::StrCat("cannot infer the -1 entry: the other target entries ",
                                        "multiply to 0 but the input ", input.ToString(),
                                        " is not empty"));
        }
      } else if (symbols_divide) {
        if (in.factor % others.factor != 0) {
          if (rest.empty()) {
            return ctx.Error(absl::StrCat("cannot reshape ", input.ToString(), " (",
                                          in.factor, " elements) to a shape whose other dims ",
                                          "multiply to ", others.factor));
          }
        } else {
          DimProduct quotient;
          quotient.factor = in.factor / others.factor;
          quotient.symbols = rest;
          dims[slot] = quotient.ToDim();
        }
      }
    }
  } else if (unresolved.empty() && in.known) {
    DimProduct out = ProductOf(dims, 0, dims.size());
    if (out.known && out.symbols == in.symbols && out.factor != in.factor) {
      return ctx.Error(absl::StrCat("element-count mismatch: cannot reshape ", input.ToString(),
                                    " to ", Shape(dims).ToString()));
    }
  }
  Shape output(std::move(dims));
  ForwardShapeValue(ctx, output);
  ctx.SetOutput(0, dtype, std::move(output));
  return absl::OkStatus();
}

// ---- Flatten -----------------------------------------------------------------

absl::Status InferFlatten(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(
      ctx, 0, ctx.opset() < 9 ? std::vector<DType>{DType::kFloat16, DType::kFloat32,
                                                   DType::kFloat64}
                              : AllTypesAt(ctx)));
  const Shape& input = ctx.input_shape(0);
  int64_t axis = ctx.GetInt("axis", 1);
  if (!input.rank_known()) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape({axis == 0 ? Dim(1) : Dim(), Dim()}));
    return absl::OkStatus();
  }
  const int64_t rank = input.rank();
  const int64_t lowest = ctx.opset() >= 11 ? -rank : 0;
  if (axis < lowest || axis > rank) {
    return ctx.Error(absl::StrCat("axis ", axis, " is out of range [", lowest, ", ", rank,
                                  "] for input rank ", rank));
  }
  if (axis < 0) axis += rank;
  ctx.SetOutput(0, ctx.input_dtype(0),
                Shape({ProductOf(input.dims(), 0, axis).ToDim(),
                       ProductOf(input.dims(), axis, rank).ToDim()}));
  return absl::OkStatus();
}

// ---- Transpose ---------------------------------------------------------------

absl::Status InferTranspose(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  const Shape& input = ctx.input_shape(0);
  const bool has_perm = ctx.has_attribute("perm");
  std::vector<int64_t> perm = ctx.GetInts("perm");
  if (!input.rank_known()) {
    ctx.SetOutput(0, ctx.input_dtype(0),
                  has_perm ? Shape(std::vector<Dim>(perm.size())) : Shape::Unknown());
    return absl::OkStatus();
  }
  const int rank = input.rank();
  if (!has_perm) {
    for (int i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  if (static_cast<int>(perm.size()) != rank) {
    return ctx.Error(absl::StrCat("perm [", absl::StrJoin(perm, ","), "] has ", perm.size(),
                                  " entries but the input has rank ", rank));
  }
  std::vector<bool> seen(rank, false);
  std::vector<Dim> dims;
  for (int64_t p : perm) {
    if (p < 0 || p >= rank || seen[p]) {
      return ctx.Error(absl::StrCat("perm [", absl::StrJoin(perm, ","),
                                    "] is not a permutation of 0..", rank - 1));
    }
    seen[p] = true;
    dims.push_back(input[p]);
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(dims)));
  return absl::OkStatus();
}

// ---- Squeeze / Unsqueeze -----------------------------------------------------

// Reads the axes (attribute before opset 13, input from 13) and rejects
// negative axes before opset 11.
absl::StatusOr<std::optional<std::vector<int64_t>>> ReadSqueezeAxes(InferenceContext& ctx) {
  if (ctx.opset() < 13 && ctx.num_inputs() > 1) {
    return ctx.Error(absl::StrCat("takes one input before opset 13 (axes is an attribute); got ",
                                  ctx.num_inputs()));
  }
  if (ctx.opset() >= 13 && ctx.has_input(1)) {
    CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt64}));
    CASTOR_RETURN_IF_ERROR(Require1D(ctx, 1, "axes"));
  }
  CASTOR_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> axes, ops::ReadAxes(ctx, 13, 1));
  if (axes && ctx.opset() < 11) {
    for (int64_t a : *axes) {
      if (a < 0) {
        return ctx.Error(absl::StrCat("axis ", a, " is negative; negative axes need opset 11"));
      }
    }
  }
  return axes;
}

absl::Status InferSqueeze(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  CASTOR_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> axes, ReadSqueezeAxes(ctx));
  const Shape& input = ctx.input_shape(0);
  const DType dtype = ctx.input_dtype(0);
  if (!input.rank_known()) {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  const int rank = input.rank();
  Shape output;
  if (!axes) {
    const int64_t count = StaticLength(ctx, 1);
    if (count >= 0 && count <= rank) output = Shape(std::vector<Dim>(rank - count));
  } else if (axes->empty()) {
    // Remove every dim of size 1; a dim not known to be 1 or not makes the
    // result's rank unknown.
    std::vector<Dim> dims;
    bool certain = true;
    for (const Dim& d : input.dims()) {
      if (!d.is_static()) certain = false;
      if (!(d.is_static() && d.value() == 1)) dims.push_back(d);
    }
    if (certain) output = Shape(std::move(dims));
  } else {
    std::vector<bool> squeezed(rank, false);
    for (int64_t axis : *axes) {
      CASTOR_ASSIGN_OR_RETURN(int64_t a, ops::NormalizeAxis(ctx, axis, rank));
      if (squeezed[a]) return ctx.Error(absl::StrCat("axis ", axis, " is listed twice"));
      if (input[a].is_static() && input[a].value() != 1) {
        return ctx.Error(absl::StrCat("cannot squeeze axis ", axis, " of shape ",
                                      input.ToString(), ": its size is not 1"));
      }
      squeezed[a] = true;
    }
    std::vector<Dim> dims;
    for (int i = 0; i < rank; ++i) {
      if (!squeezed[i]) dims.push_back(input[i]);
    }
    output = Shape(std::move(dims));
  }
  ForwardShapeValue(ctx, output);
  ctx.SetOutput(0, dtype, std::move(output));
  return absl::OkStatus();
}

absl::Status InferUnsqueeze(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  if (ctx.opset() < 13 && !ctx.has_attribute("axes")) {
    return ctx.Error("attribute 'axes' is required before opset 13");
  }
  if (ctx.opset() >= 13 && !ctx.has_input(1)) {
    return ctx.Error("input 1 (axes) is required from opset 13");
  }
  CASTOR_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> axes, ReadSqueezeAxes(ctx));
  const Shape& input = ctx.input_shape(0);
  const DType dtype = ctx.input_dtype(0);
  if (!input.rank_known()) {
    ctx.SetOutput(0, dtype, Shape::Unknown());
    return absl::OkStatus();
  }
  Shape output;
  if (!axes) {
    const int64_t count = StaticLength(ctx, 1);
    if (count >= 0) output = Shape(std::vector<Dim>(input.rank() + count));
  } else {
    const int out_rank = input.rank() + static_cast<int>(axes->size());
    std::vector<bool> inserted(out_rank, false);
    for (int64_t axis : *axes) {
      CASTOR_ASSIGN_OR_RETURN(int64_t a, ops::NormalizeAxis(ctx, axis, out_rank));
      if (inserted[a]) return ctx.Error(absl::StrCat("axis ", axis, " is listed twice"));
      inserted[a] = true;
    }
    std::vector<Dim> dims;
    int next_input = 0;
    for (int i = 0; i < out_rank; ++i) {
      dims.push_back(inserted[i] ? Dim(1) : input[next_input++]);
    }
    output = Shape(std::move(dims));
  }
  ForwardShapeValue(ctx, output);
  ctx.SetOutput(0, dtype, std::move(output));
  return absl::OkStatus();
}

// ---- Expand ------------------------------------------------------------------

absl::Status InferExpand(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 1, {DType::kInt64}));
  CASTOR_RETURN_IF_ERROR(Require1D(ctx, 1, "shape"));
  Shape target;
  if (const auto& value = ctx.input_shape_value(1)) {
    target = Shape(*value);
  } else if (int64_t length = StaticLength(ctx, 1); length >= 0) {
    target = Shape(std::vector<Dim>(length));
  }
  absl::StatusOr<Shape> output = ops::BroadcastShapes(ctx.input_shape(0), target);
  if (!output.ok()) {
    return ctx.Error(absl::StrCat("cannot expand: ", std::string(output.status().message())));
  }
  ctx.SetOutput(0, ctx.input_dtype(0), *std::move(output));
  return absl::OkStatus();
}

// ---- Shape / Size ------------------------------------------------------------

absl::Status InferShape(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  if (ctx.opset() < 15 && (ctx.has_attribute("start") || ctx.has_attribute("end"))) {
    return ctx.Error(absl::StrCat("attributes 'start'/'end' exist from opset 15; the model "
                                  "imports opset ",
                                  ctx.opset()));
  }
  const Shape& input = ctx.input_shape(0);
  if (!input.rank_known()) {
    ctx.SetOutput(0, DType::kInt64, Shape({Dim()}));
    return absl::OkStatus();
  }
  const int64_t rank = input.rank();
  auto clamp = [rank](int64_t index) {
    if (index < 0) index += rank;
    return std::clamp<int64_t>(index, 0, rank);
  };
  const int64_t start = clamp(ctx.GetInt("start", 0));
  const int64_t end = clamp(ctx.GetInt("end", rank));
  std::vector<Dim> value;
  for (int64_t i = start; i < end; ++i) value.push_back(input[i]);
  ctx.SetOutput(0, DType::kInt64, Shape({Dim(static_cast<int64_t>(value.size()))}));
  ctx.SetOutputShapeValue(0, std::move(value));
  return absl::OkStatus();
}

absl::Status InferSize(InferenceContext& ctx) {
  CASTOR_RETURN_IF_ERROR(ops::RequireDType(ctx, 0, AllTypesAt(ctx)));
  const Shape& input = ctx.input_shape(0);
  ctx.SetOutput(0, DType::kInt64, Shape::Scalar());
  if (input.rank_known()) {
    const Dim size = ProductOf(input.dims(), 0, input.rank()).ToDim();
    if (!size.is_unknown()) ctx.SetOutputShapeValue(0, {size});
  }
  return absl::OkStatus();
}

using ops::MakeDef;

}  // namespace

void RegisterShapeOps(OpRegistry& registry) {
  registry.Register(MakeDef("Reshape", kMinOnnxOpset, 2, 2, {{"allowzero", AttrKind::kInt}},
                            InferReshape,
                            "Reshapes to the shape input (0 copies a dim, -1 is inferred)."));
  registry.Register(MakeDef("Flatten", kMinOnnxOpset, 1, 1, {{"axis", AttrKind::kInt}},
                            InferFlatten, "Flattens to 2-D around `axis`."));
  registry.Register(MakeDef("Transpose", kMinOnnxOpset, 1, 1, {{"perm", AttrKind::kInts}},
                            InferTranspose,
                            "Permutes the axes (default: reverses them)."));
  registry.Register(MakeDef("Squeeze", kMinOnnxOpset, 1, 2, {{"axes", AttrKind::kInts}},
                            InferSqueeze, "Removes size-1 axes (all of them without axes)."));
  registry.Register(MakeDef("Unsqueeze", kMinOnnxOpset, 1, 2, {{"axes", AttrKind::kInts}},
                            InferUnsqueeze, "Inserts size-1 axes at the given output positions."));
  registry.Register(MakeDef("Expand", 8, 2, 2, {}, InferExpand,
                            "Broadcasts the input to the shape input (numpy rules)."));
  registry.Register(MakeDef("Shape", kMinOnnxOpset, 1, 1,
                            {{"start", AttrKind::kInt}, {"end", AttrKind::kInt}}, InferShape,
                            "The input's shape (optionally dims start..end) as 1-D int64."));
  registry.Register(MakeDef("Size", kMinOnnxOpset, 1, 1, {}, InferSize,
                            "The input's element count as an int64 scalar."));
}

}  // namespace castor
