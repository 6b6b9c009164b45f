// Offline scoring with a model export (docs/model-format.md): eps-predict.
//
// ExportedModel loads an export's parameters into memory: each embedding
// table as an id -> row index, each dense tensor whole. Ids the export
// lacks read as the table's initializer makes them (cluster/initializer.h),
// exactly as a server would have created them for a worker, and are
// counted. Predict reads text records with the worker's parser and runs
// the worker's model code (CPU, or CUDA) over them in batches, in the order
// of the files (sorted, as the master orders a data set) and of their
// lines: one prediction per record, and the AUC and log loss of the
// records' labels.
//
// Memory: the whole model (weights only, no optimizer state) plus one
// batch.
//
// Thread-safety: ExportedModel is immutable once loaded; Predict uses one
// thread (and the model code's own).

#ifndef EPS_WORKER_PREDICTOR_H_
#define EPS_WORKER_PREDICTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/job_config.h"
#include "core/status.h"
#include "models/batch.h"
#include "models/model.h"
#include "nlohmann/json.hpp"
#include "proto/eps.pb.h"

namespace eps {

class ExportedModel {
 public:
  // Loads the export in `dir` for a model with `params` (Model::params()
  // of the export's model options). kNotFound naming the file when
  // manifest.json or a part is missing (an export not finished);
  // kFailedPrecondition for another format or a newer major version;
  // kDataLoss naming the file for parts that do not fit the manifest, and
  // for a manifest or part that the checks of cluster/model_format.h
  // refuse (not a regular file, outside `dir`, a header that lies);
  // kInvalidArgument when a parameter of the model is not in the export.
  static StatusOr<std::unique_ptr<ExportedModel>> Load(const std::string& dir,
                                                       const std::vector<ParamSpec>& params);

  // Fills the buffers a step over `batch` reads (Model::ForwardBackward):
  // each embedding table's rows of batch.keys, and each dense tensor whole
  // (only when its buffer is empty: reuse `buffers` across batches). Adds
  // the ids the export lacks to *unseen.
  void FillParams(const Batch& batch, ParamBuffers* buffers, uint64_t* unseen) const;
  const nlohmann::json& manifest() const { return manifest_; }

 private:
  struct Param {
    ParamSpec spec;
    proto::TableSpec table;
    // Embedding: id -> row of `values` (dim floats each). Dense: the
    // tensor in `values`.
    absl::flat_hash_map<uint64_t, uint32_t> index;
    std::vector<float> values;
  };
  ExportedModel() = default;
  // Load, letting nlohmann::json's exceptions out.
  static StatusOr<std::unique_ptr<ExportedModel>> LoadUnchecked(
      const std::string& dir, const std::vector<ParamSpec>& params);
  static Status LoadParam(const std::string& dir, const nlohmann::json& entry, uint64_t seed,
                          Param* param);

  nlohmann::json manifest_;
  uint64_t seed_ = 0;
  std::vector<Param> params_;
};

struct PredictOptions {
  std::string model_dir;
  // Files, globs or directories, comma-separated (as data.eval).
  std::string data;
  // Where predictions go, one per line; empty: nowhere (metrics only).
  std::string out;
  // auto, cpu or cuda.
  std::string device = "auto";
  // Records per batch; 0: the job's worker.batch_size.
  int64_t batch_size = 0;
};

struct PredictResult {
  uint64_t records = 0;
  uint64_t malformed = 0;  // lines skipped, as the worker skips them
  uint64_t ids = 0;        // ids looked up, once per batch
  uint64_t unseen = 0;     // of those, ids the export lacks
  double auc = 0;
  double log_loss = 0;
  std::string device;
};

// Called every few seconds with (bytes read, total bytes).
using PredictProgress = std::function<void(uint64_t, uint64_t)>;

// Scores `options.data` with the export; `job` is the export's job.ini
// (with any overrides). kInvalidArgument for bad options or data paths;
// ExportedModel::Load's errors; kDataLoss naming the export and the first
// record (its index) whose prediction is NaN or infinite, stopping there
// (--out then holds the batches before it); kUnavailable naming a file
// that cannot be read or written.
StatusOr<PredictResult> Predict(const PredictOptions& options, const JobConfig& job,
                                const PredictProgress& progress);

}  // namespace eps

#endif  // EPS_WORKER_PREDICTOR_H_
