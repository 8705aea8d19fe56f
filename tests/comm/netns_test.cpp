// Several hosts on one machine: each simulated host is a network namespace (netns_lab.h) and each
// rank a separate process started in it. tcp across three hosts and hier across two hosts of two
// ranks give exact results, with the tcp address found from the route to MASTER_ADDR; a link cut
// in the middle of all-reduces, or a killed rank, turns into CommError on every surviving rank
// within the group timeout, naming the operation, its sequence number and a rank on the far side.
// Skipped (with the reason) where namespaces cannot be made.
//
// The worker is this test program itself: started with MESHTRAIN_NETNS_WORKER set, it runs
// worker_main() before GoogleTest starts and exits.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/comm/process_group_tcp.h"
#include "meshtrain/comm/tcp_store.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "netns_lab.h"
#include "tests/support/capability.h"

namespace meshtrain::comm {
namespace {

namespace fs = std::filesystem;

constexpr const char* kToken = "netns-test-token";
constexpr int kStorePort = 29511;  // each namespace has its own ports: no clash with the host
constexpr auto kGroupTimeout = std::chrono::seconds(3);

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

void write_file(const fs::path& p, const std::string& text) {
  fs::path tmp = p.string() + ".tmp";
  std::ofstream(tmp) << text;
  fs::rename(tmp, p);
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// ---- the worker process ---------------------------------------------------------------------

// Checks a few collectives against values every rank can compute; returns "" or what differed.
std::string check_collectives(ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  // Sizes that take every path: direct/halving-doubling/ring on tcp, leaders and shards on hier.
  for (size_t count : {size_t{1}, size_t{1001}, size_t{300007}}) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((r + 1) * ((i % 7) + 1));
    pg.all_reduce(v.data(), count, DType::f32)->wait();
    for (size_t i = 0; i < count; ++i) {
      float want = static_cast<float>(n * (n + 1) / 2 * ((i % 7) + 1));
      if (v[i] != want)
        return "all_reduce count " + std::to_string(count) + " wrong at " + std::to_string(i);
    }
  }
  std::vector<int64_t> b(513, r == n - 1 ? 42 : 0);
  pg.broadcast(b.data(), b.size(), DType::i64, {.root = n - 1})->wait();
  for (int64_t x : b) {
    if (x != 42) return "broadcast wrong";
  }
  int32_t mine = r * 10;
  std::vector<int32_t> all(n, -1);
  pg.all_gather(&mine, all.data(), 1, DType::i32)->wait();
  for (int q = 0; q < n; ++q) {
    if (all[q] != q * 10) return "all_gather wrong";
  }
  pg.barrier()->wait();
  return "";
}

int worker_main() {
  const fs::path dir = env_or("NETNS_DIR", "");
  const int rank = std::atoi(env_or("RANK", "0").c_str());
  const int world = std::atoi(env_or("WORLD_SIZE", "1").c_str());
  const std::string backend = env_or("NETNS_BACKEND", "auto");
  const std::string mode = env_or("NETNS_MODE", "check");
  const std::string tag = std::to_string(rank);
  write_file(dir / ("pid" + tag), std::to_string(::getpid()));
  try {
    TcpStoreOptions so;
    so.is_server = rank == 0;
    so.token = AuthToken(kToken);
    so.timeout = std::chrono::seconds(20);
    auto store = std::make_shared<TcpStore>(env_or("MASTER_ADDR", ""),
                                            static_cast<uint16_t>(kStorePort), so);
    ProcessGroupOptions o;
    o.name = "netns";
    o.timeout = kGroupTimeout;
    o.token = kToken;
    o.master_addr = env_or("MASTER_ADDR", "");
    auto pg = make_process_group(backend, store, rank, world, o);
    write_file(dir / ("info" + tag), pg->backend_name() + " " + resolve_comm_address(o));
    if (mode == "check") {
      std::string bad = check_collectives(*pg);
      write_file(dir / ("result" + tag), bad.empty() ? "ok" : bad);
      // Rank 0 hosts the store: keep it until everyone is done with it.
      pg->barrier()->wait();
      return bad.empty() ? 0 : 1;
    }
    std::vector<float> buf(1 << 18, 1.0f);
    pg->all_reduce(buf.data(), buf.size(), DType::f32)->wait();
    auto start = std::chrono::steady_clock::now();
    try {
      // "ready" once this rank has gone round the loop: the fault then interrupts the steady
      // sequence of all-reduces on every rank that said so.
      for (int done = 0;; ++done) {
        if (done == 2) write_file(dir / ("ready" + tag), "ok");
        start = std::chrono::steady_clock::now();
        pg->all_reduce(buf.data(), buf.size(), DType::f32)->wait();
      }
    } catch (const CommError& e) {
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      write_file(dir / ("result" + tag), std::to_string(s) + "\n" + e.what());
      return 0;
    }
  } catch (const std::exception& e) {
    write_file(dir / ("result" + tag), std::string("-1\nunexpected: ") + e.what());
    return 2;
  }
}

// Runs before GoogleTest's main in a worker process.
[[maybe_unused]] const bool kIsWorker = [] {
  if (!meshtrain::env_is_set(meshtrain::Env::netns_worker)) return false;
  std::fflush(stdout);
  int rc = worker_main();
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(rc);
}();

// ---- the controller -------------------------------------------------------------------------

struct Job {
  fs::path dir;
  std::vector<::meshtrain::testing::ChildProcess> launchers;  // killed and reaped with the job
  std::vector<int> host_of;
};

fs::path make_temp_dir() {
  fs::path dir = fs::temp_directory_path() /
                 ("meshtrain-netns-" + std::to_string(::getpid()) + "-" +
                  std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  return dir;
}

// Rank r runs on host r % hosts, so rank 0 (the store) is on host 0.
Job launch(testing::NetnsLab& lab, int hosts, int world, const std::string& backend,
           const std::string& mode) {
  Job job;
  job.dir = make_temp_dir();
  std::string self = fs::read_symlink("/proc/self/exe").string();
  for (int r = 0; r < world; ++r) {
    int h = r % hosts;
    job.host_of.push_back(h);
    std::map<std::string, std::string> env = {
        {"MESHTRAIN_NETNS_WORKER", "1"}, {"NETNS_DIR", job.dir.string()},
        {"NETNS_BACKEND", backend},      {"NETNS_MODE", mode},
        {"RANK", std::to_string(r)},     {"WORLD_SIZE", std::to_string(world)},
        {"MASTER_ADDR", lab.address(0)}, {"MESHTRAIN_HOST_ID", "host" + std::to_string(h)},
        {"MESHTRAIN_COMM_ADDR", ""},     {"OMP_NUM_THREADS", "1"}};
    job.launchers.push_back(
        lab.spawn(h, {self}, env, (job.dir / ("log" + std::to_string(r))).string()));
  }
  return job;
}

bool wait_for_files(const Job& job, const std::string& stem, std::chrono::seconds limit) {
  return ::meshtrain::testing::wait_until(
      [&] {
        for (size_t r = 0; r < job.launchers.size(); ++r) {
          if (!fs::exists(job.dir / (stem + std::to_string(r)))) return false;
        }
        return true;
      },
      limit, std::chrono::milliseconds(20));
}

// Waits for every launcher (killing what is left after the limit); returns exit codes.
std::vector<int> reap(Job& job, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<int> codes(job.launchers.size(), -1);
  for (size_t r = 0; r < job.launchers.size(); ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (auto status = job.launchers[r].wait_for(std::max(left, std::chrono::milliseconds(0)))) {
      codes[r] = WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
      continue;
    }
    std::string pid = read_file(job.dir / ("pid" + std::to_string(r)));
    if (!pid.empty()) ::kill(std::atoi(pid.c_str()), SIGKILL);
    job.launchers[r].kill_and_reap();
    codes[r] = 99;
  }
  return codes;
}

std::string logs(const Job& job) {
  std::string out;
  for (size_t r = 0; r < job.launchers.size(); ++r) {
    out += "--- rank " + std::to_string(r) +
           " result: " + read_file(job.dir / ("result" + std::to_string(r))) + "\n--- log:\n" +
           read_file(job.dir / ("log" + std::to_string(r))) + "\n";
  }
  return out;
}

// Every rank named in "ranks [...]" lists of an error message.
std::set<int> named_ranks(const std::string& msg) {
  std::set<int> out;
  static const std::regex list(R"(ranks \[([0-9, ]*)\])");
  for (std::sregex_iterator it(msg.begin(), msg.end(), list), end; it != end; ++it) {
    std::string inner = (*it)[1];
    static const std::regex num("[0-9]+");
    for (std::sregex_iterator n(inner.begin(), inner.end(), num); n != end; ++n) {
      out.insert(std::stoi(n->str()));
    }
  }
  return out;
}

#define REQUIRE_LAB(lab) MT_SKIP_UNLESS("netns", (lab).available(), (lab).unavailable_reason())

void run_check(int hosts, int world, const std::string& want_backend) {
  testing::NetnsLab lab(hosts);
  REQUIRE_LAB(lab);
  Job job = launch(lab, hosts, world, "auto", "check");
  auto codes = reap(job, std::chrono::seconds(40));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r << "\n" << logs(job);
    EXPECT_EQ(read_file(job.dir / ("result" + std::to_string(r))), "ok") << logs(job);
    // The backend auto chose, and the address found from the route to MASTER_ADDR.
    EXPECT_EQ(read_file(job.dir / ("info" + std::to_string(r))),
              want_backend + " " + lab.address(job.host_of[r]));
  }
  fs::remove_all(job.dir);
}

enum class Fault { cut_link, kill_rank };

// Starts all-reduces in a loop, injects the fault against `victim_host` (cut) or the last rank
// (kill), and checks what every remaining rank reported.
void run_fault(int hosts, int world, Fault fault) {
  testing::NetnsLab lab(hosts);
  REQUIRE_LAB(lab);
  Job job = launch(lab, hosts, world, "auto", "fault");
  ASSERT_TRUE(wait_for_files(job, "ready", std::chrono::seconds(30))) << logs(job);
  const int victim_host = hosts - 1;
  const int victim_rank = world - 1;  // on victim_host
  ASSERT_EQ(job.host_of[victim_rank], victim_host);
  if (fault == Fault::cut_link) {
    ASSERT_TRUE(lab.cut_link(victim_host));
  } else {
    ::kill(std::atoi(read_file(job.dir / ("pid" + std::to_string(victim_rank))).c_str()), SIGKILL);
  }
  auto codes = reap(job, std::chrono::seconds(20));
  bool across_from_victim = false, across_to_victim = false;
  for (int r = 0; r < world; ++r) {
    if (fault == Fault::kill_rank && r == victim_rank) continue;
    std::string report = read_file(job.dir / ("result" + std::to_string(r)));
    if (std::getenv("NETNS_VERBOSE") != nullptr) std::printf("rank %d: %s\n", r, report.c_str());
    EXPECT_EQ(codes[r], 0) << "rank " << r << "\n" << logs(job);
    std::istringstream is(report);
    double seconds = -1;
    is >> seconds;
    EXPECT_GE(seconds, 0.0) << report;
    EXPECT_LT(seconds, 10.0) << report;  // the 3 s group timeout, with slack for a loaded host
    EXPECT_NE(report.find("all_reduce"), std::string::npos) << report;
    EXPECT_NE(report.find("seq "), std::string::npos) << report;
    // Every rank names the ranks it waited for: the killed one; with a cut link, a rank it was
    // waiting on (in a ring that may be a neighbour on its own side that waits across the cut,
    // so across the cut is required of one rank per side).
    std::set<int> named = named_ranks(report);
    EXPECT_FALSE(named.empty()) << "rank " << r << " named no rank: " << report;
    EXPECT_EQ(named.count(r), 0u) << "rank " << r << " named itself: " << report;
    bool across = false;
    for (int q : named)
      across |= (job.host_of[q] == victim_host) != (job.host_of[r] == victim_host);
    if (fault == Fault::kill_rank) {
      EXPECT_EQ(named.count(victim_rank), 1u) << "rank " << r << ": " << report;
    } else {
      (job.host_of[r] == victim_host ? across_from_victim : across_to_victim) |= across;
    }
  }
  if (fault == Fault::cut_link) {
    EXPECT_TRUE(across_from_victim) << "no rank on the cut host named a rank beyond the cut\n"
                                    << logs(job);
    EXPECT_TRUE(across_to_victim) << "no rank named a rank on the cut host\n" << logs(job);
  }
  fs::remove_all(job.dir);
}

TEST(Netns, TcpAcrossThreeHosts) {
  run_check(3, 3, "tcp");
}

TEST(Netns, HierAcrossTwoHostsOfTwoRanks) {
  run_check(2, 4, "hier");
}

TEST(Netns, TcpLinkCutMidCollective) {
  run_fault(3, 3, Fault::cut_link);
}

TEST(Netns, HierLinkCutMidCollective) {
  run_fault(2, 4, Fault::cut_link);
}

TEST(Netns, TcpKilledRank) {
  run_fault(3, 3, Fault::kill_rank);
}

TEST(Netns, HierKilledRank) {
  run_fault(2, 4, Fault::kill_rank);
}

}  // namespace
}  // namespace meshtrain::comm
