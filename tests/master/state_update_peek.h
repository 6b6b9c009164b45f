// PeekUpdate: what a StateUpdate would write (keys put, keys deleted, the
// pass cleared), for tests of the units that fill one.
//
// Thread-safety: functions of their argument.

#ifndef EPS_TESTS_MASTER_STATE_UPDATE_PEEK_H_
#define EPS_TESTS_MASTER_STATE_UPDATE_PEEK_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "master/state_store.h"

namespace eps {

struct PeekedUpdate {
  bool clear_pass = false;
  // Keys put, in order (a key put twice appears twice).
  std::vector<std::string> put_keys;
  // The last value put under each key.
  std::map<std::string, std::string> values;
  std::vector<std::string> deleted_keys;

  int Puts(const std::string& key) const {
    int n = 0;
    for (const std::string& put : put_keys) n += put == key;
    return n;
  }
};

inline PeekedUpdate PeekUpdate(const StateUpdate& update) {
  PeekedUpdate peeked;
  peeked.clear_pass = update.clears_pass_for_testing();
  for (const auto& [key, value] : update.puts_for_testing()) {
    peeked.put_keys.push_back(key);
    peeked.values[key] = value;
  }
  peeked.deleted_keys = update.deletes_for_testing();
  return peeked;
}

// The keys master/state_store.cc writes (fixed-width hex ids).
inline std::string ShardKey(uint64_t id) {
  return absl::StrCat("pass/shard/", absl::Hex(id, absl::kZeroPad16));
}
inline std::string CheckpointKey(uint64_t id) {
  return absl::StrCat("checkpoint/", absl::Hex(id, absl::kZeroPad16));
}
inline constexpr char kMasterKey[] = "master";
inline constexpr char kTrainKey[] = "data/train";
inline constexpr char kEvalKey[] = "data/eval";

}  // namespace eps

#endif  // EPS_TESTS_MASTER_STATE_UPDATE_PEEK_H_
