// ProcessGroup: the collective-communication interface every parallel strategy talks to, with
// one options struct per collective (timeout and algorithm overridable per call), and the factory
// that picks a backend ("shm", "tcp", "hier", "auto") from a registry at run time.
//
// Every collective is asynchronous: it is queued on the group's own thread, runs in issue order
// (FIFO) with a sequence number, and returns a Work. Buffers must stay valid until the Work
// completes. With `async_op = false` in its options (PyTorch's async_op=False, MPI's blocking
// calls) a collective runs on the calling thread, after the ones issued before it, and returns a
// completed Work (a failure is still rethrown by its wait()): no hand-off to the group's thread
// and back, which costs tens of microseconds on a machine with fewer cores than threads. Results
// are deterministic: every rank ends with the same bits, and the same inputs on the same world size
// give the same bits on every run. A failed operation (a peer died, a link dropped, the deadline
// passed) fails with CommError naming the operation, its sequence number and the ranks that did not
// answer, and aborts the group: every later operation fails at once.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/comm/comm_buffer.h"
#include "meshtrain/comm/reduce_op.h"
#include "meshtrain/comm/shm_budget.h"
#include "meshtrain/comm/store.h"
#include "meshtrain/comm/work.h"
#include "meshtrain/tensor/dtype.h"

namespace meshtrain::comm {

// How a collective moves data. `automatic` lets the backend choose by message and world size;
// the environment variable MESHTRAIN_COMM_ALGO (ring, halving_doubling, tree, direct) overrides
// the automatic choice for a whole process.
enum class Algorithm : uint8_t { automatic, ring, halving_doubling, tree, direct };
std::string_view algorithm_name(Algorithm a);
Algorithm parse_algorithm(std::string_view name);  // throws ValueError

struct AllReduceOptions {
  ReduceOp op = ReduceOp::sum;
  std::optional<Duration> timeout = std::nullopt;  // defaults to the group timeout
  Algorithm algorithm = Algorithm::automatic;
  bool async_op = true;  // false: runs on the calling thread and returns once finished
};
struct BroadcastOptions {
  int root = 0;
  std::optional<Duration> timeout = std::nullopt;
  Algorithm algorithm = Algorithm::automatic;
  bool async_op = true;  // false: runs on the calling thread and returns once finished
};
struct ReduceOptions {
  int root = 0;
  ReduceOp op = ReduceOp::sum;
  std::optional<Duration> timeout = std::nullopt;
  Algorithm algorithm = Algorithm::automatic;
  bool async_op = true;  // false: runs on the calling thread and returns once finished
};
struct AllGatherOptions {
  std::optional<Duration> timeout = std::nullopt;
  Algorithm algorithm = Algorithm::automatic;
  bool async_op = true;  // false: runs on the calling thread and returns once finished
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::sum;
  std::optional<Duration> timeout = std::nullopt;
  Algorithm algorithm = Algorithm::automatic;
  bool async_op = true;  // false: runs on the calling thread and returns once finished
};
struct GatherOptions {
  int root = 0;
  std::optional<Duration> timeout = std::nullopt;
  Algorithm algorithm = Algorithm::automatic;
  bool async_op = true;  // false: runs on the calling thread and returns once finished
};
struct ScatterOptions {
  int root = 0;
  std::optional<Duration> timeout = std::nullopt;
  Algorithm algorithm = Algorithm::automatic;
  bool async_op = true;  // false: runs on the calling thread and returns once finished
};
struct AllToAllOptions {
  std::optional<Duration> timeout = std::nullopt;
  Algorithm algorithm = Algorithm::automatic;
  bool async_op = true;  // false: runs on the calling thread and returns once finished
};
struct SendRecvOptions {
  std::optional<Duration> timeout = std::nullopt;
};
struct BarrierOptions {
  std::optional<Duration> timeout = std::nullopt;
  bool async_op = true;
};

struct ProcessGroupOptions {
  // Names the group's keys in the store ("pg/<name>/..."); two live groups on one store need
  // different names. split() derives "<name>/split<k>".
  std::string name = "default";
  Duration timeout = std::chrono::seconds(300);
  // The watchdog logs a warning naming the missing ranks once an operation runs this long.
  Duration warn_after = std::chrono::seconds(30);
  size_t flight_recorder_size = 64;
  Algorithm algorithm = Algorithm::automatic;
  // shm: bytes per rank per staging buffer (two buffers per rank).
  size_t shm_chunk_bytes = size_t{4} << 20;
  // shm: the host-wide /dev/shm and core budget this group draws from (comm/shm_budget.h). On the
  // job's first group, planned_groups declares the groups that will be split off it; split()
  // fills in the rest for the groups it makes.
  ShmBudget shm_budget;
  // tcp: the job token every peer connection proves it knows (empty: MESHTRAIN_TOKEN or
  // MESHTRAIN_TOKEN_FILE); the address peers reach this rank at (empty: MESHTRAIN_COMM_ADDR, else
  // the local address that routes to master_addr, else 127.0.0.1); master_addr is the
  // launcher's MASTER_ADDR as the worker's DistEnv read it (empty: none).
  std::string token;
  std::string address;
  std::string master_addr;
  // hier/auto: which host this rank is on (empty: MESHTRAIN_HOST_ID, else the host name).
  std::string host_id;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;
  virtual const ProcessGroupOptions& options() const = 0;
  // True where the ranks never meet (comm/detached_group.h): rank and size place data and files,
  // and every operation fails.
  virtual bool detached() const { return false; }

