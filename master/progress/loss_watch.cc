#include "master/progress/loss_watch.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace eps {

double LossWatch::window() const {
  return std::max(64.0, 8.0 * static_cast<double>(job_.worker.largest_batch_size()));
}

void LossWatch::Add(double loss_sum, uint64_t records, uint32_t epoch,
                    std::optional<EpochTotals> epoch1) {
  const double decay = std::exp(-static_cast<double>(records) / window());
  recent_loss_sum_ = recent_loss_sum_ * decay + loss_sum;
  recent_records_ = recent_records_ * decay + static_cast<double>(records);
  const std::optional<Reference> reference = ReferenceNow(epoch, epoch1);
  const bool over =
      reference.has_value() &&
      recent_loss_sum_ / recent_records_ >
          job_.job.divergence_factor * (records_over_ > 0 ? over_reference_ : *reference).loss;
  if (!over) {
    records_over_ = 0;
    return;
  }
  if (records_over_ == 0) over_reference_ = *reference;
  records_over_ += static_cast<double>(records);
}

void LossWatch::Reset() {
  recent_loss_sum_ = 0;
  recent_records_ = 0;
  records_over_ = 0;
}

std::optional<double> LossWatch::recent() const {
  if (recent_records_ <= 0) return std::nullopt;
  return recent_loss_sum_ / recent_records_;
}

std::optional<LossWatch::Reference> LossWatch::ReferenceNow(
    uint32_t epoch, std::optional<EpochTotals> epoch1) const {
  if (job_.job.divergence_factor <= 0 || !epoch1.has_value()) return std::nullopt;
  const double window = this->window();
  // recent_records_ approaches the window from below as records arrive.
  if (recent_records_ < 0.5 * window) return std::nullopt;
  double base_sum = epoch1->loss_sum;
  double base_records = static_cast<double>(epoch1->records);
  if (epoch == 0) {
    // Epoch 1's records before the recent ones: the running mean with the
    // recent records in it would rise with them.
    base_sum -= recent_loss_sum_;
    base_records -= recent_records_;
  }
  // A loss that exploded from the first batches on would make its own
  // baseline: the loss of a model that knows nothing caps it.
  const bool have_baseline = base_records >= window;
  const double baseline = have_baseline ? base_sum / base_records : kKnowNothingLogLoss;
  if (baseline >= kKnowNothingLogLoss) {
    return Reference{kKnowNothingLogLoss,
                     "the loss of a model that knows nothing (ln 2: predicting 0.5 for every "
                     "record)"};
  }
  return Reference{baseline, epoch == 0 ? "epoch 1's mean loss before them" : "epoch 1's mean loss"};
}

std::optional<std::string> LossWatch::Diverging(uint32_t epoch) const {
  const double window = this->window();
  if (records_over_ < kDivergedWindows * window) return std::nullopt;
  return absl::StrFormat(
      "training diverged in epoch %d: the mean loss of the last %.0f records, %.5f, has stayed "
      "over job.divergence_factor (%g) times %s, %.5f, for %.0f records",
      epoch + 1, window, recent_loss_sum_ / recent_records_, job_.job.divergence_factor,
      over_reference_.what,
      over_reference_.loss, records_over_);
}

}  // namespace eps
