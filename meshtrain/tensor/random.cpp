#include "meshtrain/tensor/random.h"

#include <cmath>
#include <numbers>

#include "meshtrain/util/splitmix64.h"

namespace meshtrain {

uint64_t splitmix64(uint64_t x) {
  return splitmix64_mix(x + 0x9e3779b97f4a7c15ull);
}

double Generator::normal() {
  // 53-bit uniforms; u1 in (0, 1] so the log is finite.
  const double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  const double u2 = static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

uint64_t Generator::below(uint64_t n) {
  MT_CHECK(n > 0, "Generator::below(0)");
  // Rejection sampling removes modulo bias.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = next_u64();
  } while (x >= limit);
  return x % n;
}

void normal_(Tensor& t, Generator& gen, double mean, double std) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(mean + std * gen.normal());
}

void uniform_(Tensor& t, Generator& gen, double low, double high) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<float>(low + (high - low) * gen.uniform());
}

Tensor randn(const Shape& shape, Generator& gen) {
  Tensor t = Tensor::empty(shape);
  normal_(t, gen);
  return t;
}

}  // namespace meshtrain
