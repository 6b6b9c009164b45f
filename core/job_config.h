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
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/status.h"

namespace eps {

// An integer option that may instead say "auto" (worker.batch_size).
struct IntOrAuto {
  int64_t value = 0;  // meaningless when automatic
  bool automatic = false;

  // "auto" or the integer.
  std::string ToString() const;
  // Reads "auto" or a decimal integer; false for anything else.
  static bool Parse(absl::string_view text, IntOrAuto* out);
};

// Sees every option of a JobConfig with its name and help text.
class OptionVisitor {
 public:
  virtual ~OptionVisitor() = default;
  virtual void Visit(absl::string_view name, std::string* value, absl::string_view help) = 0;
  virtual void Visit(absl::string_view name, int64_t* value, absl::string_view help) = 0;
  virtual void Visit(absl::string_view name, double* value, absl::string_view help) = 0;
  virtual void Visit(absl::string_view name, bool* value, absl::string_view help) = 0;
  virtual void Visit(absl::string_view name, IntOrAuto* value, absl::string_view help) = 0;
};

struct JobConfig {
  struct Job {
    // Name shown in logs and /status. Default "eps".
    std::string name = "eps";
    // Passes over data.train, in [1, 1e6]. Default 1.
    int64_t epochs = 1;
    // Seeds shard shuffling and parameter initialisation, >= 0. Default 1.
    int64_t seed = 1;
    // Seconds between progress lines in every process's log, in [1, 86400]
    // (a day). Default 10.
    int64_t progress_interval_s = 10;
    // The job stops (resumably) when the mean loss of the last records
    // trained rises past this factor times the lower of the first epoch's
    // mean loss and ln 2 (the loss of predicting 0.5 for every record), or
    // when its evaluation's log loss ends past this factor times ln 2;
    // 0 = never (a non-finite loss stops it all the same). 0 or in
    // (1, 1e6]. Default 2.
    double divergence_factor = 2.0;
    // Where the trained model goes (docs/model-format.md): once the last
    // pass is done, every server writes its rows there and the master the
    // manifest, before the job counts as finished. A directory every server
    // and the master can write (shared storage when they run on several
    // machines). Empty: no export. Default empty.
    std::string export_dir;
    // A warm start: the model export (job.export_dir of an earlier job,
    // docs/model-format.md) the job starts from instead of new rows. Its
    // tables are loaded into this job's servers before training starts,
    // placed by this job's cluster map (the server count may differ); a
    // model of another type or size is refused by name. Empty: none.
    // Default empty.
    std::string init_from;
    // With job.init_from: load the rows' optimizer state too (Adagrad's
    // accumulators, ...), which needs the same optimizer; false starts it
    // afresh. Default true.
    bool init_optimizer_state = true;
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
    // The character between the values of a multicat column (data.schema).
    // Default ",".
    std::string multi_value_separator = ",";
    // Records (lines) per data shard, in [1, 1e9]. Default 100000.
    int64_t shard_records = 100000;
    // What a shard whose file cannot be read at run time (gone, truncated,
    // unreadable) does, once the master has checked the file itself:
    // "fail" stops the job resumably naming the file; "skip" counts the
    // shard's unread lines as skipped (ledger lines_skipped, with the
    // reason) and goes on. Default "fail".
    std::string on_unreadable = "fail";
  } data;

  struct Model {
    // lr (logistic regression), wdl (Wide & Deep), deepfm or dlrm
    // (docs/models.md). Default lr.
    std::string type = "lr";
    // Floats per embedding row, for models with embeddings, in [1, 4096].
    // Default 16.
    int64_t embedding_dim = 16;
    // Embedding initialiser: auto (the model's choice), zeros, normal, uniform.
    std::string initializer = "auto";
    // Standard deviation (normal) or half-width (uniform), in [0, 1e6].
    // Default 0.01.
    double init_scale = 0.01;
    // Layer sizes (comma-separated, the input excluded) of wdl's and
    // deepfm's deep MLP; the last must be 1. Default 400,400,400,1.
    std::string mlp = "400,400,400,1";
    // dlrm's bottom MLP over the dense features; the last size must be
    // embedding_dim. Default 512,256,64,16 (the reference Criteo DLRM).
    std::string bottom_mlp = "512,256,64,16";
    // dlrm's top MLP over the interactions; the last size must be 1.
    // Default 512,256,1.
    std::string top_mlp = "512,256,1";
    // Hidden-layer activation: relu, sigmoid or tanh. Default relu.
    std::string activation = "relu";
    // How a multi-value field's rows combine: sum or mean. Default sum.
    std::string pooling = "sum";
  } model;

