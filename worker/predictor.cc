#include "worker/predictor.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cluster/initializer.h"
#include "cluster/job_spec_check.h"
#include "cluster/model_format.h"
#include "cluster/placement.h"
#include "core/cpu_budget.h"
#include "core/data_paths.h"
#include "core/data_schema.h"
#include "core/logging.h"
#include "core/npy.h"
#include "google/protobuf/util/json_util.h"
#include "models/cuda/cuda_model.h"
#include "models/device.h"
#include "models/metrics.h"
#include "worker/line_reader.h"
#include "worker/record_parser.h"

namespace eps {
Status ExportedModel::LoadParam(const std::string& dir, const nlohmann::json& entry,
                                uint64_t seed, Param* param) {
  const std::string name = param->spec.name;
  const std::string spec_text = entry.contains("spec") ? entry["spec"].dump() : "";
  const auto parsed = google::protobuf::util::JsonStringToMessage(spec_text, &param->table);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat(dir, "/manifest.json: parameter '", name,
                                            "' has no readable spec (", parsed.ToString(),
                                            "): ", spec_text));
  }
  if (Status valid = ValidateTableSpec(param->table); !valid.ok()) {
    return absl::DataLossError(
        absl::StrCat(dir, "/manifest.json: parameter '", name, "': ", valid.message()));
  }
  const bool dense = param->spec.kind == ParamSpec::Kind::kDense;
  const uint32_t dim = param->table.dim();
  if (dense != (param->table.kind() == proto::DENSE) || dim == 0 ||
      (dense ? param->table.dense_size() != param->spec.size : dim != param->spec.size)) {
    return absl::DataLossError(absl::StrCat(
        dir, "/manifest.json: parameter '", name, "' does not fit the model (",
        dense ? "dense" : "embedding", " of ", param->spec.size, " floats expected)"));
  }
  const uint64_t dense_chunks = dense ? (param->spec.size + dim - 1) / dim : 0;
  std::vector<bool> have_chunk(dense_chunks, false);
  if (dense) param->values.assign(param->spec.size, 0.0f);
  RETURN_IF_ERROR(ReadModelParam(
      dir, entry, dim,
      [&](const uint64_t* ids, const float* rows, uint64_t n, uint64_t stride) -> Status {
        // The optimizer state past `dim` is dropped.
        for (uint64_t r = 0; r < n; ++r) {
          const float* row = rows + r * stride;
          if (dense) {
            if (ids[r] >= dense_chunks) {
              return absl::DataLossError(absl::StrCat(dir, ": chunk ", ids[r], " of ", name,
                                                      ", which has ", dense_chunks));
            }
            const uint64_t begin = ids[r] * dim;
            const uint64_t count = std::min<uint64_t>(dim, param->spec.size - begin);
            std::copy(row, row + count, param->values.begin() + begin);
            have_chunk[ids[r]] = true;
            continue;
          }
          const auto [it, inserted] =
              param->index.try_emplace(ids[r], static_cast<uint32_t>(param->index.size()));
          if (!inserted) {
            return absl::DataLossError(
                absl::StrCat(dir, ": id ", ids[r], " of ", name, " is in two parts"));
          }
          param->values.insert(param->values.end(), row, row + dim);
        }
        return absl::OkStatus();
      }));
  // A chunk no server held is what a server would have made of it.
  std::vector<float> initial(dim);
  for (uint64_t chunk = 0; chunk < dense_chunks; ++chunk) {
    if (have_chunk[chunk]) continue;
    InitializeRow(param->table.initializer(), seed, param->table.id(),
                  DenseChunkKey(param->table.id(), chunk), initial.data(), static_cast<int>(dim));
    const uint64_t begin = chunk * dim;
    const uint64_t n = std::min<uint64_t>(dim, param->spec.size - begin);
    std::copy(initial.begin(), initial.begin() + n, param->values.begin() + begin);
  }
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<ExportedModel>> ExportedModel::Load(
    const std::string& dir, const std::vector<ParamSpec>& params) {
  // A manifest of the wrong shape is an error, not a crash.
  try {
    return LoadUnchecked(dir, params);
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(
        absl::StrCat(dir, "/manifest.json does not have the shape of a model export: ", e.what()));
  }
}

