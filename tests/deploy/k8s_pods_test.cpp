// The Indexed Job of deploy/k8s run as processes, with no cluster: the manifests are rendered
// with `kubectl kustomize`, and every pod's container is started from the rendered Job exactly as
// written (command, args with $(VAR) expanded the way the kubelet does, env with the values the
// downward API gives an Indexed Job's pod) and trains; one pod is then killed and restarted with
// the same command, as restartPolicy OnFailure does, and the job resumes from its checkpoint
// and trains to the end.
//
// What is real: the rendered objects, the container command line and environment, meshrun and
// meshtrain, the fixed ports the manifests name (29400, 9400: each pod has a network namespace
// of its own with its own address, 10.231.0.<index+1>), the rendezvous through the headless
// Service's DNS name, the token file, the ConfigMap's file, the shared checkpoint volume, a
// memory-backed /dev/shm of the manifest's size limit, and killing a container (its PID
// namespace's first process gets SIGKILL, which takes every process of the pod with it).
//
// What is simulated: the cluster DNS is the pod's /etc/hosts (written under /etc/netns/<ns>/,
// which `ip netns exec` mounts over /etc/hosts), naming every <job>-<index>.<service> with that
// pod's address; volumes are bind mounts of test directories (the PersistentVolumeClaim one
// directory shared by all pods, the Secret a file with a test token) on the container paths,
// which are created on this machine when missing and removed afterwards; the image is this build
// (its directory first on PATH); the controller-uid label is a fixed UUID; and the kubelet is
// this test (it restarts a container that exited non-zero, with the same command). The
// ConfigMap's train.toml is replaced, through a kustomize overlay, with a tiny model so that the
// job takes seconds; everything else is rendered from deploy/k8s/indexed-job/base unchanged.
// Needs root (namespaces and mounts).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/comm/netns_lab.h"
#include "tests/support/capability.h"
#include "tests/support/child_process.h"
#include "tests/support/run_command.h"
#include "tests/support/wait.h"

namespace {

namespace fs = std::filesystem;
using meshtrain::testing::ChildProcess;
using meshtrain::testing::run_command;
using nlohmann::json;

const fs::path kK8s = fs::path(MESHTRAIN_SOURCE_DIR) / "deploy" / "k8s";
const std::string kBin = MESHTRAIN_BINARY_DIR;
constexpr const char* kControllerUid = "6c1b7a4e-3f0d-4b8e-9a57-2d1e0c9f8b31";
constexpr int kSteps = 1500;
constexpr int kCheckpointInterval = 50;

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The kubelet's expansion of $(VAR) in command and args: a defined variable is replaced, $$ is
// a literal $, anything else is left as written.
std::string expand(const std::string& s, const std::map<std::string, std::string>& env) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 2, "$$") == 0) {
      out += '$';
      i += 2;
      continue;
    }
    if (s.compare(i, 2, "$(") == 0) {
      const size_t end = s.find(')', i);
      if (end != std::string::npos) {
        const auto it = env.find(s.substr(i + 2, end - i - 2));
        if (it != env.end()) {
          out += it->second;
          i = end + 1;
          continue;
        }
      }
    }
    out += s[i++];
  }
  return out;
}

// A Kubernetes quantity such as 2Gi or 512Mi, in bytes.
uint64_t quantity_bytes(const std::string& q) {
  static const std::map<std::string, uint64_t> units{
      {"", 1},     {"Ki", 1ull << 10}, {"Mi", 1ull << 20}, {"Gi", 1ull << 30},
      {"k", 1000}, {"M", 1000000},     {"G", 1000000000}};
  size_t n = 0;
  const uint64_t v = std::stoull(q, &n);
  return v * units.at(q.substr(n));
}

// Directories made on this machine for mount points, removed (when still empty) at the end, and
// the /etc/netns/<ns> directories of the pods' hosts files.
struct MadePaths {
  std::vector<fs::path> dirs;
  ~MadePaths() {
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
      std::error_code ec;
      if (it->string().rfind("/etc/netns/", 0) == 0)
        fs::remove_all(*it, ec);
      else
        fs::remove(*it, ec);  // only if empty: never anything a mount left behind
    }
  }
  void make(const fs::path& p) {
    std::vector<fs::path> missing;
    for (fs::path q = p; !q.empty() && q != q.root_path() && !fs::exists(q); q = q.parent_path())
      missing.push_back(q);
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      fs::create_directory(*it);
      dirs.push_back(*it);
    }
  }
};

