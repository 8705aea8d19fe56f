// safetensors: round trips for every dtype, interoperability with files written and read by
// Python (PyTorch's torch.frombuffer), and rejection of corrupt files with IoError.
#include "meshtrain/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "meshtrain/util/error.h"
#include "meshtrain/util/hash.h"
#include "tests/support/capability.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::ckpt {
namespace {

using meshtrain::testing::read_bytes;
using meshtrain::testing::TempDir;
using meshtrain::testing::write_bytes;

constexpr const char* kPython = "/usr/bin/python3";

// The values both sides agree on: element i of a tensor of the given dtype. Floats are exact in
// bf16 and f16.
double expected_value(DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32:
    case DType::bf16:
    case DType::f16:
      return static_cast<double>(i % 17) * 0.5 - 3.0;
    case DType::i32:
      return static_cast<double>(i * 7 - 100);
    case DType::i64:
      return static_cast<double>(i * 100003 - (int64_t{1} << 40));
    case DType::u8:
      return static_cast<double>((i * 7) % 256);
  }
  return 0;
}

Tensor make_tensor(DType dtype, const Shape& shape) {
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t n = t.numel();
  if (dtype == DType::i64) {
    for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = i * 100003 - (int64_t{1} << 40);
    return t;
  }
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<float>(expected_value(dtype, i));
  if (n > 0) convert(v.data(), DType::f32, t.data_ptr(), dtype, v.size());
  return t;
}

void expect_values(const Tensor& t, DType dtype, const Shape& shape, const std::string& name) {
  ASSERT_EQ(t.dtype(), dtype) << name;
  ASSERT_EQ(t.shape(), shape) << name;
  if (dtype == DType::i64) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      EXPECT_EQ(t.data<int64_t>()[i], i * 100003 - (int64_t{1} << 40)) << name << "[" << i << "]";
    }
    return;
  }
  std::vector<float> v = t.to_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i], static_cast<float>(expected_value(dtype, static_cast<int64_t>(i))))
        << name << "[" << i << "]";
  }
}

struct Spec {
  std::string name;
  DType dtype;
  Shape shape;
};

const std::vector<Spec>& specs() {
  static const std::vector<Spec> s = {
      {"w_f32", DType::f32, {3, 4}}, {"w_bf16", DType::bf16, {5}},    {"w_f16", DType::f16, {2, 3}},
      {"ids_i32", DType::i32, {7}},  {"big_i64", DType::i64, {2, 2}}, {"bytes_u8", DType::u8, {10}},
      {"scalar", DType::f32, {}},    {"empty", DType::f32, {0, 3}},
  };
  return s;
}

