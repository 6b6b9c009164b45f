#include "ps/storage.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/logging.h"

namespace eps {
namespace {

std::string DatabaseDir(const std::string& data_dir) {
  return (std::filesystem::path(data_dir) / "db").string();
}
std::string CheckpointsDir(const std::string& data_dir) {
  return (std::filesystem::path(data_dir) / "checkpoints").string();
}

uint64_t DirectoryBytes(const std::string& dir) {
  uint64_t bytes = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir, error)) {
    if (entry.is_regular_file(error)) bytes += entry.file_size(error);
  }
  return bytes;
}

}  // namespace

Status StorageOptions::Validate() const {
  if (memory_budget_mb < 0) return absl::InvalidArgumentError("ps.memory_budget_mb must be >= 0");
  if (memory_budget_mb > 0 && data_dir.empty()) {
    return absl::InvalidArgumentError(
        "ps.memory_budget_mb needs a data dir to keep the rows that leave memory");
  }
  if (flush_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ps.flush_interval_ms must be > 0");
  }
  if (keep_checkpoints < 1) return absl::InvalidArgumentError("checkpoint.keep must be >= 1");
  if (!restore_checkpoint.empty() && data_dir.empty()) {
    return absl::InvalidArgumentError("checkpoint.restore needs a data dir");
  }
  return absl::OkStatus();
}

ServerStorage::ServerStorage(const StorageOptions& options) : options_(options) {}

StatusOr<std::unique_ptr<ServerStorage>> ServerStorage::Open(const StorageOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<ServerStorage> storage(new ServerStorage(options));
  if (!options.data_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options.data_dir, error);
    if (error) {
      return absl::UnavailableError(
          absl::StrCat("cannot create data dir ", options.data_dir, ": ", error.message()));
    }
    if (!options.restore_checkpoint.empty()) {
      const std::string checkpoint =
          (std::filesystem::path(CheckpointsDir(options.data_dir)) / options.restore_checkpoint)
              .string();
      RETURN_IF_ERROR_CTX(RestoreRocksCheckpoint(checkpoint, DatabaseDir(options.data_dir)),
                          absl::StrCat("checkpoint.restore = ", options.restore_checkpoint));
      LOG(INFO) << "restored checkpoint " << checkpoint;
    }
    RocksKvStoreOptions store;
    store.dir = DatabaseDir(options.data_dir);
    store.block_cache_mb = options.block_cache_mb;
    store.write_buffer_mb = options.write_buffer_mb;
    ASSIGN_OR_RETURN(storage->store_, OpenRocksKvStore(store));
    storage->queue_ = std::make_unique<WriteQueue>(storage->store_.get());
  }
  storage->budget_ = std::make_unique<MemoryBudget>(options.memory_budget_mb << 20);
  return storage;
}

ServerStorage::~ServerStorage() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (flusher_.joinable()) flusher_.join();
  Status flushed = Flush();
  if (!flushed.ok()) LOG(ERROR) << "final flush: " << flushed;
  tables_.clear();
  queue_.reset();
  store_.reset();
}

Status ServerStorage::CreateTables(const proto::JobSpec& job) {
  if (!options_.data_dir.empty() && !job.job_id().empty()) {
    const std::string want = absl::StrCat(job.job_id(), " ", job.name());
    const std::string have = stored_job();
    if (!have.empty() && have != want) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--data-dir ", options_.data_dir, " holds the parameters of job ", have,
          ", not of this job (", want, "); give this server a fresh --data-dir"));
    }
    if (have.empty()) {
      const std::filesystem::path marker = std::filesystem::path(options_.data_dir) / "JOB";
      std::ofstream out(marker, std::ios::trunc);
      out << want << "\n";
      if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", marker.string()));
    }
  }
  TableStorage storage;
  storage.store = store_.get();
  storage.queue = queue_.get();
  storage.budget = budget_.get();
  storage.write_every_push = options_.every_push && store_ != nullptr;
  storage.durability_timeout = options_.durability_timeout;
  std::vector<std::unique_ptr<Table>> tables;
  for (const proto::TableSpec& spec : job.tables()) {
    if (spec.id() != tables.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the job's table ids must be 0..n-1; table '", spec.name(), "' has id ", spec.id()));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Table> table, Table::Create(spec, job.seed(), storage));
    tables.push_back(std::move(table));
  }
  tables_ = std::move(tables);
  {
    absl::MutexLock lock(&mu_);
    tables_ready_ = true;
  }
  if (store_ != nullptr) flusher_ = std::thread([this] { FlushLoop(); });
  return absl::OkStatus();
}

