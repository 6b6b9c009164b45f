// Tests ps/param_server.h: pulls, pushes, ownership, readiness, malformed
// requests and fences.
// The fixture is in tests/ps/param_server_fixture.h.

#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "core/metrics.h"
#include "rpc/bfloat16.h"
#include "tests/ps/param_server_fixture.h"

namespace eps {
namespace {

TEST_F(ParamServerTest, PullCreatesRowsAndPushAppliesSgdExactly) {
  StartServer();
  EXPECT_EQ(server_->id(), kServerId);
  EXPECT_EQ(master_->AwaitRegistration(absl::Seconds(1)), server_->endpoint());
  EXPECT_THAT(server_->endpoint(), HasSubstr("tcp://127.0.0.1:"));

  std::vector<uint64_t> keys = EmbKeys(20, /*here=*/true);
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, std::vector<float>(keys.size() * kDim, 0.0f));

  const std::vector<float> grads = Grads(keys.size());
  ASSERT_TRUE(Push(kEmb, keys, grads).ok());
  // A second push with one key twice: applied one after the other.
  std::vector<uint64_t> again = {keys[0], keys[5], keys[0]};
  std::vector<float> again_grads = Grads(again.size());
  ASSERT_TRUE(Push(kEmb, again, again_grads).ok());

  std::vector<float> expected(keys.size() * kDim);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t e = 0; e < kDim; ++e) {
      expected[i * kDim + e] = Sgd(0.0f, grads[i * kDim + e]);
    }
  }
  for (uint32_t e = 0; e < kDim; ++e) {
    expected[0 * kDim + e] =
        Sgd(Sgd(expected[0 * kDim + e], again_grads[0 * kDim + e]), again_grads[2 * kDim + e]);
    expected[5 * kDim + e] = Sgd(expected[5 * kDim + e], again_grads[1 * kDim + e]);
  }
  rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, expected);

  // The dense tensor: chunks of 4 floats, placed like embedding rows.
  const std::vector<uint64_t> chunks = DenseKeysHere();
  ASSERT_FALSE(chunks.empty());
  rows = Pull(kDense, chunks);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, std::vector<float>(chunks.size() * kDim, 0.0f));
  const std::vector<float> dense_grads = Grads(chunks.size());
  ASSERT_TRUE(Push(kDense, chunks, dense_grads).ok());
  rows = Pull(kDense, chunks);
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (size_t i = 0; i < dense_grads.size(); ++i) {
    EXPECT_EQ((*rows)[i], Sgd(0.0f, dense_grads[i])) << i;
  }

  // Both tables in one request, in either order.
  StatusOr<Message> reply = Call(PullRequest({kDense, kEmb}, {chunks, keys}));
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->num_frames(), 2u);
  EXPECT_EQ(reply->frame(0).size(), chunks.size() * kDim * sizeof(float));
  StatusOr<std::span<const float>> emb_rows = reply->Array<float>(1);
  ASSERT_TRUE(emb_rows.ok());
  EXPECT_EQ(std::vector<float>(emb_rows->begin(), emb_rows->end()), expected);
}

// optimizer.lr_scaling: a push's lr_scale multiplies the learning rate of
// every table it updates (SGD here: exactly scale times the step).
TEST_F(ParamServerTest, PushAppliesItsLearningRateScale) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(4, /*here=*/true);
  ASSERT_TRUE(Pull(kEmb, keys).ok());
  const std::vector<float> grads = Grads(keys.size());
  Message request = PushRequest({kEmb}, {keys}, {grads});
  request.header().mutable_push_request()->set_lr_scale(0.5f);
  ASSERT_TRUE(Call(std::move(request)).ok());
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_FLOAT_EQ((*rows)[i], Sgd(0.0f, 0.5f * grads[i])) << i;
  }
}

TEST_F(ParamServerTest, HeartbeatsCarryStats) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(7, /*here=*/true);
  ASSERT_TRUE(Push(kEmb, keys, Grads(keys.size())).ok());
  const proto::ServerStats stats = master_->AwaitPushes(1, absl::Seconds(3));
  EXPECT_EQ(stats.pushes(), 1u);
  EXPECT_GE(stats.pulls(), 1u);
  EXPECT_GE(stats.rows(), keys.size());
}