  // The update rule the servers apply to every table (formulas in
  // ps/optimizer.h); per_table overrides it for named tables. Settings a
  // type does not use are ignored. The numbers travel to the servers as
  // floats, so each must be one: at most FLT_MAX (3.4e38), a value that
  // must be > 0 at least the smallest positive float (1.4e-45), beta1 and
  // beta2 below 1 as floats.
  struct Optimizer {
    // sgd, adagrad, adam or ftrl, applied on the servers. Default adagrad.
    std::string type = "adagrad";
    // Step size; FTRL's alpha. Default 0.05.
    double learning_rate = 0.05;
    // Adagrad: starting value of the squared-gradient accumulator. Default 0.
    double initial_accumulator = 0.0;
    // Adagrad and Adam: added to the denominator. Default 1e-8.
    double epsilon = 1e-8;
    // L2 penalty (l2 / 2) * |w|^2 on the weights a gradient touches.
    // Default 0.
    double l2 = 0.0;
    // Adam: decay rate of the first moment, in [0, 1). Default 0.9.
    double beta1 = 0.9;
    // Adam: decay rate of the second moment, in [0, 1). Default 0.999.
    double beta2 = 0.999;
    // FTRL: beta of the per-coordinate rate alpha / (beta + sqrt(n)), >= 0.
    // Default 1.
    double ftrl_beta = 1.0;
    // FTRL: L1 penalty l1 * |w|_1; > 0 zeroes small weights. Default 0.
    double l1 = 0.0;
    // Every type: when > 0, the servers clip each gradient value to
    // [-clip, clip] before the update rule; 0 = off. >= 0. Default 0.
    double clip = 0.0;
    // How the learning rate follows the batch a worker actually trains
    // (worker.batch_size = auto, a shard's short last batch): none, linear
    // (lr * b / reference) or sqrt (lr * sqrt(b / reference)), where the
    // reference is worker.batch_size, or worker.min_batch_size under auto.
    // It scales every table's learning_rate (FTRL's alpha) for that push,
    // on the servers. Default none.
    std::string lr_scaling = "none";
    // After a worker's batch size changes, its scale moves from the old
    // value to the new one over this many batches, in [0, 1e6]; 0 = at
    // once. Default 100.
    int64_t lr_warmup_batches = 100;
    // Settings over the ones above for every MLP layer's weights and biases
    // (wdl's and deepfm's deep MLP, dlrm's bottom and top):
    // "key=value[,key=value...]", keys as in per_table. Empty: the MLPs
    // take the settings above, as embedding tables and the linear weights
    // of the dense features (lr.dense, wdl.wide_dense, deepfm.first_dense)
    // always do. Default "type=adam,learning_rate=0.001,beta1=0.5": Adam
    // at 0.001 is what the PyTorch references (and PyTorch users) train
    // MLPs with, while the tables keep Adagrad; Adagrad at a table's rate
    // over-steps an MLP. beta1 0.5 rather than Adam's 0.9: asynchronous
    // workers add momentum of their own (docs/models.md, "Optimizers").
    std::string mlp = "type=adam,learning_rate=0.001,beta1=0.5";
    // Records per optimizer step of every dense tensor (the MLPs, the
    // linear weights of the dense features), in [0, 2^30]: each server
    // sums the workers' gradients, weighted by their records, and steps
    // once it holds this many, so that the model does not depend on how
    // many workers sent them (ps/global_batch.h; docs/accuracy.md). A
    // worker reading the version being filled reserves its share, and one
    // that would overfill it waits for the step, so none computes on a
    // version that steps under it; a reservation not pushed within 4x the
    // mean step (a dead or frozen worker) is given up, and a gradient
    // computed on an older version is then dropped (its records still
    // train the embeddings). Requires worker.max_staleness = 0. The learning-rate
    // scaling above does not apply to them. With worker.deterministic
    // (fresh embedding rows at each step), DLRM's AUC at 1, 2 and 4
    // workers stays within 0.005. 0: a step per push, asynchronous across
    // workers. Default 0.
    int64_t dense_global_batch = 0;
    // Per-table settings over the ones above (over optimizer.mlp's for an
    // MLP layer):
    // "TABLE:key=value[,key=value...][;TABLE:...]", keys as above without
    // the section (type, learning_rate, initial_accumulator, epsilon, l2,
    // beta1, beta2, ftrl_beta, l1, clip), e.g.
    // "lr.dense:type=sgd,learning_rate=0.1;lr.w:type=ftrl,l1=1".
    // Default empty (every table uses the settings above).
    std::string per_table;
  } optimizer;

