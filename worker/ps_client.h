// PsClient: a worker's view of the parameter servers.
//
// Pulls and pushes rows of the job's tables: keys are routed to their
// servers by the cluster map, every server is asked in parallel, and bulk
// transfers are cut into messages of at most `max_request_bytes` (ZeroMQ
// slows down 5-10x above ~16 MiB). When a server answers WRONG_OWNER the
// client fetches a new cluster map through `refresh_map` and re-sends what
// that server refused; a push is never applied twice by this re-sending.
// A server that has not received the cluster map yet (NOT_READY), or one
// that refuses keys while the master has no newer map (the new owner not
// yet told), is asked again until the call's time (attempt timeout x
// attempts) runs out. A server that does not answer at all (every attempt
// timed out) may have left the job (drained, retired and exited) while
// this client's map still names it: the client fetches the map and, when
// a newer one gives every key of the silent request to another slot,
// sends them there; only a map that still places them on the silent slot
// (or no newer map) makes the call fail with the silence.
//
// Thread-safety: one thread only (it owns an RpcChannel).

#ifndef EPS_WORKER_PS_CLIENT_H_
#define EPS_WORKER_PS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cluster/placement.h"
#include "core/metrics.h"
#include "core/status.h"
#include "models/model.h"
#include "proto/eps.pb.h"
#include "rpc/message.h"
#include "rpc/rpc_channel.h"
#include "rpc/socket_factory.h"

namespace eps {

// Where a model's parameters live in a job: per Model::params()[i], the
// id of the job's table of that name (of the same kind and size), and for a
// dense tensor the keys of its chunks (empty for an embedding table).
struct ParamTables {
  std::vector<uint32_t> ids;
  std::vector<std::vector<uint64_t>> dense_keys;
};
// kFailedPrecondition naming the first parameter the job has no table for.
StatusOr<ParamTables> MatchParamTables(const proto::JobSpec& job,
                                       const std::vector<ParamSpec>& params);

class PsClient {
 public:
  // Fetches the current cluster map from the master.
  using MapSource = std::function<StatusOr<proto::ClusterMap>()>;

  struct Keys {
    uint32_t table_id = 0;
    std::span<const uint64_t> keys;
  };

  // `factory` must outlive the client.
  PsClient(SocketFactory* factory, proto::NodeId self, proto::JobSpec job, CallOptions options,
           MapSource refresh_map, size_t max_request_bytes = size_t{4} << 20);

  // Installs `map`. kInvalidArgument if it is inconsistent.
  Status SetClusterMap(const proto::ClusterMap& map);
  // Version of the installed map (0: none).
  uint64_t map_version() const { return placement_ ? placement_->version() : 0; }

  // Dense tensors' versions (the pushes a server applied to its chunks of
  // one): per table of a call, per server of the placement (by index; 0
  // where that server holds none of it, and for embedding tables).
  using Versions = std::vector<std::vector<uint64_t>>;

  // Pulls the rows of tables[i].keys into (*out)[i], resized to
  // keys x dim; and, given `versions`, each server's version of what it
  // sent (the lowest when it sent a table in several messages).
  // kDeadlineExceeded when a server does not answer and the master's
  // newest map still places its keys on it; the server's error otherwise.
  // With `reserve`, the worker will compute its next step from the dense
  // tensors pulled and push on their versions: a global batch reserves its
  // share, and the pull waits while one is full (PullRequest.reserve,
  // ps/global_batch.h).
  Status Pull(std::span<const Keys> tables, std::vector<std::vector<float>>* out,
              Versions* versions = nullptr, bool reserve = false);

  // Rows and their versions, as Pull gives them.
  struct Rows {
    std::vector<std::vector<float>> values;
    Versions versions;
  };

