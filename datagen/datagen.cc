#include "datagen/datagen.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "models/metrics.h"
#include "nlohmann/json.hpp"

namespace eps::datagen {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxRows = 100'000'000'000;  // ~30 TB of text
constexpr int64_t kMaxFiles = 100'000;         // part-NNNNN names
// Eval predictions are kept in memory for the AUC (8 bytes per row).
constexpr int64_t kMaxEvalRows = 200'000'000;
constexpr int kMaxThreads = 1024;
// Bytes reserved per formatted row (a typical line is ~250 bytes).
constexpr int64_t kBytesPerRowHint = 300;

// Version of the generator's output for a given (rows, seed, eval_rows); bump
// whenever the bytes change.
constexpr int kGeneratorVersion = 1;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Status ErrnoError(int error_number, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(error_number, absl::StrCat(what, " ", path));
}

std::string PartName(int64_t index) { return absl::StrFormat("part-%05d.txt", index); }

// A data file written as PATH.tmp and renamed to PATH on Commit. Abandoned
// (closed and the .tmp removed) when destroyed uncommitted.
class AtomicFile {
 public:
  AtomicFile() = default;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() { Abandon(); }

  Status Open(std::string path) {
    path_ = std::move(path);
    tmp_path_ = path_ + ".tmp";
    fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return ErrnoError(errno, "cannot create", tmp_path_);
    return absl::OkStatus();
  }

  Status Write(absl::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, "cannot write", tmp_path_);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  Status Commit() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      const int error_number = errno;
      ::unlink(tmp_path_.c_str());
      return ErrnoError(error_number, "cannot write", tmp_path_);
    }
    if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
      const int error_number = errno;
      ::unlink(tmp_path_.c_str());
      return ErrnoError(error_number, "cannot rename to", path_);
    }
    return absl::OkStatus();
  }

  bool is_open() const { return fd_ >= 0; }

 private:
  void Abandon() {
    if (fd_ < 0) return;
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_path_.c_str());
  }

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
};

Status WriteWholeFile(const std::string& path, absl::string_view data) {
  AtomicFile file;
  RETURN_IF_ERROR(file.Open(path));
  RETURN_IF_ERROR(file.Write(data));
  return file.Commit();
}

Status CreateDirectory(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return ErrnoError(ec.value(), "cannot create directory", dir.string());
  // create_directories may report success when `dir` exists but is not a
  // directory (LWG 2935); check.
  if (!fs::is_directory(dir, ec)) {
    return ErrnoError(ec ? ec.value() : ENOTDIR, "cannot create directory", dir.string());
  }
  return absl::OkStatus();
}

// Removes part-NNNNN.txt files in `dir` numbered >= `keep`: leftovers of an
// earlier run with more files, which a reader of the directory would
// otherwise take for data.
Status RemoveStaleParts(const fs::path& dir, int64_t keep) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != PartName(0).size() || name.rfind("part-", 0) != 0 ||
        name.substr(name.size() - 4) != ".txt") {
      continue;
    }
    const std::string digits = name.substr(5, name.size() - 9);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    if (std::stoll(digits) < keep) continue;
    std::error_code remove_ec;
    fs::remove(it->path(), remove_ec);
    if (remove_ec) {
      return ErrnoError(remove_ec.value(), "cannot remove stale", it->path().string());
    }
  }
  if (ec) return ErrnoError(ec.value(), "cannot list", dir.string());
  return absl::OkStatus();
}

// A run of consecutive rows of one split that go to one file.
struct Chunk {
  Split split;
  int64_t file;   // part number within the split's directory
  int64_t begin;  // first row index within the split
  int64_t end;    // one past the last
};

struct ChunkOutput {
  std::string text;
  int64_t positives = 0;
};

std::vector<Chunk> PlanChunks(int64_t train_rows, int64_t files, int64_t eval_rows,
                              int64_t chunk_rows) {
  std::vector<Chunk> chunks;
  const auto add = [&](Split split, int64_t file, int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; b += chunk_rows) {
      chunks.push_back({split, file, b, std::min(end, b + chunk_rows)});
    }
  };
  for (int64_t i = 0; i < files; ++i) {
    // No overflow: train_rows * files <= 1e11 * 1e5.
    add(Split::kTrain, i, i * train_rows / files, (i + 1) * train_rows / files);
  }
  add(Split::kEval, 0, 0, eval_rows);
  return chunks;
}

