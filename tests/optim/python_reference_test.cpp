// The PyTorch reference tools under tests/python (safetensors reader/writer, the GPT, the
// training parity reference) check themselves; this runs those checks with the test suite.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/support/capability.h"
#include "torch_reference.h"

namespace meshtrain::optim {
namespace {

TEST(PythonReference, SelfTestPasses) {
  MT_SKIP_UNLESS("torch", testing::torch_available(),
                 testing::kSystemPython << " cannot import torch (python3-torch missing)");
  const std::string cmd =
      testing::python_command() + " '" + MESHTRAIN_SOURCE_DIR + "/tests/python/selftest.py'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace meshtrain::optim
