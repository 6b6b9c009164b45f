#include "core/failpoint.h"

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/logging.h"

namespace eps {

StatusOr<Failpoints> ParseFailpoints(absl::string_view spec) {
  Failpoints failpoints;
  if (absl::StripAsciiWhitespace(spec).empty()) return failpoints;
  for (absl::string_view entry : absl::StrSplit(spec, ',')) {
    const std::pair<absl::string_view, absl::string_view> parts =
        absl::StrSplit(entry, absl::MaxSplits('=', 1));
    const absl::string_view name = absl::StripAsciiWhitespace(parts.first);
    const absl::string_view value_text = absl::StripAsciiWhitespace(parts.second);
    if (name.empty() || entry.find('=') == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("failpoint entry '", entry, "' is not name=value (in '", spec, "')"));
    }
    uint64_t value = 0;
    // SimpleAtoi accepts a sign; a failpoint value is a plain unsigned number.
    if (value_text.empty() || value_text[0] == '-' || value_text[0] == '+' ||
        !absl::SimpleAtoi(value_text, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("failpoint ", name, ": value '", value_text,
                                                     "' is not an unsigned number"));
    }
    if (!failpoints.emplace(std::string(name), value).second) {
      return absl::InvalidArgumentError(absl::StrCat("failpoint ", name, " is given twice"));
    }
  }
  return failpoints;
}

std::optional<uint64_t> FailpointValue(absl::string_view name) {
  // Read once: the environment of a running process is not ours to watch.
  static const Failpoints* const armed = [] {
    const char* spec = std::getenv("EPS_FAILPOINTS");
    StatusOr<Failpoints> parsed = ParseFailpoints(spec == nullptr ? "" : spec);
    if (!parsed.ok()) {
      LOG(ERROR) << "EPS_FAILPOINTS ignored: " << parsed.status().message();
      return new Failpoints();
    }
    if (!parsed->empty()) LOG(WARNING) << "EPS_FAILPOINTS arms test failpoints: " << spec;
    return new Failpoints(*std::move(parsed));
  }();
  const auto it = armed->find(name);
  if (it == armed->end()) return std::nullopt;
  return it->second;
}

bool FailpointArmed(absl::string_view name, uint64_t value) {
  return FailpointValue(name) == value;
}

}  // namespace eps
