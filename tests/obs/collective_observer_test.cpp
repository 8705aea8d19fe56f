// The comm layer's collective hook: a real two-rank group reports every collective (op, bytes,
// time, outcome), and the run observer turns the reports into the collective metrics by
// operation; no report arrives once the hook is removed.
#include "meshtrain/comm/collective_observer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/obs/run_observer.h"
#include "tests/obs/exposition_parser.h"

namespace meshtrain::obs {
namespace {

void run_two_ranks(const std::function<void(comm::ProcessGroup&)>& fn,
                   const std::string& backend = "shm") {
  comm::register_builtin_backends();
  auto store = std::make_shared<comm::HashStore>();
  static std::atomic<int> id{0};
  const std::string name = "obs" + std::to_string(id++);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::ProcessGroupOptions po;
        po.name = name;
        po.timeout = std::chrono::seconds(60);
        auto pg = comm::make_process_group(backend, store, r, 2, po);
        fn(*pg);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void two_collectives(comm::ProcessGroup& pg) {
  std::vector<float> v(100, 1.0f);
  pg.all_reduce(v.data(), v.size(), DType::f32, {})->wait();
  std::vector<float> out(200);
  pg.all_gather(v.data(), out.data(), v.size(), DType::f32, {})->wait();
}

TEST(CollectiveObserverTest, EveryCollectiveIsReportedWithItsBytes) {
  std::mutex mu;
  std::map<std::string, std::pair<int, uint64_t>> seen;  // op -> (count, bytes)
  {
    comm::ScopedCollectiveObserver hook([&](const comm::CollectiveEvent& e) {
      std::lock_guard lock(mu);
      auto& s = seen[e.op];
      ++s.first;
      s.second += e.bytes;
      EXPECT_TRUE(e.ok);
      EXPECT_GE(e.seconds, 0.0);
    });
    run_two_ranks(two_collectives);
  }
  EXPECT_EQ(seen["all_reduce"].first, 2);  // once per rank
  EXPECT_EQ(seen["all_reduce"].second, 2u * 100 * sizeof(float));
  EXPECT_EQ(seen["all_gather"].first, 2);
  EXPECT_EQ(seen["all_gather"].second, 2u * 100 * sizeof(float));
  // Removed: later collectives are not reported.
  seen.clear();
  run_two_ranks(two_collectives);
  EXPECT_TRUE(seen.empty());
  EXPECT_FALSE(comm::has_collective_observer());
}

TEST(CollectiveObserverTest, AllToAllVReportsTheBytesEachRankSends) {
  for (const char* backend : {"shm", "tcp"}) {
    std::mutex mu;
    std::map<std::string, std::pair<int, uint64_t>> seen;
    std::vector<std::string> recorded(2);
    {
      comm::ScopedCollectiveObserver hook([&](const comm::CollectiveEvent& e) {
        std::lock_guard lock(mu);
        auto& s = seen[e.op];
        ++s.first;
        s.second += e.bytes;
      });
      run_two_ranks(
          [&](comm::ProcessGroup& pg) {
            // Rank r sends r + 1 elements to rank 0 and 2r + 3 to rank 1.
            const size_t r = static_cast<size_t>(pg.rank());
            const std::vector<size_t> send = {r + 1, 2 * r + 3};
            const std::vector<size_t> recv = pg.exchange_counts(send);
            std::vector<float> in(send[0] + send[1], 1.0f), out(recv[0] + recv[1]);
            pg.all_to_all_v(in.data(), send, out.data(), recv, DType::f32)->wait();
            recorded[r] = pg.flight_recorder_json();
          },
          backend);
    }
    EXPECT_EQ(seen["all_to_all_v"].first, 2) << backend;
    EXPECT_EQ(seen["all_to_all_v"].second, (4u + 7u) * sizeof(float)) << backend;
    EXPECT_EQ(seen["all_to_all"].first, 2) << backend << ": exchange_counts";
    for (const auto& json : recorded)
      EXPECT_NE(json.find("\"all_to_all_v\""), std::string::npos) << backend << ": " << json;
  }
}

TEST(CollectiveObserverTest, CompositeGroupReportsItsCollectiveOnceNotItsInnerSteps) {
  std::mutex mu;
  std::map<std::string, int> seen;
  {
    comm::ScopedCollectiveObserver hook([&](const comm::CollectiveEvent& e) {
      std::lock_guard lock(mu);
      ++seen[e.op];
    });
    run_two_ranks(
        [](comm::ProcessGroup& pg) {
          std::vector<float> v(1000, 1.0f);
          pg.all_reduce(v.data(), v.size(), DType::f32, {})->wait();
        },
        "hier");
  }
  // Setting the group up may run a barrier; the all-reduce's inner steps are not reported.
  EXPECT_EQ(seen["all_reduce"], 2);
  for (const char* inner : {"reduce", "broadcast", "all_gather", "reduce_scatter"})
    EXPECT_EQ(seen.count(inner), 0u) << inner;
}

TEST(CollectiveObserverTest, RunObserverExportsCollectivesByOperation) {
  Registry registry({{"job", "t"}, {"rank", "0"}, {"node", "n"}});
  {
    RunObserverOptions o;
    RunObserver observer(registry, o);
    run_two_ranks(two_collectives);
  }
  const auto e = testing::parse_exposition(registry.render());
  std::map<std::string, double> count, bytes;
  for (const auto& s : e.samples) {
    if (s.name == "meshtrain_collectives_total") count[s.labels.at("op")] = s.value;
    if (s.name == "meshtrain_collective_bytes_total") bytes[s.labels.at("op")] = s.value;
  }
  EXPECT_EQ(count["all_reduce"], 2);  // both ranks live in this process
  EXPECT_EQ(count["all_gather"], 2);
  EXPECT_EQ(bytes["all_gather"], 2 * 100 * sizeof(float));
  EXPECT_EQ(e.types.at("meshtrain_collective_duration_seconds"), "histogram");
}

TEST(CollectiveObserverTest, RankStepTimesNameTheSlowestRankInTheMetricsRow) {
  Registry registry({{"job", "t"}, {"rank", "0"}, {"node", "n"}});
  RunObserver observer(registry, {});
  nlohmann::json row;
  observer.on_rank_step_times({0.10, 0.30, 0.12, 0.11}, row);
  EXPECT_EQ(row["slowest_rank"], 1);
  EXPECT_NEAR(row["rank_lag_s"].get<double>(), 0.30 - 0.11, 1e-12);  // behind the median rank
  nlohmann::json two;
  observer.on_rank_step_times({0.5, 0.2}, two);  // two ranks: the gap between them
  EXPECT_EQ(two["slowest_rank"], 0);
  EXPECT_NEAR(two["rank_lag_s"].get<double>(), 0.3, 1e-12);
  EXPECT_EQ(row["rank_step_s"].size(), 4u);
  const auto e = testing::parse_exposition(registry.render());
  double rank = -1;
  for (const auto& s : e.samples)
    if (s.name == "meshtrain_straggler_rank") rank = s.value;
  EXPECT_EQ(rank, 0);  // the gauge shows the latest step's slowest rank
}

}  // namespace
}  // namespace meshtrain::obs
