// MESHTRAIN_HOST_DEVICE marks an inline function that the CPU's kernels and the device's both
// compile from one definition (the same arithmetic, so the same bits where the operations are).
#pragma once

#if defined(__CUDACC__)
#define MESHTRAIN_HOST_DEVICE __host__ __device__
#else
#define MESHTRAIN_HOST_DEVICE
#endif
