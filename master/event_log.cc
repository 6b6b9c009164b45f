#include "master/event_log.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "master/http/json_text.h"

namespace eps {

EventLog::EventLog(std::string path, const Clock* clock)
    : path_(std::move(path)), clock_(clock) {}

void EventLog::Record(const std::string& event, nlohmann::json fields) {
  nlohmann::json line = {{"time", absl::ToUnixMillis(clock_->Now()) / 1000.0}, {"event", event}};
  for (auto& [key, value] : fields.items()) line[key] = value;
  std::string text = DumpJson(line, /*indent=*/-1);
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(std::move(text));
}

Status EventLog::Flush() {
  absl::MutexLock file_lock(&file_mu_);
  std::vector<std::string> lines;
  {
    absl::MutexLock lock(&queue_mu_);
    lines.swap(queue_);
  }
  if (lines.empty()) return absl::OkStatus();
  std::ofstream out(path_, std::ios::app);
  for (const std::string& line : lines) out << line << '\n';
  out.flush();
  if (!out) {
    const std::string error = std::strerror(errno);
    absl::MutexLock lock(&queue_mu_);
    queue_.insert(queue_.begin(), lines.begin(), lines.end());
    return absl::UnavailableError(absl::StrCat("cannot append to ", path_, ": ", error));
  }
  return absl::OkStatus();
}

}  // namespace eps