  // In place: data holds count elements on every rank and ends with the reduction.
  virtual WorkPtr all_reduce(void* data, size_t count, DType dtype,
                             const AllReduceOptions& opts = {}) = 0;
  virtual WorkPtr broadcast(void* data, size_t count, DType dtype,
                            const BroadcastOptions& opts = {}) = 0;
  // In place; only the root's buffer holds the result afterwards (others are left unspecified).
  virtual WorkPtr reduce(void* data, size_t count, DType dtype, const ReduceOptions& opts = {}) = 0;
  // output holds size() * count elements, rank r's input at offset r * count.
  virtual WorkPtr all_gather(const void* input, void* output, size_t count, DType dtype,
                             const AllGatherOptions& opts = {}) = 0;
  // Unequal sizes: rank r contributes counts[r] elements; output holds their sum, in rank order.
  virtual WorkPtr all_gather_v(const void* input, void* output, std::vector<size_t> counts,
                               DType dtype, const AllGatherOptions& opts = {}) = 0;
  // input holds size() * count elements; rank r receives the reduction of block r.
  virtual WorkPtr reduce_scatter(const void* input, void* output, size_t count, DType dtype,
                                 const ReduceScatterOptions& opts = {}) = 0;
  // output (size() * count elements) is only written on the root and may be null elsewhere.
  virtual WorkPtr gather(const void* input, void* output, size_t count, DType dtype,
                         const GatherOptions& opts = {}) = 0;
  // input (size() * count elements) is only read on the root and may be null elsewhere.
  virtual WorkPtr scatter(const void* input, void* output, size_t count, DType dtype,
                          const ScatterOptions& opts = {}) = 0;
  // input and output hold size() * count elements; block j of rank i lands in block i of rank j.
  virtual WorkPtr all_to_all(const void* input, void* output, size_t count, DType dtype,
                             const AllToAllOptions& opts = {}) = 0;
  // all_to_all with a block size per pair of ranks (mixture-of-experts token exchange). input
  // holds send_counts[j] elements for rank j, output recv_counts[i] elements from rank i, each
  // side's blocks back to back in rank order (block i of output starts at the sum of
  // recv_counts[0..i)). Any count may be zero. recv_counts[i] must equal the send_counts[rank()]
  // that rank i passes; exchange_counts() provides it when only the send side is known. A
  // mismatch fails with CommError (and aborts the group) instead of hanging or writing past a
  // block: shm compares every pair before any data moves, so every rank fails with the same
  // message; tcp finds it when the block arrives, so the receiving rank fails and its peers fail
  // on their next operation (a sender whose data was already buffered may complete); nccl cannot
  // check sizes, and a mismatched exchange ends with the group's deadline at the latest.
  virtual WorkPtr all_to_all_v(const void* input, const std::vector<size_t>& send_counts,
                               void* output, const std::vector<size_t>& recv_counts, DType dtype,
                               const AllToAllOptions& opts = {}) = 0;
  // The recv_counts of an all_to_all_v whose send_counts (one per rank) are given: an all_to_all
  // of one integer per pair. Blocking and collective (every rank calls it, in the same order
  // relative to the group's other operations); send_counts is host memory on every backend.
  virtual std::vector<size_t> exchange_counts(const std::vector<size_t>& send_counts,
                                              const AllToAllOptions& opts = {});
  // Point to point. Sends and receives between two ranks match by tag, in issue order per tag.
  // A send completes once its data is buffered or received; pair sends and receives so that
  // they cannot wait on each other (as with blocking MPI_Send).
  virtual WorkPtr send(const void* data, size_t count, DType dtype, int dst, uint32_t tag,
                       const SendRecvOptions& opts = {}) = 0;
  virtual WorkPtr recv(void* data, size_t count, DType dtype, int src, uint32_t tag,
                       const SendRecvOptions& opts = {}) = 0;
  virtual WorkPtr barrier(const BarrierOptions& opts = {}) = 0;

  // Collective over this group: every member calls it with the same list. Members get a new group
  // ranked in list order; other ranks get nullptr.
  virtual std::shared_ptr<ProcessGroup> split(const std::vector<int>& ranks) = 0;

  // Memory for collective buffers (see CommBuffer), zero-filled. Collective: every rank calls it
  // with the same size, in the same order relative to the group's operations. An all_reduce
  // whose buffer lies, on every rank, in the allocation made by the same call runs without
  // staging copies on backends that share it (shm); elsewhere this is private memory.
  virtual CommBufferPtr allocate_buffer(size_t bytes) {
    return CommBuffer::allocate_private(bytes);
  }

  // Fails every queued and future operation with CommError(reason) and wakes peers.
  virtual void abort(const std::string& reason) = 0;
  virtual bool aborted() const = 0;
  // The sequence number the next operation will get.
  virtual uint64_t next_seq() const = 0;
  // The last collectives of this rank, as JSON (see FlightRecorder).
  virtual std::string flight_recorder_json() const = 0;

 protected:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}

 private:
  const int rank_;
  const int size_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

using BackendFactory = std::function<ProcessGroupPtr(std::shared_ptr<Store> store, int rank,
                                                     int size, const ProcessGroupOptions& opts)>;

// The backend registry. The built-in backends are registered on first use; another backend
// (nccl, mpi) registers itself before make_process_group is called with its name.
void register_backend(const std::string& name, BackendFactory factory);
std::vector<std::string> registered_backends();

// Creates this rank's member of a group of `size` ranks that meet through `store`. Collective:
// every rank calls it with the same backend and options.name. "auto" picks shm when all ranks
// share a host, tcp when every rank is alone on its host, hier otherwise.
ProcessGroupPtr make_process_group(const std::string& backend, std::shared_ptr<Store> store,
                                   int rank, int size, const ProcessGroupOptions& opts = {});

}  // namespace meshtrain::comm