// Dense tensors carry versions: the pushes this server applied to them.
// Pulls report them (embedding tables 0), pushes answer the version after
// them, and a push that says what it was computed from (PushRequest
// .based_on, 1 + the version) is counted in dense_staleness by the pushes
// applied in between; a repeated push changes nothing.
TEST_F(ParamServerTest, DenseVersionsCountPushesAndPushesReportTheirStaleness) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> chunks = DenseKeysHere();
  ASSERT_FALSE(chunks.empty());
  const std::vector<uint64_t> rows = EmbKeys(2, /*here=*/true);
  auto pull_versions = [&]() -> std::vector<uint64_t> {
    StatusOr<Message> reply = Call(PullRequest({kEmb, kDense}, {rows, chunks}));
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return {};
    const auto& versions = reply->header().pull_reply().versions();
    return {versions.begin(), versions.end()};
  };
  // A push to both tables, computed from dense version `based_on - 1`
  // (0: not said); the versions it answers.
  auto push = [&](uint64_t based_on, uint64_t seq) -> std::vector<uint64_t> {
    Message request = PushRequest({kEmb, kDense}, {rows, chunks},
                                  {Grads(rows.size()), Grads(chunks.size())}, seq);
    if (based_on > 0) {
      request.header().mutable_push_request()->add_based_on(0);
      request.header().mutable_push_request()->add_based_on(based_on);
    }
    StatusOr<Message> reply = Call(std::move(request));
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return {};
    const auto& versions = reply->header().push_reply().versions();
    return {versions.begin(), versions.end()};
  };
  EXPECT_THAT(pull_versions(), ::testing::ElementsAre(0, 0));
  const uint64_t seq = NextSeq();
  EXPECT_THAT(push(/*based_on=*/0, seq), ::testing::ElementsAre(0, 1));  // not measured
  EXPECT_THAT(push(/*based_on=*/1, NextSeq()), ::testing::ElementsAre(0, 2));  // missed 1
  EXPECT_THAT(push(/*based_on=*/3, NextSeq()), ::testing::ElementsAre(0, 3));  // missed 0
  EXPECT_THAT(push(/*based_on=*/1, NextSeq()), ::testing::ElementsAre(0, 4));  // missed 3
  // A retry is acknowledged with the current version and counts nothing.
  EXPECT_THAT(push(/*based_on=*/1, seq), ::testing::ElementsAre(0, 4));
  EXPECT_THAT(pull_versions(), ::testing::ElementsAre(0, 4));
  const proto::ServerStats stats = master_->AwaitStats(
      [](const proto::ServerStats& s) { return s.dense_staleness().count() >= 3; },
      absl::Seconds(3));
  StatusOr<HistogramSnapshot> staleness = HistogramFromProto(stats.dense_staleness());
  ASSERT_TRUE(staleness.ok()) << staleness.status();
  EXPECT_EQ(staleness->count, 3u);
  EXPECT_EQ(staleness->sum, 0 + 1 + 3);
  EXPECT_EQ(staleness->counts[0], 1u);  // 0
  EXPECT_EQ(staleness->counts[1], 1u);  // 1
  EXPECT_EQ(staleness->counts[3], 1u);  // (2, 4]
}

// TableSpec.global_batch: a dense table steps once per batch of records,
// with their mean gradient, whichever pushes brought them; its version
// counts those steps.
TEST_F(ParamServerTest, AGlobalBatchStepsOncePerBatchOfRecords) {
  proto::JobSpec job = MakeJob();
  job.mutable_tables(kDense)->set_global_batch(300);
  master_->set_job(job);
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> chunks = DenseKeysHere();
  ASSERT_FALSE(chunks.empty());
  auto push = [&](const std::vector<float>& grads, uint32_t records) -> StatusOr<Message> {
    Message request = PushRequest({kDense}, {chunks}, {grads}, NextSeq());
    if (records > 0) request.header().mutable_push_request()->set_records(records);
    return Call(std::move(request));
  };
  auto rows = [&]() -> std::vector<float> {
    StatusOr<Message> reply = Call(PullRequest({kDense}, {chunks}));
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return {};
    std::span<const float> values = reply->Array<float>(0).value();
    return {values.begin(), values.end()};
  };
  const std::vector<float> first = Grads(chunks.size());
  std::vector<float> second = first;
  for (float& g : second) g *= -2.0f;
  // A third of the batch: nothing applied yet.
  StatusOr<Message> one = push(first, 100);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(one->header().push_reply().versions(), ::testing::ElementsAre(0));
  EXPECT_EQ(rows(), std::vector<float>(chunks.size() * kDim, 0.0f));
  // A push without its records is refused whole.
  const StatusOr<Message> bare = push(first, 0);
  EXPECT_EQ(bare.status().code(), absl::StatusCode::kInvalidArgument) << bare.status();
  // The rest: one step with the records' mean, (100 g - 400 g) / 300 = -g.
  StatusOr<Message> two = push(second, 200);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_THAT(two->header().push_reply().versions(), ::testing::ElementsAre(1));
  std::vector<float> expected(first.size());
  for (size_t i = 0; i < first.size(); ++i) expected[i] = Sgd(0.0f, -first[i]);
  EXPECT_THAT(rows(), ::testing::Pointwise(::testing::FloatEq(), expected));
  // A push computed on version 0 now is too stale: dropped, and counted.
  Message stale = PushRequest({kDense}, {chunks}, {first}, NextSeq());
  stale.header().mutable_push_request()->set_records(50);
  stale.header().mutable_push_request()->add_based_on(1);  // 1 + version 0
  ASSERT_TRUE(Call(std::move(stale)).ok());
  EXPECT_THAT(rows(), ::testing::Pointwise(::testing::FloatEq(), expected));
  // The heartbeats say so (ServerStats.global_*, /status, /metrics).
  const proto::ServerStats stats = master_->AwaitStats(
      [](const proto::ServerStats& s) { return s.global_pushes_dropped() >= 1; },
      absl::Seconds(10));
  EXPECT_EQ(stats.global_steps(), 1u);
  EXPECT_EQ(stats.global_step_records(), 300u);
  EXPECT_EQ(stats.global_pushes_dropped(), 1u);
  EXPECT_EQ(stats.global_records_dropped(), 50u);
  EXPECT_EQ(stats.global_pushes_decayed(), 0u);
}

