// eps_fuzz_corpus: writes the binary seed inputs of the fuzz targets
// (fuzz/corpus/rpc_request, fuzz/corpus/state_record) in the layouts the
// targets read (fuzz/fuzz_support.h). Run once and checked in; run again
// after a change to those layouts or to the records:
//
//   tar xzf tests/testdata/master_state_v1.tar.gz -C /tmp/v1
//   build/fuzz/eps_fuzz_corpus fuzz/corpus /tmp/v1/state
//
// The text seeds (record_parser, job_config) are written by hand.
//
// Thread-safety: one thread only.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/logging.h"
#include "fuzz/fuzz_support.h"
#include "master/state_store.h"
#include "proto/eps.pb.h"
#include "rpc/message.h"

namespace eps {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  CHECK(file.good()) << "cannot write " << path;
}

// The rpc_request layout: the peer byte, then the frames.
std::string Request(uint8_t peer, Message message) {
  std::string out(1, static_cast<char>(peer));
  for (const zmq::message_t& frame : std::move(message).ToFrames()) {
    fuzz::AppendChunk(absl::string_view(frame.data<char>(), frame.size()), &out);
  }
  return out;
}

Message Envelope(proto::Method method, proto::Role role, uint64_t id) {
  Message message;
  message.header().set_request_id(id);
  message.header().set_method(method);
  message.header().set_cluster_map_version(3);
  message.header().mutable_sender()->set_role(role);
  message.header().mutable_sender()->set_id(2);
  return message;
}

// Peer bytes: CURVE on (bit 7) with the key of the role, or off.
constexpr uint8_t kCurveMaster = 0x81, kCurveServer = 0x82, kCurveWorker = 0x83;
constexpr uint8_t kCurveTool = 0x84, kPlain = 0x00;

void WriteRequests(const fs::path& dir) {
  const auto write = [&dir](const std::string& name, uint8_t peer, Message message) {
    Write(dir / (name + ".bin"), Request(peer, std::move(message)));
  };
  Message m = Envelope(proto::REGISTER_SERVER, proto::ROLE_SERVER, 1);
  auto* server = m.header().mutable_register_server_request();
  server->set_endpoint("tcp://127.0.0.1:40001");
  server->set_hostname("host-a");
  server->set_pid(4242);
  server->set_stored_server_id(0);
  auto* option = server->add_job_options();
  option->set_name("model.type");
  option->set_value("lr");
  write("register_server", kCurveServer, std::move(m));

  m = Envelope(proto::REGISTER_WORKER, proto::ROLE_WORKER, 2);
  m.header().mutable_register_worker_request()->set_hostname("host-b");
  m.header().mutable_register_worker_request()->set_device("cpu");
  m.header().mutable_register_worker_request()->set_launch_id(7);
  write("register_worker", kCurveWorker, std::move(m));

  m = Envelope(proto::HEARTBEAT, proto::ROLE_WORKER, 3);
  m.header().mutable_heartbeat_request()->set_paused_for_checkpoint(5);
  m.header().mutable_heartbeat_request()->set_endpoint("tcp://127.0.0.1:40002");
  write("heartbeat", kCurveWorker, std::move(m));

  m = Envelope(proto::GET_CLUSTER_MAP, proto::ROLE_TOOL, 4);
  m.header().mutable_get_cluster_map_request();
  write("get_cluster_map", kCurveTool, std::move(m));

  m = Envelope(proto::GET_SHARD, proto::ROLE_WORKER, 5);
  m.header().mutable_get_shard_request();
  write("get_shard", kPlain, std::move(m));

  m = Envelope(proto::COMMIT_PROGRESS, proto::ROLE_WORKER, 6);
  auto* commit = m.header().mutable_commit_progress_request();
  commit->set_shard_id(1);
  commit->set_epoch(0);
  commit->set_phase(proto::EVAL);
  commit->set_begin_offset(0);
  commit->set_end_offset(4096);
  commit->set_lines(3);
  commit->set_loss_sum(1.5);
  commit->add_malformed_examples("1\tx\t");
  m.AddArray(std::vector<float>{1, 0, 1});
  m.AddArray(std::vector<float>{0.9f, 0.2f, 0.6f});
  write("commit_progress_eval", kCurveWorker, std::move(m));

  m = Envelope(proto::DEREGISTER, proto::ROLE_WORKER, 7);
  m.header().mutable_deregister_request();
  write("deregister", kCurveWorker, std::move(m));

  m = Envelope(proto::SPLIT_SHARD, proto::ROLE_WORKER, 8);
  m.header().mutable_split_shard_request()->set_shard_id(2);
  m.header().mutable_split_shard_request()->set_split_offset(2048);
  m.header().mutable_split_shard_request()->set_split_line(100);
  write("split_shard", kCurveWorker, std::move(m));

  m = Envelope(proto::SHARD_UNREADABLE, proto::ROLE_WORKER, 9);
  m.header().mutable_shard_unreadable_request()->set_shard_id(3);
  m.header().mutable_shard_unreadable_request()->set_error("Input/output error");
  write("shard_unreadable", kCurveWorker, std::move(m));

  m = Envelope(proto::PULL, proto::ROLE_WORKER, 10);
  m.header().mutable_pull_request()->add_table_ids(0);
  m.header().mutable_pull_request()->add_table_ids(1);
  m.AddArray(std::vector<uint64_t>{17, 99, 123456789});
  m.AddArray(std::vector<uint64_t>{(uint64_t{1} << 56) | 0, (uint64_t{1} << 56) | 1});
  write("pull", kCurveWorker, std::move(m));

  m = Envelope(proto::PUSH, proto::ROLE_WORKER, 11);
  m.header().mutable_push_request()->add_table_ids(0);
  m.header().mutable_push_request()->set_client_seq(12);
  m.header().mutable_push_request()->set_lr_scale(2.0f);
  m.AddArray(std::vector<uint64_t>{17, 99});
  m.AddArray(std::vector<float>{0.1f, -0.2f, 0.3f, 0.0f, 0.5f, 0.5f, -1.0f, 2.0f});
  write("push", kCurveWorker, std::move(m));

  m = Envelope(proto::FENCE_WORKERS, proto::ROLE_MASTER, 12);
  m.header().mutable_fence_workers_request()->add_worker_ids(4);
  m.header().mutable_fence_workers_request()->set_membership_epoch(9);
  write("fence_workers", kCurveMaster, std::move(m));

  m = Envelope(proto::CHECKPOINT, proto::ROLE_MASTER, 13);
  m.header().mutable_checkpoint_request()->set_checkpoint_id(5);
  m.header().mutable_checkpoint_request()->add_keep_ids(4);
  write("checkpoint", kCurveMaster, std::move(m));

  m = Envelope(proto::RESTORE, proto::ROLE_MASTER, 14);
  m.header().mutable_restore_request()->set_checkpoint_id(5);
  m.header().mutable_restore_request()->set_path("/data/ps-0/checkpoints/5");
  write("restore", kCurveMaster, std::move(m));

  // Refusals: a worker key claiming to be the master; a reply's status.
  m = Envelope(proto::CHECKPOINT, proto::ROLE_MASTER, 15);
  m.header().mutable_checkpoint_request()->set_checkpoint_id(6);
  write("checkpoint_forged_role", kCurveWorker, std::move(m));
  m = Envelope(proto::PULL, proto::ROLE_WORKER, 16);
  StatusToProto(ErrorWithReason(absl::StatusCode::kFailedPrecondition, "fenced", proto::FENCED),
                m.header().mutable_status());
  write("with_status", kPlain, std::move(m));
}

