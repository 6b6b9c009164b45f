#include "cluster/placement.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace eps {

proto::ClusterMap MakeClusterMap(uint64_t version, uint32_t num_partitions,
                                 const std::vector<proto::ServerInfo>& servers) {
  proto::ClusterMap map;
  map.set_version(version);
  map.set_num_partitions(num_partitions);
  for (const proto::ServerInfo& server : servers) *map.add_servers() = server;
  for (uint32_t p = 0; p < num_partitions; ++p) {
    map.add_partition_owner(servers[p % servers.size()].id());
  }
  return map;
}

StatusOr<Placement> Placement::FromProto(const proto::ClusterMap& map) {
  if (map.num_partitions() == 0) {
    return absl::InvalidArgumentError("cluster map has no partitions");
  }
  if (static_cast<uint32_t>(map.partition_owner_size()) != map.num_partitions()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster map lists ", map.partition_owner_size(), " owners for ",
                     map.num_partitions(), " partitions"));
  }
  Placement placement;
  placement.version_ = map.version();
  absl::flat_hash_map<uint32_t, size_t> index_of;
  for (const proto::ServerInfo& server : map.servers()) {
    if (!index_of.emplace(server.id(), placement.servers_.size()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster map lists server ", server.id(), " twice"));
    }
    placement.servers_.push_back(server);
  }
  placement.owner_index_.reserve(map.num_partitions());
  for (uint32_t p = 0; p < map.num_partitions(); ++p) {
    auto it = index_of.find(map.partition_owner(p));
    if (it == index_of.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster map: partition ", p, " owned by unknown server ", map.partition_owner(p)));
    }
    placement.owner_index_.push_back(static_cast<uint32_t>(it->second));
  }
  return placement;
}

std::vector<uint32_t> Placement::PartitionsOf(uint32_t server_id) const {
  std::vector<uint32_t> partitions;
  for (uint32_t p = 0; p < owner_index_.size(); ++p) {
    if (servers_[owner_index_[p]].id() == server_id) partitions.push_back(p);
  }
  return partitions;
}

}  // namespace eps
