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

// An export is trusted no further than its directory: every file a reader
// opens is a regular file inside DIR, checked with stat before it is
// opened (a FIFO never blocks a reader), and each part is read with the
// size checks of NpyReader::Open. Every error is one line naming the file.

// DIR/manifest.json. kNotFound naming it when it is missing (not an
// export, or one that did not finish); kDataLoss naming it when it is not
// a regular file (a directory, a FIFO), is larger than 64 MiB, is not JSON
// or has no "params"; kFailedPrecondition for another format or a version
// this build does not know.
StatusOr<nlohmann::json> ReadModelManifest(const std::string& dir);

// Checks that `path`, a file of the export in `dir`, is a regular file
// whose real path (links resolved) lies inside dir's. Only stats the file:
// never opens it. kNotFound naming a missing file; kDataLoss naming it when
// it is not a regular file or resolves outside `dir`; kUnavailable when it
// cannot be resolved.
Status CheckModelFile(const std::string& dir, const std::string& path);

// The file stem DIR/PART of `part`, an entry of a parameter's "parts":
// PART must be a relative path of plain names ("params/emb/part-0": none
// empty, "." or "..", no leading '/'), and both of its files
// (STEM.keys.npy, STEM.rows.npy) must pass CheckModelFile. kDataLoss
// naming the manifest and the part, or the file; kNotFound naming a
// missing file. What eps-predict and a warm start (ReadModelParam) check,
// and what a master checks an export with before servers load it.
StatusOr<std::string> ModelPartStem(const std::string& dir, const std::string& part);

// The manifest's entry of parameter `name`, or null.
const nlohmann::json* FindModelParam(const nlohmann::json& manifest, const std::string& name);

// Checks the export in `dir` as a warm start reads it, without reading a
// row: the manifest as ReadModelManifest; every parameter an object with a
// string "name", a string "kind" and a "dim" of at least 1; each of its
// parts as ModelPartStem; and each part's files opened as NpyReader::Open
// does (every size its header claims against the file's size), ids "<u8"
// of shape (n) and rows "<f4" of shape (n, d) with d at least "dim".
// Reads the manifest and each part's header only, so it is quick on an
// export of any size. Not its business: the values (NaN weights) and
// whether the parameters fit a job's model (the servers check both as
// they load). The master calls it before any server loads a warm start.
// Errors as ReadModelManifest's and ReadModelParam's, each one line
// naming the file: kNotFound, kDataLoss, kFailedPrecondition;
// kUnavailable for a read error.
Status ValidateModelExport(const std::string& dir);

// Reads every part of parameter `param` (a manifest entry) under `dir`, in
// pieces of at most 4,096 rows (fewer for rows over 16 KiB, so a piece is
// about 64 MiB at most): visit(ids, rows, n, stride) gets n ids
// (feature ids, or a dense tensor's chunk indices) and their rows of
// `stride` floats each (weights first, then the optimizer state). Stops at
// visit's first error. Each part passes ModelPartStem before it is opened.
// kNotFound naming a missing part; kDataLoss naming a part path or file
// ModelPartStem refuses, a part whose header claims more than its file
// holds, or one that is not ids and rows of at least `min_floats` floats,
// or when the manifest entry has the wrong shape.
using ModelRowsVisitor =
    std::function<Status(const uint64_t* ids, const float* rows, uint64_t n, uint64_t stride)>;
Status ReadModelParam(const std::string& dir, const nlohmann::json& param, uint64_t min_floats,
                      const ModelRowsVisitor& visit);

}  // namespace eps

#endif  // EPS_CLUSTER_MODEL_FORMAT_H_
