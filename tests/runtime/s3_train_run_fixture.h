// Training runs against a real S3-compatible server (s3rver) in the test's directory: the server
// starts before each test, its address and credentials are in this process's environment (for
// clients the test makes itself) and in env() (for the programs it runs). Without s3rver the
// test is skipped, or fails where MESHTRAIN_TEST_REQUIRE names it.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "tests/runtime/train_run_fixture.h"
#include "tests/support/capability.h"
#include "tests/support/s3_server.h"

namespace meshtrain::testing {

class S3TrainRunTest : public TrainRunTest {
 protected:
  // A derived SetUp goes on only when this one neither skipped nor failed (the server is up).
  void SetUp() override {
    TrainRunTest::SetUp();
    if (const auto why = S3Server::missing()) MT_SKIP_UNLESS("s3rver", false, *why);
    server_ = std::make_unique<S3Server>(dir_ / "s3");
    ASSERT_TRUE(server_->start()) << file_bytes(dir_ / "s3" / "s3rver.log");
    server_->set_env();
  }

  std::unique_ptr<S3Server> server_;
};

}  // namespace meshtrain::testing
