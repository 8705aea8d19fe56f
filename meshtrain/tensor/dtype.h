// Element types. Half types are stored as raw 16-bit patterns; conversions to and from f32
// round to nearest, ties to even, and keep NaN a NaN (quiet) and infinities infinite.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace meshtrain {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, u8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);      // "f32", "bf16", ...
DType parse_dtype(std::string_view name);  // throws ValueError; accepts "float32", "F32" too
bool is_floating(DType t);

// Raw 16-bit storage types, distinct so that overloads and templates can tell them apart.
struct BF16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements between any two dtypes (floats through f32; integers saturate on
// narrowing; NaN to integer gives 0).
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace meshtrain
