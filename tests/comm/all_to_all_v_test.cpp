// all_to_all_v with real processes on one host (shm, and tcp over loopback), 2 to 4 ranks:
// uneven blocks with zeros, everything to one rank, nothing at all, blocks of megabytes, several
// dtypes, receive counts known or exchanged, every received byte checked. Failures: a rank killed
// during a loop of exchanges turns into a CommError naming it on every survivor, and counts that
// disagree between sender and receiver fail with CommError instead of hanging.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "all_to_all_v_util.h"
#include "comm_test_util.h"
#include "meshtrain/comm/file_store.h"
#include "meshtrain/util/error.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"
#include "tests/support/wait.h"

namespace meshtrain::comm {
namespace {

namespace fs = std::filesystem;
using ::meshtrain::testing::ChildProcess;
using ::meshtrain::testing::fork_child;
using ::meshtrain::testing::read_bytes;
using ::meshtrain::testing::TempDir;

std::shared_ptr<ProcessGroup> join(const std::string& backend, const fs::path& dir, int rank,
                                   int world, std::chrono::milliseconds timeout) {
  auto store = std::make_shared<FileStore>((dir / "store").string());
  store->set_timeout(std::chrono::seconds(30));
  ProcessGroupOptions o = testing::test_options(backend);
  o.timeout = timeout;
  return make_process_group(backend, store, rank, world, o);
}

void report(const fs::path& dir, int rank, const std::string& text) {
  std::ofstream(dir / ("report" + std::to_string(rank))) << text;
}

// Starts `world` ranks running body(rank) (its exit code) and waits for all of them until
// `limit`; the exit codes (99: still running at the limit, then killed). The children are
// killed and reaped however the test ends.
std::vector<int> run_processes(int world, std::chrono::seconds limit,
                               const std::function<int(int)>& body) {
  std::vector<ChildProcess> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(fork_child([&] { return body(r); }));
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<int> codes(world, -1);
  for (int r = 0; r < world; ++r) {
    if (!ranks[r].started()) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (auto st = ranks[r].wait_for(std::max(left, std::chrono::milliseconds(0)))) {
      codes[r] = WIFEXITED(*st) ? WEXITSTATUS(*st) : 128 + WTERMSIG(*st);
    } else {
      ranks[r].kill_and_reap();
      codes[r] = 99;
    }
  }
  return codes;
}

struct Param {
  std::string backend;
  int world;
};

class AllToAllVProcesses : public ::testing::TestWithParam<Param> {};

TEST_P(AllToAllVProcesses, EveryShapeAndDTypeBitwise) {
  const auto [backend, world] = GetParam();
  TempDir dir;
  const auto codes = run_processes(world, std::chrono::seconds(150), [&](int rank) {
    try {
      auto pg = join(backend, dir.path(), rank, world, std::chrono::seconds(60));
      uint32_t seed = 100;
      std::ostringstream failures;
      auto check = [&](testing::A2aShape shape, DType dt, bool exchange) {
        const auto counts = testing::a2a_counts(shape, world, ++seed, dt);
        const std::string err = testing::a2a_run_and_check(*pg, counts, dt, seed, exchange);
        if (!err.empty()) {
          failures << "shape " << static_cast<int>(shape) << ' ' << dtype_name(dt) << " seed "
                   << seed << (exchange ? " (exchanged counts)" : "") << ": " << err << '\n';
        }
      };
      for (DType dt : {DType::f32, DType::bf16, DType::i32}) {
        // Several random exchanges back to back: consecutive operations reuse the staging
        // buffers.
        for (int i = 0; i < 4; ++i) check(testing::A2aShape::random, dt, i % 2 == 1);
        check(testing::A2aShape::one_receiver, dt, false);
        check(testing::A2aShape::one_receiver, dt, true);
        check(testing::A2aShape::all_zero, dt, true);
      }
      check(testing::A2aShape::large, DType::f32, false);
      check(testing::A2aShape::large, DType::bf16, true);
      // The group still runs the other collectives afterwards.
      int64_t one = 1;
      pg->all_reduce(&one, 1, DType::i64)->wait();
      if (one != world) failures << "all_reduce after all_to_all_v gave " << one << '\n';
      report(dir.path(), rank, failures.str());
      return failures.str().empty() ? 0 : 1;
    } catch (const std::exception& e) {
      report(dir.path(), rank, std::string("exception: ") + e.what());
      return 2;
    }
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r << ": "
                           << read_bytes(dir.file("report" + std::to_string(r)));
  }
}

std::vector<Param> process_params() {
  std::vector<Param> out;
  for (const char* b : {"shm", "tcp"}) {
    for (int w : {2, 3, 4}) out.push_back({b, w});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, AllToAllVProcesses, ::testing::ValuesIn(process_params()),
                         [](const auto& info) {
                           return info.param.backend + "_w" + std::to_string(info.param.world);
                         });

class AllToAllVFaults : public ::testing::TestWithParam<std::string> {};

TEST_P(AllToAllVFaults, KilledRankIsNamedBySurvivors) {
  const std::string backend = GetParam();
  const int world = 3, victim = 1;
  TempDir dir;
  std::vector<ChildProcess> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(fork_child([&, r] {
      try {
        auto pg = join(backend, dir.path(), r, world, std::chrono::seconds(3));
        const auto counts = testing::a2a_counts(testing::A2aShape::random, world, 7, DType::f32);
        const auto send = testing::a2a_send_counts(counts, r);
        const auto recv = testing::a2a_recv_counts(counts, r);
        const auto in = testing::a2a_input(counts, r, DType::f32, 7);
        std::vector<uint8_t> out(testing::a2a_expected(counts, r, DType::f32, 7).size());
        auto start = std::chrono::steady_clock::now();
        try {
          for (int done = 0;; ++done) {
            // Every rank that says so is in the steady loop that the kill interrupts.
            if (done == 2) std::ofstream(dir.file("looping" + std::to_string(r))) << "ok";
            start = std::chrono::steady_clock::now();
            pg->all_to_all_v(in.data(), send, out.data(), recv, DType::f32)->wait();
          }
        } catch (const CommError& e) {
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          report(dir.path(), r, std::to_string(s) + "\n" + e.what());
          return 0;
        }
      } catch (const std::exception& e) {
        report(dir.path(), r, std::string("-1\nother: ") + e.what());
        return 4;
      }
    }));
    ASSERT_TRUE(ranks.back().started());
  }
  ASSERT_TRUE(::meshtrain::testing::wait_until(
      [&] {
        for (int r = 0; r < world; ++r) {
          if (!fs::exists(dir.file("looping" + std::to_string(r)))) return false;
        }
        return true;
      },
      std::chrono::seconds(30)))
      << "the ranks did not all reach their loop of exchanges";
  ranks[victim].signal(SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const auto st = ranks[r].wait_for(std::max(left, std::chrono::milliseconds(0)));
    const std::string text = read_bytes(dir.file("report" + std::to_string(r)));
    ASSERT_TRUE(st.has_value()) << "rank " << r << " still runs after the kill";
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << "rank " << r << ": " << text;
    std::istringstream is(text);
    double seconds = -1;
    is >> seconds;
    EXPECT_GE(seconds, 0.0) << text;
    EXPECT_LT(seconds, 10.0) << text;  // the 3 s timeout plus slack for a loaded machine
    EXPECT_NE(text.find("all_to_all_v"), std::string::npos) << text;
    EXPECT_NE(text.find("[1]"), std::string::npos)
        << "rank " << r << " did not name rank 1: " << text;
  }
}

TEST_P(AllToAllVFaults, MismatchedCountsFailInsteadOfHanging) {
  // Rank 0 sends 5 elements to rank 1, which expects 6. Every rank must come out of the exchange
  // or of the barrier after it with a CommError, well within the group timeout: none may hang,
  // crash or get past the barrier as if nothing happened.
  const std::string backend = GetParam();
  for (int world : {2, 3}) {
    TempDir dir;
    const auto codes = run_processes(world, std::chrono::seconds(40), [&](int r) {
      try {
        auto pg = join(backend, dir.path(), r, world, std::chrono::seconds(20));
        std::vector<size_t> send(world, 4), recv(world, 4);
        if (r == 0) send[1] = 5;
        if (r == 1) recv[0] = 6;
        std::vector<float> in(64, 1.0f), out(64, 0.0f);
        const auto start = std::chrono::steady_clock::now();
        std::string where = "exchange";
        try {
          pg->all_to_all_v(in.data(), send, out.data(), recv, DType::f32)->wait();
          where = "barrier";
          pg->barrier()->wait();
          report(dir.path(), r, "no error");
          return 1;
        } catch (const CommError& e) {
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          report(dir.path(), r, where + " " + std::to_string(s) + "\n" + e.what());
          return 0;
        }
      } catch (const std::exception& e) {
        report(dir.path(), r, std::string("other: ") + e.what());
        return 4;
      }
    });
    for (int r = 0; r < world; ++r) {
      const std::string text = read_bytes(dir.file("report" + std::to_string(r)));
      EXPECT_EQ(codes[r], 0) << "world " << world << " rank " << r << ": " << text;
      std::istringstream is(text);
      std::string where;
      double seconds = -1;
      is >> where >> seconds;
      EXPECT_GE(seconds, 0.0) << text;
      EXPECT_LT(seconds, 15.0) << "found by the deadline only: " << text;
      // The receiver finds it on every backend; shm tells every rank what disagrees.
      if (r == 1 || backend == "shm") {
        EXPECT_EQ(where, "exchange") << text;
        EXPECT_NE(text.find("all_to_all_v"), std::string::npos) << text;
      }
      if (backend == "shm") {
        EXPECT_NE(text.find("which expects 6"), std::string::npos) << text;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AllToAllVFaults, ::testing::Values("shm", "tcp"));

}  // namespace
}  // namespace meshtrain::comm
