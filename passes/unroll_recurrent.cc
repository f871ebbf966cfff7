// The unroll-recurrent pass (see unroll_recurrent.h for the numbered steps).
#include "passes/unroll_recurrent.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/half.h"
#include "graph/shape_inference.h"
#include "graph/status.h"
#include "passes/pass_manager.h"

namespace castor {
namespace {

enum class CellKind { kLstm, kGru, kRnn };

// One activation of the cell with its parameters (ONNX's defaults, as the
// standalone ops have them).
struct Activation {
  std::string op_type;  // the ONNX op that computes it
  std::optional<float> alpha;
  std::optional<float> beta;
};

// The attributes of one recurrent node, read and checked.
struct CellSpec {
  CellKind kind;
  int gates = 1;
  int64_t hidden = 0;
  int64_t directions = 1;
  bool reverse_only = false;  // direction "reverse"
  int64_t layout = 0;
  int64_t seq = 0;
  std::optional<float> clip;
  bool input_forget = false;
  bool linear_before_reset = false;
  // Per direction: f, g (LSTM, GRU), h (LSTM).
  std::vector<std::vector<Activation>> activations;
};

std::string Quoted(const std::string& s) { return absl::StrCat("'", s, "'"); }

absl::Status NodeError(const Node& node, const std::string& message) {
  return absl::InvalidArgumentError(
      absl::StrCat(node.op_type(), " node ", Quoted(node.name()), ": ", message));
}

// The activation names ONNX allows, mapped to the op computing them; the
// number of alpha/beta values each takes, with the defaults.
struct ActivationInfo {
  const char* name;
  const char* op_type;
  bool has_alpha;
  float alpha;
  bool has_beta;
  float beta;
};
constexpr ActivationInfo kActivations[] = {
    {"sigmoid", "Sigmoid", false, 0, false, 0},
    {"tanh", "Tanh", false, 0, false, 0},
    {"relu", "Relu", false, 0, false, 0},
    {"leakyrelu", "LeakyRelu", true, 0.01f, false, 0},
    {"thresholdedrelu", "ThresholdedRelu", true, 1.0f, false, 0},
    {"hardsigmoid", "HardSigmoid", true, 0.2f, true, 0.5f},
    {"elu", "Elu", true, 1.0f, false, 0},
    {"softsign", "Softsign", false, 0, false, 0},
    {"softplus", "Softplus", false, 0, false, 0},
};

absl::StatusOr<CellSpec> ReadSpec(const Node& node, CellKind kind) {
  CellSpec spec;
  spec.kind = kind;
  spec.gates = kind == CellKind::kLstm ? 4 : kind == CellKind::kGru ? 3 : 1;
  const std::string direction = node.GetString("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    return NodeError(node, absl::StrCat("attribute 'direction' is ", Quoted(direction),
                                        "; expected forward, reverse or bidirectional"));
  }
  spec.directions = direction == "bidirectional" ? 2 : 1;
  spec.reverse_only = direction == "reverse";
  spec.layout = node.GetInt("layout", 0);
  if (spec.layout != 0 && spec.layout != 1) {
    return NodeError(node, absl::StrCat("attribute 'layout' is ", spec.layout, "; expected 0 or 1"));
  }
  const Shape& r = node.input(2)->shape();
  if (node.has_attribute("hidden_size")) {
    spec.hidden = node.GetInt("hidden_size", 0);
  } else if (r.rank_known() && r.rank() == 3 && r[2].is_static()) {
    spec.hidden = r[2].value();
  }
  if (spec.hidden <= 0) {
    return NodeError(node, "the hidden size is unknown: set attribute 'hidden_size' or give R a "
                           "static shape [directions, gates*hidden, hidden]");
  }
  const Shape& x = node.input(0)->shape();
  const int seq_axis = spec.layout == 0 ? 0 : 1;
  if (!x.rank_known() || x.rank() != 3 || !x[seq_axis].is_static()) {
    return NodeError(
        node, absl::StrCat("the sequence length (axis ", seq_axis, " of X ",
                           Quoted(node.input(0)->name()), ", shape ", x.ToString(),
                           ") is not a static number; castor unrolls recurrent layers over a fixed "
                           "number of steps: export the model with a fixed sequence length (no "
                           "dynamic axis on the sequence dimension)"));
  }
  spec.seq = x[seq_axis].value();
  if (spec.seq <= 0) return NodeError(node, "the sequence length is 0; nothing to unroll");
  if (node.has_attribute("clip")) {
    const float clip = node.GetFloat("clip", 0);
    if (!(clip > 0)) {
      return NodeError(node, absl::StrCat("attribute 'clip' is ", clip, "; expected > 0"));
    }
    spec.clip = clip;
  }
  spec.input_forget = kind == CellKind::kLstm && node.GetInt("input_forget", 0) != 0;
  spec.linear_before_reset = kind == CellKind::kGru && node.GetInt("linear_before_reset", 0) != 0;

