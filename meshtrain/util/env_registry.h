// Every MESHTRAIN_* environment variable that meshtrain, meshrun, the tests or the deploy scripts
// read, declared once: name, type, default, who reads it and what it means. Code reads a variable
// only through env_value(Env::...), so the registry is complete by construction, `meshtrain env`
// lists it, and a MESHTRAIN_* variable that is set but declared nowhere (a misspelling, a
// variable of an older release) can be named with the closest known one.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

// Who reads a variable (a bit set): meshrun, the meshtrain process (worker or single process),
// the test programs only, or a deploy/demo shell script.
enum EnvReader : uint8_t {
  kEnvLauncher = 1,
  kEnvWorker = 2,
  kEnvTest = 4,
  kEnvScript = 8,
};

// X(id, name, type, default, readers, meaning). Add a variable here, read it with
// env_value(Env::id). Variables read by tests alone carry kEnvTest only (and say so in `meshtrain
// env`); a secret's value is never printed.
#define MESHTRAIN_ENV_SETTINGS(X)                                                                  \
  X(log_level, "MESHTRAIN_LOG_LEVEL", "choice", "info", kEnvLauncher | kEnvWorker,                 \
    "log threshold: debug, info, warn (or warning), error")                                        \
  X(token, "MESHTRAIN_TOKEN", "secret", "", kEnvLauncher | kEnvWorker | kEnvScript,                \
    "job token that authenticates store and collective connections (meshrun makes one when "       \
    "unset)")                                                                                      \
  X(token_file, "MESHTRAIN_TOKEN_FILE", "path", "", kEnvLauncher | kEnvWorker | kEnvScript,        \
    "file holding the job token, read when MESHTRAIN_TOKEN is unset")                              \
  X(store_host, "MESHTRAIN_STORE_HOST", "choice", "", kEnvLauncher | kEnvWorker,                   \
    "'agent': the launcher agent hosts the store, so rank 0 does not (set by meshrun)")            \
  X(rank, "MESHTRAIN_RANK", "int", "", kEnvWorker, "overrides the launcher's RANK")                \
  X(world_size, "MESHTRAIN_WORLD_SIZE", "int", "", kEnvWorker,                                     \
    "overrides the launcher's WORLD_SIZE")                                                         \
  X(local_rank, "MESHTRAIN_LOCAL_RANK", "int", "", kEnvWorker,                                     \
    "overrides the launcher's LOCAL_RANK")                                                         \
  X(local_world_size, "MESHTRAIN_LOCAL_WORLD_SIZE", "int", "", kEnvWorker,                         \
    "overrides the launcher's LOCAL_WORLD_SIZE")                                                   \
  X(group_rank, "MESHTRAIN_GROUP_RANK", "int", "", kEnvWorker,                                     \
    "overrides the launcher's GROUP_RANK (node rank)")                                             \
  X(master_addr, "MESHTRAIN_MASTER_ADDR", "host", "", kEnvWorker,                                  \
    "overrides the launcher's MASTER_ADDR (the store's host)")                                     \
  X(master_port, "MESHTRAIN_MASTER_PORT", "port", "", kEnvWorker,                                  \
    "overrides the launcher's MASTER_PORT (the store's port)")                                     \
  X(restart_count, "MESHTRAIN_RESTART_COUNT", "int", "", kEnvWorker,                               \
    "overrides the launcher's TORCHELASTIC_RESTART_COUNT")                                         \
  X(replacement, "MESHTRAIN_REPLACEMENT", "int", "0", kEnvWorker,                                  \
    "set by meshrun: this process replaces its rank's N-th failed one while the job goes on")      \
  X(grace_period_ms, "MESHTRAIN_GRACE_PERIOD_MS", "int", "", kEnvWorker,                           \
    "the launcher's grace period from SIGTERM to SIGKILL (set by meshrun): a collective still "    \
    "blocked half of it after SIGTERM is abandoned, naming the ranks it waited for (else 5 s)")    \
  X(rdzv_backend, "MESHTRAIN_RDZV_BACKEND", "choice", "tcp", kEnvLauncher | kEnvWorker,            \
    "where the rendezvous store lives: tcp (MASTER_ADDR:MASTER_PORT) or etcd")                     \
  X(rdzv_endpoint, "MESHTRAIN_RDZV_ENDPOINT", "list", "", kEnvLauncher | kEnvWorker,               \
    "etcd members, HOST:PORT[,HOST:PORT...] (with MESHTRAIN_RDZV_BACKEND=etcd)")                   \
  X(rdzv_id, "MESHTRAIN_RDZV_ID", "string", "", kEnvLauncher | kEnvWorker,                         \
    "the job's id in etcd (with MESHTRAIN_RDZV_BACKEND=etcd)")                                     \
  X(etcd_user, "MESHTRAIN_ETCD_USER", "string", "", kEnvLauncher | kEnvWorker, "etcd user name")   \
  X(etcd_password, "MESHTRAIN_ETCD_PASSWORD", "secret", "", kEnvLauncher | kEnvWorker,             \
    "etcd password")                                                                               \
  X(etcd_password_file, "MESHTRAIN_ETCD_PASSWORD_FILE", "path", "", kEnvLauncher | kEnvWorker,     \
    "file holding the etcd password, read when MESHTRAIN_ETCD_PASSWORD is unset")                  \
  X(etcd_cacert, "MESHTRAIN_ETCD_CACERT", "path", "", kEnvLauncher | kEnvWorker,                   \
    "CA certificate that verifies the etcd members (TLS)")                                         \
  X(etcd_cert, "MESHTRAIN_ETCD_CERT", "path", "", kEnvLauncher | kEnvWorker,                       \
    "client certificate presented to etcd (TLS)")                                                  \
  X(etcd_key, "MESHTRAIN_ETCD_KEY", "path", "", kEnvLauncher | kEnvWorker,                         \
    "private key of MESHTRAIN_ETCD_CERT")                                                          \
  X(tls, "MESHTRAIN_TLS", "bool", "0", kEnvLauncher | kEnvWorker,                                  \
    "1 or true: the store and the tcp collectives speak TLS 1.3 with mutual certificates "         \
    "(meshrun --tls sets it for its workers)")                                                     \
  X(tls_cert, "MESHTRAIN_TLS_CERT", "path", "", kEnvLauncher | kEnvWorker,                         \
    "this node's TLS certificate, PEM (with MESHTRAIN_TLS)")                                       \
  X(tls_key, "MESHTRAIN_TLS_KEY", "path", "", kEnvLauncher | kEnvWorker,                           \
    "private key of MESHTRAIN_TLS_CERT, PEM")                                                      \
  X(tls_ca, "MESHTRAIN_TLS_CA", "path", "", kEnvLauncher | kEnvWorker,                             \
    "CA certificate every peer's certificate must chain to, PEM")                                  \
  X(elastic_min_nodes, "MESHTRAIN_ELASTIC_MIN_NODES", "int", "", kEnvWorker,                       \
    "set by meshrun --nnodes MIN:MAX: MIN, the fewest nodes the job may shrink to")                \
  X(host_id, "MESHTRAIN_HOST_ID", "string", "hostname", kEnvWorker,                                \
    "which host a rank is on, for the host-aware collectives (ranks with equal ids share memory)") \
  X(comm_addr, "MESHTRAIN_COMM_ADDR", "host", "towards MASTER_ADDR", kEnvWorker,                   \
    "address the tcp backend listens on and announces to its peers")                               \
  X(comm_algo, "MESHTRAIN_COMM_ALGO", "choice", "auto", kEnvWorker,                                \
    "collective algorithm for every group: ring, halving_doubling, tree, direct")                  \
  X(shm_step_bytes, "MESHTRAIN_SHM_STEP_BYTES", "bytes", "131072", kEnvWorker,                     \
    "shm backend: step of a large all-reduce (tuning)")                                            \
  X(shm_whole_bytes, "MESHTRAIN_SHM_WHOLE_BYTES", "bytes", "32768", kEnvWorker,                    \
    "shm backend: largest all-reduce reduced whole by every rank (tuning)")                        \
  X(shm_inline_bytes, "MESHTRAIN_SHM_INLINE_BYTES", "bytes", "65536", kEnvWorker,                  \
    "shm backend: largest collective run on the caller's thread (tuning)")                         \
  X(shm_spin_us, "MESHTRAIN_SHM_SPIN_US", "int", "20", kEnvWorker,                                 \
    "shm backend: microseconds a waiting rank spins before yielding (tuning)")                     \
  X(shm_yield_us, "MESHTRAIN_SHM_YIELD_US", "int", "50", kEnvWorker,                               \
    "shm backend: microseconds a waiting rank yields before sleeping (tuning)")                    \
  X(shm_shared_min_bytes, "MESHTRAIN_SHM_SHARED_MIN_BYTES", "bytes", "262144", kEnvWorker,         \
    "shm backend: smallest all-reduce on a shared buffer that is reduced in place (tuning)")       \
  X(shm_shared_chunk_bytes, "MESHTRAIN_SHM_SHARED_CHUNK_BYTES", "bytes", "65536", kEnvWorker,      \
    "shm backend: chunk an in-place all-reduce is claimed in (tuning)")                            \
  X(shm_in_place_leave_us, "MESHTRAIN_SHM_IN_PLACE_LEAVE_US", "int", "auto", kEnvWorker,           \
    "shm backend: microseconds an in-place all-reduce waits for its issuer (tuning)")              \
  X(nvml_library, "MESHTRAIN_NVML_LIBRARY", "path", "libnvidia-ml.so.1", kEnvWorker,               \
    "NVML library for GPU telemetry (the driver's)")                                               \
  X(cuda_attention, "MESHTRAIN_CUDA_ATTENTION", "choice", "flash", kEnvWorker,                     \
    "cuda attention kernels: flash (under bf16 or f16 autocast), gemm or simple")                  \
  X(metrics_port, "MESHTRAIN_METRICS_PORT", "port", "", kEnvLauncher | kEnvWorker,                 \
    "serve Prometheus metrics on this port + LOCAL_RANK (0: any free port; unset: no server)")     \
  X(metrics_host, "MESHTRAIN_METRICS_HOST", "host", "127.0.0.1", kEnvLauncher | kEnvWorker,        \
    "address the metrics server binds")                                                            \
  X(metrics_port_fallback, "MESHTRAIN_METRICS_PORT_FALLBACK", "bool", "0", kEnvWorker,             \
    "1 or true: take any free port when MESHTRAIN_METRICS_PORT is taken")                          \
  X(job_id, "MESHTRAIN_JOB_ID", "string", "meshtrain", kEnvWorker, "the metrics' job label")       \
  X(node_name, "MESHTRAIN_NODE_NAME", "string", "hostname", kEnvWorker, "the metrics' node label") \
  X(ps_servers, "MESHTRAIN_PS_SERVERS", "int", "", kEnvLauncher | kEnvWorker,                      \
    "meshrun --ps-servers: the job's last N ranks are parameter servers")                          \
  X(s3_parallel, "MESHTRAIN_S3_PARALLEL", "int", "4", kEnvWorker,                                  \
    "s3:// checkpoints and datasets: parts (or small files) uploaded or downloaded at a time")     \
  X(s3_part_mb, "MESHTRAIN_S3_PART_MB", "int", "64", kEnvWorker,                                   \
    "s3:// checkpoints: multipart part size in MiB (files of 8 parts or more go multipart)")       \
  X(s3_queue, "MESHTRAIN_S3_QUEUE", "int", "4", kEnvWorker,                                        \
    "s3:// checkpoints: checkpoints waiting for upload; past it the oldest waiting one is "        \
    "skipped")                                                                                     \
  X(s3_retry_max_s, "MESHTRAIN_S3_RETRY_MAX_S", "float", "60", kEnvWorker,                         \
    "s3:// checkpoints: longest wait between attempts of a failed upload")                         \
  X(s3_drain_s, "MESHTRAIN_S3_DRAIN_S", "float", "600", kEnvWorker,                                \
    "s3:// checkpoints: at the end of a run, how long to wait for uploads still queued")           \
  X(s3_cache, "MESHTRAIN_S3_CACHE", "path", "~/.cache/meshtrain/s3", kEnvWorker,                   \
    "meshtrain ckpt on s3:// URIs: where the checkpoint is downloaded; s3:// datasets: their "     \
    "cache (under datasets/)")                                                                     \
  X(test_crash_at_step, "MESHTRAIN_TEST_CRASH_AT_STEP", "int", "", kEnvWorker | kEnvTest,          \
    "test fault: rank 1 (rank 0 alone) throws at this step on the first attempt")                  \
  X(test_nan_steps, "MESHTRAIN_TEST_NAN_STEPS", "list", "", kEnvWorker | kEnvTest,                 \
    "test fault: the last rank's loss is NaN at steps A[-B][,always]")                             \
  X(test_spike_step, "MESHTRAIN_TEST_SPIKE_STEP", "int", "", kEnvWorker | kEnvTest,                \
    "test fault: the last rank's loss is 1000x at this step")                                      \
  X(test_ckpt_stall_at_step, "MESHTRAIN_TEST_CKPT_STALL_AT_STEP", "int", "",                       \
    kEnvWorker | kEnvTest,                                                                         \
    "test fault: the checkpoint writer stalls mid-save at this step, first attempt")               \
  X(test_ckpt_snapshot_delay_ms, "MESHTRAIN_TEST_CKPT_SNAPSHOT_DELAY_MS", "int", "",               \
    kEnvWorker | kEnvTest, "test fault: every checkpoint snapshot copy is held back this many ms") \
  X(test_slowdown, "MESHTRAIN_TEST_SLOWDOWN", "string", "", kEnvWorker | kEnvTest,                 \
    "test fault: F[@R][~P]: rank R (every rank that sees it) takes F times as long per step (~P: " \
    "a step in P of them)")                                                                        \
  X(test_clock_step_s, "MESHTRAIN_TEST_CLOCK_STEP_S", "float", "", kEnvWorker | kEnvTest,          \
    "test clock: the k-th reading of ckpt.interval_minutes' clock is k x this many seconds")       \
  X(test_require, "MESHTRAIN_TEST_REQUIRE", "list", "", kEnvTest,                                  \
    "capabilities (netns,torch,prometheus,...) whose absence fails a test instead of skipping")    \
  X(netns_worker, "MESHTRAIN_NETNS_WORKER", "bool", "", kEnvTest,                                  \
    "the network-namespace test program runs as one of its own workers")                           \
  X(bin, "MESHTRAIN_BIN", "path", "meshtrain", kEnvScript,                                         \
    "deploy/slurm/train.sbatch: the meshtrain program")                                            \
  X(config, "MESHTRAIN_CONFIG", "path", "configs/demo.toml", kEnvScript,                           \
    "deploy/slurm/train.sbatch: the training config")                                              \
  X(out_dir, "MESHTRAIN_OUT_DIR", "path", "runs/slurm-JOB", kEnvScript,                            \
    "deploy/slurm/train.sbatch: the run directory")                                                \
  X(args, "MESHTRAIN_ARGS", "list", "", kEnvScript,                                                \
    "deploy/slurm/train.sbatch: more arguments for `meshtrain train`")                             \
  X(demo_nproc, "MESHTRAIN_DEMO_NPROC", "int", "2", kEnvScript, "make demo: ranks to train on")

