#include "cluster/model_format.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "core/npy.h"

namespace eps {

namespace {

// The largest manifest a reader takes: a few hundred bytes per part, so
// room for a hundred thousand parts.
constexpr size_t kMaxManifestBytes = size_t{64} << 20;
// A piece of a part read at once: at most 4,096 rows and, for long rows,
// not much more than this many bytes.
constexpr uint64_t kRowsPerRead = 4096;
constexpr uint64_t kBytesPerRead = uint64_t{64} << 20;

// kNotFound naming a missing `path`; kDataLoss naming it when it is not a
// regular file (links followed). Only stats it: a FIFO is never opened.
Status CheckRegularFile(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return absl::NotFoundError(absl::StrCat("no ", path));
    return absl::UnavailableError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode)) {
    const char* what = S_ISDIR(info.st_mode)    ? "a directory"
                       : S_ISFIFO(info.st_mode) ? "a FIFO"
                                                : "a special file";
    return absl::DataLossError(
        absl::StrCat(path, " is ", what, ", not a file of a model export"));
  }
  return absl::OkStatus();
}

// The name of manifest entry `param` for messages: "?" when it has none
// (json::value would throw on a name that is not a string).
std::string ParamName(const nlohmann::json& param) {
  return param.is_object() && param.contains("name") && param["name"].is_string()
             ? param["name"].get<std::string>()
             : std::string("?");
}

// The "parts" of manifest entry `param`; kDataLoss naming the manifest
// when it has none.
StatusOr<const nlohmann::json*> PartsOf(const std::string& dir, const nlohmann::json& param) {
  if (!param.is_object() || !param.contains("parts") || !param["parts"].is_array()) {
    return absl::DataLossError(
        absl::StrCat(dir, "/manifest.json: parameter ", ParamName(param), " has no parts"));
  }
  return &param["parts"];
}

// One part of a parameter, its headers read.
struct OpenedPart {
  std::string stem;
  std::unique_ptr<NpyReader> keys;
  std::unique_ptr<NpyReader> rows;
};

// Opens `part` (an entry of `param`'s "parts") under `dir`: the path as
// ModelPartStem checks it, both files as NpyReader::Open reads their
// headers (every size against the file's), which must hold ids "<u8" of
// shape (n) and rows "<f4" of shape (n, d), d >= min_floats. Reads no
// row. Errors as ReadModelParam's, naming the manifest or the file.
Status OpenModelPart(const std::string& dir, const nlohmann::json& param,
                     const nlohmann::json& part, uint64_t min_floats, OpenedPart* opened) {
  if (!part.is_string()) {
    return absl::DataLossError(
        absl::StrCat(dir, "/manifest.json: a part of ", ParamName(param), " is not a path"));
  }
  ASSIGN_OR_RETURN(opened->stem, ModelPartStem(dir, part.get<std::string>()));
  ASSIGN_OR_RETURN(opened->keys, NpyReader::Open(opened->stem + ".keys.npy"));
  ASSIGN_OR_RETURN(opened->rows, NpyReader::Open(opened->stem + ".rows.npy"));
  const NpyReader& keys = *opened->keys;
  const NpyReader& rows = *opened->rows;
  if (keys.descr() != "<u8" || keys.shape().size() != 1 || rows.descr() != "<f4" ||
      rows.shape().size() != 2 || rows.rows() != keys.rows() || rows.row_size() < min_floats) {
    return absl::DataLossError(absl::StrCat(opened->stem,
                                            ".{keys,rows}.npy do not hold the ids and rows of at "
                                            "least ",
                                            min_floats, " floats of ", ParamName(param)));
  }
  return absl::OkStatus();
}

}  // namespace

Status CheckModelFile(const std::string& dir, const std::string& path) {
  RETURN_IF_ERROR(CheckRegularFile(path));
  std::error_code error;
  const std::filesystem::path root = std::filesystem::canonical(dir, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", dir, ": ", error.message()));
  }
  const std::filesystem::path real = std::filesystem::canonical(path, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", path, ": ", error.message()));
  }
  // Component by component: /a/bc is not inside /a/b.
  const auto [in_root, in_real] = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
  if (in_root != root.end() || in_real == real.end()) {
    return absl::DataLossError(absl::StrCat(path, " resolves to ", real.string(),
                                            ", outside the export ", root.string()));
  }
  return absl::OkStatus();
}

