// EvalCheck: the master's check of an evaluation commit against the model.
//
// A worker's evaluation commit carries a label and a prediction per valid
// record of its range. EvalCheck reads that range of the data file with
// the worker's parser and holds the commit to it: the same lines, the same
// malformed count, every label the file's; and for a random sample of
// `sample` records it recomputes the prediction with the job's model (on
// the CPU) from the parameters `ParamSource` gives (in the master: pulled
// from the servers, which the evaluation no longer changes) and compares.
// A worker key alone can thereby not make the job's metrics: labels copied
// into predictions, or predictions nudged toward them, fail the sample
// (with 4 of a batch of 512 records, a commit that changed a quarter of its
// predictions escapes with probability 0.32, two such commits 0.1, and a
// worker is fenced at its first failure).
//
// Tolerance: a recomputed prediction may differ by kEvalCheckTolerance
// (a CUDA worker's sums run in another order); a model that moved a
// prediction by less moves the AUC by next to nothing.
//
// Cost: the range is read and parsed once more (~1 us a record), and the
// sample's rows are pulled per commit (the caller's ParamSource may keep
// the dense tensors: the master does for a membership generation).
//
// Thread-safety: one thread at a time (the master's RPC handler).

#ifndef EPS_MASTER_TRUST_EVAL_CHECK_H_
#define EPS_MASTER_TRUST_EVAL_CHECK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "core/job_config.h"
#include "core/status.h"
#include "models/batch.h"
#include "models/model.h"
#include "proto/eps.pb.h"
#include "worker/record_parser.h"

namespace eps {

inline constexpr float kEvalCheckTolerance = 1e-3f;

class EvalCheck {
 public:
  // Fills the parameters a forward pass over `batch` reads (Model::params()
  // order): each embedding table's rows of batch.keys, each dense tensor
  // whole. kUnavailable when they cannot be had now. `params` are the same
  // buffers from check to check, as the source left them: a source may
  // keep the dense tensors it filled before instead of filling them again.
  using ParamSource = std::function<Status(const Batch& batch, ParamBuffers* params)>;

  // The model and parser of `job`; `sample` records checked per commit
  // (master.eval_check_records), from random numbers seeded with `seed`.
  static StatusOr<std::unique_ptr<EvalCheck>> Create(const JobConfig& job, int sample,
                                                     uint64_t seed);

  const std::vector<ParamSpec>& params() const { return model_->params(); }

  // Checks `commit` (EVAL) of the file `path`, whose range starts at line
  // `first_line`, with its `labels` and `predictions`, at time `now`:
  //   kPermissionDenied: the commit does not match the file (lines,
  //     malformed, a label) or a sampled prediction differs from the
  //     model's; the message names the record (file:line) and both values.
  //   kUnavailable with reason SLOW_DOWN: a passing read error, or
  //     `source` failed: nothing was decided (the worker sends it again).
  //   kFailedPrecondition: the range can never be read (the file is gone,
  //     unreadable, or shorter than the scan saw), or its read has failed
  //     for over half of master.progress_timeout_s (before the waiting
  //     worker would be fenced as hung); the message names the
  //     file and what to do. No evaluation of it can be checked (the master
  //     stops the job). data.on_unreadable = skip does not apply: the
  //     worker read the range, so the data is there and the fault is the
  //     master's view of it; skipping would drop evaluated records.
  Status Check(const std::string& path, uint64_t first_line,
               const proto::CommitProgressRequest& commit, std::span<const float> labels,
               std::span<const float> predictions, const ParamSource& source, absl::Time now);

 private:
  EvalCheck(std::unique_ptr<Model> model, RecordParser parser, int sample, uint64_t seed,
            absl::Duration read_patience)
      : model_(std::move(model)),
        parser_(std::move(parser)),
        sample_(sample),
        random_(seed),
        read_patience_(read_patience) {}

  // The answer to a read of `path` from `begin` that failed with `status`.
  Status Unreadable(const std::string& path, uint64_t begin, const Status& status,
                    absl::Time now);

  std::unique_ptr<Model> model_;
  RecordParser parser_;
  const int sample_;
  std::mt19937_64 random_;
  ParamBuffers params_;  // given to the ParamSource, kept between checks
  const absl::Duration read_patience_;
  // Ranges (path, first byte) whose reads have failed with passing errors,
  // and since when; a range that reads again leaves.
  std::map<std::pair<std::string, uint64_t>, absl::Time> failing_since_;
};

}  // namespace eps

#endif  // EPS_MASTER_TRUST_EVAL_CHECK_H_
