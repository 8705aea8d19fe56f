// See hash_store.h.
#include "meshtrain/comm/hash_store.h"

#include <charconv>

#include "meshtrain/util/error.h"

namespace meshtrain::comm {

int64_t parse_store_integer(const std::string& key, const Bytes& value) {
  const char* begin = reinterpret_cast<const char*>(value.data());
  const char* end = begin + value.size();
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(begin, end, v);
  if (value.empty() || ec != std::errc() || ptr != end) {
    MT_THROW(StoreError, "store key '", key, "' does not hold an integer");
  }
  return v;
}

Bytes format_store_integer(int64_t v) {
  std::string s = std::to_string(v);
  return Bytes(s.begin(), s.end());
}

std::string missing_keys_message(const std::vector<std::string>& missing, Duration timeout) {
  std::string names;
  for (size_t i = 0; i < missing.size() && i < 8; ++i) {
    names += (i ? ", '" : "'") + missing[i] + "'";
  }
  if (missing.size() > 8) names += detail::str_cat(" and ", missing.size() - 8, " more");
  return detail::str_cat("store keys not set within ", timeout.count(), " ms: ", names);
}

void HashStore::throw_if_closed() const {
  if (closed_) MT_THROW(StoreError, "store is closed");
}

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mu_);
    throw_if_closed();
    data_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key, Duration timeout) {
  std::unique_lock lock(mu_);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    throw_if_closed();
    auto it = data_.find(key);
    if (it != data_.end()) return it->second;
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      throw_if_closed();
      it = data_.find(key);
      if (it != data_.end()) return it->second;
      throw TimeoutError(missing_keys_message({key}, timeout));
    }
  }
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard lock(mu_);
    throw_if_closed();
    auto it = data_.find(key);
    int64_t current = it == data_.end() ? 0 : parse_store_integer(key, it->second);
    result = current + delta;
    data_[key] = format_store_integer(result);
  }
  changed_.notify_all();
  return result;
}

Bytes HashStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Bytes now;
  bool changed = false;
  {
    std::lock_guard lock(mu_);
    throw_if_closed();
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (expected.empty()) {
        data_[key] = desired;
        now = desired;
        changed = true;
      }
    } else if (it->second == expected) {
      it->second = desired;
      now = desired;
      changed = true;
    } else {
      now = it->second;
    }
  }
  if (changed) changed_.notify_all();
  return now;
}

void HashStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock lock(mu_);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto missing = [&] {
    std::vector<std::string> out;
    for (const auto& k : keys) {
      if (!data_.count(k)) out.push_back(k);
    }
    return out;
  };
  while (true) {
    throw_if_closed();
    auto m = missing();
    if (m.empty()) return;
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      throw_if_closed();
      m = missing();
      if (m.empty()) return;
      throw TimeoutError(missing_keys_message(m, timeout));
    }
  }
}

bool HashStore::remove(const std::string& key) {
  std::lock_guard lock(mu_);
  throw_if_closed();
  return data_.erase(key) > 0;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  throw_if_closed();
  for (const auto& k : keys) {
    if (!data_.count(k)) return false;
  }
  return true;
}

size_t HashStore::num_keys() const {
  std::lock_guard lock(mu_);
  return data_.size();
}

void HashStore::close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  changed_.notify_all();
}

}  // namespace meshtrain::comm
