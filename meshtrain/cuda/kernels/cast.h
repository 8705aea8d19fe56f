// Conversions between the floating dtypes on the device (f32 <-> bf16 <-> f16), rounding to
// nearest even like the host's convert(), so a cast on either side gives the same bits for every
// value but NaN, which stays a NaN (its sign and payload may differ: the device's conversion
// gives a canonical NaN).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain::cuda {

// dst[n] = src[n] converted; both dtypes floating (f32, bf16, f16). Equal dtypes copy.
void cast(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
          cudaStream_t stream);

}  // namespace meshtrain::cuda
