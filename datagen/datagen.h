// GenerateDataset: eps-datagen's library, writing a Criteo-format data set
// drawn from a PlantedModel together with the model's best reachable
// metrics.
//
// Output layout under DatagenOptions::out_dir:
//   train/part-00000.txt .. part-(files-1).txt   the training rows, split
//                                                evenly in row order
//   eval/part-00000.txt                          the eval rows
//   truth.json                                   optimal AUC and log loss of
//                                                the planted model on the
//                                                eval rows, and its parameters
//
// The bytes written depend only on (rows, seed, eval_rows): not on the
// thread count, and the training parts concatenate to the same bytes for
// any number of files. Every file is written as NAME.tmp and renamed when
// complete; part files left by an earlier run with more files are removed.
//
// Thread-safety: GenerateDataset may be called concurrently for different
// out_dirs; it runs its own worker threads and joins them before returning.

#ifndef EPS_DATAGEN_DATAGEN_H_
#define EPS_DATAGEN_DATAGEN_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "core/status.h"
#include "datagen/planted_model.h"

namespace eps::datagen {

struct DatagenOptions {
  // --rows: number of training rows. Required; no default (0 is rejected).
  int64_t rows = 0;
  // --out: the output directory, created (with parents) when missing.
  // Required.
  std::string out_dir;
  // --seed: selects the planted model and the rows. Default 1.
  uint64_t seed = 1;
  // --files: number of training part files (1..min(rows, 100000)). Default 1.
  int64_t files = 1;
  // --eval-rows: number of eval rows (1..200M; their predictions are kept
  // in memory for the AUC). Unset: max(1000, rows / 10).
  std::optional<int64_t> eval_rows;
  // --threads: generator threads (0..1024); 0 means the hardware
  // concurrency. Does not change the output. Default 0.
  int threads = 0;
  // Rows per unit of work (a thread formats a chunk into one buffer).
  // Does not change the output. Default 16384.
  int64_t chunk_rows = 16384;
  // Minimum time between progress callbacks, in milliseconds. Default 1000.
  int64_t progress_interval_ms = 1000;
  // The planted model's shape (not a command-line flag).
  PlantedModelOptions model;

  // kInvalidArgument, naming the flag, for a value out of range (e.g.
  // "--rows must be >= 1 (got 0)").
  Status Validate() const;

  // The eval row count and thread count after defaults.
  int64_t EffectiveEvalRows() const;
  int EffectiveThreads() const;
};

// Reported while rows are written (from the calling thread).
struct DatagenProgress {
  int64_t rows_written = 0;  // training and eval rows written so far
  int64_t rows_total = 0;    // training plus eval rows
  double elapsed_s = 0;      // since generation started
};

struct DatagenResult {
  int64_t train_rows = 0;
  int64_t eval_rows = 0;
  int threads = 0;            // generator threads used
  int64_t bytes_written = 0;  // data files only
  double elapsed_s = 0;       // wall time of the whole run
  double optimal_auc = 0;     // planted model on the eval rows
  double optimal_logloss = 0;
  double positive_rate_train = 0;
  double positive_rate_eval = 0;
  std::string truth_path;  // out_dir/truth.json
};

using ProgressCallback = std::function<void(const DatagenProgress&)>;

// Writes the data set described by `options` (see the file comment). Blocks
// until done. `progress`, when set, is called from the calling thread at
// most every progress_interval_ms while data is written.
// Errors: kInvalidArgument when options do not validate; otherwise the
// errno-derived code (e.g. kPermissionDenied, kNotFound, kResourceExhausted)
// with a message naming the path that could not be created or written.
// Files already renamed into place stay on failure; .tmp files are removed.
StatusOr<DatagenResult> GenerateDataset(const DatagenOptions& options,
                                        const ProgressCallback& progress = nullptr);

}  // namespace eps::datagen

#endif  // EPS_DATAGEN_DATAGEN_H_
