// The Kubernetes manifests under deploy/k8s: every base and overlay renders with
// `kubectl kustomize`, and every rendered object validates offline (deploy/k8s/validate: the
// Kubernetes API schemas, the Kubeflow PyTorchJob schema and the operator's rules); a manifest
// broken on purpose is rejected with the field named, so the validation can fail.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/capability.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::run_command;

const fs::path kK8s = fs::path(MESHTRAIN_SOURCE_DIR) / "deploy" / "k8s";

class Manifests : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    MT_SKIP_UNLESS("kubectl", run_command("kubectl kustomize --help").status == 0,
                   "kubectl with kustomize is missing: run scripts/install-deps.sh");
    MT_SKIP_UNLESS("npm", fs::exists(kK8s / "validate" / "node_modules" / "kubernetes-models"),
                   "the validator's npm packages are missing: run scripts/install-deps.sh");
  }
  static std::string render(const std::string& dir) {
    const auto r = run_command("kubectl kustomize " + (kK8s / dir).string() + " 2>/dev/null");
    EXPECT_EQ(r.status, 0) << dir << ":\n" << r.output;
    return r.output;
  }
  // Validates YAML text; returns the validator's status and output.
  static meshtrain::testing::CommandResult validate(const std::string& yaml, const fs::path& tmp) {
    {
      std::ofstream f(tmp);
      f << yaml;
    }
    return run_command("node " + (kK8s / "validate" / "validate.mjs").string() + " " +
                       tmp.string());
  }
};

TEST_P(Manifests, RenderAndValidate) {
  const std::string dir = GetParam();
  const std::string yaml = render(dir);
  ASSERT_FALSE(yaml.empty());
  const fs::path tmp = fs::temp_directory_path() / ("mt_manifest_" + std::to_string(::getpid()));
  const auto r = validate(yaml, tmp);
  fs::remove(tmp);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(" 0 invalid"), std::string::npos) << r.output;
  const bool pytorch = dir.rfind("pytorchjob", 0) == 0;
  EXPECT_NE(r.output.find(pytorch ? "kubeflow.org/v1 PyTorchJob/meshtrain: valid"
                                  : "batch/v1 Job/meshtrain: valid"),
            std::string::npos)
      << r.output;
}

INSTANTIATE_TEST_SUITE_P(Deploy, Manifests,
                         ::testing::Values("indexed-job/base", "indexed-job/overlays/cpu",
                                           "indexed-job/overlays/gpu",
                                           "indexed-job/overlays/parameter-server",
                                           "pytorchjob/base", "pytorchjob/overlays/cpu",
                                           "pytorchjob/overlays/gpu"));

// Replaces the first `from` in `text` by `to` (the test fails when `from` is absent).
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

class BrokenManifests : public Manifests {};

TEST_F(BrokenManifests, AreRejectedNamingTheField) {
  const fs::path tmp = fs::temp_directory_path() / ("mt_broken_" + std::to_string(::getpid()));
  const std::string job = render("indexed-job/overlays/cpu");
  auto r = validate(replaced(job, "restartPolicy: OnFailure", "restartPolicy: Sometimes"), tmp);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("Job/meshtrain: INVALID"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restartPolicy"), std::string::npos) << r.output;

  r = validate(replaced(job, "cpu: \"16\"", "cpu: sixteen"), tmp);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("limits/cpu"), std::string::npos) << r.output;

  const std::string ptj = render("pytorchjob/overlays/gpu");
  r = validate(replaced(ptj, "    Master:\n      replicas: 1", "    Master:\n      replicas: 2"),
               tmp);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("Master/replicas must be 1"), std::string::npos) << r.output;

  r = validate(replaced(ptj, "  runPolicy:", "  runPolicyy:"), tmp);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("additional properties"), std::string::npos) << r.output;

  r = validate(replaced(ptj, "name: pytorch\n", "name: trainer\n"), tmp);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("no container is named \"pytorch\""), std::string::npos) << r.output;
  fs::remove(tmp);
}

}  // namespace
