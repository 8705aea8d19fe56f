// ShmSegment and futex helpers (Linux).
#include "meshtrain/comm/transport/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// What is left where POSIX shared memory lives, for errors about running out of it.
std::string dev_shm_free() {
  const std::optional<DevShmSpace> space = dev_shm_space();
  if (!space) return "/dev/shm: " + std::string(std::strerror(errno));
  return "/dev/shm has " + format_mib(space->free_bytes) + " free of " +
         format_mib(space->total_bytes);
}

uint8_t* map_fd(int fd, size_t bytes, const std::string& name, bool populate = false) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (p == MAP_FAILED) {
    MT_THROW(CommError, "mmap of shared memory '", name, "' (", bytes,
             " bytes) failed: ", std::strerror(errno));
  }
  return static_cast<uint8_t*>(p);
}

}  // namespace

ShmSegment ShmSegment::create(const std::string& name, size_t bytes, bool reserve) {
  Fd f;
  f.fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (f.fd < 0) {
    MT_THROW(CommError, "shm_open('", name, "') failed: ", std::strerror(errno));
  }
  if (::ftruncate(f.fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::shm_unlink(name.c_str());
    MT_THROW(CommError, "ftruncate of shared memory '", name, "' to ", bytes,
             " bytes failed: ", std::strerror(err));
  }
  if (reserve) {
    if (int err = ::posix_fallocate(f.fd, 0, static_cast<off_t>(bytes)); err != 0) {
      ::shm_unlink(name.c_str());
      MT_THROW(CommError, "cannot reserve ", format_mib(bytes), " of shared memory for '", name,
               "': ", std::strerror(err), " (", dev_shm_free(), ")");
    }
  }
  ShmSegment s;
  s.data_ = map_fd(f.fd, bytes, name);
  s.size_ = bytes;
  return s;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes, bool populate) {
  Fd f;
  f.fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (f.fd < 0) MT_THROW(CommError, "shm_open('", name, "') failed: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    MT_THROW(CommError, "shared memory '", name, "' is smaller than the expected ", bytes,
             " bytes");
  }
  ShmSegment s;
  s.data_ = map_fd(f.fd, bytes, name, populate);
  s.size_ = bytes;
  return s;
}

void ShmSegment::unlink(const std::string& name) {
  ::shm_unlink(name.c_str());
}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool process_alive(int pid) {
  if (pid <= 0) return true;  // not yet known
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A killed child that its parent has not reaped yet still answers kill(); its state says Z.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

std::optional<DevShmSpace> dev_shm_space() {
  struct statvfs st {};
  if (::statvfs("/dev/shm", &st) != 0) return std::nullopt;
  return DevShmSpace{uint64_t{st.f_bavail} * st.f_frsize, uint64_t{st.f_blocks} * st.f_frsize};
}

std::string format_mib(uint64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return os.str();
}

}  // namespace meshtrain::comm
