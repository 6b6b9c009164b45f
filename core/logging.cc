#include "core/logging.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace eps {
namespace {

std::atomic<int> g_verbosity{0};

// The logger writes to stderr; its pattern carries the node name, which
// changes once at startup (after registration assigns an id).
class Logger {
 public:
  Logger() : logger_(spdlog::stderr_logger_mt("eps")) {
    logger_->set_level(spdlog::level::info);
    logger_->flush_on(spdlog::level::info);
    SetNode("eps");
  }

  void SetNode(std::string_view node) {
    absl::MutexLock lock(&mu_);
    logger_->set_pattern(std::string("%Y-%m-%d %H:%M:%S.%e ") + std::string(node) +
                         " %L %v");
  }

  spdlog::logger& get() { return *logger_; }

 private:
  absl::Mutex mu_;
  std::shared_ptr<spdlog::logger> logger_;
};

Logger& GetLogger() {
  static Logger* logger = new Logger();  // never destroyed: logs may outlive main
  return *logger;
}

const char* BaseName(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

void SetLogNode(std::string_view node) { GetLogger().SetNode(node); }
void SetLogVerbosity(int level) { g_verbosity.store(level, std::memory_order_relaxed); }
int LogVerbosity() { return g_verbosity.load(std::memory_order_relaxed); }

namespace internal {

LogMessage::LogMessage(const char* file, int line, LogSeverity severity)
    : file_(file), line_(line), severity_(severity) {}

LogMessage::~LogMessage() {
  spdlog::level::level_enum level = spdlog::level::info;
  switch (severity_) {
    case LogSeverity::kInfo: level = spdlog::level::info; break;
    case LogSeverity::kWarning: level = spdlog::level::warn; break;
    case LogSeverity::kError: level = spdlog::level::err; break;
    case LogSeverity::kFatal: level = spdlog::level::critical; break;
  }
  if (severity_ == LogSeverity::kInfo) {
    GetLogger().get().log(level, "{}", stream_.str());
  } else {
    GetLogger().get().log(level, "{}:{}] {}", BaseName(file_), line_, stream_.str());
  }
  if (severity_ == LogSeverity::kFatal) {
    GetLogger().get().flush();
    std::abort();
  }
}

}  // namespace internal
}  // namespace eps
