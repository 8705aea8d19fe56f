// IDX reading: the file is mapped, then read through one byte stream that is either the mapped
// bytes themselves or their inflation (zlib), so the header and data checks are written once.
// fuzz/idx_file_fuzz.cpp drives parse_idx with arbitrary bytes.
#include "meshtrain/data/idx_file.h"

#define ZLIB_CONST
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "meshtrain/data/mapped_file.h"
#include "meshtrain/util/error.h"

namespace meshtrain::data {

namespace {

// Deflate cannot expand a compressed byte into more than 1032 bytes, so a gzip file of n bytes
// holds at most 1032 n: what a header may make us allocate is bounded by the file's own size.
constexpr size_t kMaxDeflateRatio = 1032;
// zlib counts in 32-bit units; larger spans are fed in pieces.
constexpr size_t kZlibChunk = size_t{1} << 30;

bool known_type(uint8_t code) {
  switch (static_cast<IdxType>(code)) {
    case IdxType::u8:
    case IdxType::i8:
    case IdxType::i16:
    case IdxType::i32:
    case IdxType::f32:
    case IdxType::f64:
      return true;
  }
  return false;
}

std::string hex_bytes(const uint8_t* p, size_t n) {
  std::string s;
  char b[4];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, i == 0 ? "%02x" : " %02x", p[i]);
    s += b;
  }
  return s;
}

// The content of a file: its bytes, or what they inflate to when they start with the gzip
// magic. Concatenated gzip members read as one stream (as gunzip reads them).
class Content {
 public:
  Content(std::span<const uint8_t> file, const std::string& path)
      : file_(file), path_(path), gzip_(file.size() >= 2 && file[0] == 0x1f && file[1] == 0x8b) {
    if (gzip_ && inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK)
      MT_THROW(IoError, "cannot start decompressing ", path_, ": zlib is out of memory");
  }
  ~Content() {
    if (gzip_) inflateEnd(&zs_);
  }
  Content(const Content&) = delete;
  Content& operator=(const Content&) = delete;

  bool gzip() const { return gzip_; }
  // "" or "decompressed ", for messages about sizes.
  const char* form() const { return gzip_ ? "decompressed " : ""; }
  // The largest content the file can hold.
  size_t bound() const { return gzip_ ? kMaxDeflateRatio * file_.size() : file_.size(); }
  // The content's size modulo 2^32 as a gzip trailer records it (the last member's).
  size_t gzip_size_hint() const {
    if (!gzip_ || file_.size() < 4) return 0;
    const uint8_t* t = file_.data() + file_.size() - 4;
    return size_t{t[0]} | size_t{t[1]} << 8 | size_t{t[2]} << 16 | size_t{t[3]} << 24;
  }

  // Up to n bytes; fewer only at the end of the content.
  size_t read(uint8_t* dst, size_t n) {
    if (!gzip_) {
      const size_t got = std::min(n, file_.size() - pos_);
      if (got > 0) std::memcpy(dst, file_.data() + pos_, got);
      pos_ += got;
      return got;
    }
    return inflate_into(dst, n);
  }

  // Reads to the end, counting the bytes.
  size_t skip_rest() {
    uint8_t scratch[1 << 14];
    size_t total = 0;
    for (size_t got; (got = read(scratch, sizeof scratch)) > 0;) total += got;
    return total;
  }

 private:
  size_t inflate_into(uint8_t* dst, size_t n) {
    const std::string& path = path_;
    size_t got = 0;
    while (got < n && !ended_) {
      if (zs_.avail_in == 0) {
        const size_t left = file_.size() - pos_;
        if (left == 0) {
          MT_THROW(IoError, path, " is a cut gzip file: its stream stops after ", file_.size(),
                   " compressed bytes without the end of the stream; expected a complete gzip "
                   "file (was the download or copy interrupted?)");
        }
        zs_.next_in = file_.data() + pos_;
        zs_.avail_in = static_cast<uInt>(std::min(left, kZlibChunk));
        pos_ += zs_.avail_in;
      }
      const auto want = static_cast<uInt>(std::min(n - got, kZlibChunk));
      zs_.next_out = dst + got;
      zs_.avail_out = want;
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      got += want - zs_.avail_out;
      if (rc == Z_STREAM_END) {
        const size_t rest = zs_.avail_in + (file_.size() - pos_);
        if (rest == 0) {
          ended_ = true;
          break;
        }
        const uint8_t* next = zs_.avail_in > 0 ? zs_.next_in : file_.data() + pos_;
        if (rest >= 2 && next[0] == 0x1f && next[1] == 0x8b) {
          inflateReset(&zs_);  // another member follows
          continue;
        }
        MT_THROW(IoError, path, " has ", rest, " bytes of trailing garbage after its gzip stream",
                 " (from compressed byte ", file_.size() - rest, " of ", file_.size(),
                 "); expected the file to end with the stream");
      }
      // Z_BUF_ERROR only says no progress was possible without more input, which the next
      // round brings.
      if (rc != Z_OK && rc != Z_BUF_ERROR) {
        MT_THROW(IoError, path, " is corrupt gzip: ", zs_.msg != nullptr ? zs_.msg : zError(rc),
                 " near compressed byte ", pos_ - zs_.avail_in, " of ", file_.size(),
                 "; expected a valid gzip stream");
      }
    }
    return got;
  }

  std::span<const uint8_t> file_;
  const std::string& path_;
  bool gzip_;
  bool ended_ = false;
  size_t pos_ = 0;  // file bytes handed out (plain) or handed to zlib (gzip)
  z_stream zs_{};
};

