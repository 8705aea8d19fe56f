// What observability costs a training step: nanoseconds per metric update (counter, gauge,
// histogram; one thread and eight threads updating the same metric), the whole per-step
// instrumentation (PhaseClock marks plus TrainingMetrics::on_step, tracing off and on), and that
// cost as a fraction of one step of the default GPT (4 layers, width 128, T=128, B=8) on this
// machine. Output: one line per measurement.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/obs/metrics.h"
#include "meshtrain/obs/phase_clock.h"
#include "meshtrain/obs/trace.h"
#include "meshtrain/obs/training_metrics.h"
#include "meshtrain/tensor/random.h"

using namespace meshtrain;
using Clock = std::chrono::steady_clock;

namespace {

template <typename Fn>
double ns_per_op(int threads, int64_t iters, Fn fn) {
  std::vector<std::thread> ts;
  const auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (int64_t i = 0; i < iters; ++i) fn(t, i);
    });
  for (auto& th : ts) th.join();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return s * 1e9 / static_cast<double>(iters);  // wall time per update per thread
}

double gpt_step_seconds(int steps) {
  nn::GPTConfig gc;  // the default model
  nn::GPT model(gc);
  const int64_t B = 8, T = gc.block_size;
  Generator gen(1);
  std::vector<int32_t> x(static_cast<size_t>(B * T)), y(x.size());
  for (auto& v : x) v = static_cast<int32_t>(gen.below(static_cast<uint64_t>(gc.vocab_size)));
  for (auto& v : y) v = static_cast<int32_t>(gen.below(static_cast<uint64_t>(gc.vocab_size)));
  std::vector<double> times;
  for (int s = 0; s < steps + 1; ++s) {
    const auto t0 = Clock::now();
    Tensor loss = model.loss(Tensor::from_vector(x, {B, T}), Tensor::from_vector(y, {B, T}));
    autograd::backward(loss);
    if (s > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"metrics update overhead"};
  int64_t iters = 5'000'000;
  int gpt_steps = 5;
  app.add_option("--iters", iters, "updates per thread per measurement");
  app.add_option("--gpt-steps", gpt_steps, "GPT steps timed for the comparison (0 = skip)");
  CLI11_PARSE(app, argc, argv);

  obs::Registry reg({{"job", "bench"}, {"rank", "0"}, {"node", "n"}});
  obs::Counter& c = reg.counter("bench_ops_total", "ops", {{"op", "all_reduce"}});
  obs::Gauge& g = reg.gauge("bench_value", "value");
  obs::Histogram& h = reg.histogram("bench_seconds", "latency", obs::latency_buckets());

  for (int threads : {1, 8}) {
    std::printf("counter.inc        threads=%d  %6.2f ns/update\n", threads,
                ns_per_op(threads, iters, [&](int, int64_t) { c.inc(); }));
    std::printf("gauge.set          threads=%d  %6.2f ns/update\n", threads,
                ns_per_op(threads, iters, [&](int, int64_t i) { g.set(static_cast<double>(i)); }));
    std::printf("histogram.observe  threads=%d  %6.2f ns/update\n", threads,
                ns_per_op(threads, iters, [&](int, int64_t i) {
                  h.observe(1e-3 * static_cast<double>(i & 1023));
                }));
  }
  // Looking a metric up by name each time (what hot paths should not do).
  std::printf("registry lookup+inc threads=1  %6.2f ns/update\n",
              ns_per_op(1, iters / 10, [&](int, int64_t) {
                reg.counter("bench_ops_total", "ops", {{"op", "all_reduce"}}).inc();
              }));

  obs::TrainingMetricsOptions to;
  to.tokens_per_step = 1024;
  to.samples_per_step = 8;
  to.flops_per_token = 1e6;
  to.peak_flops = 1e12;
  obs::TrainingMetrics tm(reg, to);
  auto per_step = [&](int64_t n) {
    nlohmann::json row;
    const auto t0 = Clock::now();
    for (int64_t s = 0; s < n; ++s) {
      obs::PhaseClock phases;
      for (obs::Phase p : {obs::Phase::kData, obs::Phase::kForward, obs::Phase::kBackward,
                           obs::Phase::kComm, obs::Phase::kOptimizer})
        phases.end(p);
      tm.on_step({.step = s, .loss = 1.0, .lr = 1e-3, .grad_norm = 1, .step_s = 0.1}, phases, row);
    }
    return std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(n);
  };
  const int64_t n = 20000;
  const double off = per_step(n);
  obs::TraceRecorder::global().start(0);
  const double on = per_step(n);
  obs::TraceRecorder::global().stop();
  std::printf("per-step instrumentation (5 phases + on_step), trace off: %8.2f us\n", off * 1e6);
  std::printf("per-step instrumentation (5 phases + on_step), trace on:  %8.2f us\n", on * 1e6);
  if (gpt_steps > 0) {
    const double step = gpt_step_seconds(gpt_steps);
    std::printf("default GPT forward+backward step (B=8, T=128):            %8.2f ms\n",
                step * 1e3);
    std::printf("instrumentation / step: %.4f%% (trace off), %.4f%% (trace on)\n",
                100.0 * off / step, 100.0 * on / step);
  }
  return 0;
}
