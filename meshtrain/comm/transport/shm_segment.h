// A POSIX shared-memory segment (shm_open + mmap) owned by RAII, and the futex calls that let
// processes sleep on a 32-bit word inside it. The shm backend keeps all of its synchronisation
// in such a segment: waiting ranks spin briefly, then sleep in the kernel until a peer wakes them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace meshtrain::comm {

class ShmSegment {
 public:
  ShmSegment() = default;
  // Creates a new segment (fails when the name exists) of `bytes` zeroed bytes. `reserve`
  // allocates every page now, so that a full /dev/shm fails here with an error instead of
  // killing the process with SIGBUS at the first touch of a page it could not get.
  static ShmSegment create(const std::string& name, size_t bytes, bool reserve = false);
  // Maps an existing segment, which must be at least `bytes` long. `populate` maps every page
  // now, so that the first reads do not fault page by page.
  static ShmSegment open(const std::string& name, size_t bytes, bool populate = false);
  // Removes the name; the mappings stay valid.
  static void unlink(const std::string& name);

  ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ~ShmSegment();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Sleeps while *word == expected, at most `timeout`. Returns on wake, timeout or signal alike:
// callers re-check their condition.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout);
// Wakes every sleeper on the word.
void futex_wake_all(std::atomic<uint32_t>* word);

// True when the process exists and is not a zombie.
bool process_alive(int pid);

// Room where POSIX shared memory lives (/dev/shm); nullopt when it cannot be asked.
struct DevShmSpace {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};
std::optional<DevShmSpace> dev_shm_space();

// `bytes` as "12.3 MiB", for messages about shared memory.
std::string format_mib(uint64_t bytes);

}  // namespace meshtrain::comm
