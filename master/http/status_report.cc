#include "master/http/status_report.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/metrics.h"
#include "master/checkpoint_coordinator.h"
#include "master/membership.h"
#include "master/progress/training_progress.h"
#include "master/progress_meter.h"
#include "master/recovery.h"
#include "proto/eps.pb.h"

namespace eps {

using nlohmann::json;

namespace {

// A dense staleness a server or worker measured: the pushes or steps
// (`counted`) it counts, their mean, and the bucket bounds under which half
// and 99% of them fall (null above the largest bound; null for all without
// any or for a malformed histogram).
json StalenessSummary(const proto::Histogram& wire, const char* counted) {
  StatusOr<HistogramSnapshot> snapshot = HistogramFromProto(wire);
  json summary = {{counted, 0}, {"mean", nullptr}, {"p50", nullptr}, {"p99", nullptr}};
  if (!snapshot.ok() || snapshot->count == 0) return summary;
  summary[counted] = snapshot->count;
  summary["mean"] = snapshot->sum / static_cast<double>(snapshot->count);
  for (const auto& [name, share] : {std::pair{"p50", 0.5}, std::pair{"p99", 0.99}}) {
    if (std::optional<double> bound = QuantileBound(*snapshot, share)) summary[name] = *bound;
  }
  return summary;
}

// Where a worker's steps spent their time: the mean milliseconds of each
// wait for its batch, for the dense tensors and to hand a step over (its
// pushes and commits), and of each step's compute (null when none was
// measured or reported); `steps` counts the steps computed.
json StepTimes(const proto::WorkerStats& stats) {
  uint64_t steps = 0;
  const auto mean_ms = [](const proto::Histogram& wire, uint64_t* count = nullptr) -> json {
    StatusOr<HistogramSnapshot> snapshot = HistogramFromProto(wire);
    if (!snapshot.ok() || snapshot->count == 0) return nullptr;
    if (count != nullptr) *count = snapshot->count;
    return 1e3 * snapshot->sum / static_cast<double>(snapshot->count);
  };
  json times = {{"batch_wait", mean_ms(stats.batch_wait())},
                {"dense_wait", mean_ms(stats.staleness_wait())},
                {"compute", mean_ms(stats.compute(), &steps)},
                {"push_wait", mean_ms(stats.push_wait())}};
  times["steps"] = steps;
  return times;
}

}  // namespace

// A server's global batches (ServerStats.global_*), or the sum of several.
json GlobalBatchSummary(const proto::ServerStats& stats) {
  const uint64_t taken = stats.global_step_records();
  const uint64_t dropped = stats.global_records_dropped();
  return {{"steps", stats.global_steps()},
          {"records_per_step", stats.global_steps() > 0
                                   ? static_cast<double>(taken) /
                                         static_cast<double>(stats.global_steps())
                                   : 0.0},
          {"pushes_decayed", stats.global_pushes_decayed()},
          {"pushes_dropped", stats.global_pushes_dropped()},
          {"records_dropped", dropped},
          {"reads_refused", stats.global_reads_refused()},
          {"reservations_expired", stats.global_reservations_expired()},
          {"dropped_share", taken + dropped > 0 ? static_cast<double>(dropped) /
                                                      static_cast<double>(taken + dropped)
                                                : 0.0}};
}

json StatusDocument(const JobControl& control, absl::Time now) {
  const JobConfig& job = control.job();
  const TrainingProgress& progress = control.progress();
  const Membership& membership = control.membership();
  const CheckpointCoordinator& checkpoints = control.checkpoints();
  const Recovery& recovery = control.recovery();
  const ProgressMeter& meter = control.meter();
  const JobPhase phase = progress.phase();
  const ShardTracker* tracker = progress.tracker();

  json doc;
  doc["job"] = job.job.name;
  doc["state"] = phase == JobPhase::kFinished ? "finished"
                 : phase == JobPhase::kFailed ? "failed"
                                              : "running";
  doc["phase"] = JobPhaseName(phase);
  if (!progress.failure().empty()) doc["error"] = progress.failure();
  doc["epoch"] = progress.epoch() + 1;
  doc["epochs"] = job.job.epochs;
  doc["elapsed_s"] = absl::ToDoubleSeconds(now - control.started());
  doc["resumed"] = control.resumed();
  json shards = {{"total", 0}, {"todo", 0}, {"doing", 0}, {"done", 0}};
  if (tracker != nullptr) {
    shards = {{"total", tracker->num_shards()},
              {"todo", tracker->todo()},
              {"doing", tracker->doing()},
              {"done", tracker->done()}};
  } else if (phase == JobPhase::kFinished) {
    const uint64_t total = progress.train_data().shards.size();
    shards = {{"total", total}, {"todo", 0}, {"doing", 0}, {"done", total}};
  }
  doc["shards"] = shards;
  doc["records_trained"] = progress.records_trained();
  doc["records_retrained"] = progress.records_retrained();
  doc["records_per_epoch"] = progress.train_data().lines;
  doc["records_per_s"] = meter.records_per_s();
  doc["eta_s"] = NullableNumber(control.EtaSeconds());
  doc["history"] = json(std::vector<json>(meter.history().begin(), meter.history().end()));
  doc["records_malformed"] = progress.records_malformed();
  doc["malformed_examples"] = progress.malformed_examples();
  doc["membership_epoch"] = membership.generation();
  doc["reassignments"] = progress.reassignments();
  const std::optional<uint64_t> round = checkpoints.round_id();
  doc["checkpoints"] = {{"written", checkpoints.written()},
                        {"failed", checkpoints.failed()},
                        {"interval_s", job.checkpoint.interval_s},
                        {"pause_s", checkpoints.pause_s()},
                        {"in_progress", round.has_value() ? json(*round) : json(nullptr)},
                        {"last", checkpoints.LastResult()}};
  json recovering = {{"in_progress", nullptr},
                     {"recoveries", recovery.count()},
                     {"on_server_failure", job.checkpoint.on_server_failure},
                     {"last", recovery.last()}};
  if (recovery.active()) {
    const std::optional<proto::CheckpointRecord>& last = checkpoints.last();
    recovering["in_progress"] = {
        {"reason", recovery.why()},
        {"checkpoint", last.has_value() ? json(last->id()) : json(nullptr)},
        {"waiting_for_servers", membership.MissingServers()},
        {"since_s", absl::ToDoubleSeconds(now - recovery.started())}};
  }
  doc["recovery"] = recovering;
  doc["moves"] = control.moves().ToJson(now);
  if (progress.stopped()) doc["resumable"] = true;
  doc["splits"] = progress.splits();
  doc["workers_fenced"] = membership.fenced().size();
  doc["max_reassign_delay_ms"] = absl::ToDoubleMilliseconds(progress.worst_reassign_delay());
  doc["cluster_map_version"] = membership.cluster_map().version();
  doc["waiting_for"] = control.Waits(now);

  const std::vector<proto::EpochLedger>& ledger = progress.ledger();
  json epochs = json::array();
  for (size_t e = 0; e < ledger.size(); ++e) {
    const proto::EpochLedger& entry = ledger[e];
    const bool complete = progress.EpochComplete(e);
    epochs.push_back(
        {{"epoch", entry.epoch()},
         {"lines_expected", entry.records_expected()},
         {"lines_committed", entry.lines_committed()},
         {"records_committed", entry.records_committed()},
         {"malformed", entry.malformed()},
         {"lines_skipped", entry.lines_skipped()},
         {"skipped", std::vector<std::string>(entry.skipped().begin(), entry.skipped().end())},
         {"complete", complete},
         // Every line counted once: committed, or skipped with its reason.
         {"exactly_once", complete && entry.lines_committed() + entry.lines_skipped() ==
                                          entry.records_expected()}});
  }
  doc["ledger"] = epochs;

  json workers = json::array();
  for (const auto& [id, worker] : membership.workers()) {
    // What its steps trained with: the updates their dense copy missed
    // (worker.max_staleness bounds them) and the time they waited for it.
    json staleness = StalenessSummary(worker.stats.dense_staleness(), "steps");
    staleness["max"] = worker.stats.dense_staleness_max();
    StatusOr<HistogramSnapshot> waits = HistogramFromProto(worker.stats.staleness_wait());
    staleness["wait_s"] = waits.ok() ? waits->sum : 0.0;
    workers.push_back(
        {{"id", id},
         {"state", PeerStateName(worker.state)},
         {"host", worker.host},
         {"pid", worker.pid},
         {"launch_id", worker.launch_id},
         {"device", worker.device},
         {"records", worker.records},
         {"records_per_s", worker.state == PeerState::kAlive ? worker.records_per_s : 0.0},
         {"batch_size", worker.stats.batch_size()},
         {"dense_staleness", staleness},
         {"step_ms", StepTimes(worker.stats)}});
  }
  doc["workers"] = workers;
  json servers = json::array();
  const std::map<uint32_t, uint32_t> partitions_of = membership.PartitionCounts();
  for (const auto& [id, server] : membership.servers()) {
    const uint32_t partitions = partitions_of.at(id);
    servers.push_back(
        {{"id", id},
         {"state", PeerStateName(server.state)},
         {"endpoint", server.endpoint},
         {"host", server.host},
         {"pid", server.pid},
         {"partitions", partitions},
         {"rows", server.stats.rows()},
         {"memory_bytes", server.stats.bytes()},
         {"rows_on_disk", server.stats.rows_on_disk()},
         {"disk_bytes", server.stats.disk_bytes()},
         {"store_memory_bytes", server.stats.store_memory_bytes()},
         {"hit_rate", server.stats.hits() + server.stats.misses() > 0
                          ? static_cast<double>(server.stats.hits()) /
                                static_cast<double>(server.stats.hits() + server.stats.misses())
                          : 1.0},
         {"evictions", server.stats.evictions()},
         {"last_flush_ms", server.stats.last_flush_ms()},
         {"pushes_fenced", server.stats.pushes_fenced()},
         {"pushes_deduplicated", server.stats.pushes_deduplicated()},
         {"updates_refused", server.stats.updates_refused()},
         {"admission", {{"rows_admitted", server.stats.rows_admitted()},
                        {"updates_rejected", server.stats.updates_rejected()},
                        {"candidates", server.stats.admission_candidates()}}},
         {"rows_expired", server.stats.rows_expired()},
         {"requests_refused", server.stats.requests_refused()},
         {"requests_unauthenticated", server.stats.requests_unauthenticated()},
         {"requests_limited", server.stats.requests_limited()},
         {"dense_staleness", StalenessSummary(server.stats.dense_staleness(), "pushes")},
         {"global_batch", GlobalBatchSummary(server.stats)}});
  }
  doc["servers"] = servers;
  if (job.optimizer.dense_global_batch > 0) {
    // Over every slot's chunks of the dense tensors, as each process last
    // reported (counted since it started).
    proto::ServerStats sum;
    for (const auto& [id, server] : membership.servers()) {
      sum.set_global_steps(sum.global_steps() + server.stats.global_steps());
      sum.set_global_step_records(sum.global_step_records() + server.stats.global_step_records());
      sum.set_global_pushes_decayed(sum.global_pushes_decayed() +
                                    server.stats.global_pushes_decayed());
      sum.set_global_pushes_dropped(sum.global_pushes_dropped() +
                                    server.stats.global_pushes_dropped());
      sum.set_global_records_dropped(sum.global_records_dropped() +
                                     server.stats.global_records_dropped());
      sum.set_global_reads_refused(sum.global_reads_refused() +
                                   server.stats.global_reads_refused());
      sum.set_global_reservations_expired(sum.global_reservations_expired() +
                                          server.stats.global_reservations_expired());
    }
    json global = GlobalBatchSummary(sum);
    global["records"] = job.optimizer.dense_global_batch;
    doc["global_batch"] = std::move(global);
  }

  // train_loss is the last complete epoch's mean loss.
  std::optional<double> train_loss;
  json epoch_losses = json::array();
  for (size_t e = 0; e < ledger.size(); ++e) {
    if (!progress.EpochComplete(e) || ledger[e].records_committed() == 0) continue;
    train_loss = ledger[e].loss_sum() / static_cast<double>(ledger[e].records_committed());
    epoch_losses.push_back(*train_loss);
  }
  doc["metrics"] = {{"train_loss", NullableNumber(train_loss)},
                    {"epoch_loss_so_far", NullableNumber(progress.RunningLoss())},
                    {"recent_loss", NullableNumber(progress.RecentLoss())},
                    {"epoch_train_loss", epoch_losses},
                    {"eval_auc", NullableNumber(progress.eval_auc())},
                    {"eval_logloss", NullableNumber(progress.eval_logloss())},
                    {"eval_records", progress.eval_records()},
                    {"eval_lines_skipped", progress.eval_lines_skipped()},
                    {"eval_skipped", progress.eval_skipped()}};
  return doc;
}

std::string MetricsText(const JobControl& control) {
  // Families in a fixed order, each with every series it has: job progress,
  // training quality, membership and shards, per worker, per server,
  // checkpoints and recoveries. docs/observability.md "Metrics" lists them.
  const JobConfig& job = control.job();
  const TrainingProgress& progress = control.progress();
  const Membership& membership = control.membership();
  const CheckpointCoordinator& checkpoints = control.checkpoints();
  const JobPhase phase = progress.phase();
  const ShardTracker* tracker = progress.tracker();

  PrometheusWriter out;
  auto gauge = [&out](const char* name, const char* help, double value) {
    out.Family(name, MetricType::kGauge, help);
    out.Sample(value);
  };
  auto counter = [&out](const char* name, const char* help, double value) {
    out.Family(name, MetricType::kCounter, help);
    out.Sample(value);
  };

  // Not "job": Prometheus gives every target a job label of its own.
  out.Family("eps_job_info", MetricType::kGauge, "The job's name and id; always 1.");
  out.Sample({{"name", job.job.name}, {"job_id", control.job_spec().job_id()}}, 1);
  out.Family("eps_job_phase", MetricType::kGauge,
             "1 for the job's current phase, 0 for the others.");
  for (JobPhase each : {JobPhase::kScanning, JobPhase::kTraining, JobPhase::kEvaluating,
                        JobPhase::kFinished, JobPhase::kFailed}) {
    out.Sample({{"phase", JobPhaseName(each)}}, each == phase ? 1 : 0);
  }
  gauge("eps_job_epoch", "Current training epoch, 1-based.", progress.epoch() + 1);
  gauge("eps_job_epochs", "Training epochs of the job.", static_cast<double>(job.job.epochs));
  gauge("eps_job_pass_done_ratio",
        "Fraction of the current pass (training epoch or evaluation) committed.",
        progress.PassFraction());
  gauge("eps_job_records_trained",
        "The job's progress: training records committed, each once per epoch, over all epochs. "
        "Falls back when a recovery rolls the job back.",
        static_cast<double>(progress.records_trained()));
  // Counted from the workers' entries, which are never removed: unlike
  // records_trained, no rollback lowers it.
  uint64_t committed = 0;
  for (const auto& [id, worker] : membership.workers()) committed += worker.records;
  counter("eps_records_trained_total",
          "Training records committed by workers since this master started, including those a "
          "recovery rolled back.",
          static_cast<double>(committed));
  counter("eps_records_retrained_total",
          "Records trained again: pushed by a worker that died before committing them, or rolled "
          "back by a recovery.",
          static_cast<double>(progress.records_retrained()));
  gauge("eps_records_per_second", "Records committed per second over the last progress interval.",
        control.meter().records_per_s());

  const std::vector<proto::EpochLedger>& ledger = progress.ledger();
  for (size_t e = ledger.size(); e-- > 0;) {
    if (!progress.EpochComplete(e) || ledger[e].records_committed() == 0) continue;
    gauge("eps_train_loss", "Mean train loss of the last finished epoch.",
          ledger[e].loss_sum() / static_cast<double>(ledger[e].records_committed()));
    break;
  }
  if (const std::optional<double> loss = progress.RunningLoss(); loss.has_value()) {
    gauge("eps_train_loss_current_epoch", "Mean train loss of the current epoch so far.", *loss);
  }
  if (const std::optional<double> auc = progress.eval_auc(); auc.has_value()) {
    gauge("eps_eval_auc", "Final evaluation AUC.", *auc);
  }
  if (const std::optional<double> logloss = progress.eval_logloss(); logloss.has_value()) {
    gauge("eps_eval_logloss", "Final evaluation log loss.", *logloss);
  }

  gauge("eps_membership_epoch", "Membership changes so far.",
        static_cast<double>(membership.generation()));
  uint64_t todo = 0, doing = 0, done = 0;
  if (tracker != nullptr) {
    todo = tracker->todo();
    doing = tracker->doing();
    done = tracker->done();
  } else if (phase == JobPhase::kFinished) {
    done = progress.train_data().shards.size();
  }
  out.Family("eps_shards", MetricType::kGauge, "Shards of the current pass by state.");
  out.Sample({{"state", "todo"}}, static_cast<double>(todo));
  out.Sample({{"state", "doing"}}, static_cast<double>(doing));
  out.Sample({{"state", "done"}}, static_cast<double>(done));
  counter("eps_reassignments_total", "Shards handed back after their worker died or left.",
          static_cast<double>(progress.reassignments()));
  counter("eps_splits_total", "Shards split off a straggler for an idle worker.",
          static_cast<double>(progress.splits()));
  const PeerState kStates[] = {PeerState::kAlive, PeerState::kDead, PeerState::kLeft,
                               PeerState::kFenced};
  out.Family("eps_workers", MetricType::kGauge, "Workers by state.");
  for (PeerState state : kStates) {
    int n = 0;
    for (const auto& [id, worker] : membership.workers()) n += worker.state == state;
    out.Sample({{"state", PeerStateName(state)}}, n);
  }
  out.Family("eps_servers", MetricType::kGauge, "Parameter servers by state.");
  for (PeerState state : kStates) {
    int n = 0;
    for (const auto& [id, server] : membership.servers()) n += server.state == state;
    out.Sample({{"state", PeerStateName(state)}}, n);
  }

  // Per peer. A gone worker's or server's series keep its last values (its
  // entry stays), so counters and histograms never go back; a server that
  // takes over a slot starts them again, as any restarted process does.
  std::vector<std::pair<std::string, const WorkerEntry*>> workers;
  for (const auto& [id, worker] : membership.workers()) {
    workers.emplace_back(absl::StrCat(id), &worker);
  }
  std::vector<std::pair<std::string, const ServerEntry*>> servers;
  // Keyed by the id as text, as the old code did: the series come out in
  // that (lexicographic) order, unlike the other per-server families.
  std::map<std::string, uint64_t> partitions;
  const std::map<uint32_t, uint32_t> partitions_of = membership.PartitionCounts();
  for (const auto& [id, server] : membership.servers()) {
    servers.emplace_back(absl::StrCat(id), &server);
    partitions[absl::StrCat(id)] = partitions_of.at(id);
  }
  // A histogram a peer has not reported (or reported malformed) has no
  // series.
  auto histogram = [&out](const std::string& label, const std::string& id,
                          const proto::Histogram& wire) {
    StatusOr<HistogramSnapshot> snapshot = HistogramFromProto(wire);
    if (snapshot.ok()) out.Histogram({{label, id}}, *snapshot);
  };
  out.Family("eps_worker_records_per_second", MetricType::kGauge,
             "Records a worker trains per second, as it reports; 0 once it is gone.");
  for (const auto& [id, worker] : workers) {
    out.Sample({{"worker", id}}, worker->state == PeerState::kAlive ? worker->records_per_s : 0);
  }
  out.Family("eps_worker_batch_size", MetricType::kGauge,
             "Records per batch a worker trains now (worker.batch_size, or its choice under "
             "auto).");
  for (const auto& [id, worker] : workers) {
    out.Sample({{"worker", id}}, static_cast<double>(worker->stats.batch_size()));
  }
  out.Family("eps_worker_records_committed_total", MetricType::kCounter,
             "Training records the master accepted from a worker.");
  for (const auto& [id, worker] : workers) {
    out.Sample({{"worker", id}}, static_cast<double>(worker->records));
  }
  // The histograms a worker reports in its heartbeats.
  using WorkerHistogram = const proto::Histogram& (*)(const proto::WorkerStats&);
  const struct {
    const char* name;
    const char* help;
    WorkerHistogram field;
  } worker_histograms[] = {
      {"eps_worker_pull_seconds",
       "Duration of a worker's pulls as its trainer sees them (all servers, network, retries).",
       [](const proto::WorkerStats& s) -> const proto::Histogram& { return s.pull_latency(); }},
      {"eps_worker_push_seconds",
       "Duration of a worker's pushes as its trainer sees them (all servers, network, retries).",
       [](const proto::WorkerStats& s) -> const proto::Histogram& { return s.push_latency(); }},
      {"eps_worker_dense_staleness",
       "Per step a worker started: the updates of the dense tensors its copy missed, as the "
       "worker knew them (worker.max_staleness bounds them).",
       [](const proto::WorkerStats& s) -> const proto::Histogram& { return s.dense_staleness(); }},
      {"eps_worker_staleness_wait_seconds",
       "Per step a worker started: the time it waited for a copy of the dense tensors within "
       "worker.max_staleness.",
       [](const proto::WorkerStats& s) -> const proto::Histogram& { return s.staleness_wait(); }},
      {"eps_worker_batch_wait_seconds",
       "Per step: the time a worker's trainer waited for its next batch (read, parsed, its "
       "embedding rows pulled).",
       [](const proto::WorkerStats& s) -> const proto::Histogram& { return s.batch_wait(); }},
      {"eps_worker_compute_seconds",
       "Per step: the time a worker's trainer computed (forward and backward).",
       [](const proto::WorkerStats& s) -> const proto::Histogram& { return s.compute(); }},
      {"eps_worker_push_wait_seconds",
       "Per step: the time a worker's trainer waited to hand the step over (its pushes and "
       "commits behind it, at worker.max_staleness).",
       [](const proto::WorkerStats& s) -> const proto::Histogram& { return s.push_wait(); }},
  };
  for (const auto& family : worker_histograms) {
    out.Family(family.name, MetricType::kHistogram, family.help);
    for (const auto& [id, worker] : workers) {
      histogram("worker", id, family.field(worker->stats));
    }
  }

  auto per_server = [&out, &servers](const char* name, MetricType type, const char* help,
                                     const std::function<double(const ServerEntry&)>& value) {
    out.Family(name, type, help);
    for (const auto& [id, server] : servers) out.Sample({{"server", id}}, value(*server));
  };
  out.Family("eps_server_partitions", MetricType::kGauge, "Partitions a server owns.");
  for (const auto& [id, owned] : partitions) {
    out.Sample({{"server", id}}, static_cast<double>(owned));
  }
  per_server("eps_server_rows", MetricType::kGauge, "Rows a server holds in memory.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.rows()); });
  per_server("eps_server_rows_on_disk", MetricType::kGauge,
             "Rows in a server's on-disk store (approximate).",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.rows_on_disk()); });
  per_server("eps_server_memory_bytes", MetricType::kGauge, "Bytes of a server's rows in memory.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.bytes()); });
  per_server(
      "eps_server_memory_budget_bytes", MetricType::kGauge,
      "A server's memory budget for rows (ps.memory_budget_mb; 0: unlimited).",
      [](const ServerEntry& s) { return static_cast<double>(s.stats.memory_budget_bytes()); });
  per_server("eps_server_disk_bytes", MetricType::kGauge,
             "Bytes of a server's on-disk store (approximate).",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.disk_bytes()); });
  per_server(
      "eps_server_store_memory_bytes", MetricType::kGauge,
      "Bytes of memory a server's on-disk store holds: RocksDB's block cache, memtables and table "
      "readers (approximate).",
      [](const ServerEntry& s) { return static_cast<double>(s.stats.store_memory_bytes()); });
  per_server("eps_server_hit_ratio", MetricType::kGauge,
             "Fraction of a server's row lookups served from memory since it started (1 before "
             "any).",
             [](const ServerEntry& s) {
               const uint64_t lookups = s.stats.hits() + s.stats.misses();
               return lookups > 0
                          ? static_cast<double>(s.stats.hits()) / static_cast<double>(lookups)
                          : 1.0;
             });
  per_server("eps_server_row_hits_total", MetricType::kCounter,
             "Row lookups a server served from memory.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.hits()); });
  per_server("eps_server_row_misses_total", MetricType::kCounter,
             "Row lookups a server read from its store.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.misses()); });
  per_server("eps_server_evictions_total", MetricType::kCounter,
             "Rows a server evicted from memory.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.evictions()); });
  per_server("eps_server_last_flush_seconds", MetricType::kGauge,
             "Duration of a server's last flush of changed rows to its store.",
             [](const ServerEntry& s) { return s.stats.last_flush_ms() / 1000; });
  per_server("eps_server_pulls_total", MetricType::kCounter, "PULL requests a server applied.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.pulls()); });
  per_server("eps_server_pushes_total", MetricType::kCounter, "PUSH requests a server applied.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.pushes()); });
  per_server("eps_server_pushes_fenced_total", MetricType::kCounter,
             "Pushes a server refused because their worker was fenced.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.pushes_fenced()); });
  per_server(
      "eps_server_pushes_deduplicated_total", MetricType::kCounter,
      "Retried pushes a server acknowledged without applying them again.",
      [](const ServerEntry& s) { return static_cast<double>(s.stats.pushes_deduplicated()); });
  // Global batches (optimizer.dense_global_batch), each summed over a
  // server's chunks of dense tensors.
  const struct {
    const char* name;
    const char* help;
    uint64_t (proto::ServerStats::*field)() const;
  } global_batch_counters[] = {
      {"eps_server_global_steps_total",
       "Optimizer steps a server took on its chunks of dense tensors, one per global batch "
       "(optimizer.dense_global_batch), summed over the chunks.",
       &proto::ServerStats::global_steps},
      {"eps_server_global_step_records_total",
       "Records the global steps of a server averaged, summed over its dense chunks.",
       &proto::ServerStats::global_step_records},
      {"eps_server_global_pushes_decayed_total",
       "Pushes a server added to a global batch with a gradient decayed for staleness.",
       &proto::ServerStats::global_pushes_decayed},
      {"eps_server_global_pushes_dropped_total",
       "Pushes a server dropped from a global batch as computed on too old a version.",
       &proto::ServerStats::global_pushes_dropped},
      {"eps_server_global_records_dropped_total",
       "Records of the pushes a server dropped from a global batch as too stale.",
       &proto::ServerStats::global_records_dropped},
      {"eps_server_global_reads_refused_total",
       "Reads of a full global batch a server told to wait for its next version (BATCH_FULL), "
       "summed over its dense chunks.",
       &proto::ServerStats::global_reads_refused},
      {"eps_server_global_reservations_expired_total",
       "Reservations on a global batch a server gave up after their bound (a dead, frozen or "
       "slow worker), summed over its dense chunks.",
       &proto::ServerStats::global_reservations_expired},
  };
  for (const auto& counter : global_batch_counters) {
    per_server(counter.name, MetricType::kCounter, counter.help, [&counter](const ServerEntry& s) {
      return static_cast<double>((s.stats.*counter.field)());
    });
  }
  per_server("eps_server_updates_refused_total", MetricType::kCounter,
             "Row updates a server refused because they would have made a weight or an optimizer "
             "state non-finite (the row kept its values).",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.updates_refused()); });
  per_server("eps_server_rows_admitted_total", MetricType::kCounter,
             "Embedding rows a server made for a feature id at its ps.admission_min_count-th push.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.rows_admitted()); });
  per_server("eps_server_updates_rejected_total", MetricType::kCounter,
             "Pushed rows a server dropped because their feature id was not admitted yet.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.updates_rejected()); });
  per_server("eps_server_admission_candidates", MetricType::kGauge,
             "Feature ids a server counts toward admission now.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.admission_candidates()); });
  per_server("eps_server_rows_expired_total", MetricType::kCounter,
             "Embedding rows a server deleted, from memory and its store, because no push "
             "touched them for ps.ttl_passes training passes.",
             [](const ServerEntry& s) { return static_cast<double>(s.stats.rows_expired()); });
  out.Family("eps_server_requests_refused_total", MetricType::kCounter,
             "Requests a server refused: for their sender's role (reason permission_denied), "
             "for carrying no key the job trusts (unauthenticated; refused CURVE handshakes "
             "included), or for a limit (limit: requests in flight, message size, rows created).");
  for (const auto& [id, server] : servers) {
    out.Sample({{"server", id}, {"reason", "permission_denied"}},
               static_cast<double>(server->stats.requests_refused()));
    out.Sample({{"server", id}, {"reason", "unauthenticated"}},
               static_cast<double>(server->stats.requests_unauthenticated()));
    out.Sample({{"server", id}, {"reason", "limit"}},
               static_cast<double>(server->stats.requests_limited()));
  }
  out.Family("eps_server_pull_seconds", MetricType::kHistogram,
             "Time a server takes to answer a PULL, from its arrival to the reply.");
  for (const auto& [id, server] : servers) histogram("server", id, server->stats.pull_latency());
  out.Family("eps_server_push_seconds", MetricType::kHistogram,
             "Time a server takes to answer a PUSH, from its arrival to the reply.");
  for (const auto& [id, server] : servers) histogram("server", id, server->stats.push_latency());
  out.Family("eps_server_dense_staleness", MetricType::kHistogram,
             "Per push to a dense tensor: the pushes to it a server applied between the pull the "
             "gradient was computed from and this push (the updates the step's copy missed).");
  for (const auto& [id, server] : servers) {
    histogram("server", id, server->stats.dense_staleness());
  }

  counter("eps_checkpoints_written_total", "Coordinated checkpoints completed.",
          static_cast<double>(checkpoints.written()));
  counter("eps_checkpoints_failed_total", "Coordinated checkpoints abandoned or failed.",
          static_cast<double>(checkpoints.failed()));
  counter("eps_checkpoint_pause_seconds_total",
          "Time workers spent paused for checkpoints, summed over rounds.", checkpoints.pause_s());
  // Checkpoint 0 (training starting) is written by nobody: no durations.
  if (const std::optional<proto::CheckpointRecord>& last = checkpoints.last();
      last.has_value() && last->id() > 0) {
    gauge("eps_checkpoint_last_pause_seconds",
          "How long the last complete checkpoint paused the workers.", last->pause_ms() / 1000);
    gauge("eps_checkpoint_last_duration_seconds",
          "How long the servers took to write the last complete checkpoint.",
          last->duration_ms() / 1000);
    gauge("eps_checkpoint_last_bytes", "Bytes of the last complete checkpoint.",
          static_cast<double>(last->bytes()));
    gauge("eps_checkpoint_last_timestamp_seconds",
          "Unix time at which the last complete checkpoint was recorded.",
          static_cast<double>(last->unix_ms()) / 1000);
  }
  counter("eps_recoveries_total",
          "Recoveries started: restores from the last complete checkpoint after a parameter "
          "server was lost, or to resume a stopped job.",
          static_cast<double>(control.recovery().count()));
  gauge("eps_recovery_in_progress", "1 while the job is being restored after losing a server.",
        control.recovery().active() ? 1 : 0);
  const PartitionMoves& moves = control.moves();
  counter("eps_partition_moves_total", "Partition moves committed (docs/design.md 2.20).",
          static_cast<double>(moves.done()));
  counter("eps_partition_moves_failed_total",
          "Partition moves dropped after their last attempt failed.",
          static_cast<double>(moves.failed()));
  counter("eps_partition_move_rows_total", "Rows the committed partition moves copied.",
          static_cast<double>(moves.rows()));
  counter("eps_partition_move_bytes_total", "Bytes the committed partition moves copied.",
          static_cast<double>(moves.bytes()));
  gauge("eps_partition_move_in_progress", "1 while a partition moves between servers.",
        moves.active().has_value() ? 1 : 0);
  gauge("eps_partition_unavailable_seconds_max",
        "The longest a moved partition was refused (hand-off to the map that moved it).",
        moves.longest_unavailable_ms() / 1000);
  return out.text();
}

}  // namespace eps