  // How a push goes (LevelDB's WriteOptions); every field may stay unset.
  struct PushOptions {
    // The servers apply the gradients at this times the learning rate.
    float lr_scale = 1.0f;
    // Each server's versions the gradients were computed from (a Pull's;
    // a table with no entries: not known), so that it measures their
    // staleness and a global batch weighs them (ps/global_batch.h).
    const Versions* based_on = nullptr;
    // Gets each server's versions once the push is applied (the highest
    // when it took a table in several messages).
    Versions* versions = nullptr;
    // 1 + the training pass (epoch) the gradients come from; 0: not known
    // (PushRequest.pass).
    uint32_t pass = 0;
    // The records of the batch whose mean loss the gradients are, in every
    // request (PushRequest.records): a table with a global batch needs them.
    uint32_t records = 0;
    // The training records the gradients come from, for a receipt: under
    // CURVE the server answers with one and `receipt` gets it (cleared
    // first; empty when none came). Both or neither: without `receipt` no
    // batch is sent. One request of the push carries the batch (the first
    // of a routing round, until a reply brought the receipt): every server
    // makes the same receipt, so one HMAC per push is enough.
    const proto::WorkBatch* batch = nullptr;
    std::string* receipt = nullptr;
    // Gets the pushed rows as the push left them, with each server's
    // version of what it sent (the lowest over its messages), as Pull would
    // give them right after the push, without a pull; left empty when a
    // reply did not carry them (the push still succeeds).
    Rows* after = nullptr;
  };
  // Pushes grads[i] (keys x dim floats) for tables[i].keys.
  // REQUIRES: grads[i].size() == tables[i].keys.size() * dim.
  Status Push(std::span<const Keys> tables, std::span<const std::span<const float>> grads,
              const PushOptions& options);
  Status Push(std::span<const Keys> tables, std::span<const std::span<const float>> grads) {
    return Push(tables, grads, PushOptions());
  }

  const proto::TableSpec& table(uint32_t id) const { return job_.tables(static_cast<int>(id)); }

  // Checked while calls are in flight (every few ms): once it returns true,
  // the calls are given up and Pull/Push fail with kAborted. A worker whose
  // session ended (fenced while a server is being restored) stops waiting
  // for a server that will not answer.
  void set_abandon(std::function<bool()> abandon) { abandon_ = std::move(abandon); }

  // The newest cluster map version the master announced (0: none). A call
  // made while it is above map_version() fetches the map first, so a worker
  // routes by a map within a heartbeat of the master's, not only once a
  // server says WRONG_OWNER: its heartbeat may then tell the master so, and
  // a retired server exits once no worker can still send to it (issue 49).
  void set_newest_map(std::function<uint64_t()> newest) { newest_map_ = std::move(newest); }

  // With `bf16`, the rows and gradients of DENSE tables travel as
  // bfloat16 from now on (PullRequest.dense_bf16, PushRequest.dense_bf16;
  // worker.dense_wire): half the bytes, each value within 2^-8 of its
  // float32 (relative).
  void set_dense_bf16(bool bf16) { dense_bf16_ = bf16; }

  // Every Pull and Push from now on, failed ones included, is timed whole
  // (routing, every server's answer, re-sending) into `pull` / `push`;
  // nullptr times nothing. The histograms must outlive the client; several
  // clients may share them.
  void set_latency_histograms(LatencyHistogram* pull, LatencyHistogram* push) {
    pull_latency_ = pull;
    push_latency_ = push;
  }

 private:
  // Part of one table's keys bound for one server.
  struct Piece {
    size_t table = 0;                 // index into the call's `tables`
    std::vector<uint32_t> positions;  // indices into that table's keys
  };
  struct Request {
    size_t server = 0;  // index into the placement
    std::vector<Piece> pieces;
  };
  // A request of a routing round that got no reply after every attempt.
  struct SilentRequest {
    const Request* request = nullptr;  // the round's, alive until the next Plan
    uint32_t server_id = 0;            // the slot it went to
    std::string endpoint;              // and that slot's endpoint then
    Status error;                      // the channel's (kDeadlineExceeded)
  };

