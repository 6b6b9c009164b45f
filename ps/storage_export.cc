// ServerStorage's model files (docs/model-format.md): Export writes every
// row this server holds, resident or not, as .npy parts of the export;
// Import loads the rows it owns of one (the warm start).

#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/model_format.h"
#include "cluster/placement.h"
#include "core/logging.h"
#include "core/npy.h"
#include "ps/storage.h"

namespace eps {

namespace fs = std::filesystem;

namespace {

// One table's part of an export: its keys and rows, written in pieces.
class ExportPart {
 public:
  static StatusOr<ExportPart> Create(const std::string& dir, const Table& table,
                                     uint32_t server_id) {
    const fs::path tables = fs::path(dir) / "params" / table.spec().name();
    std::error_code error;
    fs::create_directories(tables, error);
    if (error) {
      return absl::UnavailableError(
          absl::StrCat("cannot create export dir ", tables.string(), ": ", error.message()));
    }
    const std::string stem = (tables / absl::StrCat("part-", server_id)).string();
    ExportPart part;
    part.dense_ = table.spec().kind() == proto::DENSE;
    part.row_floats_ = table.row_floats();
    ASSIGN_OR_RETURN(part.keys_, NpyWriter::Create(stem + ".keys.npy", "<u8", {}));
    ASSIGN_OR_RETURN(part.rows_, NpyWriter::Create(stem + ".rows.npy", "<f4", {part.row_floats_}));
    return part;
  }

  // `row`: row_floats floats, not necessarily aligned (a store's value).
  Status Add(uint64_t key, const void* row) {
    keys_buffer_.push_back(dense_ ? DecodeDenseChunkKey(key).chunk : key);
    const size_t at = rows_buffer_.size();
    rows_buffer_.resize(at + row_floats_);
    std::memcpy(rows_buffer_.data() + at, row, sizeof(float) * row_floats_);
    return keys_buffer_.size() >= kRowsPerWrite ? Write() : absl::OkStatus();
  }

  // Returns the rows written.
  StatusOr<uint64_t> Close() {
    RETURN_IF_ERROR(Write());
    RETURN_IF_ERROR(keys_->Close());
    RETURN_IF_ERROR(rows_->Close());
    return keys_->rows();
  }

 private:
  static constexpr size_t kRowsPerWrite = 4096;

  Status Write() {
    RETURN_IF_ERROR(keys_->Append(keys_buffer_.data(), keys_buffer_.size()));
    RETURN_IF_ERROR(rows_->Append(rows_buffer_.data(), keys_buffer_.size()));
    keys_buffer_.clear();
    rows_buffer_.clear();
    return absl::OkStatus();
  }

