// Small status helpers: Abseil 20220623 (Debian 12) ships no RETURN_IF_ERROR / ASSIGN_OR_RETURN.
// Used everywhere inside krause-serve; errors cross the gRPC boundary in exactly one place.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define KRAUSE_CONCAT_INNER_(a, b) a##b
#define KRAUSE_CONCAT_(a, b) KRAUSE_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status krause_status_ = (expr);          \
    if (!krause_status_.ok()) return krause_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F());` assigns the value of a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL_(KRAUSE_CONCAT_(krause_statusor_, __LINE__), lhs, rexpr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                           \
  if (!tmp.ok()) return tmp.status();           \
  lhs = std::move(tmp).value()

namespace krause {

// `status` with its message prefixed by `context` ("model m: ..."), its code kept.
inline absl::Status WithContext(absl::string_view context, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace krause