// Reservations (ps/global_batch.h): a worker that read the version being
// filled holds its share of the batch; a read that would overfill it is
// refused with BATCH_FULL (rows held back from a push's reply), and the step
// waits for the holder's push. Nothing is computed on a version that steps
// under it.
TEST_F(ParamServerTest, AFullGlobalBatchRefusesReadsUntilItSteps) {
  proto::JobSpec job = MakeJob();
  job.mutable_tables(kDense)->set_global_batch(200);
  master_->set_job(job);
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> chunks = DenseKeysHere();
  ASSERT_FALSE(chunks.empty());
  auto pull = [&](RpcChannel& worker, bool holds = false) {
    Message request = PullRequest({kDense}, {chunks});
    request.header().mutable_pull_request()->set_reserve(true);
    if (holds) request.header().mutable_pull_request()->set_holds_reservations(true);
    return CallOn(worker, std::move(request));
  };
  auto push = [&](RpcChannel& worker, uint64_t based_on, bool reply_rows) {
    Message request = PushRequest({kDense}, {chunks}, {Grads(chunks.size())}, NextSeq());
    request.header().mutable_push_request()->set_records(100);
    request.header().mutable_push_request()->add_based_on(1 + based_on);
    request.header().mutable_push_request()->set_reply_rows(reply_rows);
    return CallOn(worker, std::move(request));
  };
  // Both workers read version 0 (room for both: 0 in, one reserved).
  StatusOr<Message> read = pull(channel_);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->header().pull_reply().reserved());
  ASSERT_TRUE(pull(other_worker_).ok());
  // A read that does not ask for a reservation (rows pulled ahead, an
  // evaluation) neither gets one nor is refused.
  Message plain = PullRequest({kDense}, {chunks});
  read = CallOn(other_worker_, std::move(plain));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->header().pull_reply().reserved());
  // Worker 1 pushes 100 and asks for the rows: 100 in + worker 2's 100
  // fill the batch, so they are held back.
  StatusOr<Message> pushed = push(channel_, 0, /*reply_rows=*/true);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_TRUE(pushed->header().push_reply().applied());
  EXPECT_TRUE(pushed->header().push_reply().rows_withheld());
  EXPECT_EQ(pushed->num_frames(), 0u);
  EXPECT_THAT(pushed->header().push_reply().versions(), ::testing::ElementsAre(0));
  // Its pull waits (the PsClient asks again shortly).
  StatusOr<Message> refused = pull(channel_);
  EXPECT_EQ(ReasonOf(refused.status()), proto::BATCH_FULL) << refused.status();
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("100 of 200 records in"));
  // A plain read is not refused.
  EXPECT_TRUE(CallOn(channel_, PullRequest({kDense}, {chunks})).ok());
  // Worker 2's push completes the batch: one step, and worker 1 reads it.
  pushed = push(other_worker_, 0, /*reply_rows=*/false);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_THAT(pushed->header().push_reply().versions(), ::testing::ElementsAre(1));
  StatusOr<Message> granted = pull(channel_);
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_THAT(granted->header().pull_reply().versions(), ::testing::ElementsAre(1));
  // Worker 1 pushes on version 1 and reads again (room: 100 in, none held);
  // worker 2, refused, queues; a worker another server let in gets in.
  ASSERT_TRUE(push(channel_, 1, false).ok());
  ASSERT_TRUE(pull(channel_).ok());
  EXPECT_EQ(ReasonOf(pull(other_worker_).status()), proto::BATCH_FULL);
  EXPECT_TRUE(pull(other_worker_, /*holds=*/true).ok());
  // Nothing was dropped; the refusals are counted.
  const proto::ServerStats stats = master_->AwaitStats(
      [](const proto::ServerStats& s) { return s.global_reads_refused() >= 3; },
      absl::Seconds(10));
  EXPECT_EQ(stats.global_steps(), 1u);
  EXPECT_EQ(stats.global_pushes_dropped(), 0u);
  EXPECT_EQ(stats.global_reads_refused(), 3u);
}

