// Failure semantics with real processes: a rank killed with SIGKILL in the middle of all-reduces
// turns into a CommError naming it on every survivor within the group timeout; a peer with the
// wrong token is refused; an aborted group fails later operations at once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "comm_test_util.h"
#include "meshtrain/comm/file_store.h"
#include "meshtrain/comm/termination.h"
#include "meshtrain/util/error.h"
#include "tests/support/child_process.h"
#include "tests/support/wait.h"

namespace meshtrain::comm {
namespace {

namespace fs = std::filesystem;

fs::path make_temp_dir() {
  fs::path dir = fs::temp_directory_path() /
                 ("meshtrain-comm-test-" + std::to_string(::getpid()) + "-" +
                  std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  return dir;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Child body: join the group, run `op` (all_reduce, reduce_scatter or all_gather)
// until something fails; report the error.
[[noreturn]] void child(const std::string& backend, bool registered, const std::string& op,
                        const fs::path& dir, int rank, int world) {
  int code = 3;
  try {
    auto store = std::make_shared<FileStore>((dir / "store").string());
    store->set_timeout(std::chrono::seconds(20));
    ProcessGroupOptions o = testing::test_options(backend);
    o.timeout = std::chrono::seconds(3);
    auto pg = make_process_group(backend, store, rank, world, o);
    const size_t count = size_t{1} << 18;
    std::vector<float> own(count, 1.0f);
    float* buf = own.data();
    // "shm-registered": the buffer comes from the group (shared, as DDP's buckets), so that the
    // in-place all-reduce is what loses its peer.
    // reduce_scatter reads world blocks of count / world elements from the shared buffer; the
    // in-place all_gather's input is this rank's block of it.
    const size_t block = count / static_cast<size_t>(world);
    std::vector<float> out(block);
    CommBufferPtr shared;
    if (registered) {
      shared = pg->allocate_buffer(count * sizeof(float));
      buf = shared->as<float>();
      std::fill(buf, buf + count, 1.0f);
    }
    auto run = [&] {
      if (op == "reduce_scatter") return pg->reduce_scatter(buf, out.data(), block, DType::f32);
      if (op == "all_gather") return pg->all_gather(buf + rank * block, buf, block, DType::f32);
      return pg->all_reduce(buf, count, DType::f32);
    };
    run()->wait();
    auto start = std::chrono::steady_clock::now();
    try {
      // "looping" once this rank has gone round the loop: every rank that says so is in the
      // steady sequence of operations that the kill interrupts.
      for (int done = 0;; ++done) {
        if (done == 2) std::ofstream(dir / ("looping" + std::to_string(rank))) << "ok";
        start = std::chrono::steady_clock::now();
        run()->wait();
      }
    } catch (const CommError& e) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // Later operations fail at once.
      bool fast = false;
      try {
        pg->barrier()->wait();
      } catch (const CommError&) {
        fast = true;
      }
      std::ofstream(dir / ("error" + std::to_string(rank))) << s << '\n'
                                                            << (fast ? "fast" : "slow") << '\n'
                                                            << e.what();
      code = 0;
    }
  } catch (const std::exception& e) {
    std::ofstream(dir / ("error" + std::to_string(rank))) << "-1\nother\n" << e.what();
    code = 4;
  }
  ::_exit(code);
}

class Faults : public ::testing::TestWithParam<std::string> {};

TEST_P(Faults, KilledRankIsNamedBySurvivors) {
  const std::string param = GetParam();
  // "shm-registered[-OP]": buffers from the group, so that the in-place path loses its peer.
  const bool registered = param.rfind("shm-registered", 0) == 0;
  const std::string backend = registered ? "shm" : param;
  const std::string op = param == "shm-registered-rs"   ? "reduce_scatter"
                         : param == "shm-registered-ag" ? "all_gather"
                                                        : "all_reduce";
  const int world = 4, victim = 2;
  fs::path dir = make_temp_dir();
  std::vector<::meshtrain::testing::ChildProcess> ranks;  // killed and reaped with the test
  for (int r = 0; r < world; ++r) {
    ranks.push_back(::meshtrain::testing::fork_child([&] {
      child(backend, registered, op, dir, r, world);
      return 98;  // child() exits on its own
    }));
    ASSERT_TRUE(ranks.back().started());
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto all_looping = [&] {
    for (int r = 0; r < world; ++r) {
      if (!fs::exists(dir / ("looping" + std::to_string(r)))) return false;
    }
    return true;
  };
  ASSERT_TRUE(::meshtrain::testing::wait_until(all_looping, std::chrono::seconds(30)))
      << "the ranks did not all reach their loop of operations";
  ranks[victim].signal(SIGKILL);
  std::vector<int> codes(world, -1);
  for (int r = 0; r < world; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (auto status = ranks[r].wait_for(std::max(left, std::chrono::milliseconds(0)))) {
      codes[r] = WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
    } else {
      ranks[r].kill_and_reap();
      codes[r] = 99;
    }
  }
  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    std::string report = read_file(dir / ("error" + std::to_string(r)));
    EXPECT_EQ(codes[r], 0) << "rank " << r << ": " << report;
    std::istringstream is(report);
    double seconds = -1;
    std::string fast;
    is >> seconds >> fast;
    EXPECT_GE(seconds, 0.0) << report;
    EXPECT_LT(seconds, 10.0) << report;  // the 3 s timeout plus slack for a loaded machine
    EXPECT_EQ(fast, "fast") << report;
    EXPECT_NE(report.find("[2]"), std::string::npos)
        << "rank " << r << " did not name rank 2: " << report;
    EXPECT_NE(report.find(op), std::string::npos) << report;
    EXPECT_NE(report.find("seq"), std::string::npos) << report;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Backends, Faults,
                         ::testing::Values("shm", "shm-registered", "shm-registered-rs",
                                           "shm-registered-ag", "tcp"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(TcpAuth, WrongTokenIsRefused) {
  // Rank 1 has a different token: its connection to rank 0 is dropped before any data, so the
  // all-reduce fails on both sides instead of mixing data with an impostor.
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ProcessGroupOptions o = testing::test_options("tcp");
      o.timeout = std::chrono::seconds(3);
      o.token = r == 0 ? "right-token" : "wrong-token";
      try {
        auto pg = make_process_group("tcp", store, r, 2, o);
        int32_t v = 1;
        pg->all_reduce(&v, 1, DType::i32)->wait();
      } catch (const CommError& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(errors[0].empty());
  EXPECT_FALSE(errors[1].empty());
}

TEST(Watchdog, FlightRecorderAndTimeoutNameTheMissingRank) {
  for (const char* backend : {"shm", "tcp"}) {
    auto store = std::make_shared<HashStore>();
    std::string error, json;
    std::atomic<bool> rank0_done{false};
    std::thread late;
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        ProcessGroupOptions o = testing::test_options(backend);
        o.timeout = std::chrono::milliseconds(800);
        o.warn_after = std::chrono::milliseconds(200);
        auto pg = make_process_group(backend, store, r, 2, o);
        int64_t v = 1;
        pg->all_reduce(&v, 1, DType::i64)->wait();
        if (r == 1) {
          // Rank 1 never joins the second all-reduce; it waits until rank 0 gave up.
          EXPECT_TRUE(::meshtrain::testing::wait_until([&] { return rank0_done.load(); },
                                                       std::chrono::seconds(30)));
          return;
        }
        try {
          pg->all_reduce(&v, 1, DType::i64)->wait();
        } catch (const CommError& e) {
          error = e.what();
        }
        json = pg->flight_recorder_json();
        EXPECT_TRUE(pg->aborted());
        rank0_done = true;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_NE(error.find("[1]"), std::string::npos) << backend << ": " << error;
    EXPECT_NE(error.find("seq 1"), std::string::npos) << error;
    EXPECT_NE(json.find("\"failed\""), std::string::npos) << json;
    EXPECT_NE(json.find("\"completed\""), std::string::npos) << json;
  }
}

// A termination signal while a collective waits on a rank that never comes: the collective is
// given up after abandon_after(), long before its own deadline, naming the op and the rank.
TEST(Watchdog, ATerminationSignalAbandonsABlockedCollective) {
  set_abandon_after(std::chrono::milliseconds(300));
  for (const char* backend : {"shm", "tcp"}) {
    clear_termination_signal();
    auto store = std::make_shared<HashStore>();
    std::string error;
    double waited = -1;
    std::atomic<bool> rank0_done{false};
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        ProcessGroupOptions o = testing::test_options(backend);
        o.timeout = std::chrono::seconds(120);
        auto pg = make_process_group(backend, store, r, 2, o);
        int64_t v = 1;
        pg->all_reduce(&v, 1, DType::i64)->wait();
        if (r == 1) {
          EXPECT_TRUE(::meshtrain::testing::wait_until([&] { return rank0_done.load(); },
                                                       std::chrono::seconds(60)));
          return;
        }
        note_termination_signal(SIGTERM);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          pg->all_reduce(&v, 1, DType::i64)->wait();
        } catch (const CommError& e) {
          error = e.what();
        }
        waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rank0_done = true;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_TRUE(std::regex_search(
        error, std::regex("all_reduce \\(seq [0-9]+, group 'test', rank 0/2\\) abandoned on "
                          "SIGTERM after waiting [0-9]+ ms for ranks \\[1\\]")))
        << backend << ": " << error;
    // Far below the operation's own 120 s deadline.
    EXPECT_LT(waited, 60.0) << backend;
  }
  clear_termination_signal();
  set_abandon_after(std::chrono::milliseconds(-1));
}

}  // namespace
}  // namespace meshtrain::comm
