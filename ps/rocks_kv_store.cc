// The RocksDB back end of KvStore (ps/kv_store.h); checkpoint restore is in
// rocks_restore.cc.

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/placement.h"
#include "core/logging.h"
#include "ps/kv_store.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/utilities/checkpoint.h"
#include "rocksdb/write_batch.h"

namespace eps {
namespace {

namespace fs = std::filesystem;

constexpr size_t kKeyBytes = sizeof(uint64_t);
// A key of a table grouped by partition: its partition, then the key.
constexpr size_t kPartitionBytes = sizeof(uint32_t);
constexpr size_t kMaxKeyBytes = kPartitionBytes + kKeyBytes;

// MultiGet reads at most this many keys per RocksDB call: it bounds the
// PinnableSlices (about 100 bytes each) and the cache blocks pinned at once.
constexpr size_t kMultiGetChunk = 4096;

// "t<id>" for a table in key order, "t<id>.p<partitions>" for one grouped
// by partition: the layout is in the name, so a store says it from the
// moment it is opened, and a table is never half of one and half of the
// other.
std::string FamilyName(uint32_t table, uint32_t partitions) {
  return partitions == 0 ? absl::StrCat("t", table) : absl::StrCat("t", table, ".p", partitions);
}

// The table and partitions of a family FamilyName names; false for any
// other name.
bool ParseFamilyName(const std::string& name, uint32_t* table, uint32_t* partitions) {
  if (name.size() < 2 || name[0] != 't') return false;
  const size_t dot = name.find(".p");
  *partitions = 0;
  if (!absl::SimpleAtoi(name.substr(1, dot == std::string::npos ? std::string::npos : dot - 1),
                        table)) {
    return false;
  }
  if (dot != std::string::npos &&
      (!absl::SimpleAtoi(name.substr(dot + 2), partitions) || *partitions == 0)) {
    return false;
  }
  return name == FamilyName(*table, *partitions);
}

// Big-endian, so that bytewise order is numeric order.
template <typename T>
void PutBigEndian(T value, char* out) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<char>(value >> (8 * (sizeof(T) - 1 - i)));
  }
}

template <typename T>
T GetBigEndian(const char* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value = (value << 8) | static_cast<unsigned char>(in[i]);
  return value;
}

// A table's column family and how its keys are stored.
struct Family {
  rocksdb::ColumnFamilyHandle* handle = nullptr;
  uint32_t partitions = 0;  // 0: key order

  size_t key_bytes() const { return partitions == 0 ? kKeyBytes : kMaxKeyBytes; }
  // Writes the stored form of `key` (key_bytes() of them) to `out`.
  void Encode(uint64_t key, char* out) const {
    if (partitions == 0) {
      PutBigEndian(key, out);
      return;
    }
    PutBigEndian(PartitionOf(key, partitions), out);
    PutBigEndian(key, out + kPartitionBytes);
  }
  rocksdb::Slice Encoded(uint64_t key, char* out) const {
    Encode(key, out);
    return rocksdb::Slice(out, key_bytes());
  }
  // The key a stored key holds; false when it is not of this layout.
  bool Decode(const rocksdb::Slice& stored, uint64_t* key) const {
    if (stored.size() != key_bytes()) return false;
    *key = GetBigEndian<uint64_t>(stored.data() + (partitions == 0 ? 0 : kPartitionBytes));
    return true;
  }
};

// Maps a RocksDB failure onto our codes: corruption is kDataLoss, anything
// else from the disk is worth retrying (kUnavailable).
Status FromRocks(const rocksdb::Status& status, absl::string_view context) {
  const std::string message = absl::StrCat(context, ": ", status.ToString());
  if (status.IsCorruption()) return absl::DataLossError(message);
  return absl::UnavailableError(message);
}

