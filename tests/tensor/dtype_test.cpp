#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "meshtrain/tensor/dtype.h"
#include "meshtrain/util/error.h"

namespace meshtrain {
namespace {

float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("F16"), DType::f16);
  EXPECT_THROW(parse_dtype("f8"), ValueError);
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between two bf16 values (1 and 1 + 2^-7): ties go to even (1).
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808000u)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: ties to even rounds up.
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000u)), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.5f)), 1.5f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
  // The largest finite f32 rounds to bf16 infinity.
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::max()))));
}

TEST(DType, F16RoundTripsEveryHalfValue) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = f16_to_f32(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), bits) << "half bits " << h;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // Halfway between 1 and 1 + 2^-10 rounds to 1 (even); halfway above an odd mantissa rounds up.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  // Smallest subnormal 2^-24 and half of it (ties to even: zero).
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
}

TEST(DType, ConvertSaturatesIntegers) {
  const float src[4] = {300.f, -5.f, 2.7f, std::numeric_limits<float>::quiet_NaN()};
  uint8_t dst[4];
  convert(src, DType::f32, dst, DType::u8, 4);
  EXPECT_EQ(dst[0], 255);
  EXPECT_EQ(dst[1], 0);
  EXPECT_EQ(dst[2], 2);
  EXPECT_EQ(dst[3], 0);
  const int64_t big[2] = {int64_t{1} << 40, -(int64_t{1} << 40)};
  int32_t out[2];
  convert(big, DType::i64, out, DType::i32, 2);
  EXPECT_EQ(out[0], std::numeric_limits<int32_t>::max());
  EXPECT_EQ(out[1], std::numeric_limits<int32_t>::min());
}

// Arrays of autocast's size convert between f32 and the half types across the cores: every
// element is the scalar rounding's (ties, subnormals, infinities, NaN, and every half value back).
TEST(DType, ConvertsLargeArraysBetweenF32AndHalfElementByElement) {
  const size_t n = size_t{1} << 17;
  std::vector<float> src(n);
  for (size_t i = 0; i < n; ++i) src[i] = bits_to_f32(static_cast<uint32_t>(i * 2654435761u));
  src[1] = std::numeric_limits<float>::infinity();
  src[2] = std::numeric_limits<float>::quiet_NaN();
  src[3] = std::ldexp(1.5f, -25);
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(half)));
    std::vector<uint16_t> packed(n);
    convert(src.data(), DType::f32, packed.data(), half, n);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = half == DType::bf16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
      ASSERT_EQ(packed[i], want) << i;
    }
    std::vector<uint16_t> every(n);
    for (size_t i = 0; i < n; ++i) every[i] = static_cast<uint16_t>(i);
    std::vector<float> wide(n);
    convert(every.data(), half, wide.data(), DType::f32, n);
    for (size_t i = 0; i < n; ++i) {
      const float want = half == DType::bf16 ? bf16_to_f32(every[i]) : f16_to_f32(every[i]);
      ASSERT_TRUE(wide[i] == want || (std::isnan(wide[i]) && std::isnan(want))) << i;
    }
  }
}

}  // namespace
}  // namespace meshtrain
