// See process_metrics.h. /proc/self/statm gives sizes in pages; the start time is taken once, as
// the first time anything asks (close enough to process start for a dashboard's uptime panel).
#include "meshtrain/obs/process_metrics.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

namespace meshtrain::obs {
namespace {

bool read_statm(int64_t& vm_pages, int64_t& rss_pages) {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return false;
  long long vm = 0, rss = 0;
  const bool ok = std::fscanf(f, "%lld %lld", &vm, &rss) == 2;
  std::fclose(f);
  vm_pages = vm;
  rss_pages = rss;
  return ok;
}

int64_t page_size() {
  static const int64_t size = ::sysconf(_SC_PAGESIZE);
  return size > 0 ? size : 4096;
}

double start_time_seconds() {
  static const double t =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return t;
}

}  // namespace

int64_t process_rss_bytes() {
  int64_t vm = 0, rss = 0;
  return read_statm(vm, rss) ? rss * page_size() : 0;
}

void update_process_metrics(Registry& registry) {
  // Lookups take the registry lock; this runs once per scrape or step, not on a hot path.
  int64_t vm = 0, res = 0;
  if (read_statm(vm, res)) {
    registry.gauge("process_resident_memory_bytes", "Resident memory size in bytes.")
        .set(static_cast<double>(res * page_size()));
    registry.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.")
        .set(static_cast<double>(vm * page_size()));
  }
  std::error_code ec;
  int64_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  registry.gauge("process_open_fds", "Number of open file descriptors.")
      .set(static_cast<double>(n));
  registry.gauge("process_start_time_seconds", "Start time of the process since the Unix epoch.")
      .set(start_time_seconds());
}

}  // namespace meshtrain::obs