rocksdb::ColumnFamilyOptions FamilyOptions(const RocksKvStoreOptions& options,
                                           const std::shared_ptr<rocksdb::Cache>& cache) {
  rocksdb::BlockBasedTableOptions table;
  // One LRU cache shared by every table: the block cache is a fixed part of
  // the server's memory overhead, whatever the number of tables.
  table.block_cache = cache;
  // Pulls are point lookups, and a pull of a new row misses: a full (not
  // block-based) 10 bits/key Bloom filter answers most misses without a
  // data block read (~1% false positives), and is what the batched MultiGet
  // path is optimized for. We keep filters on the last level too
  // (optimize_filters_for_hits stays false), since misses are common.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(/*bits_per_key=*/10));
  table.whole_key_filtering = true;
  // Index and filter blocks of a table larger than RAM are large too (10
  // bits/key is 125 MB per 10^8 rows): charging them to the block cache
  // keeps the server's memory bounded by the budget plus a fixed overhead.
  // L0's are pinned since every lookup checks each L0 file.
  table.cache_index_and_filter_blocks = true;
  table.cache_index_and_filter_blocks_with_high_priority = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  // Rows are small (tens to hundreds of bytes): 4 KiB blocks keep a point
  // read's I/O small.
  table.block_size = 4 << 10;

  rocksdb::ColumnFamilyOptions family;
  family.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  family.write_buffer_size = static_cast<size_t>(options.write_buffer_mb) << 20;
  // A Bloom filter over each memtable's keys (5% of its size): a read of a
  // key the memtables lack, nearly every cold-tier miss, skips their skip
  // lists. ps_bench, a table 10x its budget: pull 1.16M -> 1.66M keys/s.
  family.memtable_whole_key_filtering = true;
  family.memtable_prefix_bloom_size_ratio = 0.05;
  // One memtable taking writes while the other flushes; more would only
  // add memory.
  family.max_write_buffer_number = 2;
  // Leveled compaction: the least space and read amplification, at the cost
  // of write amplification, which a flush-interval write pattern (each row
  // rewritten at most once per interval) keeps moderate. Dynamic level sizes
  // bound space amplification to ~1.1x.
  family.compaction_style = rocksdb::kCompactionStyleLevel;
  family.level_compaction_dynamic_level_bytes = true;
  // SST files of 8 MiB rather than RocksDB's 64: building a file's Bloom
  // filter holds 8 bytes per key of that file until it is written (20 MB
  // for a 64 MiB file of small rows), memory outside the block cache that
  // otherwise grows with the table up to that size. Measured with LR rows
  // (16 bytes a key) at a 2 MiB budget: peak RSS 97 MiB at 2.1M rows
  // before, 81 MiB after.
  family.target_file_size_base = 8 << 20;
  // Values are float weights and optimizer state, which general-purpose
  // compressors shrink little: no compression, so a point read costs no
  // decompression (measured: LZ4 bought no speed and little space).
  family.compression = rocksdb::kNoCompression;
  return family;
}

