// The checkpoint writer's barrier rides out a store that stalls for longer than a collective's
// deadline (an etcd leader change), and a stopping job ends its wait at once.
#include "meshtrain/runtime/checkpoint_barrier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "meshtrain/comm/hash_store.h"
#include "meshtrain/util/error.h"
#include "tests/support/wait.h"

namespace {

using namespace std::chrono_literals;
using meshtrain::comm::Bytes;
using meshtrain::comm::Duration;

// A store shared by thread ranks whose add() can be held (a stalled store request) and which
// counts the waits its callers make.
class GatedStore : public meshtrain::comm::Store {
 public:
  void set(const std::string& key, const Bytes& value) override { inner_.set(key, value); }
  Bytes get(const std::string& key) override { return inner_.get(key); }
  int64_t add(const std::string& key, int64_t delta) override {
    std::unique_lock lock(mu_);
    if (pass_ > 0) {
      --pass_;
    } else {
      open_.wait(lock, [&] { return !held_; });
    }
    lock.unlock();
    return inner_.add(key, delta);
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    return inner_.compare_set(key, expected, desired);
  }
  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    ++waits_;
    inner_.wait(keys, timeout);
  }
  using Store::wait;
  bool remove(const std::string& key) override { return inner_.remove(key); }
  bool check(const std::vector<std::string>& keys) override { return inner_.check(keys); }

  // The next `pass` add() calls go through; the ones after wait for release().
  void hold_after(int pass) {
    std::lock_guard lock(mu_);
    held_ = true;
    pass_ = pass;
  }
  void release() {
    {
      std::lock_guard lock(mu_);
      held_ = false;
    }
    open_.notify_all();
  }
  int waits() const { return waits_.load(); }

 private:
  meshtrain::comm::HashStore inner_;
  std::mutex mu_;
  std::condition_variable open_;
  bool held_ = false;
  int pass_ = 0;
  std::atomic<int> waits_{0};
};

// Runs f on a thread and keeps what it threw.
class Arrival {
 public:
  explicit Arrival(std::function<void()> f)
      : thread_([this, f = std::move(f)] {
          try {
            f();
          } catch (...) {
            error_ = std::current_exception();
          }
          done_ = true;
        }) {}
  ~Arrival() {
    if (thread_.joinable()) thread_.join();
  }
  bool done() const { return done_.load(); }
  std::exception_ptr join() {
    thread_.join();
    return error_;
  }

 private:
  std::exception_ptr error_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

TEST(CheckpointBarrier, OutlastsACollectiveDeadlineWhileTheStoreStalls) {
  auto store = std::make_shared<GatedStore>();
  const Duration collective = 50ms;
  meshtrain::runtime::CheckpointBarrier rank0(store, 2, collective, 20s);
  meshtrain::runtime::CheckpointBarrier rank1(store, 2, collective, 20s);
  for (int save = 0; save < 2; ++save) {
    const int base = store->waits();
    store->hold_after(1);
    Arrival first([&] { rank0.arrive(5); });
    Arrival second([&] { rank1.arrive(5); });
    // Declared after the arrivals: a failed assertion lets the held add() go before they join.
    const std::unique_ptr<GatedStore, void (*)(GatedStore*)> release_on_exit(
        store.get(), [](GatedStore* s) { s->release(); });
    // Whichever rank got its add() in first waits in slices of 250 ms: by its third slice it
    // has waited ten collective deadlines for the other, whose add() the store holds.
    ASSERT_TRUE(meshtrain::testing::wait_until([&] { return store->waits() >= base + 3; }, 30s));
    EXPECT_FALSE(first.done());
    EXPECT_FALSE(second.done());
    store->release();
    EXPECT_EQ(first.join(), nullptr) << "save " << save;
    EXPECT_EQ(second.join(), nullptr) << "save " << save;
  }
}

// A process that replaced a rank mid-run (an asynchronous parameter-server worker) saved
// nothing before: it meets the others at the step they save together, not at its first save.
TEST(CheckpointBarrier, AReplacementThatSavedNothingBeforeMeetsTheOthersAtTheSameStep) {
  auto store = std::make_shared<GatedStore>();
  meshtrain::runtime::CheckpointBarrier rank0(store, 2, 50ms, 20s);
  {
    meshtrain::runtime::CheckpointBarrier predecessor(store, 2, 50ms, 20s);
    Arrival first([&] { rank0.arrive(10); });
    Arrival second([&] { predecessor.arrive(10); });
    EXPECT_EQ(first.join(), nullptr);
    EXPECT_EQ(second.join(), nullptr);
  }
  meshtrain::runtime::CheckpointBarrier replacement(store, 2, 50ms, 20s);
  Arrival first([&] { rank0.arrive(20); });
  Arrival second([&] { replacement.arrive(20); });
  EXPECT_EQ(first.join(), nullptr);
  EXPECT_EQ(second.join(), nullptr);
  // Saving step 20 again (after a rollback) is a barrier of its own: alone, it times out.
  EXPECT_THROW(
      {
        meshtrain::runtime::CheckpointBarrier alone(store, 2, 10ms, 10ms);
        alone.arrive(20);
        alone.arrive(20);
      },
      meshtrain::TimeoutError);
}

TEST(CheckpointBarrier, AbandonEndsTheWaitForARankThatNeverArrives) {
  auto store = std::make_shared<GatedStore>();
  meshtrain::runtime::CheckpointBarrier rank0(store, 2, 50ms, 600s);
  Arrival first([&] { rank0.arrive(5); });
  ASSERT_TRUE(meshtrain::testing::wait_until([&] { return store->waits() >= 1; }, 30s));
  rank0.abandon();
  std::exception_ptr e = first.join();
  ASSERT_NE(e, nullptr);
  EXPECT_NE(what_of(e).find("abandoned"), std::string::npos) << what_of(e);
  EXPECT_THROW(rank0.arrive(5), meshtrain::CommError);
}

TEST(CheckpointBarrier, TimesOutNamingTheWorldAndTheDeadline) {
  auto store = std::make_shared<GatedStore>();
  meshtrain::runtime::CheckpointBarrier rank0(store, 3, 20ms, 30ms);
  EXPECT_EQ(rank0.timeout(), 50ms);
  try {
    rank0.arrive(5);
    FAIL() << "a barrier that two of three ranks never reach returned";
  } catch (const meshtrain::TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("3 ranks arrived within 50 ms"), std::string::npos) << what;
  }
}

TEST(CheckpointBarrier, TheDefaultLeavesRoomForAStoreFailover) {
  auto store = std::make_shared<GatedStore>();
  meshtrain::runtime::CheckpointBarrier b(store, 2, 5s);
  EXPECT_EQ(b.timeout(), 5s + meshtrain::runtime::CheckpointBarrier::kStoreFailover);
  EXPECT_GE(meshtrain::runtime::CheckpointBarrier::kStoreFailover, 30s);
}

}  // namespace
