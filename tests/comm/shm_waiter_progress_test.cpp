// The shm transport lets the thread that posts or waits on a request move its bytes itself: a
// send that fits the ring is written before post_send returns, a receive whose message is in the
// ring is copied before post_recv returns, and two ranks that each wait on a send larger than
// their rings drain each other's rings from their waits. Handing every transfer to the progress
// thread and back cost two thread wake-ups (about 100 us per pipeline transfer on a busy host).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm_test_util.h"
#include "meshtrain/comm/transport/shm_transport.h"

namespace meshtrain::comm {
namespace {

using namespace std::chrono_literals;

// The rings and doorbells of a 2-rank group in this process's memory.
struct Rings {
  explicit Rings(size_t ring_bytes) : stride(ShmTransport::stride_for(ring_bytes)) {
    memory.reset(static_cast<uint8_t*>(std::aligned_alloc(64, 4 * stride)));
    std::memset(memory.get(), 0, 4 * stride);
    layout.rings = memory.get();
    layout.ring_stride = stride;
    layout.ring_bytes = ring_bytes;
    layout.doorbell = [this](int r) { return &bells[r]; };
    layout.alive = [](int) { return true; };
    layout.remote_abort = [] { return std::string(); };
  }
  ShmRing* ring(int src, int dst) {
    return reinterpret_cast<ShmRing*>(memory.get() + stride * (size_t(src) * 2 + dst));
  }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  const size_t stride;
  std::unique_ptr<uint8_t, Free> memory;
  std::atomic<uint32_t> bells[2] = {0, 0};
  ShmTransportLayout layout;
};

struct Header {  // the ring's wire format: magic, length, tag
  uint32_t magic = 0x6d74706du;
  uint32_t bytes = 0;
  uint64_t tag = 0;
};

TEST(ShmWaiterProgress, ASendThatFitsTheRingIsWrittenBeforePostSendReturns) {
  Rings rings(4096);
  ShmTransport t(0, 2, rings.layout);
  const std::vector<uint8_t> msg = testing::byte_pattern(1000, 5);
  RequestPtr s = t.post_send(1, 42, msg.data(), msg.size(), std::chrono::steady_clock::now() + 10s);
  EXPECT_TRUE(s->done()) << "the send waited for the progress thread";
  ShmRing* r = rings.ring(0, 1);
  ASSERT_EQ(r->write_pos.load(), sizeof(Header) + msg.size());
  Header h;
  std::memcpy(&h, r->data, sizeof h);
  EXPECT_EQ(h.bytes, msg.size());
  EXPECT_EQ(h.tag, 42u);
  EXPECT_EQ(std::memcmp(r->data + sizeof h, msg.data(), msg.size()), 0);
  s->wait();
}

TEST(ShmWaiterProgress, AReceiveWhoseMessageIsInTheRingIsDoneWhenPosted) {
  Rings rings(4096);
  ShmTransport t(1, 2, rings.layout);
  // Rank 0 writes its message by hand before anything is posted: with no receive posted, the
  // transport leaves it in the ring.
  const std::vector<uint8_t> msg = testing::byte_pattern(700, 11);
  ShmRing* r = rings.ring(0, 1);
  Header h;
  h.bytes = static_cast<uint32_t>(msg.size());
  h.tag = 9;
  std::memcpy(r->data, &h, sizeof h);
  std::memcpy(r->data + sizeof h, msg.data(), msg.size());
  r->write_pos.store(sizeof h + msg.size(), std::memory_order_release);
  std::vector<uint8_t> got(msg.size());
  RequestPtr rv = t.post_recv(0, 9, got.data(), got.size(), std::chrono::steady_clock::now() + 10s);
  EXPECT_TRUE(rv->done()) << "the receive waited for the progress thread";
  rv->wait();
  EXPECT_EQ(got, msg);
  EXPECT_EQ(r->read_pos.load(), sizeof h + msg.size());
}

// Each rank posts a send 64 times its ring, then a receive, and waits on the send first: the
// sends can only finish while the waits also drain the incoming rings.
TEST(ShmWaiterProgress, RanksWaitingOnSendsLargerThanTheirRingsDrainEachOther) {
  Rings rings(4096);
  constexpr size_t kBytes = 64 * 4096 + 123;
  ShmTransport t0(0, 2, rings.layout);
  ShmTransport t1(1, 2, rings.layout);
  ShmTransport* ts[2] = {&t0, &t1};
  std::vector<uint8_t> got[2];
  std::string failed[2];
  auto side = [&](int r) {
    try {
      const std::vector<uint8_t> out = testing::byte_pattern(kBytes, static_cast<uint8_t>(r + 1));
      got[r].assign(kBytes, 0);
      const auto deadline = std::chrono::steady_clock::now() + 20s;
      for (int i = 0; i < 3; ++i) {
        RequestPtr s = ts[r]->post_send(1 - r, 100 + i, out.data(), out.size(), deadline);
        RequestPtr rv = ts[r]->post_recv(1 - r, 100 + i, got[r].data(), kBytes, deadline);
        s->wait();
        rv->wait();
      }
    } catch (const std::exception& e) {
      failed[r] = e.what();
    }
  };
  std::thread other([&] { side(1); });
  side(0);
  other.join();
  EXPECT_EQ(failed[0], "");
  EXPECT_EQ(failed[1], "");
  EXPECT_EQ(got[0], testing::byte_pattern(kBytes, 2));
  EXPECT_EQ(got[1], testing::byte_pattern(kBytes, 1));
}

}  // namespace
}  // namespace meshtrain::comm
