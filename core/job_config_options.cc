// The table of every option of the job config: its name, its field in
// JobConfig and its help, in the order `eps-master --help` and ToIni print
// them (JobConfig::VisitOptions). Bounds and checks: job_config.cc.

#include "core/job_config.h"

namespace eps {

void JobConfig::VisitOptions(OptionVisitor& v) {
  v.Visit("job.name", &job.name, "job name shown in logs and /status");
  v.Visit("job.epochs", &job.epochs, "passes over data.train");
  v.Visit("job.seed", &job.seed, "seed of shard shuffling and initialisation");
  v.Visit("job.progress_interval_s", &job.progress_interval_s,
          "seconds between progress lines in the logs");
  v.Visit("job.divergence_factor", &job.divergence_factor,
          "stop when the recent loss stays past this times epoch 1's (at most ln 2) for 64 "
          "batches; 0 never");
  v.Visit("job.export_dir", &job.export_dir,
          "where servers and master write the trained model at the end; empty: no export");
  v.Visit("job.init_from", &job.init_from,
          "a model export to start from (warm start); empty: new rows");
  v.Visit("job.init_optimizer_state", &job.init_optimizer_state,
          "with job.init_from: load the optimizer state too");

  v.Visit("data.train", &data.train, "training files, globs or directories, comma-separated");
  v.Visit("data.eval", &data.eval, "evaluation files, globs or directories; empty: no eval");
  v.Visit("data.format", &data.format, "criteo or tsv");
  v.Visit("data.schema", &data.schema,
          "tsv column kinds (label, dense, cat, multicat, skip), e.g. label,dense*13,cat*26");
  v.Visit("data.multi_value_separator", &data.multi_value_separator,
          "the character between the values of a multicat column");
  v.Visit("data.shard_records", &data.shard_records, "records per data shard");
  v.Visit("data.on_unreadable", &data.on_unreadable,
          "a data file that cannot be read at run time: fail or skip");

  v.Visit("model.type", &model.type, "model: lr, wdl, deepfm or dlrm");
  v.Visit("model.embedding_dim", &model.embedding_dim, "floats per embedding row");
  v.Visit("model.initializer", &model.initializer, "auto, zeros, normal or uniform");
  v.Visit("model.init_scale", &model.init_scale, "stddev (normal) or half-width (uniform)");
  v.Visit("model.mlp", &model.mlp, "wdl/deepfm deep MLP layer sizes; the last must be 1");
  v.Visit("model.bottom_mlp", &model.bottom_mlp,
          "dlrm bottom MLP layer sizes; the last must be model.embedding_dim");
  v.Visit("model.top_mlp", &model.top_mlp, "dlrm top MLP layer sizes; the last must be 1");
  v.Visit("model.activation", &model.activation, "hidden-layer activation: relu, sigmoid, tanh");
  v.Visit("model.pooling", &model.pooling, "how a multi-value field's rows combine: sum or mean");

  v.Visit("optimizer.type", &optimizer.type, "sgd, adagrad, adam or ftrl");
  v.Visit("optimizer.learning_rate", &optimizer.learning_rate, "step size (ftrl: alpha)");
  v.Visit("optimizer.initial_accumulator", &optimizer.initial_accumulator,
          "adagrad accumulator start value");
  v.Visit("optimizer.epsilon", &optimizer.epsilon, "adagrad and adam denominator epsilon");
  v.Visit("optimizer.l2", &optimizer.l2, "L2 penalty");
  v.Visit("optimizer.beta1", &optimizer.beta1, "adam first-moment decay, in [0, 1)");
  v.Visit("optimizer.beta2", &optimizer.beta2, "adam second-moment decay, in [0, 1)");
  v.Visit("optimizer.ftrl_beta", &optimizer.ftrl_beta, "ftrl beta, >= 0");
  v.Visit("optimizer.l1", &optimizer.l1, "ftrl L1 penalty");
  v.Visit("optimizer.clip", &optimizer.clip,
          "clip each gradient value to [-clip, clip] on the servers; 0 off");
  v.Visit("optimizer.lr_scaling", &optimizer.lr_scaling,
          "learning rate against the batch trained: none, linear or sqrt");
  v.Visit("optimizer.lr_warmup_batches", &optimizer.lr_warmup_batches,
          "batches over which the scale follows a batch-size change; 0 at once");
  v.Visit("optimizer.dense_global_batch", &optimizer.dense_global_batch,
          "records per optimizer step of the dense tensors, whichever workers sent them; "
          "0 a step per push");
  v.Visit("optimizer.mlp", &optimizer.mlp,
          "settings over the ones above for the MLP layers, key=value[,key=value...]; "
          "empty: the same");
  v.Visit("optimizer.per_table", &optimizer.per_table,
          "per-table settings, TABLE:key=value[,key=value...][;TABLE:...]");

  v.Visit("ps.num_servers", &ps.num_servers, "servers the master waits for");
  v.Visit("ps.partitions", &ps.partitions, "virtual partitions of the key space");
  v.Visit("ps.threads", &ps.threads, "request threads per server");
  v.Visit("ps.memory_budget_mb", &ps.memory_budget_mb, "hot-tier budget in MiB, 0 unlimited");
  v.Visit("ps.flush_interval_ms", &ps.flush_interval_ms, "longest time rows stay unflushed");
  v.Visit("ps.journal_mb", &ps.journal_mb, "journal size at which rows go to the store");
  v.Visit("ps.master_wait_s", &ps.master_wait_s,
          "seconds a server keeps trying to reach the master");
  v.Visit("ps.leave_timeout_s", &ps.leave_timeout_s,
          "seconds a server sent SIGTERM waits for its drain");
  v.Visit("ps.rpc_timeout_ms", &ps.rpc_timeout_ms, "time per attempt of a server's call");
  v.Visit("ps.durability", &ps.durability, "flush or every_push");
  v.Visit("ps.dense_chunk_floats", &ps.dense_chunk_floats, "floats per dense-tensor chunk");
  v.Visit("ps.max_new_rows_s", &ps.max_new_rows_s,
          "rows all workers together may create per second on a server, 0 unlimited");
  v.Visit("ps.max_new_rows_per_worker_s", &ps.max_new_rows_per_worker_s,
          "rows one worker may create per second on a server, 0 unlimited");
  v.Visit("ps.admission_min_count", &ps.admission_min_count,
          "pushes an id needs before it gets an embedding row; 0 or 1 every id at once");
  v.Visit("ps.admission_memory_mb", &ps.admission_memory_mb,
          "memory per table for counting ids not admitted yet, MiB");
  v.Visit("ps.ttl_passes", &ps.ttl_passes,
          "passes an embedding row may go untrained before it is deleted; 0 keeps every row");
  v.Visit("ps.per_table", &ps.per_table,
          "admission_min_count and ttl_passes per embedding table, "
          "TABLE:key=value[,key=value...][;TABLE:...]");

  v.Visit("worker.batch_size", &worker.batch_size,
          "records per batch, or auto (min_batch_size..max_batch_size by throughput)");
  v.Visit("worker.min_batch_size", &worker.min_batch_size,
          "batch_size = auto: the batch workers start at (and the learning rate's reference)");
  v.Visit("worker.max_batch_size", &worker.max_batch_size,
          "batch_size = auto: the largest batch a worker grows to");
  v.Visit("worker.prefetch_batches", &worker.prefetch_batches, "batches prepared ahead");
  v.Visit("worker.max_staleness", &worker.max_staleness,
          "updates of a dense tensor a step's copy may miss");
  v.Visit("worker.dense_wire", &worker.dense_wire,
          "float32 or bfloat16: how a step's dense tensors travel");
  v.Visit("worker.rpc_timeout_ms", &worker.rpc_timeout_ms, "time per attempt of a call");
  v.Visit("worker.rpc_attempts", &worker.rpc_attempts, "attempts per call");
  v.Visit("worker.master_wait_s", &worker.master_wait_s,
          "seconds a worker keeps trying to reach the master");
  v.Visit("worker.compute_threads", &worker.compute_threads,
          "CPU threads of the model math; 0 = its share of the CPUs it may use");
  v.Visit("worker.max_records_per_s", &worker.max_records_per_s,
          "cap on a worker's records/s, 0 none (demos, tests)");
  v.Visit("worker.deterministic", &worker.deterministic,
          "steps wait for the last push and pull again: the same bits every run (checks)");

  v.Visit("master.heartbeat_ms", &master.heartbeat_ms, "heartbeat interval");
  v.Visit("master.lease_ms", &master.lease_ms, "heartbeat silence after which a peer is dead");
  v.Visit("master.bind_host", &master.bind_host, "address the master binds to");
  v.Visit("master.recovery_timeout_s", &master.recovery_timeout_s,
          "longest wait for a missing server (at the start, in a recovery)");
  v.Visit("master.progress_timeout_s", &master.progress_timeout_s,
          "a worker holding a shard without committing for this long is fenced");
  v.Visit("master.worker_wait_s", &master.worker_wait_s,
          "stop when no worker is alive for this long; 0 wait forever");
  v.Visit("master.max_workers", &master.max_workers,
          "live workers admitted at most; 0 sized to autoscale.max_workers");
  v.Visit("master.eval_check_records", &master.eval_check_records,
          "evaluation records per commit the master recomputes; 0 none");

  v.Visit("checkpoint.interval_s", &checkpoint.interval_s, "seconds between checkpoints");
  v.Visit("checkpoint.keep", &checkpoint.keep, "checkpoints each server keeps");
  v.Visit("checkpoint.restore", &checkpoint.restore,
          "checkpoint id a server restores before opening its store");
  v.Visit("checkpoint.dir", &checkpoint.dir,
          "where servers write checkpoints (shared storage for replacement servers)");
  v.Visit("checkpoint.on_server_failure", &checkpoint.on_server_failure,
          "rollback or continue");
  v.Visit("checkpoint.max_failures", &checkpoint.max_failures,
          "stop after this many failed checkpoints in a row; 0 never");

  v.Visit("autoscale.source", &autoscale.source,
          "none (off), slurm, prometheus or command: where the free GPUs are read");
  v.Visit("autoscale.partition", &autoscale.partition,
          "source or launcher slurm: the Slurm partition of the workers");
  v.Visit("autoscale.sbatch_args", &autoscale.sbatch_args,
          "launcher=slurm: more sbatch options for each worker job (--account=A --time=T)");
  v.Visit("autoscale.command", &autoscale.command,
          "source=command: shell command printing FREE_GPUS [PENDING_GPUS]");
  v.Visit("autoscale.prometheus_url", &autoscale.prometheus_url,
          "source=prometheus: the server, http://HOST:PORT");
  v.Visit("autoscale.query", &autoscale.query, "source=prometheus: PromQL giving the free GPUs");
  v.Visit("autoscale.pending_query", &autoscale.pending_query,
          "source=prometheus: PromQL giving the GPUs other jobs wait for (optional)");
  v.Visit("autoscale.source_timeout_s", &autoscale.source_timeout_s,
          "longest reading of the signal or launcher command, seconds");
  v.Visit("autoscale.launcher", &autoscale.launcher, "local, slurm or command");
  v.Visit("autoscale.start_command", &autoscale.start_command,
          "launcher=command: starts worker {id} ({master}, {config}); may print a handle");
  v.Visit("autoscale.stop_command", &autoscale.stop_command,
          "launcher=command: stops worker {id} ({handle}) gracefully");
  v.Visit("autoscale.worker_binary", &autoscale.worker_binary,
          "launcher local or slurm: eps-worker to run; empty: the one next to eps-master");
  v.Visit("autoscale.min_workers", &autoscale.min_workers, "workers kept at least");
  v.Visit("autoscale.max_workers", &autoscale.max_workers, "workers kept at most");
  v.Visit("autoscale.gpus_per_worker", &autoscale.gpus_per_worker, "GPUs one worker takes");
  v.Visit("autoscale.scale_up_free_gpus", &autoscale.scale_up_free_gpus,
          "grow while at least this many GPUs are free");
  v.Visit("autoscale.scale_down_free_gpus", &autoscale.scale_down_free_gpus,
          "shrink when fewer GPUs than this are free; 0 never for that reason");
  v.Visit("autoscale.interval_s", &autoscale.interval_s, "seconds between readings of the signal");
  v.Visit("autoscale.cooldown_s", &autoscale.cooldown_s, "seconds after a change before the next");
  v.Visit("autoscale.scale_up_stabilization_s", &autoscale.scale_up_stabilization_s,
          "grow only to the lowest size recommended in this many seconds");
  v.Visit("autoscale.scale_down_stabilization_s", &autoscale.scale_down_stabilization_s,
          "shrink only to the highest size recommended in this many seconds");
  v.Visit("autoscale.max_restarts", &autoscale.max_restarts,
          "dead or stuck workers replaced at most");
  v.Visit("autoscale.restart_backoff_s", &autoscale.restart_backoff_s,
          "wait before replacing a worker that died within a minute, doubling in a row");
  v.Visit("autoscale.min_servers", &autoscale.min_servers,
          "with max_servers: parameter servers kept at least");
  v.Visit("autoscale.max_servers", &autoscale.max_servers,
          "parameter servers kept at most; 0 leaves the servers alone");
  v.Visit("autoscale.servers_memory_high", &autoscale.servers_memory_high,
          "add a server when one holds this fraction of its memory budget and evicts");
  v.Visit("autoscale.servers_min_hit_rate", &autoscale.servers_min_hit_rate,
          "add a server when one's hit rate falls below this; 0 never");
  v.Visit("autoscale.servers_max_push_ms", &autoscale.servers_max_push_ms,
          "add a server when one's push p99 passes this many ms; 0 never");
  v.Visit("autoscale.server_binary", &autoscale.server_binary,
          "eps-server to start; empty: the one next to eps-master");
  v.Visit("security.mode", &security.mode,
          "curve (peers authenticated by the job's keys) or off (anyone can act on the job)");
  v.Visit("security.keys_dir", &security.keys_dir, "the job's keys (eps-keygen --out DIR)");
  v.Visit("security.http_token_file", &security.http_token_file,
          "bearer token of mutating HTTP endpoints (empty: KEYS_DIR/http_token)");
}

}  // namespace eps
