// ShardLoader: a worker session's loader thread and the bounded queue of
// batches it fills for the trainer.
//
//   loop { GET_SHARD -> read the shard's lines -> parse -> batch -> pull the
//          batch's parameters (Hooks::prepare) -> queue }
//
// The loader keeps at most `prefetch_batches` batches ahead of the trainer
// (Push blocks while the queue is full). Malformed lines are counted,
// skipped, sampled into their batch (FILE:LINE: reason) and logged, the
// first few per worker only. A file that cannot be read (gone, truncated,
// unreadable, changed) does not end the loader: the shard's batches end
// with a marker (PreparedBatch::unreadable) and the loader asks for the
// next shard. While it reads a shard, the loader answers
// the master's request to split it (RequestSplit, from heartbeat and
// commit replies): it gives up the second half of what it has not read yet
// (SPLIT_SHARD). The loader ends when the master has no shard left (OK,
// Hooks::finished), when the worker winds down (Hooks::stopping), on Stop,
// or on the first error; the queue then ends with that status and Pop
// drains what is left.
//
// Thread-safety: Start, Pop and Stop from the owning (trainer) thread;
// SetBatchSize, RequestSplit and status from any thread. The hooks run on the loader
// thread, concurrently with the owner's work.

#ifndef EPS_WORKER_SHARD_LOADER_H_
#define EPS_WORKER_SHARD_LOADER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "core/status.h"
#include "models/batch.h"
#include "models/model.h"
#include "proto/eps.pb.h"
#include "rpc/message.h"
#include "rpc/rpc_channel.h"
#include "rpc/socket_factory.h"
#include "worker/line_reader.h"
#include "worker/ps_client.h"
#include "worker/record_parser.h"

namespace eps {

// One batch, parsed and with its parameters pulled, ready to train.
struct PreparedBatch {
  proto::ShardAssignment shard;
  uint64_t begin = 0;  // byte range of the shard this batch covers
  uint64_t end = 0;
  uint64_t lines = 0;
  uint64_t malformed = 0;
  std::vector<std::string> malformed_examples;
  Batch batch;
  ParamBuffers params;
  // Set on the marker that ends a shard whose file could not be read from
  // `begin` (line `unreadable_line`) on: why. It carries no batch; the
  // trainer, having committed every batch before it, reports it to the
  // master (SHARD_UNREADABLE).
  std::string unreadable;
  uint64_t unreadable_line = 0;
};

struct ShardLoaderOptions {
  // Records per batch at the start (worker.batch_size, or where auto
  // starts). Default 1024.
  int64_t batch_size = 1024;
  // Batches prepared ahead of the trainer (worker.prefetch_batches).
  // Default 2.
  size_t prefetch_batches = 2;
};

class ShardLoader {
 public:
  // What the loader needs from its worker. All required.
  struct Hooks {
    // Makes the loader's parameter client; `master` is the loader's own
    // channel to the master (for map refreshes) and outlives the client.
    std::function<std::unique_ptr<PsClient>(RpcChannel* master)> make_ps_client;
    // Calls the master on `master` with what `make` builds (GET_SHARD,
    // SPLIT_SHARD), riding out short outages.
    std::function<StatusOr<Message>(RpcChannel& master, const std::function<Message()>& make)>
        call_master;
    // Pulls the parameters `prepared` needs before its step.
    std::function<Status(PsClient& ps, PreparedBatch& prepared)> prepare;
    // True once the worker winds down (stopping, or the session over).
    std::function<bool()> stopping;
    // Waits up to a duration, returning early when the worker stops.
    std::function<void(absl::Duration)> sleep;
    // The master has no shard left: the job is over.
    std::function<void()> finished;
    // The loader failed with `error`: what the worker makes of it (which
    // may end its session); the queue ends with the status it returns.
    std::function<Status(Status error)> failed;
  };

  // `factory`, `parser` and `malformed_logged` (malformed lines logged so
  // far by this worker, across sessions) must outlive the loader. `self` is
  // the worker's id in this session.
  ShardLoader(const ShardLoaderOptions& options, SocketFactory* factory, proto::NodeId self,
              const RecordParser* parser, std::atomic<int>* malformed_logged, Hooks hooks);
  ~ShardLoader();  // Stop()s.
  ShardLoader(const ShardLoader&) = delete;
  ShardLoader& operator=(const ShardLoader&) = delete;

  // Starts the loader thread. REQUIRES: once.
  void Start();

  // The next batch; blocks until one is queued or the loader has ended
  // (null: see status()).
  std::unique_ptr<PreparedBatch> Pop();

  // Records per batch from the next batch it makes on (batches already
  // queued keep theirs). Never blocks. REQUIRES: records >= 1.
  void SetBatchSize(int64_t records) { batch_size_.store(records); }

  // The master asks to split `shard_id`; the loader does so if it is
  // reading that shard (at its next batch boundary). Never blocks.
  void RequestSplit(uint64_t shard_id) { split_shard_.store(static_cast<int64_t>(shard_id)); }

  // Ends the queue (batches still queued are dropped: never pushed, they
  // are simply lost), and joins the loader thread. Blocks while the loader
  // finishes the batch in hand (its pull). Idempotent.
  void Stop();

  // How the loader ended: OK while it runs or after it ran out of shards,
  // kCancelled after Stop, its error otherwise.
  Status status() const;

 private:
  class BatchQueue;

  void Loop();
  Status LoadShards(RpcChannel& master, PsClient& ps);
  Status LoadShard(RpcChannel& master, const proto::ShardAssignment& shard, PsClient& ps);
  // Answers the master's request to split `shard`: gives up the second half
  // of what `reader` has not read yet.
  Status MaybeSplit(RpcChannel& master, const proto::ShardAssignment& shard, LineReader& reader);

  const ShardLoaderOptions options_;
  SocketFactory* const factory_;
  const proto::NodeId self_;
  const RecordParser* const parser_;
  std::atomic<int>* const malformed_logged_;
  const Hooks hooks_;
  const std::unique_ptr<BatchQueue> queue_;
  // Records per batch (options.batch_size until SetBatchSize).
  std::atomic<int64_t> batch_size_;
  // Shard the master asked to split (-1: none).
  std::atomic<int64_t> split_shard_{-1};
  std::thread thread_;
};

}  // namespace eps

#endif  // EPS_WORKER_SHARD_LOADER_H_
