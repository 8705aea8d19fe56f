// comm_bench: collective bandwidth and latency in the style of nccl-tests. It forks its own ranks
// on one host (--world-size) or joins a job launched by meshrun (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), checks every result, prints a table (size, count, type, time, algbw, busbw) and one
// JSON line per size, plus the single-thread memcpy bandwidth as the ceiling on one host. The
// timing loop (time_collective) is reusable for other libraries' peers.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "meshtrain/comm/file_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/tcp_store.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/util/error.h"

namespace {

using namespace meshtrain;
using namespace meshtrain::comm;

struct Timing {
  double avg_us = 0;
  double cpu_us = 0;  // CPU time of every thread of every rank per iteration, summed
};

// CPU time of this process (all its threads), microseconds.
double process_cpu_us() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto us = [](const timeval& t) { return static_cast<double>(t.tv_sec) * 1e6 + t.tv_usec; };
  return us(u.ru_utime) + us(u.ru_stime);
}

// Runs `op` warmup + iters times between barriers and returns the mean time per iteration; the
// slowest rank's time is what counts, so it is max-reduced through `max_across_ranks`. The CPU
// the ranks spent (what bounds a transfer whose ranks share a host's cores) is summed through
// `sum_across_ranks`.
Timing time_collective(int warmup, int iters, const std::function<void()>& op,
                       const std::function<void()>& barrier,
                       const std::function<double(double)>& max_across_ranks,
                       const std::function<double(double)>& sum_across_ranks) {
  for (int i = 0; i < warmup; ++i) op();
  barrier();
  const double cpu0 = process_cpu_us();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) op();
  double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
      std::max(1, iters);
  const double cpu = (process_cpu_us() - cpu0) / std::max(1, iters);
  return Timing{max_across_ranks(us), sum_across_ranks(cpu)};
}

double memcpy_bandwidth_gbs() {
  std::vector<uint8_t> a(size_t{64} << 20, 1), b(size_t{64} << 20);
  std::memcpy(b.data(), a.data(), a.size());
  auto t0 = std::chrono::steady_clock::now();
  const int reps = 5;
  for (int i = 0; i < reps; ++i) std::memcpy(b.data(), a.data(), a.size());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(a.size()) * reps / s / 1e9;
}

double bus_factor(const std::string& op, int n) {
  if (n <= 1) return 1.0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all" || op == "all_to_all_v") {
    return static_cast<double>(n - 1) / n;
  }
  return 1.0;
}

// all_to_all_v's fixed uneven split (bench/python/all_to_all_v_bench_torch.py computes the same):
// of its `count` elements, rank r sends rank j a share weighted 1 + (r + j) % n, rounded down,
// the last rank getting the rest. With 2 ranks each keeps a third and sends two thirds.
std::vector<size_t> uneven_split(size_t count, int n, int r) {
  std::vector<size_t> split(n);
  size_t total_weight = 0, given = 0;
  for (int j = 0; j < n; ++j) total_weight += 1 + (r + j) % n;
  for (int j = 0; j + 1 < n; ++j) {
    split[j] = count * (1 + (r + j) % n) / total_weight;
    given += split[j];
  }
  split[n - 1] = count - given;
  return split;
}

struct BenchOptions {
  std::string backend = "shm", op = "all_reduce";
  size_t min_bytes = 4096, max_bytes = size_t{64} << 20;
  int iters = 20, warmup = 5;
  bool async_op = false;
  bool registered = false;
};

