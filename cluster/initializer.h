// Deterministic row initialisation.
//
// A new row's weights depend only on (initializer spec, job seed, table id,
// key, element index), never on which server creates the row or when: a
// row re-created after a move or a restart starts the same.
//
// Thread-safety: pure function, safe for concurrent use.

#ifndef EPS_CLUSTER_INITIALIZER_H_
#define EPS_CLUSTER_INITIALIZER_H_

#include <cstdint>

#include "proto/eps.pb.h"

namespace eps {

// Writes `dim` initial weights of row `key` of table `table_id` into `out`.
//   ZEROS:   0
//   NORMAL:  Normal(0, scale^2), resampled beyond 2 scale (truncated)
//   UNIFORM: Uniform(-scale, scale)
void InitializeRow(const proto::InitializerSpec& spec, uint64_t seed, uint32_t table_id,
                   uint64_t key, float* out, int dim);

}  // namespace eps

#endif  // EPS_CLUSTER_INITIALIZER_H_
