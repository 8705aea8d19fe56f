// prepare_text: read, split at a line boundary, tokenize, write shards and metadata.
#include "meshtrain/data/prepare.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "meshtrain/data/byte_tokenizer.h"
#include "meshtrain/data/token_shard.h"
#include "meshtrain/util/atomic_file.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/hash.h"
#include "meshtrain/util/log.h"

namespace meshtrain::data {

namespace fs = std::filesystem;

namespace {

std::string read_text(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) MT_THROW(IoError, "input file ", path, " does not exist");
  if (fs::is_directory(path, ec)) MT_THROW(IoError, "input ", path, " is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) MT_THROW(IoError, "cannot open input file ", path, ": ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) MT_THROW(IoError, "error reading input file ", path);
  return std::move(ss).str();
}

// Where the validation split starts: the start of the line containing byte n - val_bytes, so
// no line is cut in two. Falls back to the start of the next line, then to the exact byte when
// the text has no usable line break (one long line).
size_t split_point(const std::string& text, double val_fraction) {
  const size_t n = text.size();
  const auto val_bytes = static_cast<size_t>(static_cast<double>(n) * val_fraction);
  if (val_bytes == 0) return n;
  const size_t target = n - val_bytes;
  size_t nl = text.rfind('\n', target - 1);
  if (nl != std::string::npos && nl + 1 < n) return nl + 1;
  nl = text.find('\n', target);
  if (nl != std::string::npos && nl + 1 < n) return nl + 1;
  return target;
}

}  // namespace

PrepareResult prepare_text(const std::string& input_path, const std::string& out_dir,
                           double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    MT_THROW(ValueError, "--val-fraction must be in [0, 1), got ", val_fraction);
  }
  const std::string text = read_text(input_path);
  if (text.empty()) MT_THROW(IoError, "input file ", input_path, " is empty; nothing to prepare");
  const size_t split = split_point(text, val_fraction);
  if (split == 0) {
    MT_THROW(ValueError, "input file ", input_path, " (", text.size(),
             " bytes) leaves no training text with --val-fraction ", val_fraction);
  }

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) MT_THROW(IoError, "cannot create output directory ", out_dir, ": ", ec.message());

  ByteTokenizer tok;
  const std::vector<int32_t> train = tok.encode(std::string_view(text).substr(0, split));
  const std::vector<int32_t> val = tok.encode(std::string_view(text).substr(split));

  PrepareResult r;
  r.train_path = (fs::path(out_dir) / "train_000000.bin").string();
  r.val_path = (fs::path(out_dir) / "val_000000.bin").string();
  r.meta_path = (fs::path(out_dir) / "meta.json").string();
  r.train_tokens = static_cast<int64_t>(train.size());
  r.val_tokens = static_cast<int64_t>(val.size());
  r.source_xxh3 = xxh3_64(text);
  write_token_shard(r.train_path, train);
  write_token_shard(r.val_path, val);

  nlohmann::ordered_json meta;
  meta["format"] = "llm.c token shards, uint16";
  meta["tokenizer"] = std::string(tok.name());
  meta["vocab_size"] = tok.vocab_size();
  meta["eot_token"] = tok.eot_token();
  meta["train_tokens"] = r.train_tokens;
  meta["val_tokens"] = r.val_tokens;
  meta["val_fraction"] = val_fraction;
  meta["source"] = input_path;
  meta["source_bytes"] = text.size();
  meta["source_xxh3"] = hash_hex(r.source_xxh3);
  meta["shards"] = {{"train", {"train_000000.bin"}}, {"val", {"val_000000.bin"}}};
  write_file_atomic(r.meta_path, meta.dump(2) + "\n");
  if (val_fraction > 0 && r.val_tokens == 0) {
    MT_LOG_WARN("data", "input ", input_path, " is too short for a validation split");
  }
  return r;
}

std::string prepare_summary(const PrepareResult& result) {
  return detail::str_cat("wrote ", result.train_tokens, " train tokens to ", result.train_path,
                         " and ", result.val_tokens, " val tokens to ", result.val_path,
                         " (source xxh3 ", hash_hex(result.source_xxh3), ")");
}

}  // namespace meshtrain::data
