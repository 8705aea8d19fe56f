// See run_dir_lock.h.
#include "meshtrain/runtime/run_dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

namespace fs = std::filesystem;

namespace {

std::string this_host() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

std::string read_small_file(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string boot_id() {
  std::string id = read_small_file("/proc/sys/kernel/random/boot_id");
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

// The fields of /proc/<pid>/stat after the command name (which may hold spaces): state first;
// empty when the process is gone.
std::vector<std::string> stat_fields(int64_t pid) {
  const std::string stat = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  std::vector<std::string> fields;
  if (close == std::string::npos) return fields;
  std::istringstream in(stat.substr(close + 1));
  for (std::string f; in >> f;) fields.push_back(f);
  return fields;
}

// Field 22: the process's start in clock ticks after boot (0 when unknown).
uint64_t process_start(int64_t pid) {
  const std::vector<std::string> f = stat_fields(pid);
  return f.size() > 19 ? std::stoull(f[19]) : 0;
}

// Killed but not yet reaped: kill(pid, 0) still succeeds on it.
bool is_zombie(int64_t pid) {
  const std::vector<std::string> f = stat_fields(pid);
  return !f.empty() && (f[0] == "Z" || f[0] == "X");
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::optional<fs::file_time_type> mtime(const fs::path& path) {
  std::error_code ec;
  const auto t = fs::last_write_time(path, ec);
  if (ec) return std::nullopt;
  return t;
}

std::string describe(const RunDirHolder& h) {
  return detail::str_cat("host ", h.host, ", pid ", h.pid, ", started ", h.start_time,
                         h.job_id.empty() ? "" : ", job " + h.job_id);
}

// Removes a private file when it goes out of scope.
struct RemoveOnExit {
  fs::path path;
  ~RemoveOnExit() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

void write_private_file(const fs::path& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    MT_THROW(IoError, "cannot create ", path.string(), ": ", std::strerror(errno),
             "; train.out_dir must be a writable directory");
  const ssize_t n = ::write(fd, content.data(), content.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(content.size()))
    MT_THROW(IoError, "cannot write ", path.string(), ": ", std::strerror(err));
}

}  // namespace

std::optional<RunDirHolder> read_run_dir_holder(const fs::path& lock_file) {
  std::ifstream in(lock_file);
  if (!in) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  RunDirHolder h;
  h.host = j.value("host", "");
  h.pid = j.value("pid", int64_t{0});
  h.start_time = j.value("start_time", "");
  h.job_id = j.value("job_id", "");
  h.boot_id = j.value("boot_id", "");
  h.pid_start = j.value("pid_start", uint64_t{0});
  if (h.host.empty() || h.pid <= 0) return std::nullopt;
  return h;
}

RunDirLock::RunDirLock(const fs::path& out_dir, RunDirLockOptions options)
    : path_(out_dir / kFileName), options_(std::move(options)) {
  if (options_.host.empty()) options_.host = this_host();
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec)
    MT_THROW(IoError, "cannot create train.out_dir ", out_dir.string(), ": ", ec.message(),
             "; set train.out_dir to a writable directory");
  const int64_t pid = ::getpid();
  content_ = nlohmann::json{{"host", options_.host},   {"pid", pid},
                            {"start_time", utc_now()}, {"job_id", options_.job_id},
                            {"boot_id", boot_id()},    {"pid_start", process_start(pid)}}
                 .dump() +
             "\n";
  // Complete under a private name first: the lock's name never shows a partial file.
  const RemoveOnExit mine{out_dir / detail::str_cat(".", kFileName, ".", options_.host, ".", pid)};
  write_private_file(mine.path, content_);
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (::link(mine.path.c_str(), path_.c_str()) == 0) {
      heartbeat_ = std::thread([this] { heartbeat_loop(); });
      return;
    }
    if (errno != EEXIST)
      MT_THROW(IoError, "cannot create ", path_.string(), ": ", std::strerror(errno),
               "; train.out_dir must be on a filesystem with hard links");
    const std::string held = read_small_file(path_);
    const std::optional<RunDirHolder> holder = read_run_dir_holder(path_);
    const auto held_at = mtime(path_);
    if (!held_at) continue;  // released meanwhile: try again
    // Our private file was written just now: its mtime is the filesystem's "now".
    const auto now = mtime(mine.path).value_or(fs::file_time_type::clock::now());
    const bool fresh = now - *held_at < options_.stale_after;
    bool dead;
    if (!holder) {
      dead = !fresh;  // unreadable: only its age can tell
    } else if (!options_.job_id.empty() && holder->job_id == options_.job_id) {
      dead = true;  // an earlier attempt of this job
    } else if (holder->host == options_.host) {
      const bool running = ::kill(static_cast<pid_t>(holder->pid), 0) == 0 || errno == EPERM;
      const uint64_t started = process_start(holder->pid);
      dead = holder->boot_id != boot_id() || !running || is_zombie(holder->pid) ||
             (holder->pid_start != 0 && started != 0 && started != holder->pid_start);
    } else {
      dead = !fresh;
    }
    if (!dead) {
      if (!holder)
        MT_THROW(ValueError, "train.out_dir ", out_dir.string(), " is locked by ", path_.string(),
                 ", which cannot be read and was written less than ",
                 options_.stale_after.count() / 1000,
                 " s ago; remove it if no job uses this directory");
      MT_THROW(ValueError, "train.out_dir ", out_dir.string(), " is in use by another job (",
               describe(*holder), "); wait for it to end or set another train.out_dir");
    }
    // Take over: move the dead holder's file aside under a name of ours, and check that what was
    // moved is the file judged dead (another process may have taken over first).
    const fs::path aside =
        out_dir / detail::str_cat(".", kFileName, ".stale.", options_.host, ".", pid);
    if (::rename(path_.c_str(), aside.c_str()) != 0) continue;
    if (read_small_file(aside) != held) (void)::link(aside.c_str(), path_.c_str());
    fs::remove(aside, ec);
  }
  MT_THROW(ValueError, "train.out_dir ", out_dir.string(),
           ": could not take its lock, which other processes keep taking; "
           "start one job per train.out_dir");
}

RunDirLock::~RunDirLock() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (still_ours()) {
    std::error_code ec;
    fs::remove(path_, ec);
  }
}

bool RunDirLock::still_ours() const {
  return read_small_file(path_) == content_;
}

// Refreshes the file's mtime so that other hosts see the holder alive; stops touching a file that
// another process has taken over.
void RunDirLock::heartbeat_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, options_.heartbeat, [this] { return stopping_; })) {
    if (!still_ours()) return;
    (void)::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);
  }
}

std::unique_ptr<RunDirLock> lock_run_dir(const std::string& out_dir, const std::string& job_id,
                                         int rank, comm::Store* store) {
  const std::string key = "run_dir_lock";
  if (rank != 0) {
    if (store == nullptr) return nullptr;
    const std::string refusal = store->get_string(key);
    if (!refusal.empty()) throw ValueError(refusal);
    return nullptr;
  }
  try {
    RunDirLockOptions options;
    options.job_id = job_id;
    auto lock = std::make_unique<RunDirLock>(out_dir, options);
    if (store != nullptr) store->set_string(key, "");
    return lock;
  } catch (const Error& e) {
    if (store != nullptr) store->set_string(key, e.what());
    throw;
  }
}

}  // namespace meshtrain::runtime
