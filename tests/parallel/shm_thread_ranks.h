// Runs one function per rank on threads of this process, each rank with its own process group
// over shared memory, as the data-parallel tests need: ranks that really communicate, without
// starting processes.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"

namespace meshtrain::testing {

// fn(rank, group) on `world` threads sharing one in-memory store; every call gets a fresh group
// name, so groups of earlier calls cannot meet it. Rethrows the first rank's failure.
inline void run_shm_ranks(int world,
                          const std::function<void(int, const comm::ProcessGroupPtr&)>& fn) {
  comm::register_builtin_backends();
  auto store = std::make_shared<comm::HashStore>();
  static std::atomic<int> group_id{0};
  const std::string name = "threads" + std::to_string(group_id++);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::ProcessGroupOptions po;
        po.name = name;
        po.timeout = std::chrono::seconds(60);
        fn(r, comm::make_process_group("shm", store, r, world, po));
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace meshtrain::testing
