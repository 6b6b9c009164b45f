#include "master/membership.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cluster/placement.h"
#include "core/logging.h"
#include "rpc/message.h"

namespace eps {

const char* PeerStateName(PeerState state) {
  switch (state) {
    case PeerState::kAlive: return "alive";
    case PeerState::kDead: return "dead";
    case PeerState::kLeft: return "left";
    case PeerState::kFenced: return "fenced";
  }
  return "unknown";
}

namespace {

// Worker registrations admitted per second, once master.max_workers
// registered at once.
double RegistrationsPerS(int64_t max_workers) {
  return std::max(8.0, static_cast<double>(max_workers) / 8);
}

// A heartbeat numbered `seq` (HeartbeatRequest.seq) at or below `*last`,
// the last one applied, is stale; otherwise it becomes the last. 0 (an
// unnumbered sender) is never stale.
bool StaleHeartbeat(uint64_t seq, uint64_t* last) {
  if (seq == 0) return false;
  if (seq <= *last) return true;
  *last = seq;
  return false;
}

}  // namespace

Membership::Membership(const JobConfig& job, EventSink* events)
    : job_(job),
      events_(events),
      // Full at the first registration (refilled from the infinite past).
      registrations_(static_cast<double>(job.MaxWorkers()), RegistrationsPerS(job.MaxWorkers()),
                     absl::InfinitePast()) {}

StatusOr<Membership::Claim> Membership::ClaimSlot(const proto::RegisterServerRequest& request) {
  for (auto& [id, server] : servers_) {
    if (server.endpoint == request.endpoint() && server.pid == request.pid() &&
        server.instance == request.instance() && server.state == PeerState::kAlive &&
        server.seen) {
      return Claim{.slot = id, .retried = true};
    }
  }
  if (const uint32_t slot = request.stored_server_id();
      (request.rejoin() || request.has_stored_server_id()) && left_.contains(slot)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ps[", slot, "] was drained and left the job: this server (", request.endpoint(),
        ") exits; to add a server, start one on a fresh --data-dir"));
  }
  if (request.rejoin()) {
    // The same process, back after its lease ran out (cut off, stopped):
    // its slot is its own again unless another process took it meanwhile.
    const uint32_t slot = request.stored_server_id();
    auto it = servers_.find(slot);
    if (it == servers_.end() || it->second.endpoint != request.endpoint() ||
        (it->second.pid != 0 && it->second.pid != request.pid())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ps[", slot, "] ",
          it == servers_.end() ? std::string("is no longer a slot of this job")
                               : absl::StrCat("is served by ", it->second.endpoint, " now"),
          ": this server (", request.endpoint(),
          ") was replaced while it was away, and exits"));
    }
    if (it->second.state == PeerState::kAlive) return Claim{.slot = slot, .retried = true};
    return Claim{.slot = slot};
  }
  if (request.has_stored_server_id()) {
    // A server restarted on its --data-dir takes its own slot back.
    const uint32_t slot = request.stored_server_id();
    auto it = servers_.find(slot);
    if (it == servers_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the server's --data-dir says it was ps[", slot, "] of this job, which has no such "
          "server; give it a fresh --data-dir"));
    }
    if (it->second.state != PeerState::kAlive) return Claim{.slot = slot};
    // A new process (a running server never registers again), back before
    // its lease ran out or after a master restart: what it held since its
    // last checkpoint is gone all the same.
    it->second.state = PeerState::kDead;
    LOG(ERROR) << "ps[" << slot << "] restarted (pid " << it->second.pid << " -> " << request.pid()
               << "): its parameters since the last checkpoint are lost";
    events_->Record("server_dead",
                    {{"server", slot}, {"endpoint", it->second.endpoint}, {"reason", "restarted"}});
    return Claim{.slot = slot, .restarted = true};
  }
  if (!placed() && servers_.size() < static_cast<size_t>(job_.ps.num_servers)) {
    return Claim{.slot = next_server_id_++};
  }
  // A fresh server takes the place of a dead one.
  for (const auto& [id, server] : servers_) {
    if (server.state != PeerState::kAlive) return Claim{.slot = id};
  }
  // Every slot is alive: a new one, which the master fills by moving
  // partitions to it. More slots than partitions would hold nothing.
  if (servers_.size() >= static_cast<size_t>(cluster_map_.num_partitions())) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job has ", servers_.size(), " server(s), all alive, and ",
                     cluster_map_.num_partitions(),
                     " partitions (ps.partitions): one more server would hold none"));
  }
  return Claim{.slot = next_server_id_, .joined = true};
}

