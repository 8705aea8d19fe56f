// A generated classification set that needs no files: K interleaved spiral arms in the plane,
// one class per arm, with Gaussian noise. Linear models cannot separate it and a small MLP learns
// it in a few hundred steps, so a run shows learning without a download. The same seed gives the
// same set on every machine (counter-based generator), so every rank generates it itself.
#pragma once

#include <cstdint>

#include "meshtrain/data/classification_set.h"

namespace meshtrain::data {

inline constexpr int64_t kSpiralFeatures = 2;  // (x, y)

// `samples` points spread evenly over `classes` arms (the first samples % classes arms get one
// more), in shuffled order; noise is the standard deviation of each point's angle, in radians.
ClassificationSet make_spirals(int64_t samples, int64_t classes, uint64_t seed, double noise = 0.2);

}  // namespace meshtrain::data
