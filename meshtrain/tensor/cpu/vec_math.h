// Branch-free float exp and tanh that the compiler can vectorise. The C library's expf/tanhf are
// scalar calls without -ffast-math, and softmax, attention, cross-entropy and GELU spend most of
// their time in them, so the kernels use these inline versions instead (error below 2 ulp).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace meshtrain::cpu {

// cond ? a : b on the bit patterns. A plain ?: whose arms are float arithmetic stays a branch
// under the default -ftrapping-math (the compiler will not speculate an arm that might raise an
// FP exception), which keeps the whole loop scalar; integer masking has no such restriction.
inline float select(bool cond, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(cond);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// exp(x) for x already in [-87.5, 88.72283], by range reduction x = n*ln2 + r, |r| <= ln2/2, a
// degree-6 polynomial for exp(r) and the exponent bits for 2^n. Callers that can clamp their
// input with min/max (and need no special cases) use it directly: the selects of fast_exp are
// half of its instructions.
inline float exp_in_range(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  const float shifted = x * kLog2e + kRound;
  const float n = shifted - kRound;
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = (p * r) * r + r + 1.0f;
  // 2^n split in two factors so that n = 128 (x near 88.7) does not overflow the exponent field.
  // n as an integer, read from the low mantissa bits of `shifted` (no float-to-int conversion,
  // which would keep the loop scalar under the default -ftrapping-math).
  int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  int32_t half = ni >> 1;
  float s1 = std::bit_cast<float>((half + 127) << 23);
  float s2 = std::bit_cast<float>((ni - half + 127) << 23);
  return e * s1 * s2;
}

// x limited to [lo, hi]; NaN comes back as a number in range.
inline float clamp_to(float x, float lo, float hi) {
  return select(x > hi, hi, select(x < lo, lo, x));
}

// exp(x) for every float: inputs below -87.3 give 0 (no subnormal results), above ln(FLT_MAX)
// give +inf. NaN needs no case of its own: every comparison is false for it, so it reaches the
// polynomial and comes out NaN.
inline float fast_exp(float x) {
  float result = exp_in_range(clamp_to(x, -87.5f, 88.72283f));
  result = select(x < -87.3f, 0.0f, result);
  return select(x > 88.72283f, std::bit_cast<float>(0x7f800000), result);
}

// exp(x) for x <= 88.7 or NaN -- the shifted logits of a softmax, which are <= 0 up to rounding --
// with half the selects of fast_exp.
inline float exp_nonpositive(float x) {
  const float result = exp_in_range(select(x < -87.5f, -87.5f, x));
  return select(x < -87.3f, 0.0f, result);
}

// tanh(x): an odd Taylor polynomial near zero (where 1 - 2/(e^2x + 1) cancels), else the exp form.
inline float fast_tanh(float x) {
  const float ax = select(std::fabs(x) > 20.0f, 20.0f, std::fabs(x));
  const float e = fast_exp(2.0f * ax);
  float big = 1.0f - 2.0f / (e + 1.0f);
  float x2 = ax * ax;
  float small = ax * (1.0f + x2 * (-1.0f / 3.0f + x2 * (2.0f / 15.0f + x2 * (-17.0f / 315.0f))));
  const float t = select(ax < 0.125f, small, big);
  return select(x < 0.0f, -t, t);
}

}  // namespace meshtrain::cpu
