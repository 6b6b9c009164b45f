#include "master/autoscale/autoscale_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace eps {

const char* ActionName(AutoscaleDecision::Action action) {
  switch (action) {
    case AutoscaleDecision::Action::kHold:
      return "hold";
    case AutoscaleDecision::Action::kUp:
      return "scale_up";
    case AutoscaleDecision::Action::kDown:
      return "scale_down";
  }
  return "hold";
}

nlohmann::json AutoscaleDecision::ToJson() const {
  nlohmann::json out = {{"action", ActionName(action)},
                        {"previous", previous},
                        {"target", target},
                        {"rule", rule}};
  if (signal.has_value()) {
    out["free_gpus"] = signal->free_gpus;
    out["pending_gpus"] = signal->pending_gpus;
  }
  return out;
}

int64_t ClampSize(int64_t size, int64_t min, const char* min_option, int64_t max,
                  const char* max_option, std::string* why) {
  if (size > max) {
    absl::StrAppend(why, " (at ", max_option, " = ", max, ")");
    return max;
  }
  if (size < min) {
    absl::StrAppend(why, " (at ", min_option, " = ", min, ")");
    return min;
  }
  return size;
}

Stabilizer::Stabilizer(const JobConfig::Autoscale& options, int64_t start)
    : up_window_(absl::Seconds(options.scale_up_stabilization_s)),
      down_window_(absl::Seconds(options.scale_down_stabilization_s)),
      cooldown_s_(options.cooldown_s),
      target_(start) {}

void Stabilizer::Settle(int64_t recommended, absl::Time now, AutoscaleDecision* decision) {
  decision->previous = target_;
  decision->target = target_;
  decision->action = AutoscaleDecision::Action::kHold;
  recommendations_.emplace_back(now, recommended);
  const absl::Duration longest = std::max(up_window_, down_window_);
  while (recommendations_.size() > 1 && now - recommendations_.front().first >= longest) {
    recommendations_.pop_front();
  }
  // The newest recommendation always counts; older ones while within
  // their window.
  int64_t up_to = recommended;
  int64_t down_to = recommended;
  for (const auto& [time, size] : recommendations_) {
    if (now - time < up_window_) up_to = std::min(up_to, size);
    if (now - time < down_window_) down_to = std::max(down_to, size);
  }
  int64_t wanted = target_;
  if (up_to > target_) {
    wanted = up_to;
  } else if (down_to < target_) {
    wanted = down_to;
  }
  if (wanted == target_) {
    if (recommended != target_) {
      absl::StrAppend(&decision->rule, "; held at ", target_, " by the stabilization window (",
                      recommended > target_ ? "lowest" : "highest",
                      " recommendation in it: ", recommended > target_ ? up_to : down_to, ")");
    }
  } else if (last_change_.has_value() && now - *last_change_ < absl::Seconds(cooldown_s_)) {
    absl::StrAppend(&decision->rule, "; held at ", target_, " by autoscale.cooldown_s = ",
                    cooldown_s_, " (", absl::ToInt64Seconds(now - *last_change_),
                    " s since the last change)");
  } else {
    if (wanted != recommended) {
      absl::StrAppend(&decision->rule, "; ", wanted, " by the stabilization window");
    }
    decision->action =
        wanted > target_ ? AutoscaleDecision::Action::kUp : AutoscaleDecision::Action::kDown;
    decision->target = wanted;
    target_ = wanted;
    last_change_ = now;
  }
}

AutoscalePolicy::AutoscalePolicy(const JobConfig::Autoscale& options)
    : options_(options), stabilizer_(options, options.min_workers) {
  last_.previous = target();
  last_.target = target();
  last_.rule = absl::StrCat("start at autoscale.min_workers = ", options_.min_workers);
}

std::pair<int64_t, std::string> AutoscalePolicy::Recommend(const AutoscaleSignal& signal,
                                                           const OwnGpus& own) const {
  const int64_t per_worker = options_.gpus_per_worker;
  const int64_t free = std::max<int64_t>(0, signal.free_gpus - own.starting);
  // What shrinking counts as free: our leaving workers' GPUs too.
  const int64_t releasing = free + own.stopping;
  const std::string free_text =
      own.starting > 0
          ? absl::StrCat("free GPUs ", free, " (", signal.free_gpus, " less ", own.starting,
                         " our starting workers take)")
          : absl::StrCat("free GPUs ", free);
  const std::string releasing_text =
      own.stopping > 0
          ? absl::StrCat(free_text, " and ", own.stopping, " our stopping workers release")
          : free_text;
  int64_t size = target();
  std::string why;
  if (signal.pending_gpus > releasing) {
    const int64_t give_back = (signal.pending_gpus - releasing + per_worker - 1) / per_worker;
    size = target() - give_back;
    why = absl::StrCat("other jobs wait for ", signal.pending_gpus, " GPUs, ", releasing_text,
                       ": give back ", give_back, " worker(s)");
  } else if (signal.pending_gpus > 0) {
    // The free GPUs cover them: the scheduler starts them without our
    // help, and growing now would take what they wait for.
    why = absl::StrCat("other jobs wait for ", signal.pending_gpus, " GPUs, ", releasing_text,
                       " cover them: keep the size");
  } else if (releasing < options_.scale_down_free_gpus) {
    const int64_t give_back =
        (options_.scale_down_free_gpus - releasing + per_worker - 1) / per_worker;
    size = target() - give_back;
    why = absl::StrCat(releasing_text, " < autoscale.scale_down_free_gpus = ",
                       options_.scale_down_free_gpus, ": give back ", give_back, " worker(s)");
  } else if (free >= options_.scale_up_free_gpus) {
    const int64_t take = free / per_worker;
    size = target() + take;
    why = absl::StrCat(free_text, " >= autoscale.scale_up_free_gpus = ",
                       options_.scale_up_free_gpus, ": take ", take, " worker(s)");
  } else {
    why = absl::StrCat(free_text, " within [", options_.scale_down_free_gpus, ", ",
                       options_.scale_up_free_gpus, "): keep the size");
  }
  size = ClampSize(size, options_.min_workers, "autoscale.min_workers", options_.max_workers,
                   "autoscale.max_workers", &why);
  return {size, why};
}

AutoscaleDecision AutoscalePolicy::Decide(const StatusOr<AutoscaleSignal>& signal,
                                          const OwnGpus& own, absl::Time now) {
  AutoscaleDecision decision;
  decision.time = now;
  decision.previous = target();
  decision.target = target();
  if (!signal.ok()) {
    decision.rule = absl::StrCat("no signal (", signal.status().message(), "): keeping ", target(),
                                 " worker(s)");
    last_ = decision;
    return decision;
  }
  decision.signal = *signal;
  auto [recommended, why] = Recommend(*signal, own);
  decision.rule = why;
  stabilizer_.Settle(recommended, now, &decision);
  last_ = decision;
  return decision;
}

}  // namespace eps
