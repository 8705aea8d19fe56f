// The bookkeeping of the GPU caching allocator, free of any CUDA call so that it is unit-tested on
// the CPU with a fake memory source. cudaMalloc and cudaFree are slow and synchronise the device;
// a training step allocates and frees the same activation sizes every iteration, so memory that
// is freed stays reserved and is handed out again, and after the first step nothing reaches the
// memory source at all.
//
// Design (the one PyTorch's allocator made familiar):
//   - Requests are rounded up to 512 bytes. Small requests (<= 1 MiB) are carved out of 2 MiB
//     segments; large ones out of segments of at least 20 MiB (or the request rounded to 2 MiB).
//     Small and large requests never share a segment, so small blocks cannot pin a large one.
//   - Each segment belongs to the stream that first allocated it. A freed block returns to the
//     free list of its (stream, pool); reuse on the same stream needs no synchronisation because
//     the stream orders the old uses before the new one. Use on other streams is the caller's to
//     fence (caching_allocator.h defers such frees behind events).
//   - A free list is ordered by (size, address): the best fit is a lower_bound. A block larger
//     than needed is split and the remainder goes back to the list; a freed block merges with
//     free neighbours of its segment, so fragmentation does not grow step after step.
//   - When the source is out of memory, every wholly free segment is released and the request
//     retried once before failing with an error that reports what is allocated and reserved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace meshtrain::cuda {

// Identifies a stream without naming a CUDA type (a cudaStream_t cast to an integer).
using StreamId = uintptr_t;

// Where segments come from: cudaMalloc/cudaFree on one device in production, a counting host
// allocator in tests.
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  // nullptr when out of memory (the caller may free cache and retry); other failures throw.
  virtual void* allocate_segment(size_t nbytes) = 0;
  virtual void free_segment(void* p, size_t nbytes) = 0;
};

struct AllocatorStats {
  size_t allocated_bytes = 0;       // in blocks handed out (rounded sizes)
  size_t requested_bytes = 0;       // what callers asked for
  size_t reserved_bytes = 0;        // in segments obtained from the source
  size_t peak_allocated_bytes = 0;  // since construction or reset_peaks()
  size_t peak_reserved_bytes = 0;
  uint64_t allocations = 0;  // allocate() calls that returned memory
  uint64_t frees = 0;
  uint64_t segment_allocations = 0;  // calls into the source (cudaMalloc)
  uint64_t segment_frees = 0;
  uint64_t out_of_memory_retries = 0;  // times cached segments were released to satisfy a request
  size_t active_blocks = 0;
  size_t segments = 0;
};

class CachingAllocatorCore {
 public:
  static constexpr size_t kMinBlock = 512;
  static constexpr size_t kSmallRequest = size_t{1} << 20;  // <= this: small pool
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kLargeSegment = size_t{20} << 20;  // minimum for requests < 10 MiB
  static constexpr size_t kSegmentRound = size_t{2} << 20;
  static constexpr size_t kMaxRequest = size_t{1} << 48;  // 256 TiB: beyond every device

  // label names the device in error messages ("cuda:0").
  CachingAllocatorCore(MemorySource& source, std::string label);
  // Returns every segment to the source; blocks still in use at that point are released too.
  ~CachingAllocatorCore();
  CachingAllocatorCore(const CachingAllocatorCore&) = delete;
  CachingAllocatorCore& operator=(const CachingAllocatorCore&) = delete;

  // nullptr for 0 bytes. Throws meshtrain::Error when the source cannot supply the memory.
  void* allocate(size_t nbytes, StreamId stream);
  // p must come from allocate() and not be freed yet (nullptr is ignored).
  void free(void* p);

  // The rounded size and stream of a live block; throws for a pointer this allocator does not own.
  size_t block_size(const void* p) const;
  StreamId block_stream(const void* p) const;

  // Returns every wholly free segment to the source (for another process or library).
  void release_cached();
  AllocatorStats stats() const;
  void reset_peaks();

  static size_t round_size(size_t nbytes);
  static size_t segment_size(size_t rounded);

 private:
  struct Block;
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeList = std::set<Block*, BlockLess>;
  struct PoolKey {
    StreamId stream;
    bool small;
    friend auto operator<=>(const PoolKey&, const PoolKey&) = default;
  };

  Block* find_free(FreeList& list, size_t rounded);
  Block* new_segment(size_t rounded, StreamId stream, bool small);
  void split(Block* b, size_t rounded, FreeList& list);
  void release_free_segments();  // requires mu_
  void erase_block(Block* b);

  MemorySource& source_;
  std::string label_;
  mutable std::mutex mu_;
  std::unordered_map<const void*, std::unique_ptr<Block>> blocks_;  // every block, by address
  std::map<PoolKey, FreeList> free_;
  AllocatorStats stats_;
};

}  // namespace meshtrain::cuda
