// The Indexed Job and the PyTorchJob of deploy/k8s run as processes, with no cluster: the
// manifests are rendered with `kubectl kustomize`, and every pod's container is started from the
// rendered object exactly as written (command, args with $(VAR) expanded the way the kubelet
// does, env with the values the downward API gives the pod, plus what the kubelet or the
// training operator adds: JOB_COMPLETION_INDEX; MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK) and
// trains; the last pod is then killed and restarted with the same command, as restartPolicy
// OnFailure does, and the job resumes from its checkpoint and trains to the end.
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
// this test (it restarts a container that exited non-zero, with the same command), and for the
// PyTorchJob so is the operator (the variables above, the pod and Service names). The
// ConfigMap's train.toml is replaced, through a kustomize overlay, with a tiny model so that the
// job takes seconds; everything else is rendered from the bases unchanged.
// Needs root (namespaces and mounts).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
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

// A pod as the scheduler, the operator and the kubelet would start it.
struct PodPlan {
  std::string name;            // the pod's name, its hostname
  json spec;                   // its pod template's spec
  std::string restart_policy;  // the template's, or the PyTorchJob replica's
  // The downward API's values for the fieldRefs of its env.
  std::map<std::string, std::string> field_refs;
  // Variables set outside the container's env list: the kubelet's (JOB_COMPLETION_INDEX) and
  // the training operator's (MASTER_ADDR, RANK, ...).
  std::vector<std::pair<std::string, std::string>> injected;
};