  struct Ps {
    // Parameter servers the master waits for before training starts, in
    // [1, ps.partitions]. Default 1.
    int64_t num_servers = 1;
    // Virtual partitions keys are hashed into (fixed for the job), in
    // [ps.num_servers, 2^20]. Default 256.
    int64_t partitions = 256;
    // Request-handling threads per server, in [1, 1024]. Default 2.
    int64_t threads = 2;
    // Memory budget of a server's hot tier in MiB, in [0, 2^24] (16 TiB);
    // 0 = unlimited. Over it, rows already written to the server's store
    // leave memory. Needs --data-dir. Default 0.
    int64_t memory_budget_mb = 0;
    // Longest time a changed row stays unwritten to the store, in ms, in
    // [1, 86400000] (a day). Default 1000.
    int64_t flush_interval_ms = 1000;
    // Most MiB a server's journal may hold, in [0, 2^20] (1 TiB): changed
    // rows are appended to it every flush interval and reach the store
    // (RocksDB) only when the journal passes this, when they leave memory,
    // and at checkpoints, exports and stops (ps/journal.h). A restart
    // replays it. 0: no journal, every flush writes the store. Default 256.
    int64_t journal_mb = 256;
    // How long a server keeps trying to reach the master (at startup, and
    // when it stops answering), in seconds, in [0, 604800] (a week).
    // Default 30.
    int64_t master_wait_s = 30;
    // How long a server sent SIGTERM waits for the master to drain it (move
    // its partitions to the other servers) before it exits anyway, in
    // seconds, in [0, 604800] (a week). Default 600.
    int64_t leave_timeout_s = 600;
    // Time one attempt of a server's call to the master may take, in ms,
    // in [1, 86400000]. Default 10000.
    int64_t rpc_timeout_ms = 10000;
    // "flush": a push is acknowledged once applied in memory (a crash loses
    // at most the last flush interval); "every_push": only once its rows
    // are in the server's journal (ps.journal_mb; the store's write-ahead
    // log without one): a crash loses no acknowledged push. Default flush.
    std::string durability = "flush";
    // Floats per chunk of a dense tensor, in [1, 2^20]. Default 16384.
    int64_t dense_chunk_floats = 16384;
    // Rows one worker may create per second on one server (pulls and
    // pushes of keys the server has never held), in [0, 2^40]; 0 =
    // unlimited. A worker over it is told to slow down (ps/row_quota.h).
    // Default 4000000.
    int64_t max_new_rows_per_worker_s = 4'000'000;
    // The same for all workers together (one key holder registered under
    // many ids counts once), in [0, 2^40]; 0 = unlimited. Default 16000000.
    int64_t max_new_rows_s = 16'000'000;
    // Admission: a feature id gets a row in an embedding table only at its
    // admission_min_count-th push (until then it reads as its initializer
    // makes it and its gradients are dropped); 0 or 1 = every id at once.
    // In [0, 65535]. Default 0.
    int64_t admission_min_count = 0;
    // Memory a server's admission counts may take per table, in MiB, in
    // [1, 65536]: ids counted at once, beyond which a full shard forgets
    // its candidates (ps/admission.h). Default 32.
    int64_t admission_memory_mb = 32;
    // Expiry: an embedding row no push touched in the last ttl_passes
    // training passes (epochs) is deleted, from memory and the store, when
    // a pass ends and before the export (a warm start's rows count as
    // trained in the pass before the job's first); 0 keeps every row. In
    // [0, 65535]. Default 0.
    int64_t ttl_passes = 0;
    // admission_min_count and ttl_passes for named embedding tables, over
    // the values above: "TABLE:key=value[,key=value...][;TABLE:...]", e.g.
    // "wdl.wide:ttl_passes=2;wdl.emb:admission_min_count=3". Default empty.
    std::string per_table;
  } ps;