// PushRequest.reply_rows: the reply carries the pushed rows as the push
// left them (what a pull right after it reads), and so does a repeat's.
TEST_F(ParamServerTest, APushAnswersWithTheRowsItLeftWhenAsked) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> chunks = DenseKeysHere();
  ASSERT_FALSE(chunks.empty());
  const std::vector<uint64_t> rows = EmbKeys(3, /*here=*/true);
  const uint64_t seq = NextSeq();
  auto push = [&](uint64_t client_seq) -> StatusOr<Message> {
    Message request = PushRequest({kEmb, kDense}, {rows, chunks},
                                  {Grads(rows.size()), Grads(chunks.size())}, client_seq);
    request.header().mutable_push_request()->set_reply_rows(true);
    return Call(std::move(request));
  };
  StatusOr<Message> reply = push(seq);
  ASSERT_TRUE(reply.ok()) << reply.status();
  StatusOr<Message> pulled = Call(PullRequest({kEmb, kDense}, {rows, chunks}));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  ASSERT_EQ(reply->num_frames(), 2u);
  for (size_t t = 0; t < 2; ++t) {
    StatusOr<std::span<const float>> got = reply->Array<float>(t);
    StatusOr<std::span<const float>> want = pulled->Array<float>(t);
    ASSERT_TRUE(got.ok() && want.ok());
    EXPECT_THAT(std::vector<float>(got->begin(), got->end()),
                ::testing::ElementsAreArray(want->begin(), want->end()))
        << "table " << t;
  }
  EXPECT_THAT(reply->header().push_reply().versions(), ::testing::ElementsAre(0, 1));
  // A repeat applies nothing and answers with the rows as they are.
  StatusOr<Message> again = push(seq);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->header().push_reply().applied());
  ASSERT_EQ(again->num_frames(), 2u);
  EXPECT_EQ(again->frame(1).size(), reply->frame(1).size());
  EXPECT_EQ(std::memcmp(again->frame(1).data(), reply->frame(1).data(), reply->frame(1).size()),
            0);
  // Not asked: no rows.
  reply = Call(PushRequest({kEmb}, {rows}, {Grads(rows.size())}));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->num_frames(), 0u);
}

// A repeat of a push this server applied is answered as applied after its
// keys' partitions moved away (the worker must not send it elsewhere); a
// new push of those keys is WRONG_OWNER, applying nothing.
TEST_F(ParamServerTest, ARepeatOfAnAppliedPushIsAppliedAfterItsPartitionsMoved) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(3, /*here=*/true);
  const uint64_t seq = NextSeq();
  StatusOr<Message> reply = Call(PushRequest({kEmb}, {keys}, {Grads(keys.size())}, seq));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->header().push_reply().applied());

  master_->set_partitions_moved(true);
  master_->set_map_version(2);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (ReasonOf(Call(PullRequest({kEmb}, {keys})).status()) != proto::WRONG_OWNER &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(ReasonOf(Call(PullRequest({kEmb}, {keys})).status()), proto::WRONG_OWNER);

  Message repeat = PushRequest({kEmb}, {keys}, {Grads(keys.size())}, seq);
  repeat.header().mutable_push_request()->set_reply_rows(true);
  reply = Call(std::move(repeat));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_FALSE(reply->header().push_reply().applied());
  EXPECT_EQ(reply->num_frames(), 0u) << "no rows of keys elsewhere";
  const Status fresh = Push(kEmb, keys, Grads(keys.size()));
  EXPECT_EQ(ReasonOf(fresh), proto::WRONG_OWNER) << fresh;
}

