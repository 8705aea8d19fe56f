// The rendezvous key-value store. Ranks and launcher agents meet here to exchange addresses,
// counters and barriers. Values are opaque bytes. Implementations: TcpStore (server + clients,
// authenticated), FileStore (a shared file, for tests and single hosts), HashStore (in-memory,
// one process) and PrefixStore (a namespace over another store).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain::comm {

using Bytes = std::vector<uint8_t>;
using Duration = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until the key exists or the store's timeout passes (TimeoutError).
  virtual Bytes get(const std::string& key) = 0;
  // Atomically adds delta to the integer stored at key (0 when absent) and returns the result.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to desired if its current value equals expected (an empty expected value means
  // "key absent"). Returns the value now stored.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // Blocks until every key exists; throws TimeoutError naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Returns true when the key existed.
  virtual bool remove(const std::string& key) = 0;
  virtual bool check(const std::vector<std::string>& keys) = 0;

  Duration timeout() const { return timeout_; }
  void set_timeout(Duration t) { timeout_ = t; }

  // Convenience for string values.
  void set_string(const std::string& key, const std::string& value) {
    set(key, Bytes(value.begin(), value.end()));
  }
  std::string get_string(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }

 protected:
  Duration timeout_{std::chrono::seconds(300)};
};

}  // namespace meshtrain::comm
