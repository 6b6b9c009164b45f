// Placement: which partition a key is in and which server owns it.
//
// key -> partition = PartitionOf(key, P), P fixed per job; partition ->
// server by the master's versioned ClusterMap. Dense tensors are cut into
// chunks whose keys (DenseChunkKey) are placed the same way.
//
// Thread-safety: Placement is immutable after construction; safe for
// concurrent use.

#ifndef EPS_CLUSTER_PLACEMENT_H_
#define EPS_CLUSTER_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/hashing.h"
#include "core/status.h"
#include "proto/eps.pb.h"

namespace eps {

// The partition of `key`. REQUIRES: num_partitions > 0.
inline uint32_t PartitionOf(uint64_t key, uint32_t num_partitions) {
  // Salted so that partitions are independent of any structure in the ids
  // (feature ids are hashes already; dense chunk keys are small integers).
  return static_cast<uint32_t>(Mix64(key ^ 0x7061727469746e6fULL) % num_partitions);
}

// A dense chunk key is the table id above the low kDenseChunkBits bits,
// which hold the chunk index. Keys are stored on servers and in
// checkpoints: never change this.
inline constexpr int kDenseChunkBits = 40;

// The key of chunk `chunk` of the dense tensor stored as table `table_id`.
// REQUIRES: chunk < 2^kDenseChunkBits.
inline uint64_t DenseChunkKey(uint32_t table_id, uint64_t chunk) {
  return (static_cast<uint64_t>(table_id) << kDenseChunkBits) | chunk;
}

// What a dense chunk key names.
struct DenseChunkId {
  uint32_t table_id = 0;
  uint64_t chunk = 0;
};

// The inverse of DenseChunkKey. Any key decodes; whether the table is dense
// and has that many chunks is the caller's to check.
inline DenseChunkId DecodeDenseChunkKey(uint64_t key) {
  return {.table_id = static_cast<uint32_t>(key >> kDenseChunkBits),
          .chunk = key & ((uint64_t{1} << kDenseChunkBits) - 1)};
}

// Number of chunks of `dim` floats a dense tensor of `size` floats needs.
inline uint64_t DenseChunkCount(uint64_t size, uint32_t dim) { return (size + dim - 1) / dim; }

// Builds a cluster map that spreads `num_partitions` partitions round-robin
// over `servers` (in the given order). REQUIRES: servers non-empty.
proto::ClusterMap MakeClusterMap(uint64_t version, uint32_t num_partitions,
                                 const std::vector<proto::ServerInfo>& servers);

// A validated cluster map with O(1) key -> server lookup.
class Placement {
 public:
  // kInvalidArgument if the map is inconsistent (owner ids unknown, wrong
  // number of partitions, duplicate server ids).
  static StatusOr<Placement> FromProto(const proto::ClusterMap& map);

  uint64_t version() const { return version_; }
  uint32_t num_partitions() const { return static_cast<uint32_t>(owner_index_.size()); }
  size_t num_servers() const { return servers_.size(); }
  const proto::ServerInfo& server(size_t index) const { return servers_[index]; }

  // Index (into server(i)) of the server owning `key`.
  size_t ServerIndexOf(uint64_t key) const {
    return owner_index_[PartitionOf(key, num_partitions())];
  }
  // Index of the server owning `partition`.
  size_t ServerIndexOfPartition(uint32_t partition) const { return owner_index_[partition]; }
  // Partitions owned by server id `server_id`.
  std::vector<uint32_t> PartitionsOf(uint32_t server_id) const;

 private:
  uint64_t version_ = 0;
  std::vector<proto::ServerInfo> servers_;
  std::vector<uint32_t> owner_index_;
};

}  // namespace eps

#endif  // EPS_CLUSTER_PLACEMENT_H_
