// JobConfig: the job config file shared by every eps process.
//
// One INI file describes a job; every process (master, servers, workers)
// reads the same file, so the schema of all sections lives here. Each role
// maps the sections it needs onto its own options struct. Options are named
// "section.key", the name used in the file's [section] and on the command
// line as --section.key=value (core/flags.h).
//
// Thread-safety: a plain value; const methods are safe for concurrent use.

#ifndef EPS_CORE_JOB_CONFIG_H_
#define EPS_CORE_JOB_CONFIG_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "core/status.h"

namespace eps {

// Sees every option of a JobConfig with its name and help text.
class OptionVisitor {
 public:
  virtual ~OptionVisitor() = default;
  virtual void Visit(absl::string_view name, std::string* value, absl::string_view help) = 0;
  virtual void Visit(absl::string_view name, int64_t* value, absl::string_view help) = 0;
  virtual void Visit(absl::string_view name, double* value, absl::string_view help) = 0;
  virtual void Visit(absl::string_view name, bool* value, absl::string_view help) = 0;
};

struct JobConfig {
  struct Job {
    // Name shown in logs and /status. Default "eps".
    std::string name = "eps";
    // Passes over data.train. Default 1.
    int64_t epochs = 1;
    // Seeds shard shuffling and parameter initialisation. Default 1.
    int64_t seed = 1;
    // Seconds between progress lines in every process's log. Default 10.
    int64_t progress_interval_s = 10;
  } job;

  struct Data {
    // Training data: files, globs or directories, comma-separated. Required.
    std::string train;
    // Evaluation data, same syntax; empty skips the final evaluation.
    std::string eval;
    // "criteo" (label, 13 integer, 26 categorical columns) or "tsv" (see schema).
    std::string format = "criteo";
    // For format=tsv: comma-separated column kinds, each `label`, `dense`,
    // `cat` or `skip`, optionally repeated as `kind*N`; e.g.
    // "label,dense*13,cat*26" is the Criteo layout.
    std::string schema;
    // Records (lines) per data shard. Default 100000.
    int64_t shard_records = 100000;
  } data;

  struct Model {
    // lr (logistic regression). Default lr.
    std::string type = "lr";
    // Floats per embedding row, for models with embeddings. Default 16.
    int64_t embedding_dim = 16;
    // Embedding initialiser: auto (the model's choice), zeros, normal, uniform.
    std::string initializer = "auto";
    // Standard deviation (normal) or half-width (uniform). Default 0.01.
    double init_scale = 0.01;
  } model;

  struct Optimizer {
    // sgd or adagrad, applied on the servers. Default adagrad.
    std::string type = "adagrad";
    // Step size. Default 0.05.
    double learning_rate = 0.05;
    // Adagrad: starting value of the squared-gradient accumulator. Default 0.
    double initial_accumulator = 0.0;
    // Adagrad: added to the denominator sqrt(accumulator). Default 1e-8.
    double epsilon = 1e-8;
    // L2 penalty on the weights a gradient touches. Default 0.
    double l2 = 0.0;
  } optimizer;

  struct Ps {
    // Parameter servers the master waits for before training starts. Default 1.
    int64_t num_servers = 1;
    // Virtual partitions keys are hashed into (fixed for the job). Default 256.
    int64_t partitions = 256;
    // Request-handling threads per server. Default 2.
    int64_t threads = 2;
    // Memory budget of a server's hot tier in MiB; 0 = unlimited. Default 0.
    // Rows are kept in memory until the RocksDB store lands.
    int64_t memory_budget_mb = 0;
    // Longest time dirty rows stay unflushed, in ms. Default 1000.
    // Takes effect with the RocksDB store.
    int64_t flush_interval_ms = 1000;
    // Floats per chunk of a dense tensor. Default 16384.
    int64_t dense_chunk_floats = 16384;
  } ps;

  struct Worker {
    // Records per training batch. Default 1024.
    int64_t batch_size = 1024;
    // Batches parsed and pulled ahead of the one training. Default 2.
    int64_t prefetch_batches = 2;
    // Time one attempt of a remote call may take, in ms. Default 10000.
    int64_t rpc_timeout_ms = 10000;
    // Attempts per remote call before it fails. Default 3.
    int64_t rpc_attempts = 3;
    // How long a worker or server keeps trying to reach the master at
    // startup, in seconds. Default 30.
    int64_t master_wait_s = 30;
    // Caps a worker's training rate, in records/s; 0 = no cap. For demos
    // and tests of elasticity on small data. Default 0.
    int64_t max_records_per_s = 0;
  } worker;

  struct Master {
    // Interval of worker and server heartbeats, in ms. Default 1000.
    int64_t heartbeat_ms = 1000;
    // A worker or server without a heartbeat for this long is dead, in ms.
    // Default 10000.
    int64_t lease_ms = 10000;
    // Address the master's RPC and HTTP ports bind to. Default 127.0.0.1;
    // use 0.0.0.0 to serve other machines.
    std::string bind_host = "127.0.0.1";
  } master;

  struct Checkpoint {
    // Seconds between coordinated checkpoints. Default 600.
    // Takes effect with checkpointing.
    int64_t interval_s = 600;
  } checkpoint;

  // Calls `visitor` once for every option, in file order.
  void VisitOptions(OptionVisitor& visitor);

  // Rejects nonsense values. kInvalidArgument, its message naming the option;
  // the option's name is also attached as the payload kOptionPayload.
  Status Validate() const;

  // "section.key = value" lines for every option, for startup logs.
  std::string DebugString() const;
};

// Payload type URL under which Validate() attaches the offending option name.
inline constexpr char kOptionPayload[] = "eps.option";

}  // namespace eps

#endif  // EPS_CORE_JOB_CONFIG_H_
