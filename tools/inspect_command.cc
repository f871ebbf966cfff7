// `castor inspect`: the model checks, the report rows built from a checked
// Model, and the text, JSON and Graphviz renderers over those rows.
#include "tools/inspect_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "passes/autocast.h"
#include "passes/model_loader.h"
#include "passes/pass_manager.h"
#include "passes/verifier.h"
#include "tools/args.h"
#include "tools/cli.h"
#include "graph/json_writer.h"

namespace castor::tools {
namespace {

std::string DomainName(const std::string& domain) {
  return domain.empty() ? "ai.onnx" : domain;
}

std::string FormatDouble(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", value);
  return buffer;
}

ValueRow MakeValueRow(const Value* value) {
  ValueRow row;
  if (!value) {
    row.present = false;
    return row;
  }
  row.name = value->name();
  row.dtype = value->dtype();
  row.shape = value->shape();
  row.has_default = value->is_graph_input() && value->initializer() != nullptr;
  return row;
}

DType ComputeDType(const Node& node) {
  if (const std::string* recorded = node.FindMetadata(kNodeDTypeKey)) {
    if (absl::StatusOr<DType> dtype = DTypeFromName(*recorded); dtype.ok()) return *dtype;
  }
  for (const Value* in : node.inputs()) {
    if (in && IsFloatingPoint(in->dtype())) return in->dtype();
  }
  return node.num_outputs() > 0 ? node.output(0)->dtype() : DType::kUndefined;
}

std::string OpsetsText(const std::vector<OpsetImport>& opsets) {
  std::vector<std::string> parts;
  for (const OpsetImport& opset : opsets) {
    parts.push_back(absl::StrCat(DomainName(CanonicalDomain(opset.domain)), " ", opset.version));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

// ---- text -------------------------------------------------------------------

std::string ValueText(const ValueRow& value) {
  if (!value.present) return "-";
  return absl::StrCat(value.name, " ", TypeString(value.dtype, value.shape));
}

// A tensor attribute: its type, plus its values when there are few
// (Reshape targets, scalars): "int64[3]{-1,28,28}".
std::string CompactTensor(const Tensor& tensor) {
  std::string text = TypeString(tensor.dtype(), tensor.shape());
  constexpr int64_t kMaxShownElements = 8;
  const bool numeric = IsFloatingPoint(tensor.dtype()) || IsInteger(tensor.dtype());
  if (numeric && tensor.num_elements() <= kMaxShownElements) {
    std::vector<std::string> values;
    for (int64_t i = 0; i < tensor.num_elements(); ++i) {
      values.push_back(IsFloatingPoint(tensor.dtype()) ? FormatDouble(tensor.GetDouble(i))
                                                       : absl::StrCat(tensor.GetInt64(i)));
    }
    absl::StrAppend(&text, "{", absl::StrJoin(values, ","), "}");
  }
  return text;
}

std::string CompactAttribute(const Attribute& attribute) {
  std::string value = attribute.kind == AttrKind::kTensor ? CompactTensor(attribute.t)
                      : attribute.kind == AttrKind::kFloat ? FormatDouble(attribute.f)
                                                           : attribute.ToString();
  constexpr size_t kMaxWidth = 48;
  if (value.size() > kMaxWidth) value = absl::StrCat(value.substr(0, kMaxWidth - 3), "...");
  return absl::StrCat(attribute.name, "=", value);
}

// Aligned columns separated by two spaces, each line indented by `indent`
// spaces; the last column is not padded.
std::string RenderTable(const std::vector<std::vector<std::string>>& rows, size_t indent) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string text;
  for (const auto& row : rows) {
    std::string line(indent, ' ');
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line.append(widths[c] - row[c].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&text, line, "\n");
  }
  return text;
}

// ---- JSON -------------------------------------------------------------------

void WriteShape(JsonWriter& json, const Shape& shape) {
  if (!shape.rank_known()) {
    json.Null();
    return;
  }
  json.BeginArray();
  for (const Dim& dim : shape.dims()) {
    if (dim.is_static()) {
      json.Int(dim.value());
    } else if (dim.is_symbolic()) {
      json.String(dim.symbol());
    } else {
      json.Null();
    }
  }
  json.EndArray();
}

void WriteValue(JsonWriter& json, const ValueRow& value) {
  if (!value.present) {
    json.Null();
    return;
  }
  json.BeginObject().Key("name").String(value.name).Key("dtype").String(DTypeName(value.dtype));
  json.Key("shape");
  WriteShape(json, value.shape);
  json.EndObject();
}

void WriteTensorSummary(JsonWriter& json, const Tensor& tensor) {
  json.BeginObject().Key("dtype").String(DTypeName(tensor.dtype())).Key("shape");
  WriteShape(json, tensor.shape());
  constexpr int64_t kMaxShownElements = 16;
  if (tensor.num_elements() <= kMaxShownElements) {
    if (IsFloatingPoint(tensor.dtype())) {
      json.Key("values").BeginArray();
      for (int64_t i = 0; i < tensor.num_elements(); ++i) json.Double(tensor.GetDouble(i));
      json.EndArray();
    } else if (IsInteger(tensor.dtype())) {
      json.Key("values").BeginArray();
      for (int64_t i = 0; i < tensor.num_elements(); ++i) json.Int(tensor.GetInt64(i));
      json.EndArray();
    }
  }
  json.EndObject();
}

void WriteAttributeValue(JsonWriter& json, const Attribute& attribute) {
  switch (attribute.kind) {
    case AttrKind::kFloat: json.Double(attribute.f); return;
    case AttrKind::kInt: json.Int(attribute.i); return;
    case AttrKind::kString: json.String(attribute.s); return;
    case AttrKind::kFloats:
      json.BeginArray();
      for (float f : attribute.floats) json.Double(f);
      json.EndArray();
      return;
    case AttrKind::kInts:
      json.BeginArray();
      for (int64_t i : attribute.ints) json.Int(i);
      json.EndArray();
      return;
    case AttrKind::kStrings:
      json.BeginArray();
      for (const std::string& s : attribute.strings) json.String(s);
      json.EndArray();
      return;
    case AttrKind::kTensor: WriteTensorSummary(json, attribute.t); return;
    default: json.String(attribute.ToString()); return;  // graphs, sparse tensors, ...
  }
}

// ---- DOT --------------------------------------------------------------------

// Inside a DOT "..." string: quotes and backslashes escaped.
std::string DotEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// Node fill colours by compute dtype; edges use a darker shade.
const char* DTypeFillColor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "#c6dbef";   // blue
    case DType::kFloat16: return "#fdd0a2";   // orange
    case DType::kBFloat16: return "#c7e9c0";  // green
    case DType::kFloat64: return "#dadaeb";   // purple
    default: return "#f0f0f0";                // integers, bool: grey
  }
}

const char* DTypeEdgeColor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "#2171b5";
    case DType::kFloat16: return "#d94801";
    case DType::kBFloat16: return "#238b45";
    case DType::kFloat64: return "#6a51a3";
    default: return "#636363";
  }
}