  bool dense_ = false;
  uint32_t row_floats_ = 0;
  std::unique_ptr<NpyWriter> keys_;
  std::unique_ptr<NpyWriter> rows_;
  std::vector<uint64_t> keys_buffer_;
  std::vector<float> rows_buffer_;
};

}  // namespace

StatusOr<ExportInfo> ServerStorage::Export(const std::string& dir,
                                           std::optional<uint32_t> passes_done,
                                           const std::function<bool(uint64_t)>& keep) {
  std::optional<uint32_t> server_id;
  {
    absl::MutexLock lock(&mu_);
    server_id = server_id_;
  }
  if (!server_id.has_value()) {
    return absl::FailedPreconditionError("no server id yet: nothing to export");
  }
  absl::ReaderMutexLock state_lock(&state_mu_);
  if (!broken_.ok()) return broken_;
  if (tables_.empty()) return absl::FailedPreconditionError("no tables yet: nothing to export");
  const absl::Time start = absl::Now();
  if (passes_done.has_value()) {
    NotePassesDone(*passes_done);
    RETURN_IF_ERROR_CTX(ExpireLocked(*passes_done), "deleting expired rows before the export");
  }
  if (store_ != nullptr) RETURN_IF_ERROR(FlushLocked(/*journal_only=*/false));
  ExportInfo info;
  for (const std::unique_ptr<Table>& table : tables_) {
    ASSIGN_OR_RETURN(ExportPart part, ExportPart::Create(dir, *table, *server_id));
    if (store_ != nullptr) {
      // Every row is in the store once flushed; rows in memory are the same.
      // (A stored row may end in its last pass, which the export leaves out.)
      const size_t row_bytes = sizeof(float) * table->stored_floats();
      RETURN_IF_ERROR(store_->Scan(table->spec().id(), [&](uint64_t key, absl::string_view value) {
        if (value.size() != row_bytes) {
          return absl::DataLossError(absl::StrCat("key ", key, " of table '", table->spec().name(),
                                                  "' holds ", value.size(), " bytes, expected ",
                                                  row_bytes));
        }
        return keep && !keep(key) ? absl::OkStatus() : part.Add(key, value.data());
      }));
    } else {
      Status added;
      table->VisitResident([&](uint64_t key, const float* row) {
        if (added.ok() && (!keep || keep(key))) added = part.Add(key, row);
      });
      RETURN_IF_ERROR(added);
    }
    ASSIGN_OR_RETURN(uint64_t rows, part.Close());
    info.rows += rows;
    info.bytes += rows * (sizeof(uint64_t) + sizeof(float) * table->row_floats());
  }
  info.duration = absl::Now() - start;
  return info;
}

StatusOr<ImportInfo> ServerStorage::Import(const std::string& dir,
                                           const std::function<bool(uint64_t)>& owned,
                                           bool with_state) {
  ASSIGN_OR_RETURN(const nlohmann::json manifest, ReadModelManifest(dir));
  absl::ReaderMutexLock state_lock(&state_mu_);
  if (!broken_.ok()) return broken_;
  if (tables_.empty()) return absl::FailedPreconditionError("no tables yet to import into");
  const absl::Time start = absl::Now();
  ImportInfo info;
  for (const std::unique_ptr<Table>& table : tables_) {
    const proto::TableSpec& spec = table->spec();
    const nlohmann::json* entry = FindModelParam(manifest, spec.name());
    const bool dense = spec.kind() == proto::DENSE;
    const uint64_t size = dense ? spec.dense_size() : 0;
    const auto number = [&](const char* key) {
      return entry->contains(key) && (*entry)[key].is_number_unsigned()
                 ? (*entry)[key].get<uint64_t>()
                 : ~uint64_t{0};
    };
    if (entry == nullptr || entry->value("kind", "") != (dense ? "dense" : "embedding") ||
        number("dim") != spec.dim() || number("size") != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job.init_from: ", dir, " has no ", dense ? "dense tensor" : "embedding table", " '",
          spec.name(), "' of ", dense ? absl::StrCat(size, " floats in chunks of ") : "",
          spec.dim(), dense ? "" : " floats per row",
          ", which this job's model has: a model of another type or size"));
    }
    const uint32_t width = with_state ? table->row_floats() : spec.dim();
    std::vector<uint64_t> keys;
    std::vector<float> values;
    RETURN_IF_ERROR(ReadModelParam(
        dir, *entry, spec.dim(),
        [&](const uint64_t* ids, const float* rows, uint64_t n, uint64_t stride) -> Status {
          if (with_state && stride != table->row_floats()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "job.init_from: the rows of '", spec.name(), "' in ", dir, " hold ",
                stride - spec.dim(), " floats of optimizer state, this job's optimizer keeps ",
                table->row_floats() - spec.dim(),
                ": another optimizer; set job.init_optimizer_state = false to start it afresh"));
          }
          keys.clear();
          values.clear();
          for (uint64_t r = 0; r < n; ++r) {
            if (dense && ids[r] >= DenseChunkCount(size, spec.dim())) {
              return absl::DataLossError(absl::StrCat(dir, ": chunk ", ids[r], " of '",
                                                      spec.name(), "' is past its end"));
            }
            const uint64_t key = dense ? DenseChunkKey(spec.id(), ids[r]) : ids[r];
            if (!owned(key)) continue;
            keys.push_back(key);
            values.insert(values.end(), rows + r * stride, rows + r * stride + width);
          }
          RETURN_IF_ERROR(PutLocked(*table, keys, values, width));
          info.rows += keys.size();
          return absl::OkStatus();
        }));
  }
  if (store_ != nullptr) RETURN_IF_ERROR(FlushLocked(/*journal_only=*/false));
  info.duration = absl::Now() - start;
  return info;
}

