#include "ps/storage.h"

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cluster/placement.h"
#include "core/failpoint.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "ps/admission.h"
#include "ps/journal.h"

namespace eps {
namespace {

namespace fs = std::filesystem;

std::string DatabaseDir(const std::string& data_dir) {
  return (fs::path(data_dir) / "db").string();
}
std::string CheckpointsDir(const std::string& data_dir) {
  return (fs::path(data_dir) / "checkpoints").string();
}

uint64_t DirectoryBytes(const std::string& dir) {
  uint64_t bytes = 0;
  std::error_code error;
  for (const auto& entry : fs::recursive_directory_iterator(dir, error)) {
    if (entry.is_regular_file(error)) bytes += entry.file_size(error);
  }
  return bytes;
}

std::string JournalDir(const std::string& data_dir) {
  return (fs::path(data_dir) / "journal").string();
}

// Opens the RocksDB store in DATA_DIR/db.
StatusOr<std::unique_ptr<KvStore>> OpenDatabase(const StorageOptions& options) {
  RocksKvStoreOptions store;
  store.dir = DatabaseDir(options.data_dir);
  store.block_cache_mb = options.block_cache_mb;
  store.write_buffer_mb = options.write_buffer_mb;
  return OpenRocksKvStore(store);
}

// Before a restore replaces DATA_DIR/db: the journal that completes it goes
// into it (`store`, or the database opened for this when null), so that no
// journal outlives its database and is replayed over the checkpoint later.
// When it cannot be applied (a damaged journal, a database that does not
// open) it is discarded instead, loudly: the restore replaces those rows
// anyway (after a failed copy, the old database comes back without them).
Status ApplyJournalBeforeRestore(const StorageOptions& options, KvStore* store) {
  const std::string dir = JournalDir(options.data_dir);
  if (!Journal::HasSegments(dir)) return absl::OkStatus();
  Status applied;
  if (store != nullptr) {
    applied = Journal::Apply(dir, store);
  } else {
    StatusOr<std::unique_ptr<KvStore>> old = OpenDatabase(options);
    applied = old.ok() ? Journal::Apply(dir, old->get()) : old.status();
  }
  if (applied.ok()) return absl::OkStatus();
  LOG(ERROR) << "the journal " << dir << " could not be applied to the database a restore "
             << "replaces (" << applied << "); discarding it: its rows, changed since that "
             << "database's last full flush, are not in it";
  return Journal::Discard(dir);
}

// The write queue to `store`: with a journal, after replaying what the
// journal in DATA_DIR/journal holds into the store. Without one, a journal
// left by a run with one is replayed all the same, then removed.
StatusOr<std::unique_ptr<WriteQueue>> OpenQueue(const StorageOptions& options, KvStore* store) {
  const std::string dir = JournalDir(options.data_dir);
  if (options.journal_mb > 0) {
    ASSIGN_OR_RETURN(std::unique_ptr<Journal> journal, Journal::Open(dir, store, /*first_seq=*/1));
    return std::make_unique<WriteQueue>(store, std::move(journal));
  }
  RETURN_IF_ERROR(Journal::Apply(dir, store));
  std::error_code error;
  fs::remove_all(dir, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot remove ", dir, ": ", error.message()));
  return std::make_unique<WriteQueue>(store);
}

// The tables of `job` over the given store, queue and budget (store and
// queue null for a memory-only server).
StatusOr<std::vector<std::unique_ptr<Table>>> MakeTables(const proto::JobSpec& job,
                                                         const StorageOptions& options,
                                                         KvStore* store, WriteQueue* queue,
                                                         MemoryBudget* budget,
                                                         const std::atomic<uint32_t>* pass) {
  TableStorage storage;
  storage.pass = pass;
  storage.store = store;
  storage.partitions = job.num_partitions();
  storage.queue = queue;
  storage.budget = budget;
  storage.write_every_push = options.every_push && store != nullptr;
  storage.durability_timeout = options.durability_timeout;
  storage.admission_candidates = static_cast<uint64_t>(options.admission_memory_mb << 20) /
                                 AdmissionFilter::kBytesPerCandidate;
  std::vector<std::unique_ptr<Table>> tables;
  for (const proto::TableSpec& spec : job.tables()) {
    if (spec.id() != tables.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the job's table ids must be 0..n-1; table '", spec.name(), "' has id ", spec.id()));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Table> table, Table::Create(spec, job.seed(), storage));
    tables.push_back(std::move(table));
  }
  return tables;
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
  if (journal_mb < 0) return absl::InvalidArgumentError("ps.journal_mb must be >= 0");
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
  absl::WriterMutexLock lock(&storage->state_mu_);
  storage->budget_ = std::make_unique<MemoryBudget>(options.memory_budget_mb << 20);
  if (!options.data_dir.empty()) {
    std::error_code error;
    fs::create_directories(options.data_dir, error);
    if (error) {
      return absl::UnavailableError(
          absl::StrCat("cannot create data dir ", options.data_dir, ": ", error.message()));
    }
    if (!options.restore_checkpoint.empty()) {
      const std::string checkpoint =
          (fs::path(CheckpointsDir(options.data_dir)) / options.restore_checkpoint).string();
      RETURN_IF_ERROR_CTX(ApplyJournalBeforeRestore(options, /*store=*/nullptr),
                          absl::StrCat("checkpoint.restore = ", options.restore_checkpoint));
      RETURN_IF_ERROR_CTX(RestoreRocksCheckpoint(checkpoint, DatabaseDir(options.data_dir)),
                          absl::StrCat("checkpoint.restore = ", options.restore_checkpoint));
      LOG(INFO) << "restored checkpoint " << checkpoint;
    }
    ASSIGN_OR_RETURN(storage->store_, OpenDatabase(options));
    ASSIGN_OR_RETURN(storage->queue_, OpenQueue(options, storage->store_.get()));
  }
  return storage;
}

ServerStorage::~ServerStorage() {
  StopFlusher();
  Status flushed = Flush();
  if (!flushed.ok()) LOG(ERROR) << "final flush: " << flushed;
  absl::WriterMutexLock lock(&state_mu_);
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
      const fs::path marker = fs::path(options_.data_dir) / "JOB";
      std::ofstream out(marker, std::ios::trunc);
      out << want << "\n";
      if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", marker.string()));
    }
  }
  {
    absl::WriterMutexLock lock(&state_mu_);
    ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Table>> tables,
                     MakeTables(job, options_, store_.get(), queue_.get(), budget_.get(), &pass_));
    tables_ = std::move(tables);
    job_ = job;
    for (const auto& table : tables_) {
      const uint32_t id = table->spec().id();
      if (store_ == nullptr || store_->Partitions(id) == job.num_partitions()) continue;
      LOG(WARNING) << "table '" << table->spec().name() << "' of this store is kept in key "
                   << "order (it was made before stores grouped rows by partition): moving one "
                   << "of its partitions to another server reads all of its rows";
    }
  }
  {
    absl::MutexLock lock(&mu_);
    tables_ready_ = true;
  }
  StartFlusher();
  return absl::OkStatus();
}

Table* ServerStorage::table(uint32_t id) const {
  absl::ReaderMutexLock lock(&state_mu_);
  return id < tables_.size() ? tables_[id].get() : nullptr;
}

size_t ServerStorage::num_tables() const {
  absl::ReaderMutexLock lock(&state_mu_);
  return tables_.size();
}

Status ServerStorage::Flush() {
  absl::ReaderMutexLock lock(&state_mu_);
  return FlushLocked(/*journal_only=*/false);
}

Status ServerStorage::FlushLocked(bool journal_only) {
  if (store_ == nullptr) return absl::OkStatus();
  absl::MutexLock flush_lock(&flush_mu_);
  const absl::Time start = absl::Now();
  // A full flush starts a journal segment: once every row the store lacks
  // is queued after it and durable, the segments before it hold nothing
  // the store does not.
  const uint64_t boundary = journal_only ? 0 : queue_->MarkSegment();
  uint64_t seq = boundary > 0 ? boundary - 1 : 0;
  for (const auto& table : tables_) seq = std::max(seq, table->QueueDirtyRows(journal_only));
  if (seq > 0) RETURN_IF_ERROR(queue_->WaitDurable(seq, options_.durability_timeout));
  RETURN_IF_ERROR(queue_->status());
  if (boundary > 0) {
    if (Status dropped = queue_->DropJournalBefore(boundary); !dropped.ok()) {
      return NoteWriteError(dropped);
    }
  }
  // The rows just written may leave memory now; requests alone would evict
  // them only as fast as they touch rows.
  for (const auto& table : tables_) table->EvictToBudget();
  absl::MutexLock lock(&mu_);
  last_flush_ms_ = absl::ToDoubleMilliseconds(absl::Now() - start);
  ++flushes_;
  return absl::OkStatus();
}

void ServerStorage::StartFlusher() {
  bool store = false;
  bool expiry = false;
  {
    absl::ReaderMutexLock lock(&state_mu_);
    store = store_ != nullptr;
    for (const proto::TableSpec& spec : job_.tables()) expiry |= spec.ttl_passes() > 0;
  }
  {
    // New tables: nothing of them was swept yet, and nothing is swept
    // before the master tells the passes done again (after a restore, the
    // count of before it would expire rows the checkpoint brought back).
    absl::MutexLock lock(&mu_);
    swept_through_.reset();
    failed_through_.reset();
    passes_due_.reset();
  }
  if (store) flusher_ = std::thread([this] { FlushLoop(); });
  if (expiry) expirer_ = std::thread([this] { ExpireLoop(); });
}

void ServerStorage::StopFlusher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (flusher_.joinable()) flusher_.join();
  if (expirer_.joinable()) expirer_.join();
  absl::MutexLock lock(&mu_);
  stopping_ = false;
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
    bool over = false;
    {
      absl::ReaderMutexLock lock(&state_mu_);
      over = budget_->over();
    }
    if (now - last < options_.flush_interval && !over) continue;
    last = now;
    // Into the journal, unless rows must leave memory or it is full.
    Status flushed;
    {
      absl::ReaderMutexLock lock(&state_mu_);
      const bool full =
          over || queue_->journal_bytes() >= static_cast<uint64_t>(options_.journal_mb) << 20;
      flushed = FlushLocked(/*journal_only=*/!full);
    }
    if (!flushed.ok()) LOG(ERROR) << "flush: " << flushed;
  }
}

