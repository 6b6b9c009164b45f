#include "master/model_export.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/file_util.h"
#include "core/npy.h"
#include "google/protobuf/util/json_util.h"
#include "models/model.h"

namespace eps {
namespace {

nlohmann::json TableJson(const proto::TableSpec& table, const std::vector<uint32_t>& servers) {
  std::string spec_text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(table, &spec_text, options);
  nlohmann::json parts = nlohmann::json::array();
  for (uint32_t server : servers) {
    parts.push_back(absl::StrCat("params/", table.name(), "/part-", server));
  }
  const bool dense = table.kind() == proto::DENSE;
  return {{"name", table.name()},
          {"kind", dense ? "dense" : "embedding"},
          {"dim", table.dim()},
          // Dense: the tensor's floats; its chunks hold `dim` each.
          {"size", dense ? table.dense_size() : uint64_t{0}},
          {"parts", parts},
          {"spec", nlohmann::json::parse(spec_text, nullptr, /*allow_exceptions=*/false)}};
}

Status WriteNpy(const std::string& path, const std::vector<float>& values) {
  ASSIGN_OR_RETURN(std::unique_ptr<NpyWriter> writer, NpyWriter::Create(path, "<f4", {}));
  RETURN_IF_ERROR(writer->Append(values.data(), values.size()));
  return writer->Close();
}

}  // namespace

StatusOr<ExportManifest> MakeExportManifest(const JobConfig& job, const proto::JobSpec& spec,
                                            const TrainingProgress& progress,
                                            const std::vector<uint32_t>& servers) {
  ExportManifest out;
  ASSIGN_OR_RETURN(out.config_ini, job.ToIni());
  ASSIGN_OR_RETURN(ModelOptions model, ModelOptions::FromConfig(job));
  progress.EvalInDataOrder(&out.eval_labels, &out.eval_predictions);
  nlohmann::json params = nlohmann::json::array();
  for (const proto::TableSpec& table : spec.tables()) params.push_back(TableJson(table, servers));
  nlohmann::json eval = nullptr;
  if (progress.eval_auc().has_value()) {
    eval = {{"auc", *progress.eval_auc()},
            {"log_loss", *progress.eval_logloss()},
            {"records", out.eval_predictions.size()},
            {"files", progress.eval_data().files},
            {"labels", "eval_labels.npy"},
            {"predictions", "eval_predictions.npy"}};
  }
  out.manifest = {
      {"format", kModelFormat},
      {"version", kModelFormatVersion},
      {"job", {{"name", spec.name()},
               {"job_id", spec.job_id()},
               {"seed", spec.seed()},
               {"epochs", job.job.epochs},
               {"records_trained", progress.records_trained()},
               {"exported_at", absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone())}}},
      {"model", {{"type", model.type},
                 {"num_dense", model.num_dense},
                 {"num_fields", model.num_fields},
                 {"embedding_dim", model.embedding_dim},
                 {"mlp", model.mlp},
                 {"bottom_mlp", model.bottom_mlp},
                 {"top_mlp", model.top_mlp},
                 {"activation", model.activation},
                 {"pooling", model.pooling}}},
      {"data", {{"format", job.data.format},
                {"schema", job.data.schema},
                {"multi_value_separator", job.data.multi_value_separator}}},
      {"config", "job.ini"},
      {"servers", servers},
      {"params", params},
      {"eval", eval}};
  return out;
}

ExportTally TallyExport(const std::vector<StatusOr<proto::ExportReply>>& replies) {
  ExportTally tally;
  for (const StatusOr<proto::ExportReply>& reply : replies) {
    if (!reply.ok()) {
      absl::StrAppend(&tally.error, tally.error.empty() ? "" : "; ", reply.status().message());
      continue;
    }
    tally.rows += reply->rows();
    tally.bytes += reply->bytes();
    tally.rows_expired += reply->rows_expired();
  }
  return tally;
}

Status WriteExportManifest(const std::string& dir, const ExportManifest& manifest) {
  const std::filesystem::path root(dir);
  std::error_code error;
  std::filesystem::create_directories(root, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create export dir ", dir, ": ", error.message()));
  }
  RETURN_IF_ERROR(WriteFileAtomically((root / "job.ini").string(), manifest.config_ini));
  if (!manifest.manifest.at("eval").is_null()) {
    RETURN_IF_ERROR(WriteNpy((root / "eval_labels.npy").string(), manifest.eval_labels));
    RETURN_IF_ERROR(WriteNpy((root / "eval_predictions.npy").string(), manifest.eval_predictions));
  }
  return WriteFileAtomically((root / "manifest.json").string(), manifest.manifest.dump(2) + "\n");
}

}  // namespace eps
