#pragma once

// Abseil 20220623 (Debian) has no status macros; these are the house ones.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define RLMESH_STATUS_CONCAT_INNER_(a, b) a##b
#define RLMESH_STATUS_CONCAT_(a, b) RLMESH_STATUS_CONCAT_INNER_(a, b)

// Returns `expr` from the enclosing function if it is not OK.
#define RLMESH_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::absl::Status rlmesh_status_ = (expr);           \
    if (!rlmesh_status_.ok()) return rlmesh_status_;  \
  } while (0)

// `RLMESH_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from the value of a
// StatusOr, or returns its error status.
#define RLMESH_ASSIGN_OR_RETURN(lhs, rexpr) \
  RLMESH_ASSIGN_OR_RETURN_IMPL_(            \
      RLMESH_STATUS_CONCAT_(rlmesh_statusor_, __LINE__), lhs, rexpr)

#define RLMESH_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()
