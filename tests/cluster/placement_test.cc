// Tests cluster/placement.h: partitions, cluster maps and dense chunk keys.

#include "cluster/placement.h"

#include <cmath>
#include <set>
#include <vector>

#include "core/hashing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<proto::ServerInfo> Servers(const std::vector<uint32_t>& ids) {
  std::vector<proto::ServerInfo> servers;
  for (uint32_t id : ids) {
    proto::ServerInfo info;
    info.set_id(id);
    info.set_endpoint("tcp://127.0.0.1:" + std::to_string(40000 + id));
    servers.push_back(info);
  }
  return servers;
}

// Pearson's chi-square statistic of `counts` against a uniform spread.
double ChiSquare(const std::vector<int>& counts) {
  double total = 0;
  for (int c : counts) total += c;
  const double expected = total / counts.size();
  double chi = 0;
  for (int c : counts) chi += (c - expected) * (c - expected) / expected;
  return chi;
}

TEST(PartitionOf, IsStableAndInRange) {
  for (uint32_t partitions : {1u, 2u, 7u, 256u, 1u << 20}) {
    for (uint64_t key : {0ULL, 1ULL, 42ULL, ~0ULL, 0x8000000000000000ULL}) {
      const uint32_t p = PartitionOf(key, partitions);
      EXPECT_LT(p, partitions);
      EXPECT_EQ(p, PartitionOf(key, partitions));
    }
  }
  EXPECT_EQ(PartitionOf(12345, 1), 0u);
}

TEST(PartitionOf, GoldenValues) {
  // Placement is persistent state (checkpoints, cluster maps): changing
  // PartitionOf moves every key. If this fails, the change was not safe.
  EXPECT_EQ(PartitionOf(0, 256), 154u);
  EXPECT_EQ(PartitionOf(0x0123456789abcdefULL, 1000), 769u);
}

TEST(PartitionOf, SpreadsSequentialKeysEvenly) {
  // Dense chunk keys are small consecutive integers: the worst case for a
  // plain modulo of structured keys.
  constexpr uint32_t kPartitions = 64;
  constexpr int kKeys = 64 * 1000;
  std::vector<int> counts(kPartitions);
  for (int k = 0; k < kKeys; ++k) counts[PartitionOf(DenseChunkKey(3, k), kPartitions)]++;
  // 63 degrees of freedom: mean 63, sd ~11.2; 150 is ~8 sd out.
  EXPECT_LT(ChiSquare(counts), 150.0);
}

TEST(PartitionOf, SpreadsStridedKeysEvenly) {
  constexpr uint32_t kPartitions = 256;
  std::vector<int> counts(kPartitions);
  for (uint64_t k = 0; k < 256 * 400; ++k) counts[PartitionOf(k << 20, kPartitions)]++;
  // 255 degrees of freedom: mean 255, sd ~22.6.
  EXPECT_LT(ChiSquare(counts), 255 + 8 * 22.6);
}

TEST(PartitionOf, SpreadsFeatureIdsEvenly) {
  constexpr uint32_t kPartitions = 10;
  std::vector<int> counts(kPartitions);
  for (int v = 0; v < 20000; ++v) {
    counts[PartitionOf(FeatureId(v % 26, std::to_string(v)), kPartitions)]++;
  }
  // 9 degrees of freedom: mean 9, sd ~4.2.
  EXPECT_LT(ChiSquare(counts), 45.0);
}

TEST(DenseChunks, KeysAndCounts) {
  EXPECT_EQ(DenseChunkCount(0, 16), 0u);
  EXPECT_EQ(DenseChunkCount(1, 16), 1u);
  EXPECT_EQ(DenseChunkCount(16, 16), 1u);
  EXPECT_EQ(DenseChunkCount(17, 16), 2u);
  EXPECT_EQ(DenseChunkCount(1000000, 16384), 62u);

  EXPECT_EQ(DenseChunkKey(0, 0), 0u);
  EXPECT_EQ(DenseChunkKey(1, 0), 1ULL << 40);
  EXPECT_EQ(DenseChunkKey(1, 5), (1ULL << 40) | 5);
  // Distinct over tables and chunks.
  std::set<uint64_t> keys;
  for (uint32_t table = 0; table < 4; ++table) {
    for (uint64_t chunk = 0; chunk < 100; ++chunk) keys.insert(DenseChunkKey(table, chunk));
  }
  EXPECT_EQ(keys.size(), 400u);
}