void ServerStorage::NotePassesDone(uint32_t passes_done) {
  pass_.store(passes_done, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  passes_due_ = passes_done;
}

void ServerStorage::ExpireLoop() {
  while (true) {
    uint32_t due;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || (passes_due_.has_value() && swept_through_ != passes_due_ &&
                             failed_through_ != passes_due_);
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      due = *passes_due_;
    }
    absl::ReaderMutexLock state_lock(&state_mu_);
    const Status swept = ExpireLocked(due);
    if (swept.ok()) continue;
    LOG(ERROR) << "deleting expired rows: " << swept;
    // Again at the next pass (or stop), not in a loop; an export before
    // then sweeps again.
    absl::MutexLock lock(&mu_);
    failed_through_ = due;
  }
}

Status ServerStorage::ExpireLocked(uint32_t passes_done) {
  absl::MutexLock expire_lock(&expire_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (swept_through_ == passes_done) return absl::OkStatus();
  }
  const absl::Time start = absl::Now();
  uint64_t expired = 0;
  Status result;
  if (FailpointArmed("ps.fail_expiry", passes_done)) {
    return absl::UnavailableError(
        absl::StrCat("failpoint ps.fail_expiry=", passes_done, ": the sweep fails"));
  }
  for (const std::unique_ptr<Table>& table : tables_) {
    const uint64_t stored = store_ != nullptr ? store_->ApproximateRows(table->spec().id()) : 0;
    StatusOr<uint64_t> rows = table->Expire(passes_done);
    if (!rows.ok()) {
      result = rows.status();
      break;
    }
    expired += *rows;
    if (*rows == 0) continue;
    std::string compacted;
    if (store_ != nullptr && *rows * 8 >= stored) {
      // A full flush first: the journal segments that still hold the
      // deleted rows' images go too.
      if (Status flushed = FlushLocked(/*journal_only=*/false); !flushed.ok()) {
        LOG(WARNING) << "flushing before compacting table '" << table->spec().name()
                     << "': " << flushed;
      }
      const absl::Time compact_start = absl::Now();
      if (Status done = store_->Compact(table->spec().id()); !done.ok()) {
        LOG(WARNING) << "compacting table '" << table->spec().name() << "': " << done;
      } else {
        compacted = absl::StrFormat("; compacted its store in %.0f ms",
                                    absl::ToDoubleMilliseconds(absl::Now() - compact_start));
      }
    }
    LOG(INFO) << "table '" << table->spec().name() << "': deleted " << *rows
              << " rows untrained for " << table->spec().ttl_passes() << " pass(es), once "
              << passes_done << " pass(es) were done" << compacted;
  }
  absl::MutexLock lock(&mu_);
  rows_expired_ += expired;
  if (!result.ok()) return result;
  swept_through_ = passes_done;
  VLOG(1) << "expiry after pass " << passes_done << ": " << expired << " rows in "
          << absl::ToDoubleMilliseconds(absl::Now() - start) << " ms";
  return absl::OkStatus();
}

