// WakeSignal: a wake-up now, a wake-up later, and a later one taken back before it fires.
#include "meshtrain/comm/wake_signal.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace meshtrain::comm {
namespace {

TEST(WakeSignal, NotifyWakesTheSleeperEvenWhenItCameFirst) {
  WakeSignal w;
  w.notify();
  w.wait();  // returns: the wake-up was kept until someone waited
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    w.wait();
    woke = true;
  });
  w.notify();
  sleeper.join();
  EXPECT_TRUE(woke);
}

TEST(WakeSignal, DelayedWakeUpFiresOnItsOwn) {
  WakeSignal w;
  w.notify_after(std::chrono::microseconds(200));
  w.wait();  // nobody notifies: only the timer can end this wait
  // Fired and consumed: it can be armed again.
  w.notify_after(std::chrono::microseconds(200));
  w.wait();
}

TEST(WakeSignal, CancelledDelayedWakeUpDoesNotFire) {
  WakeSignal w;
  w.notify_after(std::chrono::milliseconds(1));
  w.cancel_later();
  std::atomic<int> wakes{0};
  std::thread sleeper([&] {
    w.wait();
    wakes.fetch_add(1);
  });
  // Well past the cancelled deadline the sleeper is still asleep; only notify() wakes it. The
  // check is one-sided (a late sleeper passes too) but a timer left armed fails it.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(wakes.load(), 0);
  w.notify();
  sleeper.join();
  EXPECT_EQ(wakes.load(), 1);
}

}  // namespace
}  // namespace meshtrain::comm
