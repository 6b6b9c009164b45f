// Tests core/metrics.h: latency histograms, their wire form and the
// Prometheus text writer.

#include "core/metrics.h"

#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The bucket one observation of `duration` lands in.
size_t BucketOf(absl::Duration duration) {
  LatencyHistogram histogram;
  histogram.Observe(duration);
  const HistogramSnapshot snapshot = histogram.Snapshot();
  for (size_t i = 0; i < snapshot.counts.size(); ++i) {
    if (snapshot.counts[i] == 1) return i;
  }
  ADD_FAILURE() << "no bucket counted " << duration;
  return snapshot.counts.size();
}

TEST(LatencyHistogram, BoundsDoubleFrom100MicrosecondsTo13Seconds) {
  const std::span<const double> bounds = LatencyHistogram::Bounds();
  ASSERT_EQ(bounds.size(), 18u);
  EXPECT_EQ(bounds[0], 0.0001);
  EXPECT_EQ(bounds[1], 0.0002);
  EXPECT_EQ(bounds[17], 13.1072);
  for (size_t i = 1; i < bounds.size(); ++i) EXPECT_EQ(bounds[i], 2 * bounds[i - 1]);
  EXPECT_EQ(PrometheusNumber(bounds[10]), "0.1024");
}

TEST(LatencyHistogram, BoundsAreInclusiveUpperLimits) {
  EXPECT_EQ(BucketOf(absl::ZeroDuration()), 0u);
  EXPECT_EQ(BucketOf(-absl::Seconds(1)), 0u);  // a clock step back counts as zero
  EXPECT_EQ(BucketOf(absl::Microseconds(100)), 0u);
  EXPECT_EQ(BucketOf(absl::Nanoseconds(100'001)), 1u);
  EXPECT_EQ(BucketOf(absl::Microseconds(200)), 1u);
  EXPECT_EQ(BucketOf(absl::Nanoseconds(200'001)), 2u);
  EXPECT_EQ(BucketOf(absl::Milliseconds(1)), 4u);     // (0.8 ms, 1.6 ms]
  EXPECT_EQ(BucketOf(absl::Milliseconds(100)), 10u);  // (51.2 ms, 102.4 ms]
  EXPECT_EQ(BucketOf(absl::Nanoseconds(13'107'200'000)), 17u);
  EXPECT_EQ(BucketOf(absl::Nanoseconds(13'107'200'001)), 18u);  // +Inf
  EXPECT_EQ(BucketOf(absl::Hours(5)), 18u);
}

TEST(LatencyHistogram, SnapshotCountsAndSums) {
  LatencyHistogram histogram;
  histogram.Observe(absl::Microseconds(50));
  histogram.Observe(absl::Microseconds(150));
  histogram.Observe(absl::Microseconds(150));
  histogram.Observe(absl::Seconds(20));
  const HistogramSnapshot snapshot = histogram.Snapshot();
  EXPECT_EQ(snapshot.bounds.size(), 18u);
  ASSERT_EQ(snapshot.counts.size(), 19u);
  EXPECT_EQ(snapshot.counts[0], 1u);
  EXPECT_EQ(snapshot.counts[1], 2u);
  EXPECT_EQ(snapshot.counts[18], 1u);
  EXPECT_EQ(snapshot.count, 4u);
  EXPECT_DOUBLE_EQ(snapshot.sum, 20.00035);
}

TEST(CountHistogram, CountsZeroOneTwoThenDoublingBuckets) {
  EXPECT_THAT(CountHistogram::Bounds(),
              ElementsAre(0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024));
  CountHistogram histogram;
  for (uint64_t value : {0, 0, 1, 2, 3, 4, 5, 1024, 1025, 1 << 30}) histogram.Observe(value);
  const HistogramSnapshot snapshot = histogram.Snapshot();
  ASSERT_EQ(snapshot.counts.size(), 13u);
  // 0 | 1 | 2 | (2,4] | (4,8] | ... | (512,1024] | +Inf
  EXPECT_THAT(snapshot.counts, ElementsAre(2, 1, 1, 2, 1, 0, 0, 0, 0, 0, 0, 1, 2));
  EXPECT_EQ(snapshot.count, 10u);
  EXPECT_DOUBLE_EQ(snapshot.sum, 0 + 1 + 2 + 3 + 4 + 5 + 1024 + 1025 + (1 << 30));
  // It travels and checks as any histogram does.
  proto::Histogram wire;
  HistogramToProto(snapshot, &wire);
  ASSERT_TRUE(HistogramFromProto(wire).ok());
}

TEST(LatencyHistogram, ConcurrentObservationsAreAllCounted) {
  LatencyHistogram histogram;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&histogram, t] {
      for (int i = 0; i < 10000; ++i) histogram.Observe(absl::Microseconds(t * 1000 + i % 7));
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(histogram.Snapshot().count, 40000u);
}

TEST(ScopedLatency, ObservesOnceOnDestructionAndAcceptsNull) {
  LatencyHistogram histogram;
  { ScopedLatency timer(&histogram); }
  { ScopedLatency timer(nullptr); }
  EXPECT_EQ(histogram.Snapshot().count, 1u);
}

TEST(HistogramProto, RoundTrips) {
  LatencyHistogram histogram;
  histogram.Observe(absl::Milliseconds(3));
  histogram.Observe(absl::Milliseconds(30));
  const HistogramSnapshot snapshot = histogram.Snapshot();
  proto::Histogram wire;
  HistogramToProto(snapshot, &wire);
  StatusOr<HistogramSnapshot> back = HistogramFromProto(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->bounds, snapshot.bounds);
  EXPECT_EQ(back->counts, snapshot.counts);
  EXPECT_EQ(back->count, 2u);
  EXPECT_DOUBLE_EQ(back->sum, 0.033);
}

TEST(HistogramProto, RejectsMalformedHistograms) {
  proto::Histogram wire;
  wire.add_bounds(1);
  wire.add_bounds(2);
  wire.add_counts(1);
  wire.add_counts(1);
  EXPECT_EQ(HistogramFromProto(wire).status().code(), absl::StatusCode::kInvalidArgument);
  wire.add_counts(1);
  EXPECT_TRUE(HistogramFromProto(wire).ok());
  wire.set_bounds(1, 1);  // not increasing
  EXPECT_EQ(HistogramFromProto(wire).status().code(), absl::StatusCode::kInvalidArgument);
  wire.set_bounds(1, std::numeric_limits<double>::infinity());
  EXPECT_EQ(HistogramFromProto(wire).status().code(), absl::StatusCode::kInvalidArgument);
}

// The bound of the first bucket that holds the share asked for; none
// without observations or above the last bound.
TEST(HistogramSnapshot, QuantileBoundIsTheBucketThatReachesTheShare) {
  HistogramSnapshot snapshot;
  snapshot.bounds = {1, 2, 4};
  snapshot.counts = {0, 0, 0, 0};
  EXPECT_FALSE(QuantileBound(snapshot, 0.5).has_value());
  snapshot.counts = {0, 90, 9, 1};
  snapshot.count = 100;
  EXPECT_EQ(QuantileBound(snapshot, 0.5), 2.0);
  EXPECT_EQ(QuantileBound(snapshot, 0.99), 4.0);
  EXPECT_FALSE(QuantileBound(snapshot, 1.0).has_value());
}

TEST(HistogramProto, CountIsTheSumOfTheCounts) {
  proto::Histogram wire;
  wire.add_bounds(1);
  wire.add_counts(2);
  wire.add_counts(3);
  wire.set_count(99);  // a sender's count never contradicts its buckets
  StatusOr<HistogramSnapshot> snapshot = HistogramFromProto(wire);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->count, 5u);
}

TEST(PrometheusNumber, KeepsEveryDigitAndSpellsSpecialValues) {
  EXPECT_EQ(PrometheusNumber(1234567), "1234567");
  EXPECT_EQ(PrometheusNumber(0.5), "0.5");
  EXPECT_EQ(PrometheusNumber(0), "0");
  EXPECT_EQ(PrometheusNumber(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(PrometheusNumber(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(PrometheusNumber(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(EscapeLabelValue, EscapesBackslashQuoteAndNewline) {
  EXPECT_EQ(EscapeLabelValue("plain"), "\"plain\"");
  EXPECT_EQ(EscapeLabelValue(""), "\"\"");
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "\"a\\\\b\\\"c\\nd\"");
  EXPECT_EQ(EscapeLabelValue("tab\tstays"), "\"tab\tstays\"");
}

TEST(EscapeLabelValue, KeepsUtf8AndReplacesStrayBytes) {
  EXPECT_EQ(EscapeLabelValue("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"");
  EXPECT_EQ(EscapeLabelValue("a\xFF-"), "\"a\xEF\xBF\xBD-\"");
  EXPECT_EQ(EscapeLabelValue("\xC3"), "\"\xEF\xBF\xBD\"");  // truncated sequence
  EXPECT_EQ(EscapeLabelValue("\xED\xA0\x80"),               // a UTF-16 surrogate
            "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"");
}

TEST(PrometheusWriter, WritesGaugesAndCountersWithHelpAndType) {
  PrometheusWriter writer;
  writer.Family("eps_epoch", MetricType::kGauge, "Current epoch.");
  writer.Sample(2);
  writer.Family("eps_things_total", MetricType::kCounter, "Things, a \\ and a\nnewline.");
  writer.Sample({{"worker", "3"}, {"state", "a\"b"}}, 1234567);
  writer.Sample({{"worker", "4"}, {"state", "ok"}}, 0.25);
  EXPECT_EQ(writer.text(),
            "# HELP eps_epoch Current epoch.\n"
            "# TYPE eps_epoch gauge\n"
            "eps_epoch 2\n"
            "# HELP eps_things_total Things, a \\\\ and a\\nnewline.\n"
            "# TYPE eps_things_total counter\n"
            "eps_things_total{worker=\"3\",state=\"a\\\"b\"} 1234567\n"
            "eps_things_total{worker=\"4\",state=\"ok\"} 0.25\n");
}

TEST(PrometheusWriter, WritesHistogramsCumulatively) {
  HistogramSnapshot snapshot;
  snapshot.bounds = {0.1, 1};
  snapshot.counts = {2, 0, 3};
  snapshot.count = 5;
  snapshot.sum = 12.5;
  PrometheusWriter writer;
  writer.Family("eps_pull_seconds", MetricType::kHistogram, "Pulls.");
  writer.Histogram({{"server", "0"}}, snapshot);
  writer.Histogram({}, snapshot);
  EXPECT_EQ(writer.text(),
            "# HELP eps_pull_seconds Pulls.\n"
            "# TYPE eps_pull_seconds histogram\n"
            "eps_pull_seconds_bucket{server=\"0\",le=\"0.1\"} 2\n"
            "eps_pull_seconds_bucket{server=\"0\",le=\"1\"} 2\n"
            "eps_pull_seconds_bucket{server=\"0\",le=\"+Inf\"} 5\n"
            "eps_pull_seconds_sum{server=\"0\"} 12.5\n"
            "eps_pull_seconds_count{server=\"0\"} 5\n"
            "eps_pull_seconds_bucket{le=\"0.1\"} 2\n"
            "eps_pull_seconds_bucket{le=\"1\"} 2\n"
            "eps_pull_seconds_bucket{le=\"+Inf\"} 5\n"
            "eps_pull_seconds_sum 12.5\n"
            "eps_pull_seconds_count 5\n");
}

TEST(PrometheusWriter, LatencyHistogramBucketsAreMonotonic) {
  LatencyHistogram histogram;
  for (int ms = 0; ms < 2000; ms += 7) histogram.Observe(absl::Milliseconds(ms));
  PrometheusWriter writer;
  writer.Family("eps_x_seconds", MetricType::kHistogram, "X.");
  writer.Histogram({}, histogram.Snapshot());
  const std::string& text = writer.text();
  EXPECT_THAT(text, HasSubstr("eps_x_seconds_bucket{le=\"0.0001\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("eps_x_seconds_bucket{le=\"13.1072\"} 286\n"));
  EXPECT_THAT(text, HasSubstr("eps_x_seconds_bucket{le=\"+Inf\"} 286\n"));
  EXPECT_THAT(text, HasSubstr("eps_x_seconds_count 286\n"));
  uint64_t previous = 0;
  size_t at = 0;
  int buckets = 0;
  while ((at = text.find("_bucket{", at)) != std::string::npos) {
    const size_t space = text.find("} ", at);
    const uint64_t value = std::stoull(text.substr(space + 2));
    EXPECT_GE(value, previous);
    previous = value;
    ++buckets;
    at = space;
  }
  EXPECT_EQ(buckets, 19);
}

TEST(PrometheusWriterDeathTest, RefusesMisuse) {
  EXPECT_DEATH(
      {
        PrometheusWriter writer;
        writer.Family("eps_records", MetricType::kCounter, "no _total");
      },
      "_total");
  EXPECT_DEATH(
      {
        PrometheusWriter writer;
        writer.Family("eps_records_total", MetricType::kGauge, "a gauge named _total");
      },
      "_total");
  EXPECT_DEATH(
      {
        PrometheusWriter writer;
        writer.Family("eps_a", MetricType::kGauge, "a");
        writer.Family("eps_a", MetricType::kGauge, "again");
      },
      "twice");
  EXPECT_DEATH(
      {
        PrometheusWriter writer;
        writer.Family("eps-a", MetricType::kGauge, "a");
      },
      "metric name");
  EXPECT_DEATH(
      {
        PrometheusWriter writer;
        writer.Family("eps_a", MetricType::kGauge, "a");
        writer.Sample({{"le", "1"}}, 1);
      },
      "label name");
  EXPECT_DEATH(
      {
        PrometheusWriter writer;
        writer.Family("eps_a_seconds", MetricType::kHistogram, "a");
        writer.Sample(1);
      },
      "outside a gauge or counter");
}

}  // namespace
}  // namespace eps
