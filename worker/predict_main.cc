// eps-predict: scores text records with a model export (docs/model-format.md).
//
//   eps-predict --model DIR --data FILES [--out FILE] [--device auto|cpu|cuda]
//               [--batch-size N] [--section.key=value ...]
//
// The export's job.ini gives the data format and the model; options given
// as --section.key=value override it (--worker.compute_threads=4). Writes
// one prediction per record to --out, in the order of the files (sorted)
// and their lines, malformed lines skipped as in training; prints the AUC
// and log loss of the records' labels. Exit 0, 2 for bad options, 1 for
// anything else.

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "core/flags.h"
#include "core/logging.h"
#include "worker/predictor.h"

int main(int argc, char** argv) {
  eps::PredictOptions options;
  // The export's job.ini is the config, unless --config names another.
  std::vector<std::string> args(argv, argv + argc);
  bool has_config = false;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--config" || absl::StartsWith(args[i], "--config=")) has_config = true;
    if (args[i] == "--model" && i + 1 < args.size()) options.model_dir = args[i + 1];
    if (absl::StartsWith(args[i], "--model=")) options.model_dir = args[i].substr(8);
  }
  bool help = false;
  for (const std::string& arg : args) help |= arg == "--help" || arg == "-h";
  if (!has_config && options.model_dir.empty() && !help) {
    std::cerr << "eps-predict: missing --model DIR (a model export: job.export_dir)\n";
    return 2;
  }
  if (!has_config && !options.model_dir.empty()) {
    args.push_back("--config=" + options.model_dir + "/job.ini");
  }
  std::vector<const char*> raw;
  for (const std::string& arg : args) raw.push_back(arg.c_str());

  eps::CommandLine command_line(
      "eps-predict", "--model DIR --data FILES [--out FILE] [--device auto|cpu|cuda]");
  int64_t batch_size = 0;
  command_line.AddString("model", &options.model_dir, "the model export's directory",
                         /*required=*/true);
  command_line.AddString("data", &options.data, "files, globs or directories to score",
                         /*required=*/true);
  command_line.AddString("out", &options.out, "where predictions go, one per line");
  command_line.AddString("device", &options.device, "auto, cpu or cuda");
  command_line.AddInt("batch-size", &batch_size, "records per batch; 0: the job's");
  eps::StatusOr<eps::JobConfig> config =
      command_line.Parse(static_cast<int>(raw.size()), raw.data());
  if (command_line.help_requested()) {
    std::cout << command_line.Usage();
    return 0;
  }
  if (!config.ok()) {
    std::cerr << "eps-predict: " << config.status().message() << "\n";
    return 2;
  }
  options.batch_size = batch_size;
  eps::SetLogNode("predict");
  eps::StatusOr<eps::PredictResult> result =
      eps::Predict(options, *config, [](uint64_t done, uint64_t total) {
        LOG(INFO) << absl::StrFormat("scored %.1f of %.1f MiB (%.0f%%)", done / 1048576.0,
                                     total / 1048576.0, total > 0 ? 100.0 * done / total : 100.0);
      });
  if (!result.ok()) {
    std::cerr << "eps-predict: " << result.status().message() << "\n";
    return absl::IsInvalidArgument(result.status()) ? 2 : 1;
  }
  std::cout << absl::StrFormat(
      "records %d\nmalformed %d\nauc %.9f\nlog_loss %.9f\nids %d\nunseen_ids %d\ndevice %s\n",
      result->records, result->malformed, result->auc, result->log_loss, result->ids,
      result->unseen, result->device);
  return 0;
}