  struct Worker {
    // Records per training batch, in [1, 2^20], or auto: each worker
    // starts at min_batch_size and doubles its batch while its records/s
    // rise by more than a tenth, up to max_batch_size, and halves it when a
    // step runs out of memory (that batch is trained in halves). Default
    // 1024.
    IntOrAuto batch_size{1024, false};
    // Under batch_size = auto: the smallest and largest batch a worker
    // uses, in [1, 2^20], min <= max. Defaults 256 and 16384.
    int64_t min_batch_size = 256;
    int64_t max_batch_size = 16384;
    // The batch size a worker starts at, and the one the learning rate is
    // tuned for (optimizer.lr_scaling's reference).
    int64_t reference_batch_size() const {
      return batch_size.automatic ? min_batch_size : batch_size.value;
    }
    // The largest batch a worker may train.
    int64_t largest_batch_size() const {
      return batch_size.automatic ? max_batch_size : batch_size.value;
    }
    // Batches parsed and pulled ahead of the one training, in [1, 1024].
    // Default 2.
    int64_t prefetch_batches = 2;
    // Updates of a dense tensor a step's copy of it may miss, in [0, 1024]:
    // a worker keeps its copy of the dense tensors between steps and starts
    // a step only when the updates it knows were applied since the copy was
    // pulled (its own pushes in flight included) are at most this many. 0:
    // every step waits for its previous push and a fresh pull
    // (synchronous for dense tensors); 1 overlaps one step's push and the
    // next copy's pull with the next step. Embedding rows are pulled
    // worker.prefetch_batches ahead either way. Shared by every member.
    // Default 0: with 2 workers, 1 cost DLRM (Adam on its MLPs) 0.032 eval
    // AUC (docs/accuracy.md).
    int64_t max_staleness = 0;
    // How a step's dense tensors travel between worker and servers (their
    // gradients out, the new copy back): float32 or bfloat16 (half the
    // bytes; the servers keep float32). Default bfloat16: 1-6% more
    // records/s on 2 cores, eval AUC within run-to-run noise
    // (docs/performance.md).
    std::string dense_wire = "bfloat16";
    // Time one attempt of a remote call may take, in ms, in [1, 86400000];
    // times rpc_attempts at most a day. Default 10000.
    int64_t rpc_timeout_ms = 10000;
    // Attempts per remote call before it fails, in [1, 1000]. Default 3.
    int64_t rpc_attempts = 3;
    // How long a worker keeps trying to reach the master (at startup, and
    // when it stops answering), in seconds, in [0, 604800] (a week).
    // Default 30. A server's: ps.master_wait_s.
    int64_t master_wait_s = 30;
    // Caps a worker's training rate, in records/s, in [0, 1e9]; 0 = no cap.
    // For demos and tests of elasticity on small data. Default 0.
    int64_t max_records_per_s = 0;
    // CPU threads a worker's model math uses, in [0, 1024]; 0 = the CPUs the
    // process may use (affinity mask and cgroup quota) divided among the
    // workers on its host (core/cpu_budget.h). Default 0.
    int64_t compute_threads = 0;
    // Each training step waits until the worker's earlier pushes are
    // applied and only then pulls its batch's rows (the loader, which works
    // ahead, pulls none), so that one worker with a fixed batch_size trains
    // the same bits every run: for checks (a move loses no update, docs/
    // design.md 2.20), not speed (pulls no longer overlap steps). Default
    // off.
    bool deterministic = false;
  } worker;