// The state_record layout: the flag byte (bit 0: --resume), then keys and
// values.
std::string Records(bool resume, const StateUpdate& update) {
  std::string out(1, resume ? '\1' : '\0');
  for (const auto& [key, value] : update.puts_for_testing()) {
    fuzz::AppendChunk(key, &out);
    fuzz::AppendChunk(value, &out);
  }
  return out;
}

StateUpdate Puts(const MasterSnapshot& snapshot) {
  StateUpdate update;
  update.PutMaster(snapshot.master);
  update.PutDataSet(/*eval=*/false, snapshot.train);
  update.PutDataSet(/*eval=*/true, snapshot.eval);
  for (const auto& [id, shard] : snapshot.shards) update.PutShard(id, shard);
  for (const auto& [key, results] : snapshot.eval_results) {
    update.PutEvalResult(key.first, key.second, results.first, results.second);
  }
  for (const auto& [id, checkpoint] : snapshot.checkpoints) update.PutCheckpoint(checkpoint);
  return update;
}

void WriteRecords(const fs::path& dir, const std::string& state_dir) {
  StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(state_dir);
  CHECK_OK(store.status());
  StatusOr<std::optional<MasterSnapshot>> loaded = (*store)->Load();
  CHECK_OK(loaded.status());
  CHECK(loaded->has_value()) << state_dir << " holds no master state";
  const MasterSnapshot v1 = **loaded;
  // As saved: a job stopped by SIGTERM, resumable.
  Write(dir / "v1_stopped.bin", Records(/*resume=*/false, Puts(v1)));
  Write(dir / "v1_stopped_resume.bin", Records(/*resume=*/true, Puts(v1)));
  // The same job had its master been killed instead: restarted mid-epoch.
  MasterSnapshot crashed = v1;
  crashed.master.set_stopped(false);
  crashed.master.set_failure("");
  crashed.master.set_phase(1);
  Write(dir / "v1_killed.bin", Records(/*resume=*/false, Puts(crashed)));
  // ... while it was restoring the servers from a checkpoint.
  MasterSnapshot recovering = crashed;
  recovering.master.set_recovering(true);
  Write(dir / "v1_killed_recovering.bin", Records(/*resume=*/false, Puts(recovering)));
  // ... while evaluating, with one eval commit saved.
  MasterSnapshot evaluating = crashed;
  evaluating.master.set_phase(2);
  evaluating.eval_results[{0, 0}] = {{1, 0, 1}, {0.8f, 0.3f, 0.4f}};
  Write(dir / "v1_killed_evaluating.bin", Records(/*resume=*/false, Puts(evaluating)));
}

}  // namespace
}  // namespace eps

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR MASTER_STATE_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path corpus = argv[1];
  eps::WriteRequests(corpus / "rpc_request");
  eps::WriteRecords(corpus / "state_record", argv[2]);
  return 0;
}
