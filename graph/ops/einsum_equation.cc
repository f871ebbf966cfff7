// Parsing of Einsum's equation (see einsum_equation.h).
#include "graph/ops/einsum_equation.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"

namespace castor {
namespace {

int LabelOfLetter(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return 26 + (c - 'a');
  return -2;
}

// One term ("bij", "...ii") of the equation; `what` names it in errors.
absl::StatusOr<std::vector<int>> ParseTerm(const std::string& text, const std::string& what) {
  std::vector<int> term;
  bool has_ellipsis = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.') {
      if (text.compare(i, 3, "...") != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " '", text, "' has a '.' that is not part of \"...\""));
      }
      if (has_ellipsis) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " '", text, "' has \"...\" more than once"));
      }
      has_ellipsis = true;
      term.push_back(kEinsumEllipsis);
      i += 2;
      continue;
    }
    const int label = LabelOfLetter(c);
    if (label < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " '", text, "' has the character '", std::string(1, c),
          "'; subscripts are letters a-z, A-Z and \"...\""));
    }
    term.push_back(label);
  }
  return term;
}

}  // namespace

std::string EinsumLabelText(int label) {
  if (label == kEinsumEllipsis) return "...";
  if (label < 0 || label >= kEinsumLetters) return absl::StrCat("<", label, ">");
  return std::string(1, label < 26 ? static_cast<char>('A' + label)
                                   : static_cast<char>('a' + label - 26));
}

std::string EinsumTermText(const std::vector<int>& term) {
  std::string text;
  for (int label : term) text += EinsumLabelText(label);
  return text;
}

absl::StatusOr<EinsumEquation> ParseEinsumEquation(const std::string& equation, int num_inputs) {
  std::string text;
  for (char c : equation) {
    if (c != ' ') text.push_back(c);
  }
  const size_t arrow = text.find("->");
  if (arrow != std::string::npos && text.find("->", arrow + 2) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("equation '", equation, "' has \"->\" more than once"));
  }
  const std::string left = text.substr(0, arrow);
  EinsumEquation parsed;
  parsed.explicit_output = arrow != std::string::npos;
  size_t start = 0;
  while (true) {
    const size_t comma = left.find(',', start);
    const std::string term_text = left.substr(start, comma == std::string::npos
                                                         ? std::string::npos
                                                         : comma - start);
    const std::string what = absl::StrCat("equation '", equation, "': input term ",
                                          parsed.inputs.size());
    auto term = ParseTerm(term_text, what);
    if (!term.ok()) return term.status();
    parsed.inputs.push_back(*std::move(term));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<int>(parsed.inputs.size()) != num_inputs) {
    return absl::InvalidArgumentError(absl::StrCat("equation '", equation, "' has ",
                                                   parsed.inputs.size(), " input term(s) for ",
                                                   num_inputs, " input(s)"));
  }
  bool any_ellipsis = false;
  std::array<int, kEinsumLetters> count{};
  for (const std::vector<int>& term : parsed.inputs) {
    for (int label : term) {
      if (label == kEinsumEllipsis) {
        any_ellipsis = true;
      } else {
        ++count[label];
      }
    }
  }
  if (parsed.explicit_output) {
    const std::string right = text.substr(arrow + 2);
    if (right.find(',') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("equation '", equation, "' has more than one output term"));
    }
    auto output = ParseTerm(right, absl::StrCat("equation '", equation, "': output term"));
    if (!output.ok()) return output.status();
    std::array<bool, kEinsumLetters> seen{};
    for (int label : *output) {
      if (label == kEinsumEllipsis) {
        if (!any_ellipsis) {
          return absl::InvalidArgumentError(absl::StrCat(
              "equation '", equation, "': the output has \"...\" but no input has"));
        }
        continue;
      }
      if (count[label] == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("equation '", equation, "': output subscript '",
                         EinsumLabelText(label), "' appears in no input"));
      }
      if (seen[label]) {
        return absl::InvalidArgumentError(
            absl::StrCat("equation '", equation, "': output subscript '",
                         EinsumLabelText(label), "' appears more than once"));
      }
      seen[label] = true;
    }
    parsed.output = *std::move(output);
  } else {
    if (any_ellipsis) parsed.output.push_back(kEinsumEllipsis);
    for (int label = 0; label < kEinsumLetters; ++label) {
      if (count[label] == 1) parsed.output.push_back(label);
    }
  }
  return parsed;
}

absl::StatusOr<EinsumAxes> ResolveEinsumAxes(const EinsumEquation& equation,
                                             const std::vector<int64_t>& input_ranks) {
  EinsumAxes axes;
  std::vector<int64_t> ellipsis_ranks(equation.inputs.size(), 0);
  for (size_t i = 0; i < equation.inputs.size(); ++i) {
    const std::vector<int>& term = equation.inputs[i];
    const bool has_ellipsis =
        std::find(term.begin(), term.end(), kEinsumEllipsis) != term.end();
    const int64_t letters = static_cast<int64_t>(term.size()) - (has_ellipsis ? 1 : 0);
    const int64_t rank = input_ranks[i];
    if (has_ellipsis ? rank < letters : rank != letters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", i, " has rank ", rank, " but its subscripts '", EinsumTermText(term),
          "' name ", has_ellipsis ? "at least " : "", letters, " axes"));
    }
    ellipsis_ranks[i] = rank - letters;
    axes.ellipsis_rank = std::max<int>(axes.ellipsis_rank, static_cast<int>(rank - letters));
  }
  auto spell_out = [&](const std::vector<int>& term, int64_t ellipsis_rank) {
    std::vector<int> labels;
    for (int label : term) {
      if (label != kEinsumEllipsis) {
        labels.push_back(label);
        continue;
      }
      for (int64_t j = axes.ellipsis_rank - ellipsis_rank; j < axes.ellipsis_rank; ++j) {
        labels.push_back(kEinsumLetters + static_cast<int>(j));
      }
    }
    return labels;
  };
  for (size_t i = 0; i < equation.inputs.size(); ++i) {
    axes.inputs.push_back(spell_out(equation.inputs[i], ellipsis_ranks[i]));
  }
  axes.output = spell_out(equation.output, axes.ellipsis_rank);
  return axes;
}

}  // namespace castor