// dense_bf16: a DENSE table's rows (pulled, or read back by a push) come
// as bfloat16, its gradients are taken as bfloat16 and applied in float32;
// an embedding table's frames stay float32.
TEST_F(ParamServerTest, DenseRowsAndGradientsTravelAsBfloat16WhenAsked) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> chunks = DenseKeysHere();
  ASSERT_FALSE(chunks.empty());
  const std::vector<uint64_t> rows = EmbKeys(3, /*here=*/true);
  auto pull = [&](bool bf16) -> StatusOr<Message> {
    Message request = PullRequest({kEmb, kDense}, {rows, chunks});
    request.header().mutable_pull_request()->set_dense_bf16(bf16);
    return Call(std::move(request));
  };
  StatusOr<Message> exact = pull(false);
  StatusOr<Message> narrow = pull(true);
  ASSERT_TRUE(exact.ok() && narrow.ok());
  EXPECT_EQ(narrow->frame(0).size(), exact->frame(0).size());  // embedding: float32
  std::span<const float> dense = *exact->Array<float>(1);
  std::span<const uint16_t> dense_bf16 = *narrow->Array<uint16_t>(1);
  ASSERT_EQ(dense_bf16.size(), dense.size());
  for (size_t i = 0; i < dense.size(); ++i) ASSERT_EQ(dense_bf16[i], ToBfloat16(dense[i])) << i;

  // Gradients exact in bfloat16 give the same update either way.
  std::vector<float> grads = Grads(chunks.size());  // multiples of 1/4: exact
  std::vector<uint16_t> grads_bf16(grads.size());
  ToBfloat16(grads, grads_bf16);
  Message push;
  push.header().set_method(proto::PUSH);
  push.header().mutable_push_request()->set_client_seq(NextSeq());
  push.header().mutable_push_request()->add_table_ids(kDense);
  push.header().mutable_push_request()->set_dense_bf16(true);
  push.header().mutable_push_request()->set_reply_rows(true);
  push.AddArray(chunks);
  push.AddArray(std::span<const uint16_t>(grads_bf16));
  StatusOr<Message> pushed = Call(std::move(push));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  StatusOr<Message> after = pull(false);
  ASSERT_TRUE(after.ok());
  std::span<const float> updated = *after->Array<float>(1);
  std::span<const uint16_t> read_back = *pushed->Array<uint16_t>(0);
  ASSERT_EQ(read_back.size(), updated.size());
  for (size_t i = 0; i < updated.size(); ++i) {
    ASSERT_EQ(updated[i], Sgd(dense[i], grads[i])) << i;
    ASSERT_EQ(read_back[i], ToBfloat16(updated[i])) << i;
  }
}

// ps.max_new_rows_per_worker_s: a worker that created more rows than its
// quota is told to slow down (nothing done) until it has repaid them;
// other workers are not, and rows that exist cost nothing.
TEST_F(ParamServerTest, AWorkerCreatingRowsTooFastIsToldToSlowDown) {
  ParamServerOptions options = Options();
  options.max_new_rows_per_worker_s = 100;
  StartServer(options);
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(150, /*here=*/true);
  // Admitted with a full bucket; it creates 150 rows and owes 50.
  ASSERT_TRUE(Pull(kEmb, keys).ok());
  const Status refused = Push(kEmb, keys, Grads(keys.size()));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(ReasonOf(refused), proto::SLOW_DOWN);
  EXPECT_THAT(refused.message(), HasSubstr("worker 1 created more than"));
  StatusOr<std::vector<float>> untouched = Pull(kEmb, keys, &other_worker_);
  ASSERT_TRUE(untouched.ok()) << untouched.status();
  EXPECT_EQ(*untouched, std::vector<float>(keys.size() * kDim, 0.0f)) << "the refused push applied";
  // Half a second repays the 50 owed; from then on it reads and updates
  // the rows it made as often as it likes.
  absl::SleepFor(absl::Milliseconds(600));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Push(kEmb, keys, Grads(keys.size())).ok()) << i;
  const proto::ServerStats stats = master_->AwaitStats(
      [](const proto::ServerStats& s) { return s.requests_limited() >= 1; }, absl::Seconds(3));
  EXPECT_EQ(stats.requests_limited(), 1u);
}

// 3e38 is finite, so the push is valid; squared it would make the Adagrad
// accumulator, and so the weight, non-finite.
TEST_F(ParamServerTest, PushOfAHugeGradientKeepsAnAdagradRowFiniteAndIsCounted) {
  proto::JobSpec job = MakeJob();
  proto::OptimizerSpec& optimizer = *job.mutable_tables(kEmb)->mutable_optimizer();
  optimizer.set_kind(proto::OptimizerSpec::ADAGRAD);
  optimizer.set_initial_accumulator(0.1f);
  optimizer.set_epsilon(1e-8f);
  master_->set_job(job);
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(3, /*here=*/true);
  ASSERT_TRUE(Push(kEmb, keys, Grads(keys.size())).ok());
  StatusOr<std::vector<float>> before = Pull(kEmb, keys);
  ASSERT_TRUE(before.ok()) << before.status();

  std::vector<float> huge = Grads(keys.size());
  huge[1 * kDim + 2] = 3e38f;
  EXPECT_TRUE(Push(kEmb, keys, huge).ok()) << "acknowledged, like any valid push";
  StatusOr<std::vector<float>> after = Pull(kEmb, keys);
  ASSERT_TRUE(after.ok()) << after.status();
  for (float value : *after) EXPECT_TRUE(std::isfinite(value));
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::vector<float> row_before(before->begin() + i * kDim,
                                        before->begin() + (i + 1) * kDim);
    const std::vector<float> row_after(after->begin() + i * kDim, after->begin() + (i + 1) * kDim);
    if (i == 1) {
      EXPECT_EQ(row_after, row_before) << "the refused row keeps its weights";
    } else {
      EXPECT_NE(row_after, row_before) << "key " << i << " was updated";
    }
  }
  const proto::ServerStats stats = master_->AwaitStats(
      [](const proto::ServerStats& s) { return s.updates_refused() >= 1 && s.pushes() >= 2; },
      absl::Seconds(3));
  EXPECT_EQ(stats.updates_refused(), 1u);
  EXPECT_EQ(stats.pushes(), 2u);
}