constexpr const char* kCastFillColor = "#fcbba1";
constexpr const char* kCastBorderColor = "#cb181d";

}  // namespace

std::string TypeString(DType dtype, const Shape& shape) {
  return absl::StrCat(DTypeName(dtype), shape.rank_known() ? shape.ToString() : "[...]");
}

std::string WithThousandsSeparators(int64_t value) {
  std::string digits = absl::StrCat(value < 0 ? -value : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return value < 0 ? absl::StrCat("-", out) : out;
}

std::string QualifiedOpName(const std::string& domain, const std::string& op_type) {
  return domain.empty() ? op_type : absl::StrCat(domain, ":", op_type);
}

InspectReport BuildInspectReport(const Model& model, const std::string& file) {
  const Graph& graph = *model.graph;
  InspectReport report;
  report.file = file;
  report.ir_version = model.ir_version;
  report.producer_name = model.producer_name;
  report.producer_version = model.producer_version;
  report.opsets = model.opset_imports;
  report.graph_name = graph.name();
  report.description = model.doc_string.substr(0, model.doc_string.find('\n'));
  if (const std::string* name = model.FindMetadata(kPolicyNameKey)) report.policy_name = *name;
  if (const std::string* digest = model.FindMetadata(kPolicyDigestKey)) {
    report.policy_digest = *digest;
  }

  for (const Value* input : graph.inputs()) report.inputs.push_back(MakeValueRow(input));
  for (const Value* output : graph.outputs()) report.outputs.push_back(MakeValueRow(output));

  InspectSummary& summary = report.summary;
  std::map<DType, ParameterTotals> by_dtype;
  for (const Value* value : graph.initializers()) {
    const Tensor& tensor = *value->initializer();
    InitializerRow row{value->name(),          tensor.dtype(),
                       tensor.shape(),         tensor.num_elements(),
                       static_cast<int64_t>(tensor.byte_size()), value->is_graph_input()};
    if (row.overridable) {
      ++summary.overridable_inputs;
    } else {
      ParameterTotals& totals = by_dtype[row.dtype];
      totals.dtype = row.dtype;
      totals.elements += row.elements;
      totals.bytes += row.bytes;
      summary.parameter_count += row.elements;
      summary.parameter_bytes += row.bytes;
    }
    report.initializers.push_back(std::move(row));
  }
  for (const auto& [dtype, totals] : by_dtype) summary.parameters_by_dtype.push_back(totals);

  std::map<std::string, int> op_counts;
  std::map<std::string, int> autocast_counts;
  int index = 0;
  for (const Node* node : graph.nodes()) {
    NodeRow row;
    row.index = index++;
    row.name = node->name();
    row.op_type = node->op_type();
    row.domain = node->domain();
    row.compute_dtype = ComputeDType(*node);
    const AutocastRecord record = ReadAutocastRecord(*node);
    row.autocast_why = record.why;
    row.inserted_cast = record.inserted_cast;
    if (!record.inserted_cast.empty()) {
      ++summary.inserted_casts;
    } else if (!record.dtype.empty()) {
      ++autocast_counts[record.dtype];
    }
    for (const Value* in : node->inputs()) row.inputs.push_back(MakeValueRow(in));
    for (const Value* out : node->outputs()) row.outputs.push_back(MakeValueRow(out));
    for (const Attribute& attribute : node->attributes()) row.attributes.push_back(&attribute);
    ++op_counts[QualifiedOpName(row.domain, row.op_type)];
    report.nodes.push_back(std::move(row));
  }
  summary.node_count = index;
  summary.autocast_nodes_per_dtype.assign(autocast_counts.begin(), autocast_counts.end());
  summary.op_histogram.assign(op_counts.begin(), op_counts.end());
  std::stable_sort(summary.op_histogram.begin(), summary.op_histogram.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return report;
}

std::string RenderInspectText(const InspectReport& report) {
  std::string text;
  std::vector<std::vector<std::string>> header = {
      {"file:", report.file},
      {"ir version:", absl::StrCat(report.ir_version)},
      {"producer:", report.producer_name.empty()
                        ? "unknown"
                        : absl::StrCat(report.producer_name, " ", report.producer_version)},
      {"opsets:", OpsetsText(report.opsets)},
      {"graph:", report.graph_name}};
  if (!report.description.empty()) header.push_back({"description:", report.description});
  const bool converted = !report.policy_name.empty();
  if (converted) {
    header.push_back({"policy:", absl::StrCat(report.policy_name, " (", report.policy_digest,
                                              ")")});
  }
  absl::StrAppend(&text, RenderTable(header, 0));

  absl::StrAppend(&text, "\nnodes (", report.nodes.size(), "):", converted
                             ? "  (+ Cast inserted by castor autocast; dtype as recorded, "
                               "'castor inspect MODEL --why NODE' says why)"
                             : "",
                  "\n");
  std::vector<std::vector<std::string>> node_table = {
      {"#", "name", "op", "dtype", "inputs", "outputs", "attributes"}};
  for (const NodeRow& node : report.nodes) {
    std::vector<std::string> inputs, outputs, attributes;
    for (const ValueRow& in : node.inputs) inputs.push_back(in.present ? in.name : "-");
    for (const ValueRow& out : node.outputs) outputs.push_back(ValueText(out));
    for (const Attribute* attribute : node.attributes) {
      attributes.push_back(CompactAttribute(*attribute));
    }
    node_table.push_back({absl::StrCat(node.index), node.name,
                          absl::StrCat(QualifiedOpName(node.domain, node.op_type),
                                       node.inserted_cast.empty() ? "" : " +"),
                          DTypeName(node.compute_dtype), absl::StrJoin(inputs, ", "),
                          absl::StrJoin(outputs, ", "), absl::StrJoin(attributes, " ")});
  }
  absl::StrAppend(&text, RenderTable(node_table, 2));

  absl::StrAppend(&text, "\ninputs (", report.inputs.size(), "):\n");
  for (const ValueRow& input : report.inputs) {
    absl::StrAppend(&text, "  ", ValueText(input),
                    input.has_default ? "  (default: initializer)" : "", "\n");
  }
  absl::StrAppend(&text, "\noutputs (", report.outputs.size(), "):\n");
  for (const ValueRow& output : report.outputs) absl::StrAppend(&text, "  ", ValueText(output), "\n");

  absl::StrAppend(&text, "\ninitializers (", report.initializers.size(), "):\n");
  if (!report.initializers.empty()) {
    std::vector<std::vector<std::string>> initializer_table;
    for (const InitializerRow& row : report.initializers) {
      initializer_table.push_back({row.name, TypeString(row.dtype, row.shape),
                                   WithThousandsSeparators(row.elements),
                                   row.overridable ? "overridable input" : ""});
    }
    absl::StrAppend(&text, RenderTable(initializer_table, 2));
  }

  const InspectSummary& summary = report.summary;
  absl::StrAppend(&text, "\nsummary:\n  nodes: ", summary.node_count, "\n  op histogram:\n");
  std::vector<std::vector<std::string>> histogram;
  for (const auto& [op, count] : summary.op_histogram) {
    histogram.push_back({op, absl::StrCat(count)});
  }
  absl::StrAppend(&text, RenderTable(histogram, 4));
  absl::StrAppend(&text, "  parameters: ", WithThousandsSeparators(summary.parameter_count), " (",
                  WithThousandsSeparators(summary.parameter_bytes), " bytes)\n");
  std::vector<std::vector<std::string>> per_dtype;
  for (const ParameterTotals& totals : summary.parameters_by_dtype) {
    per_dtype.push_back({DTypeName(totals.dtype), WithThousandsSeparators(totals.elements),
                         absl::StrCat(WithThousandsSeparators(totals.bytes), " bytes")});
  }
  absl::StrAppend(&text, RenderTable(per_dtype, 4));
  if (summary.overridable_inputs > 0) {
    absl::StrAppend(&text, "  overridable inputs with defaults (not counted): ",
                    summary.overridable_inputs, "\n");
  }
  if (converted) {
    std::vector<std::string> per_dtype_text;
    for (const auto& [dtype, count] : summary.autocast_nodes_per_dtype) {
      per_dtype_text.push_back(absl::StrCat(dtype, " ", count));
    }
    absl::StrAppend(&text, "  autocast: ", summary.inserted_casts, " Casts inserted; nodes per dtype: ",
                    per_dtype_text.empty() ? "none" : absl::StrJoin(per_dtype_text, ", "), "\n");
  }
  absl::StrAppend(&text, "  opsets: ", OpsetsText(report.opsets), "\n");
  return text;
}

std::string RenderInspectJson(const InspectReport& report) {
  JsonWriter json;
  json.BeginObject();
  json.Key("file").String(report.file);
  json.Key("ir_version").Int(report.ir_version);
  json.Key("producer").BeginObject();
  json.Key("name").String(report.producer_name).Key("version").String(report.producer_version);
  json.EndObject();
  auto write_opsets = [&] {
    json.BeginArray();
    for (const OpsetImport& opset : report.opsets) {
      json.BeginObject().Key("domain").String(DomainName(CanonicalDomain(opset.domain)));
      json.Key("version").Int(opset.version).EndObject();
    }
    json.EndArray();
  };
  json.Key("opsets");
  write_opsets();
  json.Key("graph").String(report.graph_name);
  json.Key("description").String(report.description);
  if (!report.policy_name.empty()) {
    json.Key("policy").BeginObject().Key("name").String(report.policy_name);
    json.Key("digest").String(report.policy_digest).EndObject();
  }

  json.Key("inputs").BeginArray();
  for (const ValueRow& input : report.inputs) {
    json.BeginObject().Key("name").String(input.name).Key("dtype").String(DTypeName(input.dtype));
    json.Key("shape");
    WriteShape(json, input.shape);
    json.Key("has_default").Bool(input.has_default).EndObject();
  }
  json.EndArray();
  json.Key("outputs").BeginArray();
  for (const ValueRow& output : report.outputs) WriteValue(json, output);
  json.EndArray();

  json.Key("initializers").BeginArray();
  for (const InitializerRow& row : report.initializers) {
    json.BeginObject().Key("name").String(row.name).Key("dtype").String(DTypeName(row.dtype));
    json.Key("shape");
    WriteShape(json, row.shape);
    json.Key("elements").Int(row.elements).Key("bytes").Int(row.bytes);
    json.Key("overridable").Bool(row.overridable).EndObject();
  }
  json.EndArray();

  json.Key("nodes").BeginArray();
  for (const NodeRow& node : report.nodes) {
    json.BeginObject();
    json.Key("index").Int(node.index).Key("name").String(node.name);
    json.Key("op_type").String(node.op_type).Key("domain").String(DomainName(node.domain));
    json.Key("compute_dtype").String(DTypeName(node.compute_dtype));
    if (!node.autocast_why.empty()) {
      json.Key("autocast").BeginObject().Key("why").String(node.autocast_why);
      json.Key("inserted_cast").String(node.inserted_cast).EndObject();
    }
    json.Key("inputs").BeginArray();
    for (const ValueRow& in : node.inputs) WriteValue(json, in);
    json.EndArray();
    json.Key("outputs").BeginArray();
    for (const ValueRow& out : node.outputs) WriteValue(json, out);
    json.EndArray();
    json.Key("attributes").BeginObject();
    for (const Attribute* attribute : node.attributes) {
      json.Key(attribute->name);
      WriteAttributeValue(json, *attribute);
    }
    json.EndObject();
    json.EndObject();
  }
  json.EndArray();

  const InspectSummary& summary = report.summary;
  json.Key("summary").BeginObject();
  json.Key("node_count").Int(summary.node_count);
  json.Key("op_histogram").BeginArray();
  for (const auto& [op, count] : summary.op_histogram) {
    json.BeginObject().Key("op").String(op).Key("count").Int(count).EndObject();
  }
  json.EndArray();
  json.Key("parameters").BeginObject();
  json.Key("count").Int(summary.parameter_count).Key("bytes").Int(summary.parameter_bytes);
  json.Key("by_dtype").BeginArray();
  for (const ParameterTotals& totals : summary.parameters_by_dtype) {
    json.BeginObject().Key("dtype").String(DTypeName(totals.dtype));
    json.Key("count").Int(totals.elements).Key("bytes").Int(totals.bytes).EndObject();
  }
  json.EndArray();
  json.EndObject();
  json.Key("overridable_inputs").Int(summary.overridable_inputs);
  if (!report.policy_name.empty()) {
    json.Key("autocast").BeginObject().Key("inserted_casts").Int(summary.inserted_casts);
    json.Key("nodes_per_dtype").BeginObject();
    for (const auto& [dtype, count] : summary.autocast_nodes_per_dtype) json.Key(dtype).Int(count);
    json.EndObject().EndObject();
  }
  json.Key("opsets");
  write_opsets();
  json.EndObject();

  json.EndObject();
  return json.TakeString();
}

std::string RenderInspectDot(const InspectReport& report) {
  std::string dot = absl::StrCat("digraph \"", DotEscape(report.graph_name), "\" {\n");
  absl::StrAppend(
      &dot, "  graph [rankdir=TB, fontname=\"Helvetica\", fontsize=11, labelloc=t, label=\"",
      DotEscape(report.file),
      "\\nfill by compute dtype: float32 blue, float16 orange, bfloat16 green, other grey; "
      "Cast nodes red (inserted by autocast: double border)\"];\n",
      "  node [fontname=\"Helvetica\", fontsize=10, style=filled];\n",
      "  edge [fontname=\"Helvetica\", fontsize=8];\n");

  // Where each value comes from, as a DOT node id.
  std::map<std::string, std::string> source_of;

  absl::StrAppend(&dot, "  // graph inputs\n");
  for (size_t k = 0; k < report.inputs.size(); ++k) {
    const ValueRow& input = report.inputs[k];
    const std::string id = absl::StrCat("i", k);
    source_of[input.name] = id;
    absl::StrAppend(&dot, "  ", id, " [shape=invhouse, fillcolor=\"", DTypeFillColor(input.dtype),
                    "\", label=\"", DotEscape(input.name), "\\n",
                    TypeString(input.dtype, input.shape), "\"];\n");
  }

  absl::StrAppend(&dot, "  // op nodes\n");
  for (const NodeRow& node : report.nodes) {
    const std::string id = absl::StrCat("n", node.index);
    std::string label = absl::StrCat(DotEscape(QualifiedOpName(node.domain, node.op_type)), "\\n",
                                     DotEscape(node.name));
    for (const ValueRow& out : node.outputs) {
      absl::StrAppend(&label, "\\n", TypeString(out.dtype, out.shape));
      if (!out.name.empty()) source_of[out.name] = id;
    }
    const bool is_cast = node.op_type == "Cast" && node.domain.empty();
    absl::StrAppend(&dot, "  ", id, " [shape=box, ");
    if (is_cast) {
      // Casts castor inserted get a double border; model Casts a single one.
      absl::StrAppend(&dot, "style=\"filled,bold\", color=\"", kCastBorderColor,
                      "\", fillcolor=\"", kCastFillColor, "\"",
                      node.inserted_cast.empty() ? "" : ", peripheries=2");
    } else {
      absl::StrAppend(&dot, "fillcolor=\"", DTypeFillColor(node.compute_dtype), "\"");
    }
    if (!node.autocast_why.empty()) {
      absl::StrAppend(&dot, ", tooltip=\"", DotEscape(node.autocast_why), "\"");
    }
    absl::StrAppend(&dot, ", label=\"", label, "\"];\n");
  }

  absl::StrAppend(&dot, "  // initializers, grouped per consuming node\n");
  for (const NodeRow& node : report.nodes) {
    std::string label;
    for (const ValueRow& in : node.inputs) {
      if (!in.present || source_of.count(in.name)) continue;  // not an initializer
      absl::StrAppend(&label, DotEscape(in.name), " ", TypeString(in.dtype, in.shape), "\\l");
    }
    if (label.empty()) continue;
    absl::StrAppend(&dot, "  w", node.index,
                    " [shape=note, fontsize=8, fillcolor=\"#ffffff\", label=\"", label, "\"];\n",
                    "  w", node.index, " -> n", node.index,
                    " [style=dashed, arrowsize=0.5, color=\"#969696\"];\n");
  }

  absl::StrAppend(&dot, "  // graph outputs\n");
  for (size_t k = 0; k < report.outputs.size(); ++k) {
    const ValueRow& output = report.outputs[k];
    absl::StrAppend(&dot, "  o", k, " [shape=house, fillcolor=\"", DTypeFillColor(output.dtype),
                    "\", label=\"", DotEscape(output.name), "\\n",
                    TypeString(output.dtype, output.shape), "\"];\n");
  }

  absl::StrAppend(&dot, "  // values\n");
  auto edge = [&dot](const std::string& from, const std::string& to, const ValueRow& value) {
    absl::StrAppend(&dot, "  ", from, " -> ", to, " [label=\"",
                    TypeString(value.dtype, value.shape), "\", tooltip=\"",
                    DotEscape(value.name), "\", color=\"", DTypeEdgeColor(value.dtype),
                    "\"];\n");
  };
  for (const NodeRow& node : report.nodes) {
    for (const ValueRow& in : node.inputs) {
      if (!in.present) continue;
      auto source = source_of.find(in.name);
      if (source != source_of.end()) edge(source->second, absl::StrCat("n", node.index), in);
    }
  }
  for (size_t k = 0; k < report.outputs.size(); ++k) {
    auto source = source_of.find(report.outputs[k].name);
    if (source != source_of.end()) edge(source->second, absl::StrCat("o", k), report.outputs[k]);
  }
  absl::StrAppend(&dot, "}\n");
  return dot;
}

namespace {

// Where a node input comes from, for --why.
std::string SourceText(const Value& value) {
  if (value.initializer() && !value.is_graph_input()) return "weight (float32 initializer)";
  if (value.is_graph_input()) return "graph input";
  const Node* producer = value.producer();
  if (!producer) return "no producer";
  std::string text = absl::StrCat("output of ", producer->op_type(), " '", producer->name(), "'");
  const AutocastRecord record = ReadAutocastRecord(*producer);
  if (!record.inserted_cast.empty()) {
    absl::StrAppend(&text, ", a Cast castor inserted (of ",
                    record.inserted_cast == "activation" ? "an " : "a ", record.inserted_cast,
                    ")");
  }
  return text;
}

}  // namespace

absl::StatusOr<std::string> ExplainNode(const Model& model, const std::string& node_name) {
  const Node* node = nullptr;
  std::vector<std::string> names;
  for (const Node* candidate : model.graph->nodes()) {
    if (candidate->name() == node_name) node = candidate;
    names.push_back(candidate->name());
  }
  if (!node) {
    std::string message = absl::StrCat("--why: no node named '", node_name, "'");
    if (std::string close = ClosestMatch(node_name, names); !close.empty()) {
      absl::StrAppend(&message, " (did you mean '", close, "'?)");
    }
    absl::StrAppend(&message, "; 'castor inspect MODEL' lists the node names");
    return absl::NotFoundError(message);
  }
  const AutocastRecord record = ReadAutocastRecord(*node);
  const std::string* policy = model.FindMetadata(kPolicyNameKey);
  const std::string* digest = model.FindMetadata(kPolicyDigestKey);
  std::string why = record.why;
  if (why.empty() && !policy) {
    why = "no autocast record: the model was not converted by 'castor convert' (no "
          "castor.policy in its metadata_props); the dtype shown is that of the node's first "
          "floating-point input (or first output)";
  } else if (why.empty()) {
    why = "untouched by autocast: the node does no floating-point computation (op list "
          "'none', e.g. Shape, or no float inputs or outputs), or is a Cast from the model";
  }
  std::vector<std::vector<std::string>> rows = {
      {"node", node->name()},
      {"op", absl::StrCat(QualifiedOpName(node->domain(), node->op_type()), " (opset ",
                          model.OpsetVersion(node->domain()), ")")},
      {"dtype", DTypeName(ComputeDType(*node))},
      {"why", why},
      {"policy", policy ? absl::StrCat(*policy, " (", digest ? *digest : "no digest", ")")
                        : "none recorded"}};
  for (int i = 0; i < node->num_inputs(); ++i) {
    const Value* in = node->input(i);
    rows.push_back({i == 0 ? "inputs" : "",
                    in ? absl::StrCat(i, ": ", in->name(), " ", TypeString(in->dtype(), in->shape()),
                                      "  ", SourceText(*in))
                       : absl::StrCat(i, ": (omitted)")});
  }
  for (int i = 0; i < node->num_outputs(); ++i) {
    const Value* out = node->output(i);
    rows.push_back({i == 0 ? "outputs" : "",
                    absl::StrCat(i, ": ", out->name(), " ", TypeString(out->dtype(), out->shape()),
                                 out->is_graph_output() ? "  graph output" : "")});
  }
  return RenderTable(rows, 0);
}

absl::StatusOr<std::string> InspectModel(const InspectOptions& options) {
  absl::StatusOr<Model> model = LoadAndCheckModel(options.model_path);
  if (!model.ok()) return model.status();
  std::string canonicalized;  // what the canonicalize pass did, for the text report
  if (options.canonicalize) {
    PassManager manager;
    AddImportPasses(manager);
    PassContext context;
    if (absl::Status s = manager.Run(*model, context); !s.ok()) {
      return NameFile(s, options.model_path);
    }
    if (context.notes.empty()) canonicalized = "note: canonicalize: nothing to change\n";
    for (const std::string& note : context.notes) absl::StrAppend(&canonicalized, "note: ", note, "\n");
  }
  if (!options.why_node.empty()) {
    absl::StatusOr<std::string> explained = ExplainNode(*model, options.why_node);
    if (!explained.ok()) return NameFile(explained.status(), options.model_path);
    return explained;
  }
  const InspectReport report = BuildInspectReport(*model, options.model_path);
  if (options.format == "json") return RenderInspectJson(report);
  if (options.format == "dot") return RenderInspectDot(report);
  return RenderInspectText(report) + canonicalized;
}

int RunInspect(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  InspectOptions options;
  ArgParser parser(
      "castor inspect",
      "Loads MODEL, checks it (opset range, supported ops, type inference, graph verifier)\n"
      "and shows its graph: a header, every node with its compute dtype, inputs, typed\n"
      "outputs and attributes, the graph inputs and outputs, the initializers, and a\n"
      "summary (op histogram, parameters and bytes per dtype). On a model written by\n"
      "'castor convert' it shows the recorded policy, each node's autocast dtype, and marks\n"
      "the Casts castor inserted with '+'.");
  parser.AddPositional("MODEL", "the ONNX model file", &options.model_path)
      .AddEnum("format", {"text", "json", "dot"},
               "text: aligned tables; json: one JSON document; dot: a Graphviz digraph",
               &options.format)
      .AddString("output", "FILE", "write the report to FILE (atomically) instead of stdout",
                 &options.output_path)
      .AddString("why", "NODE",
                 "explain the dtype of node NODE: the autocast rule and list entry behind it, "
                 "its inputs and where they come from",
                 &options.why_node)
      .AddSwitch("canonicalize",
                 "show the graph after the canonicalize pass, the one convert and train start "
                 "from (no-op Casts and Identity nodes folded, nodes nobody reads removed, "
                 "LSTM/GRU/RNN unrolled into primitive ops), and what it changed",
                 &options.canonicalize)
      .AddExample("castor inspect models/cnn_opset13.onnx")
      .AddExample("castor inspect cnn_fp16.onnx --why /fc2/Gemm")
      .AddExample("castor inspect model.onnx --format dot --output model.dot && dot -Tsvg "
                  "model.dot -o model.svg");

  const Command command(parser, out, err);
  if (std::optional<int> done = command.Parse(args)) return *done;
  absl::StatusOr<std::string> report = InspectModel(options);
  if (!report.ok()) return command.Fail(kExitBadInput, report.status());
  if (options.output_path.empty()) {
    out << *report;
    return kExitOk;
  }
  if (absl::Status s = WriteFileAtomically(options.output_path, *report); !s.ok()) {
    return command.Fail(kExitBadInput, absl::StrCat("cannot write --output ",
                                                    options.output_path, ": ", s.message()));
  }
  return kExitOk;
}

}  // namespace castor::tools