TEST(Safetensors, RoundTripEveryDtypeInOrder) {
  TempDir dir;
  NamedTensors tensors;
  // Deliberately not alphabetical: the file keeps the caller's order.
  for (auto it = specs().rbegin(); it != specs().rend(); ++it) {
    tensors.emplace_back(it->name, make_tensor(it->dtype, it->shape));
  }
  const std::string path = dir.file("model.safetensors");
  save_safetensors(path, tensors, {{"step", "12"}, {"format", "pt"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::string bytes = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');

  SafetensorsFile f = load_safetensors(path);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_EQ(f.tensors[i].first, tensors[i].first);
  for (const Spec& s : specs()) expect_values(f.at(s.name), s.dtype, s.shape, s.name);
  EXPECT_EQ(f.metadata.at("step"), "12");
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_TRUE(f.contains("w_f16"));
  EXPECT_FALSE(f.contains("nope"));
  EXPECT_THROW(f.at("nope"), ValueError);

  SafetensorsHeader h = read_safetensors_header(path);
  EXPECT_EQ(h.entries.size(), tensors.size());
  EXPECT_EQ(h.data_start, 8 + n);
}

TEST(Safetensors, SaveRejectsBadNames) {
  TempDir dir;
  Tensor t = Tensor::zeros({2});
  EXPECT_THROW(save_safetensors(dir.file("a"), {{"x", t}, {"x", t}}), ValueError);
  EXPECT_THROW(save_safetensors(dir.file("b"), {{"", t}}), ValueError);
  EXPECT_THROW(save_safetensors(dir.file("c"), {{"__metadata__", t}}), ValueError);
  EXPECT_FALSE(std::filesystem::exists(dir.file("a")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("a.tmp")));
}

// Writes a file with the given header text (padded) and data bytes.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string h = header;
  h.append((8 - h.size() % 8) % 8, ' ');
  uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}

void expect_io_error(const std::string& path, const std::string& fragment) {
  try {
    load_safetensors(path);
    FAIL() << "accepted a corrupt file (expected '" << fragment << "')";
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
  }
}

TEST(Safetensors, RejectsCorruptFiles) {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  const std::string data16(16, '\x01');
  auto check = [&](const std::string& contents, const std::string& fragment) {
    write_bytes(p, contents);
    expect_io_error(p, fragment);
  };
  // Well-formed baseline loads.
  write_bytes(p, raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data16));
  EXPECT_NO_THROW(load_safetensors(p));

  check("abc", "shorter than");
  {
    std::string f = raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data16);
    uint64_t huge = uint64_t{1} << 40;
    std::memcpy(f.data(), &huge, 8);
    check(f, "header length");
    uint64_t over = f.size();  // longer than what follows the length field
    std::memcpy(f.data(), &over, 8);
    check(f, "header length");
  }
  check(raw_file(R"({"a":{"dtype":"F32", "shape":[4],)", data16), "not valid JSON");
  check(raw_file(R"([1,2,3])", ""), "not a JSON object");
  check(raw_file(R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", data16),
        "tensor 'a' has unsupported dtype 'F64'");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,32]}})", data16), "outside");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data16),
        "tensor 'a' has 16 bytes");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", data16),
        "bad dimension");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[8,0]}})", data16),
        "tensor 'a'");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[4]}})", data16), "data_offsets");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 std::string(12, '\0')),
        "overlaps");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                 data16),
        "gap");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data16),
        "data section has 16");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],)"
                 R"("data_offsets":[0,16]}})",
                 data16),
        "tensor 'a'");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                 R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                 data16),
        "appears twice");
  check(
      raw_file(R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
               data16),
      "not a string");
  // A valid file cut short.
  TempDir other;
  save_safetensors(other.file("ok"), {{"w", make_tensor(DType::f32, {64})}});
  std::string ok = read_bytes(other.file("ok"));
  check(ok.substr(0, ok.size() - 10), "tensor 'w'");
  EXPECT_THROW(load_safetensors(dir.file("missing")), IoError);
}

TEST(Safetensors, RandomDamageNeverCrashes) {
  TempDir dir;
  const std::string good = dir.file("good");
  NamedTensors tensors;
  for (const Spec& s : specs()) tensors.emplace_back(s.name, make_tensor(s.dtype, s.shape));
  save_safetensors(good, tensors, {{"k", "v"}});
  const std::string bytes = read_bytes(good);
  std::mt19937_64 rng(1234);
  const std::string p = dir.file("damaged");
  int rejected = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::string f = bytes;
    const int kind = static_cast<int>(rng() % 3);
    if (kind == 0) {
      f.resize(rng() % f.size());
    } else {
      const int flips = 1 + static_cast<int>(rng() % 4);
      const size_t limit = kind == 1 ? std::min<size_t>(f.size(), 8 + 600) : f.size();
      for (int k = 0; k < flips; ++k) f[rng() % limit] = static_cast<char>(rng());
    }
    write_bytes(p, f);
    try {
      load_safetensors(p);
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);
}

bool python_has_torch() {
  return std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
}

