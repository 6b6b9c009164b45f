// BuildJobSpec: the job description the master hands to every server and
// worker: partitions and the parameter tables of the configured model.
//
// Thread-safety: pure function.

#ifndef EPS_MASTER_JOB_SPEC_H_
#define EPS_MASTER_JOB_SPEC_H_

#include "core/job_config.h"
#include "core/status.h"
#include "proto/eps.pb.h"

namespace eps {

// One table per model parameter (in the model's order, ids 0..n-1):
// embeddings with the configured initializer (model.initializer, "auto"
// taking the model's choice) and dense tensors chunked by
// ps.dense_chunk_floats with the model's initializer; MLP layers
// (ParamSpec::mlp_layer) use the [optimizer] section with optimizer.mlp
// applied (JobConfig::MlpOptimizer), every other table the section, and a
// table's optimizer.per_table entry applies over those where it has one. kInvalidArgument when the model config or optimizer.per_table is
// invalid, when optimizer.per_table names a table the model lacks (the
// message lists the model's tables), or when the spec is one a server would
// refuse (ValidateJobSpec, cluster/job_spec_check.h: e.g. a hyperparameter
// that is 0 or inf as a float, for a config that skipped
// JobConfig::Validate).
StatusOr<proto::JobSpec> BuildJobSpec(const JobConfig& config);

}  // namespace eps

#endif  // EPS_MASTER_JOB_SPEC_H_
