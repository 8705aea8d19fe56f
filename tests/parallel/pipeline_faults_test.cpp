// A pipeline stage killed with SIGKILL in the middle of training steps (real processes, one per
// stage, the engine's pipeline mode over shm or tcp): its neighbours are waiting on transfers
// from it, the others on the step's collectives; every survivor gets a CommError naming the
// dead rank within the group timeout.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/file_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/parallel/mesh/device_mesh.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/util/error.h"
#include "tests/support/child_process.h"
#include "tests/support/engines.h"
#include "tests/support/wait.h"

namespace meshtrain::parallel {
namespace {

namespace fs = std::filesystem;

constexpr int kStages = 3, kVictim = 1;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<Batch> batches(int step) {
  std::vector<Batch> out;
  for (int k = 0; k < 4; ++k) {
    Generator gen(100 * static_cast<uint64_t>(step) + static_cast<uint64_t>(k));
    Tensor x = Tensor::empty({2, 16}, DType::i32), y = Tensor::empty({2, 16}, DType::i32);
    for (int64_t i = 0; i < 32; ++i) {
      x.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % 50);
      y.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % 50);
    }
    out.push_back({x, y});
  }
  return out;
}

// Child body: train steps until something fails; the report is "<seconds> <kind>\n<message>".
[[noreturn]] void stage(const std::string& backend, const fs::path& dir, int rank) {
  int code = 3;
  try {
    comm::register_builtin_backends();
    auto store = std::make_shared<comm::FileStore>((dir / "store").string());
    store->set_timeout(std::chrono::seconds(20));
    comm::ProcessGroupOptions o;
    o.name = "pipe";
    o.timeout = std::chrono::seconds(3);
    o.token = "test-token";
    o.address = "127.0.0.1";
    auto world = comm::make_process_group(backend, store, rank, kStages, o);
    const DeviceMesh mesh(world, {{"pp", kStages}, {"dp", 1}, {"tp", 1}});
    nn::GPTConfig config;
    config.vocab_size = 50;
    config.block_size = 16;
    config.n_layer = 4;
    config.n_head = 2;
    config.n_embd = 16;
    EngineOptions eo;
    eo.pipeline = {kStages, pipeline::ScheduleKind::one_f_one_b, 0, 1};
    auto engine_owner = testing::gpt_engine(config, mesh, eo);
    TrainEngine& engine = *engine_owner;
    StepOptions so;
    so.lr = 1e-3f;
    so.step = 1;
    engine.train_step(batches(0), so);
    std::ofstream(dir / ("ready" + std::to_string(rank))) << "ok";
    auto start = std::chrono::steady_clock::now();
    try {
      for (int step = 2;; ++step) {
        start = std::chrono::steady_clock::now();
        so.step = step;
        engine.train_step(batches(step), so);
      }
    } catch (const CommError& e) {
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::ofstream(dir / ("error" + std::to_string(rank))) << s << " comm\n" << e.what();
      code = 0;
    }
  } catch (const std::exception& e) {
    std::ofstream(dir / ("error" + std::to_string(rank))) << "-1 other\n" << e.what();
    code = 4;
  }
  ::_exit(code);
}

class PipelineFaults : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineFaults, KilledStageIsNamedByEverySurvivor) {
  const std::string backend = GetParam();
  const fs::path dir = fs::temp_directory_path() /
                       ("meshtrain-pipe-fault-" + std::to_string(::getpid()) + "-" + backend);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<testing::ChildProcess> ranks;  // killed and reaped with the test
  for (int r = 0; r < kStages; ++r) {
    ranks.push_back(testing::fork_child([&] {
      stage(backend, dir, r);
      return 98;  // stage() exits on its own
    }));
    ASSERT_TRUE(ranks.back().started());
  }
  const bool ready = testing::wait_until(
      [&] {
        for (int r = 0; r < kStages; ++r)
          if (!fs::exists(dir / ("ready" + std::to_string(r)))) return false;
        return true;
      },
      std::chrono::seconds(60), std::chrono::milliseconds(20));
  ASSERT_TRUE(ready) << read_file(dir / "error0") << read_file(dir / "error1")
                     << read_file(dir / "error2");
  ranks[kVictim].signal(SIGKILL);
  for (int r = 0; r < kStages; ++r) {
    if (r == kVictim) continue;
    const auto status = ranks[r].wait_for(std::chrono::seconds(30));
    ASSERT_TRUE(status.has_value()) << "stage " << r << " did not end";
    const std::string report = read_file(dir / ("error" + std::to_string(r)));
    std::printf("stage %d: %s\n", r, report.c_str());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "stage " << r << ": " << report;
    std::istringstream is(report);
    double seconds = -1;
    std::string kind;
    is >> seconds >> kind;
    EXPECT_EQ(kind, "comm") << report;
    EXPECT_GE(seconds, 0.0) << report;
    EXPECT_LT(seconds, 10.0) << report;  // the 3 s timeout plus slack for a loaded machine
    EXPECT_NE(report.find("[1]"), std::string::npos)
        << "stage " << r << " did not name rank 1: " << report;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Backends, PipelineFaults, ::testing::Values("shm", "tcp"));

}  // namespace
}  // namespace meshtrain::parallel
