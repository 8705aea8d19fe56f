#include "meshtrain/tensor/dtype.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/util/error.h"

namespace meshtrain {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  std::string s(name);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "f32" || s == "float32" || s == "float") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f16" || s == "float16" || s == "half") return DType::f16;
  if (s == "i32" || s == "int32") return DType::i32;
  if (s == "i64" || s == "int64") return DType::i64;
  if (s == "u8" || s == "uint8") return DType::u8;
  MT_THROW(ValueError, "unknown dtype '", name, "' (expected f32, bf16, f16, i32, i64 or u8)");
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);  // inf or NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {
    // Subnormal half: normalise into an f32 normal.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    u = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to inf (>= 65520)
  if (abs >= 0x38800000u) {                       // normal half
    uint32_t r = abs - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return sign | static_cast<uint16_t>(r >> 13);
  }
  if (abs < 0x33000000u) return sign;  // below half of the smallest subnormal: zero
  // Subnormal half: shift the full mantissa, rounding to nearest even.
  const uint32_t exp = abs >> 23;
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // 14..24
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

namespace {

float load_f(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      return 0.f;
  }
}

int64_t load_i(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::i32:
      return static_cast<const int32_t*>(p)[i];
    case DType::i64:
      return static_cast<const int64_t*>(p)[i];
    case DType::u8:
      return static_cast<const uint8_t*>(p)[i];
    default:
      return 0;
  }
}

template <typename I>
I saturate(double v) {
  if (std::isnan(v)) return 0;
  if (v <= static_cast<double>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (v >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}

template <typename I>
I saturate_i(int64_t v) {
  if (v < static_cast<int64_t>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (v > static_cast<int64_t>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(v);
}

// The conversions autocast makes on every activation (f32 to and from bf16 or f16), in one
// typed loop over the cores; the same rounding as the general loop below.
template <typename F>
void convert_each(size_t n, F f) {
  const auto count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(count))
  for (int64_t i = 0; i < count; ++i) f(i);
}

bool convert_half(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == DType::f32 && (dt == DType::bf16 || dt == DType::f16)) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    if (dt == DType::bf16)
      convert_each(n, [&](int64_t i) { d[i] = f32_to_bf16(s[i]); });
    else
      convert_each(n, [&](int64_t i) { d[i] = f32_to_f16(s[i]); });
    return true;
  }
  if ((st == DType::bf16 || st == DType::f16) && dt == DType::f32) {
    const auto* s = static_cast<const uint16_t*>(src);
    auto* d = static_cast<float*>(dst);
    if (st == DType::bf16)
      convert_each(n, [&](int64_t i) { d[i] = bf16_to_f32(s[i]); });
    else
      convert_each(n, [&](int64_t i) { d[i] = f16_to_f32(s[i]); });
    return true;
  }
  return false;
}

}  // namespace

void convert(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  if (convert_half(src, st, dst, dt, n)) return;
  if (is_floating(st)) {
    for (size_t i = 0; i < n; ++i) {
      const float v = load_f(src, st, i);
      switch (dt) {
        case DType::f32:
          static_cast<float*>(dst)[i] = v;
          break;
        case DType::bf16:
          static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v);
          break;
        case DType::f16:
          static_cast<uint16_t*>(dst)[i] = f32_to_f16(v);
          break;
        case DType::i32:
          static_cast<int32_t*>(dst)[i] = saturate<int32_t>(v);
          break;
        case DType::i64:
          static_cast<int64_t*>(dst)[i] = saturate<int64_t>(v);
          break;
        case DType::u8:
          static_cast<uint8_t*>(dst)[i] = saturate<uint8_t>(v);
          break;
      }
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const int64_t v = load_i(src, st, i);
    switch (dt) {
      case DType::f32:
        static_cast<float*>(dst)[i] = static_cast<float>(v);
        break;
      case DType::bf16:
        static_cast<uint16_t*>(dst)[i] = f32_to_bf16(static_cast<float>(v));
        break;
      case DType::f16:
        static_cast<uint16_t*>(dst)[i] = f32_to_f16(static_cast<float>(v));
        break;
      case DType::i32:
        static_cast<int32_t*>(dst)[i] = saturate_i<int32_t>(v);
        break;
      case DType::i64:
        static_cast<int64_t*>(dst)[i] = v;
        break;
      case DType::u8:
        static_cast<uint8_t*>(dst)[i] = saturate_i<uint8_t>(v);
        break;
    }
  }
}

}  // namespace meshtrain
