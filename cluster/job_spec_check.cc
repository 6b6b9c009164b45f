#include "cluster/job_spec_check.h"

#include <cfloat>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "cluster/placement.h"

namespace eps {
namespace {

// The values a float field accepts. Comparisons are written so that NaN
// fails them.
enum class Range { kPositive, kNonNegative, kUnitInterval };

Status CheckField(absl::string_view field, float value, Range range) {
  absl::string_view requirement;
  switch (range) {
    case Range::kPositive:
      if (!(value > 0) || !std::isfinite(value)) requirement = "must be finite and > 0";
      break;
    case Range::kNonNegative:
      if (!(value >= 0) || !std::isfinite(value)) requirement = "must be finite and >= 0";
      break;
    case Range::kUnitInterval:
      if (!(value >= 0 && value < 1)) requirement = "must be in [0, 1)";
      break;
  }
  if (requirement.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, ": ", requirement));
}

}  // namespace

Status ValidateInitializerSpec(const proto::InitializerSpec& spec) {
  switch (spec.kind()) {
    case proto::InitializerSpec::ZEROS:
      return absl::OkStatus();
    case proto::InitializerSpec::NORMAL:
    case proto::InitializerSpec::UNIFORM:
      // A truncated normal draw reaches 2 * scale.
      if (!(spec.scale() >= 0 && spec.scale() <= FLT_MAX / 2)) {
        return absl::InvalidArgumentError(absl::StrCat("initializer.scale = ", spec.scale(),
                                                       ": must be in [0, ", FLT_MAX / 2, "]"));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat("initializer.kind: unknown initializer kind ",
                                                     static_cast<int>(spec.kind())));
  }
}

Status ValidateOptimizerSpec(const proto::OptimizerSpec& spec) {
  RETURN_IF_ERROR(CheckField("optimizer.learning_rate", spec.learning_rate(), Range::kPositive));
  RETURN_IF_ERROR(CheckField("optimizer.l2", spec.l2(), Range::kNonNegative));
  RETURN_IF_ERROR(CheckField("optimizer.clip", spec.clip(), Range::kNonNegative));
  switch (spec.kind()) {
    case proto::OptimizerSpec::SGD:
      return absl::OkStatus();
    case proto::OptimizerSpec::ADAGRAD:
      RETURN_IF_ERROR(CheckField("optimizer.initial_accumulator", spec.initial_accumulator(),
                                 Range::kNonNegative));
      return CheckField("optimizer.epsilon", spec.epsilon(), Range::kPositive);
    case proto::OptimizerSpec::ADAM:
      RETURN_IF_ERROR(CheckField("optimizer.beta1", spec.beta1(), Range::kUnitInterval));
      RETURN_IF_ERROR(CheckField("optimizer.beta2", spec.beta2(), Range::kUnitInterval));
      return CheckField("optimizer.epsilon", spec.epsilon(), Range::kPositive);
    case proto::OptimizerSpec::FTRL:
      RETURN_IF_ERROR(CheckField("optimizer.ftrl_beta", spec.ftrl_beta(), Range::kNonNegative));
      return CheckField("optimizer.l1", spec.l1(), Range::kNonNegative);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer.kind: unknown optimizer kind ", static_cast<int>(spec.kind())));
  }
}

Status ValidateTableSpec(const proto::TableSpec& spec) {
  const std::string name = absl::StrCat("table '", spec.name(), "' (id ", spec.id(), ")");
  if (spec.dim() == 0 || spec.dim() > kMaxTableDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": dim = ", spec.dim(), ": must be in [1, ", kMaxTableDim, "]"));
  }
  switch (spec.kind()) {
    case proto::EMBEDDING:
      if (spec.global_batch() > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": a global batch applies to dense tables only"));
      }
      break;
    case proto::DENSE: {
      // Chunk keys hold the table id above kDenseChunkBits bits of chunk index.
      constexpr uint64_t kMaxChunks = uint64_t{1} << kDenseChunkBits;
      if (spec.id() >= (uint64_t{1} << (64 - kDenseChunkBits))) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": a dense table's id must be < 2^", 64 - kDenseChunkBits));
      }
      // Without DenseChunkCount's rounding up, which could wrap.
      const uint64_t chunks =
          spec.dense_size() / spec.dim() + (spec.dense_size() % spec.dim() != 0 ? 1 : 0);
      if (spec.dense_size() == 0 || chunks > kMaxChunks) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": dense_size = ", spec.dense_size(),
                                                       ": must be in [1, dim * 2^", kDenseChunkBits,
                                                       "]"));
      }
      if (spec.admission_min_count() > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": admission applies to embedding tables only"));
      }
      if (spec.ttl_passes() > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": expiry (ttl_passes) applies to embedding tables only"));
      }
      if (spec.global_batch() > (uint64_t{1} << 30)) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": global_batch = ", spec.global_batch(), ": must be in [0, 2^30]"));
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": kind: unknown table kind ", static_cast<int>(spec.kind())));
  }
  RETURN_IF_ERROR_CTX(ValidateInitializerSpec(spec.initializer()), name);
  RETURN_IF_ERROR_CTX(ValidateOptimizerSpec(spec.optimizer()), name);
  return absl::OkStatus();
}

Status ValidateJobSpec(const proto::JobSpec& spec) {
  if (spec.num_partitions() == 0 || spec.num_partitions() > kMaxJobPartitions) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: num_partitions = ", spec.num_partitions(), ": must be in [1, ",
                     kMaxJobPartitions, "]"));
  }
  if (spec.tables_size() == 0) return absl::InvalidArgumentError("job spec: no tables");
  for (int i = 0; i < spec.tables_size(); ++i) {
    const proto::TableSpec& table = spec.tables(i);
    if (table.id() != static_cast<uint32_t>(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("job spec: the table ids must be 0..n-1; table '", table.name(), "' has id ",
                       table.id()));
    }
    RETURN_IF_ERROR(ValidateTableSpec(table));
  }
  return absl::OkStatus();
}

}  // namespace eps
