// calibrate(): this machine measured as a ClusterSpec. Ranks are threads of this process, each
// with its own member of a shm (intra) and a tcp (inter, over loopback) group, as `meshrun`
// processes would have; GEMM FLOP/s is what one rank reaches on a square f32 product while every
// rank multiplies at once (ranks share the cores and the memory bandwidth as they do training).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include <ostream>
#include <thread>
#include <vector>

#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/plan/cluster.h"
#include "meshtrain/tensor/cpu/adamw.h"
#include "meshtrain/tensor/cpu/gelu.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/cpu/layer_norm.h"
#include "meshtrain/util/error.h"

namespace meshtrain::plan {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct GemmRates {
  double square = 0;  // FLOP/s of a 1024^3 product
  double thin = 0;    // FLOP/s of a 64 x 1024 x 1024 product
};

// One rank's f32 GEMM FLOP/s with `threads` threads each, `ranks` ranks multiplying at once, for
// a square and a thin product, interleaved so that both see the same load: per repetition the
// slowest rank's time, then the median. A thin repetition runs 16 products (the square's work).
GemmRates gemm_rates(int threads, int ranks) {
  constexpr int kReps = 7;
  constexpr int64_t n = 1024, thin_m = 64, inner = n / thin_m;
  std::vector<std::vector<std::pair<double, double>>> t(static_cast<size_t>(ranks));
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> workers;
  for (int r = 0; r < ranks; ++r) {
    workers.emplace_back([&, r] {
      try {
        std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size());
        omp_set_num_threads(threads);  // this thread's OpenMP setting only
        cpu::matmul(c.data(), a.data(), b.data(), n, n, n, false, false);  // warm-up
        for (int i = 0; i < kReps; ++i) {
          auto t0 = Clock::now();
          cpu::matmul(c.data(), a.data(), b.data(), n, n, n, false, false);
          const double square = seconds_since(t0);
          t0 = Clock::now();
          for (int64_t j = 0; j < inner; ++j)
            cpu::matmul(c.data(), a.data(), b.data(), thin_m, n, n, false, false);
          t[static_cast<size_t>(r)].emplace_back(square, seconds_since(t0));
        }
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& w : workers) w.join();
  if (first) std::rethrow_exception(first);
  std::vector<double> square(kReps, 0.0), thin(kReps, 0.0);
  for (const auto& rank : t)
    for (size_t i = 0; i < rank.size(); ++i) {
      square[i] = std::max(square[i], rank[i].first);
      thin[i] = std::max(thin[i], rank[i].second);
    }
  std::sort(square.begin(), square.end());
  std::sort(thin.begin(), thin.end());
  const double flops = 2.0 * static_cast<double>(n * n * n);
  return {flops / square[kReps / 2], flops / thin[kReps / 2]};
}

// One rank's element-wise bandwidth with `threads` threads each while `ranks` ranks run at once:
// the project's LayerNorm (1024 tokens x 768, forward and backward), GELU (1024 x 3072, forward
// and backward) and AdamW (2^20 parameters) kernels, training-sized arrays that do not fit a
// core's cache, bytes counted as the time model counts them (LayerNorm 2 + 3 elements per
// element, GELU 2 + 3, AdamW 7 floats per parameter). Per repetition the slowest rank's time,
// then the median.
double elementwise_bandwidth(int threads, int ranks) {
  constexpr int kReps = 5;
  constexpr int64_t N = 1024, C = 768, H = 4 * C, P = int64_t{1} << 20;
  const double bytes = 4.0 * static_cast<double>(5 * N * C + 5 * N * H + 7 * P);
  std::vector<std::vector<double>> t(static_cast<size_t>(ranks));
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> workers;
  for (int r = 0; r < ranks; ++r) {
    workers.emplace_back([&, r] {
      try {
        std::vector<float> x(static_cast<size_t>(N * C), 0.5f), y(x.size()), dy(x.size(), 0.1f),
            dx(x.size()), w(static_cast<size_t>(C), 1.0f), b(w.size(), 0.0f), dw(w.size()),
            db(w.size()), mean(static_cast<size_t>(N)), rstd(mean.size());
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) * 0.01f;
        std::vector<float> h(static_cast<size_t>(N * H), 0.3f), g(h.size()), dg(h.size(), 0.1f),
            dh(h.size());
        std::vector<float> p(static_cast<size_t>(P), 0.1f), grad(p.size(), 0.01f), m(p.size()),
            v(p.size());
        omp_set_num_threads(threads);
        int64_t step = 0;
        auto once = [&] {
          cpu::layer_norm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                                  N, C, 1e-5f);
          cpu::layer_norm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                   mean.data(), rstd.data(), N, C);
          cpu::gelu_forward(g.data(), h.data(), N * H);
          cpu::gelu_backward(dh.data(), h.data(), dg.data(), N * H);
          cpu::adamw_step(p.data(), grad.data(), m.data(), v.data(), P, 1e-4f, 0.9f, 0.95f, 1e-8f,
                          0.1f, ++step);
        };
        once();  // warm-up: pages touched, code loaded
        for (int i = 0; i < kReps; ++i) {
          const auto t0 = Clock::now();
          once();
          t[static_cast<size_t>(r)].push_back(seconds_since(t0));
        }
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& w : workers) w.join();
  if (first) std::rethrow_exception(first);
  std::vector<double> slowest(kReps, 0.0);
  for (const auto& rank : t)
    for (size_t i = 0; i < rank.size(); ++i) slowest[i] = std::max(slowest[i], rank[i]);
  std::sort(slowest.begin(), slowest.end());
  return bytes / slowest[kReps / 2];
}

// This process's resident memory now (VmRSS), in bytes; 0 when /proc cannot say.
double resident_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string key; in >> key;) {
    if (key == "VmRSS:") {
      double kib = 0;
      in >> kib;
      return kib * 1024.0;
    }
    in.ignore(1 << 16, '\n');
  }
  return 0;
}

// Bus bandwidth and per-step latency of all-reduce on `ranks` threads over `backend`.
Link measure_all_reduce(const std::string& backend, int ranks) {
  auto store = std::make_shared<comm::HashStore>();
  store->set_timeout(std::chrono::seconds(60));
  const size_t big = size_t{4} << 20;  // floats: 16 MiB
  std::vector<double> big_s(static_cast<size_t>(ranks)), small_s(static_cast<size_t>(ranks));
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::ProcessGroupOptions o;
        o.name = "calibrate-" + backend;
        o.timeout = std::chrono::seconds(60);
        o.token = "calibrate";
        o.address = "127.0.0.1";
        auto pg = comm::make_process_group(backend, store, r, ranks, o);
        std::vector<float> buf(big, 1.0f), one(1, 1.0f);
        auto time_it = [&](std::vector<float>& v, int reps) {
          pg->all_reduce(v.data(), v.size(), DType::f32)->wait();  // warm-up
          pg->barrier()->wait();
          const auto t0 = Clock::now();
          for (int i = 0; i < reps; ++i) pg->all_reduce(v.data(), v.size(), DType::f32)->wait();
          return seconds_since(t0) / reps;
        };
        big_s[static_cast<size_t>(r)] = time_it(buf, 5);
        small_s[static_cast<size_t>(r)] = time_it(one, 200);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
  const double n = ranks;
  const double tb = *std::max_element(big_s.begin(), big_s.end());
  const double ts = *std::max_element(small_s.begin(), small_s.end());
  Link l;
  l.latency = ts / (2 * (n - 1));
  l.bandwidth = 2 * (n - 1) / n * static_cast<double>(big * sizeof(float)) /
                std::max(tb - 2 * (n - 1) * l.latency, 1e-9);
  return l;
}

// What a training rank holds beyond this process's start-up footprint and the memory model's
// tensors and buffers: its threads' stacks and malloc arenas (data loader, collectives, OpenMP),
// the mapped dataset, BLAS work space and the heap's slack between differently sized activations.
// Measured as the peak resident memory of a rank (shared buckets at its share) less the
// calibrated start-up footprint less estimate_memory, on runs outside the validation table of
// docs/planner.md: 42, 46, 50 and 61 MiB (2 ranks DDP and ZeRO-2 of 4 x 128 wide; 1 rank of
// 6 x 384; 3 ranks ZeRO-1 of 2 x 192); the median rounded.
constexpr double kTrainingRuntimeBytes = 48.0 * 1048576.0;

}  // namespace

