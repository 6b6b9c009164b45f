// Worker::Impl's trainer (worker_impl.h): the loop over a session's
// batches (TrainBatches), and each step: the pulls a batch needs, its
// forward and backward pass, and the push and commit it hands to the step
// pipeline.

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "core/failpoint.h"
#include "core/logging.h"
#include "models/batch.h"
#include "rpc/message.h"
#include "worker/worker_impl.h"

namespace eps {

Status Worker::Impl::TrainBatches(Session& session, RpcChannel& master) {
  const absl::Time started = absl::Now();
  absl::Time last_progress = started;
  uint64_t records_at_progress = records_committed_.load();
  uint64_t session_records = 0;
  double loss_sum_since = 0;
  uint64_t loss_count_since = 0;
  Status status;
  // Looked up once a session, not once a batch.
  const bool hang_trainer = FailpointArmed("worker.hang_trainer", session.self.id());
  // The batch sizer times whole steps: from one step's hand-over to the
  // pipeline to the next.
  absl::Time step_ended = absl::Now();
  // Where the trainer waits: for its batch (WorkerStats.batch_wait) and to
  // hand a step over (push_wait).
  const auto next_batch = [&session] {
    const ScopedLatency waiting(&session.batch_wait);
    return session.loader->Pop();
  };
  // Under worker.deterministic: the trainer's own pulls.
  std::unique_ptr<PsClient> sync_ps;
  while (std::shared_ptr<PreparedBatch> prepared = next_batch()) {
    if (session.over.load()) break;  // fenced: nothing queued may land
    if (!prepared->unreadable.empty()) {
      // Every batch of the shard before it is committed: the master checks
      // the file from there and skips the rest, or stops the job.
      {
        const ScopedLatency waiting(&session.push_wait);
        status = session.pipeline->Drain();
      }
      if (status.ok()) status = ReportUnreadable(session, master, *prepared);
      if (!status.ok()) break;
      continue;
    }
    // No step is in flight while the master asks to pause for a
    // coordinated checkpoint: the moment to pause.
    if (!BeginStep(session)) break;
    // Until the pipeline takes the step (its on_end then ends it).
    absl::Cleanup end_step = [&session] { EndStep(session); };
    StepResult result;
    if (options_.job.worker.deterministic && prepared->batch.size() > 0 &&
        prepared->shard.phase() == proto::TRAIN) {
      // The rows as every earlier push of this worker left them (the
      // loader, which works ahead, pulls none: LoaderHooks).
      {
        const ScopedLatency waiting(&session.push_wait);
        status = session.pipeline->Drain();
      }
      if (!status.ok()) break;
      if (sync_ps == nullptr) sync_ps = MakePsClient(session, &master);
      status = PullParams(session, *sync_ps, Pulled::kWithBatch, prepared->batch.keys,
                          &prepared->params, nullptr);
      if (!status.ok()) break;
    }
    if (prepared->batch.size() > 0) {
      status = Train(session, prepared, &result);
      if (!status.ok()) break;
    }
    const double loss_sum = result.loss_sum;
    std::move(end_step).Cancel();  // the step's on_end ends it, queued or refused
    {
      const ScopedLatency waiting(&session.push_wait);
      status = session.pipeline->Enqueue(MakeStep(session, prepared, std::move(result)));
    }
    if (!status.ok()) break;
    if (hang_trainer) {
      // As a trainer stuck in a device call: in its next step, holding its
      // shard, heartbeating, until the process is asked to stop.
      LOG(WARNING) << "failpoint worker.hang_trainer=" << session.self.id()
                   << ": the trainer hangs";
      {
        absl::MutexLock lock(&session.mu);
        ++session.steps_in_flight;
      }
      while (!SleepUnlessStopping(absl::Hours(1))) {
      }
      break;
    }
    const absl::Time now = absl::Now();
    if (prepared->shard.phase() == proto::TRAIN) {
      const uint64_t records = static_cast<uint64_t>(prepared->batch.size());
      session_records += records;
      loss_sum_since += loss_sum;
      loss_count_since += records;
      if (std::optional<BatchSizer::Change> change =
              batch_size_.StepDone(prepared->batch.size(), now - step_ended)) {
        session.loader->SetBatchSize(change->to);
      }
      Throttle(started, session_records);
    }
    step_ended = now;
    if (now - last_progress >= absl::Seconds(options_.job.job.progress_interval_s)) {
      const uint64_t records = records_committed_.load();
      std::string job;
      {
        absl::MutexLock lock(&mu_);
        job = job_progress_;
      }
      LOG(INFO) << records << " records trained, "
                << absl::StrFormat("%.0f", (records - records_at_progress) /
                                               absl::ToDoubleSeconds(now - last_progress))
                << " records/s, loss "
                << (loss_count_since ? absl::StrFormat("%.5f", loss_sum_since / loss_count_since)
                                     : std::string("n/a"))
                << (prepared->shard.phase() == proto::EVAL ? " (evaluating)" : "") << "; " << job;
      last_progress = now;
      records_at_progress = records;
      loss_sum_since = 0;
      loss_count_since = 0;
    }
  }
  return status;
}

Status Worker::Impl::PullParams(Session& session, PsClient& ps, Pulled which,
                                std::span<const uint64_t> keys, ParamBuffers* params,
                                PsClient::Versions* versions) {
  const std::vector<ParamSpec>& specs = model_->params();
  std::vector<PsClient::Keys> tables(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    tables[i].table_id = session.table_ids[i];
    if (!Wanted(which, specs[i])) continue;  // no keys: nothing pulled
    tables[i].keys = specs[i].kind == ParamSpec::Kind::kEmbedding
                         ? keys
                         : std::span<const uint64_t>(session.dense_keys[i]);
  }
  std::vector<std::vector<float>> pulled;
  // The step pipeline's copy (kAtStep) is what the next step computes from
  // and pushes on: it reserves its share of the global batches.
  RETURN_IF_ERROR_CTX(ps.Pull(tables, &pulled, versions, /*reserve=*/which == Pulled::kAtStep),
                      which == Pulled::kAtStep ? "pull of the dense tensors" : "pull");
  TakeRows(which, &pulled, params);
  return absl::OkStatus();
}

bool Worker::Impl::Wanted(Pulled which, const ParamSpec& spec) {
  return which == Pulled::kAll || spec.pull_each_step == (which == Pulled::kAtStep);
}

void Worker::Impl::TakeRows(Pulled which, std::vector<std::vector<float>>* rows,
                            ParamBuffers* params) const {
  const std::vector<ParamSpec>& specs = model_->params();
  params->resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!Wanted(which, specs[i])) continue;
    (*params)[i] = std::move((*rows)[i]);
    // Dense tensors arrive as whole chunks; the model sees the tensor.
    if (specs[i].kind == ParamSpec::Kind::kDense) (*params)[i].resize(specs[i].size);
  }
}

