// RecordingEvents: an EventSink that keeps every event in memory, so tests
// of the master's units can assert what they reported.
//
// Thread-safety: not thread-safe (the units it serves are one thread only).

#ifndef EPS_TESTS_TESTING_RECORDING_EVENTS_H_
#define EPS_TESTS_TESTING_RECORDING_EVENTS_H_

#include <string>
#include <utility>
#include <vector>

#include "master/event_log.h"
#include "nlohmann/json.hpp"

namespace eps {

class RecordingEvents : public EventSink {
 public:
  struct Event {
    std::string name;
    nlohmann::json fields;
  };

  void Record(const std::string& event,
              nlohmann::json fields = nlohmann::json::object()) override {
    events_.push_back(Event{event, std::move(fields)});
  }

  const std::vector<Event>& events() const { return events_; }
  // The fields of every event called `name`, oldest first.
  std::vector<nlohmann::json> Named(const std::string& name) const {
    std::vector<nlohmann::json> named;
    for (const Event& event : events_) {
      if (event.name == name) named.push_back(event.fields);
    }
    return named;
  }
  size_t Count(const std::string& name) const { return Named(name).size(); }
  void Clear() { events_.clear(); }

 private:
  std::vector<Event> events_;
};

}  // namespace eps

#endif  // EPS_TESTS_TESTING_RECORDING_EVENTS_H_
