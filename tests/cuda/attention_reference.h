// The logsumexp of each row of causal attention's scaled scores over qkv[B, T, 3C], in double:
// what flash attention keeps for its backward, as the tests check it and as the fake device
// plays it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace meshtrain::test {

// lse[(b * NH + h) * T + t] = log sum_{u <= t} exp(q_t . k_u / sqrt(HS)).
inline void attention_lse_reference(float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                                    int64_t NH) {
  const int64_t HS = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t e = 0; e < HS; ++e)
            dot += static_cast<double>(qkv[(b * T + t) * 3 * C + h * HS + e]) *
                   qkv[(b * T + u) * 3 * C + C + h * HS + e];
          s.push_back(dot * scale);
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (const double v : s) sum += std::exp(v - m);
        lse[(b * NH + h) * T + t] = static_cast<float>(m + std::log(sum));
      }
}

}  // namespace meshtrain::test
