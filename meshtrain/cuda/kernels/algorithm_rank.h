// The order in which a convolution tries cuDNN's algorithms. cuDNN's heuristics rank them by
// expected speed; a step must also give the same bits on every run (some backward-filter
// algorithms add with atomics) and, unless TF32 is allowed, compute in plain f32 (an entry may
// name tensor-op math the descriptor did not ask for). Those come first, in cuDNN's order, then
// the other deterministic ones, then the rest: the later ones are fallbacks for when an earlier
// one cannot run (its workspace does not fit in the device's memory, or cuDNN refuses it at run
// time). Host-only, so the order is tested on every machine.
#pragma once

#include <vector>

namespace meshtrain::cuda {

struct AlgorithmTraits {
  int algo = 0;
  bool supported = false;  // the heuristics' status for this shape
  bool deterministic = false;
  bool plain_math = false;  // f32 arithmetic (no TF32, no reduced precision)
};

// The supported algorithms, best first, by the rule above; `allow_tf32` makes every math mode as
// good as plain f32. Empty when none is supported.
inline std::vector<int> rank_algorithms(const std::vector<AlgorithmTraits>& heuristics,
                                        bool allow_tf32) {
  std::vector<int> ranked;
  const auto pass = [&](auto wanted) {
    for (const AlgorithmTraits& a : heuristics)
      if (a.supported && wanted(a)) ranked.push_back(a.algo);
  };
  const auto preferred = [&](const AlgorithmTraits& a) {
    return a.deterministic && (allow_tf32 || a.plain_math);
  };
  pass(preferred);
  pass([&](const AlgorithmTraits& a) { return a.deterministic && !preferred(a); });
  pass([](const AlgorithmTraits& a) { return !a.deterministic; });
  return ranked;
}

}  // namespace meshtrain::cuda
