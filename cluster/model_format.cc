#include "cluster/model_format.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/npy.h"

namespace eps {

StatusOr<nlohmann::json> ReadModelManifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "manifest.json").string();
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("no ", path, ": not a model export, or one that did not finish"));
  }
  nlohmann::json manifest = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
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
    if (param.is_object() && param.value("name", "") == name) return &param;
  }
  return nullptr;
}

Status ReadModelParam(const std::string& dir, const nlohmann::json& param, uint64_t min_floats,
                      const ModelRowsVisitor& visit) {
  const nlohmann::json& parts = param.contains("parts") ? param["parts"] : nlohmann::json();
  if (!parts.is_array()) {
    return absl::DataLossError(
        absl::StrCat(dir, "/manifest.json: parameter ", param.value("name", "?"), " has no parts"));
  }
  std::vector<char> key_bytes;
  std::vector<char> row_bytes;
  for (const nlohmann::json& part : parts) {
    if (!part.is_string()) {
      return absl::DataLossError(absl::StrCat(dir, "/manifest.json: a part of ",
                                              param.value("name", "?"), " is not a path"));
    }
    const std::string stem = (std::filesystem::path(dir) / part.get<std::string>()).string();
    ASSIGN_OR_RETURN(std::unique_ptr<NpyReader> keys, NpyReader::Open(stem + ".keys.npy"));
    ASSIGN_OR_RETURN(std::unique_ptr<NpyReader> rows, NpyReader::Open(stem + ".rows.npy"));
    if (keys->descr() != "<u8" || keys->shape().size() != 1 || rows->descr() != "<f4" ||
        rows->shape().size() != 2 || rows->rows() != keys->rows() ||
        rows->row_size() < min_floats) {
      return absl::DataLossError(absl::StrCat(stem, ".{keys,rows}.npy do not hold the ids and rows "
                                              "of at least ", min_floats, " floats of ",
                                              param.value("name", "?")));
    }
    while (true) {
      constexpr uint64_t kRowsPerRead = 4096;
      ASSIGN_OR_RETURN(uint64_t n, keys->Read(kRowsPerRead, &key_bytes));
      ASSIGN_OR_RETURN(uint64_t m, rows->Read(kRowsPerRead, &row_bytes));
      if (n == 0) break;
      if (m != n) return absl::DataLossError(absl::StrCat(stem, ".rows.npy ends early"));
      RETURN_IF_ERROR(visit(reinterpret_cast<const uint64_t*>(key_bytes.data()),
                            reinterpret_cast<const float*>(row_bytes.data()), n,
                            rows->row_size()));
    }
  }
  return absl::OkStatus();
}

}  // namespace eps
