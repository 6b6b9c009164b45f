// The logging facade: LOG(severity), VLOG(level), CHECK(cond), over spdlog.
//
//   LOG(INFO) << "registered " << name;
//   VLOG(1) << "membership change";      // printed when verbosity >= 1
//   CHECK(offset <= end) << "shard " << id;
//
// Every line carries the process's node name ("master", "ps[3]",
// "worker[2]"), set once with SetLogNode. VLOG(1) is for membership events,
// VLOG(2) for per-message traces. LOG(FATAL) and a failed CHECK log and
// abort: they are for broken invariants, never for outside failures (those
// are Status values).
//
// Thread-safety: safe for concurrent use.

#ifndef EPS_CORE_LOGGING_H_
#define EPS_CORE_LOGGING_H_

#include <sstream>
#include <string>
#include <string_view>

namespace eps {

enum class LogSeverity { kInfo, kWarning, kError, kFatal };

// Sets the name every log line starts with. Safe to call at any time.
void SetLogNode(std::string_view node);
// Sets the VLOG verbosity (default 0).
void SetLogVerbosity(int level);
int LogVerbosity();

namespace internal {

// Collects one log line and emits it on destruction.
class LogMessage {
 public:
  LogMessage(const char* file, int line, LogSeverity severity);
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Turns a streamed LogMessage expression into void (for the ternary in
// CHECK/VLOG, which avoids dangling-else surprises).
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace eps

#define EPS_LOG_SEVERITY_INFO ::eps::LogSeverity::kInfo
#define EPS_LOG_SEVERITY_WARNING ::eps::LogSeverity::kWarning
#define EPS_LOG_SEVERITY_ERROR ::eps::LogSeverity::kError
#define EPS_LOG_SEVERITY_FATAL ::eps::LogSeverity::kFatal

#define LOG(severity) \
  ::eps::internal::LogMessage(__FILE__, __LINE__, EPS_LOG_SEVERITY_##severity).stream()

#define VLOG(level)                            \
  (::eps::LogVerbosity() < (level)) ? (void)0 \
                                    : ::eps::internal::LogVoidify() & LOG(INFO)

#define CHECK(condition)                                        \
  (condition) ? (void)0                                         \
              : ::eps::internal::LogVoidify() &                 \
                    LOG(FATAL) << "Check failed: " #condition " "

#define CHECK_OP_(a, b, op) CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define CHECK_EQ(a, b) CHECK_OP_(a, b, ==)
#define CHECK_NE(a, b) CHECK_OP_(a, b, !=)
#define CHECK_LE(a, b) CHECK_OP_(a, b, <=)
#define CHECK_LT(a, b) CHECK_OP_(a, b, <)
#define CHECK_GE(a, b) CHECK_OP_(a, b, >=)
#define CHECK_GT(a, b) CHECK_OP_(a, b, >)
#define CHECK_OK(expr)                                     \
  do {                                                     \
    const auto& eps_check_status_ = (expr);                \
    CHECK(eps_check_status_.ok()) << eps_check_status_;    \
  } while (false)

#endif  // EPS_CORE_LOGGING_H_
