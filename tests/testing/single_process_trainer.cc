#include "tests/testing/single_process_trainer.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "cluster/placement.h"
#include "core/data_schema.h"
#include "core/flags.h"
#include "core/logging.h"
#include "master/job_spec.h"
#include "master/progress/data_set.h"
#include "models/batch.h"
#include "models/metrics.h"
#include "models/model.h"
#include "ps/table.h"
#include "worker/line_reader.h"
#include "worker/record_parser.h"

namespace eps {
namespace {

class Trainer {
 public:
  Status Init(const JobConfig& config) {
    config_ = config;
    ASSIGN_OR_RETURN(proto::JobSpec spec, BuildJobSpec(config));
    ASSIGN_OR_RETURN(Schema schema, Schema::FromConfig(config));
    parser_ = std::make_unique<RecordParser>(schema);
    ASSIGN_OR_RETURN(ModelOptions options, ModelOptions::FromConfig(config));
    ASSIGN_OR_RETURN(model_, Model::Create(options));
    for (const proto::TableSpec& table_spec : spec.tables()) {
      ASSIGN_OR_RETURN(std::unique_ptr<Table> table, Table::Create(table_spec, spec.seed()));
      std::vector<uint64_t> keys;
      if (table_spec.kind() == proto::DENSE) {
        for (uint64_t c = 0; c < DenseChunkCount(table_spec.dense_size(), table_spec.dim()); ++c) {
          keys.push_back(DenseChunkKey(table_spec.id(), c));
        }
      }
      dense_keys_.push_back(std::move(keys));
      tables_.push_back(std::move(table));
    }
    return absl::OkStatus();
  }

  // Runs `batch`: trains it (eval == false) or predicts it.
  double Step(const Batch& batch, bool eval, std::vector<float>* predictions) {
    const std::vector<ParamSpec>& params = model_->params();
    ParamBuffers buffers(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].kind == ParamSpec::Kind::kEmbedding) {
        buffers[i].resize(batch.keys.size() * tables_[i]->dim());
        CHECK_OK(tables_[i]->Pull(batch.keys, buffers[i]));
      } else {
        buffers[i].resize(dense_keys_[i].size() * tables_[i]->dim());
        CHECK_OK(tables_[i]->Pull(dense_keys_[i], buffers[i]));
        buffers[i].resize(params[i].size);
      }
    }
    ParamBuffers grads;
    const double loss = model_->ForwardBackward(batch, buffers, predictions, eval ? nullptr : &grads);
    if (eval) return loss;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].kind == ParamSpec::Kind::kEmbedding) {
        CHECK_OK(tables_[i]->Push(batch.keys, grads[i]));
      } else {
        grads[i].resize(dense_keys_[i].size() * tables_[i]->dim(), 0.0f);
        CHECK_OK(tables_[i]->Push(dense_keys_[i], grads[i]));
      }
    }
    return loss;
  }

  // Streams `files` in batches; trains or collects predictions.
  Status Pass(const std::vector<std::string>& files, bool eval, SingleProcessResult* result,
              std::vector<float>* labels, std::vector<float>* predictions) {
    const Schema& schema = parser_->schema();
    BatchBuilder builder(schema.num_dense, schema.num_cat);
    std::vector<float> dense(schema.num_dense);
    std::vector<uint64_t> ids;
    std::vector<uint32_t> field_ends(schema.num_cat);
    std::vector<float> batch_predictions;
    double loss_sum = 0;
    uint64_t loss_count = 0;
    auto flush = [&] {
      Batch batch = builder.Finish();
      if (batch.size() == 0) return;
      loss_sum += Step(batch, eval, &batch_predictions);
      loss_count += static_cast<uint64_t>(batch.size());
      if (eval) {
        labels->insert(labels->end(), batch.labels.begin(), batch.labels.end());
        predictions->insert(predictions->end(), batch_predictions.begin(),
                            batch_predictions.end());
      } else {
        result->records_trained += static_cast<uint64_t>(batch.size());
      }
    };
    for (const std::string& path : files) {
      ASSIGN_OR_RETURN(std::unique_ptr<LineReader> reader,
                       LineReader::Open(path, 0, FileSize(path), 1));
      absl::string_view line;
      while (reader->Next(&line)) {
        float label = 0;
        if (!parser_->Parse(line, &label, std::span<float>(dense), &ids, field_ends).ok()) {
          ++result->malformed;
          continue;
        }
        builder.Add(label, dense, ids, field_ends);
        if (builder.size() >= config_.worker.reference_batch_size()) flush();
      }
      RETURN_IF_ERROR(reader->status());
    }
    flush();
    if (!eval && loss_count > 0) result->train_loss = loss_sum / static_cast<double>(loss_count);
    return absl::OkStatus();
  }

 private:
  static uint64_t FileSize(const std::string& path) {
    std::error_code error;
    const uintmax_t size = std::filesystem::file_size(path, error);
    return error ? 0 : static_cast<uint64_t>(size);
  }

  JobConfig config_;
  std::unique_ptr<RecordParser> parser_;
  std::unique_ptr<Model> model_;
  std::vector<std::unique_ptr<Table>> tables_;
  std::vector<std::vector<uint64_t>> dense_keys_;
};

}  // namespace

StatusOr<SingleProcessResult> TrainSingleProcess(const JobConfig& config) {
  Trainer trainer;
  RETURN_IF_ERROR(trainer.Init(config));
  ASSIGN_OR_RETURN(std::vector<std::string> train, ExpandDataPaths(config.data.train, "data.train"));
  SingleProcessResult result;
  for (int64_t epoch = 0; epoch < config.job.epochs; ++epoch) {
    RETURN_IF_ERROR(trainer.Pass(train, /*eval=*/false, &result, nullptr, nullptr));
  }
  if (!config.data.eval.empty()) {
    ASSIGN_OR_RETURN(std::vector<std::string> eval, ExpandDataPaths(config.data.eval, "data.eval"));
    std::vector<float> labels;
    std::vector<float> predictions;
    RETURN_IF_ERROR(trainer.Pass(eval, /*eval=*/true, &result, &labels, &predictions));
    result.eval_auc = ComputeAuc(predictions, labels);
    result.eval_logloss = ComputeLogLoss(predictions, labels);
    result.eval_records = labels.size();
  }
  return result;
}

StatusOr<SingleProcessResult> TrainSingleProcess(const std::string& config_path,
                                                 const std::vector<std::string>& overrides) {
  CommandLine command_line("eps-train-local", "--config JOB.ini");
  std::vector<std::string> args = {"eps-train-local", "--config", config_path};
  args.insert(args.end(), overrides.begin(), overrides.end());
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  ASSIGN_OR_RETURN(JobConfig config, command_line.Parse(static_cast<int>(argv.size()), argv.data()));
  return TrainSingleProcess(config);
}

}  // namespace eps
