// `meshtrain place` generates the Indexed Job's placement as kustomize patches: applied on top of
// the GPU overlay they render (kubectl kustomize) into a Job that validates offline and runs on
// exactly the placed nodes, with completions, --nnodes and --nproc-per-node from the placement
// and the overlay's other settings kept. A placement with uneven ranks per node gets no args
// patch and says why.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/capability.h"
#include "tests/support/run_command.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::run_command;
using nlohmann::json;

const fs::path kK8s = fs::path(MESHTRAIN_SOURCE_DIR) / "deploy" / "k8s";
const std::string kMeshtrain = std::string(MESHTRAIN_BINARY_DIR) + "/meshtrain";

class K8sPlacement : public ::testing::Test {
 protected:
  void SetUp() override {
    MT_SKIP_UNLESS("kubectl", run_command("kubectl kustomize --help").status == 0,
                   "kubectl with kustomize is missing: run scripts/install-deps.sh");
    MT_SKIP_UNLESS("npm", fs::exists(kK8s / "validate" / "node_modules" / "kubernetes-models"),
                   "the validator's npm packages are missing: run scripts/install-deps.sh");
    dir_ = fs::temp_directory_path() / ("mt_k8splace_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

TEST_F(K8sPlacement, PlacePatchesRenderIntoAValidJobOnThePlacedNodes) {
  // Three nodes of 4 devices; an 8-rank job takes two of them, in one rack.
  std::ofstream(dir_ / "inv.toml") << "[[node]]\nname = \"gpu-a\"\nrack = \"r0\"\ndevices = 4\n"
                                      "[[node]]\nname = \"gpu-b\"\nrack = \"r1\"\ndevices = 4\n"
                                      "[[node]]\nname = \"gpu-c\"\nrack = \"r0\"\ndevices = 4\n";
  std::ofstream(dir_ / "jobs.toml") << "[[job]]\nname = \"big\"\ndevices = 8\ntp = 4\n";
  auto r =
      run_command(kMeshtrain + " place --inventory " + (dir_ / "inv.toml").string() + " --jobs " +
                  (dir_ / "jobs.toml").string() + " --out-dir " + (dir_ / "placed").string());
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_NE(r.output.find("job big: 8 ranks (dp 2 tp 4 pp 1) on 2 node(s): gpu-a gpu-c"),
            std::string::npos)
      << r.output;
  ASSERT_TRUE(fs::exists(dir_ / "placed" / "big.k8s-args.yaml")) << r.output;

  // An overlay of the GPU overlay with the two generated patches, as docs/run-on-kubernetes.md
  // describes.
  fs::create_directories(dir_ / "k8s" / "placed");
  fs::copy(kK8s / "indexed-job", dir_ / "k8s" / "indexed-job", fs::copy_options::recursive);
  for (const char* f : {"big.k8s-patch.yaml", "big.k8s-args.yaml", "big.k8s-gpu.yaml"})
    fs::copy_file(dir_ / "placed" / f, dir_ / "k8s" / "placed" / f);
  std::ofstream(dir_ / "k8s" / "placed" / "kustomization.yaml")
      << "bases:\n- ../indexed-job/overlays/gpu\n"
         "patchesStrategicMerge:\n- big.k8s-patch.yaml\n- big.k8s-gpu.yaml\n"
         "patchesJson6902:\n- target:\n    group: batch\n    version: v1\n    kind: Job\n"
         "    name: meshtrain\n  path: big.k8s-args.yaml\n";
  const std::string render =
      "kubectl kustomize " + (dir_ / "k8s" / "placed").string() + " 2>/dev/null";
  const auto valid =
      run_command(render + " | node " + (kK8s / "validate" / "validate.mjs").string() + " -");
  EXPECT_EQ(valid.status, 0) << valid.output;
  const auto rendered =
      run_command(render + " | node " + (kK8s / "validate" / "to-json.mjs").string());
  ASSERT_EQ(rendered.status, 0) << rendered.output;
  json job;
  for (const json& o : json::parse(rendered.output))
    if (o["kind"] == "Job") job = o;
  ASSERT_TRUE(job.is_object()) << rendered.output;

  EXPECT_EQ(job["spec"]["completions"], 2);
  EXPECT_EQ(job["spec"]["parallelism"], 2);
  const json& spec = job["spec"]["template"]["spec"];
  const json& terms = spec["affinity"]["nodeAffinity"]
                          ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
  ASSERT_EQ(terms.size(), 1u) << "the placement replaces the pool affinity: " << terms.dump();
  ASSERT_EQ(terms[0]["matchExpressions"].size(), 1u) << terms.dump();
  EXPECT_EQ(terms[0]["matchExpressions"][0]["key"], "kubernetes.io/hostname");
  EXPECT_EQ(terms[0]["matchExpressions"][0]["values"], json::array({"gpu-a", "gpu-c"}));
  const json& c = spec["containers"][0];
  EXPECT_EQ(c["args"][0], "--nnodes=2:2");
  EXPECT_EQ(c["args"][6], "--nproc-per-node=4");
  EXPECT_EQ(c["args"].back(), "--set=train.device=cuda") << c["args"].dump();
  EXPECT_EQ(c["image"], "meshtrain-cuda:latest");
  // One GPU per rank of the pod; the overlay's other resources stay.
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], "4") << c["resources"].dump();
  EXPECT_EQ(c["resources"]["requests"]["nvidia.com/gpu"], "4") << c["resources"].dump();
  EXPECT_EQ(c["resources"]["limits"]["memory"], "256Gi") << c["resources"].dump();
}

TEST_F(K8sPlacement, UnevenRanksPerNodeGetNoArgsPatchAndSayWhy) {
  // 6 free devices on one node and 4 on the other: an 8-rank job takes 6 + 2.
  std::ofstream(dir_ / "inv.toml") << "[[node]]\nname = \"a\"\nrack = \"r0\"\ndevices = 6\n"
                                      "[[node]]\nname = \"b\"\nrack = \"r0\"\ndevices = 4\n";
  std::ofstream(dir_ / "jobs.toml") << "[[job]]\nname = \"odd\"\ndevices = 8\ntp = 2\n";
  auto r =
      run_command(kMeshtrain + " place --inventory " + (dir_ / "inv.toml").string() + " --jobs " +
                  (dir_ / "jobs.toml").string() + " --out-dir " + (dir_ / "placed").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir_ / "placed" / "odd.k8s-patch.yaml"));
  EXPECT_FALSE(fs::exists(dir_ / "placed" / "odd.k8s-args.yaml"));
  EXPECT_FALSE(fs::exists(dir_ / "placed" / "odd.k8s-gpu.yaml"));
  EXPECT_NE(r.output.find("different numbers of ranks"), std::string::npos) << r.output;
}

}  // namespace