// RocksDB's info log, in DIR/LOG (the previous one in LOG.old past
// kMaxBytes). RocksDB's own logger writes through a file writer that, once
// a write failed (a full disk), aborts the process at its next line when
// the library is built with assertions, as Debian's is; this one stops
// writing instead and says so once. Errors also go to the server's log.
class InfoLog final : public rocksdb::Logger {
 public:
  explicit InfoLog(std::string dir)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), dir_(std::move(dir)) {}
  ~InfoLog() override {
    if (file_ != nullptr) std::fclose(file_);
  }

  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    const std::string formatted = Format(format, ap);
    const absl::string_view message = absl::StripTrailingAsciiWhitespace(formatted);
    if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL) {
      LOG(WARNING) << "rocksdb in " << dir_ << ": " << message;
    }
    absl::MutexLock lock(&mu_);
    if (failed_) return;
    if (file_ == nullptr || bytes_ > kMaxBytes) Roll();
    if (failed_) return;
    const std::string line =
        absl::StrCat(absl::FormatTime("%Y/%m/%d-%H:%M:%E6S ", absl::Now(), absl::LocalTimeZone()),
                     message, "\n");
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
      Fail("writing");
      return;
    }
    bytes_ += line.size();
  }

 private:
  static constexpr uint64_t kMaxBytes = 16 << 20;

  // The whole message, however long (RocksDB's statistics dumps run to
  // many lines).
  static std::string Format(const char* format, va_list ap) {
    va_list again;
    va_copy(again, ap);
    char buffer[1024];
    const int length = std::vsnprintf(buffer, sizeof(buffer), format, ap);
    std::string message;
    if (length < 0) {
      message = format;
    } else if (static_cast<size_t>(length) < sizeof(buffer)) {
      message.assign(buffer, length);
    } else {
      message.resize(static_cast<size_t>(length) + 1);
      std::vsnprintf(message.data(), message.size(), format, again);
      message.resize(length);
    }
    va_end(again);
    return message;
  }

  void Roll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string path = dir_ + "/LOG";
    if (file_ != nullptr) {
      std::fclose(file_);
      file_ = nullptr;
      std::error_code error;
      fs::rename(path, path + ".old", error);
    } else {
      // RocksDB logs before it creates a new store's directory; if this
      // fails, so does the open, saying why.
      std::error_code error;
      fs::create_directories(dir_, error);
    }
    file_ = std::fopen(path.c_str(), "a");
    if (file_ == nullptr) {
      Fail("opening");
      return;
    }
    std::error_code error;
    bytes_ = fs::file_size(path, error);
    if (error) bytes_ = 0;
  }

  void Fail(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    failed_ = true;
    LOG(WARNING) << "rocksdb's info log " << dir_ << "/LOG: " << what << " failed ("
                 << std::strerror(errno) << "); it stops here";
  }

  const std::string dir_;
  absl::Mutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

// A store whose write failed stays failed: RocksDB would otherwise resume
// writing on its own once space is back (a full disk's error is one it
// recovers from), behind the back of a master that has already stopped
// the job on that error. The server restarts instead, replaying its WAL.
class NoAutoRecovery final : public rocksdb::EventListener {
 public:
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason /*reason*/, rocksdb::Status /*error*/,
                            bool* auto_recovery) override {
    *auto_recovery = false;
  }
};

class RocksKvStore final : public KvStore {
 public:
  RocksKvStore(std::shared_ptr<rocksdb::Cache> cache, rocksdb::ColumnFamilyOptions family_options,
               std::unique_ptr<rocksdb::DB> db, std::vector<rocksdb::ColumnFamilyHandle*> handles,
               absl::flat_hash_map<uint32_t, Family> tables)
      : cache_(std::move(cache)),
        family_options_(std::move(family_options)),
        db_(std::move(db)),
        handles_(std::move(handles)),
        tables_(std::move(tables)) {}

  ~RocksKvStore() override {
    // Handles belong to the DB: they go first; Close then reports what a
    // destructor alone would swallow.
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    {
      absl::MutexLock lock(&mu_);
      tables_.clear();
      handles.swap(handles_);
    }
    for (rocksdb::ColumnFamilyHandle* handle : handles) {
      rocksdb::Status status = db_->DestroyColumnFamilyHandle(handle);
      if (!status.ok()) LOG(ERROR) << "kv store: " << status.ToString();
    }
    rocksdb::Status status = db_->Close();
    if (!status.ok()) LOG(ERROR) << "kv store: closing: " << status.ToString();
  }

  using KvStore::CreateTable;
  Status CreateTable(uint32_t table, uint32_t partitions) override {
    // create_mu_ serializes creators across the disk write, so two of them
    // cannot both create "t<table>"; readers only ever take mu_, briefly.
    absl::MutexLock create_lock(&create_mu_);
    if (const Family family = Find(table); family.handle != nullptr) {
      return CheckTableLayout(table, family.partitions, partitions);
    }
    rocksdb::ColumnFamilyHandle* handle = nullptr;
    rocksdb::Status status =
        db_->CreateColumnFamily(family_options_, FamilyName(table, partitions), &handle);
    if (!status.ok()) return FromRocks(status, absl::StrCat("creating table ", table));
    absl::MutexLock lock(&mu_);
    handles_.push_back(handle);
    tables_[table] = Family{.handle = handle, .partitions = partitions};
    return absl::OkStatus();
  }

