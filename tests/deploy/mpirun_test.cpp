// `mpirun -np 2 meshtrain train ...` (Open MPI) trains exactly as `meshrun --nproc-per-node 2`:
// the workers read their place from OMPI_COMM_WORLD_* and meet at rank 0's store, and the loss
// of every step has the same bits as under meshrun.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "meshtrain/comm/socket.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/capability.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::kMeshrunBin;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;

class Mpirun : public meshtrain::testing::TrainRunTest {};

TEST_F(Mpirun, TwoRanksTrainWithTheLossesOfMeshrun) {
  MT_SKIP_UNLESS("mpirun", run_command("command -v mpirun").status == 0,
                 "mpirun (Debian's openmpi-bin) is not installed");
  const int64_t steps = 8;
  const fs::path by_meshrun = dir_ / "meshrun", by_mpirun = dir_ / "mpirun";
  const auto a =
      run_command("env MESHTRAIN_TOKEN=mpirun-test " + kMeshrunBin + " --nproc-per-node 2 -- " +
                  kMeshtrainBin + " " + train_args(by_meshrun, steps, 0));
  ASSERT_EQ(a.status, 0) << a.output;
  // Open MPI refuses to start as root unless told; CI runs as root. --oversubscribe lets two
  // ranks start on a machine that reports fewer slots; MASTER_PORT is any free port.
  const uint16_t port = meshtrain::comm::Socket::listen("127.0.0.1", 0).local_port();
  const std::string root = ::geteuid() == 0 ? " --allow-run-as-root" : "";
  const auto b =
      run_command("mpirun -np 2 --oversubscribe" + root +
                  " -x MESHTRAIN_TOKEN=mpirun-test -x MASTER_PORT=" + std::to_string(port) +
                  " -x OMP_NUM_THREADS=1 " + kMeshtrainBin + " " + train_args(by_mpirun, steps, 0));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find("x ranks 2"), std::string::npos) << b.output;
  const auto la = losses(by_meshrun), lb = losses(by_mpirun);
  ASSERT_EQ(la.size(), static_cast<size_t>(steps)) << a.output;
  ASSERT_EQ(lb.size(), static_cast<size_t>(steps)) << b.output;
  for (const auto& [step, loss] : la) EXPECT_EQ(lb.at(step), loss) << "step " << step;
}

}  // namespace