  // Activations: f, g, h per direction, forward's first.
  const size_t per_direction = kind == CellKind::kLstm ? 3 : kind == CellKind::kGru ? 2 : 1;
  std::vector<std::string> names = node.has_attribute("activations")
                                       ? node.attribute("activations")->strings
                                       : std::vector<std::string>{};
  if (names.empty()) {
    const std::vector<std::string> defaults =
        kind == CellKind::kLstm  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
        : kind == CellKind::kGru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                 : std::vector<std::string>{"Tanh"};
    for (int64_t d = 0; d < spec.directions; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  } else if (names.size() == per_direction && spec.directions == 2) {
    names.insert(names.end(), names.begin(), names.end());  // one list for both directions
  }
  if (names.size() != per_direction * spec.directions) {
    return NodeError(node, absl::StrCat("attribute 'activations' has ", names.size(),
                                        " entries; expected ", per_direction * spec.directions,
                                        " (", per_direction, " per direction)"));
  }
  const std::vector<float> alphas = node.has_attribute("activation_alpha")
                                        ? node.attribute("activation_alpha")->floats
                                        : std::vector<float>{};
  const std::vector<float> betas = node.has_attribute("activation_beta")
                                       ? node.attribute("activation_beta")->floats
                                       : std::vector<float>{};
  size_t next_alpha = 0, next_beta = 0;
  spec.activations.resize(spec.directions);
  for (size_t k = 0; k < names.size(); ++k) {
    const std::string lower = absl::AsciiStrToLower(names[k]);
    const ActivationInfo* info = nullptr;
    for (const ActivationInfo& candidate : kActivations) {
      if (lower == candidate.name) info = &candidate;
    }
    if (info == nullptr) {
      return NodeError(
          node, absl::StrCat("attribute 'activations' entry ", k, " is ", Quoted(names[k]),
                             "; castor supports Sigmoid, Tanh, Relu, LeakyRelu, ThresholdedRelu, "
                             "HardSigmoid, Elu, Softsign and Softplus (not Affine, ScaledTanh)"));
    }
    Activation activation{info->op_type, std::nullopt, std::nullopt};
    if (info->has_alpha) activation.alpha = next_alpha < alphas.size() ? alphas[next_alpha++] : info->alpha;
    if (info->has_beta) activation.beta = next_beta < betas.size() ? betas[next_beta++] : info->beta;
    spec.activations[k / per_direction].push_back(activation);
  }
  return spec;
}

// The constant integer values of `value` (an initializer that is not a
// graph input, or a Constant node's output), else nullopt.
std::optional<std::vector<int64_t>> ConstantInts(const Value* value) {
  const Tensor* tensor = nullptr;
  if (value->initializer() != nullptr && !value->is_graph_input()) {
    tensor = value->initializer();
  } else if (value->producer() != nullptr && value->producer()->op_type() == "Constant" &&
             value->producer()->domain().empty() && value->producer()->has_attribute("value")) {
    tensor = &value->producer()->attribute("value")->t;
  }
  if (tensor == nullptr) return std::nullopt;
  std::vector<int64_t> values;
  for (int64_t i = 0; i < tensor->num_elements(); ++i) {
    if (tensor->dtype() == DType::kInt32) {
      values.push_back(tensor->data<int32_t>()[i]);
    } else if (tensor->dtype() == DType::kInt64) {
      values.push_back(tensor->data<int64_t>()[i]);
    } else {
      return std::nullopt;
    }
  }
  return values;
}

// Whether sequence_lens needs masking: absent, or a constant equal to the
// sequence length everywhere, needs none. Lengths outside [0, seq] and
// masking below opset 9 (no Where, no integer Less) are refused.
absl::StatusOr<bool> NeedsMasking(const Node& node, const CellSpec& spec, int64_t opset) {
  const Value* lens = node.input(4);
  if (lens == nullptr) return false;
  const std::optional<std::vector<int64_t>> values = ConstantInts(lens);
  if (values.has_value()) {
    for (int64_t n : *values) {
      if (n < 0 || n > spec.seq) {
        return NodeError(node, absl::StrCat("input 4 (sequence_lens, ", Quoted(lens->name()),
                                            ") has length ", n, "; expected 0..", spec.seq,
                                            " (the sequence length)"));
      }
    }
    if (std::all_of(values->begin(), values->end(), [&spec](int64_t n) { return n == spec.seq; })) {
      return false;
    }
  }
  if (opset < 9) {
    return NodeError(node, absl::StrCat("input 4 (sequence_lens, ", Quoted(lens->name()),
                                        ") may be shorter than the sequence; castor masks the "
                                        "steps past each length with Where, which needs opset 9 "
                                        "(the model has ", opset, "): leave sequence_lens out "
                                        "or export at opset 9 or later"));
  }
  return true;
}

// Emits the nodes of one rewrite, named after the recurrent node.
class Emitter {
 public:
  Emitter(Graph& graph, const Node& node, int64_t opset, DType dtype)
      : graph_(graph), prefix_(node.name().empty() ? node.op_type() : node.name()),
        opset_(opset), dtype_(dtype) {}

  int nodes_added() const { return nodes_added_; }

  // One node with one output; `output_name` empty gives a fresh name.
  absl::StatusOr<Value*> Op(const std::string& op_type, std::vector<Value*> inputs,
                            const std::string& what, std::vector<Attribute> attributes = {},
                            const std::string& output_name = "") {
    const std::string base = absl::StrCat(prefix_, "/", what);
    const std::string out = output_name.empty() ? graph_.UniqueName(base) : output_name;
    CASTOR_ASSIGN_OR_RETURN(Node * node,
                            graph_.AddNode(op_type, std::move(inputs), {out}, graph_.UniqueName(base)));
    for (Attribute& attribute : attributes) node->SetAttribute(std::move(attribute));
    ++nodes_added_;
    return node->output(0);
  }

