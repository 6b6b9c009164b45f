// eps-datagen: writes Criteo-format data drawn from a planted model, with the
// model's optimal AUC in truth.json (see datagen/datagen.h).
//
//   eps-datagen --rows N --out DIR [--seed S] [--files K] [--eval-rows M]
//               [--threads T]
//
// Exit codes: 0 success, 2 usage error, 1 runtime failure (one line on
// stderr saying what failed).

#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "boost/program_options.hpp"
#include "datagen/datagen.h"

namespace po = boost::program_options;

namespace {

constexpr char kProgram[] = "eps-datagen";
constexpr int kExitOk = 0;
constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

po::options_description Flags() {
  po::options_description flags("Options");
  // clang-format off
  flags.add_options()
      ("help,h", "print this help and exit")
      ("rows", po::value<int64_t>(), "number of training rows (required, >= 1)")
      ("out", po::value<std::string>(), "output directory, created if missing (required)")
      ("seed", po::value<std::string>(), "seed of the planted model and the rows (default 1)")
      ("files", po::value<int64_t>(), "number of training part files (default 1)")
      ("eval-rows", po::value<int64_t>(), "number of eval rows (default max(1000, rows/10))")
      ("drift", po::value<double>(),
       "radians a day the per-id weights turn by: training file i is day i, the eval rows the "
       "day after the last (default 0: no drift)")
      ("threads", po::value<int>(), "generator threads; 0 = all cores (default 0)");
  // clang-format on
  return flags;
}

std::string Usage(const po::options_description& flags) {
  std::ostringstream out;
  out << "usage: " << kProgram
      << " --rows N --out DIR [--seed S] [--files K] [--eval-rows M] [--drift R] [--threads T]\n\n"
      << "Writes Criteo-format data (label, I1-I13, C1-C26; tab-separated) drawn from a\n"
      << "planted model: DIR/train/part-*.txt, DIR/eval/part-00000.txt, and DIR/truth.json\n"
      << "with the planted model's optimal AUC and log loss on the eval rows. The output\n"
      << "depends only on --rows, --seed and --eval-rows (and --files for the split).\n\n"
      << flags;
  return out.str();
}

int UsageError(const std::string& message) {
  std::cerr << kProgram << ": " << message << " (see --help)" << std::endl;
  return kExitUsage;
}

std::string HumanRate(double rows_per_s) {
  if (rows_per_s >= 1e6) return absl::StrFormat("%.2fM", rows_per_s / 1e6);
  if (rows_per_s >= 1e3) return absl::StrFormat("%.1fk", rows_per_s / 1e3);
  return absl::StrFormat("%.0f", rows_per_s);
}

}  // namespace

int main(int argc, char** argv) {
  const po::options_description flags = Flags();
  po::variables_map vm;
  try {
    // Stray words are collected (Boost would otherwise ignore them) and
    // rejected below by name.
    po::options_description all = flags;
    all.add_options()("positional", po::value<std::vector<std::string>>(), "");
    po::positional_options_description positional;
    positional.add("positional", -1);
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const std::exception& e) {  // Boost throws; we report and exit 2.
    return UsageError(e.what());
  }
  if (vm.count("positional")) {
    return UsageError("unexpected argument '" +
                      vm["positional"].as<std::vector<std::string>>().front() + "'");
  }
  if (vm.count("help")) {
    std::cout << Usage(flags);
    return kExitOk;
  }

  eps::datagen::DatagenOptions options;
  if (!vm.count("rows")) return UsageError("--rows is required");
  if (!vm.count("out")) return UsageError("--out is required");
  options.rows = vm["rows"].as<int64_t>();
  options.out_dir = vm["out"].as<std::string>();
  if (vm.count("seed")) {
    const std::string& seed = vm["seed"].as<std::string>();
    if (!absl::SimpleAtoi(seed, &options.seed) || seed.find('-') != std::string::npos) {
      return UsageError("--seed must be an integer in [0, 2^64) (got '" + seed + "')");
    }
  }
  if (vm.count("files")) options.files = vm["files"].as<int64_t>();
  if (vm.count("eval-rows")) options.eval_rows = vm["eval-rows"].as<int64_t>();
  if (vm.count("threads")) options.threads = vm["threads"].as<int>();
  if (vm.count("drift")) options.model.drift = vm["drift"].as<double>();
  if (eps::Status status = options.Validate(); !status.ok()) {
    return UsageError(std::string(status.message()));
  }

  std::cerr << absl::StrFormat("%s: rows=%d eval_rows=%d files=%d seed=%d threads=%d out=%s",
                               kProgram, options.rows, options.EffectiveEvalRows(), options.files,
                               options.seed, options.EffectiveThreads(), options.out_dir)
            << std::endl;
  const auto progress = [](const eps::datagen::DatagenProgress& p) {
    std::cerr << absl::StrFormat("%s: %d/%d rows (%.1f%%), %s rows/s", kProgram, p.rows_written,
                                 p.rows_total, 100.0 * p.rows_written / p.rows_total,
                                 HumanRate(p.rows_written / p.elapsed_s))
              << std::endl;
  };
  eps::StatusOr<eps::datagen::DatagenResult> result =
      eps::datagen::GenerateDataset(options, progress);
  if (!result.ok()) {
    std::cerr << kProgram << ": " << result.status().message() << std::endl;
    return absl::IsInvalidArgument(result.status()) ? kExitUsage : kExitRuntime;
  }
  const eps::datagen::DatagenResult& r = *result;
  std::cout << absl::StrFormat(
                   "%s: wrote %d train rows (%d files) and %d eval rows, %.1f MB, in %.2f s "
                   "(%s rows/s, %d threads); optimal AUC %.4f, log loss %.4f, positive rate "
                   "%.3f; see %s",
                   kProgram, r.train_rows, options.files, r.eval_rows, r.bytes_written / 1e6,
                   r.elapsed_s, HumanRate((r.train_rows + r.eval_rows) / r.elapsed_s), r.threads,
                   r.optimal_auc, r.optimal_logloss, r.positive_rate_eval, r.truth_path)
            << std::endl;
  return kExitOk;
}
