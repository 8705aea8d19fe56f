// See metrics.h. Rendering is the only place that walks the registry; it holds the registry lock
// so that families are not created under it, and reads values with relaxed loads, which is what a
// scrape needs (each value is exact, the set of values is a near-instant snapshot).
#include "meshtrain/obs/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"

namespace meshtrain::obs {

std::string_view metric_type_name(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

namespace detail {

size_t assign_shard() {
  static std::atomic<size_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed) % kShards;
}

}  // namespace detail

double Counter::value() const {
  double total = 0;
  for (const auto& c : cells_) total += c.value.load(std::memory_order_relaxed);
  return total;
}

// ---- histograms -------------------------------------------------------------------------------

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    MT_CHECK(std::isfinite(bounds_[i]), "histogram bounds must be finite (+Inf is implicit)");
    MT_CHECK(i == 0 || bounds_[i] > bounds_[i - 1], "histogram bounds must increase strictly");
  }
  for (auto& s : shards_) {
    s.counts = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
    for (size_t i = 0; i <= bounds_.size(); ++i) s.counts[i].store(0, std::memory_order_relaxed);
  }
}

void Histogram::observe(double v) {
  if (std::isnan(v)) return;
  // `le` buckets: the first bound >= v.
  const size_t bucket =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  Shard& s = shards_[detail::shard_index()];
  s.counts[bucket].fetch_add(1, std::memory_order_relaxed);
  s.sum.fetch_add(v, std::memory_order_relaxed);
}

HistogramSnapshot Histogram::snapshot() const {
  HistogramSnapshot snap;
  snap.bounds = bounds_;
  snap.counts.assign(bounds_.size() + 1, 0);
  for (const auto& s : shards_) {
    for (size_t i = 0; i <= bounds_.size(); ++i)
      snap.counts[i] += s.counts[i].load(std::memory_order_relaxed);
    snap.sum += s.sum.load(std::memory_order_relaxed);
  }
  for (uint64_t c : snap.counts) snap.count += c;
  return snap;
}

double HistogramSnapshot::quantile(double q) const {
  if (count == 0 || std::isnan(q)) return std::numeric_limits<double>::quiet_NaN();
  q = std::clamp(q, 0.0, 1.0);
  const double rank = q * static_cast<double>(count);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const uint64_t before = cumulative;
    cumulative += counts[i];
    if (static_cast<double>(cumulative) < rank || counts[i] == 0) continue;
    if (i == bounds.size())
      return bounds.empty() ? std::numeric_limits<double>::quiet_NaN() : bounds.back();
    const double upper = bounds[i];
    double lower = i == 0 ? 0.0 : bounds[i - 1];
    if (i == 0 && upper <= 0) return upper;
    const double within = (rank - static_cast<double>(before)) / static_cast<double>(counts[i]);
    return lower + (upper - lower) * within;
  }
  return bounds.empty() ? std::numeric_limits<double>::quiet_NaN() : bounds.back();
}

std::vector<double> exponential_buckets(double start, double factor, size_t count) {
  MT_CHECK(start > 0 && factor > 1 && count > 0, "exponential_buckets: start > 0, factor > 1");
  std::vector<double> b(count);
  double v = start;
  for (size_t i = 0; i < count; ++i, v *= factor) b[i] = v;
  return b;
}

std::vector<double> linear_buckets(double start, double width, size_t count) {
  MT_CHECK(width > 0 && count > 0, "linear_buckets: width > 0");
  std::vector<double> b(count);
  for (size_t i = 0; i < count; ++i) b[i] = start + width * static_cast<double>(i);
  return b;
}

std::vector<double> latency_buckets() {
  return exponential_buckets(0.0005, 1.5, 30);
}

// ---- names and text format --------------------------------------------------------------------

bool valid_metric_name(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}

