// Reduction operators and the kernels that apply them. Every collective that combines values goes
// through these functions so that all backends agree bit for bit: half types (bf16, f16) are
// widened to f32, combined, and rounded once; min and max propagate NaN so that the order of two
// operands never changes the result.
#pragma once

#include <cstddef>
#include <string_view>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain::comm {

enum class ReduceOp : uint8_t { sum, avg, min, max, product };

std::string_view reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(std::string_view name);  // throws ValueError

// dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... in source order, accumulating half types in f32
// and rounding once. For ReduceOp::avg the sum is divided by avg_divisor before rounding. dst may
// alias any source.
void reduce_sources(void* dst, const void* const* srcs, int num_srcs, size_t count, DType dtype,
                    ReduceOp op, int avg_divisor);

// acc[i] = acc[i] (op) src[i] in the element type itself (avg combines as sum). Algorithms that
// combine partial results across steps run on f32 for half types (see accumulation_dtype).
void reduce_into(void* acc, const void* src, size_t count, DType dtype, ReduceOp op);

// Divides every element by n (ReduceOp::avg's last step; integers truncate toward zero).
void divide_by(void* data, size_t count, DType dtype, int n);

// The type partial results travel in: f32 for half types, the type itself otherwise.
DType accumulation_dtype(DType dtype);

}  // namespace meshtrain::comm
