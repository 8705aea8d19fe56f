// `meshtrain data prepare`: turns a text file into train/val token shards that TokenDataset
// reads. The text is tokenized with the byte tokenizer; the last val_fraction of it (moved back
// to the start of a line) becomes the validation split. meta.json records how the shards were
// made (tokenizer, counts, source and its xxh3) so a run can say what it trained on.
#pragma once

#include <cstdint>
#include <string>

namespace meshtrain::data {

struct PrepareResult {
  std::string train_path;
  std::string val_path;
  std::string meta_path;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  uint64_t source_xxh3 = 0;
};

// Creates out_dir if needed and writes train_000000.bin, val_000000.bin and meta.json there.
// val_fraction is in [0, 1). A missing or empty input is an IoError naming the file.
PrepareResult prepare_text(const std::string& input_path, const std::string& out_dir,
                           double val_fraction = 0.1);

// One line for the command line to print, e.g. "wrote 9000 train and 1000 val tokens to DIR".
std::string prepare_summary(const PrepareResult& result);

}  // namespace meshtrain::data
