// What the tests of ps/kv_store.h share: values that name their key and
// version, batched writes and reads, and RocksDB stores opened in a
// directory.

#ifndef EPS_TESTS_PS_KV_STORE_TESTING_H_
#define EPS_TESTS_PS_KV_STORE_TESTING_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ps/kv_store.h"

namespace eps {

// A deterministic value of `bytes` bytes for (key, version): a reader can
// tell which write it sees, and a torn value does not check out.
inline std::string ValueFor(uint64_t key, uint64_t version, size_t bytes) {
  std::string value(bytes, '\0');
  uint64_t state = key * 0x9E3779B97F4A7C15ull + version * 0xBF58476D1CE4E5B9ull + 1;
  for (size_t i = 0; i < bytes; ++i) {
    state ^= state >> 29;
    state *= 0x94D049BB133111EBull;
    value[i] = static_cast<char>(state >> 56);
  }
  if (bytes >= 16) {
    std::memcpy(value.data(), &key, 8);
    std::memcpy(value.data() + 8, &version, 8);
  }
  return value;
}

inline uint64_t VersionOf(const char* value) {
  uint64_t version = 0;
  std::memcpy(&version, value + 8, 8);
  return version;
}

// A KvStore that forwards to another, counts reads and writes, fails them on
// command, and shows every write to `before_write` first (when set).
class FailingKvStore final : public KvStore {
 public:
  explicit FailingKvStore(std::unique_ptr<KvStore> base) : base_(std::move(base)) {}

  std::atomic<bool> fail_reads{false};
  std::atomic<bool> fail_writes{false};
  std::atomic<int> reads{0};
  std::atomic<int> writes{0};
  std::function<void(std::span<const KvWrite>)> before_write;

  using KvStore::CreateTable;
  Status CreateTable(uint32_t table, uint32_t partitions) override {
    return base_->CreateTable(table, partitions);
  }
  uint32_t Partitions(uint32_t table) override { return base_->Partitions(table); }
  Status MultiGet(uint32_t table, std::span<const uint64_t> keys, size_t value_bytes,
                  std::span<char> out, std::vector<bool>* found) override {
    ++reads;
    if (fail_reads) return absl::UnavailableError("injected read failure");
    return base_->MultiGet(table, keys, value_bytes, out, found);
  }
  Status Write(std::span<const KvWrite> batch, bool sync) override {
    ++writes;
    if (before_write) before_write(batch);
    if (fail_writes) return absl::UnavailableError("injected write failure");
    return base_->Write(batch, sync);
  }
  Status ScanFrom(uint32_t table, uint64_t from,
                  const std::function<Status(uint64_t, absl::string_view)>& visit) override {
    if (fail_reads) return absl::UnavailableError("injected read failure");
    return base_->ScanFrom(table, from, visit);
  }
  Status ScanPartition(uint32_t table, uint32_t partition, uint64_t from,
                       const std::function<Status(uint64_t, absl::string_view)>& visit) override {
    if (fail_reads) return absl::UnavailableError("injected read failure");
    return base_->ScanPartition(table, partition, from, visit);
  }
  Status Compact(uint32_t table) override { return base_->Compact(table); }
  Status Checkpoint(const std::string& dir) override { return base_->Checkpoint(dir); }
  uint64_t ApproximateRows(uint32_t table) override { return base_->ApproximateRows(table); }
  uint64_t ApproximateDiskBytes() override { return base_->ApproximateDiskBytes(); }
  uint64_t ApproximateMemoryBytes() override { return base_->ApproximateMemoryBytes(); }

 private:
  std::unique_ptr<KvStore> base_;
};

inline std::vector<KvWrite> WritesFor(uint32_t table, const std::vector<uint64_t>& keys,
                                      const std::vector<std::string>& values) {
  std::vector<KvWrite> writes;
  for (size_t i = 0; i < keys.size(); ++i) writes.push_back({table, keys[i], values[i]});
  return writes;
}

// The result of a MultiGet: each key's value, or nullopt when missing.
struct Read {
  Status status;
  std::vector<std::optional<std::string>> values;
};

inline Read Get(KvStore& store, uint32_t table, const std::vector<uint64_t>& keys,
                size_t value_bytes) {
  std::vector<char> out(keys.size() * value_bytes, '\x5A');
  std::vector<bool> found(3, true);  // MultiGet must resize it
  Read read;
  read.status = store.MultiGet(table, keys, value_bytes, out, &found);
  if (!read.status.ok()) return read;
  EXPECT_EQ(found.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    std::string bytes(out.data() + i * value_bytes, value_bytes);
    if (found[i]) {
      read.values.emplace_back(std::move(bytes));
    } else {
      EXPECT_EQ(bytes, std::string(value_bytes, '\x5A')) << "missing key " << keys[i];
      read.values.emplace_back(std::nullopt);
    }
  }
  return read;
}

// A store with the smallest cache and memtables (1 MiB each), so that a
// few MiB of rows fill its memtables and flush.
inline RocksKvStoreOptions SmallStoreOptions(const std::string& dir) {
  RocksKvStoreOptions options;
  options.dir = dir;
  options.block_cache_mb = 1;
  options.write_buffer_mb = 1;
  return options;
}

inline std::unique_ptr<KvStore> OpenRocks(const std::string& dir) {
  RocksKvStoreOptions options;
  options.dir = dir;
  StatusOr<std::unique_ptr<KvStore>> store = OpenRocksKvStore(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

}  // namespace eps

#endif  // EPS_TESTS_PS_KV_STORE_TESTING_H_
