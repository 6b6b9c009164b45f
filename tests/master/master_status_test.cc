// Tests master/master.h: the Master service over real RPC (/status and /metrics
// over HTTP, missing data).
// The fixture is in tests/master/master_fixture.h.

#include "tests/master/master_fixture.h"

namespace eps {
namespace {

TEST_F(MasterTest, ServesStatusAndMetricsOverHttp) {
  const std::string train = Write("train.tsv", CriteoText(10, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));

  const json endpoints = json::parse(ReadFile(dir_ + "/master/master.json"));
  EXPECT_EQ(endpoints["rpc"], master_->rpc_endpoint());
  EXPECT_EQ(endpoints["http"], master_->http_url());
  EXPECT_THAT(master_->rpc_endpoint(), HasSubstr("tcp://127.0.0.1:"));
  EXPECT_THAT(master_->http_url(), HasSubstr("http://127.0.0.1:"));

  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  ASSERT_TRUE(WaitForPhase("training"));
  const proto::ShardAssignment shard = TakeShard(*worker);
  ASSERT_TRUE(worker->Commit(shard, ReadPieces(shard, 2)[0], 0.5).ok());
  // After WaitForPhase, whose keep-alive heartbeats report 0 rows.
  ASSERT_TRUE(servers_[0]->Heartbeat(/*rows=*/123).ok());
  ASSERT_TRUE(worker->Heartbeat().ok());

  httplib::Client client(master_->http_url());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result status = client.Get("/status");
  ASSERT_TRUE(status) << httplib::to_string(status.error());
  EXPECT_EQ(status->status, 200);
  const json doc = json::parse(status->body);
  EXPECT_EQ(doc["state"], "running");
  EXPECT_EQ(doc["epoch"], 1);
  for (const char* key : {"total", "todo", "doing", "done"}) {
    EXPECT_TRUE(doc["shards"].contains(key)) << key;
  }
  EXPECT_EQ(doc["shards"]["total"], 2);
  EXPECT_EQ(doc["shards"]["doing"], 1);
  EXPECT_EQ(doc["records_trained"], 2);
  ASSERT_EQ(doc["workers"].size(), 1u);
  for (const char* key : {"id", "state", "records", "records_per_s"}) {
    EXPECT_TRUE(doc["workers"][0].contains(key)) << key;
  }
  EXPECT_EQ(doc["workers"][0]["state"], "alive");
  EXPECT_EQ(doc["workers"][0]["records_per_s"], 12.5);
  ASSERT_EQ(doc["servers"].size(), 2u);
  for (const char* key : {"id", "partitions", "rows"}) {
    EXPECT_TRUE(doc["servers"][0].contains(key)) << key;
  }
  EXPECT_EQ(doc["servers"][0]["rows"], 123);
  for (const char* key : {"train_loss", "eval_auc", "eval_logloss"}) {
    EXPECT_TRUE(doc["metrics"].contains(key)) << key;
  }
  EXPECT_TRUE(doc["metrics"]["eval_auc"].is_null());

  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("# TYPE eps_records_trained_total counter"));
  EXPECT_THAT(metrics->body, HasSubstr("\neps_records_trained_total 2\n"));
  EXPECT_THAT(metrics->body, HasSubstr("\neps_workers{state=\"alive\"} 1\n"));

  httplib::Result page = client.Get("/");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->body, HasSubstr("master-test"));
}

// Counters in /metrics keep every digit (a six-digit float would not).
TEST_F(MasterTest, MetricsKeepEveryDigit) {
  // 1234567 empty lines: records as far as the master is concerned.
  const std::string train = Write("train.tsv", std::string(1234567, '\n'));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.data.shard_records = 2000000;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*worker);
  ASSERT_EQ(shard.records(), 1234567u);
  Piece all;
  all.begin = shard.start();
  all.end = shard.end();
  all.lines = shard.records();
  ASSERT_TRUE(worker->Commit(shard, all, /*loss_sum=*/0.5 * 1234567).ok());

  httplib::Client client(master_->http_url());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_THAT(metrics->body, HasSubstr("\neps_job_records_trained 1234567\n"));
  EXPECT_THAT(metrics->body, HasSubstr("\neps_records_trained_total 1234567\n"));
  EXPECT_THAT(metrics->body, HasSubstr("\neps_train_loss 0.5\n"));
  EXPECT_EQ(Doc()["records_trained"], 1234567);
}