Status Worker::Impl::Train(Session& session, const std::shared_ptr<PreparedBatch>& prepared,
                           StepResult* result) {
  // An evaluation batch was prepared with the final dense tensors.
  const bool eval = prepared->shard.phase() == proto::EVAL;
  std::shared_ptr<const StepPipeline::DenseCopy> copy;
  if (!eval) {
    ASSIGN_OR_RETURN(copy, session.pipeline->AwaitDense());
  }
  if (copy != nullptr) {
    const std::vector<ParamSpec>& specs = model_->params();
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].pull_each_step) prepared->params[i] = copy->values[i];
    }
  }
  const float lr_scale = eval ? 1.0f : batch_size_.LrScale(prepared->batch.size());
  const ScopedLatency computing(&session.compute);
  return Step(session, *prepared, std::shared_ptr<const Batch>(prepared, &prepared->batch),
              prepared->params, copy, lr_scale, result);
}

Status Worker::Impl::Step(Session& session, const PreparedBatch& prepared,
                          std::shared_ptr<const Batch> batch, const ParamBuffers& params,
                          const std::shared_ptr<const StepPipeline::DenseCopy>& copy,
                          float lr_scale, StepResult* result) {
  const bool eval = prepared.shard.phase() == proto::EVAL;
  ParamBuffers grads;
  std::vector<float> batch_predictions;
  double loss = 0;
  // The failpoint worker.oom_above stands for a device that holds fewer.
  bool out_of_memory =
      oom_above_.has_value() && static_cast<uint64_t>(batch->size()) > *oom_above_;
  try {
    if (!out_of_memory) {
      loss = model_->ForwardBackward(*batch, params, &batch_predictions, eval ? nullptr : &grads);
    }
  } catch (const std::bad_alloc&) {
    out_of_memory = true;
  }
  if (out_of_memory) {
    if (batch->size() <= 1) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a step of one record of ", prepared.shard.path(), " from byte ",
                       prepared.begin, " ran out of memory: the model does not fit"));
    }
    LOG(WARNING) << "a step of " << batch->size() << " records ran out of memory; training it "
                 << "in two halves";
    if (std::optional<BatchSizer::Change> change = batch_size_.OutOfMemory(batch->size())) {
      session.loader->SetBatchSize(change->to);
    }
    const int half = batch->size() / 2;
    for (const auto& [begin, end] : {std::pair{0, half}, std::pair{half, batch->size()}}) {
      std::vector<uint32_t> from;
      auto piece = std::make_shared<const Batch>(SliceBatch(*batch, begin, end, &from));
      const float share = lr_scale * static_cast<float>(end - begin) / batch->size();
      RETURN_IF_ERROR(Step(session, prepared, piece, model_->SliceParams(params, from), copy,
                           share, result));
      if (!std::isfinite(result->loss_sum)) break;  // diverged: nothing more of it is pushed
    }
    return absl::OkStatus();
  }
  result->loss_sum += loss;
  result->predictions.insert(result->predictions.end(), batch_predictions.begin(),
                             batch_predictions.end());
  if (eval) return absl::OkStatus();
  // A diverged model: push nothing of it. The commit carries the
  // non-finite loss, and the master stops the job (resumably) on it.
  const bool loss_finite = std::isfinite(loss);
  if (!loss_finite || !AllFinite(grads)) {
    LOG(ERROR) << "the model diverged: "
               << (loss_finite ? std::string("a non-finite gradient") : absl::StrCat("loss ", loss))
               << " on the batch of " << prepared.shard.path() << " from byte " << prepared.begin
               << "; pushing nothing of it, telling the master";
    result->loss_sum = std::numeric_limits<double>::quiet_NaN();
    result->pushes.clear();
    result->late_pushes.clear();
    return absl::OkStatus();
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (model_->params()[i].kind == ParamSpec::Kind::kEmbedding) continue;
    // Pad the gradient to whole chunks.
    grads[i].resize(session.dense_keys[i].size() * session.job.tables(session.table_ids[i]).dim(),
                    0.0f);
  }
  // Pushed by the pipeline, from its thread, while the next step computes.
  // The pass the rows were trained in (for ps.ttl_passes).
  const uint32_t pass = prepared.shard.epoch() + 1;
  // The records the push trains, for the servers' receipt.
  proto::WorkBatch work;
  work.set_shard_id(prepared.shard.shard_id());
  work.set_epoch(prepared.shard.epoch());
  work.set_begin_offset(prepared.begin);
  work.set_end_offset(prepared.end);
  work.set_records(static_cast<uint32_t>(batch->size()));
  // Two pushes when the model has a dense copy: first the gradients of the
  // copy's tensors (the next step waits for them and the copy pulled after
  // them), then the rest, the late push, while the next step computes. The
  // last push made carries the batch: its receipt counts the records once.
  const std::vector<ParamSpec>& specs = model_->params();
  // Split only when the late push carries keys: a push without any sends
  // nothing, and would bring back no receipt for the batch.
  bool split = false;
  for (size_t i = 0; i < specs.size() && has_step_params_; ++i) {
    if (specs[i].pull_each_step) continue;
    split |= specs[i].kind == ParamSpec::Kind::kEmbedding ? !batch->keys.empty()
                                                          : !session.dense_keys[i].empty();
  }
  auto shared_grads = std::make_shared<const ParamBuffers>(std::move(grads));
  // A push of the parameters `carries` takes. With `copied`, it pushes the
  // copy's tensors, based on the copy, and reads them back (the next copy,
  // no pull after it); with `last`, it carries the batch for the receipt.
  const auto make_push = [&](std::function<bool(const ParamSpec&)> carries, bool copied,
                             bool last) -> StepPipeline::Step::Push {
    return [this, &session, batch, copy = copied ? copy : nullptr, grads = shared_grads, lr_scale,
            pass, work, last, carries = std::move(carries),
            read_back = copied && has_step_params_, receipts = result->receipts](
               StepPipeline::Lane& lane, PsClient::Versions* applied,
               StepPipeline::DenseCopy* next) -> Status {
      const std::vector<ParamSpec>& specs = model_->params();
      std::vector<PsClient::Keys> keys(specs.size());
      std::vector<std::span<const float>> values(specs.size());
      for (size_t i = 0; i < specs.size(); ++i) {
        keys[i].table_id = session.table_ids[i];
        if (!carries(specs[i])) continue;  // no keys: nothing pushed
        keys[i].keys = specs[i].kind == ParamSpec::Kind::kEmbedding
                           ? std::span<const uint64_t>(batch->keys)
                           : std::span<const uint64_t>(session.dense_keys[i]);
        values[i] = (*grads)[i];
      }
      // A worker that was frozen past its lease must not push: its shard
      // may be another worker's by now.
      RETURN_IF_ERROR(CheckLease(session));
      std::string receipt;
      PsClient::Rows rows;
      RETURN_IF_ERROR(Annotate(
          lane.ps->Push(keys, values,
                        {.lr_scale = lr_scale,
                         .based_on = copy ? &copy->versions : nullptr,
                         .versions = applied,
                         .pass = pass,
                         .records = work.records(),
                         .batch = last ? &work : nullptr,
                         .receipt = last ? &receipt : nullptr,
                         .after = read_back && next != nullptr ? &rows : nullptr}),
          "push"));
      if (read_back && next != nullptr && !rows.values.empty()) {
        TakeRows(Pulled::kAtStep, &rows.values, &next->values);
        next->versions = std::move(rows.versions);
      }
      if (!last) return absl::OkStatus();
      if (!receipt.empty()) {
        proto::WorkReceipt& proof = receipts->emplace_back();
        proof.set_records(work.records());
        proof.set_tag(std::move(receipt));
      }
      records_pushed_.fetch_add(static_cast<uint64_t>(batch->size()));
      return absl::OkStatus();
    };
  };
  if (!split) {
    result->pushes.push_back(make_push([](const ParamSpec&) { return true; }, true, true));
    return absl::OkStatus();
  }
  result->pushes.push_back(
      make_push([](const ParamSpec& spec) { return spec.pull_each_step; }, true, false));
  result->late_pushes.push_back(
      make_push([](const ParamSpec& spec) { return !spec.pull_each_step; }, false, true));
  return absl::OkStatus();
}