StatusOr<std::string> ServerStorage::CheckpointRoot() const {
  fs::path root;
  if (options_.checkpoint_dir.empty()) {
    root = CheckpointsDir(options_.data_dir);
  } else {
    std::optional<uint32_t> id;
    {
      absl::MutexLock lock(&mu_);
      id = server_id_;
    }
    if (!id.has_value()) {
      return absl::FailedPreconditionError(
          "checkpoint.dir names checkpoints by server id, and this server has none yet");
    }
    root = fs::path(options_.checkpoint_dir) / absl::StrCat("ps-", *id);
  }
  std::error_code error;
  const fs::path absolute = fs::absolute(root, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot resolve checkpoint dir ", root.string(),
                                               ": ", error.message()));
  }
  return absolute.lexically_normal().string();
}

StatusOr<CheckpointInfo> ServerStorage::Checkpoint(uint64_t id,
                                                   std::span<const uint64_t> keep_ids) {
  absl::ReaderMutexLock state_lock(&state_mu_);
  if (store_ == nullptr) {
    if (!broken_.ok()) return broken_;
    return absl::FailedPreconditionError("this server keeps no store to checkpoint (no data dir)");
  }
  ASSIGN_OR_RETURN(const std::string root, CheckpointRoot());
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(FlushLocked(/*journal_only=*/false));
  std::error_code error;
  fs::create_directories(root, error);
  if (error) {
    return NoteWriteError(absl::UnavailableError(
        absl::StrCat("cannot create checkpoint dir ", root, ": ", error.message())));
  }
  const std::string path = (fs::path(root) / std::to_string(id)).string();
  {
    absl::MutexLock flush_lock(&flush_mu_);
    Status written = store_->Checkpoint(path);
    if (!written.ok()) {
      // kAlreadyExists and the like are the caller's; the disk's are ours.
      if (!absl::IsUnavailable(written)) return written;
      return NoteWriteError(
          Annotate(written, absl::StrCat("writing checkpoint ", id, " to ", path)));
    }
  }
  CheckpointInfo info{.path = path, .bytes = DirectoryBytes(path), .duration = absl::Now() - start};

  // Retention: numeric directory names only; anything else there is not ours.
  std::vector<uint64_t> ids;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    uint64_t value = 0;
    if (entry.is_directory() && absl::SimpleAtoi(entry.path().filename().string(), &value)) {
      ids.push_back(value);
    }
  }
  std::sort(ids.begin(), ids.end());
  std::vector<uint64_t> drop;
  if (!keep_ids.empty()) {
    const absl::flat_hash_set<uint64_t> keep(keep_ids.begin(), keep_ids.end());
    for (uint64_t old : ids) {
      if (old < id && !keep.contains(old)) drop.push_back(old);
    }
  } else if (ids.size() > static_cast<size_t>(options_.keep_checkpoints)) {
    drop.assign(ids.begin(), ids.end() - options_.keep_checkpoints);
  }
  for (uint64_t old : drop) {
    const fs::path old_path = fs::path(root) / std::to_string(old);
    fs::remove_all(old_path, error);
    if (error) {
      LOG(WARNING) << "cannot delete checkpoint " << old_path.string() << ": " << error.message();
    }
  }
  LOG(INFO) << "checkpoint " << id << " in " << path << ": " << info.bytes / 1024 << " KiB in "
            << absl::FormatDuration(info.duration);
  if (FailpointArmed("ps.crash_in_checkpoint", id)) {
    LOG(WARNING) << "failpoint ps.crash_in_checkpoint=" << id
                 << ": killing this server (SIGKILL) before it answers";
    raise(SIGKILL);
  }
  return info;
}