  // A Constant node (never a float initializer: that would be a parameter);
  // an integer constant below opset 9, where Constant holds only floats, is
  // an int64 initializer.
  absl::StatusOr<Value*> Constant(Tensor tensor, const std::string& what) {
    if (opset_ < 9 && tensor.dtype() == DType::kInt64) {
      return graph_.AddInitializer(graph_.UniqueName(absl::StrCat(prefix_, "/", what)),
                                   std::move(tensor));
    }
    return Op("Constant", {}, what, {Attribute::TensorValue("value", std::move(tensor))});
  }
  // The scalar index `index` (one constant per value, shared).
  absl::StatusOr<Value*> IndexScalar(int64_t index) {
    Value*& cached = index_scalars_[index];
    if (cached == nullptr) {
      Tensor scalar(DType::kInt64, {});
      scalar.data<int64_t>()[0] = index;
      CASTOR_ASSIGN_OR_RETURN(cached, Constant(std::move(scalar), absl::StrCat("index_", index)));
    }
    return cached;
  }
  // The indices [begin, end) as a 1-D int64 constant (one per range, shared).
  absl::StatusOr<Value*> IndexRange(int64_t begin, int64_t end) {
    Value*& cached = index_ranges_[{begin, end}];
    if (cached == nullptr) {
      std::vector<int64_t> indices;
      for (int64_t i = begin; i < end; ++i) indices.push_back(i);
      CASTOR_ASSIGN_OR_RETURN(cached, Constant(Tensor::Int64s(indices),
                                               absl::StrCat("range_", begin, "_", end)));
    }
    return cached;
  }
  // The time index `t` as an int32 scalar (sequence_lens' dtype), shared.
  absl::StatusOr<Value*> Int32Scalar(int64_t t) {
    Value*& cached = int32_scalars_[t];
    if (cached == nullptr) {
      Tensor scalar(DType::kInt32, {});
      scalar.data<int32_t>()[0] = static_cast<int32_t>(t);
      CASTOR_ASSIGN_OR_RETURN(cached, Constant(std::move(scalar), absl::StrCat("time_", t)));
    }
    return cached;
  }
  // 0 of the node's float dtype, shared.
  absl::StatusOr<Value*> Zero() {
    if (zero_ == nullptr) {
      CASTOR_ASSIGN_OR_RETURN(zero_, FloatScalar(0.0f, "zero"));
    }
    return zero_;
  }
  // A scalar of the node's float dtype.
  absl::StatusOr<Value*> FloatScalar(float value, const std::string& what) {
    Tensor scalar(dtype_, {});
    switch (dtype_) {
      case DType::kFloat32: scalar.data<float>()[0] = value; break;
      case DType::kFloat64: scalar.data<double>()[0] = value; break;
      case DType::kFloat16: scalar.data<uint16_t>()[0] = FloatToHalfBits(value); break;
      case DType::kBFloat16: scalar.data<uint16_t>()[0] = FloatToBFloat16Bits(value); break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat(prefix_, ": float dtype expected, got ", DTypeName(dtype_)));
    }
    return Constant(std::move(scalar), what);
  }

  // x[index] along `axis` (the axis removed).
  absl::StatusOr<Value*> Take(Value* x, int64_t index, int64_t axis, const std::string& what) {
    CASTOR_ASSIGN_OR_RETURN(Value * i, IndexScalar(index));
    return Op("Gather", {x, i}, what, {Attribute::Int("axis", axis)});
  }
  // x[begin:end] along `axis`.
  absl::StatusOr<Value*> Columns(Value* x, int64_t begin, int64_t end, int64_t axis,
                                 const std::string& what) {
    CASTOR_ASSIGN_OR_RETURN(Value * range, IndexRange(begin, end));
    return Op("Gather", {x, range}, what, {Attribute::Int("axis", axis)});
  }
  absl::StatusOr<Value*> Unsqueeze(Value* x, std::vector<int64_t> axes, const std::string& what,
                                   const std::string& output_name = "") {
    if (opset_ < 13) {
      return Op("Unsqueeze", {x}, what, {Attribute::Ints("axes", std::move(axes))}, output_name);
    }
    CASTOR_ASSIGN_OR_RETURN(Value * axes_value, Constant(Tensor::Int64s(axes), what + "_axes"));
    return Op("Unsqueeze", {x, axes_value}, what, {}, output_name);
  }
  absl::StatusOr<Value*> Concat(std::vector<Value*> parts, int64_t axis, const std::string& what,
                                const std::string& output_name = "") {
    if (parts.size() == 1 && output_name.empty()) return parts[0];
    return Op("Concat", std::move(parts), what, {Attribute::Int("axis", axis)}, output_name);
  }
  absl::StatusOr<Value*> Clip(Value* x, float bound, const std::string& what) {
    if (opset_ < 11) {
      return Op("Clip", {x}, what, {Attribute::Float("min", -bound), Attribute::Float("max", bound)});
    }
    if (clip_min_ == nullptr) {
      CASTOR_ASSIGN_OR_RETURN(clip_min_, FloatScalar(-bound, "clip_min"));
      CASTOR_ASSIGN_OR_RETURN(clip_max_, FloatScalar(bound, "clip_max"));
    }
    return Op("Clip", {x, clip_min_, clip_max_}, what);
  }
  absl::StatusOr<Value*> Activate(Value* x, const Activation& activation, const std::string& what) {
    std::vector<Attribute> attributes;
    if (activation.alpha) attributes.push_back(Attribute::Float("alpha", *activation.alpha));
    if (activation.beta) attributes.push_back(Attribute::Float("beta", *activation.beta));
    return Op(activation.op_type, {x}, what, std::move(attributes));
  }

