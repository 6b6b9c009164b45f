// The boundary values JobConfig::Validate accepts: the smallest and the
// largest allowed value of every numeric option, one change at a time on
// top of a valid config. tests/core/job_config_test.cc checks that Validate
// accepts each; tests/master/job_spec_test.cc that the job spec built from
// each (for every optimizer type) is one every server accepts.
//
// Thread-safety: pure functions.

#ifndef EPS_TESTS_TESTING_JOB_CONFIG_BOUNDARIES_H_
#define EPS_TESTS_TESTING_JOB_CONFIG_BOUNDARIES_H_

#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/job_config.h"

namespace eps::testing {

struct BoundaryCase {
  std::string name;  // "option = value"
  std::function<void(JobConfig&)> set;
};

// The shortest text that reads back as `value`.
inline std::string ExactText(double value) {
  char text[32];
  const std::to_chars_result end = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, end.ptr);
}

inline std::vector<BoundaryCase> JobConfigBoundaries() {
  constexpr int64_t kDayMs = 86'400'000;
  constexpr int64_t kWeekS = 604'800;
  std::vector<BoundaryCase> cases;
  auto add = [&cases](std::string name, std::function<void(JobConfig&)> set) {
    cases.push_back({std::move(name), std::move(set)});
  };

  // Integer options bounded on their own, each at both ends.
  struct IntBound {
    const char* option;
    int64_t& (*field)(JobConfig&);
    int64_t min;
    int64_t max;
  };
  const IntBound int_bounds[] = {
      {"job.epochs", [](JobConfig& c) -> int64_t& { return c.job.epochs; }, 1, 1'000'000},
      {"job.seed", [](JobConfig& c) -> int64_t& { return c.job.seed; }, 0,
       std::numeric_limits<int64_t>::max()},
      {"job.progress_interval_s",
       [](JobConfig& c) -> int64_t& { return c.job.progress_interval_s; }, 1, 86'400},
      {"data.shard_records", [](JobConfig& c) -> int64_t& { return c.data.shard_records; }, 1,
       1'000'000'000},
      {"model.embedding_dim", [](JobConfig& c) -> int64_t& { return c.model.embedding_dim; }, 1,
       4096},
      {"ps.threads", [](JobConfig& c) -> int64_t& { return c.ps.threads; }, 1, 1024},
      {"ps.memory_budget_mb", [](JobConfig& c) -> int64_t& { return c.ps.memory_budget_mb; }, 0,
       int64_t{1} << 24},
      {"ps.flush_interval_ms", [](JobConfig& c) -> int64_t& { return c.ps.flush_interval_ms; }, 1,
       kDayMs},
      {"ps.journal_mb", [](JobConfig& c) -> int64_t& { return c.ps.journal_mb; }, 0,
       int64_t{1} << 20},
      {"ps.master_wait_s", [](JobConfig& c) -> int64_t& { return c.ps.master_wait_s; }, 0,
       kWeekS},
      {"ps.rpc_timeout_ms", [](JobConfig& c) -> int64_t& { return c.ps.rpc_timeout_ms; }, 1,
       kDayMs},
      {"ps.dense_chunk_floats", [](JobConfig& c) -> int64_t& { return c.ps.dense_chunk_floats; }, 1,
       1 << 20},
      {"worker.batch_size", [](JobConfig& c) -> int64_t& { return c.worker.batch_size.value; },
       1, 1 << 20},
      {"optimizer.dense_global_batch",
       [](JobConfig& c) -> int64_t& { return c.optimizer.dense_global_batch; }, 0, 1 << 30},
      {"optimizer.lr_warmup_batches",
       [](JobConfig& c) -> int64_t& { return c.optimizer.lr_warmup_batches; }, 0, 1'000'000},
      {"worker.prefetch_batches",
       [](JobConfig& c) -> int64_t& { return c.worker.prefetch_batches; }, 1, 1024},
      {"worker.max_staleness",
       [](JobConfig& c) -> int64_t& { return c.worker.max_staleness; }, 0, 1024},
      {"worker.master_wait_s", [](JobConfig& c) -> int64_t& { return c.worker.master_wait_s; }, 0,
       kWeekS},
      {"worker.max_records_per_s",
       [](JobConfig& c) -> int64_t& { return c.worker.max_records_per_s; }, 0, 1'000'000'000},
      {"worker.compute_threads", [](JobConfig& c) -> int64_t& { return c.worker.compute_threads; },
       0, 1024},
      {"master.recovery_timeout_s",
       [](JobConfig& c) -> int64_t& { return c.master.recovery_timeout_s; }, 1, kWeekS},
      {"master.progress_timeout_s",
       [](JobConfig& c) -> int64_t& { return c.master.progress_timeout_s; }, 1, kWeekS},
      {"master.worker_wait_s", [](JobConfig& c) -> int64_t& { return c.master.worker_wait_s; }, 0,
       kWeekS},
      {"checkpoint.interval_s", [](JobConfig& c) -> int64_t& { return c.checkpoint.interval_s; }, 1,
       kWeekS},
      {"checkpoint.keep", [](JobConfig& c) -> int64_t& { return c.checkpoint.keep; }, 1, 1000},
      {"checkpoint.max_failures",
       [](JobConfig& c) -> int64_t& { return c.checkpoint.max_failures; }, 0, 1000},
      {"autoscale.source_timeout_s",
       [](JobConfig& c) -> int64_t& { return c.autoscale.source_timeout_s; }, 1, 3600},
      {"autoscale.gpus_per_worker",
       [](JobConfig& c) -> int64_t& { return c.autoscale.gpus_per_worker; }, 1, 1024},
      {"autoscale.interval_s", [](JobConfig& c) -> int64_t& { return c.autoscale.interval_s; }, 1,
       86'400},
      {"autoscale.cooldown_s", [](JobConfig& c) -> int64_t& { return c.autoscale.cooldown_s; }, 0,
       86'400},
      {"autoscale.scale_up_stabilization_s",
       [](JobConfig& c) -> int64_t& { return c.autoscale.scale_up_stabilization_s; }, 0, 86'400},
      {"autoscale.scale_down_stabilization_s",
       [](JobConfig& c) -> int64_t& { return c.autoscale.scale_down_stabilization_s; }, 0, 86'400},
      {"autoscale.max_restarts", [](JobConfig& c) -> int64_t& { return c.autoscale.max_restarts; },
       0, 1'000'000},
      {"autoscale.restart_backoff_s",
       [](JobConfig& c) -> int64_t& { return c.autoscale.restart_backoff_s; }, 0, 3600},
      {"autoscale.max_servers", [](JobConfig& c) -> int64_t& { return c.autoscale.max_servers; },
       0, 4096},
  };
  for (const IntBound& bound : int_bounds) {
    for (int64_t v : {bound.min, bound.max}) {
      add(absl::StrCat(bound.option, " = ", v),
          [field = bound.field, v](JobConfig& c) { field(c) = v; });
    }
  }

  // Options bounded together.
  for (const auto& [low, high] : {std::pair<int64_t, int64_t>{1, 1}, {1 << 20, 1 << 20}, {1, 1 << 20}}) {
    add(absl::StrCat("worker.batch_size = auto, worker.min_batch_size = ", low,
                     ", worker.max_batch_size = ", high),
        [low = low, high = high](JobConfig& c) {
          c.worker.batch_size = IntOrAuto{0, true};
          c.worker.min_batch_size = low;
          c.worker.max_batch_size = high;
        });
  }
  for (const char* rule : {"linear", "sqrt"}) {
    add(absl::StrCat("optimizer.lr_scaling = ", rule),
        [rule](JobConfig& c) { c.optimizer.lr_scaling = rule; });
  }
  for (int64_t v : {int64_t{1}, int64_t{1} << 20}) {
    add(absl::StrCat("ps.num_servers = ps.partitions = ", v), [v](JobConfig& c) {
      c.ps.num_servers = v;
      c.ps.partitions = v;
    });
  }
  for (const auto& [timeout, attempts] : {std::pair<int64_t, int64_t>{1, 1000}, {kDayMs, 1}}) {
    add(absl::StrCat("worker.rpc_timeout_ms = ", timeout, ", worker.rpc_attempts = ", attempts),
        [timeout = timeout, attempts = attempts](JobConfig& c) {
          c.worker.rpc_timeout_ms = timeout;
          c.worker.rpc_attempts = attempts;
        });
  }
  for (const auto& [heartbeat, lease] : {std::pair<int64_t, int64_t>{1, 2}, {kDayMs - 1, kDayMs}}) {
    add(absl::StrCat("master.heartbeat_ms = ", heartbeat, ", master.lease_ms = ", lease),
        [heartbeat = heartbeat, lease = lease](JobConfig& c) {
          c.master.heartbeat_ms = heartbeat;
          c.master.lease_ms = lease;
        });
  }

  for (const auto& [low, high] : {std::pair<int64_t, int64_t>{0, 1}, {10000, 10000}}) {
    add(absl::StrCat("autoscale.min_workers = ", low, ", autoscale.max_workers = ", high),
        [low = low, high = high](JobConfig& c) {
          c.autoscale.min_workers = low;
          c.autoscale.max_workers = high;
        });
  }
  for (const auto& [down, up] : {std::pair<int64_t, int64_t>{0, 1}, {1'000'000, 1'000'000}}) {
    add(absl::StrCat("autoscale.scale_down_free_gpus = ", down,
                     ", autoscale.scale_up_free_gpus = ", up),
        [down = down, up = up](JobConfig& c) {
          c.autoscale.scale_down_free_gpus = down;
          c.autoscale.scale_up_free_gpus = up;
        });
  }

  // Doubles.
  for (double v : {0.0, std::nextafter(1.0, 2.0), 1e6}) {
    add(absl::StrCat("job.divergence_factor = ", ExactText(v)),
        [v](JobConfig& c) { c.job.divergence_factor = v; });
  }
  for (const char* initializer : {"normal", "uniform"}) {
    for (double v : {0.0, 1e6}) {
      add(absl::StrCat("model.initializer = ", initializer, ", model.init_scale = ", v),
          [initializer, v](JobConfig& c) {
            c.model.initializer = initializer;
            c.model.init_scale = v;
          });
    }
  }
  // The [optimizer] settings travel as floats: the float extremes, and the
  // largest float below 1. Each also for one table only (lr's tables are
  // lr.w and lr.dense), written as the shortest text that reads back as it.
  const double below_one = std::nextafter(1.0f, 0.0f);
  const double float_max = FLT_MAX;
  const double float_min = FLT_TRUE_MIN;
  struct OptimizerBound {
    const char* key;
    double JobConfig::Optimizer::*member;
    double min;
    double max;
  };
  const OptimizerBound optimizer_bounds[] = {
      {"learning_rate", &JobConfig::Optimizer::learning_rate, float_min, float_max},
      {"initial_accumulator", &JobConfig::Optimizer::initial_accumulator, 0, float_max},
      {"epsilon", &JobConfig::Optimizer::epsilon, float_min, float_max},
      {"l2", &JobConfig::Optimizer::l2, 0, float_max},
      {"beta1", &JobConfig::Optimizer::beta1, 0, below_one},
      {"beta2", &JobConfig::Optimizer::beta2, 0, below_one},
      {"ftrl_beta", &JobConfig::Optimizer::ftrl_beta, 0, float_max},
      {"l1", &JobConfig::Optimizer::l1, 0, float_max},
      {"clip", &JobConfig::Optimizer::clip, 0, float_max},
  };
  for (const OptimizerBound& bound : optimizer_bounds) {
    for (double v : {bound.min, bound.max}) {
      add(absl::StrCat("optimizer.", bound.key, " = ", ExactText(v)),
          [member = bound.member, v](JobConfig& c) { c.optimizer.*member = v; });
      const std::string per_table = absl::StrCat("lr.w:", bound.key, "=", ExactText(v));
      add("optimizer.per_table = " + per_table,
          [per_table](JobConfig& c) { c.optimizer.per_table = per_table; });
    }
  }
  return cases;
}

}  // namespace eps::testing

#endif  // EPS_TESTS_TESTING_JOB_CONFIG_BOUNDARIES_H_