TEST(DenseChunks, DecodeInvertsDenseChunkKey) {
  const uint64_t last_chunk = (uint64_t{1} << kDenseChunkBits) - 1;
  for (uint32_t table : {0u, 1u, 7u, (1u << (64 - kDenseChunkBits)) - 1}) {
    for (uint64_t chunk : {uint64_t{0}, uint64_t{1}, uint64_t{61}, last_chunk}) {
      const DenseChunkId id = DecodeDenseChunkKey(DenseChunkKey(table, chunk));
      EXPECT_EQ(id.table_id, table);
      EXPECT_EQ(id.chunk, chunk);
    }
  }
  // A feature id decodes too; its table id is whatever its high bits say.
  EXPECT_EQ(DecodeDenseChunkKey(~uint64_t{0}).chunk, last_chunk);
}

TEST(MakeClusterMap, RoundRobin) {
  const proto::ClusterMap map = MakeClusterMap(3, 7, Servers({10, 20, 30}));
  EXPECT_EQ(map.version(), 3u);
  EXPECT_EQ(map.num_partitions(), 7u);
  ASSERT_EQ(map.servers_size(), 3);
  EXPECT_EQ(map.servers(1).id(), 20u);
  EXPECT_THAT(map.partition_owner(), ElementsAre(10, 20, 30, 10, 20, 30, 10));
}

TEST(Placement, FromProtoLooksUpOwners) {
  StatusOr<Placement> placement = Placement::FromProto(MakeClusterMap(5, 8, Servers({4, 9})));
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->version(), 5u);
  EXPECT_EQ(placement->num_partitions(), 8u);
  ASSERT_EQ(placement->num_servers(), 2u);
  EXPECT_EQ(placement->server(0).id(), 4u);
  EXPECT_EQ(placement->server(1).endpoint(), "tcp://127.0.0.1:40009");
  EXPECT_THAT(placement->PartitionsOf(4), ElementsAre(0, 2, 4, 6));
  EXPECT_THAT(placement->PartitionsOf(9), ElementsAre(1, 3, 5, 7));
  EXPECT_TRUE(placement->PartitionsOf(77).empty());
  for (uint32_t p = 0; p < 8; ++p) EXPECT_EQ(placement->ServerIndexOfPartition(p), p % 2);
  for (uint64_t key = 0; key < 1000; ++key) {
    EXPECT_EQ(placement->ServerIndexOf(key), PartitionOf(key, 8) % 2);
  }
}

TEST(Placement, UnevenOwnership) {
  proto::ClusterMap map = MakeClusterMap(1, 4, Servers({1, 2}));
  map.set_partition_owner(1, 1);  // server 1 owns 0, 1, 2; server 2 owns 3
  StatusOr<Placement> placement = Placement::FromProto(map);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_THAT(placement->PartitionsOf(1), ElementsAre(0, 1, 2));
  EXPECT_THAT(placement->PartitionsOf(2), ElementsAre(3));
}

TEST(Placement, FromProtoRejectsInconsistentMaps) {
  {
    proto::ClusterMap map = MakeClusterMap(1, 4, Servers({1, 2}));
    map.set_partition_owner(2, 3);  // unknown owner
    StatusOr<Placement> placement = Placement::FromProto(map);
    EXPECT_EQ(placement.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(placement.status().message()), HasSubstr("unknown server 3"));
  }
  {
    proto::ClusterMap map = MakeClusterMap(1, 4, Servers({1, 2}));
    map.add_partition_owner(1);  // five owners for four partitions
    EXPECT_EQ(Placement::FromProto(map).status().code(), absl::StatusCode::kInvalidArgument);
    map.mutable_partition_owner()->Truncate(3);  // three
    EXPECT_EQ(Placement::FromProto(map).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    proto::ClusterMap map = MakeClusterMap(1, 4, Servers({1, 2}));
    *map.add_servers() = Servers({2})[0];  // duplicate server id
    StatusOr<Placement> placement = Placement::FromProto(map);
    EXPECT_EQ(placement.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(placement.status().message()), HasSubstr("twice"));
  }
  {
    proto::ClusterMap map;  // no partitions
    EXPECT_EQ(Placement::FromProto(map).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    proto::ClusterMap map;  // owners but no servers
    map.set_num_partitions(2);
    map.add_partition_owner(0);
    map.add_partition_owner(0);
    EXPECT_EQ(Placement::FromProto(map).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace eps