 private:
  Graph& graph_;
  std::string prefix_;
  int64_t opset_;
  DType dtype_;
  int nodes_added_ = 0;
  std::map<int64_t, Value*> index_scalars_;
  std::map<int64_t, Value*> int32_scalars_;
  Value* zero_ = nullptr;
  std::map<std::pair<int64_t, int64_t>, Value*> index_ranges_;
  Value* clip_min_ = nullptr;
  Value* clip_max_ = nullptr;
};

// The state after each step of one direction.
struct DirectionResult {
  std::vector<Value*> h_by_time;  // h at each time index (original order)
  Value* last_h = nullptr;
  Value* last_c = nullptr;
};

// `a + b` where a null `b` is zero.
absl::StatusOr<Value*> AddOptional(Emitter& e, Value* a, Value* b, const std::string& what) {
  if (b == nullptr) return a;
  return e.Op("Add", {a, b}, what);
}

absl::StatusOr<Value*> ClipAndActivate(Emitter& e, const CellSpec& spec, Value* x,
                                       const Activation& activation, const std::string& what) {
  if (spec.clip) {
    CASTOR_ASSIGN_OR_RETURN(x, e.Clip(x, *spec.clip, what + "_clip"));
  }
  return e.Activate(x, activation, what);
}

// GRU's new state h = (1 - z) * h~ + z * h_prev, as h~ + z * (h_prev - h~)
// (no constant 1); a null h_prev (zeros) gives h~ - z * h~.
absl::StatusOr<Value*> GruUpdate(Emitter& e, Value* z, Value* candidate, Value* h_prev,
                                 const std::string& at) {
  if (h_prev == nullptr) {
    CASTOR_ASSIGN_OR_RETURN(Value * zc, e.Op("Mul", {z, candidate}, at + "z_h_candidate"));
    return e.Op("Sub", {candidate, zc}, at + "h");
  }
  CASTOR_ASSIGN_OR_RETURN(Value * diff, e.Op("Sub", {h_prev, candidate}, at + "h_prev_minus_candidate"));
  CASTOR_ASSIGN_OR_RETURN(Value * zd, e.Op("Mul", {z, diff}, at + "z_diff"));
  return e.Op("Add", {candidate, zd}, at + "h");
}