StatusOr<std::unique_ptr<ExportedModel>> ExportedModel::LoadUnchecked(
    const std::string& dir, const std::vector<ParamSpec>& params) {
  std::unique_ptr<ExportedModel> model(new ExportedModel());
  ASSIGN_OR_RETURN(model->manifest_, ReadModelManifest(dir));
  const nlohmann::json& manifest = model->manifest_;
  model->seed_ = manifest.contains("job") ? manifest["job"].value("seed", uint64_t{0}) : 0;
  for (const ParamSpec& spec : params) {
    const nlohmann::json* entry = FindModelParam(manifest, spec.name);
    if (entry == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, "/manifest.json has no parameter '", spec.name, "', which the model needs"));
    }
    Param& param = model->params_.emplace_back();
    param.spec = spec;
    RETURN_IF_ERROR(LoadParam(dir, *entry, model->seed_, &param));
  }
  return model;
}

void ExportedModel::FillParams(const Batch& batch, ParamBuffers* buffers,
                               uint64_t* unseen) const {
  buffers->resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& param = params_[i];
    if (param.spec.kind == ParamSpec::Kind::kDense) {
      // The same for every batch: copied once.
      if ((*buffers)[i].empty()) (*buffers)[i] = param.values;
      continue;
    }
    const uint32_t dim = param.table.dim();
    std::vector<float>& rows = (*buffers)[i];
    rows.resize(batch.keys.size() * dim);
    for (size_t k = 0; k < batch.keys.size(); ++k) {
      float* out = rows.data() + k * dim;
      auto it = param.index.find(batch.keys[k]);
      if (it != param.index.end()) {
        std::memcpy(out, param.values.data() + size_t{it->second} * dim, sizeof(float) * dim);
        continue;
      }
      ++*unseen;
      InitializeRow(param.table.initializer(), seed_, param.table.id(), batch.keys[k], out,
                    static_cast<int>(dim));
    }
  }
}

