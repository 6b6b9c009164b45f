// TrainSingleProcess: trains a job's model in one process, no network.
//
// The reference the distributed runs are measured against: the same
// parser, batches, model and server-side tables and optimizers as eps, fed
// the training files in order, one batch at a time, each update applied
// before the next batch is pulled (no staleness).
//
// Thread-safety: one thread.

#ifndef EPS_TESTS_TESTING_SINGLE_PROCESS_TRAINER_H_
#define EPS_TESTS_TESTING_SINGLE_PROCESS_TRAINER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/job_config.h"
#include "core/status.h"

namespace eps {

struct SingleProcessResult {
  uint64_t records_trained = 0;
  uint64_t malformed = 0;
  double train_loss = 0;  // mean over the last epoch, before each update
  double eval_auc = 0;
  double eval_logloss = 0;
  uint64_t eval_records = 0;
};

// Trains `config` (job.epochs over data.train, then evaluates on
// data.eval). Errors name the file that could not be read.
StatusOr<SingleProcessResult> TrainSingleProcess(const JobConfig& config);

// As above, for the job file `config_path` with --section.key=value
// `overrides`, read as the binaries read them (kInvalidArgument naming a
// bad option).
StatusOr<SingleProcessResult> TrainSingleProcess(const std::string& config_path,
                                                 const std::vector<std::string>& overrides);

}  // namespace eps

#endif  // EPS_TESTS_TESTING_SINGLE_PROCESS_TRAINER_H_
