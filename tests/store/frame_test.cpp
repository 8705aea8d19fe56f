// Frame and wire decoding: malformed input is rejected before memory is committed to it.
// Allocation counting replaces the global operator new for this test program; it only counts
// while a CountAllocations object is alive on the calling thread.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstdlib>
#include <new>
#include <thread>

#include "meshtrain/comm/frame.h"
#include "meshtrain/comm/store_protocol.h"
#include "meshtrain/util/error.h"
#include "tests/support/capability.h"

namespace {

thread_local bool g_counting = false;
thread_local size_t g_allocations = 0;
thread_local size_t g_largest = 0;

void* counted_alloc(size_t n) {
  if (g_counting) {
    ++g_allocations;
    if (n > g_largest) g_largest = n;
  }
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

struct CountAllocations {
  CountAllocations() {
    g_allocations = 0;
    g_largest = 0;
    g_counting = true;
  }
  ~CountAllocations() { g_counting = false; }
};

}  // namespace

void* operator new(size_t n) {
  return counted_alloc(n);
}
void* operator new[](size_t n) {
  return counted_alloc(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}

namespace meshtrain::comm {
namespace {

using namespace std::chrono_literals;

std::array<uint8_t, kFrameHeaderBytes> header(uint16_t type, uint32_t length) {
  std::array<uint8_t, kFrameHeaderBytes> h{};
  encode_frame_header(FrameHeader{type, length}, h.data());
  return h;
}

TEST(FrameTest, RoundTripsHeader) {
  auto h = header(7, 1234);
  FrameHeader out;
  ASSERT_EQ(decode_frame_header(h.data(), h.size(), 4096, &out), FrameStatus::kOk);
  EXPECT_EQ(out.type, 7);
  EXPECT_EQ(out.length, 1234u);
}

TEST(FrameTest, RejectsBadHeadersWithoutAllocating) {
  FrameHeader out;
  auto too_long = header(1, 0xffffffffu);
  auto bad_magic = header(1, 10);
  bad_magic[0] ^= 0x55;
  auto bad_reserved = header(1, 10);
  bad_reserved[6] = 1;
  CountAllocations count;
  EXPECT_EQ(decode_frame_header(too_long.data(), too_long.size(), 1 << 20, &out),
            FrameStatus::kTooLong);
  EXPECT_EQ(decode_frame_header(bad_magic.data(), bad_magic.size(), 1 << 20, &out),
            FrameStatus::kBadMagic);
  EXPECT_EQ(decode_frame_header(bad_reserved.data(), bad_reserved.size(), 1 << 20, &out),
            FrameStatus::kBadReserved);
  EXPECT_EQ(decode_frame_header(too_long.data(), 5, 1 << 20, &out), FrameStatus::kNeedMore);
  EXPECT_EQ(g_allocations, 0u);
}

TEST(FrameTest, ReadFrameRefusesOversizedLengthBeforeAllocating) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  Socket writer(fds[0], "writer");
  Socket reader(fds[1], "reader");
  auto h = header(1, 3u << 30);  // claims 3 GiB
  writer.send_all(h.data(), h.size(), Deadline(1s));
  CountAllocations count;
  EXPECT_THROW(read_frame(reader, Deadline(1s), 1 << 20), CommError);
  // The exception's message allocates; nothing near the claimed size may.
  EXPECT_LT(g_largest, size_t(1) << 16);
}

TEST(FrameTest, ReadWriteFrameOverSocketPair) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  Socket a(fds[0], "a");
  Socket b(fds[1], "b");
  Bytes payload(100000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 31);
  // Larger than the socket buffer: the writer must wait for the reader.
  std::thread writer([&] { write_frame(a, 42, payload, Deadline(5s)); });
  Frame f = read_frame(b, Deadline(5s));
  writer.join();
  EXPECT_EQ(f.type, 42);
  EXPECT_EQ(f.payload, payload);
}

TEST(FrameTest, RecvTimesOutNamingPeer) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  Socket a(fds[0], "peer-a");
  Socket b(fds[1], "peer-b");
  uint8_t buf[4];
  try {
    b.recv_all(buf, 4, Deadline(50ms));
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("peer-b"), std::string::npos) << e.what();
  }
  a.close();
  EXPECT_THROW(b.recv_all(buf, 4, Deadline(1s)), CommError);
}

TEST(StoreProtocolTest, KeyCountBeyondPayloadIsRejectedWithoutReserving) {
  WireWriter w;
  w.i64(10);
  w.u32(60000);  // 60000 keys claimed, none present
  Bytes payload = w.take();
  CountAllocations count;
  EXPECT_THROW(decode_store_request(static_cast<uint16_t>(StoreOp::kWait), payload), CommError);
  EXPECT_LT(g_largest, size_t(1) << 12);
}

TEST(StoreProtocolTest, RequestsRoundTrip) {
  StoreRequest r;
  r.op = StoreOp::kCompareSet;
  r.keys = {"key"};
  r.expected = {1, 2};
  r.value = {3};
  StoreRequest d = decode_store_request(static_cast<uint16_t>(r.op), encode_store_request(r));
  EXPECT_EQ(d.keys, r.keys);
  EXPECT_EQ(d.expected, r.expected);
  EXPECT_EQ(d.value, r.value);
  EXPECT_THROW(decode_store_request(999, Bytes{}), CommError);
}

TEST(HostPortTest, ParsesAndRejects) {
  EXPECT_EQ(HostPort::parse("node-1:29500").host, "node-1");
  EXPECT_EQ(HostPort::parse("node-1:29500").port, 29500);
  EXPECT_EQ(HostPort::parse("[::1]:80").host, "::1");
  EXPECT_EQ((HostPort{"::1", 80}).str(), "[::1]:80");
  EXPECT_THROW(HostPort::parse("nohost"), ValueError);
  EXPECT_THROW(HostPort::parse("h:99999"), ValueError);
  EXPECT_THROW(HostPort::parse("h:"), ValueError);
  EXPECT_THROW(HostPort::parse("::1:80"), ValueError);
}

TEST(SocketTest, ListensOnIpv6LoopbackWhenAvailable) {
  Socket l;
  bool have_ipv6 = true;
  try {
    l = Socket::listen("::1", 0);
  } catch (const CommError&) {
    have_ipv6 = false;
  }
  MT_SKIP_UNLESS("ipv6", have_ipv6, "no IPv6 loopback here");
  std::thread t([&] {
    Socket s = l.accept(Deadline(5s));
    uint8_t x = 0;
    s.recv_all(&x, 1, Deadline(5s));
    s.send_all(&x, 1, Deadline(5s));
  });
  Socket c = Socket::connect("::1", l.local_port(), Deadline(5s));
  uint8_t v = 9, back = 0;
  c.send_all(&v, 1, Deadline(5s));
  c.recv_all(&back, 1, Deadline(5s));
  t.join();
  EXPECT_EQ(back, 9);
}

}  // namespace
}  // namespace meshtrain::comm