ClusterSpec calibrate(int64_t ranks, int64_t threads, std::ostream* log) {
  MT_CHECK(ranks >= 2, "calibration needs at least 2 ranks to measure collectives, got ", ranks);
  comm::register_builtin_backends();
  const int64_t cores =
      std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  if (threads <= 0) threads = std::max<int64_t>(1, cores / ranks);
  // Before anything is allocated: what a training rank of this program holds before its model.
  const double process = resident_bytes();
  ClusterSpec c = cluster_preset("cpu-host");
  if (process > 0) c.process_memory = process + kTrainingRuntimeBytes;
  if (log)
    *log << "calibrate: this process holds " << process / 1048576.0
         << " MiB before allocating (code, libraries); a training rank about "
         << c.process_memory / 1048576.0 << " MiB besides its tensors" << std::endl;
  c.name = "calibrated";
  c.devices_per_node = ranks;
  c.efficiency = 1.0;  // peak_flops is what training-sized GEMMs reach here
  if (log)
    *log << "calibrate: f32 GEMM 1024^3 and 64 x 1024 x 1024 on " << ranks << " rank(s) at once, "
         << threads << " thread(s) each..." << std::endl;
  const GemmRates rates = gemm_rates(static_cast<int>(threads), static_cast<int>(ranks));
  const double square = rates.square, thin = rates.thin;
  // The half dimension h of s(d) = d / (d + h) from how much slower a 64-row product runs:
  // rho = s(64) / s(1024) = 64 (1024 + h) / (1024 (64 + h)).
  const double rho = std::min(thin / square, 0.999);
  c.gemm_half_dim = std::max(0.0, 65536.0 * (1.0 - rho) / (1024.0 * rho - 64.0));
  if (1024.0 * rho <= 64.0) c.gemm_half_dim = 1024;  // thinner than the model can say: cap it
  const double s1024 = 1024.0 / (1024.0 + c.gemm_half_dim);
  c.peak_flops = square / (s1024 * s1024 * s1024);  // the rate of an unboundedly large product
  if (log)
    *log << "calibrate:   " << square / 1e9 << " GFLOP/s per rank at 1024^3, " << thin / 1e9
         << " at 64 x 1024 x 1024: gemm_half_dim " << c.gemm_half_dim << std::endl;
  if (log)
    *log << "calibrate: element-wise kernels (LayerNorm, GELU, AdamW) on " << ranks
         << " rank(s) at once..." << std::endl;
  const double ew_one = elementwise_bandwidth(1, static_cast<int>(ranks));
  const double ew = threads == 1
                        ? ew_one
                        : elementwise_bandwidth(static_cast<int>(threads), static_cast<int>(ranks));
  c.elementwise_bandwidth = ew;
  if (log)
    *log << "calibrate:   " << ew_one / 1e9 << " GB/s per rank at 1 thread, " << ew / 1e9 << " at "
         << threads << " thread(s): elementwise_gbps " << ew / 1e9 << std::endl;
  if (log) *log << "calibrate: shm all-reduce on " << ranks << " ranks..." << std::endl;
  c.intra = measure_all_reduce("shm", static_cast<int>(ranks));
  if (log)
    *log << "calibrate:   " << c.intra.bandwidth / 1e9 << " GB/s, " << c.intra.latency * 1e6
         << " us per step" << std::endl;
  if (log) *log << "calibrate: tcp all-reduce on " << ranks << " ranks (loopback)..." << std::endl;
  c.inter = measure_all_reduce("tcp", static_cast<int>(ranks));
  if (log)
    *log << "calibrate:   " << c.inter.bandwidth / 1e9 << " GB/s, " << c.inter.latency * 1e6
         << " us per step" << std::endl;
  const double pages = static_cast<double>(sysconf(_SC_AVPHYS_PAGES));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  if (pages > 0 && page > 0) c.device_memory = pages * page / static_cast<double>(ranks);
  return c;
}

}  // namespace meshtrain::plan
