// calibrate(): this machine measured as a ClusterSpec. Ranks are threads of this process, each
// with its own member of a shm (intra) and a tcp (inter, over loopback) group, as `meshrun`
// processes would have; GEMM FLOP/s is one rank's share of the cores on a square f32 product.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <ostream>
#include <thread>
#include <vector>

#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/plan/cluster.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/util/error.h"

namespace meshtrain::plan {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median seconds of one f32 n x n x n product with `threads` threads.
double gemm_flops(int64_t n, int threads) {
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size());
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  cpu::matmul(c.data(), a.data(), b.data(), n, n, n, false, false);  // warm-up
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    cpu::matmul(c.data(), a.data(), b.data(), n, n, n, false, false);
    t.push_back(seconds_since(t0));
  }
  omp_set_num_threads(saved);
  std::sort(t.begin(), t.end());
  return 2.0 * static_cast<double>(n * n * n) / t[t.size() / 2];
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

}  // namespace

ClusterSpec calibrate(int64_t ranks, int64_t threads, std::ostream* log) {
  MT_CHECK(ranks >= 2, "calibration needs at least 2 ranks to measure collectives, got ", ranks);
  comm::register_builtin_backends();
  const int64_t cores =
      std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  if (threads <= 0) threads = std::max<int64_t>(1, cores / ranks);
  ClusterSpec c = cluster_preset("cpu-host");
  c.name = "calibrated";
  c.devices_per_node = ranks;
  c.efficiency = 1.0;  // peak_flops is what training-sized GEMMs reach here
  if (log) *log << "calibrate: f32 GEMM 1024^3 on " << threads << " thread(s)..." << std::endl;
  c.peak_flops = gemm_flops(1024, static_cast<int>(threads));
  if (log) *log << "calibrate:   " << c.peak_flops / 1e9 << " GFLOP/s per rank" << std::endl;
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
