// See worker_spawn.h.
#include "meshtrain/runtime/worker_spawn.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "meshtrain/runtime/core_binding.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

SpawnedWorker spawn_worker(const WorkerSpawn& spec) {
  // Everything the child needs is prepared here: after fork it makes only async-signal-safe
  // calls until exec.
  std::vector<std::string> env = spec.env;
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = spec.argv;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  cpu_set_t cores;
  CPU_ZERO(&cores);
  const bool bind = !spec.cores.empty();
  for (int cpu : spec.cores) CPU_SET(cpu, &cores);
  const pid_t agent_pid = ::getpid();

  int out_pipe[2], err_pipe[2], exec_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) < 0 || ::pipe2(err_pipe, O_CLOEXEC) < 0 ||
      ::pipe2(exec_pipe, O_CLOEXEC) < 0) {
    MT_THROW(IoError, "cannot create pipes for worker ", spec.rank, ": ", strerror(errno));
  }
  pid_t pid = ::fork();
  if (pid < 0) MT_THROW(IoError, "fork failed for worker ", spec.rank, ": ", strerror(errno));
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != agent_pid) ::_exit(126);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::signal(sig, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &spec.mask, nullptr);
    // Before exec, so that every thread the worker starts inherits it. A failure reaches the
    // parent as a negative errno.
    if (bind && ::sched_setaffinity(0, sizeof(cores), &cores) != 0) {
      int err = -errno;
      [[maybe_unused]] ssize_t n = ::write(exec_pipe[1], &err, sizeof(err));
      ::_exit(127);
    }
    ::execvpe(argv[0], argv.data(), envp.data());
    int err = errno;
    [[maybe_unused]] ssize_t n = ::write(exec_pipe[1], &err, sizeof(err));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // Also from the parent, so that the group exists before any kill.
  close_fd(out_pipe[1]);
  close_fd(err_pipe[1]);
  close_fd(exec_pipe[1]);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close_fd(exec_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    std::string msg =
        exec_errno < 0
            ? detail::str_cat("meshrun: cannot bind rank ", spec.rank, " to cores ",
                              format_cpu_list(spec.cores), ": ", strerror(-exec_errno), "\n")
            : detail::str_cat("meshrun: cannot execute '", spec.argv[0], "' for rank ", spec.rank,
                              ": ", strerror(exec_errno), "\n");
    [[maybe_unused]] ssize_t wn = ::write(STDERR_FILENO, msg.data(), msg.size());
  }
  return {pid, out_pipe[0], err_pipe[0]};
}

}  // namespace meshtrain::runtime