// Generates chunks on worker threads and hands them to the writer (the
// calling thread) in order, with at most `window` chunks in flight.
class ChunkPipeline {
 public:
  // `eval_day`: the day the eval rows are drawn on (training file i is
  // day i).
  ChunkPipeline(const PlantedModel& model, const std::vector<Chunk>& chunks, int threads,
                float* eval_predictions, float* eval_labels, int eval_day)
      : model_(model),
        eval_day_(eval_day),
        chunks_(chunks),
        window_(2 * static_cast<size_t>(threads) + 2),
        eval_predictions_(eval_predictions),
        eval_labels_(eval_labels),
        slots_(window_) {
    workers_.reserve(threads);
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;

  ~ChunkPipeline() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : workers_) t.join();
  }

  // Blocks until chunk `index` is generated and returns it.
  // REQUIRES: called with index 0, 1, 2, ... in turn.
  ChunkOutput Take(size_t index) {
    absl::MutexLock lock(&mu_);
    std::optional<ChunkOutput>& slot = slots_[index % window_];
    mu_.Await(absl::Condition(
        +[](std::optional<ChunkOutput>* s) { return s->has_value(); }, &slot));
    ChunkOutput out = std::move(*slot);
    slot.reset();
    next_write_ = index + 1;
    return out;
  }

 private:
  void WorkerLoop() {
    while (true) {
      size_t index;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &ChunkPipeline::MayClaim));
        if (stop_ || next_claim_ >= chunks_.size()) return;
        index = next_claim_++;
      }
      ChunkOutput out = Generate(chunks_[index]);
      absl::MutexLock lock(&mu_);
      slots_[index % window_] = std::move(out);
    }
  }

  // A worker may claim the next chunk (or learn there is none) once the
  // writer is less than a window behind.
  bool MayClaim() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || next_claim_ >= chunks_.size() || next_claim_ < next_write_ + window_;
  }

  ChunkOutput Generate(const Chunk& chunk) const {
    ChunkOutput out;
    out.text.reserve((chunk.end - chunk.begin) * kBytesPerRowHint);
    Row row;
    for (int64_t i = chunk.begin; i < chunk.end; ++i) {
      model_.GenerateRow(chunk.split, i, &row,
                         chunk.split == Split::kTrain ? static_cast<int>(chunk.file) : eval_day_);
      model_.AppendCriteoLine(row, &out.text);
      out.positives += row.label;
      if (chunk.split == Split::kEval) {
        // Disjoint ranges per chunk: no two threads write the same element.
        eval_predictions_[i] = static_cast<float>(row.probability);
        eval_labels_[i] = static_cast<float>(row.label);
      }
    }
    return out;
  }

  const PlantedModel& model_;
  const int eval_day_;
  const std::vector<Chunk>& chunks_;
  const size_t window_;
  float* const eval_predictions_;
  float* const eval_labels_;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  size_t next_claim_ ABSL_GUARDED_BY(mu_) = 0;
  size_t next_write_ ABSL_GUARDED_BY(mu_) = 0;
  // Chunk i waits in slots_[i % window_] until taken.
  std::vector<std::optional<ChunkOutput>> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

}  // namespace

Status DatagenOptions::Validate() const {
  if (rows < 1)
    return absl::InvalidArgumentError(absl::StrCat("--rows must be >= 1 (got ", rows, ")"));
  if (rows > kMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rows must be <= ", kMaxRows, " (got ", rows, ")"));
  }
  if (out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  if (files < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--files must be >= 1 (got ", files, ")"));
  }
  if (files > kMaxFiles) {
    return absl::InvalidArgumentError(
        absl::StrCat("--files must be <= ", kMaxFiles, " (got ", files, ")"));
  }
  if (files > rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--files must be <= --rows, or some files would be empty (got ", files, " > ", rows, ")"));
  }
  if (eval_rows.has_value() && *eval_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval-rows must be >= 1 (got ", *eval_rows, ")"));
  }
  if (EffectiveEvalRows() > kMaxEvalRows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--eval-rows must be <= ", kMaxEvalRows, " (got ", EffectiveEvalRows(),
        eval_rows.has_value() ? "" : " from the default rows / 10; set --eval-rows", ")"));
  }
  if (threads < 0 || threads > kMaxThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads must be between 0 and ", kMaxThreads, " (got ", threads, ")"));
  }
  if (chunk_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_rows must be >= 1 (got ", chunk_rows, ")"));
  }
  if (progress_interval_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("progress_interval_ms must be >= 0 (got ", progress_interval_ms, ")"));
  }
  return model.Validate();
}

