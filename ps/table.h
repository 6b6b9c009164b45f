// Table: one embedding table or dense tensor held by a parameter server,
// in memory.
//
// Rows are keyed by the exact 64-bit key (feature id, or DenseChunkKey for
// dense chunks), created on first touch by the table's initializer, and
// updated by the table's optimizer. Storage is striped: a key's stripe is
// chosen by its hash; each stripe is an open-addressing index (key -> slot)
// over a chunked arena of fixed-size rows (weights then optimizer state),
// so there is no heap allocation per row and rows never move.
//
// Thread-safety: safe for concurrent use. Pull and Push lock each stripe
// they touch once per call, never across I/O.

#ifndef EPS_PS_TABLE_H_
#define EPS_PS_TABLE_H_

#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"
#include "proto/eps.pb.h"

namespace eps {

class Table {
 public:
  // kInvalidArgument when the spec is unusable (dim 0, unknown optimizer or
  // initializer), naming the table.
  static StatusOr<std::unique_ptr<Table>> Create(const proto::TableSpec& spec, uint64_t seed);
  virtual ~Table() = default;

  virtual const proto::TableSpec& spec() const = 0;
  uint32_t dim() const { return spec().dim(); }

  // Copies the weights of each key into out[i*dim, (i+1)*dim), creating
  // missing rows. Duplicate keys are allowed.
  // REQUIRES: out.size() == keys.size() * dim().
  virtual void Pull(std::span<const uint64_t> keys, std::span<float> out) = 0;

  // Applies grads[i*dim, (i+1)*dim) to key i with the optimizer, creating
  // missing rows first. Duplicate keys are applied one after the other.
  // REQUIRES: grads.size() == keys.size() * dim().
  virtual void Push(std::span<const uint64_t> keys, std::span<const float> grads) = 0;

  // Rows held.
  virtual uint64_t num_rows() const = 0;
  // Bytes of memory held (index and arena), for stats.
  virtual uint64_t memory_bytes() const = 0;
};

}  // namespace eps

#endif  // EPS_PS_TABLE_H_