StatusOr<CheckpointInfo> ServerStorage::Restore(const std::string& checkpoint) {
  if (options_.data_dir.empty()) {
    return absl::FailedPreconditionError(
        "this server keeps no store to restore a checkpoint into (no data dir)");
  }
  {
    absl::MutexLock lock(&mu_);
    if (!tables_ready_) {
      return absl::FailedPreconditionError("the tables are not created yet: nothing to restore");
    }
  }
  std::error_code error;
  const bool empty = checkpoint.empty();
  const fs::path path = empty ? fs::path() : fs::absolute(checkpoint, error).lexically_normal();
  if (error) {
    return absl::InvalidArgumentError(absl::StrCat("bad checkpoint path '", checkpoint, "'"));
  }
  // The checks RestoreRocksCheckpoint makes too, made before anything is
  // dropped: a wrong path leaves the server as it was.
  if (!empty && !fs::is_directory(path, error)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint ", path.string()));
  }
  if (!empty && !fs::is_regular_file(path / "CURRENT", error)) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path.string(), " is not a RocksDB database (no CURRENT)"));
  }
  const absl::Time start = absl::Now();
  StopFlusher();

  // Take the old state out under the lock, let it go outside: stats()
  // answers (for an empty server) while the store closes and the copy is
  // made, instead of waiting for the disk.
  std::vector<std::unique_ptr<Table>> old_tables;
  std::unique_ptr<WriteQueue> old_queue;
  std::unique_ptr<KvStore> old_store;
  std::unique_ptr<MemoryBudget> old_budget;
  proto::JobSpec job;
  {
    absl::WriterMutexLock lock(&state_mu_);
    old_tables = std::exchange(tables_, {});
    // Their refused updates stay counted (in the same step, so that stats()
    // never sees the count fall).
    absl::MutexLock counts_lock(&mu_);
    for (const auto& table : old_tables) dropped_updates_refused_ += table->stats().updates_refused;
    old_queue = std::move(queue_);
    old_store = std::move(store_);
    old_budget = std::exchange(budget_, std::make_unique<MemoryBudget>(0));
    job = job_;
  }
  // The tables' changed rows are discarded, never queued: the database
  // they would reach is being replaced. The queue writes only what earlier
  // flushes queued, into the old database, before it closes.
  old_tables.clear();
  old_queue.reset();
  // The journal completes the old database: it goes into it before the copy
  // replaces it, so that no journal outlives its database (a crash in the
  // copy leaves the old database complete, or the checkpoint, and no journal).
  Status restored = ApplyJournalBeforeRestore(options_, old_store.get());
  if (!restored.ok()) restored = Annotate(restored, "discarding the journal before the restore");
  old_store.reset();
  old_budget.reset();

  if (!restored.ok()) {
    // The old database and its journal stay, and are reopened below.
  } else if (empty) {
    fs::remove_all(DatabaseDir(options_.data_dir), error);
    if (error) {
      restored = absl::UnavailableError(absl::StrCat("cannot empty ", DatabaseDir(options_.data_dir),
                                                     ": ", error.message()));
    }
  } else {
    restored = RestoreRocksCheckpoint(path.string(), DatabaseDir(options_.data_dir));
  }
  if (!restored.ok()) {
    restored = Annotate(restored, absl::StrCat("restore of checkpoint ", path.string(),
                                               " (the last flushed state stays)"));
  }
  // Reopen what DATA_DIR/db holds now: the checkpoint, or after a failed
  // copy the old database.
  // (Declared in the order they may be destroyed in reverse.)
  StatusOr<std::unique_ptr<KvStore>> store = OpenDatabase(options_);
  auto budget = std::make_unique<MemoryBudget>(options_.memory_budget_mb << 20);
  std::unique_ptr<WriteQueue> queue;
  StatusOr<std::vector<std::unique_ptr<Table>>> tables = absl::UnknownError("not made");
  Status reopened = store.status();
  if (store.ok()) {
    StatusOr<std::unique_ptr<WriteQueue>> opened = OpenQueue(options_, store->get());
    if (opened.ok()) {
      queue = *std::move(opened);
      tables = MakeTables(job, options_, store->get(), queue.get(), budget.get(), &pass_);
      reopened = tables.status();
    } else {
      reopened = opened.status();
    }
  }
  {
    absl::WriterMutexLock lock(&state_mu_);
    if (reopened.ok()) {
      store_ = *std::move(store);
      queue_ = std::move(queue);
      budget_ = std::move(budget);
      tables_ = *std::move(tables);
      broken_ = absl::OkStatus();
    } else {
      reopened = Annotate(reopened, "reopening the database after a restore; no tables left");
      broken_ = reopened;
    }
  }
  if (!reopened.ok()) {
    LOG(ERROR) << reopened;
    return reopened;
  }
  StartFlusher();
  RETURN_IF_ERROR(restored);
  return CheckpointInfo{.path = path.string(),
                        .bytes = DirectoryBytes(path.string()),
                        .duration = absl::Now() - start};
}