int64_t DatagenOptions::EffectiveEvalRows() const {
  return eval_rows.has_value() ? *eval_rows : std::max<int64_t>(1000, rows / 10);
}

int DatagenOptions::EffectiveThreads() const {
  if (threads > 0) return threads;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

StatusOr<DatagenResult> GenerateDataset(const DatagenOptions& options,
                                        const ProgressCallback& progress) {
  RETURN_IF_ERROR(options.Validate());
  const Clock::time_point start = Clock::now();
  const fs::path out_dir(options.out_dir);
  const fs::path train_dir = out_dir / "train";
  const fs::path eval_dir = out_dir / "eval";
  RETURN_IF_ERROR(CreateDirectory(out_dir));  // first, so an error names DIR itself
  RETURN_IF_ERROR(CreateDirectory(train_dir));
  RETURN_IF_ERROR(CreateDirectory(eval_dir));

  ASSIGN_OR_RETURN(const PlantedModel model, PlantedModel::Create(options.seed, options.model));

  DatagenResult result;
  result.train_rows = options.rows;
  result.eval_rows = options.EffectiveEvalRows();
  const std::vector<Chunk> chunks =
      PlanChunks(options.rows, options.files, result.eval_rows, options.chunk_rows);
  result.threads = static_cast<int>(std::min<size_t>(options.EffectiveThreads(), chunks.size()));
  std::vector<float> eval_predictions(result.eval_rows);
  std::vector<float> eval_labels(result.eval_rows);

  DatagenProgress report;
  report.rows_total = result.train_rows + result.eval_rows;
  int64_t train_positives = 0;
  int64_t eval_positives = 0;
  {
    // With drift, the eval rows are the day after the last training file.
    ChunkPipeline pipeline(model, chunks, result.threads, eval_predictions.data(),
                           eval_labels.data(),
                           options.model.drift > 0 ? static_cast<int>(options.files) : 0);
    AtomicFile file;
    Clock::time_point last_report = Clock::now();
    for (size_t i = 0; i < chunks.size(); ++i) {
      const Chunk& chunk = chunks[i];
      const bool starts_file =
          i == 0 || chunk.split != chunks[i - 1].split || chunk.file != chunks[i - 1].file;
      if (starts_file) {
        if (file.is_open()) RETURN_IF_ERROR(file.Commit());
        const fs::path& dir = chunk.split == Split::kTrain ? train_dir : eval_dir;
        RETURN_IF_ERROR(file.Open((dir / PartName(chunk.file)).string()));
      }
      const ChunkOutput out = pipeline.Take(i);
      RETURN_IF_ERROR(file.Write(out.text));
      result.bytes_written += static_cast<int64_t>(out.text.size());
      (chunk.split == Split::kTrain ? train_positives : eval_positives) += out.positives;
      report.rows_written += chunk.end - chunk.begin;
      if (progress &&
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_report)
                  .count() >= options.progress_interval_ms) {
        last_report = Clock::now();
        report.elapsed_s = SecondsSince(start);
        progress(report);
      }
    }
    RETURN_IF_ERROR(file.Commit());
  }
  RETURN_IF_ERROR(RemoveStaleParts(train_dir, options.files));
  RETURN_IF_ERROR(RemoveStaleParts(eval_dir, 1));

  result.optimal_auc = ComputeAuc(eval_predictions, eval_labels);
  result.optimal_logloss = ComputeLogLoss(eval_predictions, eval_labels);
  result.positive_rate_train =
      static_cast<double>(train_positives) / static_cast<double>(result.train_rows);
  result.positive_rate_eval =
      static_cast<double>(eval_positives) / static_cast<double>(result.eval_rows);

  nlohmann::json generator = model.Describe();
  generator["version"] = kGeneratorVersion;
  const nlohmann::json truth = {
      {"optimal_auc", result.optimal_auc},
      {"optimal_logloss", result.optimal_logloss},
      {"train_rows", result.train_rows},
      {"eval_rows", result.eval_rows},
      {"positive_rate_train", result.positive_rate_train},
      {"positive_rate_eval", result.positive_rate_eval},
      {"seed", options.seed},
      {"files", options.files},
      {"format", "criteo"},
      {"train", "train/part-*.txt"},
      {"eval", "eval/part-00000.txt"},
      {"generator", generator},
  };
  result.truth_path = (out_dir / "truth.json").string();
  RETURN_IF_ERROR(WriteWholeFile(result.truth_path, truth.dump(2) + "\n"));
  result.elapsed_s = SecondsSince(start);
  return result;
}

}  // namespace eps::datagen
