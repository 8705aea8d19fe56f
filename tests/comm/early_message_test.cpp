// A message that arrives before its receive is posted is read into a buffer; a receive for it
// posted while that buffer is still filling must get the message once it is whole (it used to
// stay unmatched until its deadline while the message sat parked: a parameter server's push
// chunk arrived this way under load and the job timed out). Both transports, each driven by a
// raw peer that sends half the message, waits until the transport has read every byte so far,
// and only then lets the receive be posted and sends the rest.
#include <gtest/gtest.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "comm_test_util.h"
#include "meshtrain/comm/auth.h"
#include "meshtrain/comm/socket.h"
#include "meshtrain/comm/transport/shm_transport.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

using namespace std::chrono_literals;

// Waits (bounded) until cond holds; the caller asserts the result.
template <class F>
bool wait_until(F cond, std::chrono::seconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Rank 1 is a ShmTransport over rings in this process's memory; rank 0 writes its ring by hand
// in the transport's wire format (magic, length, tag; then the payload).
TEST(EarlyMessage, ShmReceivePostedWhileTheMessageIsBufferedGetsIt) {
  constexpr size_t kRing = 4096;
  const size_t stride = ShmTransport::stride_for(kRing);
  const size_t bytes = 4 * stride;  // a multiple of 64, as aligned_alloc wants
  std::unique_ptr<uint8_t, decltype(&std::free)> memory(
      static_cast<uint8_t*>(std::aligned_alloc(64, bytes)), &std::free);
  ASSERT_NE(memory, nullptr);
  std::memset(memory.get(), 0, bytes);
  std::atomic<uint32_t> bells[2] = {0, 0};
  ShmTransportLayout layout;
  layout.rings = memory.get();
  layout.ring_stride = stride;
  layout.ring_bytes = kRing;
  layout.doorbell = [&](int r) { return &bells[r]; };
  layout.alive = [](int) { return true; };
  layout.remote_abort = [] { return std::string(); };
  ShmTransport t(1, 2, layout);
  auto* ring = reinterpret_cast<ShmRing*>(layout.rings + stride * (0 * 2 + 1));
  uint64_t w = 0;
  auto write = [&](const void* p, size_t n) {
    ASSERT_LE(w + n - ring->read_pos.load(), kRing);
    std::memcpy(ring->data + w % kRing, p, n);  // every write here stays inside the ring
    w += n;
    ring->write_pos.store(w, std::memory_order_release);
    bells[1].fetch_add(1);
    // The transport sleeps on its bell for at most 200 ms without a wake; it reads this soon.
  };
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  // A receive for another tag is waiting, so the message for tag 8 is buffered, not left in the
  // ring.
  std::vector<uint8_t> other(16);
  RequestPtr a = t.post_recv(0, 7, other.data(), other.size(), deadline);
  const std::vector<uint8_t> msg = testing::byte_pattern(1000, 3);
  struct {
    uint32_t magic = 0x6d74706du;
    uint32_t bytes = 1000;
    uint64_t tag = 8;
  } header;
  write(&header, sizeof header);
  write(msg.data(), 500);
  ASSERT_TRUE(wait_until([&] { return ring->read_pos.load() == w; }))
      << "the transport did not read the first half";
  std::vector<uint8_t> got(1000);
  RequestPtr b = t.post_recv(0, 8, got.data(), got.size(), deadline);
  write(msg.data() + 500, 500);
  ASSERT_TRUE(b->wait_for(10s)) << "the receive posted while its message was buffered waits on";
  b->wait();
  EXPECT_EQ(got, msg);
  EXPECT_FALSE(a->done());
  // The receive for tag 7 still gets its own message afterwards.
  header.bytes = 16;
  header.tag = 7;
  const std::vector<uint8_t> small = testing::byte_pattern(16, 9);
  write(&header, sizeof header);
  write(small.data(), small.size());
  ASSERT_TRUE(a->wait_for(10s));
  a->wait();
  EXPECT_EQ(other, small);
}

// Finds this process's socket whose peer is `peer_of` (the raw peer's own address).
int socket_connected_to(int peer_of) {
  sockaddr_storage mine{};
  socklen_t len = sizeof mine;
  if (::getsockname(peer_of, reinterpret_cast<sockaddr*>(&mine), &len) != 0) return -1;
  for (int fd = 0; fd < 4096; ++fd) {
    if (fd == peer_of) continue;
    sockaddr_storage p{};
    socklen_t pl = sizeof p;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&p), &pl) == 0 && pl == len &&
        std::memcmp(&p, &mine, len) == 0)
      return fd;
  }
  return -1;
}

// Rank 0 is a real tcp group member; this test plays rank 1 over a raw socket.
TEST(EarlyMessage, TcpReceivePostedWhileTheFrameIsBufferedGetsIt) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(10s);
  ProcessGroupOptions o = testing::test_options("tcp");
  o.name = "early";
  o.timeout = std::chrono::seconds(20);
  auto pg = make_process_group("tcp", store, 0, 2, o);
  std::vector<uint8_t> other(16);
  WorkPtr a = pg->recv(other.data(), other.size(), DType::u8, 1, 7);
  HostPort hp = HostPort::parse(store->get_string("pg/" + o.name + "/tcp/addr/0"));
  Deadline d(10s);
  Socket s = Socket::connect(hp.host, hp.port, d);
  authenticate_client(s, AuthToken(o.token), d);
  const uint32_t hello[2] = {0x4c48544du, 1};
  s.send_all(hello, sizeof hello, d);
  auto frame_header = [](uint64_t tag, uint64_t bytes) {
    std::vector<uint8_t> h(24);
    const uint32_t magic = 0x4650544du, type = 1;
    std::memcpy(h.data(), &magic, 4);
    std::memcpy(h.data() + 4, &type, 4);
    std::memcpy(h.data() + 8, &tag, 8);
    std::memcpy(h.data() + 16, &bytes, 8);
    return h;
  };
  const std::vector<uint8_t> msg = testing::byte_pattern(1000, 5);
  const std::vector<uint8_t> h8 = frame_header(8, msg.size());
  s.send_all(h8.data(), h8.size(), d);
  s.send_all(msg.data(), 500, d);
  int rank_side = -1;
  ASSERT_TRUE(wait_until([&] { return (rank_side = socket_connected_to(s.fd())) >= 0; }));
  // Every byte sent so far was delivered and read by the rank.
  ASSERT_TRUE(wait_until([&] {
    int out = 1, in = 1;
    return ::ioctl(s.fd(), SIOCOUTQ, &out) == 0 && out == 0 &&
           ::ioctl(rank_side, FIONREAD, &in) == 0 && in == 0;
  })) << "the rank did not read the first half";
  std::vector<uint8_t> got(1000);
  WorkPtr b = pg->recv(got.data(), got.size(), DType::u8, 1, 8);
  s.send_all(msg.data() + 500, 500, d);
  b->wait();  // fails with the group's timeout when the frame stays parked
  EXPECT_EQ(got, msg);
  const std::vector<uint8_t> small = testing::byte_pattern(16, 11);
  const std::vector<uint8_t> h7 = frame_header(7, small.size());
  s.send_all(h7.data(), h7.size(), d);
  s.send_all(small.data(), small.size(), d);
  a->wait();
  EXPECT_EQ(other, small);
}

}  // namespace
}  // namespace meshtrain::comm
