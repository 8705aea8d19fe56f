// Fuzz target for the IDX reader: arbitrary bytes as a file's content, plain or (when they start
// with 1f 8b) gzip. Built as a libFuzzer program when the compiler supports it, and replayed on
// mutated files by tests/data/idx_fuzz_replay_test.cpp everywhere else.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "meshtrain/data/idx_file.h"
#include "meshtrain/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain::data;
  try {
    const IdxArray a = parse_idx(std::span<const uint8_t>(data, size), "fuzz input");
    // What parses holds exactly the values its header describes.
    if (a.bytes.size() != static_cast<size_t>(a.count() * idx_type_size(a.type))) std::abort();
  } catch (const meshtrain::IoError&) {
    // Malformed files are expected; anything else escaping is a bug.
  }
  return 0;
}