  uint32_t Partitions(uint32_t table) override { return Find(table).partitions; }

  Status MultiGet(uint32_t table, std::span<const uint64_t> keys, size_t value_bytes,
                  std::span<char> out, std::vector<bool>* found) override {
    CHECK(found != nullptr);
    CHECK_EQ(out.size(), keys.size() * value_bytes);
    const Family family = Find(table);
    if (family.handle == nullptr) return absl::NotFoundError(absl::StrCat("no table ", table));
    found->assign(keys.size(), false);
    if (keys.empty()) return absl::OkStatus();

    rocksdb::ReadOptions read_options;
    // A batch larger than one chunk reads every chunk at one snapshot.
    const rocksdb::Snapshot* snapshot = nullptr;
    if (keys.size() > kMultiGetChunk) {
      snapshot = db_->GetSnapshot();
      read_options.snapshot = snapshot;
    }
    const size_t chunk = std::min(keys.size(), kMultiGetChunk);
    std::vector<char> encoded(chunk * kMaxKeyBytes);
    std::vector<rocksdb::Slice> slices(chunk);
    std::vector<rocksdb::PinnableSlice> values(chunk);
    std::vector<rocksdb::Status> statuses(chunk);
    Status result;
    for (size_t begin = 0; begin < keys.size() && result.ok(); begin += chunk) {
      const size_t n = std::min(chunk, keys.size() - begin);
      for (size_t i = 0; i < n; ++i) {
        slices[i] = family.Encoded(keys[begin + i], &encoded[i * kMaxKeyBytes]);
      }
      db_->MultiGet(read_options, family.handle, n, slices.data(), values.data(),
                    statuses.data());
      for (size_t i = 0; i < n; ++i) {
        const size_t index = begin + i;
        if (statuses[i].IsNotFound()) continue;
        if (!statuses[i].ok()) {
          result = FromRocks(statuses[i],
                             absl::StrCat("reading key ", keys[index], " of table ", table));
          break;
        }
        if (values[i].size() != value_bytes) {
          result =
              absl::DataLossError(absl::StrCat("key ", keys[index], " of table ", table, " holds ",
                                               values[i].size(), " bytes, expected ", value_bytes));
          break;
        }
        std::memcpy(out.data() + index * value_bytes, values[i].data(), value_bytes);
        (*found)[index] = true;
      }
      // Releases the pinned blocks before the next chunk.
      for (size_t i = 0; i < n; ++i) values[i].Reset();
    }
    if (snapshot != nullptr) db_->ReleaseSnapshot(snapshot);
    return result;
  }

