// Status helpers shared by every castor library: early-return macros over
// absl::Status / absl::StatusOr, so error paths read as one line each.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CASTOR_CONCAT_INNER_(a, b) a##b
#define CASTOR_CONCAT_(a, b) CASTOR_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define CASTOR_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::absl::Status castor_status_ = (expr);           \
    if (!castor_status_.ok()) return castor_status_;  \
  } while (0)

// `lhs = value of expr` or return its error. `lhs` may declare a variable:
//   CASTOR_ASSIGN_OR_RETURN(Model model, LoadModel(path));
#define CASTOR_ASSIGN_OR_RETURN(lhs, expr) \
  CASTOR_ASSIGN_OR_RETURN_IMPL_(CASTOR_CONCAT_(castor_statusor_, __LINE__), lhs, expr)

#define CASTOR_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