// `lengths` ([batch, 1] int32, or null): the steps at t >= lengths[b]
// keep batch entry b's state and write zeros to Y (ONNX's sequence_lens;
// the same rule for both directions, as a reverse pass meets the padding
// first).
absl::StatusOr<DirectionResult> UnrollDirection(Emitter& e, const Node& node, const CellSpec& spec,
                                                int64_t d, Value* lengths) {
  const int64_t H = spec.hidden;
  const int64_t GH = spec.gates * H;
  const std::string dir = absl::StrCat("d", d);
  const std::vector<Activation>& act = spec.activations[d];
  const bool reverse = spec.reverse_only || d == 1;
  Value* x = node.input(0);
  // 1. Wd^T, Rd^T.
  CASTOR_ASSIGN_OR_RETURN(Value * w, e.Take(node.input(1), d, 0, dir + "/W"));
  CASTOR_ASSIGN_OR_RETURN(Value * w_t, e.Op("Transpose", {w}, dir + "/W_T", {Attribute::Ints("perm", {1, 0})}));
  CASTOR_ASSIGN_OR_RETURN(Value * r, e.Take(node.input(2), d, 0, dir + "/R"));
  // GRU without linear_before_reset multiplies r * h before R's h block:
  // the z, r blocks and the h block of R apart.
  const bool gru_split_r = spec.kind == CellKind::kGru && !spec.linear_before_reset;
  Value* r_t = nullptr;     // [H, GH]
  Value* r_zr_t = nullptr;  // GRU: [H, 2H]
  Value* r_h_t = nullptr;   // GRU: [H, H]
  const std::vector<Attribute> transpose = {Attribute::Ints("perm", {1, 0})};
  if (gru_split_r) {
    CASTOR_ASSIGN_OR_RETURN(Value * r_zr, e.Columns(r, 0, 2 * H, 0, dir + "/R_zr"));
    CASTOR_ASSIGN_OR_RETURN(r_zr_t, e.Op("Transpose", {r_zr}, dir + "/R_zr_T", transpose));
    CASTOR_ASSIGN_OR_RETURN(Value * r_h, e.Columns(r, 2 * H, 3 * H, 0, dir + "/R_h"));
    CASTOR_ASSIGN_OR_RETURN(r_h_t, e.Op("Transpose", {r_h}, dir + "/R_h_T", transpose));
  } else {
    CASTOR_ASSIGN_OR_RETURN(r_t, e.Op("Transpose", {r}, dir + "/R_T", transpose));
  }
  // 2. The input projection of every step, with the biases that add to it.
  CASTOR_ASSIGN_OR_RETURN(Value * projection, e.Op("MatMul", {x, w_t}, dir + "/input_projection"));
  Value* recurrent_bias = nullptr;  // GRU with linear_before_reset: Rb, added per step
  if (node.input(3) != nullptr) {
    CASTOR_ASSIGN_OR_RETURN(Value * b, e.Take(node.input(3), d, 0, dir + "/B"));
    CASTOR_ASSIGN_OR_RETURN(Value * wb, e.Columns(b, 0, GH, 0, dir + "/Wb"));
    CASTOR_ASSIGN_OR_RETURN(Value * rb, e.Columns(b, GH, 2 * GH, 0, dir + "/Rb"));
    Value* bias = wb;
    if (spec.linear_before_reset) {
      recurrent_bias = rb;
    } else {
      CASTOR_ASSIGN_OR_RETURN(bias, e.Op("Add", {wb, rb}, dir + "/bias"));
    }
    CASTOR_ASSIGN_OR_RETURN(projection, e.Op("Add", {projection, bias}, dir + "/input_projection_bias"));
  }
  // Peepholes.
  Value* p_i = nullptr;
  Value* p_o = nullptr;
  Value* p_f = nullptr;
  if (spec.kind == CellKind::kLstm && node.input(7) != nullptr) {
    CASTOR_ASSIGN_OR_RETURN(Value * p, e.Take(node.input(7), d, 0, dir + "/P"));
    CASTOR_ASSIGN_OR_RETURN(p_i, e.Columns(p, 0, H, 0, dir + "/P_i"));
    CASTOR_ASSIGN_OR_RETURN(p_o, e.Columns(p, H, 2 * H, 0, dir + "/P_o"));
    CASTOR_ASSIGN_OR_RETURN(p_f, e.Columns(p, 2 * H, 3 * H, 0, dir + "/P_f"));
  }
  // The initial state ([D, batch, H], layout 1: [batch, D, H]); null is zeros.
  const int64_t state_axis = spec.layout == 0 ? 0 : 1;
  Value* h = nullptr;
  Value* c = nullptr;
  if (node.input(5) != nullptr) {
    CASTOR_ASSIGN_OR_RETURN(h, e.Take(node.input(5), d, state_axis, dir + "/initial_h"));
  }
  if (spec.kind == CellKind::kLstm && node.input(6) != nullptr) {
    CASTOR_ASSIGN_OR_RETURN(c, e.Take(node.input(6), d, state_axis, dir + "/initial_c"));
  }
  Value* one = nullptr;
  if (spec.input_forget) {
    CASTOR_ASSIGN_OR_RETURN(one, e.FloatScalar(1.0f, dir + "/one"));
  }

  DirectionResult result;
  result.h_by_time.assign(spec.seq, nullptr);
  const int64_t time_axis = spec.layout == 0 ? 0 : 1;
  for (int64_t step = 0; step < spec.seq; ++step) {
    const int64_t t = reverse ? spec.seq - 1 - step : step;
    const std::string at = absl::StrCat(dir, "/t", t, "/");
    Value* const h_prev = h;
    Value* const c_prev = c;
    CASTOR_ASSIGN_OR_RETURN(Value * xt, e.Take(projection, t, time_axis, at + "x"));  // [batch, GH]
    if (spec.kind == CellKind::kLstm) {
      Value* gates = xt;
      if (h != nullptr) {
        CASTOR_ASSIGN_OR_RETURN(Value * hr, e.Op("MatMul", {h, r_t}, at + "h_R"));
        CASTOR_ASSIGN_OR_RETURN(gates, e.Op("Add", {xt, hr}, at + "gates"));
      }
      CASTOR_ASSIGN_OR_RETURN(Value * gi, e.Columns(gates, 0, H, 1, at + "i_in"));
      CASTOR_ASSIGN_OR_RETURN(Value * go, e.Columns(gates, H, 2 * H, 1, at + "o_in"));
      CASTOR_ASSIGN_OR_RETURN(Value * gc, e.Columns(gates, 3 * H, 4 * H, 1, at + "c_in"));
      if (p_i != nullptr && c != nullptr) {
        CASTOR_ASSIGN_OR_RETURN(Value * peep, e.Op("Mul", {p_i, c}, at + "i_peephole"));
        CASTOR_ASSIGN_OR_RETURN(gi, e.Op("Add", {gi, peep}, at + "i_in_peephole"));
      }
      CASTOR_ASSIGN_OR_RETURN(Value * i, ClipAndActivate(e, spec, gi, act[0], at + "i"));
      CASTOR_ASSIGN_OR_RETURN(Value * cand, ClipAndActivate(e, spec, gc, act[1], at + "c_candidate"));
      CASTOR_ASSIGN_OR_RETURN(Value * new_c, e.Op("Mul", {i, cand}, at + "i_c_candidate"));
      if (c != nullptr) {  // c_prev = 0 drops f * c_prev
        Value* f = nullptr;
        if (spec.input_forget) {
          CASTOR_ASSIGN_OR_RETURN(f, e.Op("Sub", {one, i}, at + "f"));
        } else {
          CASTOR_ASSIGN_OR_RETURN(Value * gf, e.Columns(gates, 2 * H, 3 * H, 1, at + "f_in"));
          if (p_f != nullptr) {
            CASTOR_ASSIGN_OR_RETURN(Value * peep, e.Op("Mul", {p_f, c}, at + "f_peephole"));
            CASTOR_ASSIGN_OR_RETURN(gf, e.Op("Add", {gf, peep}, at + "f_in_peephole"));
          }
          CASTOR_ASSIGN_OR_RETURN(f, ClipAndActivate(e, spec, gf, act[0], at + "f"));
        }
        CASTOR_ASSIGN_OR_RETURN(Value * kept, e.Op("Mul", {f, c}, at + "f_c"));
        CASTOR_ASSIGN_OR_RETURN(new_c, e.Op("Add", {kept, new_c}, at + "c"));
      }
      c = new_c;
      if (p_o != nullptr) {
        CASTOR_ASSIGN_OR_RETURN(Value * peep, e.Op("Mul", {p_o, c}, at + "o_peephole"));
        CASTOR_ASSIGN_OR_RETURN(go, e.Op("Add", {go, peep}, at + "o_in_peephole"));
      }
      CASTOR_ASSIGN_OR_RETURN(Value * o, ClipAndActivate(e, spec, go, act[0], at + "o"));
      CASTOR_ASSIGN_OR_RETURN(Value * c_act, e.Activate(c, act[2], at + "c_activation"));
      CASTOR_ASSIGN_OR_RETURN(h, e.Op("Mul", {o, c_act}, at + "h"));
    } else if (spec.kind == CellKind::kGru) {
      CASTOR_ASSIGN_OR_RETURN(Value * x_zr, e.Columns(xt, 0, 2 * H, 1, at + "x_zr"));
      CASTOR_ASSIGN_OR_RETURN(Value * x_h, e.Columns(xt, 2 * H, 3 * H, 1, at + "x_h"));
      Value* zr_in = x_zr;
      Value* h_in = x_h;
      if (spec.linear_before_reset) {
        // rec = h @ R^T + Rb; z, r from its first blocks, h~ from r * its last.
        Value* rec = recurrent_bias;
        if (h != nullptr) {
          CASTOR_ASSIGN_OR_RETURN(rec, e.Op("MatMul", {h, r_t}, at + "h_R"));
          CASTOR_ASSIGN_OR_RETURN(rec, AddOptional(e, rec, recurrent_bias, at + "h_R_bias"));
        }
        if (rec != nullptr) {
          const int64_t axis = h != nullptr ? 1 : 0;  // Rb alone is 1-D
          CASTOR_ASSIGN_OR_RETURN(Value * rec_zr, e.Columns(rec, 0, 2 * H, axis, at + "rec_zr"));
          CASTOR_ASSIGN_OR_RETURN(zr_in, e.Op("Add", {x_zr, rec_zr}, at + "zr_in"));
        }
        CASTOR_ASSIGN_OR_RETURN(Value * zr, ClipAndActivate(e, spec, zr_in, act[0], at + "zr"));
        CASTOR_ASSIGN_OR_RETURN(Value * z, e.Columns(zr, 0, H, 1, at + "z"));
        CASTOR_ASSIGN_OR_RETURN(Value * reset, e.Columns(zr, H, 2 * H, 1, at + "r"));
        if (rec != nullptr) {
          const int64_t axis = h != nullptr ? 1 : 0;
          CASTOR_ASSIGN_OR_RETURN(Value * rec_h, e.Columns(rec, 2 * H, 3 * H, axis, at + "rec_h"));
          CASTOR_ASSIGN_OR_RETURN(Value * gated, e.Op("Mul", {reset, rec_h}, at + "r_rec_h"));
          CASTOR_ASSIGN_OR_RETURN(h_in, e.Op("Add", {x_h, gated}, at + "h_in"));
        }
        CASTOR_ASSIGN_OR_RETURN(Value * cand, ClipAndActivate(e, spec, h_in, act[1], at + "h_candidate"));
        CASTOR_ASSIGN_OR_RETURN(h, GruUpdate(e, z, cand, h, at));
      } else {
        if (h != nullptr) {
          CASTOR_ASSIGN_OR_RETURN(Value * rec_zr, e.Op("MatMul", {h, r_zr_t}, at + "h_R_zr"));
          CASTOR_ASSIGN_OR_RETURN(zr_in, e.Op("Add", {x_zr, rec_zr}, at + "zr_in"));
        }
        CASTOR_ASSIGN_OR_RETURN(Value * zr, ClipAndActivate(e, spec, zr_in, act[0], at + "zr"));
        CASTOR_ASSIGN_OR_RETURN(Value * z, e.Columns(zr, 0, H, 1, at + "z"));
        if (h != nullptr) {
          CASTOR_ASSIGN_OR_RETURN(Value * reset, e.Columns(zr, H, 2 * H, 1, at + "r"));
          CASTOR_ASSIGN_OR_RETURN(Value * rh, e.Op("Mul", {reset, h}, at + "r_h"));
          CASTOR_ASSIGN_OR_RETURN(Value * rec_h, e.Op("MatMul", {rh, r_h_t}, at + "r_h_R"));
          CASTOR_ASSIGN_OR_RETURN(h_in, e.Op("Add", {x_h, rec_h}, at + "h_in"));
        }
        CASTOR_ASSIGN_OR_RETURN(Value * cand, ClipAndActivate(e, spec, h_in, act[1], at + "h_candidate"));
        CASTOR_ASSIGN_OR_RETURN(h, GruUpdate(e, z, cand, h, at));
      }
    } else {  // RNN
      Value* in = xt;
      if (h != nullptr) {
        CASTOR_ASSIGN_OR_RETURN(Value * hr, e.Op("MatMul", {h, r_t}, at + "h_R"));
        CASTOR_ASSIGN_OR_RETURN(in, e.Op("Add", {xt, hr}, at + "h_in"));
      }
      CASTOR_ASSIGN_OR_RETURN(h, ClipAndActivate(e, spec, in, act[0], at + "h"));
    }
    result.h_by_time[t] = h;
    if (lengths != nullptr) {
      CASTOR_ASSIGN_OR_RETURN(Value * time, e.Int32Scalar(t));
      CASTOR_ASSIGN_OR_RETURN(Value * valid, e.Op("Less", {time, lengths}, at + "in_sequence"));
      CASTOR_ASSIGN_OR_RETURN(Value * zero, e.Zero());
      CASTOR_ASSIGN_OR_RETURN(result.h_by_time[t], e.Op("Where", {valid, h, zero}, at + "y_masked"));
      CASTOR_ASSIGN_OR_RETURN(h, e.Op("Where", {valid, h, h_prev != nullptr ? h_prev : zero},
                                      at + "h_masked"));
      if (c != nullptr) {
        CASTOR_ASSIGN_OR_RETURN(c, e.Op("Where", {valid, c, c_prev != nullptr ? c_prev : zero},
                                        at + "c_masked"));
      }
    }
  }
  if (lengths != nullptr) {  // a length-0 entry has zero Y_h / Y_c (as ONNX Runtime)
    CASTOR_ASSIGN_OR_RETURN(Value * first, e.Int32Scalar(0));
    CASTOR_ASSIGN_OR_RETURN(Value * nonempty, e.Op("Less", {first, lengths}, dir + "/nonempty"));
    CASTOR_ASSIGN_OR_RETURN(Value * zero, e.Zero());
    CASTOR_ASSIGN_OR_RETURN(h, e.Op("Where", {nonempty, h, zero}, dir + "/last_h"));
    if (c != nullptr) {
      CASTOR_ASSIGN_OR_RETURN(c, e.Op("Where", {nonempty, c, zero}, dir + "/last_c"));
    }
  }
  result.last_h = h;
  result.last_c = c;
  return result;
}