  struct Master {
    // Interval of worker and server heartbeats, in ms, in [1, 86400000]
    // (a day). Default 1000.
    int64_t heartbeat_ms = 1000;
    // A worker or server without a heartbeat for this long is dead, in ms:
    // more than heartbeat_ms, at most 86400000 (a day). Default 10000.
    int64_t lease_ms = 10000;
    // Address the master's RPC and HTTP ports bind to. Default 127.0.0.1;
    // use 0.0.0.0 to serve other machines.
    std::string bind_host = "127.0.0.1";
    // Longest wait for a missing parameter server, in seconds: for
    // ps.num_servers to register at the start (the job then fails), and for
    // a lost server's slot to be filled in a recovery or on --resume (the
    // job then stops resumably, naming the slot). In [1, 604800] (a week).
    // Default 600.
    int64_t recovery_timeout_s = 600;
    // A worker that holds a shard and commits nothing for this long, in
    // seconds (a hung trainer, a dead GPU), is fenced and its shards go
    // back to the queue from their committed offsets. In [1, 604800].
    // Default 600.
    int64_t progress_timeout_s = 600;
    // With work left and no live worker for this long, in seconds, the job
    // stops resumably; 0 = wait for workers forever. Not counted while an
    // autoscaler may still start workers. In [0, 604800]. Default 300.
    int64_t worker_wait_s = 300;
    // Live workers the master admits at most (a holder of the worker key
    // cannot register ids without end); another is refused until one
    // leaves. 0 = automatic: autoscale.max_workers + max(8, a quarter of
    // it) with [autoscale] on, else 256. In [0, 65536]. Default 0.
    int64_t max_workers = 0;
    // Records of each evaluation commit whose predictions the master
    // recomputes from the servers' parameters (a worker key alone cannot
    // make the job's metrics; master/trust/eval_check.h); under CURVE only.
    // 0 = none (each commit's lines and labels are still held to the
    // file). In [0, 4096]. Default 4.
    int64_t eval_check_records = 4;
  } master;

  struct Checkpoint {
    // Seconds between coordinated checkpoints, in [1, 604800]. Default 600.
    int64_t interval_s = 600;
    // Checkpoints each server keeps (newest first), in [1, 1000]. Default 3.
    int64_t keep = 3;
    // Checkpoint id a server restores into its --data-dir before opening it;
    // empty restores nothing. Default empty.
    std::string restore;
    // Where servers write checkpoints: DIR/ps-<server id>/<checkpoint id>.
    // Shared storage lets a replacement server on a fresh --data-dir take
    // over a dead server's partitions. Empty: each server's
    // --data-dir/checkpoints. Default empty.
    std::string dir;
    // What a parameter server's death does: "rollback" restores every
    // server and the data progress to the last complete checkpoint (nothing
    // lost, nothing counted twice); "continue" restores only the dead
    // server's partitions and keeps the rest (the updates those partitions
    // took since the checkpoint are lost). Default "rollback".
    std::string on_server_failure = "rollback";
    // After this many checkpoint rounds in a row fail, the job stops
    // resumably (it would otherwise train on with nothing to recover to);
    // 0 = never. In [0, 1000]. Default 3.
    int64_t max_failures = 3;
  } checkpoint;

