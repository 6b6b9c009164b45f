#include "core/metrics.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace eps {
namespace {

constexpr std::array<double, LatencyHistogram::kNumBounds> MakeBounds() {
  std::array<double, LatencyHistogram::kNumBounds> bounds{};
  // Doubling is exact, so each bound prints as its decimal (0.0002, ...).
  double bound = 1e-4;
  for (double& b : bounds) {
    b = bound;
    bound *= 2;
  }
  return bounds;
}

constexpr std::array<double, LatencyHistogram::kNumBounds> kBounds = MakeBounds();

bool ValidMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// Label names may not hold ':' and those starting "__" are reserved.
bool ValidLabelName(absl::string_view name) {
  return ValidMetricName(name) && name.find(':') == absl::string_view::npos &&
         !absl::StartsWith(name, "__");
}

// Length of the well-formed UTF-8 sequence at the start of `text`; 0 when
// it does not start with one.
size_t Utf8SequenceLength(absl::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;  // range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

// A bucket bound as an `le` label value. Labels are compared as text, so
// the spelling is fixed: plain decimals as other clients write them
// ("0.0001", not the shorter "1e-04"), shortest round trip.
std::string BoundText(double bound) {
  char buffer[512];  // room for any finite double in fixed notation
  const std::to_chars_result result =
      std::to_chars(buffer, buffer + sizeof(buffer), bound, std::chars_format::fixed);
  CHECK(result.ec == std::errc());
  return std::string(buffer, result.ptr);
}

}  // namespace

void HistogramToProto(const HistogramSnapshot& snapshot, proto::Histogram* out) {
  out->Clear();
  out->mutable_bounds()->Add(snapshot.bounds.begin(), snapshot.bounds.end());
  out->mutable_counts()->Add(snapshot.counts.begin(), snapshot.counts.end());
  out->set_count(snapshot.count);
  out->set_sum(snapshot.sum);
}

StatusOr<HistogramSnapshot> HistogramFromProto(const proto::Histogram& histogram) {
  if (histogram.counts_size() != histogram.bounds_size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("histogram has ", histogram.counts_size(),
                                                   " counts for ", histogram.bounds_size(),
                                                   " bounds (want one more)"));
  }
  HistogramSnapshot snapshot;
  for (int i = 0; i < histogram.bounds_size(); ++i) {
    const double bound = histogram.bounds(i);
    if (!std::isfinite(bound) || (i > 0 && bound <= histogram.bounds(i - 1))) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram bound ", i, " (", bound, ") is not finite and increasing"));
    }
    snapshot.bounds.push_back(bound);
  }
  snapshot.counts.assign(histogram.counts().begin(), histogram.counts().end());
  // The count is the counts' sum by definition: exposed _count and the +Inf
  // bucket must agree.
  for (uint64_t count : snapshot.counts) snapshot.count += count;
  snapshot.sum = histogram.sum();
  return snapshot;
}

std::optional<double> QuantileBound(const HistogramSnapshot& snapshot, double share) {
  uint64_t below = 0;
  for (size_t i = 0; i < snapshot.bounds.size() && i < snapshot.counts.size(); ++i) {
    below += snapshot.counts[i];
    if (below > 0 && static_cast<double>(below) >= share * static_cast<double>(snapshot.count)) {
      return snapshot.bounds[i];
    }
  }
  return std::nullopt;
}

std::span<const double> LatencyHistogram::Bounds() { return kBounds; }

void LatencyHistogram::Observe(absl::Duration duration) {
  const int64_t nanos = std::max<int64_t>(0, absl::ToInt64Nanoseconds(duration));
  // Bucket i holds (first * 2^(i-1), first * 2^i]: for nanos above the first
  // bound, i is the bit width of (nanos - 1) / first.
  size_t bucket = 0;
  if (nanos > kFirstBoundNanos) {
    bucket = std::min<size_t>(
        kNumBounds, std::bit_width(static_cast<uint64_t>((nanos - 1) / kFirstBoundNanos)));
  }
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(static_cast<uint64_t>(nanos), std::memory_order_relaxed);
}

namespace {

HistogramSnapshot SnapshotOf(std::span<const double> bounds,
                             std::span<const std::atomic<uint64_t>> buckets, double sum) {
  HistogramSnapshot snapshot;
  snapshot.bounds.assign(bounds.begin(), bounds.end());
  snapshot.counts.reserve(buckets.size());
  for (const std::atomic<uint64_t>& bucket : buckets) {
    snapshot.counts.push_back(bucket.load(std::memory_order_relaxed));
    snapshot.count += snapshot.counts.back();
  }
  snapshot.sum = sum;
  return snapshot;
}

constexpr std::array<double, CountHistogram::kNumBounds> MakeCountBounds() {
  std::array<double, CountHistogram::kNumBounds> bounds{};
  for (int i = 1; i < CountHistogram::kNumBounds; ++i) bounds[i] = static_cast<double>(1 << (i - 1));
  return bounds;
}

constexpr std::array<double, CountHistogram::kNumBounds> kCountBounds = MakeCountBounds();

}  // namespace

