// Shared memory of the simple attention kernels (attention.cu), kept free of CUDA so that the size
// computation is unit-tested on every machine.
//
// Each block keeps one float per key of its query row in shared memory. nvcc unrolls the loops over
// that row by four and may read a whole 16-byte group of it at once: a vector load, or the
// remainder's up to three scalar loads fused into one wide load whose unused lanes lie past the
// row's end. Past the last key of the longest row (t = T - 1) such a read leaves the block's
// allocation when T is not a multiple of four; the hardware does not fault, but
// compute-sanitizer's memcheck reports an invalid __shared__ read and the launch fails under it.
// So the row is padded to whole groups of four floats.
#pragma once

#include <cstddef>
#include <cstdint>

#include "meshtrain/util/error.h"

namespace meshtrain::cuda {

// Floats per group the compiler may read at once (one 16-byte vector).
inline constexpr int64_t kAttentionRowGroup = 4;
// Beyond the default 48 KiB a kernel must opt in; T = 12288 is the most this version serves.
inline constexpr size_t kAttentionRowMaxBytes = 48 * 1024;

// Floats of shared memory for a row of T keys: T rounded up to whole groups.
constexpr int64_t attention_row_floats(int64_t T) {
  return (T + kAttentionRowGroup - 1) / kAttentionRowGroup * kAttentionRowGroup;
}

// Dynamic shared memory, in bytes, of one block of the simple attention kernels.
inline size_t attention_row_shared_bytes(int64_t T) {
  MT_CHECK(T > 0, "cuda attention: T=", T, " must be positive");
  const size_t bytes = static_cast<size_t>(attention_row_floats(T)) * sizeof(float);
  MT_CHECK(bytes <= kAttentionRowMaxBytes, "cuda attention: T=", T, " needs ", bytes,
           " bytes of shared memory per row; this kernel supports T <= 12288");
  return bytes;
}

}  // namespace meshtrain::cuda
