// mpi_allreduce: the Open MPI side of bench/comm_compare.sh, started by mpirun (which picks the
// transport: --mca btl self,vader for shared memory, self,tcp for sockets). It times
// MPI_Allreduce of f32 sums in place over the same sizes and with the same method as comm_bench
// (warm-up, barrier, timed iterations, slowest rank counts), checks the result, and prints one
// JSON line per size like comm_bench's, labelled with --label. `--op send_recv` times comm_bench's
// ring shift instead (MPI_Sendrecv to the next rank from the previous one).
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::string label = "mpi", op = "all_reduce";
  size_t min_bytes = 4096, max_bytes = size_t{64} << 20;
  int iters = 20, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--label") label = v;
    if (k == "--op") op = v;
    if (k == "--min-bytes") min_bytes = std::strtoull(v, nullptr, 10);
    if (k == "--max-bytes") max_bytes = std::strtoull(v, nullptr, 10);
    if (k == "--iters") iters = std::atoi(v);
    if (k == "--warmup") warmup = std::atoi(v);
  }
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int failures = 0;
  const bool shift = op == "send_recv";
  if (!shift && op != "all_reduce") {
    if (rank == 0)
      std::fprintf(stderr, "mpi_allreduce: --op %s is not all_reduce or send_recv\n", op.c_str());
    MPI_Finalize();
    return 2;
  }
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int count = static_cast<int>(bytes / sizeof(float));
    std::vector<float> data(count, 1.0f), got(count);
    auto run = [&] {
      if (shift) {
        MPI_Sendrecv(data.data(), count, MPI_FLOAT, next, 7, got.data(), count, MPI_FLOAT, prev, 7,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
    };
    for (int i = 0; i < warmup; ++i) run();
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) run();
    double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        iters;
    double slowest = 0;
    MPI_Allreduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    std::fill(data.begin(), data.end(), static_cast<float>(rank + 1));
    run();
    int bad = 0;
    if (shift) {
      for (float v : got) bad |= v != static_cast<float>(prev + 1);
    } else {
      for (float v : data) bad |= v != static_cast<float>(n * (n + 1) / 2);
    }
    int any_bad = 0;
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    failures += any_bad;
    double algbw = static_cast<double>(bytes) / (slowest * 1e3);
    double busbw = shift ? algbw : algbw * 2.0 * (n - 1) / n;
    if (rank == 0) {
      std::printf(
          "{\"backend\":\"%s\",\"op\":\"%s\",\"ranks\":%d,\"bytes\":%zu,"
          "\"time_us\":%.3f,\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f,\"ok\":%s}\n",
          label.c_str(), op.c_str(), n, bytes, slowest, algbw, busbw, any_bad ? "false" : "true");
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