Status ServerStorage::status() const {
  absl::ReaderMutexLock lock(&state_mu_);
  return broken_;
}

Status ServerStorage::NoteWriteError(Status error) {
  absl::MutexLock lock(&mu_);
  if (write_error_.empty()) write_error_ = std::string(error.message());
  return error;
}

std::string ServerStorage::write_error() const {
  absl::ReaderMutexLock state_lock(&state_mu_);
  absl::MutexLock lock(&mu_);
  if (write_error_.empty() && queue_ != nullptr) {
    if (const Status failed = queue_->status(); !failed.ok()) {
      write_error_ = absl::StrCat("writing rows to ", DatabaseDir(options_.data_dir), ": ",
                                  failed.message());
    }
  }
  return write_error_;
}

std::string ServerStorage::stored_job() const {
  if (options_.data_dir.empty()) return "";
  std::ifstream in(fs::path(options_.data_dir) / "JOB");
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

std::optional<uint32_t> ServerStorage::stored_server_id() const {
  if (options_.data_dir.empty()) return std::nullopt;
  const fs::path file = fs::path(options_.data_dir) / "SERVER";
  std::ifstream in(file);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  uint32_t id = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &id)) {
    LOG(WARNING) << file.string() << " does not hold a server id ('" << line << "'); ignored";
    return std::nullopt;
  }
  return id;
}

