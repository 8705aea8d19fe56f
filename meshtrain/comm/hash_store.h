// An in-memory Store for threads of one process, and the state behind the TcpStore server.
// Blocking get/wait sleep on a condition variable; close() wakes every waiter with StoreError
// so a server can shut down while clients are blocked.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "meshtrain/comm/store.h"

namespace meshtrain::comm {

class HashStore : public Store {
 public:
  HashStore() = default;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override { return get(key, timeout()); }
  Bytes get(const std::string& key, Duration timeout);
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool remove(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

  size_t num_keys() const;
  // Makes every blocked and future call throw StoreError.
  void close();

 private:
  void throw_if_closed() const;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
  bool closed_ = false;
};

// The integer encoding add() uses (decimal ASCII, like other rendezvous stores), shared by every
// Store implementation. Throws StoreError when the stored value is not an integer.
int64_t parse_store_integer(const std::string& key, const Bytes& value);
Bytes format_store_integer(int64_t v);
// The TimeoutError message for keys still missing, shared so that every store says the same.
std::string missing_keys_message(const std::vector<std::string>& missing, Duration timeout);

}  // namespace meshtrain::comm
