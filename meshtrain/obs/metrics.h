// Counters, gauges and histograms with labels, rendered in the Prometheus text exposition format
// (version 0.0.4). Updates are cheap enough for every step and every collective: a metric is looked
// up once (creation takes a lock) and the reference kept; after that an update is one relaxed
// atomic add on a per-thread shard (counters, histograms) or one atomic store (gauges), with no
// lock and no allocation. A scrape sums the shards.
//
// Naming follows Prometheus conventions, which the registry enforces where it can: base units in
// the name (`_seconds`, `_bytes`, `_ratio`), counters end in `_total`, nothing else does. Every
// series carries the registry's constant labels (job, rank, node by default) before its own.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshtrain::obs {

// Ordered (name, value) pairs; the order given at a family's creation is the order rendered.
using Labels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType { kCounter, kGauge, kHistogram };
std::string_view metric_type_name(MetricType type);  // "counter", "gauge", "histogram"

namespace detail {

inline constexpr size_t kShards = 8;
size_t assign_shard();
// A thread keeps its shard for life, so concurrent writers rarely share a cache line.
inline size_t shard_index() {
  static thread_local const size_t index = assign_shard();
  return index;
}

struct alignas(64) PaddedDouble {
  std::atomic<double> value{0.0};
};

}  // namespace detail

// Monotonic; inc() with a negative or non-finite amount is ignored (a counter never goes down).
class Counter {
 public:
  void inc(double amount = 1.0) {
    if (!(amount >= 0.0) || amount > 1e300) return;
    cells_[detail::shard_index()].value.fetch_add(amount, std::memory_order_relaxed);
  }
  double value() const;

 private:
  std::array<detail::PaddedDouble, detail::kShards> cells_;
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void inc(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void dec(double amount = 1.0) { value_.fetch_add(-amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A consistent-enough copy of a histogram: `counts[i]` observations fell in (bounds[i-1],
// bounds[i]]; the last entry counts those above every bound (the +Inf bucket).
struct HistogramSnapshot {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // bounds.size() + 1 entries, not cumulative
  double sum = 0;
  uint64_t count = 0;

  // The q-quantile (0 <= q <= 1) estimated the way PromQL's histogram_quantile() does: linear
  // interpolation inside the bucket that holds the rank, the first bucket starting at 0 (when its
  // bound is positive), and the highest finite bound when the rank lands in the +Inf bucket.
  // NaN when there are no observations.
  double quantile(double q) const;
};

class Histogram {
 public:
  // `bounds`: finite, strictly increasing upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);

  void observe(double v);
  HistogramSnapshot snapshot() const;
  double quantile(double q) const { return snapshot().quantile(q); }
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  struct alignas(64) Shard {
    std::unique_ptr<std::atomic<uint64_t>[]> counts;
    std::atomic<double> sum{0.0};
  };
  std::vector<double> bounds_;
  std::array<Shard, detail::kShards> shards_;
};

// `count` bounds: start, start*factor, start*factor^2, ...
std::vector<double> exponential_buckets(double start, double factor, size_t count);
// `count` bounds: start, start+width, ...
std::vector<double> linear_buckets(double start, double width, size_t count);
// 0.5 ms .. ~64 s in steps of x1.5: fine enough for readable p50/p95/p99 of step and
// collective latencies on anything from a laptop to a cluster.
std::vector<double> latency_buckets();

class Registry {
 public:
  explicit Registry(Labels const_labels = {});
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  ~Registry();

  // Get-or-create. The same (name, labels) returns the same object, which lives as long as the
  // registry; keep the reference for hot paths. A name reused with another type, other label
  // names or other buckets, or a name or label that breaks the naming rules, is a ValueError.
  Counter& counter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels = {});
  Histogram& histogram(std::string_view name, std::string_view help, std::vector<double> bounds,
                       const Labels& labels = {});

  // Labels added to every series at render time (job, rank, node).
  void set_const_labels(Labels labels);
  Labels const_labels() const;

  // The whole registry in the text exposition format, families sorted by name.
  std::string render() const;

 private:
  struct Family;
  Family& family(std::string_view name, std::string_view help, MetricType type,
                 const Labels& labels, const std::vector<double>* bounds);
  static std::vector<std::string> label_values(const Family& f, const Labels& labels);

  mutable std::mutex mu_;
  Labels const_labels_;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_;
};

// The process-wide registry that the trainer, the metrics endpoint and other layers share.
Registry& default_registry();

// job (MESHTRAIN_JOB_ID, else "meshtrain"), rank (RANK, else 0), node (MESHTRAIN_NODE_NAME, else
// the host name). Prometheus attaches its own `job`/`instance` target labels on scrape: scrape
// with `honor_labels: true` to keep ours (otherwise ours become `exported_job`).
Labels default_labels_from_env();

// Text-format helpers, exposed for tests and for tools that write the format themselves.
std::string format_metric_value(double v);         // "1", "0.25", "+Inf", "NaN"
std::string escape_label_value(std::string_view);  // \\, \", \n
std::string escape_help(std::string_view);         // \\, \n
bool valid_metric_name(std::string_view name);
bool valid_label_name(std::string_view name);

}  // namespace meshtrain::obs