TEST_F(ParamServerTest, KeysOfOtherPartitionsAreWrongOwner) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> elsewhere = EmbKeys(3, /*here=*/false);
  StatusOr<std::vector<float>> rows = Pull(kEmb, elsewhere);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kFailedPrecondition) << rows.status();
  EXPECT_EQ(ReasonOf(rows.status()), proto::WRONG_OWNER);

  // A push mixing its own keys with another server's applies nothing.
  std::vector<uint64_t> mixed = EmbKeys(4, /*here=*/true);
  mixed.push_back(elsewhere[0]);
  const Status pushed = Push(kEmb, mixed, Grads(mixed.size()));
  EXPECT_EQ(pushed.code(), absl::StatusCode::kFailedPrecondition) << pushed;
  EXPECT_EQ(ReasonOf(pushed), proto::WRONG_OWNER);
  mixed.pop_back();
  rows = Pull(kEmb, mixed);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, std::vector<float>(mixed.size() * kDim, 0.0f));

  // Dense chunks are placed the same way.
  std::vector<uint64_t> dense_elsewhere;
  for (uint64_t c = 0; c < kDenseChunks; ++c) {
    if (!OwnedHere(DenseChunkKey(kDense, c))) dense_elsewhere.push_back(DenseChunkKey(kDense, c));
  }
  ASSERT_FALSE(dense_elsewhere.empty());
  rows = Pull(kDense, dense_elsewhere);
  EXPECT_EQ(ReasonOf(rows.status()), proto::WRONG_OWNER) << rows.status();
}

TEST_F(ParamServerTest, NotReadyUntilTheMasterHasPlacedPartitions) {
  master_->set_map_version(0);  // heartbeats say: no map yet
  StartServer();
  const std::vector<uint64_t> keys = EmbKeys(2, /*here=*/true);
  // Several heartbeats have been answered, none announcing a map.
  ASSERT_TRUE(master_->AwaitHeartbeats(3, absl::Seconds(3)));
  StatusOr<Message> reply = Call(PullRequest({kEmb}, {keys}));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_EQ(ReasonOf(reply.status()), proto::NOT_READY);
  reply = Call(PushRequest({kEmb}, {keys}, {Grads(keys.size())}));
  EXPECT_EQ(ReasonOf(reply.status()), proto::NOT_READY) << reply.status();

  master_->set_map_version(1);
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);  // retries while NOT_READY
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, std::vector<float>(keys.size() * kDim, 0.0f));  // the push was not applied
}

TEST_F(ParamServerTest, NotReadyWhileStillRegistering) {
  // A request that reaches the port while Start is still waiting for the
  // master's reply (tables not yet made) is told to come back, not served
  // from half-built state.
  master_->HoldRegister();
  Status started;
  server_ = std::make_unique<ParamServer>(Options());
  std::thread starter([&] { started = server_->Start(); });
  const std::string endpoint = master_->AwaitRegistration(absl::Seconds(3));
  const std::vector<uint64_t> keys = EmbKeys(2, /*here=*/true);
  StatusOr<Message> reply = absl::UnknownError("no server registered");
  if (!endpoint.empty()) {
    CallOptions call;
    call.attempt_timeout = absl::Milliseconds(500);  // the server's Start waits 1 s per attempt
    call.max_attempts = 1;
    reply = channel_.Call(endpoint, PullRequest({kEmb}, {keys}), call);
  }
  master_->ReleaseRegister();
  starter.join();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
  EXPECT_EQ(ReasonOf(reply.status()), proto::NOT_READY) << reply.status();
  ASSERT_TRUE(started.ok()) << started;
  StatusOr<std::vector<float>> rows = Pull(kEmb, keys);
  EXPECT_TRUE(rows.ok()) << rows.status();
}