StatusOr<PartitionPage> ServerStorage::ReadPartition(uint32_t partition,
                                                    uint32_t num_partitions,
                                                    const PartitionCursor& from,
                                                    size_t max_rows, size_t max_scanned) {
  if (num_partitions == 0 || partition >= num_partitions || max_rows == 0) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", partition, " of ",
                                                   num_partitions, ", ", max_rows, " rows a page"));
  }
  absl::ReaderMutexLock state_lock(&state_mu_);
  if (!broken_.ok()) return broken_;
  if (store_ == nullptr) {
    return absl::FailedPreconditionError(
        "this server keeps no store to read a partition from (start it with --data-dir)");
  }
  if (tables_.empty()) return absl::FailedPreconditionError("no tables yet: no partition to read");
  PartitionPage page;
  size_t rows = 0;
  size_t scanned = 0;
  for (uint32_t t = from.table; t < tables_.size(); ++t) {
    const size_t bytes = sizeof(float) * tables_[t]->stored_floats();
    TableRows run;
    run.table = t;
    const uint64_t first = t == from.table ? from.key : 0;
    // A table grouped by partition reads the partition's range; one in
    // key order (made before that layout) is filtered, a budget of keys a
    // page.
    const bool grouped = store_->Partitions(t) == num_partitions;
    const auto visit = [&](uint64_t key, absl::string_view value) -> Status {
      if (!grouped) {
        if (scanned++ == max_scanned) {
          page.next = PartitionCursor{.table = t, .key = key};
          return absl::CancelledError("the page has scanned enough");
        }
        if (PartitionOf(key, num_partitions) != partition) return absl::OkStatus();
      }
      if (rows == max_rows) {
        page.next = PartitionCursor{.table = t, .key = key};
        return absl::CancelledError("the page is full");
      }
      if (value.size() != bytes) {
        return absl::DataLossError(absl::StrCat("key ", key, " of table ", t, " holds ",
                                                value.size(), " bytes, expected ", bytes));
      }
      run.keys.push_back(key);
      const size_t at = run.values.size();
      run.values.resize(at + bytes / sizeof(float));
      std::memcpy(run.values.data() + at, value.data(), bytes);
      ++rows;
      return absl::OkStatus();
    };
    const Status scan = grouped ? store_->ScanPartition(t, partition, first, visit)
                                : store_->ScanFrom(t, first, visit);
    if (!run.keys.empty()) page.tables.push_back(std::move(run));
    if (page.next.has_value()) return page;
    RETURN_IF_ERROR(scan);
  }
  return page;
}

StatusOr<std::vector<std::vector<uint64_t>>> ServerStorage::UnstoredKeys(
    const std::function<bool(uint64_t key)>& keep) {
  absl::ReaderMutexLock state_lock(&state_mu_);
  if (!broken_.ok()) return broken_;
  if (store_ == nullptr || tables_.empty()) {
    return absl::FailedPreconditionError(
        "no store or no tables yet: no rows the store lacks to name");
  }
  std::vector<std::vector<uint64_t>> keys(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    tables_[t]->VisitUnstored([&](uint64_t key) {
      if (keep(key)) keys[t].push_back(key);
    });
  }
  return keys;
}

StatusOr<TableRows> ServerStorage::ReadRows(uint32_t table, std::span<const uint64_t> keys) {
  absl::ReaderMutexLock state_lock(&state_mu_);
  if (!broken_.ok()) return broken_;
  if (store_ == nullptr) {
    return absl::FailedPreconditionError(
        "this server keeps no store to read rows from (start it with --data-dir)");
  }
  if (table >= tables_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no table ", table, " (the job has ",
                                                   tables_.size(), ")"));
  }
  Table& from = *tables_[table];
  const size_t floats = from.stored_floats();
  TableRows rows;
  rows.table = table;
  rows.values.resize(keys.size() * floats);
  std::vector<bool> found;
  RETURN_IF_ERROR(from.Read(keys, rows.values, &found));
  // The found rows, moved up over the missing ones.
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!found[i]) continue;
    std::memmove(rows.values.data() + rows.keys.size() * floats, rows.values.data() + i * floats,
                 floats * sizeof(float));
    rows.keys.push_back(keys[i]);
  }
  rows.values.resize(rows.keys.size() * floats);
  return rows;
}

Status ServerStorage::PutLocked(Table& table, std::span<const uint64_t> keys,
                                std::span<const float> values, uint32_t width) {
  RETURN_IF_ERROR(table.Put(keys, values, width));
  // Changed rows leave memory only once written.
  if (budget_ != nullptr && budget_->over()) RETURN_IF_ERROR(FlushLocked(/*journal_only=*/false));
  return absl::OkStatus();
}

Status ServerStorage::WriteTableRows(uint32_t table, std::span<const uint64_t> keys,
                                     std::span<const float> values) {
  absl::ReaderMutexLock state_lock(&state_mu_);
  if (!broken_.ok()) return broken_;
  if (tables_.empty()) return absl::FailedPreconditionError("no tables yet to write rows into");
  if (table >= tables_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows of table ", table, ", which this job lacks"));
  }
  Table& into = *tables_[table];
  const uint32_t width = into.stored_floats();
  if (values.size() != keys.size() * width) {
    return absl::InvalidArgumentError(
        absl::StrCat(keys.size(), " rows of table '", into.spec().name(), "' come with ",
                     values.size(), " floats; the table stores ", width, " a row"));
  }
  return PutLocked(into, keys, values, width);
}

}  // namespace eps