StatusOr<std::string> ModelPartStem(const std::string& dir, const std::string& part) {
  const auto refuse = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(dir, "/manifest.json: part '", absl::CHexEscape(part),
                                            "' ", why));
  };
  if (part.empty()) return refuse("is empty");
  if (part.front() == '/') return refuse("is an absolute path; parts lie inside the export");
  if (part.find('\0') != std::string::npos) return refuse("holds a NUL byte");
  for (absl::string_view name : absl::StrSplit(part, '/')) {
    if (name == "..") return refuse("holds '..'; parts lie inside the export");
    if (name.empty() || name == ".") return refuse("is not a plain relative path");
  }
  const std::string stem = (std::filesystem::path(dir) / part).string();
  RETURN_IF_ERROR(CheckModelFile(dir, stem + ".keys.npy"));
  RETURN_IF_ERROR(CheckModelFile(dir, stem + ".rows.npy"));
  return stem;
}

StatusOr<nlohmann::json> ReadModelManifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "manifest.json").string();
  if (Status regular = CheckRegularFile(path); !regular.ok()) {
    if (!absl::IsNotFound(regular)) return regular;
    return absl::NotFoundError(
        absl::StrCat("no ", path, ": not a model export, or one that did not finish"));
  }
  StatusOr<std::string> text = ReadSmallFile(path, kMaxManifestBytes);
  if (absl::IsInvalidArgument(text.status())) {
    return absl::DataLossError(text.status().message());
  }
  if (!text.ok()) return text.status();
  nlohmann::json manifest = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return absl::DataLossError(absl::StrCat(path, " is not JSON"));
  }
  const nlohmann::json& format = manifest["format"];
  if (!format.is_string() || format.get<std::string>() != kModelFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not the manifest of an eps model export"));
  }
  const nlohmann::json& version = manifest["version"];
  if (!version.is_number_integer() || version.get<int>() < 1 ||
      version.get<int>() > kModelFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is format version ", version.dump(),
                                                      "; this eps reads version ",
                                                      kModelFormatVersion));
  }
  if (!manifest["params"].is_array()) {
    return absl::DataLossError(absl::StrCat(path, " lists no params"));
  }
  return manifest;
}

const nlohmann::json* FindModelParam(const nlohmann::json& manifest, const std::string& name) {
  for (const nlohmann::json& param : manifest.at("params")) {
    if (param.is_object() && ParamName(param) == name) return &param;
  }
  return nullptr;
}

Status ValidateModelExport(const std::string& dir) {
  ASSIGN_OR_RETURN(const nlohmann::json manifest, ReadModelManifest(dir));
  for (const nlohmann::json& param : manifest.at("params")) {
    // What a reader of the entry (ServerStorage::Import, eps-predict) takes
    // for granted: json::value throws on a field of another type.
    if (ParamName(param) == "?" || !param.contains("kind") || !param["kind"].is_string() ||
        !param.contains("dim") || !param["dim"].is_number_unsigned() ||
        param["dim"].get<uint64_t>() == 0 ||
        (param.contains("size") && !param["size"].is_number_unsigned())) {
      return absl::DataLossError(absl::StrCat(
          dir, "/manifest.json: parameter ", ParamName(param),
          " is not an object with a string name and kind, a dim of at least 1 and a size"));
    }
    ASSIGN_OR_RETURN(const nlohmann::json* parts, PartsOf(dir, param));
    for (const nlohmann::json& part : *parts) {
      OpenedPart opened;
      RETURN_IF_ERROR(OpenModelPart(dir, param, part, param["dim"].get<uint64_t>(), &opened));
    }
  }
  return absl::OkStatus();
}

Status ReadModelParam(const std::string& dir, const nlohmann::json& param, uint64_t min_floats,
                      const ModelRowsVisitor& visit) {
  ASSIGN_OR_RETURN(const nlohmann::json* parts, PartsOf(dir, param));
  std::vector<char> key_bytes;
  std::vector<char> row_bytes;
  for (const nlohmann::json& part : *parts) {
    OpenedPart opened;
    RETURN_IF_ERROR(OpenModelPart(dir, param, part, min_floats, &opened));
    const std::string& stem = opened.stem;
    NpyReader& keys = *opened.keys;
    NpyReader& rows = *opened.rows;
    // NpyReader::Open checked the files hold what their headers claim; long
    // rows are still read a few at a time.
    const uint64_t rows_per_read =
        std::clamp<uint64_t>(kBytesPerRead / std::max<uint64_t>(rows.row_bytes(), 1), 1,
                             kRowsPerRead);
    while (true) {
      ASSIGN_OR_RETURN(uint64_t n, keys.Read(rows_per_read, &key_bytes));
      ASSIGN_OR_RETURN(uint64_t m, rows.Read(rows_per_read, &row_bytes));
      if (n == 0) break;
      if (m != n) return absl::DataLossError(absl::StrCat(stem, ".rows.npy ends early"));
      RETURN_IF_ERROR(visit(reinterpret_cast<const uint64_t*>(key_bytes.data()),
                            reinterpret_cast<const float*>(row_bytes.data()), n,
                            rows.row_size()));
    }
  }
  return absl::OkStatus();
}

}  // namespace eps
