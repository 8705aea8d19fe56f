// A namespace over another store: every key is written as "<prefix>/<key>". Lets one rendezvous
// store serve several jobs, restarts and sub-groups without their keys colliding.
#pragma once

#include <memory>

#include "meshtrain/comm/store.h"

namespace meshtrain::comm {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool remove(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace meshtrain::comm