// Checks an exposition the way a scraper reads it: every sample belongs to
// the family whose HELP and TYPE precede it, no family comes twice, and
// counters end in _total. Returns what is wrong, one line each.
std::string ExpositionErrors(const std::string& text) {
  std::string errors;
  std::set<std::string> families;
  std::string family;
  std::string type;
  std::string help_of;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::vector<std::string> words = absl::StrSplit(line, absl::MaxSplits(' ', 3));
    if (absl::StartsWith(line, "# HELP ") && words.size() >= 3) {
      help_of = words[2];
      continue;
    }
    if (absl::StartsWith(line, "# TYPE ") && words.size() == 4) {
      family = words[2];
      type = words[3];
      if (help_of != family) absl::StrAppend(&errors, family, ": no HELP before TYPE\n");
      if (!families.insert(family).second) absl::StrAppend(&errors, family, ": twice\n");
      if ((type == "counter") != absl::EndsWith(family, "_total")) {
        absl::StrAppend(&errors, family, ": a ", type, " named so\n");
      }
      continue;
    }
    const std::string name(line.substr(0, line.find_first_of("{ ")));
    const bool belongs =
        name == family ||
        (type == "histogram" &&
         (name == family + "_bucket" || name == family + "_sum" || name == family + "_count"));
    if (!belongs) absl::StrAppend(&errors, "'", line, "' outside family ", family, "\n");
  }
  return errors;
}