HistogramSnapshot LatencyHistogram::Snapshot() const {
  return SnapshotOf(kBounds, buckets_,
                    static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) / 1e9);
}

std::span<const double> CountHistogram::Bounds() { return kCountBounds; }

void CountHistogram::Observe(uint64_t value) {
  // Bucket 0 holds 0; bucket i >= 1 holds (2^(i-2), 2^(i-1)]: 1 + the bit
  // width of value - 1.
  const size_t bucket =
      value == 0 ? 0 : std::min<size_t>(kNumBounds, 1 + std::bit_width(value - 1));
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

HistogramSnapshot CountHistogram::Snapshot() const {
  return SnapshotOf(kCountBounds, buckets_,
                    static_cast<double>(sum_.load(std::memory_order_relaxed)));
}

std::string PrometheusNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  CHECK(result.ec == std::errc());
  return std::string(buffer, result.ptr);
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size() + 2);
  out += '"';
  while (!value.empty()) {
    const size_t length = Utf8SequenceLength(value);
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD in place of the stray byte
      value.remove_prefix(1);
      continue;
    }
    switch (value[0]) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out.append(value.data(), length);
    }
    value.remove_prefix(length);
  }
  out += '"';
  return out;
}

void PrometheusWriter::Family(absl::string_view name, MetricType type, absl::string_view help) {
  CHECK(ValidMetricName(name)) << "metric name '" << name << "'";
  CHECK(families_.insert(std::string(name)).second) << "metric family " << name << " twice";
  CHECK_EQ(type == MetricType::kCounter, absl::EndsWith(name, "_total"))
      << name << ": counters, and only counters, end in _total";
  family_ = std::string(name);
  type_ = type;
  std::string escaped_help;
  for (char c : help) {
    if (c == '\\') {
      escaped_help += "\\\\";
    } else if (c == '\n') {
      escaped_help += "\\n";
    } else {
      escaped_help += c;
    }
  }
  const char* type_name = type == MetricType::kGauge     ? "gauge"
                          : type == MetricType::kCounter ? "counter"
                                                         : "histogram";
  absl::StrAppend(&out_, "# HELP ", name, " ", escaped_help, "\n# TYPE ", name, " ", type_name,
                  "\n");
}

void PrometheusWriter::AppendSeries(absl::string_view name, const MetricLabels& labels,
                                    const std::string* le) {
  out_.append(name.data(), name.size());
  if (!labels.empty() || le != nullptr) {
    out_ += '{';
    bool first = true;
    for (const auto& [label, value] : labels) {
      CHECK(ValidLabelName(label) && label != "le") << name << ": label name '" << label << "'";
      if (!first) out_ += ',';
      first = false;
      absl::StrAppend(&out_, label, "=", EscapeLabelValue(value));
    }
    if (le != nullptr) absl::StrAppend(&out_, first ? "" : ",", "le=\"", *le, "\"");
    out_ += '}';
  }
  out_ += ' ';
}

void PrometheusWriter::Sample(const MetricLabels& labels, double value) {
  CHECK(!family_.empty() && type_ != MetricType::kHistogram)
      << "Sample outside a gauge or counter family (" << family_ << ")";
  AppendSeries(family_, labels, nullptr);
  absl::StrAppend(&out_, PrometheusNumber(value), "\n");
}

void PrometheusWriter::Histogram(const MetricLabels& labels, const HistogramSnapshot& histogram) {
  CHECK(!family_.empty() && type_ == MetricType::kHistogram)
      << "Histogram outside a histogram family (" << family_ << ")";
  CHECK_EQ(histogram.counts.size(), histogram.bounds.size() + 1) << family_;
  const std::string bucket = family_ + "_bucket";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < histogram.counts.size(); ++i) {
    cumulative += histogram.counts[i];
    const std::string le = i < histogram.bounds.size() ? BoundText(histogram.bounds[i]) : "+Inf";
    AppendSeries(bucket, labels, &le);
    absl::StrAppend(&out_, cumulative, "\n");
  }
  AppendSeries(family_ + "_sum", labels, nullptr);
  absl::StrAppend(&out_, PrometheusNumber(histogram.sum), "\n");
  AppendSeries(family_ + "_count", labels, nullptr);
  absl::StrAppend(&out_, cumulative, "\n");
}

}  // namespace eps