// Python that knows the same expected values as expected_value() above.
constexpr const char* kPythonCommon = R"PY(
import json, struct, sys
SPECS = [("w_f32", "F32", [3, 4]), ("w_bf16", "BF16", [5]), ("w_f16", "F16", [2, 3]),
         ("ids_i32", "I32", [7]), ("big_i64", "I64", [2, 2]), ("bytes_u8", "U8", [10]),
         ("scalar", "F32", []), ("empty", "F32", [0, 3])]
def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n
def value(dtype, i):
    if dtype in ("F32", "BF16", "F16"):
        return (i % 17) * 0.5 - 3.0
    if dtype == "I32":
        return i * 7 - 100
    if dtype == "I64":
        return i * 100003 - (1 << 40)
    return (i * 7) % 256
def pack(dtype, v):
    if dtype == "F32": return struct.pack("<f", v)
    if dtype == "F16": return struct.pack("<e", v)
    if dtype == "BF16": return struct.pack("<f", v)[2:4]
    if dtype == "I32": return struct.pack("<i", v)
    if dtype == "I64": return struct.pack("<q", v)
    return struct.pack("<B", v)
)PY";

TEST(Safetensors, ReadsFileWrittenByPython) {
  MT_SKIP_UNLESS("python", std::filesystem::exists(kPython), kPython << " is not installed");
  TempDir dir;
  const std::string script = dir.file("write.py");
  // Header keys sorted (as Hugging Face writes them), data in reverse order, spaces as padding.
  write_bytes(script, std::string(kPythonCommon) + R"PY(
out = sys.argv[1]
header = {"__metadata__": {"format": "pt", "source": "python"}}
data = b""
for name, dtype, shape in reversed(SPECS):
    blob = b"".join(pack(dtype, value(dtype, i)) for i in range(numel(shape)))
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
    data += blob
text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
)PY");
  const std::string path = dir.file("py.safetensors");
  ASSERT_EQ(std::system((std::string(kPython) + " " + script + " " + path).c_str()), 0);
  SafetensorsFile f = load_safetensors(path);
  ASSERT_EQ(f.tensors.size(), specs().size());
  EXPECT_EQ(f.tensors.front().first, "empty");  // data order, not header order
  for (const Spec& s : specs()) expect_values(f.at(s.name), s.dtype, s.shape, s.name);
  EXPECT_EQ(f.metadata.at("source"), "python");
}

TEST(Safetensors, PyTorchReadsOurFile) {
  MT_SKIP_UNLESS("torch", std::filesystem::exists(kPython) && python_has_torch(),
                 kPython << " cannot import torch");
  TempDir dir;
  NamedTensors tensors;
  for (const Spec& s : specs()) tensors.emplace_back(s.name, make_tensor(s.dtype, s.shape));
  const std::string path = dir.file("ours.safetensors");
  save_safetensors(path, tensors, {{"format", "pt"}, {"writer", "meshtrain"}});
  const std::string script = dir.file("read.py");
  write_bytes(script, std::string(kPythonCommon) + R"PY(
import torch
TORCH = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
         "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8}
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert n % 8 == 0, n
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
assert header.pop("__metadata__") == {"format": "pt", "writer": "meshtrain"}
assert list(header) == [s[0] for s in SPECS], list(header)
for name, dtype, shape in SPECS:
    e = header[name]
    assert e["dtype"] == dtype and e["shape"] == shape, (name, e)
    b, end = e["data_offsets"]
    if end > b:
        t = torch.frombuffer(bytearray(data[b:end]), dtype=TORCH[dtype]).reshape(shape)
    else:
        t = torch.empty(shape, dtype=TORCH[dtype])
    want = torch.tensor([value(dtype, i) for i in range(numel(shape))], dtype=torch.float64)
    got = t.reshape(-1).to(torch.float64)
    assert torch.equal(got, want.reshape(-1)), (name, got, want)
print("OK")
)PY");
  ASSERT_EQ(std::system((std::string(kPython) + " " + script + " " + path).c_str()), 0);
}

