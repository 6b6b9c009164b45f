#include "ps/worker_gate.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/message.h"

namespace eps {

bool WorkerGate::IsFenced(const proto::NodeId& sender) const {
  return sender.role() == proto::ROLE_WORKER && fenced_.contains(sender.id());
}

Status WorkerGate::FencedError(uint32_t worker) {
  return ErrorWithReason(
      absl::StatusCode::kFailedPrecondition,
      absl::StrCat("worker ", worker, " is fenced (its lease expired); it must register again"),
      proto::FENCED);
}

Status WorkerGate::CheckNotFenced(const proto::NodeId& sender) const {
  absl::ReaderMutexLock lock(&mu_);
  return IsFenced(sender) ? FencedError(sender.id()) : absl::OkStatus();
}

WorkerGate::Push WorkerGate::AdmitPush(const proto::NodeId& sender, uint64_t seq) {
  absl::ReaderMutexLock lock(&mu_);
  if (IsFenced(sender)) return Push::kFenced;
  // Sequence numbers are per worker; other senders have no id space of
  // their own to key them by.
  if (sender.role() != proto::ROLE_WORKER) return Push::kFirstTime;
  return dedup_->FirstTime(sender.id(), seq) ? Push::kFirstTime : Push::kRepeat;
}

WorkerGate::Push WorkerGate::PeekPush(const proto::NodeId& sender, uint64_t seq) const {
  absl::ReaderMutexLock lock(&mu_);
  if (IsFenced(sender)) return Push::kFenced;
  if (sender.role() != proto::ROLE_WORKER) return Push::kFirstTime;
  return dedup_->Seen(sender.id(), seq) ? Push::kRepeat : Push::kFirstTime;
}

WorkerGate::Fenced WorkerGate::Fence(std::span<const uint32_t> workers) {
  Fenced fenced;
  {
    absl::MutexLock lock(&mu_);
    for (uint32_t worker : workers) {
      if (fenced_.insert(worker).second) {
        // Exclusively: no push of this worker is between its fence check
        // and its record now, and none will be again.
        dedup_->Forget(worker);
        fenced.added.push_back(worker);
      }
    }
    fenced.total = fenced_.size();
  }
  absl::MutexLock lock(&receipts_mu_);
  for (uint32_t worker : fenced.added) last_receipts_.erase(worker);
  return fenced;
}

void WorkerGate::ForgetPushes() {
  absl::MutexLock lock(&mu_);
  dedup_ = std::make_unique<PushDeduplicator>();
}

void WorkerGate::SetReceiptKey(WorkerCredentials key) {
  auto shared = std::make_shared<const WorkerCredentials>(std::move(key));
  absl::MutexLock lock(&receipts_mu_);
  receipt_key_ = std::move(shared);
}

std::string WorkerGate::ReceiptFor(uint32_t sender, uint64_t seq, const proto::WorkBatch& batch,
                                   bool first_time) {
  std::shared_ptr<const WorkerCredentials> key;
  {
    absl::MutexLock lock(&receipts_mu_);
    key = receipt_key_;
  }
  if (key == nullptr) return std::string();
  std::string tag = key->Receipt(sender, batch);
  absl::MutexLock lock(&receipts_mu_);
  if (first_time) {
    last_receipts_[sender] = LastReceipt{.seq = seq, .tag = tag};
    return tag;
  }
  const auto last = last_receipts_.find(sender);
  if (last == last_receipts_.end() || last->second.seq != seq || last->second.tag != tag) {
    return std::string();
  }
  return tag;
}

}  // namespace eps