bool valid_label_name(std::string_view name) {
  if (name.empty() || name.starts_with("__")) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

std::string escape_label_value(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

// ---- registry ---------------------------------------------------------------------------------

struct Registry::Family {
  std::string name;
  std::string help;
  MetricType type;
  std::vector<std::string> label_names;
  std::vector<double> bounds;
  // Keyed by label values in label_names order; node-based maps keep references stable.
  std::map<std::vector<std::string>, std::unique_ptr<Counter>> counters;
  std::map<std::vector<std::string>, std::unique_ptr<Gauge>> gauges;
  std::map<std::vector<std::string>, std::unique_ptr<Histogram>> histograms;
};

Registry::Registry(Labels const_labels) {
  set_const_labels(std::move(const_labels));
}

Registry::~Registry() = default;

void Registry::set_const_labels(Labels labels) {
  for (const auto& [k, v] : labels)
    if (!valid_label_name(k)) MT_THROW(ValueError, "metrics: invalid label name '", k, "'");
  std::lock_guard lock(mu_);
  const_labels_ = std::move(labels);
}

Labels Registry::const_labels() const {
  std::lock_guard lock(mu_);
  return const_labels_;
}

Registry::Family& Registry::family(std::string_view name, std::string_view help, MetricType type,
                                   const Labels& labels, const std::vector<double>* bounds) {
  auto it = families_.find(name);
  if (it != families_.end()) {
    Family& f = *it->second;
    if (f.type != type)
      MT_THROW(ValueError, "metrics: ", name, " is a ", metric_type_name(f.type), ", not a ",
               metric_type_name(type));
    if (bounds != nullptr && *bounds != f.bounds)
      MT_THROW(ValueError, "metrics: ", name, " was created with other buckets");
    return f;
  }
  if (!valid_metric_name(name)) MT_THROW(ValueError, "metrics: invalid metric name '", name, "'");
  const bool total = name.ends_with("_total");
  if (type == MetricType::kCounter && !total)
    MT_THROW(ValueError, "metrics: counter ", name, " must end in _total");
  if (type != MetricType::kCounter && total)
    MT_THROW(ValueError, "metrics: only counters end in _total: ", name);
  if (type == MetricType::kHistogram &&
      (name.ends_with("_bucket") || name.ends_with("_sum") || name.ends_with("_count")))
    MT_THROW(ValueError, "metrics: histogram ", name, " must not end in _bucket, _sum or _count");
  auto f = std::make_unique<Family>();
  f->name = std::string(name);
  f->help = std::string(help);
  f->type = type;
  for (const auto& [k, v] : labels) {
    if (!valid_label_name(k)) MT_THROW(ValueError, "metrics: invalid label name '", k, "'");
    if (type == MetricType::kHistogram && k == "le")
      MT_THROW(ValueError, "metrics: histogram ", name, " cannot use the label 'le'");
    for (const auto& [ck, cv] : const_labels_)
      if (ck == k)
        MT_THROW(ValueError, "metrics: label '", k, "' of ", name, " is a constant label");
    if (std::find(f->label_names.begin(), f->label_names.end(), k) != f->label_names.end())
      MT_THROW(ValueError, "metrics: label '", k, "' repeated in ", name);
    f->label_names.push_back(k);
  }
  if (bounds != nullptr) f->bounds = *bounds;
  Family& ref = *f;
  families_.emplace(f->name, std::move(f));
  return ref;
}

std::vector<std::string> Registry::label_values(const Family& f, const Labels& labels) {
  if (labels.size() != f.label_names.size())
    MT_THROW(ValueError, "metrics: ", f.name, " takes ", f.label_names.size(), " labels, got ",
             labels.size());
  std::vector<std::string> values(f.label_names.size());
  std::vector<bool> seen(f.label_names.size(), false);
  for (const auto& [k, v] : labels) {
    auto pos = std::find(f.label_names.begin(), f.label_names.end(), k);
    if (pos == f.label_names.end())
      MT_THROW(ValueError, "metrics: ", f.name, " has no label '", k, "'");
    const size_t i = static_cast<size_t>(pos - f.label_names.begin());
    if (seen[i]) MT_THROW(ValueError, "metrics: label '", k, "' repeated in ", f.name);
    seen[i] = true;
    values[i] = v;
  }
  return values;
}

Counter& Registry::counter(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard lock(mu_);
  Family& f = family(name, help, MetricType::kCounter, labels, nullptr);
  auto& slot = f.counters[label_values(f, labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::gauge(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard lock(mu_);
  Family& f = family(name, help, MetricType::kGauge, labels, nullptr);
  auto& slot = f.gauges[label_values(f, labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& Registry::histogram(std::string_view name, std::string_view help,
                               std::vector<double> bounds, const Labels& labels) {
  // Validate the bounds before the family records them.
  Histogram probe(bounds);
  (void)probe;
  std::lock_guard lock(mu_);
  Family& f = family(name, help, MetricType::kHistogram, labels, &bounds);
  auto& slot = f.histograms[label_values(f, labels)];
  if (!slot) slot = std::make_unique<Histogram>(f.bounds);
  return *slot;
}

namespace {

// `{a="1",b="2"` without the closing brace, or "" when there are no labels at all; `extra` is
// appended last (the histogram's `le`).
std::string label_block(const Labels& const_labels, const std::vector<std::string>& names,
                        const std::vector<std::string>& values, std::string_view extra_name = {},
                        std::string_view extra_value = {}) {
  std::string out;
  auto add = [&](std::string_view k, std::string_view v) {
    out += out.empty() ? "{" : ",";
    out.append(k).append("=\"").append(escape_label_value(v)).append("\"");
  };
  for (const auto& [k, v] : const_labels) add(k, v);
  for (size_t i = 0; i < names.size(); ++i) add(names[i], values[i]);
  if (!extra_name.empty()) add(extra_name, extra_value);
  if (!out.empty()) out += "}";
  return out;
}

}  // namespace

std::string Registry::render() const {
  std::lock_guard lock(mu_);
  std::string out;
  out.reserve(4096);
  for (const auto& [name, fp] : families_) {
    const Family& f = *fp;
    if (f.counters.empty() && f.gauges.empty() && f.histograms.empty()) continue;
    out.append("# HELP ").append(name).append(" ").append(escape_help(f.help)).append("\n");
    out.append("# TYPE ").append(name).append(" ").append(metric_type_name(f.type)).append("\n");
    for (const auto& [values, c] : f.counters)
      out.append(name)
          .append(label_block(const_labels_, f.label_names, values))
          .append(" ")
          .append(format_metric_value(c->value()))
          .append("\n");
    for (const auto& [values, g] : f.gauges)
      out.append(name)
          .append(label_block(const_labels_, f.label_names, values))
          .append(" ")
          .append(format_metric_value(g->value()))
          .append("\n");
    for (const auto& [values, h] : f.histograms) {
      const HistogramSnapshot snap = h->snapshot();
      uint64_t cumulative = 0;
      for (size_t i = 0; i <= snap.bounds.size(); ++i) {
        cumulative += snap.counts[i];
        const std::string le =
            i < snap.bounds.size() ? format_metric_value(snap.bounds[i]) : "+Inf";
        out.append(name)
            .append("_bucket")
            .append(label_block(const_labels_, f.label_names, values, "le", le))
            .append(" ")
            .append(std::to_string(cumulative))
            .append("\n");
      }
      const std::string labels = label_block(const_labels_, f.label_names, values);
      out.append(name).append("_sum").append(labels).append(" ");
      out.append(format_metric_value(snap.sum)).append("\n");
      out.append(name).append("_count").append(labels).append(" ");
      out.append(std::to_string(snap.count)).append("\n");
    }
  }
  return out;
}

Registry& default_registry() {
  static Registry registry(default_labels_from_env());
  return registry;
}

Labels default_labels_from_env() {
  auto env = [](Env id, std::string fallback) { return env_value(id).value_or(fallback); };
  const char* rank = std::getenv("RANK");
  std::string host = "localhost";
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) == 0 && buf[0] != '\0') host = buf;
  return {{"job", env(Env::job_id, "meshtrain")},
          {"rank", rank != nullptr && *rank != '\0' ? rank : "0"},
          {"node", env(Env::node_name, host)}};
}

}  // namespace meshtrain::obs
