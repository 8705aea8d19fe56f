// See collective_metrics.h. A handful of operation names exist, so a short vector searched under
// an uncontended lock is as fast as anything fancier.
#include "meshtrain/obs/collective_metrics.h"

namespace meshtrain::obs {

CollectiveMetrics::OpMetrics& CollectiveMetrics::op(std::string_view name) {
  std::lock_guard lock(mu_);
  for (auto& [n, m] : ops_)
    if (n == name) return *m;
  const Labels labels{{"op", std::string(name)}};
  auto m = std::make_unique<OpMetrics>();
  m->count = &registry_.counter("meshtrain_collectives_total", "Collectives issued.", labels);
  m->bytes = &registry_.counter("meshtrain_collective_bytes_total",
                                "Payload bytes this rank contributed to collectives.", labels);
  m->duration = &registry_.histogram("meshtrain_collective_duration_seconds",
                                     "Latency of a collective from issue to completion.",
                                     latency_buckets(), labels);
  m->failures =
      &registry_.counter("meshtrain_collective_failures_total", "Collectives that failed.", labels);
  ops_.emplace_back(std::string(name), std::move(m));
  return *ops_.back().second;
}

void CollectiveMetrics::record(std::string_view op_name, int64_t bytes, double seconds, bool ok) {
  OpMetrics& m = op(op_name);
  m.count->inc();
  m.bytes->inc(static_cast<double>(bytes));
  m.duration->observe(seconds);
  if (!ok) m.failures->inc();
}

}  // namespace meshtrain::obs
