// The data and the model agree before the first step: every token id a run will read must be
// an index into the model's embedding. A mismatch would otherwise surface at step 1 inside the
// embedding kernel, far from its cause. Uses each shard's recorded largest id (token_shard.h),
// or one pass over a shard that does not record it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "meshtrain/data/token_dataset.h"

namespace meshtrain::data {

// ValueError naming the first shard holding an id >= vocab_size, that id and `key` (the config
// key that sets the vocabulary size). Not thread-safe with other first calls of max_token().
void check_vocab_fits(std::initializer_list<const TokenDataset*> datasets, int64_t vocab_size,
                      std::string_view key = "model.vocab_size");

}  // namespace meshtrain::data