std::string ServerStorage::stored_server_credential() const {
  if (options_.data_dir.empty()) return "";
  std::ifstream in(fs::path(options_.data_dir) / "SERVER_CREDENTIAL");
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  const absl::string_view hex = absl::StripAsciiWhitespace(line);
  if (hex.empty() || hex.size() % 2 != 0 ||
      !std::all_of(hex.begin(), hex.end(), [](char c) { return absl::ascii_isxdigit(c); })) {
    return "";
  }
  return absl::HexStringToBytes(hex);
}

Status ServerStorage::SetServerId(uint32_t id, const std::string& credential) {
  if (!options_.data_dir.empty()) {
    // The credential first: a SERVER file never names a slot whose
    // credential a crash between the two lost.
    if (!credential.empty()) {
      RETURN_IF_ERROR(WriteFileAtomically(
          (fs::path(options_.data_dir) / "SERVER_CREDENTIAL").string(),
          absl::StrCat(absl::BytesToHexString(credential), "\n"), 0600));
    }
    RETURN_IF_ERROR(WriteFileAtomically((fs::path(options_.data_dir) / "SERVER").string(),
                                        absl::StrCat(id, "\n")));
  }
  absl::MutexLock lock(&mu_);
  server_id_ = id;
  return absl::OkStatus();
}

StorageStats ServerStorage::stats() const {
  StorageStats stats;
  absl::ReaderMutexLock state_lock(&state_mu_);
  for (const auto& table : tables_) {
    const TableStats t = table->stats();
    stats.rows_in_memory += t.rows_in_memory;
    stats.memory_bytes += t.memory_bytes;
    stats.hits += t.hits;
    stats.misses += t.misses;
    stats.evictions += t.evictions;
    stats.updates_refused += t.updates_refused;
    stats.rows_admitted += t.rows_admitted;
    stats.updates_rejected += t.updates_rejected;
    stats.admission_candidates += t.admission_candidates;
    if (store_ != nullptr) stats.rows_on_disk += store_->ApproximateRows(table->spec().id());
  }
  if (store_ != nullptr) {
    stats.disk_bytes = store_->ApproximateDiskBytes() + queue_->journal_bytes();
    stats.store_memory_bytes = store_->ApproximateMemoryBytes();
  }
  absl::MutexLock lock(&mu_);
  stats.last_flush_ms = last_flush_ms_;
  stats.flushes = flushes_;
  stats.updates_refused += dropped_updates_refused_;
  stats.rows_expired = rows_expired_;
  stats.passes_done = passes_due_.value_or(0);
  return stats;
}

}  // namespace eps
