// Status and StatusOr: the error type of every boundary in eps.
//
// eps does not throw. Anything that can fail for outside reasons (network,
// disk, peers, configuration) returns Status or StatusOr<T>; bugs CHECK-fail
// (core/logging.h). Canonical codes are chosen deliberately:
//   kInvalidArgument     the caller sent something malformed; don't retry
//   kUnavailable         retry the call (peer down, queue full)
//   kDeadlineExceeded    no answer in time (after the allowed retries)
//   kFailedPrecondition  don't retry until the state changes
//   kNotFound            the named thing (file, table) does not exist
//   kDataLoss            a corrupt checkpoint or file
// Status values are immutable and safe for concurrent reads.

#ifndef EPS_CORE_STATUS_H_
#define EPS_CORE_STATUS_H_

#include "absl/strings/string_view.h"
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace eps {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

// Returns `status` with "context: " put in front of its message, same code.
// An OK status stays OK.
Status Annotate(const Status& status, absl::string_view context);

}  // namespace eps

#define EPS_STATUS_CONCAT_INNER_(a, b) a##b
#define EPS_STATUS_CONCAT_(a, b) EPS_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::eps::Status eps_status_ = (expr);                \
    if (!eps_status_.ok()) return eps_status_;         \
  } while (false)

// Like RETURN_IF_ERROR, adding "context: " to the message.
#define RETURN_IF_ERROR_CTX(expr, context)                                \
  do {                                                                    \
    ::eps::Status eps_status_ = (expr);                                   \
    if (!eps_status_.ok()) return ::eps::Annotate(eps_status_, context);  \
  } while (false)

// `ASSIGN_OR_RETURN(auto x, Foo());` declares x from a StatusOr, or returns
// its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  EPS_ASSIGN_OR_RETURN_IMPL_(EPS_STATUS_CONCAT_(eps_statusor_, __LINE__), lhs, expr)
#define EPS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#endif  // EPS_CORE_STATUS_H_
