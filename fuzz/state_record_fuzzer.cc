// Fuzzes what a restarted master makes of the records in its --data-dir:
// each stored (key, value) decoded as StateStore::Load does
// (ParseStateRecord), then the snapshot taken up by JobControl::Restore,
// with and without --resume, and the restored job's views, status and next
// steps. Corrupt records must come back as kDataLoss (or another Status),
// never a crash.
//
// Input: one flag byte (bit 0: --resume), then a chunked input
// (fuzz/fuzz_support.h) of alternating keys and values, e.g. "master" and a
// serialized MasterRecord, "pass/shard/<16 hex digits>" and a ShardRecord.
// Seeds: fuzz/corpus/state_record (fuzz/make_corpus.cc), the records of the
// stopped job in tests/testdata/master_state_v1.tar.gz and of jobs in other
// phases.
//
// The config is that job's (tests/testdata/README.md); the fingerprint
// check is passed by taking the record's own, so that the records' contents
// are what the restore sees.

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/job_config.h"
#include "core/logging.h"
#include "fuzz/fuzz_support.h"
#include "master/event_log.h"
#include "master/job_control.h"
#include "master/job_spec.h"
#include "master/state_store.h"
#include "master/http/status_report.h"

namespace eps {
namespace {

class DiscardEvents : public EventSink {
 public:
  void Record(const std::string& event, nlohmann::json fields) override {}
};

JobConfig CompatJob() {
  JobConfig job;
  job.job.name = "compat";
  job.job.epochs = 1;
  job.job.progress_interval_s = 1;
  job.data.train = "/tmp/eps-fixture-v1/data/train";
  job.data.eval = "/tmp/eps-fixture-v1/data/eval";
  job.data.shard_records = 2000;
  job.ps.num_servers = 1;
  job.ps.partitions = 16;
  job.worker.batch_size.value = 256;
  job.master.heartbeat_ms = 200;
  job.master.lease_ms = 2000;
  job.checkpoint.interval_s = 3600;
  CHECK_OK(job.Validate());
  return job;
}

}  // namespace
}  // namespace eps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace eps;
  static const JobConfig job = CompatJob();
  static const proto::JobSpec spec = *BuildJobSpec(job);
  if (size < 1) return 0;
  const bool resume = (data[0] & 1) != 0;
  const std::vector<absl::string_view> chunks = fuzz::SplitChunks(
      absl::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  MasterSnapshot snapshot;
  bool has_master = false;
  for (size_t i = 0; i + 1 < chunks.size(); i += 2) {
    if (!ParseStateRecord(chunks[i], chunks[i + 1], &snapshot).ok()) return 0;
    has_master = has_master || chunks[i] == "master";
  }
  if (!has_master) return 0;  // Load: a new store

  DiscardEvents events;
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  JobControl control(job, spec, snapshot.master.config_fingerprint(), "/nonexistent/eps-master",
                     &events, now);
  if (!control.Restore(snapshot, resume, now).ok()) return 0;
  (void)DumpJson(StatusDocument(control, now));
  (void)MetricsText(control);
  StateUpdate update;
  control.TakeChanges(&update);
  const absl::Time later = now + absl::Seconds(5);
  control.Tick(later);
  (void)control.NextRestore(later);
  (void)control.NextCheckpointWrite(later);
  proto::GetShardReply shard;
  (void)control.GetShard(proto::NodeId(), later, &shard);
  control.TakeChanges(&update);
  (void)DumpJson(StatusDocument(control, later));
  return 0;
}