int run_rank(const BenchOptions& bo, std::shared_ptr<Store> store, int rank, int world) {
  const std::string& backend = bo.backend;
  const std::string& op = bo.op;
  const bool async_op = bo.async_op;
  ProcessGroupOptions opts;
  opts.name = "bench";
  auto pg = make_process_group(backend, store, rank, world, opts);
  const int n = pg->size();
  auto barrier = [&] { pg->barrier()->wait(); };
  auto max_across = [&](double v) {
    float f = static_cast<float>(v);
    pg->all_reduce(&f, 1, DType::f32, {.op = ReduceOp::max})->wait();
    return static_cast<double>(f);
  };
  auto sum_across = [&](double v) {
    float f = static_cast<float>(v);
    pg->all_reduce(&f, 1, DType::f32)->wait();
    return static_cast<double>(f);
  };
  if (rank == 0) {
    std::printf(
        "# comm_bench backend=%s op=%s ranks=%d calls=%s buffers=%s memcpy=%.2f GB/s blas=%s\n",
        backend.c_str(), op.c_str(), n, async_op ? "async" : "blocking",
        bo.registered ? "registered" : "private", memcpy_bandwidth_gbs(),
        cpu::blas_config().c_str());
    std::printf("%12s %12s %6s %12s %10s %10s %6s\n", "size(B)", "count", "type", "time(us)",
                "algbw", "busbw", "check");
  }
  int failures = 0;
  // With --registered the all_reduce buffer comes from the group (shared between ranks on shm);
  // one allocation of the largest size serves every size.
  CommBufferPtr registered;
  if (bo.registered) registered = pg->allocate_buffer(bo.max_bytes);
  for (size_t bytes = bo.min_bytes; bytes <= bo.max_bytes; bytes *= 2) {
    const size_t count = bytes / 4;
    // all_to_all_v: `bytes` is what each rank sends in all (its own block included), split
    // unevenly; it receives every rank's block for it.
    std::vector<size_t> send_counts, recv_counts;
    if (op == "all_to_all_v") {
      send_counts = uneven_split(count, n, rank);
      for (int s = 0; s < n; ++s) recv_counts.push_back(uneven_split(count, n, s)[rank]);
    }
    std::vector<float> in(count * (op == "all_reduce" || op == "broadcast" ? 1 : n));
    std::vector<float> out(op == "all_gather" ? count * n : count);
    std::vector<float> priv(registered ? 0 : count);
    std::span<float> data =
        registered ? std::span<float>(registered->as<float>(), count) : std::span<float>(priv);
    std::function<void()> run;
    if (op == "all_reduce") {
      run = [&] { pg->all_reduce(data.data(), count, DType::f32, {.async_op = async_op})->wait(); };
    } else if (op == "broadcast") {
      run = [&] { pg->broadcast(data.data(), count, DType::f32, {.async_op = async_op})->wait(); };
    } else if (op == "all_gather") {
      run = [&] {
        pg->all_gather(data.data(), out.data(), count, DType::f32, {.async_op = async_op})->wait();
      };
    } else if (op == "reduce_scatter") {
      in.assign(count * n, 1.0f);
      run = [&] {
        pg->reduce_scatter(in.data(), out.data(), count, DType::f32, {.async_op = async_op})
            ->wait();
      };
    } else if (op == "all_to_all_v") {
      size_t received = 0;
      for (size_t c : recv_counts) received += c;
      in.resize(count);
      out.resize(received);
      // Block j holds rank * n + j + 1 everywhere, so the receiver can tell where it came from.
      for (size_t j = 0, at = 0; j < send_counts.size(); at += send_counts[j], ++j)
        std::fill_n(in.begin() + at, send_counts[j], static_cast<float>(rank * n + j + 1));
      run = [&] {
        pg->all_to_all_v(in.data(), send_counts, out.data(), recv_counts, DType::f32,
                         {.async_op = async_op})
            ->wait();
      };
    } else if (op == "send_recv") {
      // A ring shift, the pipeline's fused transfer: each rank sends its block to the next rank
      // and receives the previous rank's, both posted at once and waited for together.
      MT_CHECK(n >= 2, "send_recv needs at least 2 ranks");
      const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      std::fill(in.begin(), in.end(), static_cast<float>(rank + 1));
      run = [&, next, prev] {
        WorkPtr s = pg->send(in.data(), count, DType::f32, next, 7);
        WorkPtr r = pg->recv(out.data(), count, DType::f32, prev, 7);
        s->wait();
        r->wait();
      };
    } else {
      MT_THROW(ValueError, "unknown --op ", op);
    }
    std::fill(data.begin(), data.end(), 1.0f);
    Timing t = time_collective(bo.warmup, bo.iters, run, barrier, max_across, sum_across);
    // Check: one fresh run on known inputs.
    bool ok = true;
    if (op == "all_reduce") {
      std::fill(data.begin(), data.end(), static_cast<float>(rank + 1));
      run();
      for (float v : data) ok &= v == static_cast<float>(n * (n + 1) / 2);
    } else if (op == "reduce_scatter") {
      run();
      for (float v : out) ok &= v == static_cast<float>(n);
    } else if (op == "send_recv") {
      std::fill(out.begin(), out.end(), -1.0f);
      run();
      for (float v : out) ok &= v == static_cast<float>((rank + n - 1) % n + 1);
    } else if (op == "all_to_all_v") {
      std::fill(out.begin(), out.end(), -1.0f);
      run();
      for (size_t s = 0, at = 0; s < recv_counts.size(); at += recv_counts[s], ++s) {
        for (size_t k = 0; k < recv_counts[s]; ++k)
          ok &= out[at + k] == static_cast<float>(static_cast<int>(s) * n + rank + 1);
      }
    }
    int32_t bad = ok ? 0 : 1;
    pg->all_reduce(&bad, 1, DType::i32)->wait();
    failures += bad;
    double algbw = static_cast<double>(bytes) / (t.avg_us * 1e3);
    double busbw = algbw * bus_factor(op, n);
    if (rank == 0) {
      std::printf("%12zu %12zu %6s %12.1f %10.3f %10.3f %6s\n", bytes, count, "f32", t.avg_us,
                  algbw, busbw, bad ? "FAIL" : "ok");
      nlohmann::json j = {{"backend", backend},
                          {"op", op},
                          {"ranks", n},
                          {"async_op", async_op},
                          {"registered", bo.registered},
                          {"bytes", bytes},
                          {"count", count},
                          {"dtype", "f32"},
                          {"time_us", t.avg_us},
                          {"cpu_us", t.cpu_us},
                          {"algbw_gbs", algbw},
                          {"busbw_gbs", busbw},
                          {"ok", bad == 0}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Collective bandwidth benchmark (nccl-tests style)"};
  BenchOptions bo;
  int world = 2;
  app.add_option("--backend", bo.backend, "shm, tcp or auto");
  app.add_option("--op", bo.op,
                 "all_reduce, broadcast, all_gather, reduce_scatter, all_to_all_v (uneven "
                 "fixed split, --min/--max-bytes per rank) or send_recv (a ring shift: each rank "
                 "sends to the next and receives from the previous, as a pipeline's transfers)");
  app.add_option("--min-bytes", bo.min_bytes, "smallest message");
  app.add_option("--max-bytes", bo.max_bytes, "largest message");
  app.add_option("--iters", bo.iters, "timed iterations per size");
  app.add_option("--warmup", bo.warmup, "untimed iterations per size");
  app.add_option("--world-size", world, "ranks to fork on this host (ignored under a launcher)");
  app.add_flag("--registered", bo.registered,
               "all_reduce on a buffer from ProcessGroup::allocate_buffer, which the shm backend "
               "shares between ranks (no staging copies; nccl-tests' -R)");
  app.add_flag("--async", bo.async_op,
               "issue each operation asynchronously and wait for its Work (default: blocking "
               "calls, async_op = false, as MPI_Allreduce and Gloo's allreduce are)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (const char* r = std::getenv("RANK"); r != nullptr && std::getenv("WORLD_SIZE") != nullptr) {
      int rank = std::atoi(r);
      int size = std::atoi(std::getenv("WORLD_SIZE"));
      const char* addr = std::getenv("MASTER_ADDR");
      const char* port = std::getenv("MASTER_PORT");
      MT_CHECK(addr && port, "MASTER_ADDR and MASTER_PORT must be set under a launcher");
      TcpStoreOptions so;
      so.is_server = false;
      auto store = std::make_shared<TcpStore>(addr, static_cast<uint16_t>(std::atoi(port)), so);
      return run_rank(bo, store, rank, size);
    }
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("comm_bench-" + std::to_string(::getpid()) + ".store");
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
      pid_t pid = ::fork();
      if (pid == 0) {
        int rc = 1;
        try {
          auto store = std::make_shared<FileStore>(path.string());
          rc = run_rank(bo, store, r, world);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "comm_bench rank %d: %s\n", r, e.what());
        }
        std::fflush(stdout);
        ::_exit(rc);
      }
      pids.push_back(pid);
    }
    int rc = 0;
    for (pid_t p : pids) {
      int status = 0;
      ::waitpid(p, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
    }
    std::filesystem::remove(path);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_bench: %s\n", e.what());
    return 1;
  }
}
