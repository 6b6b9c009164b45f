// JSON as text for what the master writes: its HTTP port's answers
// (/status, errors) and its event log's lines.
//
// Thread-safety: a pure function.

#ifndef EPS_MASTER_HTTP_JSON_TEXT_H_
#define EPS_MASTER_HTTP_JSON_TEXT_H_

#include <string>

#include "nlohmann/json.hpp"

namespace eps {

// `doc` as text, indented by `indent` (-1: on one line). Strings from
// outside (the job name, file paths, error messages naming them) need not
// be UTF-8: invalid bytes are replaced (U+FFFD) instead of throwing.
std::string DumpJson(const nlohmann::json& doc, int indent = 2);

}  // namespace eps

#endif  // EPS_MASTER_HTTP_JSON_TEXT_H_