  Status Write(std::span<const KvWrite> writes, bool sync) override {
    if (writes.empty()) return absl::OkStatus();
    // Tables are looked up once per run of equal tables; all are checked
    // before anything is written, so an unknown one writes nothing.
    std::vector<Family> families(writes.size());
    std::vector<uint32_t> partitions(writes.size(), 0);
    bool grouped = false;
    for (size_t i = 0; i < writes.size(); ++i) {
      families[i] = i > 0 && writes[i].table == writes[i - 1].table ? families[i - 1]
                                                                     : Find(writes[i].table);
      if (families[i].handle == nullptr) {
        return absl::NotFoundError(absl::StrCat("no table ", writes[i].table));
      }
      if (families[i].partitions != 0) {
        partitions[i] = PartitionOf(writes[i].key, families[i].partitions);
        grouped = true;
      }
    }
    // Into the batch in the tables' stored order (callers sort by key:
    // KeepLastWritePerKey), which RocksDB's memtable inserts fastest (its
    // skip list resumes from the last insert). Stable: of two writes of a
    // key, the later is still applied last.
    std::vector<uint32_t> order(writes.size());
    std::iota(order.begin(), order.end(), 0);
    if (grouped) {
      std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return std::tie(writes[a].table, partitions[a], writes[a].key) <
               std::tie(writes[b].table, partitions[b], writes[b].key);
      });
    }
    rocksdb::WriteBatch batch;
    char key[kMaxKeyBytes];
    for (uint32_t i : order) {
      const KvWrite& write = writes[i];
      const rocksdb::Slice stored = families[i].Encoded(write.key, key);
      rocksdb::Status status =
          write.erase ? batch.Delete(families[i].handle, stored)
                      : batch.Put(families[i].handle, stored,
                                  rocksdb::Slice(write.value.data(), write.value.size()));
      if (!status.ok()) return FromRocks(status, "building a write batch");
    }
    rocksdb::WriteOptions write_options;
    write_options.sync = sync;
    write_options.disableWAL = false;
    rocksdb::Status status = db_->Write(write_options, &batch);
    if (!status.ok()) return FromRocks(status, absl::StrCat("writing ", writes.size(), " rows"));
    return absl::OkStatus();
  }

  Status ScanFrom(uint32_t table, uint64_t from,
                  const std::function<Status(uint64_t, absl::string_view)>& visit) override {
    const Family family = Find(table);
    if (family.handle == nullptr) return absl::NotFoundError(absl::StrCat("no table ", table));
    if (family.partitions != 0 && from != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", table, " is grouped by partition: a scan of it starts at key 0, not ", from));
    }
    char start[kKeyBytes];
    PutBigEndian(from, start);
    return Iterate(table, family, rocksdb::Slice(start, family.partitions == 0 ? kKeyBytes : 0),
                   /*prefix=*/{}, visit);
  }

  Status ScanPartition(uint32_t table, uint32_t partition, uint64_t from,
                       const std::function<Status(uint64_t, absl::string_view)>& visit) override {
    const Family family = Find(table);
    if (family.handle == nullptr) return absl::NotFoundError(absl::StrCat("no table ", table));
    if (family.partitions == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("table ", table, " is stored in key order, not by partition"));
    }
    if (partition >= family.partitions) {
      return absl::InvalidArgumentError(absl::StrCat("partition ", partition, " of table ", table,
                                                     " (of ", family.partitions, ")"));
    }
    char start[kMaxKeyBytes];
    PutBigEndian(partition, start);
    PutBigEndian(from, start + kPartitionBytes);
    return Iterate(table, family, rocksdb::Slice(start, kMaxKeyBytes),
                   rocksdb::Slice(start, kPartitionBytes), visit);
  }

  Status Compact(uint32_t table) override {
    rocksdb::ColumnFamilyHandle* family = Find(table).handle;
    if (family == nullptr) return absl::NotFoundError(absl::StrCat("no table ", table));
    rocksdb::CompactRangeOptions options;
    // Tombstones at the bottom level go too: the point is the space.
    options.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    rocksdb::Status status = db_->CompactRange(options, family, nullptr, nullptr);
    if (!status.ok()) return FromRocks(status, absl::StrCat("compacting table ", table));
    return absl::OkStatus();
  }

  Status Checkpoint(const std::string& dir) override {
    std::error_code error;
    // RocksDB wants an absolute path.
    const fs::path target = fs::absolute(dir, error);
    if (error) return absl::InvalidArgumentError(absl::StrCat("bad checkpoint path ", dir));
    if (fs::exists(target, error)) {
      return absl::AlreadyExistsError(absl::StrCat("checkpoint ", dir, " already exists"));
    }
    if (!fs::is_directory(target.parent_path(), error)) {
      return absl::NotFoundError(
          absl::StrCat("the parent of checkpoint ", dir, " is not a directory"));
    }
    rocksdb::Checkpoint* raw = nullptr;
    rocksdb::Status status = rocksdb::Checkpoint::Create(db_.get(), &raw);
    std::unique_ptr<rocksdb::Checkpoint> checkpoint(raw);
    // log_size_for_flush 0: every memtable is flushed first, so the
    // checkpoint holds every acknowledged write, in SSTs.
    if (status.ok())
      status = checkpoint->CreateCheckpoint(target.string(), /*log_size_for_flush=*/0);
    if (!status.ok()) return FromRocks(status, absl::StrCat("checkpoint into ", dir));
    return absl::OkStatus();
  }

  uint64_t ApproximateRows(uint32_t table) override {
    rocksdb::ColumnFamilyHandle* family = Find(table).handle;
    uint64_t rows = 0;
    if (family == nullptr || !db_->GetIntProperty(family, "rocksdb.estimate-num-keys", &rows)) {
      return 0;
    }
    return rows;
  }

  uint64_t ApproximateDiskBytes() override {
    // SSTs (live and those still referenced by old versions: all on disk),
    // plus the memtables, whose contents the WAL holds on disk until they
    // are flushed. Memtable arena sizes overstate the WAL a little; listing
    // the WAL files instead would take the DB mutex and read the directory,
    // too costly for every heartbeat.
    uint64_t sst = 0;
    uint64_t memtables = 0;
    db_->GetAggregatedIntProperty("rocksdb.total-sst-files-size", &sst);
    db_->GetAggregatedIntProperty("rocksdb.size-all-mem-tables", &memtables);
    return sst + memtables;
  }

  uint64_t ApproximateMemoryBytes() override {
    // Index and filter blocks live in the cache (cache_index_and_filter_blocks),
    // so the cache and the memtables are the store's memory; both are read
    // without the DB mutex, which a store stalled on a full disk may hold.
    uint64_t memtables = 0;
    db_->GetAggregatedIntProperty("rocksdb.cur-size-all-mem-tables", &memtables);
    return cache_->GetUsage() + memtables;
  }

 private:
  // `table`'s column family and layout; a null handle for an unknown
  // table. Handles live as long as the store, so the pointer stays valid
  // after mu_ is released.
  Family Find(uint32_t table) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::ReaderMutexLock lock(&mu_);
    auto it = tables_.find(table);
    return it == tables_.end() ? Family{} : it->second;
  }

  // Visits the rows of `family` from stored key `start` on, while their
  // stored key begins with `prefix`.
  Status Iterate(uint32_t table, const Family& family, const rocksdb::Slice& start,
                 const rocksdb::Slice& prefix,
                 const std::function<Status(uint64_t, absl::string_view)>& visit) {
    rocksdb::ReadOptions read_options;
    // A scan reads every block once: caching them would only evict the
    // blocks the serving path needs.
    read_options.fill_cache = false;
    read_options.readahead_size = 2 << 20;
    // A partition's range ends where the next partition's begins: RocksDB
    // then stops there rather than stepping over the deleted rows past it.
    char end[kPartitionBytes];
    rocksdb::Slice upper;
    if (prefix.size() == kPartitionBytes) {
      PutBigEndian(GetBigEndian<uint32_t>(prefix.data()) + 1, end);
      upper = rocksdb::Slice(end, kPartitionBytes);
      read_options.iterate_upper_bound = &upper;
    }
    // An iterator reads from the snapshot taken when it is made.
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, family.handle));
    for (it->Seek(start); it->Valid(); it->Next()) {
      const rocksdb::Slice stored = it->key();
      if (!stored.starts_with(prefix)) break;
      uint64_t key = 0;
      if (!family.Decode(stored, &key)) {
        return absl::DataLossError(
            absl::StrCat("table ", table, " holds a key of ", stored.size(), " bytes"));
      }
      const rocksdb::Slice value = it->value();
      RETURN_IF_ERROR(visit(key, absl::string_view(value.data(), value.size())));
    }
    if (!it->status().ok()) return FromRocks(it->status(), absl::StrCat("scanning table ", table));
    return absl::OkStatus();
  }

  // Members destroyed in reverse order: the cache outlives the DB.
  const std::shared_ptr<rocksdb::Cache> cache_;
  const rocksdb::ColumnFamilyOptions family_options_;
  const std::unique_ptr<rocksdb::DB> db_;
  absl::Mutex create_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  // Every handle Open or CreateColumnFamily returned, default included.
  std::vector<rocksdb::ColumnFamilyHandle*> handles_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, Family> tables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