enum class Env : uint16_t {
#define MESHTRAIN_ENV_ENUM(id, name, type, fallback, readers, meaning) id,
  MESHTRAIN_ENV_SETTINGS(MESHTRAIN_ENV_ENUM)
#undef MESHTRAIN_ENV_ENUM
};

struct EnvSetting {
  Env id;
  std::string_view name;
  std::string_view type;      // int, bytes, port, bool, choice, string, list, host, path, secret
  std::string_view fallback;  // the default, as a user would read it ("" when there is none)
  uint8_t readers;            // EnvReader bits
  std::string_view meaning;
};

// Every declared variable, in declaration order.
std::span<const EnvSetting> env_settings();
const EnvSetting& env_setting(Env id);
inline std::string_view env_name(Env id) {
  return env_setting(id).name;
}
// The declaration of `name`, or null when it is not a declared variable.
const EnvSetting* find_env_setting(std::string_view name);

// The variable's value, or nullopt when it is unset or empty (an empty value means unset).
std::optional<std::string> env_value(Env id);
// True when the variable is set at all, even to the empty string.
bool env_is_set(Env id);
// A whole, non-negative number (an int, bytes or port variable), or nullopt when unset. A value
// that is not one is a ValueError naming the variable:
//   environment variable MESHTRAIN_SHM_STEP_BYTES='64k' is not a whole number (bytes); ...
std::optional<uint64_t> env_count(Env id);
// A finite, non-negative number (a float variable, seconds or factors), or nullopt when unset;
// anything else is a ValueError naming the variable, as env_count's.
std::optional<double> env_real(Env id);

// "reads: meshrun, meshtrain" from a reader bit set.
std::string env_readers_text(uint8_t readers);

// The declared name closest to `name` (edit distance), for "did you mean".
std::string_view closest_env_name(std::string_view name);

// One line per MESHTRAIN_* variable in `environment` ("NAME=VALUE" entries) that is not declared:
//   unknown environment variable NAME (did you mean CLOSEST? ...)
std::vector<std::string> unknown_env_warnings(std::span<const std::string> environment);
// The same for this process's environment.
std::vector<std::string> unknown_env_warnings();

// `meshtrain env`: every variable with its type, default, readers, meaning and current value
// (secrets shown as "(set)").
std::string env_report(bool include_test_only);

}  // namespace meshtrain