// /metrics: the job's progress, and what servers and workers report in
// heartbeats (their counters and latency histograms), labelled by peer; a
// gone worker's series keep their last values.
TEST_F(MasterTest, MetricsExposeProgressAndWhatPeersReport) {
  const std::string train = Write("train.tsv", CriteoText(10, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.optimizer.dense_global_batch = 4096;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_NO_FATAL_FAILURE(RegisterServers());
  ASSERT_TRUE(WaitForPhase("training"));
  std::unique_ptr<FakePeer> worker = Peer();
  ASSERT_TRUE(worker->RegisterWorker().ok());
  const proto::ShardAssignment shard = TakeShard(*worker);
  ASSERT_TRUE(*worker->Commit(shard, ReadPieces(shard, 2)[0], /*loss_sum=*/1.0));

  LatencyHistogram pulls;
  pulls.Observe(absl::Milliseconds(3));
  pulls.Observe(absl::Milliseconds(3));
  pulls.Observe(absl::Milliseconds(300));
  LatencyHistogram pushes;
  pushes.Observe(absl::Microseconds(50));
  CountHistogram staleness;  // 0, 1, 1, 3 updates missed
  for (uint64_t missed : {0, 1, 1, 3}) staleness.Observe(missed);
  {
    Message beat;
    proto::ServerStats* stats = beat.header().mutable_heartbeat_request()->mutable_server();
    stats->set_rows(123);
    stats->set_rows_on_disk(45);
    stats->set_bytes(6789);
    stats->set_store_memory_bytes(4321);
    stats->set_hits(3);
    stats->set_misses(1);
    stats->set_evictions(7);
    stats->set_pushes_fenced(2);
    stats->set_pushes_deduplicated(1);
    stats->set_updates_refused(5);
    // Global batches: 4 steps of 4,096 records; 3 pushes of 256 dropped.
    stats->set_global_steps(4);
    stats->set_global_step_records(16384);
    stats->set_global_pushes_decayed(1);
    stats->set_global_pushes_dropped(3);
    stats->set_global_records_dropped(768);
    stats->set_global_reads_refused(9);
    stats->set_global_reservations_expired(2);
    HistogramToProto(pulls.Snapshot(), stats->mutable_pull_latency());
    HistogramToProto(pushes.Snapshot(), stats->mutable_push_latency());
    HistogramToProto(staleness.Snapshot(), stats->mutable_dense_staleness());
    ASSERT_TRUE(servers_[0]->Call(proto::HEARTBEAT, std::move(beat)).ok());
  }
  {
    Message beat;
    proto::WorkerStats* stats = beat.header().mutable_heartbeat_request()->mutable_worker();
    stats->set_records_per_s(12.5);
    stats->set_batch_size(512);
    HistogramToProto(pulls.Snapshot(), stats->mutable_pull_latency());
    HistogramToProto(pushes.Snapshot(), stats->mutable_push_latency());
    HistogramToProto(staleness.Snapshot(), stats->mutable_dense_staleness());
    stats->set_dense_staleness_max(3);
    HistogramToProto(pulls.Snapshot(), stats->mutable_staleness_wait());
    // Three steps computed; one wait for a batch; no push_wait reported.
    HistogramToProto(pulls.Snapshot(), stats->mutable_compute());
    HistogramToProto(pushes.Snapshot(), stats->mutable_batch_wait());
    ASSERT_TRUE(worker->Call(proto::HEARTBEAT, std::move(beat)).ok());
  }

  httplib::Client client(master_->http_url());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  const std::string text = "\n" + metrics->body;  // every line starts after a newline
  EXPECT_EQ(ExpositionErrors(text), "") << text;
  for (const auto& [family, type] : std::vector<std::pair<std::string, std::string>>{
           {"eps_job_info", "gauge"},
           {"eps_job_phase", "gauge"},
           {"eps_job_epoch", "gauge"},
           {"eps_job_pass_done_ratio", "gauge"},
           {"eps_job_records_trained", "gauge"},
           {"eps_records_trained_total", "counter"},
           {"eps_records_retrained_total", "counter"},
           {"eps_records_per_second", "gauge"},
           {"eps_train_loss_current_epoch", "gauge"},
           {"eps_membership_epoch", "gauge"},
           {"eps_shards", "gauge"},
           {"eps_reassignments_total", "counter"},
           {"eps_splits_total", "counter"},
           {"eps_workers", "gauge"},
           {"eps_servers", "gauge"},
           {"eps_worker_records_per_second", "gauge"},
           {"eps_worker_records_committed_total", "counter"},
           {"eps_worker_batch_size", "gauge"},
           {"eps_worker_pull_seconds", "histogram"},
           {"eps_worker_push_seconds", "histogram"},
           {"eps_worker_dense_staleness", "histogram"},
           {"eps_worker_staleness_wait_seconds", "histogram"},
           {"eps_worker_batch_wait_seconds", "histogram"},
           {"eps_worker_compute_seconds", "histogram"},
           {"eps_worker_push_wait_seconds", "histogram"},
           {"eps_server_rows", "gauge"},
           {"eps_server_rows_on_disk", "gauge"},
           {"eps_server_memory_bytes", "gauge"},
           {"eps_server_store_memory_bytes", "gauge"},
           {"eps_server_hit_ratio", "gauge"},
           {"eps_server_evictions_total", "counter"},
           {"eps_server_pushes_fenced_total", "counter"},
           {"eps_server_pushes_deduplicated_total", "counter"},
           {"eps_server_updates_refused_total", "counter"},
           {"eps_server_global_steps_total", "counter"},
           {"eps_server_global_step_records_total", "counter"},
           {"eps_server_global_pushes_decayed_total", "counter"},
           {"eps_server_global_pushes_dropped_total", "counter"},
           {"eps_server_global_records_dropped_total", "counter"},
           {"eps_server_global_reads_refused_total", "counter"},
           {"eps_server_global_reservations_expired_total", "counter"},
           {"eps_server_pull_seconds", "histogram"},
           {"eps_server_push_seconds", "histogram"},
           {"eps_server_dense_staleness", "histogram"},
           {"eps_checkpoints_written_total", "counter"},
           {"eps_checkpoints_failed_total", "counter"},
           {"eps_checkpoint_pause_seconds_total", "counter"},
           {"eps_recoveries_total", "counter"},
       }) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("\n# HELP ", family, " "))) << family;
    EXPECT_THAT(text, HasSubstr(absl::StrCat("\n# TYPE ", family, " ", type, "\n"))) << family;
  }
  // Not known yet: no evaluation, no finished epoch, no checkpoint written.
  for (const char* absent : {"eps_eval_auc", "eps_train_loss ", "eps_checkpoint_last_"}) {
    EXPECT_THAT(text, Not(HasSubstr(absent))) << absent;
  }

  const std::string w = absl::StrCat("{worker=\"", worker->id(), "\"");
  for (const std::string& sample : {
           std::string("eps_job_info{name=\"master-test\",job_id=\""),
           std::string("\neps_job_phase{phase=\"training\"} 1\n"),
           std::string("\neps_job_phase{phase=\"scanning\"} 0\n"),
           std::string("\neps_job_epoch 1\n"),
           std::string("\neps_job_pass_done_ratio 0.2\n"),
           std::string("\neps_job_records_trained 2\n"),
           std::string("\neps_records_trained_total 2\n"),
           std::string("\neps_train_loss_current_epoch 0.5\n"),
           std::string("\neps_shards{state=\"todo\"} 1\n"),
           std::string("\neps_shards{state=\"doing\"} 1\n"),
           std::string("\neps_shards{state=\"done\"} 0\n"),
           std::string("\neps_workers{state=\"alive\"} 1\n"),
           std::string("\neps_servers{state=\"alive\"} 2\n"),
           absl::StrCat("\neps_worker_records_per_second", w, "} 12.5\n"),
           absl::StrCat("\neps_worker_batch_size", w, "} 512\n"),
           absl::StrCat("\neps_worker_dense_staleness_bucket", w, ",le=\"1\"} 3\n"),
           absl::StrCat("\neps_worker_dense_staleness_count", w, "} 4\n"),
           absl::StrCat("\neps_worker_staleness_wait_seconds_count", w, "} 3\n"),
           absl::StrCat("\neps_worker_compute_seconds_count", w, "} 3\n"),
           absl::StrCat("\neps_worker_batch_wait_seconds_count", w, "} 1\n"),
           absl::StrCat("\neps_worker_records_committed_total", w, "} 2\n"),
           absl::StrCat("\neps_worker_pull_seconds_bucket", w, ",le=\"0.0016\"} 0\n"),
           absl::StrCat("\neps_worker_pull_seconds_bucket", w, ",le=\"0.0032\"} 2\n"),
           absl::StrCat("\neps_worker_pull_seconds_bucket", w, ",le=\"0.4096\"} 3\n"),
           absl::StrCat("\neps_worker_pull_seconds_bucket", w, ",le=\"+Inf\"} 3\n"),
           absl::StrCat("\neps_worker_pull_seconds_sum", w, "} 0.306\n"),
           absl::StrCat("\neps_worker_pull_seconds_count", w, "} 3\n"),
           absl::StrCat("\neps_worker_push_seconds_count", w, "} 1\n"),
           std::string("\neps_server_partitions{server=\"0\"} 4\n"),
           std::string("\neps_partition_moves_total 0\n"),
           std::string("\neps_partition_move_in_progress 0\n"),
           std::string("\neps_server_rows{server=\"0\"} 123\n"),
           std::string("\neps_server_rows_on_disk{server=\"0\"} 45\n"),
           std::string("\neps_server_memory_bytes{server=\"0\"} 6789\n"),
           std::string("\neps_server_store_memory_bytes{server=\"0\"} 4321\n"),
           std::string("\neps_server_hit_ratio{server=\"0\"} 0.75\n"),
           std::string("\neps_server_hit_ratio{server=\"1\"} 1\n"),
           std::string("\neps_server_row_hits_total{server=\"0\"} 3\n"),
           std::string("\neps_server_evictions_total{server=\"0\"} 7\n"),
           std::string("\neps_server_pushes_fenced_total{server=\"0\"} 2\n"),
           std::string("\neps_server_pushes_deduplicated_total{server=\"0\"} 1\n"),
           std::string("\neps_server_updates_refused_total{server=\"0\"} 5\n"),
           std::string("\neps_server_updates_refused_total{server=\"1\"} 0\n"),
           std::string("\neps_server_global_steps_total{server=\"0\"} 4\n"),
           std::string("\neps_server_global_step_records_total{server=\"0\"} 16384\n"),
           std::string("\neps_server_global_pushes_decayed_total{server=\"0\"} 1\n"),
           std::string("\neps_server_global_pushes_dropped_total{server=\"0\"} 3\n"),
           std::string("\neps_server_global_records_dropped_total{server=\"0\"} 768\n"),
           std::string("\neps_server_global_reads_refused_total{server=\"0\"} 9\n"),
           std::string("\neps_server_global_reservations_expired_total{server=\"0\"} 2\n"),
           std::string("\neps_server_pull_seconds_bucket{server=\"0\",le=\"0.0032\"} 2\n"),
           std::string("\neps_server_pull_seconds_count{server=\"0\"} 3\n"),
           std::string("\neps_server_push_seconds_bucket{server=\"0\",le=\"0.0001\"} 1\n"),
           std::string("\neps_server_dense_staleness_bucket{server=\"0\",le=\"1\"} 3\n"),
           std::string("\neps_server_dense_staleness_bucket{server=\"0\",le=\"4\"} 4\n"),
           std::string("\neps_server_dense_staleness_sum{server=\"0\"} 5\n"),
           std::string("\neps_recoveries_total 0\n"),
       }) {
    EXPECT_THAT(text, HasSubstr(sample)) << sample;
  }
  // ps[1] reported no histogram: it has no series.
  EXPECT_THAT(text, Not(HasSubstr("eps_server_pull_seconds_count{server=\"1\"}")));

  // /status shows the same server counters.
  httplib::Result status = client.Get("/status");
  ASSERT_TRUE(status) << httplib::to_string(status.error());
  const json doc = json::parse(status->body);
  ASSERT_EQ(doc["servers"].size(), 2u);
  EXPECT_EQ(doc["servers"][0]["updates_refused"], 5);
  EXPECT_EQ(doc["servers"][0]["pushes_fenced"], 2);
  EXPECT_EQ(doc["servers"][1]["updates_refused"], 0);
  const json& global = doc["servers"][0]["global_batch"];
  EXPECT_EQ(global["steps"], 4);
  EXPECT_DOUBLE_EQ(global["records_per_step"].get<double>(), 4096);
  EXPECT_EQ(global["pushes_dropped"], 3);
  EXPECT_DOUBLE_EQ(global["dropped_share"].get<double>(), 768.0 / (16384 + 768));
  // The job's: every server's, summed, with the setting.
  EXPECT_EQ(doc["global_batch"]["records"], 4096);
  EXPECT_EQ(doc["global_batch"]["records_dropped"], 768);
  EXPECT_EQ(doc["global_batch"]["reads_refused"], 9);
  EXPECT_EQ(doc["global_batch"]["reservations_expired"], 2);
  EXPECT_EQ(doc["global_batch"]["pushes_decayed"], 1);
  const json& missed = doc["servers"][0]["dense_staleness"];
  EXPECT_EQ(missed["pushes"], 4);
  EXPECT_DOUBLE_EQ(missed["mean"].get<double>(), 1.25);
  EXPECT_EQ(missed["p50"], 1);  // 3 of 4 missed at most 1
  EXPECT_EQ(missed["p99"], 4);
  EXPECT_TRUE(doc["servers"][1]["dense_staleness"]["mean"].is_null());  // none measured
  EXPECT_EQ(doc["workers"][0]["batch_size"], 512);
  const json& trained = doc["workers"][0]["dense_staleness"];
  EXPECT_EQ(trained["steps"], 4);
  EXPECT_DOUBLE_EQ(trained["mean"].get<double>(), 1.25);
  EXPECT_EQ(trained["p50"], 1);
  EXPECT_EQ(trained["p99"], 4);
  EXPECT_EQ(trained["max"], 3);
  EXPECT_NEAR(trained["wait_s"].get<double>(), 0.306, 1e-6);  // the pulls histogram's sum
  // Where the steps' time went: the mean ms of each kind of wait, and of
  // each step's compute.
  const json& step = doc["workers"][0]["step_ms"];
  EXPECT_EQ(step["steps"], 3);
  EXPECT_NEAR(step["compute"].get<double>(), 306.0 / 3, 1e-6);
  EXPECT_NEAR(step["dense_wait"].get<double>(), 306.0 / 3, 1e-6);
  EXPECT_NEAR(step["batch_wait"].get<double>(), 0.05, 1e-6);  // one wait
  EXPECT_TRUE(step["push_wait"].is_null()) << step;  // not reported

  // The worker goes silent and its lease runs out: it counts as dead, its
  // rate drops to 0, its counters and histograms stay.
  ASSERT_TRUE(Eventually([&] { return Doc()["workers"][0]["state"] == "dead"; }, ServerPtrs()));
  metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(ExpositionErrors(metrics->body), "") << metrics->body;
  for (const std::string& sample : {
           std::string("\neps_workers{state=\"alive\"} 0\n"),
           std::string("\neps_workers{state=\"dead\"} 1\n"),
           absl::StrCat("\neps_worker_records_per_second", w, "} 0\n"),
           absl::StrCat("\neps_worker_records_committed_total", w, "} 2\n"),
           absl::StrCat("\neps_worker_pull_seconds_count", w, "} 3\n"),
           absl::StrCat("\neps_worker_push_seconds_count", w, "} 1\n"),
           std::string("\neps_records_trained_total 2\n"),
       }) {
    EXPECT_THAT(metrics->body, HasSubstr(sample)) << sample;
  }
}

