// eps-train-local: trains a job config in one process (no network), with
// the same math code as the distributed job. The reference for comparing a
// distributed run's accuracy.
//
//   eps-train-local --config JOB.ini [--section.key=value ...]

#include <cstdio>
#include <iostream>

#include "core/flags.h"
#include "tests/testing/single_process_trainer.h"

int main(int argc, char** argv) {
  eps::CommandLine command_line("eps-train-local", "--config JOB.ini");
  eps::StatusOr<eps::JobConfig> config = command_line.Parse(argc, argv);
  if (command_line.help_requested()) {
    std::cout << command_line.Usage();
    return 0;
  }
  if (!config.ok()) {
    std::cerr << "eps-train-local: " << config.status().message() << "\n";
    return 2;
  }
  eps::StatusOr<eps::SingleProcessResult> result = eps::TrainSingleProcess(*config);
  if (!result.ok()) {
    std::cerr << "eps-train-local: " << result.status().message() << "\n";
    return 1;
  }
  std::printf("{\"records_trained\": %llu, \"malformed\": %llu, \"train_loss\": %.6f, "
              "\"eval_auc\": %.6f, \"eval_logloss\": %.6f, \"eval_records\": %llu}\n",
              static_cast<unsigned long long>(result->records_trained),
              static_cast<unsigned long long>(result->malformed), result->train_loss,
              result->eval_auc, result->eval_logloss,
              static_cast<unsigned long long>(result->eval_records));
  return 0;
}
