// Reading a model export (docs/model-format.md): what a server's warm start
// (ServerStorage::Import) and eps-predict (worker/predictor.h) share. The
// master writes exports (master/model_export.h).
//
// Thread-safety: pure functions of the files; safe for concurrent use.

#ifndef EPS_CLUSTER_MODEL_FORMAT_H_
#define EPS_CLUSTER_MODEL_FORMAT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"
#include "nlohmann/json.hpp"

namespace eps {

// manifest.json's "format", and the version readers of this build know:
// they refuse a newer one.
inline constexpr char kModelFormat[] = "eps-model";
inline constexpr int kModelFormatVersion = 1;

// DIR/manifest.json. kNotFound naming it when it is missing (not an
// export, or one that did not finish); kFailedPrecondition for another
// format or a version this build does not know; kDataLoss when it is not
// JSON or has no "params".
StatusOr<nlohmann::json> ReadModelManifest(const std::string& dir);

// The manifest's entry of parameter `name`, or null.
const nlohmann::json* FindModelParam(const nlohmann::json& manifest, const std::string& name);

// Reads every part of parameter `param` (a manifest entry) under `dir`, in
// pieces of at most 4,096 rows: visit(ids, rows, n, stride) gets n ids
// (feature ids, or a dense tensor's chunk indices) and their rows of
// `stride` floats each (weights first, then the optimizer state). Stops at
// visit's first error. kNotFound naming a missing part; kDataLoss naming a
// part that is not ids and rows of at least `min_floats` floats, or when
// the manifest entry has the wrong shape.
using ModelRowsVisitor =
    std::function<Status(const uint64_t* ids, const float* rows, uint64_t n, uint64_t stride)>;
Status ReadModelParam(const std::string& dir, const nlohmann::json& param, uint64_t min_floats,
                      const ModelRowsVisitor& visit);

}  // namespace eps

#endif  // EPS_CLUSTER_MODEL_FORMAT_H_
