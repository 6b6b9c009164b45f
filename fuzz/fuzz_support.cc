// LLVMFuzzerInitialize for every fuzz target (libFuzzer, and
// standalone_main.cc, call it once before the first input): eps's log is
// kept quiet but for fatal lines (a failed CHECK still says why), and
// protobuf's too (it logs every string field that is not UTF-8); lines
// about bad input would otherwise cost more than the input.
//
// Thread-safety: called once, before the first input.

#include "core/logging.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  eps::SetLogNode("fuzz");  // makes the logger, so that spdlog knows it
  if (auto logger = spdlog::get("eps")) logger->set_level(spdlog::level::critical);
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}
