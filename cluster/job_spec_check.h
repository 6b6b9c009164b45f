// Job spec checks: what a role refuses in the JobSpec the master hands out.
//
// One set of checks for every role: a parameter server runs
// ValidateTableSpec on each table it creates (ps/table.cc) and
// ValidateOptimizerSpec when it builds a table's update rule
// (ps/optimizer.cc); the master runs ValidateJobSpec on the spec it builds
// and refuses to start on an error, so no server refuses what the master
// accepted. Every value a server computes from a spec that passes is
// finite: hyperparameters are finite floats, a value that must be > 0 is
// > 0 as a float, and an initializer's draws (at most 2 * scale) are
// finite floats.
//
// Thread-safety: pure functions, safe for concurrent use.

#ifndef EPS_CLUSTER_JOB_SPEC_CHECK_H_
#define EPS_CLUSTER_JOB_SPEC_CHECK_H_

#include <cstdint>

#include "core/status.h"
#include "proto/eps.pb.h"

namespace eps {

// Largest TableSpec.dim (64 MiB of weights per row).
inline constexpr uint32_t kMaxTableDim = 1u << 24;
// Largest JobSpec.num_partitions.
inline constexpr uint32_t kMaxJobPartitions = 1u << 20;

// kInvalidArgument naming the field ("initializer.scale = ...") for an
// unknown kind, or for NORMAL and UNIFORM a scale that is not in
// [0, FLT_MAX / 2] (NaN included).
Status ValidateInitializerSpec(const proto::InitializerSpec& spec);

// kInvalidArgument naming the field ("optimizer.epsilon = ...") for an
// unknown kind or a hyperparameter the kind uses outside its range:
// learning_rate > 0; l2 >= 0; clip >= 0 (0 = off); Adagrad
// initial_accumulator >= 0 and epsilon > 0; Adam beta1 and beta2 in [0, 1)
// and epsilon > 0; FTRL ftrl_beta >= 0 and l1 >= 0. Every one must be
// finite. Fields a kind does not use are not checked.
Status ValidateOptimizerSpec(const proto::OptimizerSpec& spec);

// kInvalidArgument naming the table ("table 'emb' (id 5): ...") and the
// field: dim outside [1, kMaxTableDim], a kind other than EMBEDDING or
// DENSE, a DENSE table with dense_size 0, more chunks than a dense chunk
// key holds or an id too large for one (cluster/placement.h), and the
// errors of ValidateInitializerSpec and ValidateOptimizerSpec.
Status ValidateTableSpec(const proto::TableSpec& spec);

// kInvalidArgument for num_partitions outside [1, kMaxJobPartitions], no
// tables, table ids other than 0..n-1 in order, and the errors of
// ValidateTableSpec for each table.
Status ValidateJobSpec(const proto::JobSpec& spec);

}  // namespace eps

#endif  // EPS_CLUSTER_JOB_SPEC_CHECK_H_
