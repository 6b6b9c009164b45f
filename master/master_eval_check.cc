// Master::Impl's check of evaluation commits (master_impl.h,
// master/trust/eval_check.h): the range read and a sample recomputed from the
// servers' parameters, before JobControl applies the commit.

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "master/master_impl.h"

namespace eps {

Status Master::Impl::PullForCheck(const Batch& batch, ParamBuffers* params) {
  const auto current_map = [this]() -> StatusOr<proto::ClusterMap> {
    proto::NodeId self;
    self.set_role(proto::ROLE_MASTER);
    proto::GetClusterMapReply reply;
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(control_->GetClusterMap(self, &reply));
    return reply.map();
  };
  if (check_ps_ == nullptr) {
    proto::JobSpec spec;
    {
      absl::MutexLock lock(&mu_);
      spec = control_->job_spec();
    }
    ASSIGN_OR_RETURN(check_tables_, MatchParamTables(spec, eval_check_->params()));
    proto::NodeId self;
    self.set_role(proto::ROLE_MASTER);
    // It holds one of the master's two request threads, and no other
    // check: a check that cannot be made soon (a server down, or behind
    // the map) gives up within seconds, and the worker sends its commit
    // again.
    CallOptions options;
    options.attempt_timeout = absl::Seconds(2);
    options.max_attempts = 2;
    check_ps_ = std::make_unique<PsClient>(&factory_, self, std::move(spec), options, current_map);
  }
  uint64_t generation = 0;
  uint64_t map_version = 0;
  {
    absl::MutexLock lock(&mu_);
    generation = control_->membership().generation();
    map_version = control_->membership().cluster_map().version();
  }
  // The map changed since the last check (a server replaced): the new one.
  if (map_version != check_ps_->map_version()) {
    ASSIGN_OR_RETURN(proto::ClusterMap map, current_map());
    RETURN_IF_ERROR(check_ps_->SetClusterMap(map));
  }
  const std::vector<ParamSpec>& specs = eval_check_->params();
  // The buffers are eval_check_'s, kept from the last check.
  const bool dense_cached =
      check_dense_generation_ == generation && params->size() == specs.size();
  std::vector<PsClient::Keys> tables(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    tables[i].table_id = check_tables_.ids[i];
    if (specs[i].kind == ParamSpec::Kind::kEmbedding) {
      tables[i].keys = batch.keys;
    } else if (!dense_cached) {
      tables[i].keys = check_tables_.dense_keys[i];
    }  // else no keys: nothing pulled
  }
  std::vector<std::vector<float>> pulled;
  RETURN_IF_ERROR(check_ps_->Pull(tables, &pulled));
  params->resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind == ParamSpec::Kind::kEmbedding) {
      (*params)[i] = std::move(pulled[i]);
    } else if (!dense_cached) {
      // Whole chunks arrive; the model sees the tensor.
      (*params)[i] = std::move(pulled[i]);
      (*params)[i].resize(specs[i].size);
    }
  }
  check_dense_generation_ = generation;
  return absl::OkStatus();
}

Status Master::Impl::CheckEvaluation(const proto::NodeId& sender,
                                     const proto::CommitProgressRequest& commit,
                                     std::span<const float> labels,
                                     std::span<const float> predictions) {
  if (eval_check_ == nullptr || commit.phase() != proto::EVAL) return absl::OkStatus();
  std::optional<TrainingProgress::EvalRange> range;
  {
    absl::MutexLock lock(&mu_);
    range = control_->EvalRangeOf(sender, commit);
  }
  // Not one to apply now: JobControl refuses or acknowledges it.
  if (!range.has_value()) return absl::OkStatus();
  // Another commit's check holds the other request thread for up to
  // seconds: waiting for it here would leave none to answer heartbeats.
  if (!eval_check_mu_.TryLock()) {
    return ErrorWithReason(absl::StatusCode::kUnavailable,
                           "the master is checking another evaluation commit; send it again",
                           proto::SLOW_DOWN);
  }
  const Status checked = eval_check_->Check(
      range->path, range->first_line, commit, labels, predictions,
      [this](const Batch& batch, ParamBuffers* params) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return PullForCheck(batch, params);  // eval_check_mu_ is held
      },
      clock_->Now());
  eval_check_mu_.Unlock();
  if (checked.ok()) return absl::OkStatus();
  if (absl::IsFailedPrecondition(checked)) {
    // No evaluation of this data can be checked: the job stops, and
    // JobControl::Commit answers the worker that it is over.
    absl::MutexLock lock(&mu_);
    control_->Stop(absl::StrCat("worker[", sender.id(), "]'s evaluation commit of [",
                                commit.begin_offset(), ", ", commit.end_offset(), "): ",
                                checked.message(), ", then run eps-master --resume"),
                   clock_->Now());
    changed_.SignalAll();
    return absl::OkStatus();
  }
  if (checked.code() != absl::StatusCode::kPermissionDenied) {
    LOG(WARNING) << "worker[" << sender.id() << "]'s evaluation commit waits: "
                 << checked.message();
    return checked;
  }
  Status refused;
  {
    absl::MutexLock lock(&mu_);
    refused = control_->RefuseEvaluation(sender, std::string(checked.message()), clock_->Now());
    changed_.SignalAll();
  }
  RETURN_IF_ERROR(Persist());
  return refused;
}

}  // namespace eps
