// Metrics: latency histograms every process keeps, and the Prometheus text
// exposition format the master serves them in (GET /metrics).
//
// A LatencyHistogram counts durations into fixed buckets (100 us doubling
// up to 13.1072 s, then +Inf) with a few relaxed atomic adds per
// observation, cheap enough for every PULL and PUSH. Its Snapshot() travels
// to the master in heartbeats as proto::Histogram (HistogramToProto /
// HistogramFromProto), and the master writes it with PrometheusWriter.
//
// PrometheusWriter builds one exposition (text format 0.0.4): families with
// HELP and TYPE, samples with escaped labels, histograms as cumulative
// `_bucket{le=...}`, `_sum` and `_count`.
//
// Thread-safety: LatencyHistogram is safe for concurrent use;
// PrometheusWriter and HistogramSnapshot need external synchronization.

#ifndef EPS_CORE_METRICS_H_
#define EPS_CORE_METRICS_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "proto/eps.pb.h"

namespace eps {

// A histogram at one moment.
struct HistogramSnapshot {
  // Upper bounds of the buckets, finite and strictly increasing (seconds
  // for latencies).
  std::vector<double> bounds;
  // bounds.size() + 1 counts, not cumulative: counts[i] observations in
  // (bounds[i-1], bounds[i]]; the last one those above every bound.
  std::vector<uint64_t> counts;
  // Observations in all (the sum of counts) and the sum of their values.
  uint64_t count = 0;
  double sum = 0;
};

// Copies `snapshot` into `out` (replacing what it held).
void HistogramToProto(const HistogramSnapshot& snapshot, proto::Histogram* out);
// The histogram `histogram` carries. kInvalidArgument when its bounds are
// not finite and strictly increasing, or it has not one count more than
// bounds (a peer's message is checked before it is exposed).
StatusOr<HistogramSnapshot> HistogramFromProto(const proto::Histogram& histogram);
// The bound of the first bucket under which at least `share` (in (0, 1]) of
// the observations fall; nullopt when there are none, or when that takes
// the bucket above every bound.
std::optional<double> QuantileBound(const HistogramSnapshot& snapshot, double share);

// Durations counted into fixed buckets. Safe for concurrent use.
class LatencyHistogram {
 public:
  // Upper bounds: 100 us * 2^i for i in [0, kNumBounds), i.e. 0.0001 s to
  // 13.1072 s; longer durations land in the +Inf bucket.
  static constexpr int kNumBounds = 18;
  static constexpr int64_t kFirstBoundNanos = 100'000;

  LatencyHistogram() = default;
  LatencyHistogram(const LatencyHistogram&) = delete;
  LatencyHistogram& operator=(const LatencyHistogram&) = delete;

  // The bucket bounds in seconds (kNumBounds of them).
  static std::span<const double> Bounds();

  // Counts one duration (a negative one as zero). Lock-free: two relaxed
  // atomic adds.
  void Observe(absl::Duration duration);

  // The counts so far. Taken while others observe, `sum` may lag or lead
  // the counts by the observations in flight; count always equals the sum
  // of the counts.
  HistogramSnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kNumBounds + 1> buckets_{};
  std::atomic<uint64_t> sum_nanos_{0};
};

// Small counts (how many updates a step's parameters missed, say) counted
// into fixed buckets: 0, 1, 2, then doubling up to 1024, then +Inf. Safe for
// concurrent use; lock-free.
class CountHistogram {
 public:
  // Upper bounds: 0, then 2^i for i in [0, 10].
  static constexpr int kNumBounds = 12;

  CountHistogram() = default;
  CountHistogram(const CountHistogram&) = delete;
  CountHistogram& operator=(const CountHistogram&) = delete;

  static std::span<const double> Bounds();
  void Observe(uint64_t value);
  // As LatencyHistogram::Snapshot; `sum` is the sum of the values.
  HistogramSnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kNumBounds + 1> buckets_{};
  std::atomic<uint64_t> sum_{0};
};

// Observes the time from its construction to its destruction into a
// histogram (none when given nullptr). Uses the monotonic clock.
class ScopedLatency {
 public:
  explicit ScopedLatency(LatencyHistogram* histogram)
      : histogram_(histogram), start_(std::chrono::steady_clock::now()) {}
  ~ScopedLatency() {
    if (histogram_ != nullptr) {
      histogram_->Observe(absl::FromChrono(std::chrono::steady_clock::now() - start_));
    }
  }
  ScopedLatency(const ScopedLatency&) = delete;
  ScopedLatency& operator=(const ScopedLatency&) = delete;

 private:
  LatencyHistogram* const histogram_;
  const std::chrono::steady_clock::time_point start_;
};

// A sample value as the exposition format spells it: the shortest text that
// reads back as `value` (every digit of a large counter), NaN, +Inf, -Inf.
std::string PrometheusNumber(double value);

// `value` as a label value between double quotes: backslash, double quote
// and newline escaped (\\, \", \n), and bytes that are not UTF-8 replaced
// by U+FFFD (label values come from outside: job names, hosts).
std::string EscapeLabelValue(absl::string_view value);

enum class MetricType { kGauge, kCounter, kHistogram };

// Label name -> value, written in this order.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Writes one exposition: each family's HELP and TYPE lines, then its
// samples. Misuse (a malformed or repeated family name, a counter whose
// name does not end in _total, a sample of the wrong type, a label named
// "le" or malformed) is a bug: CHECK-fails.
class PrometheusWriter {
 public:
  // Starts family `name`; the samples written next belong to it. A family
  // without samples is legal (HELP and TYPE only). `help` is ours, one line
  // (backslashes and newlines are escaped anyway).
  void Family(absl::string_view name, MetricType type, absl::string_view help);
  // One sample of the current gauge or counter family.
  void Sample(const MetricLabels& labels, double value);
  void Sample(double value) { Sample({}, value); }
  // One histogram of the current histogram family: a cumulative
  // `NAME_bucket{...,le="B"}` per bound and le="+Inf", then NAME_sum and
  // NAME_count.
  void Histogram(const MetricLabels& labels, const HistogramSnapshot& histogram);

  // The exposition so far.
  const std::string& text() const { return out_; }

 private:
  // `name{labels}` (and `le` last when given), then a space.
  void AppendSeries(absl::string_view name, const MetricLabels& labels, const std::string* le);

  std::string out_;
  std::string family_;
  MetricType type_ = MetricType::kGauge;
  absl::flat_hash_set<std::string> families_;
};

}  // namespace eps

#endif  // EPS_CORE_METRICS_H_