StatusOr<PredictResult> Predict(const PredictOptions& options, const JobConfig& job,
                                const PredictProgress& progress) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, ExpandDataPaths(options.data, "--data"));
  ASSIGN_OR_RETURN(Device device, ResolveDevice(options.device));
  ASSIGN_OR_RETURN(Schema schema, Schema::FromConfig(job));
  ASSIGN_OR_RETURN(ModelOptions model_options, ModelOptions::FromConfig(job));
  std::unique_ptr<Model> model;
  if (device == Device::kCuda) {
    ASSIGN_OR_RETURN(model, CreateCudaModel(model_options));
  } else {
    ASSIGN_OR_RETURN(model, Model::Create(model_options));
  }
  const CpuBudget cpu =
      ChooseCpuThreads(ReadCpuLimits(), job.worker.compute_threads, /*workers_on_host=*/1);
  LOG(INFO) << "compute threads: " << cpu.reason;
  SetCpuThreads(cpu.threads);
  ASSIGN_OR_RETURN(std::unique_ptr<ExportedModel> exported,
                   ExportedModel::Load(options.model_dir, model->params()));
  const int64_t batch_size =
      options.batch_size > 0 ? options.batch_size : job.worker.reference_batch_size();
  if (batch_size <= 0) return absl::InvalidArgumentError("--batch-size must be positive");

  std::FILE* out = nullptr;
  if (!options.out.empty()) {
    out = std::fopen(options.out.c_str(), "w");
    if (out == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("--out: cannot create ", options.out, ": ", std::strerror(errno)));
    }
  }
  const auto close_out = [&]() -> Status {
    if (out == nullptr) return absl::OkStatus();
    const bool ok = std::fflush(out) == 0 && std::fclose(out) == 0;
    out = nullptr;
    return ok ? absl::OkStatus()
              : absl::UnavailableError(absl::StrCat("--out: cannot write ", options.out, ": ",
                                                    std::strerror(errno)));
  };

  uint64_t total_bytes = 0;
  for (const std::string& file : files) {
    struct stat info {};
    if (::stat(file.c_str(), &info) == 0) total_bytes += static_cast<uint64_t>(info.st_size);
  }
  PredictResult result;
  result.device = DeviceName(device);
  const RecordParser parser(schema);
  BatchBuilder builder(schema.num_dense, schema.num_cat);
  std::vector<float> dense(schema.num_dense);
  std::vector<uint64_t> ids(schema.num_cat);
  std::vector<uint32_t> field_ends(schema.num_cat);
  std::vector<float> labels;
  std::vector<float> predictions;
  std::vector<float> batch_predictions;
  ParamBuffers params;  // reused: the dense tensors are copied in once
  uint64_t bytes_done = 0;
  absl::Time next_progress = absl::Now() + absl::Seconds(5);
  std::string text;
  const auto score = [&]() -> Status {
    Batch batch = builder.Finish();
    if (batch.size() == 0) return absl::OkStatus();
    exported->FillParams(batch, &params, &result.unseen);
    result.ids += batch.keys.size();
    model->ForwardBackward(batch, params, &batch_predictions, nullptr);
    // Before anything of the batch is written or counted: the record's
    // index is that of its line among the records scored, from 0.
    if (const std::optional<size_t> bad = FirstNonFinite(batch_predictions)) {
      return absl::DataLossError(absl::StrCat(
          options.model_dir, ": the prediction of record ", predictions.size() + *bad,
          " (from 0, malformed lines not counted) is ",
          absl::StrFormat("%g", batch_predictions[*bad]),
          ": the export's weights do not give a finite score"));
    }
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
    predictions.insert(predictions.end(), batch_predictions.begin(), batch_predictions.end());
    if (out != nullptr) {
      text.clear();
      for (float p : batch_predictions) absl::StrAppend(&text, absl::StrFormat("%.9g\n", p));
      if (std::fwrite(text.data(), 1, text.size(), out) != text.size()) {
        return absl::UnavailableError(
            absl::StrCat("--out: cannot write ", options.out, ": ", std::strerror(errno)));
      }
    }
    return absl::OkStatus();
  };
  Status status;
  for (const std::string& file : files) {
    struct stat info {};
    if (::stat(file.c_str(), &info) != 0) {
      status = absl::UnavailableError(absl::StrCat("cannot read ", file, ": ", std::strerror(errno)));
      break;
    }
    StatusOr<std::unique_ptr<LineReader>> reader =
        LineReader::Open(file, 0, static_cast<uint64_t>(info.st_size), 1);
    if (!reader.ok()) {
      status = reader.status();
      break;
    }
    absl::string_view line;
    while (status.ok() && (*reader)->Next(&line)) {
      float label = 0;
      const Status parsed =
          schema.has_multi_value()
              ? parser.Parse(line, &label, std::span<float>(dense), &ids, field_ends)
              : parser.Parse(line, &label, std::span<float>(dense), std::span<uint64_t>(ids));
      if (!parsed.ok()) {
        if (result.malformed++ < 10) {
          LOG(WARNING) << "skipping malformed line " << file << ":" << (*reader)->line_number()
                       << ": " << parsed.message();
        }
        continue;
      }
      if (schema.has_multi_value()) {
        builder.Add(label, dense, ids, field_ends);
      } else {
        builder.Add(label, dense, ids);
      }
      if (builder.size() >= batch_size) status = score();
      if (progress && absl::Now() >= next_progress) {
        progress(bytes_done + (*reader)->offset(), total_bytes);
        next_progress = absl::Now() + absl::Seconds(5);
      }
    }
    if (status.ok()) status = (*reader)->status();
    bytes_done += static_cast<uint64_t>(info.st_size);
  }
  if (status.ok()) status = score();
  Status closed = close_out();
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(closed);
  result.records = predictions.size();
  result.auc = ComputeAuc(predictions, labels);
  result.log_loss = ComputeLogLoss(predictions, labels);
  return result;
}

}  // namespace eps