// One pod: the script that sets up its mounts and hostname and then execs the container's
// command, and its process (ip netns exec -> unshare; the pod's first process is unshare's child).
struct Pod {
  int index = 0;
  fs::path script;
  ChildProcess process;
  int starts = 0;
  std::optional<int> completed_status;
};

class K8sPods : public ::testing::Test {
 protected:
  void SetUp() override {
    MT_SKIP_UNLESS("kubectl", run_command("kubectl kustomize --help").status == 0,
                   "kubectl with kustomize is missing: run scripts/install-deps.sh");
    MT_SKIP_UNLESS("npm", fs::exists(kK8s / "validate" / "node_modules" / "yaml"),
                   "the validator's npm packages are missing: run scripts/install-deps.sh");
    MT_SKIP_UNLESS("netns", ::geteuid() == 0, "pods as processes need namespaces (root)");
  }
};

TEST_F(K8sPods, IndexedJobPodsTrainToTheEndAndAKilledPodRestartsAndResumes) {
  const fs::path dir = fs::temp_directory_path() / ("mt_k8spods_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);

  // The base, copied so that a test overlay beside it can refer to it (kustomize takes no
  // absolute paths), with the ConfigMap's train.toml replaced by a tiny model.
  fs::create_directories(dir / "k8s" / "test");
  fs::copy(kK8s / "indexed-job", dir / "k8s" / "indexed-job", fs::copy_options::recursive);
  std::ofstream(dir / "k8s" / "test" / "kustomization.yaml")
      << "resources:\n- ../indexed-job/base\n"
         "configMapGenerator:\n- name: meshtrain-config\n  behavior: replace\n  files:\n"
         "  - train.toml\n";
  std::ofstream(dir / "k8s" / "test" / "train.toml")
      << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 32\nblock_size = 32\n"
         "[data]\ndir = \"/checkpoints/data\"\nbatch_size = 4\nval_batches = 2\n"
         "[train]\nsteps = "
      << kSteps
      << "\nout_dir = \"/checkpoints/run\"\nlog_interval = 100\neval_interval = 0\n"
         "sample_tokens = 0\nthreads = 1\n"
         "[ckpt]\ninterval = "
      << kCheckpointInterval << "\n";
  const auto rendered =
      run_command("kubectl kustomize " + (dir / "k8s" / "test").string() + " 2>/dev/null | node " +
                  (kK8s / "validate" / "to-json.mjs").string());
  ASSERT_EQ(rendered.status, 0) << rendered.output;
  const json objects = json::parse(rendered.output);
  json job, service, config;
  for (const json& o : objects) {
    if (o["kind"] == "Job") job = o;
    if (o["kind"] == "Service") service = o;
    if (o["kind"] == "ConfigMap") config = o;
  }
  ASSERT_TRUE(job.is_object() && service.is_object() && config.is_object()) << rendered.output;
  ASSERT_EQ(job["spec"]["completionMode"], "Indexed");
  const json& pod_spec = job["spec"]["template"]["spec"];
  ASSERT_EQ(pod_spec["restartPolicy"], "OnFailure");
  ASSERT_EQ(pod_spec["subdomain"], service["metadata"]["name"]) << "the pods' DNS names";
  ASSERT_EQ(pod_spec["containers"].size(), 1u);
  const json& container = pod_spec["containers"][0];
  const int pods = job["spec"]["completions"].get<int>();
  ASSERT_EQ(job["spec"]["parallelism"].get<int>(), pods);
  const std::string job_name = job["metadata"]["name"], svc = service["metadata"]["name"];

  // Volumes: the test's directories for them.
  const fs::path vol = dir / "volumes";
  std::map<std::string, fs::path> volume_dir;   // volume name -> source directory
  std::map<std::string, uint64_t> tmpfs_bytes;  // memory-backed emptyDir -> size limit
  for (const json& v : pod_spec["volumes"]) {
    const std::string name = v["name"];
    const fs::path d = vol / name;
    fs::create_directories(d);
    if (v.contains("configMap")) {
      ASSERT_EQ(v["configMap"]["name"], config["metadata"]["name"]);
      for (const auto& [file, text] : config["data"].items())
        std::ofstream(d / file) << text.get<std::string>();
    } else if (v.contains("secret")) {
      std::ofstream(d / "token") << "k8s-pods-test-token\n";
      fs::permissions(d / "token", fs::perms::owner_read);
    } else if (v.contains("persistentVolumeClaim")) {
      // ReadWriteMany: one directory for every pod.
    } else if (v.contains("emptyDir") && v["emptyDir"].value("medium", "") == "Memory") {
      tmpfs_bytes[name] = quantity_bytes(v["emptyDir"]["sizeLimit"].get<std::string>());
    } else {
      FAIL() << "volume " << v.dump() << " has no simulation here: extend the test";
    }
    volume_dir[name] = d;
  }
  // The dataset on the checkpoint volume, where docs/run-on-kubernetes.md puts it.
  {
    std::ofstream text(dir / "text.txt");
    for (int i = 0; i < 6000; ++i)
      text << "line " << i % 89 << " of the text, word " << i % 31 << ".\n";
  }
  fs::path checkpoints_vol;
  for (const json& m : container["volumeMounts"])
    if (m["mountPath"] == "/checkpoints") checkpoints_vol = volume_dir.at(m["name"]);
  ASSERT_FALSE(checkpoints_vol.empty()) << "no volume at /checkpoints";
  const auto prep =
      run_command(kBin + "/meshtrain data prepare --input " + (dir / "text.txt").string() +
                  " --out " + (checkpoints_vol / "data").string() + " --val-fraction 0.1");
  ASSERT_EQ(prep.status, 0) << prep.output;

  // Networking: a namespace per pod; DNS through each pod's hosts file.
  meshtrain::comm::testing::NetnsLab lab(pods);
  ASSERT_TRUE(lab.available()) << lab.unavailable_reason();
  MadePaths made;
  std::string hosts = "127.0.0.1 localhost\n";
  for (int i = 0; i < pods; ++i) {
    const std::string pod = job_name + "-" + std::to_string(i);
    hosts += lab.address(i) + " " + pod + "." + svc + " " + pod + "\n";
  }
  for (int i = 0; i < pods; ++i) {
    const fs::path etc = fs::path("/etc/netns") / lab.host_namespace(i);
    made.make(etc);
    std::ofstream(etc / "hosts") << hosts;
  }

  // Each pod's script: mounts, hostname, then exactly the container's command and args with
  // exactly its environment.
  std::vector<Pod> all(static_cast<size_t>(pods));
  for (int i = 0; i < pods; ++i) {
    const std::string pod = job_name + "-" + std::to_string(i);
    std::map<std::string, std::string> env{{"PATH", kBin + ":/usr/local/bin:/usr/bin:/bin"},
                                           {"HOSTNAME", pod},
                                           {"JOB_COMPLETION_INDEX", std::to_string(i)}};
    std::vector<std::pair<std::string, std::string>> ordered(env.begin(), env.end());
    for (const json& e : container["env"]) {
      std::string value;
      if (e.contains("value")) {
        value = expand(e["value"], env);
      } else {
        const std::string path = e["valueFrom"]["fieldRef"]["fieldPath"];
        if (path == "metadata.annotations['batch.kubernetes.io/job-completion-index']")
          value = std::to_string(i);
        else if (path == "metadata.labels['batch.kubernetes.io/controller-uid']")
          value = kControllerUid;
        else
          FAIL() << "env " << e.dump() << " has no simulation here: extend the test";
      }
      env[e["name"]] = value;
      ordered.emplace_back(e["name"], value);
    }
    std::string script = "set -e\nhostname " + pod + "\n";
    for (const json& m : container["volumeMounts"]) {
      const std::string name = m["name"], path = m["mountPath"];
      made.make(path);
      if (tmpfs_bytes.count(name) != 0) {
        script += "mount -t tmpfs -o size=" + std::to_string(tmpfs_bytes.at(name)) + " tmpfs " +
                  shell_quote(path) + "\n";
      } else {
        script += "mount --bind " + shell_quote(volume_dir.at(name).string()) + " " +
                  shell_quote(path) + "\n";
        if (m.value("readOnly", false))
          script += "mount -o remount,bind,ro " + shell_quote(path) + "\n";
      }
    }
    script += "exec env -i";
    for (const auto& [k, v] : ordered) script += " " + shell_quote(k + "=" + v);
    for (const json& c : container["command"]) script += " " + shell_quote(expand(c, env));
    for (const json& a : container["args"]) script += " " + shell_quote(expand(a, env));
    script += "\n";
    all[static_cast<size_t>(i)].index = i;
    all[static_cast<size_t>(i)].script = dir / ("pod" + std::to_string(i) + ".sh");
    std::ofstream(all[static_cast<size_t>(i)].script) << script;
  }

  // The kubelet: start a pod's container (a new PID namespace whose first process runs the
  // script, so that killing it kills the whole container).
  const auto start = [&](Pod& p) {
    ++p.starts;
    p.process = lab.spawn(
        p.index,
        {"unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "--propagation",
         "private", "sh", p.script.string()},
        {},
        (dir / ("pod" + std::to_string(p.index) + "_start" + std::to_string(p.starts) + ".log"))
            .string());
    ASSERT_TRUE(p.process.started());
  };
  for (Pod& p : all) start(p);
  // Every pod's processes go with the test, whatever happens.
  struct KillPods {
    std::vector<Pod>& pods;
    ~KillPods() {
      for (Pod& p : pods)
        for (pid_t c : meshtrain::testing::children_of(p.process.pid())) ::kill(c, SIGKILL);
    }
  } kill_pods{all};

  const fs::path root = checkpoints_vol / "run" / "checkpoints";
  const auto logs = [&] {
    std::string s;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".log")
        s += "--- " + e.path().filename().string() + "\n" + read_all(e.path());
    return s;
  };

  // Once the job has a checkpoint, the container of the last pod is killed.
  ASSERT_TRUE(meshtrain::testing::wait_until([&] { return fs::exists(root / "latest"); },
                                             std::chrono::seconds(120),
                                             std::chrono::milliseconds(50)))
      << "no checkpoint was written\n"
      << logs();
  Pod& victim = all.back();
  const std::vector<pid_t> first = meshtrain::testing::children_of(victim.process.pid());
  ASSERT_EQ(first.size(), 1u) << "the pod's first process";
  ASSERT_EQ(::kill(first[0], SIGKILL), 0);

  // The kubelet's loop: a container that exits non-zero is restarted (OnFailure); one that
  // exits 0 is done. Until every pod is done or the deadline.
  std::vector<int> failures(all.size(), 0);
  const bool done = meshtrain::testing::wait_until(
      [&] {
        bool all_done = true;
        for (Pod& p : all) {
          if (p.completed_status) continue;
          const auto st = p.process.wait_for(std::chrono::milliseconds(0));
          if (!st) {
            all_done = false;
            continue;
          }
          if (WIFEXITED(*st) && WEXITSTATUS(*st) == 0) {
            p.completed_status = *st;
          } else {
            ++failures[static_cast<size_t>(p.index)];
            if (failures[static_cast<size_t>(p.index)] > 3) return true;  // give up below
            start(p);
            all_done = false;
          }
        }
        return all_done;
      },
      std::chrono::seconds(200), std::chrono::milliseconds(50));
  ASSERT_TRUE(done) << "the job did not finish\n" << logs();
  for (const Pod& p : all)
    ASSERT_TRUE(p.completed_status.has_value())
        << "pod " << p.index << " failed " << failures[static_cast<size_t>(p.index)] << " times\n"
        << logs();
  EXPECT_EQ(failures.back(), 1) << "the killed pod was restarted once\n" << logs();
  EXPECT_EQ(all.back().starts, 2);
  EXPECT_EQ(failures.front(), 0) << "the other pod's meshrun restarts its workers itself";

  // The job trained to the end, resuming from a checkpoint after the kill.
  const fs::path out = checkpoints_vol / "run";
  int64_t last = 0;
  std::vector<json> resumes;
  {
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line, nullptr, false);
      if (!j.is_object()) continue;
      if (j.contains("loss")) last = std::max<int64_t>(last, j["step"].get<int64_t>());
      if (j.value("event", "") == "resume") resumes.push_back(j);
    }
  }
  EXPECT_EQ(last, kSteps) << logs();
  ASSERT_GE(resumes.size(), 1u) << "no resume after the kill\n" << logs();
  EXPECT_GE(resumes[0]["step"].get<int64_t>(), kCheckpointInterval);
  EXPECT_LT(resumes[0]["step"].get<int64_t>(), kSteps) << "killed before the end";
  const json state = json::parse(read_all(root / "job_state.json"), nullptr, false);
  ASSERT_TRUE(state.is_object());
  EXPECT_EQ(state["completed"], true);
  EXPECT_GE(state["resumes_success"].get<int>(), 1);
  EXPECT_NE(read_all(dir / "pod0_start1.log").find("resumed from /checkpoints/run/checkpoints/"),
            std::string::npos)
      << "rank 0 (pod 0) resumed from the shared volume\n"
      << logs();
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
