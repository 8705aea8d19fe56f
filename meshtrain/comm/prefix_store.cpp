// See prefix_store.h. The timeout starts as the base store's; get() honours this store's own.
#include "meshtrain/comm/prefix_store.h"

#include "meshtrain/util/error.h"

namespace meshtrain::comm {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  MT_CHECK(base_ != nullptr, "PrefixStore needs a base store");
  timeout_ = base_->timeout();
}

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full(k));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) {
  base_->set(full(key), value);
}

Bytes PrefixStore::get(const std::string& key) {
  // Waiting first applies this store's timeout rather than the base store's.
  base_->wait({full(key)}, timeout_);
  return base_->get(full(key));
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(full(key), delta);
}

Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return base_->compare_set(full(key), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  base_->wait(full(keys), timeout);
}

bool PrefixStore::remove(const std::string& key) {
  return base_->remove(full(key));
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(full(keys));
}

}  // namespace meshtrain::comm