class K8sPods : public ::testing::Test {
 protected:
  void SetUp() override {
    MT_SKIP_UNLESS("kubectl", run_command("kubectl kustomize --help").status == 0,
                   "kubectl with kustomize is missing: run scripts/install-deps.sh");
    MT_SKIP_UNLESS("npm", fs::exists(kK8s / "validate" / "node_modules" / "yaml"),
                   "the validator's npm packages are missing: run scripts/install-deps.sh");
    MT_SKIP_UNLESS("netns", ::geteuid() == 0, "pods as processes need namespaces (root)");
    // The container paths are mount points made on this machine: one such test at a time (ctest
    // -j may start both), the other waits for the lock.
    lock_fd_ = ::open("/tmp/meshtrain-k8s-pods.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(lock_fd_, 0);
    ASSERT_EQ(::flock(lock_fd_, LOCK_EX), 0);
    dir_ = fs::temp_directory_path() / ("mt_k8spods_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty() && !HasFailure()) fs::remove_all(dir_);
    if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
  }

  // `kubectl kustomize` of deploy/k8s/<kind>/base, copied so that a test overlay beside it can
  // refer to it (kustomize takes no absolute paths), with the ConfigMap's train.toml replaced by
  // a tiny model; the objects as JSON.
  // `layer`: the base or one of the kind's overlays.
  json render(const std::string& kind, const std::string& layer = "base") {
    fs::create_directories(dir_ / "k8s" / "test");
    fs::copy(kK8s / kind, dir_ / "k8s" / kind, fs::copy_options::recursive);
    std::ofstream(dir_ / "k8s" / "test" / "kustomization.yaml")
        << "resources:\n- ../" << kind << "/" << layer
        << "\n"
           "configMapGenerator:\n- name: meshtrain-config\n  behavior: replace\n  files:\n"
           "  - train.toml\n";
    std::ofstream(dir_ / "k8s" / "test" / "train.toml")
        << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 32\nblock_size = 32\n"
           "[data]\ndir = \"/checkpoints/data\"\nbatch_size = 4\nval_batches = 2\n"
           "[train]\nsteps = "
        << kSteps
        << "\nout_dir = \"/checkpoints/run\"\nlog_interval = 100\neval_interval = 0\n"
           "sample_tokens = 0\nthreads = 1\n"
           "[ckpt]\ninterval = "
        << kCheckpointInterval << "\n";
    const auto rendered =
        run_command("kubectl kustomize " + (dir_ / "k8s" / "test").string() +
                    " 2>/dev/null | node " + (kK8s / "validate" / "to-json.mjs").string());
    EXPECT_EQ(rendered.status, 0) << rendered.output;
    return json::parse(rendered.output, nullptr, false);
  }

  static json find(const json& objects, const std::string& kind) {
    for (const json& o : objects)
      if (o.value("kind", "") == kind) return o;
    return nullptr;
  }

  // Starts every pod, kills the last one's container once the job has a checkpoint, plays the
  // kubelet (OnFailure) until every pod has exited 0, and checks that the job trained to the
  // end and resumed from a checkpoint. `dns`: every name the cluster DNS would resolve, with the
  // index of the pod it names.
  void run_and_kill_last(const json& config, const std::vector<PodPlan>& plans,
                         const std::map<std::string, int>& dns) {
    const fs::path& dir = dir_;
    const int pods = static_cast<int>(plans.size());
    for (const PodPlan& plan : plans) {
      ASSERT_EQ(plan.restart_policy, "OnFailure") << plan.name;
      ASSERT_EQ(plan.spec["containers"].size(), 1u) << plan.name;
    }
    // Volumes (every pod of these jobs has the same ones): the test's directories.
    const json& pod_spec = plans.front().spec;
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
    for (const json& m : pod_spec["containers"][0]["volumeMounts"])
      if (m["mountPath"] == "/checkpoints") checkpoints_vol = volume_dir.at(m["name"]);
    ASSERT_FALSE(checkpoints_vol.empty()) << "no volume at /checkpoints";
    checkpoints_vol_ = checkpoints_vol;
    const auto prep =
        run_command(kBin + "/meshtrain data prepare --input " + (dir / "text.txt").string() +
                    " --out " + (checkpoints_vol / "data").string() + " --val-fraction 0.1");
    ASSERT_EQ(prep.status, 0) << prep.output;

    // Networking: a namespace per pod; DNS through each pod's hosts file.
    meshtrain::comm::testing::NetnsLab lab(pods);
    ASSERT_TRUE(lab.available()) << lab.unavailable_reason();
    MadePaths made;
    std::string hosts = "127.0.0.1 localhost\n";
    for (const auto& [name, index] : dns) hosts += lab.address(index) + " " + name + "\n";
    for (int i = 0; i < pods; ++i) {
      const fs::path etc = fs::path("/etc/netns") / lab.host_namespace(i);
      made.make(etc);
      std::ofstream(etc / "hosts") << hosts;
    }

    // Each pod's script: mounts, hostname, then exactly the container's command and args with
    // exactly its environment.
    std::vector<Pod> all(static_cast<size_t>(pods));
    for (int i = 0; i < pods; ++i) {
      const PodPlan& plan = plans[static_cast<size_t>(i)];
      const json& container = plan.spec["containers"][0];
      std::map<std::string, std::string> env{{"PATH", kBin + ":/usr/local/bin:/usr/bin:/bin"},
                                             {"HOSTNAME", plan.name}};
      std::vector<std::pair<std::string, std::string>> ordered(env.begin(), env.end());
      for (const json& e : container["env"]) {
        std::string value;
        if (e.contains("value")) {
          value = expand(e["value"], env);
        } else {
          const std::string path = e["valueFrom"]["fieldRef"]["fieldPath"];
          const auto it = plan.field_refs.find(path);
          ASSERT_NE(it, plan.field_refs.end())
              << "env " << e.dump() << " has no simulation here: extend the test";
          value = it->second;
        }
        env[e["name"]] = value;
        ordered.emplace_back(e["name"], value);
      }
      for (const auto& [k, v] : plan.injected) {
        env[k] = v;
        ordered.emplace_back(k, v);
      }
      std::string script = "set -e\nhostname " + plan.name + "\n";
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
              if (failures[static_cast<size_t>(p.index)] > 3) return true;  // given up below
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
    for (size_t i = 0; i + 1 < all.size(); ++i)
      EXPECT_EQ(failures[i], 0) << "pod " << i << ": its meshrun restarts its workers itself";

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
  }

  // Renders the Indexed Job from `layer` (its base or an overlay), starts its pods as the Job
  // controller and the kubelet do and runs them through run_and_kill_last.
  void run_indexed_job(const std::string& layer) {
    const json objects = render("indexed-job", layer);
    const json job = find(objects, "Job"), service = find(objects, "Service"),
               config = find(objects, "ConfigMap");
    ASSERT_TRUE(job.is_object() && service.is_object() && config.is_object()) << objects.dump();
    ASSERT_EQ(job["spec"]["completionMode"], "Indexed");
    const json& pod_spec = job["spec"]["template"]["spec"];
    ASSERT_EQ(pod_spec["subdomain"], service["metadata"]["name"]) << "the pods' DNS names";
    const int pods = job["spec"]["completions"].get<int>();
    ASSERT_EQ(job["spec"]["parallelism"].get<int>(), pods);
    const std::string job_name = job["metadata"]["name"], svc = service["metadata"]["name"];

    // Pod <job>-<index>, named <job>-<index>.<service> by the headless Service; the kubelet sets
    // JOB_COMPLETION_INDEX and the downward API the completion-index annotation.
    std::vector<PodPlan> plans;
    std::map<std::string, int> dns;
    for (int i = 0; i < pods; ++i) {
      PodPlan p;
      p.name = job_name + "-" + std::to_string(i);
      p.spec = pod_spec;
      p.restart_policy = pod_spec.value("restartPolicy", "");
      p.field_refs = {
          {"metadata.annotations['batch.kubernetes.io/job-completion-index']", std::to_string(i)},
          {"metadata.labels['batch.kubernetes.io/controller-uid']", kControllerUid}};
      p.injected = {{"JOB_COMPLETION_INDEX", std::to_string(i)}};
      dns[p.name + "." + svc] = i;
      dns[p.name] = i;
      plans.push_back(std::move(p));
    }
    run_and_kill_last(config, plans, dns);
  }

  // The directory behind the pods' /checkpoints, once run_and_kill_last made it.
  const fs::path& checkpoints_dir() const { return checkpoints_vol_; }

  fs::path dir_;
  fs::path checkpoints_vol_;
  int lock_fd_ = -1;
};

TEST_F(K8sPods, IndexedJobPodsTrainToTheEndAndAKilledPodRestartsAndResumes) {
  run_indexed_job("base");
}

// The parameter-server overlay: two worker pods and a server pod (the last, so the one killed);
// the restarted server loads the range it saved with the workers' checkpoint.
TEST_F(K8sPods, ParameterServerPodsTrainToTheEndAndAKilledServerPodRestartsAndResumes) {
  run_indexed_job("overlays/parameter-server");
  if (HasFatalFailure()) return;
  const std::string server_log = read_all(dir_ / "pod2_start2.log");
  EXPECT_NE(server_log.find("parameter server 0: "), std::string::npos) << server_log;
  const json report =
      json::parse(read_all(checkpoints_dir() / "run" / "ps_server0.json"), nullptr, false);
  ASSERT_TRUE(report.is_object());
  EXPECT_GT(report["steps"].get<int64_t>(), 0);
  EXPECT_TRUE(fs::exists(checkpoints_dir() / "run" / "checkpoints" / "param_servers" / "server0"));
}

// The PyTorchJob as the Kubeflow training operator starts it: one pod per replica (Master, then
// the Workers), each with the operator's MASTER_ADDR (the Master's Service, <job>-master-0),
// MASTER_PORT (the container port named pytorchjob-port), WORLD_SIZE (the replicas) and RANK (0
// for the Master, 1 + index for Worker <index>) and PYTHONUNBUFFERED, and the job-name label;
// the operator's per-replica Services are names in the pods' hosts files like the Indexed Job's.
TEST_F(K8sPods, PyTorchJobPodsTrainToTheEndAndAKilledWorkerRestartsAndResumes) {
  const json objects = render("pytorchjob");
  const json ptj = find(objects, "PyTorchJob"), config = find(objects, "ConfigMap");
  ASSERT_TRUE(ptj.is_object() && config.is_object()) << objects.dump();
  const std::string job_name = ptj["metadata"]["name"];
  const json& replicas = ptj["spec"]["pytorchReplicaSpecs"];
  ASSERT_EQ(replicas["Master"]["replicas"], 1);
  const int workers = replicas["Worker"]["replicas"].get<int>();
  const int world = 1 + workers;
  std::string master_port;
  for (const json& port : replicas["Master"]["template"]["spec"]["containers"][0]["ports"])
    if (port["name"] == "pytorchjob-port")
      master_port = std::to_string(port["containerPort"].get<int>());
  ASSERT_FALSE(master_port.empty()) << "the Master has no port named pytorchjob-port";

  std::vector<PodPlan> plans;
  std::map<std::string, int> dns;
  for (int r = 0; r < world; ++r) {
    const bool master = r == 0;
    PodPlan p;
    p.name = job_name + (master ? "-master-0" : "-worker-" + std::to_string(r - 1));
    const json& replica = replicas[master ? "Master" : "Worker"];
    p.spec = replica["template"]["spec"];
    p.restart_policy = replica.value("restartPolicy", "");
    p.field_refs = {{"metadata.labels['training.kubeflow.org/job-name']", job_name}};
    p.injected = {{"MASTER_PORT", master_port},
                  {"MASTER_ADDR", job_name + "-master-0"},
                  {"WORLD_SIZE", std::to_string(world)},
                  {"RANK", std::to_string(r)},
                  {"PYTHONUNBUFFERED", "1"}};
    dns[p.name] = r;
    plans.push_back(std::move(p));
  }
  run_and_kill_last(config, plans, dns);
}

}  // namespace