Table* ServerStorage::table(uint32_t id) const {
  return id < tables_.size() ? tables_[id].get() : nullptr;
}

size_t ServerStorage::num_tables() const { return tables_.size(); }

Status ServerStorage::Flush() {
  if (store_ == nullptr) return absl::OkStatus();
  absl::MutexLock flush_lock(&flush_mu_);
  const absl::Time start = absl::Now();
  uint64_t seq = 0;
  for (const auto& table : tables_) seq = std::max(seq, table->QueueDirtyRows());
  if (seq > 0) RETURN_IF_ERROR(queue_->WaitDurable(seq, options_.durability_timeout));
  RETURN_IF_ERROR(queue_->status());
  // The rows just written may leave memory now; requests alone would evict
  // them only as fast as they touch rows.
  for (const auto& table : tables_) table->EvictToBudget();
  absl::MutexLock lock(&mu_);
  last_flush_ms_ = absl::ToDoubleMilliseconds(absl::Now() - start);
  ++flushes_;
  return absl::OkStatus();
}

void ServerStorage::FlushLoop() {
  absl::Time last = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Wake when the next flush is due (not up to one poll later: the
      // interval bounds what a crash loses), and often enough to notice the
      // budget being exceeded: dirty rows cannot leave memory until flushed.
      const absl::Duration due = last + options_.flush_interval - absl::Now();
      const absl::Duration wait =
          std::max(absl::ZeroDuration(), std::min(due, absl::Milliseconds(50)));
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), wait)) return;
    }
    const absl::Time now = absl::Now();
    if (now - last < options_.flush_interval && !budget_->over()) continue;
    last = now;
    Status flushed = Flush();
    if (!flushed.ok()) LOG(ERROR) << "flush: " << flushed;
  }
}

StatusOr<CheckpointInfo> ServerStorage::Checkpoint(uint64_t id) {
  if (store_ == nullptr) {
    return absl::FailedPreconditionError("this server keeps no store to checkpoint (no data dir)");
  }
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(Flush());
  const std::string root = CheckpointsDir(options_.data_dir);
  std::error_code error;
  std::filesystem::create_directories(root, error);
  const std::string path = (std::filesystem::path(root) / std::to_string(id)).string();
  {
    absl::MutexLock flush_lock(&flush_mu_);
    RETURN_IF_ERROR(store_->Checkpoint(path));
  }
  CheckpointInfo info{.path = path, .bytes = DirectoryBytes(path), .duration = absl::Now() - start};
  // Keep the newest `keep_checkpoints` (numeric ids).
  std::vector<uint64_t> ids;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    uint64_t value = 0;
    if (entry.is_directory() && absl::SimpleAtoi(entry.path().filename().string(), &value)) {
      ids.push_back(value);
    }
  }
  std::sort(ids.begin(), ids.end());
  while (ids.size() > static_cast<size_t>(options_.keep_checkpoints)) {
    std::filesystem::remove_all(std::filesystem::path(root) / std::to_string(ids.front()), error);
    ids.erase(ids.begin());
  }
  LOG(INFO) << "checkpoint " << id << " in " << path << ": " << info.bytes / 1024 << " KiB in "
            << absl::FormatDuration(info.duration);
  return info;
}

std::string ServerStorage::stored_job() const {
  if (options_.data_dir.empty()) return "";
  std::ifstream in(std::filesystem::path(options_.data_dir) / "JOB");
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

StorageStats ServerStorage::stats() const {
  StorageStats stats;
  for (const auto& table : tables_) {
    const TableStats t = table->stats();
    stats.rows_in_memory += t.rows_in_memory;
    stats.memory_bytes += t.memory_bytes;
    stats.hits += t.hits;
    stats.misses += t.misses;
    stats.evictions += t.evictions;
    if (store_ != nullptr) stats.rows_on_disk += store_->ApproximateRows(table->spec().id());
  }
  if (store_ != nullptr) stats.disk_bytes = store_->ApproximateDiskBytes();
  absl::MutexLock lock(&mu_);
  stats.last_flush_ms = last_flush_ms_;
  stats.flushes = flushes_;
  return stats;
}

}  // namespace eps
