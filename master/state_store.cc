#include "master/state_store.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/logging.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

namespace eps {
namespace {

constexpr char kMasterKey[] = "master";
constexpr char kTrainKey[] = "data/train";
constexpr char kEvalKey[] = "data/eval";
constexpr char kShardPrefix[] = "pass/shard/";
constexpr char kEvalPrefix[] = "eval/";
constexpr char kCheckpointPrefix[] = "checkpoint/";

// Fixed-width hex keeps keys in numeric order.
std::string Hex(uint64_t value) { return absl::StrCat(absl::Hex(value, absl::kZeroPad16)); }

bool ParseHex(absl::string_view text, uint64_t* out) {
  return text.size() == 16 && absl::SimpleHexAtoi(text, out);
}

}  // namespace

void StateUpdate::PutMaster(const proto::MasterRecord& record) {
  puts_.emplace_back(kMasterKey, record.SerializeAsString());
}

void StateUpdate::PutDataSet(bool eval, const proto::DataSetRecord& record) {
  puts_.emplace_back(eval ? kEvalKey : kTrainKey, record.SerializeAsString());
}

void StateUpdate::PutShard(uint64_t id, const proto::ShardRecord& record) {
  puts_.emplace_back(absl::StrCat(kShardPrefix, Hex(id)), record.SerializeAsString());
}

void StateUpdate::PutEvalResult(uint64_t shard, uint64_t begin, const std::vector<float>& labels,
                                const std::vector<float>& predictions) {
  // Load splits the value in two halves: unequal ones would read back wrong.
  CHECK_EQ(labels.size(), predictions.size());
  std::string value(sizeof(float) * (labels.size() + predictions.size()), '\0');
  // An empty vector's data() may be null, which memcpy must never get.
  if (!labels.empty()) {
    std::memcpy(value.data(), labels.data(), sizeof(float) * labels.size());
    std::memcpy(value.data() + sizeof(float) * labels.size(), predictions.data(),
                sizeof(float) * predictions.size());
  }
  puts_.emplace_back(absl::StrCat(kEvalPrefix, Hex(shard), "/", Hex(begin)), std::move(value));
}

void StateUpdate::PutCheckpoint(const proto::CheckpointRecord& record) {
  puts_.emplace_back(absl::StrCat(kCheckpointPrefix, Hex(record.id())), record.SerializeAsString());
}

void StateUpdate::DeleteCheckpoint(uint64_t id) {
  deletes_.push_back(absl::StrCat(kCheckpointPrefix, Hex(id)));
}

void StateUpdate::Append(StateUpdate&& other) {
  if (other.clear_pass_) {
    // Write applies a clear before every put, so this one's puts of the
    // pass would survive the clear that follows them.
    std::erase_if(puts_, [](const std::pair<std::string, std::string>& put) {
      return absl::StartsWith(put.first, kShardPrefix) || absl::StartsWith(put.first, kEvalPrefix);
    });
    clear_pass_ = true;
  }
  for (auto& put : other.puts_) puts_.push_back(std::move(put));
  for (auto& key : other.deletes_) deletes_.push_back(std::move(key));
  other.puts_.clear();
  other.deletes_.clear();
  other.clear_pass_ = false;
}

StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& dir) {
  rocksdb::Options options;
  options.create_if_missing = true;
  // The master's state is small: keep RocksDB's footprint small too.
  options.max_background_jobs = 1;
  options.write_buffer_size = 1 << 20;
  options.keep_log_file_num = 2;
  rocksdb::DB* db = nullptr;
  rocksdb::Status status = rocksdb::DB::Open(options, dir, &db);
  if (!status.ok()) {
    const std::string message =
        absl::StrCat("cannot open the master's state in ", dir, ": ", status.ToString());
    if (status.IsCorruption()) return absl::DataLossError(message);
    return absl::UnavailableError(message);
  }
  return std::unique_ptr<StateStore>(new StateStore(db));
}

StateStore::StateStore(rocksdb::DB* db) : db_(db) {}
StateStore::~StateStore() = default;