TEST_F(ParamServerTest, RejectsMalformedRequestsWithoutTouchingTables) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(3, /*here=*/true);
  const std::vector<float> grads = Grads(keys.size());
  ASSERT_TRUE(Push(kEmb, keys, grads).ok());
  StatusOr<std::vector<float>> before = Pull(kEmb, keys);
  ASSERT_TRUE(before.ok()) << before.status();
  const std::vector<uint64_t> chunks = DenseKeysHere();
  StatusOr<std::vector<float>> dense_before = Pull(kDense, chunks);
  ASSERT_TRUE(dense_before.ok()) << dense_before.status();

  auto expect_invalid = [&](Message request, const std::string& what) {
    StatusOr<Message> reply = Call(std::move(request));
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument)
        << what << ": " << reply.status();
    StatusOr<std::vector<float>> after = Pull(kEmb, keys);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(*after, *before) << what << " changed the embedding table";
    after = Pull(kDense, chunks);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(*after, *dense_before) << what << " changed the dense table";
  };

  expect_invalid(PullRequest({7}, {keys}), "PULL of an unknown table");
  expect_invalid(PushRequest({7}, {keys}, {grads}), "PUSH to an unknown table");
  expect_invalid(PullRequest({kEmb, kDense}, {keys}), "PULL of 2 tables with 1 frame");
  expect_invalid(PullRequest({kEmb}, {keys, keys}), "PULL of 1 table with 2 frames");
  expect_invalid(PullRequest({}, {}), "PULL of no table");
  expect_invalid(PushRequest({kEmb}, {keys}, {}), "PUSH with keys but no gradients");
  expect_invalid(PushRequest({kEmb, kDense}, {keys, chunks}, {grads}),
                 "PUSH of 2 tables with 3 frames");
  {
    Message request;
    request.header().set_method(proto::PULL);  // no PullRequest body
    request.AddArray(keys);
    expect_invalid(std::move(request), "PULL without a body");
  }
  {
    Message request = PullRequest({kEmb}, {});
    const char twelve_bytes[12] = {};
    request.AddFrame(zmq::message_t(twelve_bytes, sizeof(twelve_bytes)));
    expect_invalid(std::move(request), "PULL keys frame of 12 bytes");
  }
  {
    Message request = PushRequest({kEmb}, {}, {});
    const char twelve_bytes[12] = {};
    request.AddFrame(zmq::message_t(twelve_bytes, sizeof(twelve_bytes)));
    request.AddArray(grads);
    expect_invalid(std::move(request), "PUSH keys frame of 12 bytes");
  }
  {
    std::vector<float> short_grads = grads;
    short_grads.pop_back();
    expect_invalid(PushRequest({kEmb}, {keys}, {short_grads}), "PUSH with too few gradients");
    std::vector<float> long_grads = grads;
    long_grads.push_back(1.0f);
    expect_invalid(PushRequest({kEmb}, {keys}, {long_grads}), "PUSH with too many gradients");
  }
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> bad_grads = grads;
    bad_grads[5] = bad;
    expect_invalid(PushRequest({kEmb}, {keys}, {bad_grads}),
                   absl::StrCat("PUSH with gradient ", bad));
    // The bad table second: the first, valid one must not be applied either.
    std::vector<float> bad_dense = Grads(chunks.size());
    bad_dense.back() = bad;
    expect_invalid(PushRequest({kEmb, kDense}, {keys, chunks}, {grads, bad_dense}),
                   absl::StrCat("PUSH of 2 tables, the second with gradient ", bad));
  }
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(), 2097152.0f}) {
    Message request = PushRequest({kEmb}, {keys}, {grads});
    request.header().mutable_push_request()->set_lr_scale(bad);
    expect_invalid(std::move(request), absl::StrCat("PUSH with learning-rate scale ", bad));
  }
  // Dense keys must be chunks of their own tensor.
  expect_invalid(PullRequest({kDense}, {{DenseChunkKey(kDense, kDenseChunks)}}),
                 "PULL of the chunk past the end");
  expect_invalid(PullRequest({kDense}, {{DenseChunkKey(kEmb, 0)}}),
                 "PULL of another table's chunk");
  expect_invalid(PullRequest({kDense}, {{keys[0]}}), "PULL of an embedding key as a chunk");
  expect_invalid(
      PushRequest({kEmb, kDense}, {keys, {DenseChunkKey(kDense, 1u << 20)}}, {grads, Grads(1)}),
      "PUSH of a chunk far past the end");
}

