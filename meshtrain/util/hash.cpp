// Thin wrappers over libxxhash; the streaming state is owned by a unique_ptr so that an error
// while reading a file cannot leak it.
#include "meshtrain/util/hash.h"

#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "meshtrain/util/error.h"

namespace meshtrain {

uint64_t xxh3_64(const void* data, size_t nbytes) {
  return XXH3_64bits(data, nbytes);
}

uint64_t xxh3_64(std::string_view bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t xxh3_64_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) MT_THROW(IoError, "cannot open ", path, ": ", std::strerror(errno));
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  if (!state) MT_THROW(Error, "out of memory creating an xxh3 state");
  XXH3_64bits_reset(state.get());
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    std::streamsize got = in.gcount();
    if (got > 0) XXH3_64bits_update(state.get(), buf.data(), static_cast<size_t>(got));
  }
  if (in.bad()) MT_THROW(IoError, "error reading ", path);
  return XXH3_64bits_digest(state.get());
}

std::string hash_hex(uint64_t hash) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i) {
    out[static_cast<size_t>(i)] = kDigits[hash & 0xf];
    hash >>= 4;
  }
  return out;
}

}  // namespace meshtrain