// Label values come from outside (the job's name): quotes, backslashes and
// newlines are escaped, and bytes that are not UTF-8 replaced.
TEST_F(MasterTest, MetricsEscapeLabelValues) {
  const std::string train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.job.name = "a \"quoted\\\" name\nand \xFF";
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  httplib::Client client(master_->http_url());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_THAT(metrics->body,
              HasSubstr("eps_job_info{name=\"a \\\"quoted\\\\\\\" name\\nand \xEF\xBF\xBD\","));
  EXPECT_EQ(ExpositionErrors(metrics->body), "") << metrics->body;
}

// What the HTTP port refuses (master/http/http_service.h) is counted in /metrics
// by reason, every reason listed.
TEST_F(MasterTest, MetricsCountRefusedHttpRequestsByReason) {
  const std::string train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  httplib::Client client(master_->http_url());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result posted = client.Post("/status");
  ASSERT_TRUE(posted) << httplib::to_string(posted.error());
  EXPECT_EQ(posted->status, 405);
  httplib::Result padded = client.Get("/status", {{"X-Pad", std::string(9000, 'a')}});
  ASSERT_TRUE(padded) << httplib::to_string(padded.error());
  EXPECT_EQ(padded->status, 431);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(ExpositionErrors(metrics->body), "") << metrics->body;
  for (const char* sample : {"\neps_http_requests_refused_total{reason=\"method_not_allowed\"} 1\n",
                             "\neps_http_requests_refused_total{reason=\"headers_too_large\"} 1\n",
                             "\neps_http_requests_refused_total{reason=\"unauthorized\"} 0\n",
                             "\neps_http_requests_refused_total{reason=\"too_many_connections\"} 0\n"}) {
    EXPECT_THAT(metrics->body, HasSubstr(sample)) << sample;
  }
}