  // The master's autoscaler (docs/design.md, "Autoscaling"): the number of
  // workers follows the free GPUs of the job's queue. Off unless `source`
  // is set. Thresholds and counts are in GPUs and workers.
  struct Autoscale {
    // Where the signal comes from: "none" (off), "slurm", "prometheus" or
    // "command". Default none.
    std::string source = "none";
    // source or launcher = slurm: the partition whose free GPUs are read
    // and which the workers are submitted to.
    std::string partition;
    // launcher = slurm: more sbatch options for every worker job, split on
    // whitespace ("--account=ml --time=1-00:00:00").
    std::string sbatch_args;
    // source = command: a shell command printing "FREE_GPUS [PENDING_GPUS]"
    // (the GPUs free in the queue, and those other jobs wait for).
    std::string command;
    // source = prometheus: the server's URL (http://HOST:PORT) and an
    // instant PromQL query whose value is the free GPUs; pending_query, when
    // set, gives the GPUs other jobs wait for.
    std::string prometheus_url;
    std::string query;
    std::string pending_query;
    // Longest time one reading of the signal (or one launcher command) may
    // take, in seconds, in [1, 3600]. Default 10.
    int64_t source_timeout_s = 10;
    // How workers are started and stopped: "local" (eps-worker processes on
    // the master's machine), "slurm" (one sbatch job per worker, scancel to
    // stop) or "command" (start_command and stop_command). Default local.
    std::string launcher = "local";
    // launcher = command: shell templates; {id} is the worker's launch id,
    // {master} the master's RPC endpoint, {config} a job file for the
    // worker (DATA_DIR/worker.ini). start_command runs once per worker and
    // may print a handle (a pod or job name) that stop_command gets as
    // {handle}.
    std::string start_command;
    std::string stop_command;
    // launcher = local or slurm: the eps-worker to run; empty: the one next
    // to eps-master.
    std::string worker_binary;
    // Workers the job keeps at least and at most, in [0, 10000] and
    // [max(1, min_workers), 10000]. Defaults 1 and 4.
    int64_t min_workers = 1;
    int64_t max_workers = 4;
    // GPUs one worker takes, in [1, 1024]. Default 1.
    int64_t gpus_per_worker = 1;
    // Grow while at least this many GPUs are free, in [1, 1e6]; shrink when
    // fewer than scale_down_free_gpus are free (0: never for that reason),
    // in [0, scale_up_free_gpus], or when other jobs wait for GPUs.
    // Defaults 1 and 0.
    int64_t scale_up_free_gpus = 1;
    int64_t scale_down_free_gpus = 0;
    // Seconds between readings of the signal, in [1, 86400]. Default 15.
    int64_t interval_s = 15;
    // Seconds after a change before the next one, in [0, 86400]. Default 30.
    int64_t cooldown_s = 30;
    // Stabilization windows (Kubernetes HPA semantics), in seconds, in
    // [0, 86400]: the job grows only to the lowest size recommended during
    // the last scale_up_stabilization_s, and shrinks only to the highest
    // recommended during the last scale_down_stabilization_s. Defaults 0
    // and 60.
    int64_t scale_up_stabilization_s = 0;
    int64_t scale_down_stabilization_s = 60;
    // Workers that died (or were stuck) and were replaced, at most, in
    // [0, 1e6]; past it the autoscaler replaces no more and says so.
    // Default 20.
    int64_t max_restarts = 20;
    // Wait before replacing a worker that exited within a minute of its
    // start, in seconds, in [0, 3600], doubling with each such exit in a
    // row up to 64 times. Default 5.
    int64_t restart_backoff_s = 5;
    // Parameter servers (master/autoscale/server_scaler.h): with
    // max_servers > 0 the autoscaler keeps between min_servers and
    // max_servers servers, starting eps-server processes on the master's
    // machine (on DATA_DIR/servers/server-<launch id>; they join the
    // running job) and draining idle ones. max_servers in [0, 4096],
    // default 0 (the servers are left alone); min_servers in
    // [1, max_servers], default 1. Works with any autoscale.source.
    int64_t min_servers = 1;
    int64_t max_servers = 0;
    // A server is short of room, and the job grows by one server, when its
    // rows in memory pass servers_memory_high of its ps.memory_budget_mb
    // (in (0, 1]; default 0.9) and it evicts rows to stay within it, its
    // hit rate over the last interval is
    // below servers_min_hit_rate (in [0, 1]; 0, the default: never), or its
    // pushes' p99 over the last interval is above servers_max_push_ms
    // (>= 0; 0, the default: never). The job shrinks by one server when,
    // with one fewer, every rule set would still hold with room: the rows
    // in memory of all of them under half of servers_memory_high of the
    // budgets, the hit rate at least servers_min_hit_rate and the p99
    // under half of servers_max_push_ms. With no rule set it never shrinks.
    double servers_memory_high = 0.9;
    double servers_min_hit_rate = 0;
    double servers_max_push_ms = 0;
    // The eps-server to run; empty: the one next to eps-master.
    std::string server_binary;
  } autoscale;

  // Who may act on the job (rpc/security.h). Each process reads these for
  // itself; they need not agree beyond the keys.
  struct Security {
    // "curve": every connection is encrypted and every peer authenticated
    // by the job's keys, each request authorized by its sender's role;
    // "off": anyone who reaches a port can act on the job (must be set
    // explicitly, and every process warns at its start). Default curve.
    std::string mode = "curve";
    // The directory of the job's keys (eps-keygen --out DIR); required
    // under curve. Default empty.
    std::string keys_dir;
    // The file holding the bearer token of the master's mutating HTTP
    // endpoints; empty: KEYS_DIR/http_token. Default empty.
    std::string http_token_file;
  } security;