bool Membership::AdmitServer(uint32_t slot, const proto::RegisterServerRequest& request,
                             absl::Time now) {
  const bool replaces = servers_.contains(slot);
  next_server_id_ = std::max(next_server_id_, slot + 1);
  if (!replaces && placed()) {
    // A join: listed in the map with no partition yet.
    proto::ServerInfo* info = cluster_map_.add_servers();
    info->set_id(slot);
    info->set_endpoint(request.endpoint());
    cluster_map_.set_version(cluster_map_.version() + 1);
  }
  ServerEntry& server = servers_[slot];
  server = ServerEntry();
  server.endpoint = request.endpoint();
  server.host = request.hostname();
  server.pid = request.pid();
  server.instance = request.instance();
  server.last_seen = now;
  server.seen = true;
  ++generation_;
  ++admissions_;
  if (replaces) {
    // The slot's partitions now live at the new endpoint; the new process
    // has not heard of any fenced worker yet.
    for (proto::ServerInfo& info : *cluster_map_.mutable_servers()) {
      if (info.id() == slot) info.set_endpoint(request.endpoint());
    }
    if (placed()) cluster_map_.set_version(cluster_map_.version() + 1);
    fences_acknowledged_ = 0;
    LOG(INFO) << "ps[" << slot << "] is back: " << request.endpoint() << " ("
              << request.hostname() << " pid " << request.pid() << ", "
              << (request.rejoin()                   ? "the same process, back after it was cut off"
                  : request.has_stored_server_id() ? "its own --data-dir"
                                                   : "a fresh --data-dir")
              << ")";
  } else {
    LOG(INFO) << "ps[" << slot << "] registered: " << request.endpoint() << " ("
              << request.hostname() << " pid " << request.pid() << "), " << servers_.size() << "/"
              << job_.ps.num_servers;
  }
  return replaces;
}

Status Membership::TakeRegistration(absl::Time now) {
  const int64_t max_workers = job_.MaxWorkers();
  if (alive_workers() >= static_cast<size_t>(max_workers)) {
    return ErrorWithReason(absl::StatusCode::kResourceExhausted,
                           absl::StrCat("the job has ", max_workers,
                                        " live workers, its master.max_workers; wait for one "
                                        "to leave (or raise master.max_workers)"),
                           proto::SLOW_DOWN);
  }
  registrations_.Refill(now);
  if (!registrations_.TakeOne()) {
    return ErrorWithReason(absl::StatusCode::kResourceExhausted,
                           absl::StrCat("more than ", RegistrationsPerS(max_workers),
                                        " worker registrations a second; wait and ask again"),
                           proto::SLOW_DOWN);
  }
  return absl::OkStatus();
}

uint32_t Membership::AdmitWorker(const proto::RegisterWorkerRequest& request, absl::Time now) {
  const uint32_t id = next_worker_id_++;
  WorkerEntry& worker = workers_[id];
  worker.host = request.hostname();
  worker.pid = request.pid();
  worker.device = request.device();
  worker.launch_id = request.launch_id();
  worker.last_seen = worker.joined = now;
  ++generation_;
  LOG(INFO) << "worker[" << id << "] joined (" << request.hostname() << " pid " << request.pid()
            << ", " << request.device() << ")";
  events_->Record("worker_joined", {{"worker", id},
                                    {"host", request.hostname()},
                                    {"pid", request.pid()},
                                    {"device", request.device()}});
  return id;
}

