// Small operations may run on the thread that issues them while the group is idle (shm). These
// tests pin down what must not change with that: operations still complete in issue order behind
// queued large ones, every rank gets the right values, and a failure still arrives through the
// Work rather than out of the call that issued the operation.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "comm_test_util.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

TEST(IssueOrder, SmallOperationsWaitBehindQueuedLargeOnes) {
  for (int world : {2, 3}) {
    testing::run_ranks("shm", world, [world](ProcessGroup& pg) {
      const float r = static_cast<float>(pg.rank() + 1);
      const float total = static_cast<float>(world * (world + 1) / 2);
      for (int round = 0; round < 4; ++round) {
        std::vector<float> large(size_t{1} << 20, r);  // 4 MiB: goes to the group's thread
        std::vector<float> small(7, r * 2);
        int64_t tiny = pg.rank();
        WorkPtr w_large = pg.all_reduce(large.data(), large.size(), DType::f32);
        WorkPtr w_small = pg.all_reduce(small.data(), small.size(), DType::f32);
        WorkPtr w_tiny = pg.all_reduce(&tiny, 1, DType::i64, {.op = ReduceOp::max});
        w_tiny->wait();
        // FIFO: the later operations finished, so the earlier ones did.
        EXPECT_TRUE(w_small->is_completed());
        EXPECT_TRUE(w_large->is_completed());
        w_small->wait();
        w_large->wait();
        EXPECT_LT(w_large->seq(), w_small->seq());
        EXPECT_LT(w_small->seq(), w_tiny->seq());
        EXPECT_EQ(tiny, world - 1);
        for (float v : small) ASSERT_EQ(v, 2 * total);
        for (size_t i = 0; i < large.size(); i += 4099) ASSERT_EQ(large[i], total);
        ASSERT_EQ(large.back(), total);
        // Idle again: a small operation on its own.
        float one = 1.0f;
        pg.all_reduce(&one, 1, DType::f32)->wait();
        EXPECT_EQ(one, static_cast<float>(world));
      }
    });
  }
}

TEST(IssueOrder, SmallOperationsFromTwoThreadsOfOneRankStayOrdered) {
  // Two threads of each rank issue into one group; a lock makes every rank issue in the same
  // order (round-robin by a shared counter), as the group contract requires.
  const int world = 2;
  testing::run_ranks("shm", world, [](ProcessGroup& pg) {
    std::mutex mu;
    std::condition_variable cv;
    int turn = 0;
    const int kPerThread = 50;
    std::vector<float> results(2 * kPerThread, 0.0f);
    auto body = [&](int who) {
      for (int i = 0; i < kPerThread; ++i) {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return turn % 2 == who; });
        float& v = results[static_cast<size_t>(2 * i + who)];
        v = static_cast<float>(pg.rank() + 1 + i);
        WorkPtr w = pg.all_reduce(&v, 1, DType::f32);
        ++turn;
        lock.unlock();
        cv.notify_all();
        w->wait();
      }
    };
    std::thread a(body, 0), b(body, 1);
    a.join();
    b.join();
    for (int i = 0; i < kPerThread; ++i) {
      const float want = static_cast<float>(3 + 2 * i);
      EXPECT_EQ(results[2 * i], want);
      EXPECT_EQ(results[2 * i + 1], want);
    }
  });
}

TEST(IssueOrder, FailureOfAnInlineOperationComesThroughTheWork) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::thread> threads;
  std::string error;
  uint64_t failed_seq = 0;
  bool issue_threw = true;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ProcessGroupOptions o = testing::test_options("shm");
      o.timeout = std::chrono::milliseconds(400);
      auto pg = make_process_group("shm", store, r, 2, o);
      float v = 1.0f;
      pg->all_reduce(&v, 1, DType::f32)->wait();
      if (r == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1200));
        return;
      }
      WorkPtr w;
      try {
        w = pg->all_reduce(&v, 1, DType::f32);
        issue_threw = false;
        failed_seq = w->seq();
      } catch (...) {
        return;
      }
      try {
        w->wait();
      } catch (const CommError& e) {
        error = e.what();
      }
      EXPECT_TRUE(w->is_completed());
      EXPECT_FALSE(w->is_success());
      // The group is aborted: a later operation fails at once, through its Work too.
      WorkPtr later = pg->all_reduce(&v, 1, DType::f32);
      EXPECT_THROW(later->wait(), CommError);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(issue_threw);
  EXPECT_NE(error.find("all_reduce"), std::string::npos) << error;
  EXPECT_NE(error.find("(seq " + std::to_string(failed_seq)), std::string::npos) << error;
  EXPECT_NE(error.find("[1]"), std::string::npos) << error;
}