  // Calls `visitor` once for every option, in file order.
  void VisitOptions(OptionVisitor& visitor);

  // Rejects nonsense values: every numeric option outside its range (the
  // comments above), chosen so that no value that passes wraps or overflows
  // where it travels. kInvalidArgument, its message naming the option and
  // the bound; the option's name is also attached as the payload
  // kOptionPayload.
  Status Validate() const;

  // The effective optimizer of every table optimizer.per_table names: the
  // [optimizer] settings with that table's entry applied (its per_table is
  // empty). Table names are not checked against a model here. Errors,
  // kInvalidArgument naming optimizer.per_table and the bad piece (with the
  // kOptionPayload payload as for Validate): a malformed entry, an unknown
  // key, a key set twice, a table named twice, a bad value; and
  // MlpOptimizer()'s. `is_mlp` (when given) says which named tables are MLP
  // layers: their entries apply over MlpOptimizer() instead.
  StatusOr<std::map<std::string, Optimizer>> OptimizerOverrides(
      const std::function<bool(absl::string_view)>& is_mlp = nullptr) const;

  // master.max_workers, with 0 resolved (see there).
  int64_t MaxWorkers() const;

  // The row policy (admission and expiry) of every embedding table
  // ps.per_table names: ps.admission_min_count and ps.ttl_passes with that
  // table's entry applied. Table names are not checked against a model
  // here. kInvalidArgument naming ps.per_table and the bad piece (payload
  // as for Validate): a malformed entry, an unknown key, a key set twice, a
  // table named twice, a value out of range.
  struct RowPolicy {
    int64_t admission_min_count = 0;
    int64_t ttl_passes = 0;
  };
  StatusOr<std::map<std::string, RowPolicy>> RowPolicies() const;

  // The settings of every MLP layer a per_table entry does not name:
  // [optimizer] with optimizer.mlp applied (its per_table and mlp are
  // empty). kInvalidArgument naming optimizer.mlp (payload as for
  // Validate) when it is malformed or makes invalid settings.
  StatusOr<Optimizer> MlpOptimizer() const;

  // "section.key = value" lines for every option, for startup logs.
  std::string DebugString() const;

  // Every option as a job file that reads back as this config (doubles
  // exact): what the autoscaler's workers are started with.
  // kInvalidArgument naming the option (with the kOptionPayload payload)
  // for a value a job file cannot hold: one with a newline or a '#' (which
  // starts a comment), possible only from the command line.
  StatusOr<std::string> ToIni() const;

  // The options every process of a job must share with the master (the
  // data format, the model, the optimizer, the placement, durability, the
  // heartbeat and the lease), as (name, value) pairs in file order, each
  // value exact (a double as the shortest text that reads back as it).
  // Options a process may set for itself (worker.*, ps.threads,
  // ps.memory_budget_mb, ps.flush_interval_ms, checkpoint.dir, ...) and
  // those only the master reads are not among them.
  std::vector<std::pair<std::string, std::string>> SharedOptions() const;
};

// How a member's shared options (`member`, as its SharedOptions made them)
// differ from the master's (`master`): "NAME = MEMBER'S (the master has
// MASTER'S)" items joined by "; ", an option only one side names counting
// as "(not set)" on the other; empty when they agree.
std::string DescribeOptionDifferences(
    const std::vector<std::pair<std::string, std::string>>& member,
    const std::vector<std::pair<std::string, std::string>>& master);

// Parses a comma-separated list of layer sizes ("512,256,1"): each an
// integer in [1, 65536], at least one. kInvalidArgument naming `option`
// (with the kOptionPayload payload) and the bad item.
StatusOr<std::vector<int>> ParseLayerSizes(absl::string_view option, const std::string& value);

// Payload type URL under which Validate() attaches the offending option name.
inline constexpr char kOptionPayload[] = "eps.option";

}  // namespace eps

#endif  // EPS_CORE_JOB_CONFIG_H_
