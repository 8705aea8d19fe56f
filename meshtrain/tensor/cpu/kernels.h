// The fused CPU kernels of the tensor core, one file per layer in the manner of llm.c. Autograd
// nodes call these free functions on raw float pointers; nothing here knows about Tensor.
//
// Dimension letters, used in every kernel signature and comment below this folder:
//   B  batch size               T  time (sequence length)      C  channels (model width)
//   V  vocabulary size          NH number of attention heads   HS head size = C / NH
//   N  rows of a 2-D view (often B*T); a kernel over "rows x cols" names them N and C
// Image kernels (conv2d, batch_norm, pool2d) work on [N, C, H, W]: N images, C channels, H x W
// pixels (HW = H * W); conv2d.h and pool2d.h add their window letters.
// All arrays are contiguous row-major; [B, T, C] means index (b * T + t) * C + c.
//
// Conventions shared by every kernel:
//   - Forward kernels OVERWRITE their outputs (activations).
//   - Backward kernels ACCUMULATE (+=) into every gradient they produce, parameter gradients and
//     input gradients alike, so a tensor used twice simply receives both contributions and the
//     caller zeroes gradient buffers once per step. A gradient pointer documented as optional may
//     be nullptr, and that gradient is then skipped.
//   - Kernels never allocate on the heap; the few that need scratch take it from the caller.
//   - Loops are OpenMP-parallel across the calling process's threads (static schedules, serial
//     below a size threshold) and every reduction has a fixed order, so results are bitwise
//     identical for any thread count. The exceptions are OpenBLAS sgemm, whose blocking may change
//     with its thread count, and the convolutions built on it or on oneDNN (conv2d.h).
#pragma once

#include "meshtrain/tensor/cpu/adamw.h"
#include "meshtrain/tensor/cpu/attention.h"
#include "meshtrain/tensor/cpu/batch_norm.h"
#include "meshtrain/tensor/cpu/conv2d.h"
#include "meshtrain/tensor/cpu/cross_entropy.h"
#include "meshtrain/tensor/cpu/dropout.h"
#include "meshtrain/tensor/cpu/elementwise.h"
#include "meshtrain/tensor/cpu/embedding.h"
#include "meshtrain/tensor/cpu/gelu.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/cpu/index_rows.h"
#include "meshtrain/tensor/cpu/layer_norm.h"
#include "meshtrain/tensor/cpu/pool2d.h"
#include "meshtrain/tensor/cpu/reduce.h"
#include "meshtrain/tensor/cpu/relu.h"
#include "meshtrain/tensor/cpu/sgd.h"
#include "meshtrain/tensor/cpu/softmax.h"
#include "meshtrain/tensor/cpu/vocab_parallel_cross_entropy.h"