Status ParseStateRecord(const absl::string_view full_key, absl::string_view value,
                        MasterSnapshot* snapshot) {
  absl::string_view key = full_key;
  const auto parse = [&value](google::protobuf::MessageLite* record) {
    return record->ParseFromArray(value.data(), static_cast<int>(value.size()));
  };
  bool parsed = true;
  uint64_t id = 0;
  if (key == kMasterKey) {
    parsed = parse(&snapshot->master);
  } else if (key == kTrainKey || key == kEvalKey) {
    parsed = parse(key == kTrainKey ? &snapshot->train : &snapshot->eval);
  } else if (absl::ConsumePrefix(&key, kShardPrefix)) {
    parsed = ParseHex(key, &id) && parse(&snapshot->shards[id]);
  } else if (absl::ConsumePrefix(&key, kCheckpointPrefix)) {
    parsed = ParseHex(key, &id) && parse(&snapshot->checkpoints[id]);
  } else if (absl::ConsumePrefix(&key, kEvalPrefix)) {
    std::vector<absl::string_view> parts = absl::StrSplit(key, '/');
    uint64_t begin = 0;
    parsed = parts.size() == 2 && ParseHex(parts[0], &id) && ParseHex(parts[1], &begin) &&
             value.size() % (2 * sizeof(float)) == 0;
    if (parsed) {
      // An empty commit (n = 0) has null data(), which memcpy must never get.
      const size_t n = value.size() / (2 * sizeof(float));
      auto& [labels, predictions] = snapshot->eval_results[{id, begin}];
      labels.resize(n);
      predictions.resize(n);
      if (n > 0) {
        std::memcpy(labels.data(), value.data(), n * sizeof(float));
        std::memcpy(predictions.data(), value.data() + n * sizeof(float), n * sizeof(float));
      }
    }
  }
  if (!parsed) return absl::DataLossError(absl::StrCat("record ", full_key, " does not parse"));
  return absl::OkStatus();
}

StatusOr<std::optional<MasterSnapshot>> StateStore::Load() const {
  std::string value;
  rocksdb::Status status = db_->Get(rocksdb::ReadOptions(), kMasterKey, &value);
  if (status.IsNotFound()) return std::optional<MasterSnapshot>();
  if (!status.ok()) return absl::UnavailableError(status.ToString());
  MasterSnapshot snapshot;
  if (!snapshot.master.ParseFromString(value)) {
    return absl::DataLossError("the master record does not parse");
  }
  for (const char* key : {kTrainKey, kEvalKey}) {
    status = db_->Get(rocksdb::ReadOptions(), key, &value);
    if (status.IsNotFound()) continue;
    if (!status.ok()) return absl::UnavailableError(status.ToString());
    RETURN_IF_ERROR(ParseStateRecord(key, value, &snapshot));
  }
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (const char* prefix : {kShardPrefix, kEvalPrefix, kCheckpointPrefix}) {
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      RETURN_IF_ERROR(ParseStateRecord(absl::string_view(it->key().data(), it->key().size()),
                                       absl::string_view(it->value().data(), it->value().size()),
                                       &snapshot));
    }
  }
  if (!it->status().ok()) return absl::UnavailableError(it->status().ToString());
  return std::optional<MasterSnapshot>(std::move(snapshot));
}

Status StateStore::Write(const StateUpdate& update) {
  rocksdb::WriteBatch batch;
  if (update.clear_pass_) {
    batch.DeleteRange(kShardPrefix, "pass/shard0");  // '0' follows '/'
    batch.DeleteRange(kEvalPrefix, "eval0");
  }
  for (const auto& [key, value] : update.puts_) batch.Put(key, value);
  for (const std::string& key : update.deletes_) batch.Delete(key);
  rocksdb::WriteOptions options;
  // The WAL survives a killed process; fsync per commit would only add
  // protection against a machine crash, at a large cost.
  options.sync = false;
  rocksdb::Status status = db_->Write(options, &batch);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("writing the master's state: ", status.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace eps
