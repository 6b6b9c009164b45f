// StateStore: the master's durable state, in RocksDB under --data-dir.
//
// Keys hold protobuf records (proto/eps.proto, "persisted state"):
//   "master"                 MasterRecord (phase, epoch, membership, ledger)
//   "data/train", "data/eval" DataSetRecord (files and the scan's shards)
//   "pass/shard/<id>"        ShardRecord of the current pass
//   "eval/<shard>/<begin>"   an eval commit's labels then predictions
//   "checkpoint/<id>"        CheckpointRecord of a complete coordinated checkpoint
// Writes go through the WAL and are applied atomically per Write call; the
// master writes before it acknowledges, so a master killed with -9 restarts
// with every commit it acknowledged.
//
// Thread-safety: safe for concurrent use (RocksDB is); callers order their
// writes (Master serialises them).

#ifndef EPS_MASTER_STATE_STORE_H_
#define EPS_MASTER_STATE_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/status.h"
#include "proto/eps.pb.h"

namespace rocksdb {
class DB;
}  // namespace rocksdb

namespace eps {

// Everything a restarted master needs.
struct MasterSnapshot {
  proto::MasterRecord master;
  proto::DataSetRecord train;
  proto::DataSetRecord eval;
  std::map<uint64_t, proto::ShardRecord> shards;  // current pass, by shard id
  // Eval commits: (shard id, begin offset) -> labels, predictions.
  std::map<std::pair<uint64_t, uint64_t>, std::pair<std::vector<float>, std::vector<float>>>
      eval_results;
  // Complete coordinated checkpoints, by id.
  std::map<uint64_t, proto::CheckpointRecord> checkpoints;
};

// Decodes one stored record into `snapshot`, as Load does for every key:
// "master", "data/train", "data/eval", "pass/shard/<hex id>",
// "eval/<hex shard>/<hex begin>" and "checkpoint/<hex id>"; other keys are
// no record of the master's and are ignored. kDataLoss naming the key when
// the key or its value does not parse.
Status ParseStateRecord(absl::string_view key, absl::string_view value, MasterSnapshot* snapshot);

// One atomic update.
class StateUpdate {
 public:
  void PutMaster(const proto::MasterRecord& record);
  void PutDataSet(bool eval, const proto::DataSetRecord& record);
  void PutShard(uint64_t id, const proto::ShardRecord& record);
  // Drops every shard record and eval result (a new pass begins).
  void ClearPass() { clear_pass_ = true; }
  // REQUIRES: labels.size() == predictions.size().
  void PutEvalResult(uint64_t shard, uint64_t begin, const std::vector<float>& labels,
                     const std::vector<float>& predictions);
  void PutCheckpoint(const proto::CheckpointRecord& record);
  void DeleteCheckpoint(uint64_t id);
  bool empty() const { return puts_.empty() && deletes_.empty() && !clear_pass_; }
  // Adds `other`'s changes after this one's: when `other` clears the pass,
  // this one's shard and eval puts are dropped with it.
  void Append(StateUpdate&& other);

  // What Write would do: (key, value) puts in order, deleted keys, and
  // whether the pass is cleared first.
  const std::vector<std::pair<std::string, std::string>>& puts_for_testing() const {
    return puts_;
  }
  const std::vector<std::string>& deletes_for_testing() const { return deletes_; }
  bool clears_pass_for_testing() const { return clear_pass_; }

 private:
  friend class StateStore;
  bool clear_pass_ = false;
  std::vector<std::pair<std::string, std::string>> puts_;
  std::vector<std::string> deletes_;
};

class StateStore {
 public:
  // Opens (creating if missing) the store in `dir`. kUnavailable naming
  // the directory when RocksDB cannot open it (e.g. another master holds
  // its lock), kDataLoss when it is corrupt.
  static StatusOr<std::unique_ptr<StateStore>> Open(const std::string& dir);
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // The saved state, or nullopt when the store is new. kDataLoss when a
  // record does not parse.
  StatusOr<std::optional<MasterSnapshot>> Load() const;

  // Applies `update` atomically, through the WAL. kUnavailable on I/O errors.
  Status Write(const StateUpdate& update);

 private:
  explicit StateStore(rocksdb::DB* db);
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace eps

#endif  // EPS_MASTER_STATE_STORE_H_