// Moves `old_value`'s name to the value the rewrite computes: the old one
// gets a fresh name first, so the new one can be created under the name.
absl::StatusOr<std::string> FreeName(Graph& graph, Value* old_value) {
  const std::string name = old_value->name();
  CASTOR_RETURN_IF_ERROR(graph.RenameValue(old_value, graph.UniqueName(name + "/replaced")));
  return name;
}

absl::Status UnrollNode(Model& model, Node* node, CellKind kind, UnrollRecurrentReport& report) {
  Graph& graph = *model.graph;
  CASTOR_ASSIGN_OR_RETURN(CellSpec spec, ReadSpec(*node, kind));
  const int64_t opset = model.OpsetVersion("");
  CASTOR_ASSIGN_OR_RETURN(bool masked, NeedsMasking(*node, spec, opset));
  Emitter e(graph, *node, opset, node->input(0)->dtype());
  Value* lengths = nullptr;  // [batch, 1]
  if (masked) {
    CASTOR_ASSIGN_OR_RETURN(lengths, e.Unsqueeze(node->input(4), {1}, "lengths"));
  }
  std::vector<DirectionResult> directions;
  for (int64_t d = 0; d < spec.directions; ++d) {
    CASTOR_ASSIGN_OR_RETURN(DirectionResult result, UnrollDirection(e, *node, spec, d, lengths));
    directions.push_back(std::move(result));
  }
  // 4. The outputs, under the node's output names.
  const int64_t direction_axis = spec.layout == 0 ? 1 : 2;
  const int64_t time_axis = spec.layout == 0 ? 0 : 1;
  const int64_t state_axis = spec.layout == 0 ? 0 : 1;
  std::vector<std::pair<Value*, Value*>> replaced;  // old output, new value
  auto needed = [](const Value* v) {
    return v != nullptr && (!v->uses().empty() || v->is_graph_output());
  };
  if (Value* y = node->output(0); needed(y)) {
    CASTOR_ASSIGN_OR_RETURN(std::string name, FreeName(graph, y));
    std::vector<Value*> steps;
    for (int64_t t = 0; t < spec.seq; ++t) {
      std::vector<Value*> per_direction;
      for (int64_t d = 0; d < spec.directions; ++d) {
        CASTOR_ASSIGN_OR_RETURN(
            Value * u, e.Unsqueeze(directions[d].h_by_time[t],
                                   spec.layout == 0 ? std::vector<int64_t>{0, 1}
                                                    : std::vector<int64_t>{1, 2},
                                   absl::StrCat("d", d, "/t", t, "/Y")));
        per_direction.push_back(u);
      }
      CASTOR_ASSIGN_OR_RETURN(Value * step, e.Concat(per_direction, direction_axis, absl::StrCat("t", t, "/Y")));
      steps.push_back(step);
    }
    CASTOR_ASSIGN_OR_RETURN(Value * out, e.Concat(steps, time_axis, "Y", name));
    replaced.emplace_back(y, out);
  }
  for (int k = 1; k <= 2; ++k) {
    Value* state = node->output(k);
    if (!needed(state)) continue;
    CASTOR_ASSIGN_OR_RETURN(std::string name, FreeName(graph, state));
    const char* what = k == 1 ? "Y_h" : "Y_c";
    std::vector<Value*> per_direction;
    for (int64_t d = 0; d < spec.directions; ++d) {
      Value* last = k == 1 ? directions[d].last_h : directions[d].last_c;
      CASTOR_ASSIGN_OR_RETURN(Value * u, e.Unsqueeze(last, {state_axis}, absl::StrCat("d", d, "/", what),
                                                     spec.directions == 1 ? name : ""));
      per_direction.push_back(u);
    }
    Value* out = per_direction[0];
    if (spec.directions > 1) {
      CASTOR_ASSIGN_OR_RETURN(out, e.Concat(per_direction, state_axis, what, name));
    }
    replaced.emplace_back(state, out);
  }
  for (auto& [old_value, new_value] : replaced) {
    new_value->set_has_value_info(old_value->has_value_info());
    new_value->set_doc_string(old_value->doc_string());
    new_value->set_shape(old_value->shape());
    new_value->set_dtype(old_value->dtype());
    graph.ReplaceAllUsesWith(old_value, new_value);
  }
  CASTOR_RETURN_IF_ERROR(graph.RemoveNode(node));
  ++(kind == CellKind::kLstm ? report.lstm_nodes : kind == CellKind::kGru ? report.gru_nodes : report.rnn_nodes);
  report.nodes_added += e.nodes_added();
  return absl::OkStatus();
}