Status Worker::Impl::ReportUnreadable(Session& session, RpcChannel& master,
                                      const PreparedBatch& marker) {
  // The master decides for the whole job once; a repeat gets the same answer.
  StatusOr<Message> reply = CallMaster(session, master, [&] {
    Message request;
    request.header().set_method(proto::SHARD_UNREADABLE);
    proto::ShardUnreadableRequest* body = request.header().mutable_shard_unreadable_request();
    body->set_shard_id(marker.shard.shard_id());
    body->set_epoch(marker.shard.epoch());
    body->set_phase(marker.shard.phase());
    body->set_offset(marker.begin);
    body->set_line(marker.unreadable_line);
    body->set_error(marker.unreadable);
    return request;
  });
  if (!reply.ok()) {
    return Annotate(reply.status(), absl::StrCat("cannot read ", marker.shard.path(), " (",
                                                 marker.unreadable, ")"));
  }
  if (reply->header().shard_unreadable_reply().skipped()) {
    LOG(WARNING) << "the master skipped the rest of shard " << marker.shard.shard_id() << " ("
                 << marker.shard.path() << " from line " << marker.unreadable_line
                 << "): data.on_unreadable = skip";
  }
  return absl::OkStatus();
}

Status Worker::Impl::Commit(Session& session, RpcChannel& master, const PreparedBatch& prepared,
                            double loss_sum, const std::vector<float>& predictions,
                            const std::vector<proto::WorkReceipt>& receipts) {
  // A repeated commit is acknowledged without effect, so retrying is safe.
  StatusOr<Message> reply = CallMaster(session, master, [&] {
    Message request;
    request.header().set_method(proto::COMMIT_PROGRESS);
    proto::CommitProgressRequest* body = request.header().mutable_commit_progress_request();
    body->set_shard_id(prepared.shard.shard_id());
    body->set_epoch(prepared.shard.epoch());
    body->set_phase(prepared.shard.phase());
    body->set_begin_offset(prepared.begin);
    body->set_end_offset(prepared.end);
    body->set_lines(prepared.lines);
    body->set_malformed(prepared.malformed);
    body->set_loss_sum(loss_sum);
    for (const std::string& example : prepared.malformed_examples) {
      body->add_malformed_examples(example);
    }
    body->mutable_receipts()->Add(receipts.begin(), receipts.end());
    if (prepared.shard.phase() == proto::EVAL) {
      request.AddArray(prepared.batch.labels);
      request.AddArray(predictions);
    }
    return request;
  });
  RETURN_IF_ERROR_CTX(reply.status(), absl::StrCat("commit of shard ", prepared.shard.shard_id()));
  const proto::CommitProgressReply& answer = reply->header().commit_progress_reply();
  if (answer.has_split_shard()) session.loader->RequestSplit(answer.split_shard());
  if (answer.pause_for_checkpoint() != 0) {
    absl::MutexLock lock(&session.mu);
    session.pause_for = answer.pause_for_checkpoint();
  }
  return absl::OkStatus();
}