TEST(IssueOrder, WaitingOnALaterOperationRunsTheQueuedOnesInOrder) {
  // Large operations queue for the group's thread; a caller that waits on the last one may run
  // the queue itself. Either way all of them finish, in issue order, with the right values.
  for (const char* backend : {"shm", "tcp"}) {
    for (int world : {2, 3}) {
      SCOPED_TRACE(std::string(backend) + " world " + std::to_string(world));
      testing::run_ranks(backend, world, [world](ProcessGroup& pg) {
        const float r = static_cast<float>(pg.rank() + 1);
        const float total = static_cast<float>(world * (world + 1) / 2);
        for (int round = 0; round < 8; ++round) {
          std::vector<std::vector<float>> bufs(3, std::vector<float>(size_t{1} << 17, r));
          std::vector<WorkPtr> works;
          for (auto& b : bufs) works.push_back(pg.all_reduce(b.data(), b.size(), DType::f32));
          // A tiny one last: it may run inline only once the large ones are done.
          int64_t m = pg.rank();
          works.push_back(pg.all_reduce(&m, 1, DType::i64, {.op = ReduceOp::max}));
          works.back()->wait();
          for (auto& w : works) EXPECT_TRUE(w->is_completed());
          for (size_t i = 1; i < works.size(); ++i) EXPECT_LT(works[i - 1]->seq(), works[i]->seq());
          EXPECT_EQ(m, world - 1);
          for (auto& b : bufs) {
            for (size_t i = 0; i < b.size(); i += 997) ASSERT_EQ(b[i], total);
            ASSERT_EQ(b.back(), total);
          }
          // Waiting on one that already finished returns at once.
          works.front()->wait();
        }
      });
    }
  }
}

TEST(IssueOrder, BlockingCallReturnsACompletedWorkAfterTheQueuedOnes) {
  for (const char* backend : {"shm", "tcp"}) {
    SCOPED_TRACE(backend);
    testing::run_ranks(backend, 2, [](ProcessGroup& pg) {
      const float r = static_cast<float>(pg.rank() + 1);
      for (int round = 0; round < 8; ++round) {
        std::vector<float> queued(size_t{1} << 18, r), blocking(size_t{1} << 18, 2 * r);
        WorkPtr a = pg.all_reduce(queued.data(), queued.size(), DType::f32);
        WorkPtr b =
            pg.all_reduce(blocking.data(), blocking.size(), DType::f32, {.async_op = false});
        EXPECT_TRUE(b->is_completed());
        EXPECT_TRUE(a->is_completed());  // FIFO: issued earlier, so finished earlier
        EXPECT_LT(a->seq(), b->seq());
        b->wait();
        a->wait();
        for (size_t i = 0; i < queued.size(); i += 1021) {
          ASSERT_EQ(queued[i], 3.0f);
          ASSERT_EQ(blocking[i], 6.0f);
        }
        // Blocking on an idle group, every collective kind.
        int64_t x = pg.rank();
        pg.broadcast(&x, 1, DType::i64, {.root = 1, .async_op = false})->wait();
        EXPECT_EQ(x, 1);
        pg.barrier({.async_op = false})->wait();
      }
    });
  }
}

TEST(WorkHelper, UntimedWaitOffersItsThreadAndTimedWaitDoesNot) {
  int calls = 0;
  {
    Work w("op", 1);
    w.set_helper([&] {
      ++calls;
      w.finish();  // as a group that ran the operation on the waiting thread would
    });
    w.wait();
    EXPECT_EQ(calls, 1);
    w.wait();  // finished: no second call
    EXPECT_EQ(calls, 1);
  }
  {
    Work w("op", 2);
    std::thread finisher;
    // The helper leaves the operation to another thread: the wait goes on as before.
    w.set_helper([&] {
      ++calls;
      finisher = std::thread([&w] { w.finish(); });
    });
    EXPECT_THROW(w.wait(std::chrono::milliseconds(1)), TimeoutError);
    EXPECT_EQ(calls, 1);
    w.wait();
    finisher.join();
    EXPECT_EQ(calls, 2);
  }
}

}  // namespace
}  // namespace meshtrain::comm