std::optional<CellKind> KindOf(const Node& node) {
  if (!node.domain().empty() && node.domain() != "ai.onnx") return std::nullopt;
  if (node.op_type() == "LSTM") return CellKind::kLstm;
  if (node.op_type() == "GRU") return CellKind::kGru;
  if (node.op_type() == "RNN") return CellKind::kRnn;
  return std::nullopt;
}

std::string Describe(const UnrollRecurrentReport& report) {
  std::vector<std::string> parts;
  if (report.lstm_nodes > 0) parts.push_back(absl::StrCat(report.lstm_nodes, " LSTM"));
  if (report.gru_nodes > 0) parts.push_back(absl::StrCat(report.gru_nodes, " GRU"));
  if (report.rnn_nodes > 0) parts.push_back(absl::StrCat(report.rnn_nodes, " RNN"));
  return absl::StrCat("unroll-recurrent: ", absl::StrJoin(parts, ", "),
                      " node(s) unrolled into ", report.nodes_added, " primitive nodes");
}

class UnrollRecurrentPass : public Pass {
 public:
  explicit UnrollRecurrentPass(UnrollRecurrentReport* report) : report_(report) {}
  std::string name() const override { return "unroll-recurrent"; }
  std::string description() const override {
    return "rewrites LSTM, GRU and RNN nodes into MatMul, Add, Mul, activations, Gather and "
           "Concat over a fixed number of time steps";
  }
  absl::Status Run(Model& model, PassContext& context) override {
    CASTOR_ASSIGN_OR_RETURN(UnrollRecurrentReport report, UnrollRecurrent(model));
    if (report.changed()) context.notes.push_back(Describe(report));
    if (report_ != nullptr) *report_ = report;
    return absl::OkStatus();
  }
  // The imported model may still have what canonicalize folds later.
  VerifyRules rules_after() const override { return VerifyRules::kValid; }