TEST_F(ParamServerTest, FencedWorkerIsRefusedAndOthersAreNot) {
  StartServer();
  AwaitMap();
  const std::vector<uint64_t> keys = EmbKeys(5, /*here=*/true);
  const std::vector<float> grads = Grads(keys.size());
  ASSERT_TRUE(Push(kEmb, keys, grads).ok());
  StatusOr<std::vector<float>> before = Pull(kEmb, keys, &other_worker_);
  ASSERT_TRUE(before.ok()) << before.status();

  StatusOr<uint64_t> fenced = Fence({1});
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 1u);

  // Worker 1: everything refused with FENCED, even a malformed push.
  StatusOr<Message> reply = Call(PullRequest({kEmb}, {keys}));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition) << reply.status();
  EXPECT_EQ(ReasonOf(reply.status()), proto::FENCED) << reply.status();
  EXPECT_THAT(reply.status().message(), HasSubstr("worker 1 is fenced"));
  reply = Call(PushRequest({kEmb}, {keys}, {grads}));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition) << reply.status();
  EXPECT_EQ(ReasonOf(reply.status()), proto::FENCED) << reply.status();
  reply = Call(PushRequest({7}, {keys}, {grads}));
  EXPECT_EQ(ReasonOf(reply.status()), proto::FENCED) << reply.status();

  // Worker 2 sees the table as worker 1 left it, and is served as before.
  StatusOr<std::vector<float>> after = Pull(kEmb, keys, &other_worker_);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *before);
  reply = CallOn(other_worker_, PushRequest({kEmb}, {keys}, {grads}));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->header().push_reply().applied());
  after = Pull(kEmb, keys, &other_worker_);
  ASSERT_TRUE(after.ok()) << after.status();
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_EQ((*after)[i], Sgd((*before)[i], grads[i])) << i;
  }

  // A tool never pulls (tools only read the cluster map): refused for its
  // role, whatever its id.
  RpcChannel tool(&factory_, Node(proto::ROLE_TOOL, 1));
  EXPECT_EQ(Pull(kEmb, keys, &tool).status().code(), absl::StatusCode::kPermissionDenied);

  const proto::ServerStats stats = master_->AwaitStats(
      [](const proto::ServerStats& s) { return s.pushes_fenced() >= 2 && s.pushes() >= 2; },
      absl::Seconds(3));
  EXPECT_EQ(stats.pushes_fenced(), 2u);
  EXPECT_EQ(stats.pushes(), 2u);
}

TEST_F(ParamServerTest, FenceWorkersIsIdempotentMasterOnlyAndServedBeforeTheMap) {
  master_->set_map_version(0);  // no map: PULL and PUSH are NOT_READY
  StartServer();
  ASSERT_TRUE(master_->AwaitHeartbeats(2, absl::Seconds(3)));

  StatusOr<uint64_t> fenced = Fence({5, 7});
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 2u);
  fenced = Fence({5, 7});  // re-sent: nothing changes
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 2u);
  fenced = Fence({5, 7, 9});  // the list grew
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 3u);
  fenced = Fence({});
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 3u);

  // Only the master may fence.
  fenced = Fence({1}, &channel_);
  EXPECT_EQ(fenced.status().code(), absl::StatusCode::kPermissionDenied) << fenced.status();
  RpcChannel server(&factory_, Node(proto::ROLE_SERVER, 4));
  fenced = Fence({1}, &server);
  EXPECT_EQ(fenced.status().code(), absl::StatusCode::kPermissionDenied) << fenced.status();
  {
    Message request;
    request.header().set_method(proto::FENCE_WORKERS);  // no body
    StatusOr<Message> reply = CallOn(master_channel_, std::move(request));
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument) << reply.status();
  }

  // Still no map: a fenced worker hears FENCED, the others NOT_READY.
  const std::vector<uint64_t> keys = EmbKeys(2, /*here=*/true);
  RpcChannel worker5(&factory_, Node(proto::ROLE_WORKER, 5));
  StatusOr<Message> reply = CallOn(worker5, PushRequest({kEmb}, {keys}, {Grads(keys.size())}));
  EXPECT_EQ(ReasonOf(reply.status()), proto::FENCED) << reply.status();
  reply = Call(PullRequest({kEmb}, {keys}));
  EXPECT_EQ(ReasonOf(reply.status()), proto::NOT_READY) << reply.status();

  // With the map the fence still holds.
  master_->set_map_version(1);
  AwaitMap();
  reply = CallOn(worker5, PullRequest({kEmb}, {keys}));
  EXPECT_EQ(ReasonOf(reply.status()), proto::FENCED) << reply.status();
  fenced = Fence({1});
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 4u);
}

TEST_F(ParamServerTest, FenceWorkersIsServedWhileStillRegistering) {
  master_->HoldRegister();
  Status started;
  server_ = std::make_unique<ParamServer>(Options());
  std::thread starter([&] { started = server_->Start(); });
  const std::string endpoint = master_->AwaitRegistration(absl::Seconds(3));
  StatusOr<Message> reply = absl::UnknownError("no server registered");
  if (!endpoint.empty()) {
    Message request;
    request.header().set_method(proto::FENCE_WORKERS);
    request.header().mutable_fence_workers_request()->add_worker_ids(1);
    CallOptions call;
    call.attempt_timeout = absl::Milliseconds(500);  // the server's Start waits 1 s per attempt
    call.max_attempts = 1;
    reply = master_channel_.Call(endpoint, std::move(request), call);
  }
  master_->ReleaseRegister();
  starter.join();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->header().fence_workers_reply().fenced(), 1u);
  ASSERT_TRUE(started.ok()) << started;
  StatusOr<std::vector<float>> rows = Pull(kEmb, EmbKeys(1, /*here=*/true));
  EXPECT_EQ(ReasonOf(rows.status()), proto::FENCED) << rows.status();
}

}  // namespace
}  // namespace eps
