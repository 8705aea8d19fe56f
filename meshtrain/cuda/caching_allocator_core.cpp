// Block bookkeeping of the caching allocator; see caching_allocator_core.h for the design.
#include "meshtrain/cuda/caching_allocator_core.h"

#include <algorithm>
#include <string>

#include "meshtrain/util/error.h"

namespace meshtrain::cuda {

struct CachingAllocatorCore::Block {
  char* ptr = nullptr;
  size_t size = 0;
  size_t requested = 0;
  StreamId stream = 0;
  bool small = false;
  bool allocated = false;
  Block* prev = nullptr;  // neighbours within the same segment
  Block* next = nullptr;
  char* segment = nullptr;  // the segment's base address and size (kept by every block of it)
  size_t segment_size = 0;
};

bool CachingAllocatorCore::BlockLess::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

namespace {

std::string mib(size_t bytes) {
  return std::to_string(static_cast<double>(bytes) / (1 << 20)) + " MiB";
}

}  // namespace

CachingAllocatorCore::CachingAllocatorCore(MemorySource& source, std::string label)
    : source_(source), label_(std::move(label)) {}

CachingAllocatorCore::~CachingAllocatorCore() {
  for (auto& [addr, b] : blocks_) {
    if (b->prev == nullptr) source_.free_segment(b->segment, b->segment_size);
  }
}

size_t CachingAllocatorCore::round_size(size_t nbytes) {
  return std::max(kMinBlock, (nbytes + kMinBlock - 1) / kMinBlock * kMinBlock);
}

size_t CachingAllocatorCore::segment_size(size_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  if (rounded < kLargeSegment / 2) return kLargeSegment;
  return (rounded + kSegmentRound - 1) / kSegmentRound * kSegmentRound;
}

CachingAllocatorCore::Block* CachingAllocatorCore::find_free(FreeList& list, size_t rounded) {
  Block key;
  key.size = rounded;
  key.ptr = nullptr;
  auto it = list.lower_bound(&key);
  if (it == list.end()) return nullptr;
  Block* b = *it;
  list.erase(it);
  return b;
}

CachingAllocatorCore::Block* CachingAllocatorCore::new_segment(size_t rounded, StreamId stream,
                                                               bool small) {
  const size_t seg = segment_size(rounded);
  void* p = source_.allocate_segment(seg);
  if (p == nullptr) {
    release_free_segments();
    ++stats_.out_of_memory_retries;
    p = source_.allocate_segment(seg);
  }
  if (p == nullptr) {
    MT_THROW(Error, label_, " out of memory: tried to allocate ", mib(rounded), " (a new ",
             mib(seg), " segment); ", mib(stats_.allocated_bytes), " allocated, ",
             mib(stats_.reserved_bytes), " reserved by this allocator");
  }
  auto block = std::make_unique<Block>();
  block->ptr = static_cast<char*>(p);
  block->size = seg;
  block->stream = stream;
  block->small = small;
  block->segment = block->ptr;
  block->segment_size = seg;
  Block* raw = block.get();
  blocks_.emplace(raw->ptr, std::move(block));
  ++stats_.segment_allocations;
  ++stats_.segments;
  stats_.reserved_bytes += seg;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return raw;
}

void CachingAllocatorCore::split(Block* b, size_t rounded, FreeList& list) {
  // Large blocks are split only when the remainder could serve a large request; otherwise a
  // small leftover would sit unusable in the large pool.
  const size_t rest = b->size - rounded;
  const bool worth = b->small ? rest >= kMinBlock : rest > kSmallRequest;
  if (!worth) return;
  auto tail = std::make_unique<Block>();
  tail->ptr = b->ptr + rounded;
  tail->size = rest;
  tail->stream = b->stream;
  tail->small = b->small;
  tail->segment = b->segment;
  tail->segment_size = b->segment_size;
  tail->prev = b;
  tail->next = b->next;
  if (b->next != nullptr) b->next->prev = tail.get();
  b->next = tail.get();
  b->size = rounded;
  list.insert(tail.get());
  blocks_.emplace(tail->ptr, std::move(tail));
}

void* CachingAllocatorCore::allocate(size_t nbytes, StreamId stream) {
  if (nbytes == 0) return nullptr;
  // Rounding up to blocks and segments must not wrap around (a huge size from an overflowed
  // count would come back as a small block).
  MT_CHECK(nbytes <= kMaxRequest, label_, ": a request of ", nbytes,
           " bytes is larger than any device's memory");
  const size_t rounded = round_size(nbytes);
  const bool small = rounded <= kSmallRequest;
  std::lock_guard lock(mu_);
  FreeList& list = free_[PoolKey{stream, small}];
  Block* b = find_free(list, rounded);
  if (b == nullptr) b = new_segment(rounded, stream, small);
  split(b, rounded, list);
  b->allocated = true;
  b->requested = nbytes;
  ++stats_.allocations;
  ++stats_.active_blocks;
  stats_.allocated_bytes += b->size;
  stats_.requested_bytes += nbytes;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return b->ptr;
}

void CachingAllocatorCore::erase_block(Block* b) {
  blocks_.erase(b->ptr);
}

void CachingAllocatorCore::free(void* p) {
  if (p == nullptr) return;
  std::lock_guard lock(mu_);
  auto it = blocks_.find(p);
  MT_CHECK(it != blocks_.end() && it->second->allocated, label_,
           ": free of a pointer this allocator did not hand out (or freed twice)");
  Block* b = it->second.get();
  b->allocated = false;
  ++stats_.frees;
  --stats_.active_blocks;
  stats_.allocated_bytes -= b->size;
  stats_.requested_bytes -= b->requested;
  b->requested = 0;
  FreeList& list = free_[PoolKey{b->stream, b->small}];
  // Merge with free neighbours: the next block folds into b, b folds into the previous one.
  if (Block* n = b->next; n != nullptr && !n->allocated) {
    list.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    erase_block(n);
  }
  if (Block* pr = b->prev; pr != nullptr && !pr->allocated) {
    list.erase(pr);
    pr->size += b->size;
    pr->next = b->next;
    if (b->next != nullptr) b->next->prev = pr;
    erase_block(b);
    b = pr;
  }
  list.insert(b);
}

void CachingAllocatorCore::release_free_segments() {
  for (auto& [key, list] : free_) {
    for (auto it = list.begin(); it != list.end();) {
      Block* b = *it;
      if (b->prev == nullptr && b->next == nullptr) {  // the whole segment is one free block
        it = list.erase(it);
        source_.free_segment(b->segment, b->segment_size);
        ++stats_.segment_frees;
        --stats_.segments;
        stats_.reserved_bytes -= b->segment_size;
        erase_block(b);
      } else {
        ++it;
      }
    }
  }
}

void CachingAllocatorCore::release_cached() {
  std::lock_guard lock(mu_);
  release_free_segments();
}

size_t CachingAllocatorCore::block_size(const void* p) const {
  std::lock_guard lock(mu_);
  auto it = blocks_.find(p);
  MT_CHECK(it != blocks_.end() && it->second->allocated, label_, ": not a live block");
  return it->second->size;
}

StreamId CachingAllocatorCore::block_stream(const void* p) const {
  std::lock_guard lock(mu_);
  auto it = blocks_.find(p);
  MT_CHECK(it != blocks_.end() && it->second->allocated, label_, ": not a live block");
  return it->second->stream;
}

AllocatorStats CachingAllocatorCore::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void CachingAllocatorCore::reset_peaks() {
  std::lock_guard lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

}  // namespace meshtrain::cuda
