// TLS end to end with the built programs: `meshtrain tls gen-ca` and `gen-cert` make a CA and a
// node certificate that load and complete a mutual TLS handshake; a 2-rank meshrun training run
// over the tcp backend with dist.tls = true (and meshrun --tls-*: the store is TLS as well) gives
// the losses of the same run in plaintext; a missing certificate file is one line naming the key
// and the file, exit status 2.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <thread>

#include "meshtrain/comm/socket.h"
#include "meshtrain/comm/tls.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using meshtrain::testing::CommandResult;
using meshtrain::testing::kMeshtrainBin;
using meshtrain::testing::run_command;

class TlsCli : public meshtrain::testing::TrainRunTest {
 protected:
  // A CA and one certificate for 127.0.0.1 in dir_/pki, through the command line.
  void make_pki() {
    pki_ = dir_ / "pki";
    CommandResult ca = run_command(kMeshtrainBin + " tls gen-ca --out " + pki_.string());
    ASSERT_EQ(ca.status, 0) << ca.output;
    CommandResult node =
        run_command(kMeshtrainBin + " tls gen-cert --ca " + (pki_ / "ca.pem").string() +
                    " --host 127.0.0.1 --host localhost --out " + pki_.string());
    ASSERT_EQ(node.status, 0) << node.output;
  }
  meshtrain::comm::TlsSettings settings() const {
    meshtrain::comm::TlsSettings s;
    s.enabled = true;
    s.cert = (pki_ / "127.0.0.1.pem").string();
    s.key = (pki_ / "127.0.0.1.key").string();
    s.ca = (pki_ / "ca.pem").string();
    return s;
  }
  fs::path pki_;
};

TEST_F(TlsCli, GeneratedCertificatesCompleteAMutualHandshake) {
  make_pki();
  ASSERT_FALSE(HasFatalFailure());
  for (const char* f : {"ca.pem", "ca.key", "127.0.0.1.pem", "127.0.0.1.key"})
    EXPECT_TRUE(fs::exists(pki_ / f)) << f;
  struct stat st {};
  ASSERT_EQ(::stat((pki_ / "127.0.0.1.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto ctx = meshtrain::comm::TlsContext::load(settings());
  EXPECT_NE(ctx->subject().find("CN=127.0.0.1"), std::string::npos) << ctx->subject();
  using meshtrain::comm::Deadline;
  using meshtrain::comm::Socket;
  Socket listener = Socket::listen("127.0.0.1", 0);
  std::string server_error;
  std::thread server([&] {
    try {
      Socket s = listener.accept(Deadline(10s));
      s.start_tls(*ctx, true, Deadline(10s));
      // The server speaks first, as in the store's and the transport's protocols.
      s.send_all("hello", 5, Deadline(10s));
      char buf[6] = {0};
      s.recv_all(buf, 5, Deadline(10s));
      if (std::string(buf) != "hello") server_error = "echo was '" + std::string(buf) + "'";
    } catch (const std::exception& e) {
      server_error = e.what();
    }
  });
  char echo[6] = {0};
  try {
    Socket c = Socket::connect("127.0.0.1", listener.local_port(), Deadline(10s));
    c.start_tls(*ctx, false, Deadline(10s));
    c.recv_all(echo, 5, Deadline(10s));
    c.send_all(echo, 5, Deadline(10s));
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  server.join();
  EXPECT_EQ(server_error, "");
  EXPECT_STREQ(echo, "hello");
}

TEST_F(TlsCli, TwoRankMeshrunOverTcpGivesThePlaintextLosses) {
  make_pki();
  ASSERT_FALSE(HasFatalFailure());
  const auto s = settings();
  const std::string tcp = "--set dist.backend=tcp ";
  CommandResult plain = run_command(meshrun(2) + train_args(dir_ / "plain", 8, 0, tcp));
  ASSERT_EQ(plain.status, 0) << plain.output;
  const std::string meshrun_tls =
      "--tls-cert " + s.cert + " --tls-key " + s.key + " --tls-ca " + s.ca;
  const std::string config_tls = "--set dist.tls=true --set dist.tls_cert=" + s.cert +
                                 " --set dist.tls_key=" + s.key + " --set dist.tls_ca=" + s.ca;
  // The workers' metrics endpoints (any free port) are https too.
  CommandResult tls =
      run_command(meshrun(2, meshrun_tls) + train_args(dir_ / "tls", 8, 0, tcp + config_tls) +
                  " --set train.log_interval=1 --set train.metrics_port=0");
  ASSERT_EQ(tls.status, 0) << tls.output;
  EXPECT_NE(tls.output.find("[rank 1] [meshtrain]"), std::string::npos) << tls.output;
  EXPECT_NE(tls.output.find("TLS 1.3 on the store, the tcp collectives and the metrics endpoint "
                            "as /O=meshtrain/CN=127.0.0.1"),
            std::string::npos)
      << tls.output;
  EXPECT_NE(tls.output.find("rank 1 serving https://127.0.0.1:"), std::string::npos) << tls.output;
  EXPECT_EQ(plain.output.find("TLS 1.3 on"), std::string::npos) << plain.output;
  const auto a = losses(dir_ / "plain"), b = losses(dir_ / "tls");
  ASSERT_EQ(a.size(), 8u) << plain.output;
  EXPECT_EQ(a, b) << tls.output;
}

TEST_F(TlsCli, MissingCertificateIsOneLineNamingKeyAndFile) {
  const std::string missing = (dir_ / "nowhere.pem").string();
  CommandResult r = run_command(kMeshtrainBin + " " + train_args(dir_ / "run", 2, 0) +
                                " --set dist.tls=true --set dist.tls_cert=" + missing);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("dist.tls_cert = \"" + missing +
                          "\": cannot read the file: No such file or directory"),
            std::string::npos)
      << r.output;
  // meshrun's flag likewise, before any worker starts.
  CommandResult m = run_command(meshtrain::testing::kMeshrunBin +
                                " --nproc-per-node 2 --tls-cert " + missing + " -- true");
  EXPECT_EQ(m.status, 2) << m.output;
  EXPECT_NE(m.output.find("--tls-cert = \"" + missing + "\": cannot read the file"),
            std::string::npos)
      << m.output;
}

}  // namespace