StepPipeline::Step Worker::Impl::MakeStep(Session& session,
                                          std::shared_ptr<PreparedBatch> prepared,
                                          StepResult result) {
  // Computed: neither its pushes nor its commit read the batch's parameters
  // (embedding rows and the dense copy), which would otherwise stay in memory
  // while the step waits in the pipeline.
  ParamBuffers().swap(prepared->params);
  StepPipeline::Step step;
  step.pushes = std::move(result.pushes);
  step.late_pushes = std::move(result.late_pushes);
  step.commit = [this, &session, prepared = std::move(prepared), loss_sum = result.loss_sum,
                 predictions = std::move(result.predictions),
                 receipts = std::move(result.receipts)](StepPipeline::Lane& lane) {
    RETURN_IF_ERROR(CheckLease(session));
    RETURN_IF_ERROR(Commit(session, *lane.master, *prepared, loss_sum, predictions, *receipts));
    batches_.fetch_add(1);
    malformed_.fetch_add(prepared->malformed);
    if (prepared->shard.phase() == proto::TRAIN) {
      records_committed_.fetch_add(static_cast<uint64_t>(prepared->batch.size()));
    }
    return absl::OkStatus();
  };
  // Committed, failed or dropped: the step is no longer in flight.
  step.on_end = [&session] { EndStep(session); };
  return step;
}