 private:
  UnrollRecurrentReport* report_;
};

}  // namespace

bool HasRecurrentNodes(const Model& model) {
  const std::vector<Node*>& nodes = model.graph->nodes();
  return std::any_of(nodes.begin(), nodes.end(), [](const Node* n) { return KindOf(*n).has_value(); });
}

absl::StatusOr<UnrollRecurrentReport> UnrollRecurrent(Model& model) {
  UnrollRecurrentReport report;
  const std::vector<Node*> nodes = model.graph->nodes();
  for (Node* node : nodes) {
    const std::optional<CellKind> kind = KindOf(*node);
    if (!kind.has_value()) continue;
    CASTOR_RETURN_IF_ERROR(UnrollNode(model, node, *kind, report));
  }
  if (report.changed()) {
    CASTOR_RETURN_IF_ERROR(model.graph->TopologicalSort());
    CASTOR_RETURN_IF_ERROR(InferTypes(model));
  }
  return report;
}

std::unique_ptr<Pass> MakeUnrollRecurrentPass(UnrollRecurrentReport* report) {
  return std::make_unique<UnrollRecurrentPass>(report);
}

absl::Status UnrollRecurrentIfAny(Model& model) {
  if (!HasRecurrentNodes(model)) return absl::OkStatus();
  PassManager manager;
  manager.Add(MakeUnrollRecurrentPass());
  PassContext context;
  return manager.Run(model, context);
}

}  // namespace castor
