// WakeSignal: a wake-up now, a wake-up later, and a later one taken back before it fires.
#include "meshtrain/comm/wake_signal.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/support/wait.h"

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
  std::atomic<int> wakes{0};
  std::atomic<pid_t> sleeper_tid{0};
  std::thread sleeper([&] {
    sleeper_tid = ::meshtrain::testing::current_tid();
    w.wait();
    wakes.fetch_add(1);
  });
  // The sleeper is in its poll() before the timer is armed and cancelled.
  EXPECT_TRUE(::meshtrain::testing::wait_until(
      [&] {
        return sleeper_tid.load() != 0 && ::meshtrain::testing::thread_is_asleep(sleeper_tid);
      },
      std::chrono::seconds(10)));
  w.notify_after(std::chrono::milliseconds(1));
  w.cancel_later();
  // A timer armed after the cancelled one, with the same delay, fires after the cancelled
  // deadline: when it has, a timer left armed would have made the sleeper runnable (the kernel
  // wakes it from the timer's interrupt), so it must still be asleep and not have woken.
  WakeSignal reference;
  reference.notify_after(std::chrono::milliseconds(1));
  reference.wait();
  EXPECT_TRUE(::meshtrain::testing::thread_is_asleep(sleeper_tid)) << "the cancelled wake-up fired";
  EXPECT_EQ(wakes.load(), 0);
  w.notify();
  sleeper.join();
  EXPECT_EQ(wakes.load(), 1);
}

}  // namespace
}  // namespace meshtrain::comm