StatusOr<const WorkerEntry*> Membership::LiveWorker(const proto::NodeId& sender,
                                                    const std::string& fenced_why,
                                                    absl::Time now) {
  ASSIGN_OR_RETURN(WorkerEntry * worker, Live(sender, fenced_why));
  worker->last_seen = now;
  return worker;
}

StatusOr<WorkerEntry*> Membership::Live(const proto::NodeId& sender,
                                        const std::string& fenced_why) {
  if (sender.role() != proto::ROLE_WORKER) {
    return absl::InvalidArgumentError("only workers may call this");
  }
  auto it = workers_.find(sender.id());
  if (it != workers_.end() && it->second.state == PeerState::kFenced &&
      !it->second.fenced_why.empty()) {
    return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                           absl::StrCat("worker ", sender.id(), " is fenced: ",
                                        it->second.fenced_why, "; it must register again"),
                           proto::FENCED);
  }
  if (it != workers_.end() && it->second.state == PeerState::kFenced) {
    return ErrorWithReason(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat("worker ", sender.id(), " is fenced: a parameter server was lost",
                     fenced_why.empty() ? "" : absl::StrCat(" (", fenced_why, ")"),
                     " and the job is restored from a checkpoint; it must register again"),
        proto::FENCED);
  }
  if (it == workers_.end() || it->second.state != PeerState::kAlive) {
    return ErrorWithReason(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat("worker ", sender.id(),
                     " is fenced (its lease expired, it left, or the master restarted); "
                     "it must register again"),
        proto::FENCED);
  }
  return &it->second;
}

Status Membership::ServerHeartbeat(uint32_t slot, const std::string& endpoint,
                                   const proto::ServerStats& stats, absl::Time now,
                                   bool* first_contact, uint64_t seq) {
  auto it = servers_.find(slot);
  if (it == servers_.end() || it->second.state != PeerState::kAlive) {
    return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                           absl::StrCat("ps[", slot,
                                        "] is not registered (its lease ran out, or the job never "
                                        "had it): register again"),
                           proto::FENCED);
  }
  if (!endpoint.empty() && endpoint != it->second.endpoint) {
    return ErrorWithReason(absl::StatusCode::kFailedPrecondition,
                           absl::StrCat("ps[", slot, "] is now served at ", it->second.endpoint,
                                        "; this server at ", endpoint, " was replaced"),
                           proto::FENCED);
  }
  *first_contact = !it->second.seen;
  if (StaleHeartbeat(seq, &it->second.heartbeat_seq)) return absl::OkStatus();
  it->second.last_seen = now;
  it->second.seen = true;
  it->second.stats = stats;
  return absl::OkStatus();
}

Status Membership::WorkerHeartbeat(const proto::NodeId& sender, const std::string& fenced_why,
                                   proto::WorkerStats stats, uint64_t paused_for,
                                   std::optional<uint64_t> round, absl::Time now,
                                   uint64_t seq) {
  ASSIGN_OR_RETURN(WorkerEntry * worker, Live(sender, fenced_why));
  if (StaleHeartbeat(seq, &worker->heartbeat_seq)) return absl::OkStatus();
  worker->last_seen = now;
  worker->records_per_s = stats.records_per_s();
  worker->records_pushed = std::max(worker->records_pushed, stats.records_pushed());
  uint64_t seen = 0;
  for (const proto::BatchSizeChange& change : worker->stats.batch_size_changes()) {
    seen = std::max(seen, change.seq());
  }
  for (const proto::BatchSizeChange& change : stats.batch_size_changes()) {
    if (change.seq() <= seen) continue;
    events_->Record("batch_size_changed", {{"worker", sender.id()},
                                           {"from", change.from()},
                                           {"to", change.to()},
                                           {"reason", change.reason()}});
  }
  worker->stats = std::move(stats);
  worker->paused_for = paused_for;
  if (round.has_value() && paused_for == *round) worker->held_until = now;
  return absl::OkStatus();
}