StepPipeline::Hooks Worker::Impl::PipelineHooks(Session& session) {
  StepPipeline::Hooks hooks;
  hooks.make_lane = [this, &session] {
    StepPipeline::Lane lane;
    lane.master = std::make_unique<RpcChannel>(&factory_, session.self);
    lane.ps = MakePsClient(session, lane.master.get());
    // The step's dense traffic only: evaluation and the batches' pulls
    // read the model in float32.
    lane.ps->set_dense_bf16(options_.job.worker.dense_wire == "bfloat16");
    return lane;
  };
  if (has_step_params_) {
    hooks.pull_dense = [this, &session](StepPipeline::Lane& lane, StepPipeline::DenseCopy* copy) {
      return PullParams(session, *lane.ps, Pulled::kAtStep, {}, &copy->values,
                        &copy->versions);
    };
  }
  // A fenced or failed session's steps are moot; a stopping worker's are
  // committed first (Drain).
  hooks.abandoned = [&session] { return session.over.load(); };
  hooks.stats = &session.staleness;
  hooks.map_version = [](StepPipeline::Lane& lane) { return lane.ps->map_version(); };
  return hooks;
}

bool Worker::Impl::BeginStep(Session& session) {
  absl::Time paused;
  uint64_t checkpoint = 0;  // the pause in progress, once seen
  while (true) {
    bool newly_paused = false;
    {
      absl::MutexLock lock(&session.mu);
      if (session.pause_for == 0) {
        ++session.steps_in_flight;
        if (checkpoint != 0) {
          VLOG(1) << "checkpoint " << checkpoint << ": resumed after "
                  << absl::FormatDuration(absl::Now() - paused);
        }
        break;
      }
      if (checkpoint == 0) {
        checkpoint = session.pause_for;
        paused = absl::Now();
        newly_paused = true;
      }
    }
    if (newly_paused) {
      VLOG(1) << "paused for checkpoint " << checkpoint;
      session.member->HeartbeatNow();  // tell the master without waiting for the next beat
    }
    // A failed pipeline commits nothing more: the session ends on its
    // failure instead of waiting out the pause.
    if (StoppingOrOver(session) || !session.pipeline->status().ok()) return false;
    // Timed: a stop or the end of the session does not signal pause_changed.
    absl::MutexLock lock(&session.mu);
    if (session.pause_for != 0) {
      session.pause_changed.WaitWithTimeout(&session.mu, absl::Milliseconds(50));
    }
  }
  // The checkpoint applied the servers' global batches (ps/global_batch.h)
  // under the worker's copy of the dense tensors, which no reply tells of:
  // a step from that copy would be dropped as stale.
  if (checkpoint != 0 && options_.job.optimizer.dense_global_batch > 0) {
    session.pipeline->RenewDense();
  }
  return true;
}

}  // namespace eps
