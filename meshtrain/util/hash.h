// xxh3 (64-bit) checksums for files and in-memory bytes. Checkpoint manifests, dataset metadata
// and the config fingerprint that ranks compare all use this one function, so a hash printed by
// one tool can be checked by any other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace meshtrain {

uint64_t xxh3_64(const void* data, size_t nbytes);
uint64_t xxh3_64(std::string_view bytes);

// Streams the file; throws IoError naming it when it cannot be read.
uint64_t xxh3_64_file(const std::string& path);

// 16 lowercase hex digits, the form written to JSON files (JSON numbers lose 64-bit precision).
std::string hash_hex(uint64_t hash);

}  // namespace meshtrain