void Membership::NoteWorkerMap(uint32_t id, uint64_t version) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second.map_version = std::max(it->second.map_version, version);
}

void Membership::NoteProgress(uint32_t id, absl::Time now, uint64_t records) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second.records += records;
  it->second.last_progress = now;
}

void Membership::ToldToExit(const proto::NodeId& peer) {
  if (peer.role() == proto::ROLE_WORKER) {
    if (auto it = workers_.find(peer.id()); it != workers_.end()) it->second.told_to_exit = true;
  } else if (peer.role() == proto::ROLE_SERVER) {
    if (auto it = servers_.find(peer.id()); it != servers_.end()) it->second.told_to_exit = true;
  }
}

const WorkerEntry* Membership::worker(uint32_t id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

const ServerEntry* Membership::server(uint32_t slot) const {
  auto it = servers_.find(slot);
  return it == servers_.end() ? nullptr : &it->second;
}

Membership::Expired Membership::ExpireLeases(absl::Time now) {
  const absl::Duration lease = absl::Milliseconds(job_.master.lease_ms);
  Expired expired;
  for (auto& [id, worker] : workers_) {
    if (worker.state != PeerState::kAlive || now - worker.last_seen <= lease) continue;
    worker.state = PeerState::kDead;
    LOG(WARNING) << "worker[" << id << "] (" << worker.host << " pid " << worker.pid
                 << ") missed its lease (" << job_.master.lease_ms << " ms): dead";
    events_->Record("worker_dead",
                    {{"worker", id},
                     {"host", worker.host},
                     {"pid", worker.pid},
                     {"silent_ms", absl::ToInt64Milliseconds(now - worker.last_seen)}});
    expired.workers.emplace_back(
        id, worker.records_pushed > worker.records ? worker.records_pushed - worker.records : 0);
  }
  ForgetOldWorkers();
  std::vector<uint32_t> silent;
  for (const auto& [id, server] : servers_) {
    if (server.state == PeerState::kAlive && now - server.last_seen > lease) silent.push_back(id);
  }
  for (uint32_t id : silent) {
    const absl::Duration quiet = now - servers_.at(id).last_seen;
    if (LoseServer(id,
                   absl::StrCat("missed its lease (", job_.master.lease_ms, " ms): silent for ",
                                absl::ToInt64Milliseconds(quiet), " ms"),
                   now)) {
      expired.servers.push_back(id);
    }
  }
  return expired;
}

void Membership::ForgetOldWorkers() {
  size_t gone = 0;
  for (const auto& [id, worker] : workers_) gone += worker.state != PeerState::kAlive;
  // Ids only grow: the oldest go first. One whose fence is still on its way
  // stays (its shards wait for it).
  for (auto it = workers_.begin(); gone > kGoneWorkersKept && it != workers_.end();) {
    if (it->second.state == PeerState::kAlive || awaiting_fence_.contains(it->first)) {
      ++it;
      continue;
    }
    it = workers_.erase(it);
    --gone;
  }
}

bool Membership::LoseServer(uint32_t slot, const std::string& why, absl::Time now) {
  auto it = servers_.find(slot);
  if (it == servers_.end() || it->second.state != PeerState::kAlive) return false;
  ServerEntry& server = it->second;
  server.state = PeerState::kDead;
  ++generation_;
  LOG(ERROR) << "ps[" << slot << "] at " << server.endpoint << " " << why << ": dead";
  events_->Record("server_dead", {{"server", slot},
                                  {"endpoint", server.endpoint},
                                  {"reason", why},
                                  {"silent_ms", absl::ToInt64Milliseconds(now - server.last_seen)}});
  if (placed()) return true;
  // Nothing placed on it yet: another server may simply take its place.
  servers_.erase(it);
  return false;
}

void Membership::AddToFenceList(uint32_t worker) {
  auto it = std::lower_bound(fenced_.begin(), fenced_.end(), worker);
  if (it == fenced_.end() || *it != worker) fenced_.insert(it, worker);
  ++generation_;
}

void Membership::Fence(uint32_t worker, absl::Time now, const std::string& why) {
  AddToFenceList(worker);
  auto it = workers_.find(worker);
  awaiting_fence_.emplace(worker, it != workers_.end() ? it->second.last_seen : now);
  VLOG(1) << "fencing worker[" << worker << "]: " << why;
}

uint64_t Membership::FenceAllAlive(absl::Time now, const std::string& why, bool tell_why) {
  uint64_t retrained = 0;
  for (auto& [id, worker] : workers_) {
    if (worker.state != PeerState::kAlive) continue;
    worker.state = PeerState::kFenced;
    if (tell_why) worker.fenced_why = why;
    if (worker.records_pushed > worker.records) retrained += worker.records_pushed - worker.records;
    Fence(id, now, why);
  }
  return retrained;
}

uint64_t Membership::FenceAlive(uint32_t worker, absl::Time now, const std::string& why) {
  auto it = workers_.find(worker);
  if (it == workers_.end() || it->second.state != PeerState::kAlive) return 0;
  WorkerEntry& entry = it->second;
  entry.state = PeerState::kFenced;
  entry.fenced_alive = true;
  entry.fenced_why = why;
  LOG(WARNING) << "worker[" << worker << "] (" << entry.host << " pid " << entry.pid
               << ") fenced: " << why;
  events_->Record("worker_fenced_alive", {{"worker", worker}, {"reason", why}});
  Fence(worker, now, why);
  return entry.records_pushed > entry.records ? entry.records_pushed - entry.records : 0;
}

StatusOr<bool> Membership::Leave(uint32_t worker) {
  auto it = workers_.find(worker);
  if (it == workers_.end()) return absl::NotFoundError("unknown worker");
  if (it->second.state != PeerState::kAlive) return false;
  it->second.state = PeerState::kLeft;
  LOG(INFO) << "worker[" << worker << "] left";
  events_->Record("worker_left", {{"worker", worker}, {"records", it->second.records}});
  // It committed what it pushed and stops pushing: its shards move now. Its
  // id is still fenced, so nothing it might send later lands.
  AddToFenceList(worker);
  return true;
}

bool Membership::IsFenced(uint32_t worker) const {
  return std::binary_search(fenced_.begin(), fenced_.end(), worker);
}

std::optional<Membership::FenceRound> Membership::PendingFences() const {
  if (!fencing()) return std::nullopt;
  // No server has seen a push before the cluster map exists; with none
  // alive there is nobody to tell (the round is acknowledged at once).
  return FenceRound{.fenced = fenced_, .servers = LiveServers(), .admissions = admissions_};
}

std::vector<std::pair<uint32_t, absl::Time>> Membership::FencesAcknowledged(
    const FenceRound& round) {
  std::vector<std::pair<uint32_t, absl::Time>> released;
  if (round.admissions != admissions_) return released;
  fences_acknowledged_ = std::max(fences_acknowledged_, round.fenced.size());
  for (const ServerAddress& address : round.servers) {
    if (auto server = servers_.find(address.first); server != servers_.end()) {
      server->second.fences_failing_since = absl::InfiniteFuture();
    }
  }
  for (auto it = awaiting_fence_.begin(); it != awaiting_fence_.end();) {
    if (!std::binary_search(round.fenced.begin(), round.fenced.end(), it->first)) {
      ++it;
      continue;
    }
    events_->Record("worker_fenced", {{"worker", it->first}});
    released.emplace_back(it->first, it->second);
    it = awaiting_fence_.erase(it);
  }
  return released;
}

std::vector<uint32_t> Membership::FencesRefused(const FenceRound& round,
                                               const std::vector<ServerAddress>& refused,
                                               absl::Duration patience, absl::Time now) {
  std::vector<uint32_t> overdue;
  for (const ServerAddress& address : round.servers) {
    auto it = servers_.find(address.first);
    if (it == servers_.end() || it->second.endpoint != address.second) continue;
    ServerEntry& server = it->second;
    if (std::find(refused.begin(), refused.end(), address) == refused.end()) {
      server.fences_failing_since = absl::InfiniteFuture();
      continue;
    }
    if (server.fences_failing_since == absl::InfiniteFuture()) server.fences_failing_since = now;
    if (server.state == PeerState::kAlive && now - server.fences_failing_since > patience) {
      overdue.push_back(address.first);
    }
  }
  return overdue;
}

bool Membership::fencing() const {
  return !awaiting_fence_.empty() || fences_acknowledged_ < fenced_.size();
}

bool Membership::MaybePlace(uint32_t num_partitions) {
  if (placed() || servers_.size() < static_cast<size_t>(job_.ps.num_servers)) return false;
  std::vector<proto::ServerInfo> infos;
  for (const auto& [id, server] : servers_) {
    proto::ServerInfo info;
    info.set_id(id);
    info.set_endpoint(server.endpoint);
    infos.push_back(info);
  }
  cluster_map_ = MakeClusterMap(/*version=*/1, num_partitions, infos);
  LOG(INFO) << "placed " << num_partitions << " partitions on " << infos.size()
            << " server(s) (cluster map v1)";
  return true;
}

void Membership::MovePartition(uint32_t partition, uint32_t slot) {
  cluster_map_.set_partition_owner(static_cast<int>(partition), slot);
  moving_.reset();
  RaiseMapVersion();
}

void Membership::RaiseMapVersion() {
  cluster_map_.set_version(cluster_map_.version() + 1);
  moving_.reset();
  Bump();
}

void Membership::RestoreOwners(const proto::ClusterMap& map,
                               const std::vector<uint32_t>& restored) {
  if (map.partition_owner_size() != cluster_map_.partition_owner_size()) return;
  bool changed = false;
  for (int p = 0; p < map.partition_owner_size(); ++p) {
    const uint32_t owner = cluster_map_.partition_owner(p);
    if (owner == map.partition_owner(p) || !servers_.contains(map.partition_owner(p)) ||
        std::find(restored.begin(), restored.end(), owner) == restored.end()) {
      continue;
    }
    LOG(INFO) << "partition " << p << " goes back to ps[" << map.partition_owner(p)
              << "], its owner at the checkpoint restored into ps[" << owner << "]";
    cluster_map_.set_partition_owner(p, map.partition_owner(p));
    changed = true;
  }
  if (changed) RaiseMapVersion();
}

std::map<uint32_t, uint32_t> Membership::PartitionCounts() const {
  std::map<uint32_t, uint32_t> counts;
  for (const auto& [id, server] : servers_) counts[id] = 0;
  for (uint32_t owner : cluster_map_.partition_owner()) ++counts[owner];
  return counts;
}

void Membership::RetireServer(uint32_t slot, absl::Time now) {
  auto it = servers_.find(slot);
  CHECK(it != servers_.end()) << "ps[" << slot << "] is no slot";
  CHECK_EQ(PartitionCounts()[slot], 0u) << "ps[" << slot << "] still owns partitions";
  left_[slot] = {.endpoint = it->second.endpoint,
                 .map_version = cluster_map_.version() + 1,
                 .at = now};
  LOG(INFO) << "ps[" << slot << "] at " << it->second.endpoint
            << " is drained and leaves the job (cluster map v" << cluster_map_.version() + 1
            << ")";
  events_->Record("server_left", {{"server", slot}, {"endpoint", it->second.endpoint}});
  servers_.erase(it);
  auto* listed = cluster_map_.mutable_servers();
  listed->erase(std::remove_if(listed->begin(), listed->end(),
                               [slot](const proto::ServerInfo& info) { return info.id() == slot; }),
                listed->end());
  RaiseMapVersion();
}

const std::string* Membership::LeftServer(uint32_t slot) const {
  auto it = left_.find(slot);
  return it == left_.end() ? nullptr : &it->second.endpoint;
}

bool Membership::RetiredServerMayGo(uint32_t slot, absl::Time now) const {
  auto it = left_.find(slot);
  CHECK(it != left_.end()) << "ps[" << slot << "] has not left";
  if (now - it->second.at >= absl::Milliseconds(job_.master.lease_ms)) return true;
  for (const auto& [id, worker] : workers_) {
    if (worker.state == PeerState::kAlive && worker.map_version < it->second.map_version) {
      return false;
    }
  }
  return true;
}

bool Membership::all_servers_alive() const {
  for (const auto& [id, server] : servers_) {
    if (server.state != PeerState::kAlive) return false;
  }
  return true;
}

size_t Membership::alive_servers() const {
  size_t alive = 0;
  for (const auto& [id, server] : servers_) alive += server.state == PeerState::kAlive;
  return alive;
}

size_t Membership::alive_workers() const {
  size_t alive = 0;
  for (const auto& [id, worker] : workers_) alive += worker.state == PeerState::kAlive;
  return alive;
}

std::vector<uint32_t> Membership::MissingServers() const {
  std::vector<uint32_t> missing;
  for (const auto& [id, server] : servers_) {
    if (server.state != PeerState::kAlive || !server.seen) missing.push_back(id);
  }
  return missing;
}

std::vector<ServerAddress> Membership::LiveServers() const {
  std::vector<ServerAddress> live;
  for (const auto& [id, server] : servers_) {
    if (server.state == PeerState::kAlive) live.emplace_back(id, server.endpoint);
  }
  return live;
}

bool Membership::Serving(const ServerAddress& address) const {
  auto it = servers_.find(address.first);
  return it != servers_.end() && it->second.state == PeerState::kAlive &&
         it->second.endpoint == address.second;
}

bool Membership::EveryoneTold() const {
  for (const auto& [id, worker] : workers_) {
    if (worker.state == PeerState::kAlive && !worker.told_to_exit) return false;
  }
  for (const auto& [id, server] : servers_) {
    if (server.state == PeerState::kAlive && !server.told_to_exit) return false;
  }
  return true;
}

void Membership::SaveTo(proto::MasterRecord* record) const {
  record->set_next_worker_id(next_worker_id_);
  record->set_next_server_id(next_server_id_);
  record->set_membership_epoch(generation_);
  *record->mutable_cluster_map() = cluster_map_;
  if (moving_.has_value()) record->set_partition_moving(*moving_);
  for (const auto& [id, server] : servers_) {
    proto::ServerInfo* info = record->add_servers();
    info->set_id(id);
    info->set_endpoint(server.endpoint);
  }
  for (uint32_t id : fenced_) record->add_fenced_workers(id);
  for (const auto& [id, retired] : left_) {
    proto::ServerInfo* info = record->add_left_servers();
    info->set_id(id);
    info->set_endpoint(retired.endpoint);
  }
}

void Membership::RestoreFrom(const proto::MasterRecord& record, absl::Time now) {
  next_worker_id_ = record.next_worker_id();
  next_server_id_ = record.next_server_id();
  generation_ = record.membership_epoch() + 1;
  cluster_map_ = record.cluster_map();
  if (record.has_partition_moving()) {
    // Its old owner refuses the partition until a newer map comes.
    LOG(WARNING) << "the move of partition " << record.partition_moving()
                 << " was in progress: given up (cluster map v"
                 << cluster_map_.version() + 1 << ")";
    cluster_map_.set_version(cluster_map_.version() + 1);
  }
  for (const proto::ServerInfo& info : record.servers()) {
    ServerEntry& server = servers_[info.id()];
    server.endpoint = info.endpoint();
    // Servers keep running while the master is away: give them a lease.
    server.last_seen = now;
  }
  fenced_.assign(record.fenced_workers().begin(), record.fenced_workers().end());
  // Workers that register with this master get its map: no older one.
  for (const proto::ServerInfo& info : record.left_servers()) {
    left_[info.id()] = {.endpoint = info.endpoint(), .map_version = cluster_map_.version(), .at = now};
  }
}

}  // namespace eps
