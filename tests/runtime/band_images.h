// A small image set in Fashion-MNIST's IDX format for the ResNet's end-to-end tests: 28 x 28
// images whose class is a brightness pattern, learnable in a few steps, written by the test so
// that no test needs the real data set.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meshtrain/tensor/random.h"
#include "tests/data/idx_test_files.h"

namespace meshtrain::testing {

// Writes `prefix`-images-idx3-ubyte and `prefix`-labels-idx1-ubyte ("train" or "t10k") into `dir`:
// `n` images of 28 x 28 bytes; image i has class i % 10, drawn as a bright band whose row is the
// class, on noise.
inline void write_band_images(const std::filesystem::path& dir, const std::string& prefix,
                              uint32_t n, uint64_t seed) {
  Generator g(seed);
  std::vector<uint8_t> pixels(static_cast<size_t>(n) * 784), labels(n);
  for (uint32_t i = 0; i < n; ++i) {
    labels[i] = static_cast<uint8_t>(i % 10);
    for (int p = 0; p < 784; ++p) {
      const int row = p / 28;
      const bool band = row / 2 == static_cast<int>(i % 10) + 2;
      pixels[static_cast<size_t>(i) * 784 + static_cast<size_t>(p)] =
          static_cast<uint8_t>((band ? 160 : 0) + g.below(64));
    }
  }
  namespace idx = data::idx_files;
  std::ofstream(dir / (prefix + "-images-idx3-ubyte"), std::ios::binary)
      << idx::idx_u8({n, 28, 28}, pixels);
  std::ofstream(dir / (prefix + "-labels-idx1-ubyte"), std::ios::binary)
      << idx::idx_u8({n}, labels);
}

}  // namespace meshtrain::testing
