// See vocab_check.h.
#include "meshtrain/data/vocab_check.h"

#include "meshtrain/util/error.h"

namespace meshtrain::data {

void check_vocab_fits(std::initializer_list<const TokenDataset*> datasets, int64_t vocab_size,
                      std::string_view key) {
  for (const TokenDataset* d : datasets) {
    if (d == nullptr) continue;
    for (int64_t i = 0; i < d->num_shards(); ++i) {
      const int64_t max_token = d->shard_max_token(i);
      if (max_token >= vocab_size) {
        MT_THROW(ValueError, "token shard ", d->shard_label(i), " holds token id ", max_token,
                 ", outside ", key, " = ", vocab_size, ": set ", key, " to at least ",
                 max_token + 1, ", or prepare the data with the model's tokenizer");
      }
    }
  }
}

}  // namespace meshtrain::data
