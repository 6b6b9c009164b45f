// The in-memory fake of KvStore (ps/kv_store.h): same contract, nothing
// durable. Tests and the conformance suite use it in place of RocksDB.

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cluster/placement.h"
#include "core/logging.h"
#include "ps/kv_store.h"

namespace eps {
namespace {

class MemoryKvStore final : public KvStore {
 public:
  using KvStore::CreateTable;
  Status CreateTable(uint32_t table, uint32_t partitions) override {
    absl::MutexLock lock(&mu_);
    const auto [it, added] = tables_.try_emplace(table);
    if (added) it->second.partitions = partitions;
    return CheckTableLayout(table, it->second.partitions, partitions);
  }

  uint32_t Partitions(uint32_t table) override {
    absl::ReaderMutexLock lock(&mu_);
    auto it = tables_.find(table);
    return it == tables_.end() ? 0 : it->second.partitions;
  }

  Status MultiGet(uint32_t table, std::span<const uint64_t> keys, size_t value_bytes,
                  std::span<char> out, std::vector<bool>* found) override {
    CHECK(found != nullptr);
    CHECK_EQ(out.size(), keys.size() * value_bytes);
    // One reader lock over the whole batch: a consistent snapshot.
    absl::ReaderMutexLock lock(&mu_);
    auto table_it = tables_.find(table);
    if (table_it == tables_.end()) return absl::NotFoundError(absl::StrCat("no table ", table));
    const Rows& rows = table_it->second.rows;
    found->assign(keys.size(), false);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = rows.find(keys[i]);
      if (it == rows.end()) continue;
      if (it->second.size() != value_bytes) {
        return absl::DataLossError(absl::StrCat("key ", keys[i], " of table ", table, " holds ",
                                                it->second.size(), " bytes, expected ",
                                                value_bytes));
      }
      std::memcpy(out.data() + i * value_bytes, it->second.data(), value_bytes);
      (*found)[i] = true;
    }
    return absl::OkStatus();
  }

  Status Write(std::span<const KvWrite> writes, bool sync) override {
    absl::MutexLock lock(&mu_);
    // All tables are checked first: an unknown one writes nothing.
    for (const KvWrite& write : writes) {
      if (!tables_.contains(write.table)) {
        return absl::NotFoundError(absl::StrCat("no table ", write.table));
      }
    }
    for (const KvWrite& write : writes) {
      Rows& rows = tables_[write.table].rows;
      if (write.erase) {
        rows.erase(write.key);
      } else {
        rows[write.key].assign(write.value.data(), write.value.size());
      }
    }
    return absl::OkStatus();
  }

  Status ScanFrom(uint32_t table, uint64_t from,
                  const std::function<Status(uint64_t, absl::string_view)>& visit) override {
    std::vector<std::tuple<uint32_t, uint64_t, std::string>> rows;
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = tables_.find(table);
      if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("no table ", table));
      const uint32_t partitions = it->second.partitions;
      if (partitions != 0 && from != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table ", table, " is grouped by partition: a scan of it starts at key 0, not ",
            from));
      }
      for (const auto& [key, value] : it->second.rows) {
        if (key < from) continue;
        rows.emplace_back(partitions == 0 ? 0 : PartitionOf(key, partitions), key, value);
      }
    }
    // The table's order: by partition (all 0 in key order), then key.
    std::sort(rows.begin(), rows.end());
    for (const auto& [partition, key, value] : rows) RETURN_IF_ERROR(visit(key, value));
    return absl::OkStatus();
  }

  Status ScanPartition(uint32_t table, uint32_t partition, uint64_t from,
                       const std::function<Status(uint64_t, absl::string_view)>& visit) override {
    std::vector<std::pair<uint64_t, std::string>> rows;
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = tables_.find(table);
      if (it == tables_.end()) return absl::NotFoundError(absl::StrCat("no table ", table));
      const uint32_t partitions = it->second.partitions;
      if (partitions == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("table ", table, " is stored in key order, not by partition"));
      }
      if (partition >= partitions) {
        return absl::InvalidArgumentError(absl::StrCat("partition ", partition, " of table ",
                                                       table, " (of ", partitions, ")"));
      }
      for (const auto& row : it->second.rows) {
        if (row.first >= from && PartitionOf(row.first, partitions) == partition) {
          rows.push_back(row);
        }
      }
    }
    std::sort(rows.begin(), rows.end());
    for (const auto& [key, value] : rows) RETURN_IF_ERROR(visit(key, value));
    return absl::OkStatus();
  }

  Status Compact(uint32_t table) override {
    absl::ReaderMutexLock lock(&mu_);
    if (!tables_.contains(table)) return absl::NotFoundError(absl::StrCat("no table ", table));
    return absl::OkStatus();
  }

  Status Checkpoint(const std::string& dir) override {
    return absl::UnimplementedError("the in-memory kv store cannot checkpoint");
  }

  uint64_t ApproximateRows(uint32_t table) override {
    absl::ReaderMutexLock lock(&mu_);
    auto it = tables_.find(table);
    return it == tables_.end() ? 0 : it->second.rows.size();
  }

  uint64_t ApproximateDiskBytes() override { return 0; }
  uint64_t ApproximateMemoryBytes() override { return 0; }

 private:
  using Rows = absl::flat_hash_map<uint64_t, std::string>;
  struct StoredTable {
    uint32_t partitions = 0;  // as RocksDB's layout: the order of a scan
    Rows rows;
  };

  absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, StoredTable> tables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<KvStore> NewMemoryKvStore() { return std::make_unique<MemoryKvStore>(); }

}  // namespace eps
