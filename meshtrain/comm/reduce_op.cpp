// Reduction kernels. Each works in blocks of kBlock elements held in a small accumulator array so
// that an N-way reduction reads every source once and writes the destination once.
#include "meshtrain/comm/reduce_op.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

constexpr size_t kBlock = 512;

template <typename T>
struct Plain {
  using Acc = T;
  static Acc load(const void* p, size_t i) { return static_cast<const T*>(p)[i]; }
  static void store(void* p, size_t i, Acc v) { static_cast<T*>(p)[i] = v; }
};

struct Bf16Io {
  using Acc = float;
  static Acc load(const void* p, size_t i) {
    return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  static void store(void* p, size_t i, Acc v) { static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); }
};

struct F16Io {
  using Acc = float;
  static Acc load(const void* p, size_t i) {
    return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  static void store(void* p, size_t i, Acc v) { static_cast<uint16_t*>(p)[i] = f32_to_f16(v); }
};

template <typename A>
inline A combine(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return static_cast<A>(a + b);
    case ReduceOp::product:
      return static_cast<A>(a * b);
    case ReduceOp::min:
      if constexpr (std::is_floating_point_v<A>) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return b < a ? b : a;
    case ReduceOp::max:
      if constexpr (std::is_floating_point_v<A>) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return a < b ? b : a;
  }
  return a;
}

// One loop per operator so that the compiler vectorises the common cases.
template <typename A, typename F>
inline void apply_block(A* acc, const A* in, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) acc[i] = f(acc[i], in[i]);
}

template <typename A>
void combine_block(ReduceOp op, A* acc, const A* in, size_t n) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      apply_block(acc, in, n, [](A a, A b) { return static_cast<A>(a + b); });
      break;
    case ReduceOp::product:
      apply_block(acc, in, n, [](A a, A b) { return static_cast<A>(a * b); });
      break;
    case ReduceOp::min:
      apply_block(acc, in, n, [](A a, A b) { return combine(ReduceOp::min, a, b); });
      break;
    case ReduceOp::max:
      apply_block(acc, in, n, [](A a, A b) { return combine(ReduceOp::max, a, b); });
      break;
  }
}

template <typename A>
A divide(A v, int n) {
  if constexpr (std::is_floating_point_v<A>) {
    return v / static_cast<A>(n);
  } else {
    return static_cast<A>(v / static_cast<A>(n));
  }
}

template <typename Io>
void reduce_sources_t(void* dst, const void* const* srcs, int num_srcs, size_t count, ReduceOp op,
                      int avg_divisor) {
  using A = typename Io::Acc;
  A acc[kBlock];
  A tmp[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    size_t n = std::min(kBlock, count - base);
    for (size_t i = 0; i < n; ++i) acc[i] = Io::load(srcs[0], base + i);
    for (int s = 1; s < num_srcs; ++s) {
      if constexpr (std::is_same_v<Io, Plain<A>>) {
        combine_block(op, acc, static_cast<const A*>(srcs[s]) + base, n);
      } else {
        for (size_t i = 0; i < n; ++i) tmp[i] = Io::load(srcs[s], base + i);
        combine_block(op, acc, tmp, n);
      }
    }
    if (op == ReduceOp::avg && avg_divisor > 0) {
      for (size_t i = 0; i < n; ++i) acc[i] = divide(acc[i], avg_divisor);
    }
    for (size_t i = 0; i < n; ++i) Io::store(dst, base + i, acc[i]);
  }
}

template <typename Io>
void reduce_into_t(void* acc, const void* src, size_t count, ReduceOp op) {
  using A = typename Io::Acc;
  if constexpr (std::is_same_v<Io, Plain<A>>) {
    combine_block(op, static_cast<A*>(acc), static_cast<const A*>(src), count);
  } else {
    const void* srcs[2] = {acc, src};
    reduce_sources_t<Io>(acc, srcs, 2, count, op, 0);
  }
}

template <typename Io>
void divide_t(void* data, size_t count, int n) {
  for (size_t i = 0; i < count; ++i) Io::store(data, i, divide(Io::load(data, i), n));
}

}  // namespace

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::product:
      return "product";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "avg" || name == "mean") return ReduceOp::avg;
  if (name == "min") return ReduceOp::min;
  if (name == "max") return ReduceOp::max;
  if (name == "product" || name == "prod") return ReduceOp::product;
  MT_THROW(ValueError, "unknown reduce op '", name, "' (expected sum, avg, min, max or product)");
}

#define MT_DISPATCH_IO(dtype, FN, ...) \
  switch (dtype) {                     \
    case DType::f32:                   \
      FN<Plain<float>>(__VA_ARGS__);   \
      break;                           \
    case DType::bf16:                  \
      FN<Bf16Io>(__VA_ARGS__);         \
      break;                           \
    case DType::f16:                   \
      FN<F16Io>(__VA_ARGS__);          \
      break;                           \
    case DType::i32:                   \
      FN<Plain<int32_t>>(__VA_ARGS__); \
      break;                           \
    case DType::i64:                   \
      FN<Plain<int64_t>>(__VA_ARGS__); \
      break;                           \
    case DType::u8:                    \
      FN<Plain<uint8_t>>(__VA_ARGS__); \
      break;                           \
  }

void reduce_sources(void* dst, const void* const* srcs, int num_srcs, size_t count, DType dtype,
                    ReduceOp op, int avg_divisor) {
  MT_CHECK(num_srcs >= 1, "reduce_sources needs at least one source");
  if (count == 0) return;
  MT_DISPATCH_IO(dtype, reduce_sources_t, dst, srcs, num_srcs, count, op, avg_divisor);
}

void reduce_into(void* acc, const void* src, size_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  MT_DISPATCH_IO(dtype, reduce_into_t, acc, src, count, op);
}

void divide_by(void* data, size_t count, DType dtype, int n) {
  if (count == 0 || n <= 1) return;
  MT_DISPATCH_IO(dtype, divide_t, data, count, n);
}

#undef MT_DISPATCH_IO

DType accumulation_dtype(DType dtype) {
  return (dtype == DType::bf16 || dtype == DType::f16) ? DType::f32 : dtype;
}

}  // namespace meshtrain::comm