// The exact bytes of a small file: the header layout (metadata first, tensors in the caller's
// order, offsets relative to the data, spaces up to a multiple of 8) is what other readers
// parse, and the digest is that of the whole file.
TEST(SafetensorsWriter, WritesTheExactFormatAndItsDigest) {
  TempDir dir;
  Tensor a = Tensor::from_vector(std::vector<float>{1.0f, -2.5f}, {2});
  Tensor b = Tensor::from_vector(std::vector<int32_t>{7}, {1});
  const std::string path = dir.file("x.safetensors");
  const FileDigest d = save_safetensors(path, {{"a", a}, {"b", b}}, {{"k", "v"}});
  std::string data(12, '\0');
  std::memcpy(data.data(), a.data_ptr(), 8);
  std::memcpy(data.data() + 8, b.data_ptr(), 4);
  const std::string expected =
      raw_file(R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"I32","shape":[1],"data_offsets":[8,12]}})",
               data);
  EXPECT_EQ(read_bytes(path), expected);
  EXPECT_EQ(d.bytes, expected.size());
  EXPECT_EQ(d.xxh3, xxh3_64(expected));
}

// More tensors than one writev() takes (IOV_MAX) and more bytes than one chunk, with a tensor
// that spans chunk boundaries: the file comes out whole, and the digest computed beside the
// write is the digest of the file.
TEST(SafetensorsWriter, StreamsManyTensorsAcrossChunks) {
  TempDir dir;
  NamedTensors tensors;
  for (int i = 0; i < 1500; ++i)
    tensors.emplace_back("small." + std::to_string(i), make_tensor(DType::f32, {1 + i % 5}));
  const auto big = static_cast<int64_t>(2 * SafetensorsWriter::kWriteChunkBytes + 12345);
  Tensor b = Tensor::empty({big}, DType::u8);
  for (int64_t i = 0; i < big; ++i) b.data<uint8_t>()[i] = static_cast<uint8_t>(i * 131 + 7);
  tensors.emplace_back("big", b);
  tensors.emplace_back("after", make_tensor(DType::i64, {3}));
  const std::string path = dir.file("many.safetensors");
  const FileDigest d = save_safetensors(path, tensors);
  EXPECT_EQ(d.bytes, std::filesystem::file_size(path));
  EXPECT_EQ(d.xxh3, xxh3_64_file(path));
  SafetensorsFile f = load_safetensors(path);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& want = tensors[i].second;
    const Tensor& got = f.tensors[i].second;
    ASSERT_EQ(f.tensors[i].first, tensors[i].first);
    ASSERT_EQ(got.shape(), want.shape()) << tensors[i].first;
    EXPECT_EQ(std::memcmp(got.data_ptr(), want.data_ptr(), want.nbytes()), 0) << tensors[i].first;
  }
}

// The in-place writer used inside checkpoint directories: a bad name is refused before a byte
// is written, and the file is complete once write() returns (sync() only makes it durable).
TEST(SafetensorsWriter, InPlaceWriteRefusesBadNamesBeforeWriting) {
  TempDir dir;
  Tensor t = make_tensor(DType::f32, {4});
  const TensorBytes x{"x", DType::f32, {4}, t.data_ptr(), t.nbytes()};
  {
    SafetensorsWriter bad(dir.file("bad.safetensors"));
    EXPECT_THROW(bad.write({x, x}), ValueError);
  }
  EXPECT_EQ(std::filesystem::file_size(dir.file("bad.safetensors")), 0u);

  SafetensorsWriter good(dir.file("good.safetensors"));
  const FileDigest d = good.write({x}, {{"k", "v"}});
  EXPECT_EQ(std::filesystem::file_size(dir.file("good.safetensors")), d.bytes);
  good.sync();
  SafetensorsFile f = load_safetensors(dir.file("good.safetensors"));
  expect_values(f.at("x"), DType::f32, {4}, "x");
  EXPECT_EQ(f.metadata.at("k"), "v");
  EXPECT_FALSE(std::filesystem::exists(dir.file("good.safetensors.tmp")));
}

}  // namespace
}  // namespace meshtrain::ckpt
