// What the master's unit tests share: PeekUpdate (what a StateUpdate would
// write: keys put, keys deleted, the pass cleared) and the keys it writes;
// a data set cut by hand (MakeData); the small job they run (TwoServerJob);
// and the requests and records peers send (registrations, node ids,
// commits, checkpoint parts).
//
// Thread-safety: functions of their arguments.

#ifndef EPS_TESTS_MASTER_UNIT_TESTING_H_
#define EPS_TESTS_MASTER_UNIT_TESTING_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/job_config.h"
#include "master/progress/data_set.h"
#include "master/state_store.h"
#include "proto/eps.pb.h"

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

// --- Data ------------------------------------------------------------------------

inline constexpr uint64_t kLineBytes = 10;

// One file of kLineBytes-byte lines cut into shards of `lines[i]` lines.
inline DataSet MakeData(const std::string& file, const std::vector<uint64_t>& lines) {
  DataSet data;
  data.files = {file};
  uint64_t offset = 0;
  uint64_t line = 1;
  for (uint64_t n : lines) {
    data.shards.push_back(ShardSpec{.file = 0,
                                    .begin = offset,
                                    .end = offset + n * kLineBytes,
                                    .first_line = line,
                                    .lines = n});
    offset += n * kLineBytes;
    line += n;
    data.lines += n;
  }
  data.bytes = offset;
  return data;
}

// `lines` lines of the assigned shard from byte `begin`, `malformed` of
// them malformed; each well-formed line's loss is 0.5.
inline proto::CommitProgressRequest CommitOf(const proto::ShardAssignment& shard, uint64_t begin,
                                             uint64_t lines, uint64_t malformed = 0) {
  proto::CommitProgressRequest commit;
  commit.set_shard_id(shard.shard_id());
  commit.set_epoch(shard.epoch());
  commit.set_phase(shard.phase());
  commit.set_begin_offset(begin);
  commit.set_end_offset(begin + lines * kLineBytes);
  commit.set_lines(lines);
  commit.set_malformed(malformed);
  commit.set_loss_sum(0.5 * static_cast<double>(lines - malformed));
  return commit;
}

// --- Members ---------------------------------------------------------------------

inline constexpr int64_t kLeaseMs = 1000;

// A job of two servers with a lease of kLeaseMs; every other option default.
inline JobConfig TwoServerJob() {
  JobConfig job;
  job.ps.num_servers = 2;
  job.master.lease_ms = kLeaseMs;
  return job;
}

inline std::string Endpoint(int port) { return absl::StrCat("tcp://127.0.0.1:", port); }

// A server process `pid` at `port` on ps-host; `stored_slot` when it starts
// on a data directory that names its slot.
inline proto::RegisterServerRequest ServerRequest(
    int port, uint32_t pid, std::optional<uint32_t> stored_slot = std::nullopt) {
  proto::RegisterServerRequest request;
  request.set_endpoint(Endpoint(port));
  request.set_hostname("ps-host");
  request.set_pid(pid);
  if (stored_slot.has_value()) request.set_stored_server_id(*stored_slot);
  return request;
}

// A worker process `pid` on worker-host, on the CPU.
inline proto::RegisterWorkerRequest WorkerRequest(uint32_t pid) {
  proto::RegisterWorkerRequest request;
  request.set_hostname("worker-host");
  request.set_pid(pid);
  request.set_device("cpu");
  return request;
}

inline proto::NodeId Node(proto::Role role, uint32_t id) {
  proto::NodeId node;
  node.set_role(role);
  node.set_id(id);
  return node;
}
inline proto::NodeId WorkerNode(uint32_t id) { return Node(proto::ROLE_WORKER, id); }
inline proto::NodeId ServerNode(uint32_t id) { return Node(proto::ROLE_SERVER, id); }

// Slot `slot`'s part of checkpoint `id`, at /ckpt/ps-SLOT/ID.
inline proto::ServerCheckpoint Part(uint32_t slot, uint64_t id, uint64_t bytes = 0) {
  proto::ServerCheckpoint part;
  part.set_server_id(slot);
  part.set_path(absl::StrCat("/ckpt/ps-", slot, "/", id));
  part.set_bytes(bytes);
  return part;
}

}  // namespace eps

#endif  // EPS_TESTS_MASTER_UNIT_TESTING_H_
