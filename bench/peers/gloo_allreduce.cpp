// gloo_allreduce: the Gloo side of bench/comm_compare.sh. It forks --world-size ranks on this
// host that meet through Gloo's FileStore, connect with Gloo's tcp transport, and time Gloo's
// ring or halving-doubling all-reduce of f32 sums over the same sizes and with the same method as
// comm_bench (warm-up, barrier, timed iterations, slowest rank counts). Each size prints one JSON
// line like comm_bench's, after checking the result. With --rank it runs that one rank instead
// (bench/netns_compare.sh starts one per network-namespace host), meeting the others in
// --store-dir and listening on --address.
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Settings {
  std::string algo = "ring";
  size_t min_bytes = 4096;
  size_t max_bytes = size_t{64} << 20;
  int iters = 20;
  int warmup = 5;
  int world = 2;
  std::string address = "127.0.0.1";
};

std::unique_ptr<gloo::Algorithm> make_allreduce(const std::shared_ptr<gloo::Context>& ctx,
                                                const std::string& algo, float* data, int count) {
  std::vector<float*> ptrs = {data};
  if (algo == "halving_doubling") {
    return std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx, ptrs, count);
  }
  return std::make_unique<gloo::AllreduceRing<float>>(ctx, ptrs, count);
}

int run_rank(const Settings& s, const std::string& store_dir, int rank) {
  gloo::transport::tcp::attr attr(s.address.c_str());
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore file_store(store_dir);
  gloo::rendezvous::PrefixStore store("gloo_allreduce", file_store);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, s.world);
  ctx->connectFullMesh(store, device);
  const int n = s.world;
  gloo::BarrierAllToOne barrier(ctx);
  double slowest = 0;
  std::unique_ptr<gloo::Algorithm> max_time = std::make_unique<gloo::AllreduceRing<double>>(
      ctx, std::vector<double*>{&slowest}, 1, gloo::ReductionFunction<double>::max);
  int failures = 0;
  for (size_t bytes = s.min_bytes; bytes <= s.max_bytes; bytes *= 2) {
    const int count = static_cast<int>(bytes / sizeof(float));
    std::vector<float> data(count, 1.0f);
    auto op = make_allreduce(ctx, s.algo, data.data(), count);
    for (int i = 0; i < s.warmup; ++i) op->run();
    barrier.run();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < s.iters; ++i) op->run();
    slowest =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        s.iters;
    max_time->run();
    std::fill(data.begin(), data.end(), static_cast<float>(rank + 1));
    op->run();
    bool ok = true;
    for (float v : data) ok &= v == static_cast<float>(n * (n + 1) / 2);
    failures += ok ? 0 : 1;
    double algbw = static_cast<double>(bytes) / (slowest * 1e3);
    double busbw = algbw * 2.0 * (n - 1) / n;
    if (rank == 0) {
      std::printf(
          "{\"backend\":\"gloo-%s\",\"op\":\"all_reduce\",\"ranks\":%d,\"bytes\":%zu,"
          "\"time_us\":%.3f,\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f,\"ok\":%s}\n",
          s.algo.c_str(), n, bytes, slowest, algbw, busbw, ok ? "true" : "false");
      std::fflush(stdout);
    }
  }
  barrier.run();
  return failures == 0 ? 0 : 1;
}

// run_rank with its failure printed: the exit status of one rank's process.
int run_rank_reporting(const Settings& s, const std::string& store_dir, int rank) {
  try {
    return run_rank(s, store_dir, rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce rank %d: %s\n", rank, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Gloo all-reduce timing (a reference peer for comm_compare.sh)"};
  Settings s;
  app.add_option("--algo", s.algo, "ring or halving_doubling");
  app.add_option("--min-bytes", s.min_bytes, "smallest message");
  app.add_option("--max-bytes", s.max_bytes, "largest message");
  app.add_option("--iters", s.iters, "timed iterations per size");
  app.add_option("--warmup", s.warmup, "untimed iterations per size");
  app.add_option("--world-size", s.world, "ranks to fork on this host (or in all, with --rank)");
  int only_rank = -1;
  std::string store_dir;
  app.add_option("--rank", only_rank, "run only this rank (the others are started elsewhere)");
  app.add_option("--store-dir", store_dir, "FileStore directory shared by the ranks (with --rank)");
  app.add_option("--address", s.address, "address this rank's tcp device listens on");
  CLI11_PARSE(app, argc, argv);
  if (only_rank >= 0) {
    if (only_rank >= s.world || store_dir.empty()) {
      std::fprintf(stderr,
                   "gloo_allreduce: --rank needs 0 <= rank < --world-size and --store-dir\n");
      return 2;
    }
    return run_rank_reporting(s, store_dir, only_rank);
  }
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gloo_allreduce-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<pid_t> pids;
  for (int r = 0; r < s.world; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      const int rc = run_rank_reporting(s, dir.string(), r);
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
  std::filesystem::remove_all(dir);
  return rc;
}