StatusOr<std::unique_ptr<KvStore>> OpenRocksKvStore(const RocksKvStoreOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("the kv store needs a directory");
  if (options.block_cache_mb <= 0 || options.write_buffer_mb <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv store: block_cache_mb (", options.block_cache_mb,
                     ") and write_buffer_mb (", options.write_buffer_mb, ") must be positive"));
  }
  std::shared_ptr<rocksdb::Cache> cache =
      rocksdb::NewLRUCache(static_cast<size_t>(options.block_cache_mb) << 20);
  rocksdb::ColumnFamilyOptions family_options = FamilyOptions(options, cache);

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  // Flushes and compactions: two jobs keep up with a flush-interval write
  // load without taking cores from serving.
  db_options.max_background_jobs = 2;
  // RocksDB's info LOG, written by InfoLog: it survives a full disk.
  db_options.info_log = std::make_shared<InfoLog>(options.dir);
  db_options.listeners.push_back(std::make_shared<NoAutoRecovery>());
  // A WAL file is deleted only once every table with writes in it has
  // flushed them; a table written a little at a time (a dense tensor)
  // fills its memtable rarely and would keep every WAL file since, up to
  // RocksDB's default limit (4x all write buffers, ~600 MB here: disk, and
  // replay time at a restart). Past this size RocksDB flushes the tables
  // holding the oldest WAL file.
  db_options.max_total_wal_size = static_cast<uint64_t>(4 * options.write_buffer_mb) << 20;

  // Every family the store holds must be opened; a new store holds only
  // "default", and ListColumnFamilies fails on it (no MANIFEST yet).
  std::vector<std::string> names;
  rocksdb::Status status = rocksdb::DB::ListColumnFamilies(db_options, options.dir, &names);
  if (!status.ok() || names.empty()) names = {rocksdb::kDefaultColumnFamilyName};
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& name : names) {
    uint32_t table = 0;
    uint32_t partitions = 0;
    if (name != rocksdb::kDefaultColumnFamilyName &&
        !ParseFamilyName(name, &table, &partitions)) {
      return absl::DataLossError(absl::StrCat("the kv store in ", options.dir,
                                              " holds an unexpected column family ", name));
    }
    descriptors.emplace_back(name, family_options);
  }

  rocksdb::DB* raw = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  status = rocksdb::DB::Open(db_options, options.dir, descriptors, &handles, &raw);
  if (!status.ok()) {
    const std::string message =
        absl::StrCat("cannot open the kv store in ", options.dir, ": ", status.ToString());
    if (status.IsCorruption()) return absl::DataLossError(message);
    return absl::UnavailableError(message);
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  absl::flat_hash_map<uint32_t, Family> tables;
  for (rocksdb::ColumnFamilyHandle* handle : handles) {
    uint32_t table = 0;
    uint32_t partitions = 0;
    if (!ParseFamilyName(handle->GetName(), &table, &partitions)) continue;
    const auto [it, added] =
        tables.try_emplace(table, Family{.handle = handle, .partitions = partitions});
    if (!added) {
      const std::string message =
          absl::StrCat("the kv store in ", options.dir, " holds table ", table, " twice: ",
                       it->second.handle->GetName(), " and ", handle->GetName());
      // Closes the store (its handles first) before saying why.
      for (rocksdb::ColumnFamilyHandle* each : handles) db->DestroyColumnFamilyHandle(each);
      return absl::DataLossError(message);
    }
  }
  return std::unique_ptr<KvStore>(new RocksKvStore(std::move(cache), std::move(family_options),
                                                   std::move(db), std::move(handles),
                                                   std::move(tables)));
}

}  // namespace eps
