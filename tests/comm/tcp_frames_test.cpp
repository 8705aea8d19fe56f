// A peer that passed authentication but then sends malformed frames to a tcp rank's listening
// port: bad magic, an unknown type, a length beyond the limit, a length that does not match the
// posted receive, an oversized early message or abort notice, a header cut short, and a huge
// announced length followed by a few bytes. Each is refused without allocating what the header
// claims (the rank's resident memory barely moves) and reported as a CommError on the receive
// that was waiting for that peer.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "comm_test_util.h"
#include "meshtrain/comm/auth.h"
#include "meshtrain/comm/socket.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

constexpr uint32_t kFrameMagic = 0x4650544du;  // the transport's frame and hello magics
constexpr uint32_t kHelloMagic = 0x4c48544du;
constexpr uint32_t kTypeData = 1;
constexpr uint32_t kTypeAbort = 2;

std::vector<uint8_t> header(uint32_t magic, uint32_t type, uint64_t tag, uint64_t bytes) {
  std::vector<uint8_t> h(24);
  std::memcpy(h.data(), &magic, 4);
  std::memcpy(h.data() + 4, &type, 4);
  std::memcpy(h.data() + 8, &tag, 8);
  std::memcpy(h.data() + 16, &bytes, 8);
  return h;
}

size_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  size_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

struct Case {
  const char* name;
  std::vector<uint8_t> bytes;  // sent after the hello; then the connection closes
  const char* expect;          // in the receive's error
};

std::vector<Case> cases() {
  const uint64_t kTag = 7;  // the receive the rank posts expects 64 bytes with this tag
  std::vector<uint8_t> truncated = header(kFrameMagic, kTypeData, kTag, 64);
  truncated.resize(10);
  auto with = [](std::vector<uint8_t> h, size_t extra) {
    h.resize(h.size() + extra, 0xab);
    return h;
  };
  return {
      {"bad_magic", header(0xdeadbeefu, kTypeData, kTag, 64), "malformed frame header"},
      {"unknown_type", header(kFrameMagic, 9, kTag, 64), "malformed frame header"},
      {"huge_length", header(kFrameMagic, kTypeData, kTag, uint64_t{1} << 62),
       "malformed frame header"},
      {"length_mismatch", header(kFrameMagic, kTypeData, kTag, uint64_t{1} << 33),
       "the receive expects 64"},
      {"early_too_big", header(kFrameMagic, kTypeData, kTag + 1, uint64_t{1} << 33),
       "exceeds the buffering limit"},
      {"abort_too_big", header(kFrameMagic, kTypeAbort, 0, uint64_t{1} << 20),
       "malformed frame header"},
      {"truncated_header", truncated, "closed its connection"},
      // Just under the early-buffer limit: accepted, but memory follows the bytes that arrive.
      {"announced_not_sent",
       with(header(kFrameMagic, kTypeData, kTag + 1, (uint64_t{1} << 30) - 1), 1000),
       "closed its connection"},
  };
}

TEST(TcpFrames, MalformedFramesAreRejectedWithoutAllocation) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::seconds(10));
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    ProcessGroupOptions o = testing::test_options("tcp");
    o.name = std::string("frames-") + c.name;
    o.timeout = std::chrono::seconds(5);
    // Rank 0 is real; this test plays rank 1 with the right token.
    auto pg = make_process_group("tcp", store, 0, 2, o);
    const size_t rss_before = resident_bytes();
    std::vector<uint8_t> buf(64);
    WorkPtr work = pg->recv(buf.data(), buf.size(), DType::u8, 1, 7);
    {
      HostPort hp = HostPort::parse(store->get_string("pg/" + o.name + "/tcp/addr/0"));
      Deadline d(std::chrono::seconds(5));
      Socket s = Socket::connect(hp.host, hp.port, d);
      authenticate_client(s, AuthToken(o.token), d);
      uint32_t hello[2] = {kHelloMagic, 1};
      s.send_all(hello, sizeof(hello), d);
      s.send_all(c.bytes.data(), c.bytes.size(), d);
    }  // closed: a rank that is still waiting for the rest of a frame sees the end of the stream
    std::string what;
    try {
      work->wait();
    } catch (const CommError& e) {
      what = e.what();
    }
    EXPECT_NE(what.find(c.expect), std::string::npos) << what;
    EXPECT_NE(what.find("[1]"), std::string::npos) << what;
    EXPECT_TRUE(pg->aborted());
    EXPECT_LT(resident_bytes(), rss_before + (size_t{64} << 20));
  }
}

}  // namespace
}  // namespace meshtrain::comm
