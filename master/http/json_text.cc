#include "master/http/json_text.h"

namespace eps {

// nlohmann::json throws on invalid UTF-8 unless told to replace it.
std::string DumpJson(const nlohmann::json& doc, int indent) {
  return doc.dump(indent, /*indent_char=*/' ', /*ensure_ascii=*/false,
                  nlohmann::json::error_handler_t::replace);
}

}  // namespace eps