void to_host_order(std::vector<uint8_t>& bytes, int64_t size) {
  if constexpr (std::endian::native == std::endian::big) return;
  if (size == 1) return;
  const auto n = static_cast<size_t>(size);
  for (size_t i = 0; i + n <= bytes.size(); i += n) std::reverse(&bytes[i], &bytes[i] + n);
}

}  // namespace

std::string_view idx_type_name(IdxType type) {
  switch (type) {
    case IdxType::u8:
      return "u8";
    case IdxType::i8:
      return "i8";
    case IdxType::i16:
      return "i16";
    case IdxType::i32:
      return "i32";
    case IdxType::f32:
      return "f32";
    case IdxType::f64:
      return "f64";
  }
  return "?";
}

int64_t idx_type_size(IdxType type) {
  switch (type) {
    case IdxType::u8:
    case IdxType::i8:
      return 1;
    case IdxType::i16:
      return 2;
    case IdxType::i32:
    case IdxType::f32:
      return 4;
    case IdxType::f64:
      return 8;
  }
  return 1;
}

int64_t IdxArray::count() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string IdxArray::describe() const {
  std::string s;
  for (int64_t d : dims) {
    if (!s.empty()) s += " x ";
    s += std::to_string(d);
  }
  s += ' ';
  s += idx_type_name(type);
  return s;
}

IdxArray read_idx(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    MT_THROW(IoError, path, " does not exist; expected an IDX file (plain or gzip-compressed)");
  const MappedFile file(path);
  return parse_idx({file.data(), file.size()}, path);
}

IdxArray parse_idx(std::span<const uint8_t> bytes, const std::string& path) {
  Content in(bytes, path);

  uint8_t magic[4];
  const size_t got_magic = in.read(magic, 4);
  if (got_magic < 4) {
    MT_THROW(IoError, path, " is too short for an IDX file: it has ", got_magic, " ", in.form(),
             "bytes, the magic alone needs 4");
  }
  if (magic[0] != 0 || magic[1] != 0) {
    MT_THROW(IoError, path, " has a bad magic: its first ", in.form(), "bytes are ",
             hex_bytes(magic, 4),
             "; expected an IDX magic (00 00, a type code, a rank: 00 00 08 03 for images)",
             in.gzip() ? "" : " or a gzip header (1f 8b)");
  }
  if (!known_type(magic[2])) {
    MT_THROW(IoError, path, " has the unsupported IDX type code ", hex_bytes(&magic[2], 1),
             " (magic ", hex_bytes(magic, 4),
             "); expected 08 (u8), 09 (i8), 0b (i16), 0c (i32), 0d (f32) or 0e (f64)");
  }
  IdxArray out;
  out.type = static_cast<IdxType>(magic[2]);
  const int rank = magic[3];
  if (rank < 1 || rank > kIdxMaxRank) {
    MT_THROW(IoError, path, " has IDX rank ", rank, " (magic ", hex_bytes(magic, 4),
             "); expected 1 to ", kIdxMaxRank, " dimensions");
  }

  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  uint8_t dims[4 * kIdxMaxRank];
  const size_t got_dims = in.read(dims, 4 * static_cast<size_t>(rank));
  if (got_dims < 4 * static_cast<size_t>(rank)) {
    MT_THROW(IoError, path, " is truncated in its header: rank ", rank, " needs ", header,
             " header bytes, the ", in.form(), "file has ", 4 + got_dims);
  }
  bool empty = false;
  for (int i = 0; i < rank; ++i) {
    const uint8_t* b = dims + 4 * i;
    const int64_t d = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3];
    out.dims.push_back(d);
    empty = empty || d == 0;
  }
  const int64_t size = idx_type_size(out.type);
  int64_t need = size;
  for (int64_t d : out.dims) {
    if (empty) {
      need = 0;
      break;
    }
    if (need > kIdxMaxBytes / d) {
      MT_THROW(IoError, path, " describes a ", out.describe(), " array of more than ", kIdxMaxBytes,
               " bytes; expected an array that fits in memory");
    }
    need *= d;
  }

  const auto need_bytes = static_cast<size_t>(need);
  const auto truncated = [&](size_t has) {
    MT_THROW(IoError, path, " is truncated: its ", out.describe(), " array needs ", need_bytes,
             " bytes of data after the ", header, "-byte header, the ", in.form(), "file has ",
             has);
  };
  // Allocate no more than the file can hold, so a header that lies cannot ask for more. A gzip
  // file whose trailer agrees with the header gets its array in one allocation; otherwise the
  // array grows as decompressed bytes arrive, so a small corrupt file stays cheap.
  const size_t room = std::min(need_bytes, in.bound() >= header ? in.bound() - header : 0);
  const bool hinted = in.gzip_size_hint() == ((header + need_bytes) & 0xffffffffu);
  size_t cap = in.gzip() && !hinted ? std::min(room, size_t{1} << 16) : room;
  out.bytes.resize(cap);
  size_t got = in.read(out.bytes.data(), cap);
  while (got == cap && cap < room) {
    const size_t next = std::min(room, 2 * cap);
    out.bytes.resize(next);
    got += in.read(out.bytes.data() + cap, next - cap);
    cap = next;
  }
  if (got < need_bytes) truncated(got < room ? got : got + in.skip_rest());
  if (const size_t extra = in.skip_rest(); extra > 0) {
    MT_THROW(IoError, path, " has ", extra, " bytes of trailing garbage after its ", out.describe(),
             " array; expected the ", in.form(), "file to end after ", header + need_bytes,
             " bytes (", header, " of header, ", need_bytes, " of data)");
  }
  to_host_order(out.bytes, size);
  return out;
}

}  // namespace meshtrain::data
