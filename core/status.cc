#include "core/status.h"

namespace eps {

Status Annotate(const Status& status, absl::string_view context) {
  if (status.ok()) return status;
  Status annotated(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view type_url, const absl::Cord& payload) {
    annotated.SetPayload(type_url, payload);
  });
  return annotated;
}

}  // namespace eps