// Text the master did not write itself (the job name from the config file,
// file names, peers' messages) may be anything; /status must still render.
TEST_F(MasterTest, StatusSurvivesTextThatIsNotUtf8) {
  const std::string train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  MasterOptions options = Options();
  options.job.data.train = train;
  options.job.job.name = "job-\xff\xfe";
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  std::string text;
  EXPECT_NO_THROW(text = master_->StatusJson());
  EXPECT_TRUE(json::accept(text));
  master_->RequestStop("stopped \xc3");
  EXPECT_EQ(master_->Wait().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(FinalStatus()["state"], "failed");
}

TEST_F(MasterTest, MissingDataIsNotFound) {
  MasterOptions options = Options();
  options.job.data.train = dir_ + "/no-such-train";
  Master master(options);
  const Status started = master.Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(started.message(), HasSubstr("data.train"));
  EXPECT_THAT(started.message(), HasSubstr(dir_ + "/no-such-train"));

  MasterOptions with_eval = Options();
  with_eval.job.data.train = Write("train.tsv", CriteoText(5, /*seed=*/1));
  with_eval.job.data.eval = dir_ + "/no-such-eval";
  Master master2(with_eval);
  const Status started2 = master2.Start();
  EXPECT_EQ(started2.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(started2.message(), HasSubstr("data.eval"));
  EXPECT_THAT(started2.message(), HasSubstr(dir_ + "/no-such-eval"));
}

TEST_F(MasterTest, TrainDataWithoutRecordsFailsTheJob) {
  const std::string train = Write("train.tsv", "");
  MasterOptions options = Options();
  options.job.data.train = train;
  ASSERT_NO_FATAL_FAILURE(StartMaster(options));
  ASSERT_TRUE(Eventually([&] { return Doc()["state"] == "failed"; }, {}));
  EXPECT_THAT(Doc()["error"].get<std::string>(), HasSubstr("data.train"));
  EXPECT_EQ(master_->Wait().code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace eps