  // Routes `positions[t]` of each table to servers and packs them into
  // requests within the size cap.
  std::vector<Request> Plan(std::span<const Keys> tables,
                            const std::vector<std::vector<uint32_t>>& positions) const;
  Status Refresh();
  // Sizes out[t] for tables[t]'s rows and empties *versions (when given).
  void SizeRows(std::span<const Keys> tables, std::vector<std::vector<float>>* out,
                Versions* versions) const;
  // Copies the rows a reply to `request` carries (a frame per piece) into
  // *out, and their versions (the lowest per server) into *versions.
  // kDataLoss when the reply's frames do not fit the request.
  Status ScatterRows(std::span<const Keys> tables, const Request& request, const Message& reply,
                     absl::string_view method,
                     const google::protobuf::RepeatedField<uint64_t>& reply_versions,
                     std::vector<std::vector<float>>* out, Versions* versions) const;
  // A version no reply gave (marked while taking the lowest) becomes 0.
  static void ForgetUnknownVersions(Versions* versions);
  // Records `reply_versions` (one per piece of `request`, as a reply
  // carries them) into `versions`, keeping the lower (`lowest`) or the
  // higher of what a server said in several messages.
  void NoteVersions(const Request& request,
                    const google::protobuf::RepeatedField<uint64_t>& reply_versions,
                    bool lowest, Versions* versions) const;
  // Sends every key of `tables` to its server, in rounds: `build` makes a
  // request's message (told whether it is the round's first request),
  // `on_reply` takes its successful reply. Requests
  // answered WRONG_OWNER or NOT_READY are re-routed and re-sent; the first
  // other error is returned once every call has finished.
  Status Exchange(std::span<const Keys> tables, absl::string_view method,
                  const std::function<Message(const Request&, bool first)>& build,
                  const std::function<Status(const Request&, Message&)>& on_reply);
  // What the servers answered in a routing round, besides replies.
  struct RoundOutcome {
    bool wrong_owner = false;  // WRONG_OWNER: refresh the map
    bool not_ready = false;    // NOT_READY: no cluster map yet
    bool slow_down = false;    // SLOW_DOWN: over the worker's row quota
    bool batch_full = false;   // BATCH_FULL: a dense global batch is full
    std::string full_why;      // the last BATCH_FULL's message (which tensor, how full)
    // A refusal that is waited out rather than re-routed.
    bool waits() const { return not_ready || slow_down || batch_full; }
  };
  // Between routing rounds: refreshes the map after WRONG_OWNER; waits a
  // little after NOT_READY or SLOW_DOWN, or when the refreshed map is no
  // newer, and 2 ms after BATCH_FULL (the step is one push away)
  // (until `deadline`, not counting the round).
  Status AfterRound(const RoundOutcome& outcome, absl::string_view method, int* round,
                    absl::Time deadline);
  // After a round in which the `silent` requests got no reply at all:
  // fetches the master's cluster map, and when it is newer than the
  // installed one and gives every key of those requests to a slot other
  // than the one each went to (that slot left the job, or its partitions
  // moved away), installs it and adds those keys to *remaining for the
  // next round. Otherwise returns the first silent request's error (its
  // code, kDeadlineExceeded), saying why it stands, and leaves the map as
  // it was.
  //
  // A push whose server went silent is sent to the new owner only then: the
  // old owner refused the keys whole from its hand-off on (WRONG_OWNER), so
  // it applied the push only if it got it before the hand-off and its
  // reply and every resend were lost (docs/design.md 2.20, "Exactly once").
  Status RerouteSilent(std::span<const Keys> tables, absl::string_view method,
                       const std::vector<SilentRequest>& silent,
                       std::vector<std::vector<uint32_t>>* remaining);

  SocketFactory* const factory_;
  const proto::JobSpec job_;
  const CallOptions options_;
  const MapSource refresh_map_;
  std::function<bool()> abandon_;
  std::function<uint64_t()> newest_map_;
  const size_t max_request_bytes_;
  // Whether a push whose rows did not come back was warned of.
  bool read_back_warned_ = false;
  bool dense_bf16_ = false;
  // Whether table `id`'s values travel as bfloat16.
  bool Bf16(uint32_t id) const { return dense_bf16_ && table(id).kind() == proto::DENSE; }
  RpcChannel channel_;
  std::unique_ptr<Placement> placement_;
  uint64_t push_seq_ = 0;
  LatencyHistogram* pull_latency_ = nullptr;
  LatencyHistogram* push_latency_ = nullptr;
};

}  // namespace eps

#endif  // EPS_WORKER_PS_CLIENT_H_
