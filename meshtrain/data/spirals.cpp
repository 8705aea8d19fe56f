#include "meshtrain/data/spirals.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "meshtrain/tensor/random.h"
#include "meshtrain/util/error.h"

namespace meshtrain::data {

ClassificationSet make_spirals(int64_t samples, int64_t classes, uint64_t seed, double noise) {
  if (samples < 1 || classes < 2)
    MT_THROW(ValueError, "spirals need at least one sample and two classes, got ", samples,
             " samples and ", classes, " classes");
  Generator gen(seed);
  // A random order, so that a prefix (the first evaluation batches) holds every class.
  std::vector<int64_t> order(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) order[static_cast<size_t>(i)] = i;
  for (int64_t i = samples - 1; i > 0; --i)
    std::swap(order[static_cast<size_t>(i)],
              order[static_cast<size_t>(gen.below(static_cast<uint64_t>(i + 1)))]);
  std::vector<float> x(static_cast<size_t>(samples * kSpiralFeatures));
  std::vector<int32_t> y(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t arm = i % classes;
    // Position along the arm in (0, 1]: radius t, the arm turning 4 radians outwards from the
    // centre, the angle jittered by `noise` radians.
    const double t = static_cast<double>(i / classes + 1) /
                     static_cast<double>((samples + classes - 1) / classes);
    const double angle =
        4.0 * t + 2.0 * std::numbers::pi * static_cast<double>(arm) / static_cast<double>(classes) +
        noise * gen.normal();
    const auto row = static_cast<size_t>(order[static_cast<size_t>(i)]);
    x[row * 2] = static_cast<float>(t * std::cos(angle));
    x[row * 2 + 1] = static_cast<float>(t * std::sin(angle));
    y[row] = static_cast<int32_t>(arm);
  }
  return ClassificationSet(std::move(x), std::move(y), kSpiralFeatures, classes);
}

}  // namespace meshtrain::data
