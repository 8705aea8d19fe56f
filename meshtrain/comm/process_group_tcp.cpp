// TcpProcessGroup: dtype widening, algorithm choice and dispatch to algorithms/.
#include "meshtrain/comm/process_group_tcp.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "meshtrain/comm/algorithms/algorithms.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {

using algorithms::Exchange;

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  // The port only has to be valid: connecting a UDP socket sends nothing.
  if (host.empty() || ::getaddrinfo(host.c_str(), "9", &hints, &found) != 0) return {};
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        local.sin_addr.s_addr != htonl(INADDR_ANY)) {
      char text[INET_ADDRSTRLEN] = {};
      if (::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) out = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return out;
}

std::string resolve_comm_address(const ProcessGroupOptions& opts) {
  if (!opts.address.empty()) return opts.address;
  if (auto env = env_value(Env::comm_addr)) return *env;
  if (!opts.master_addr.empty()) {
    if (std::string routed = local_address_towards(opts.master_addr); !routed.empty())
      return routed;
  }
  return "127.0.0.1";
}

TcpProcessGroup::TcpProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                 ProcessGroupOptions opts)
    : ProcessGroupBase(std::move(store), rank, size, std::move(opts), "tcp") {
  TcpTransportOptions t;
  t.key_prefix = key_prefix();
  t.address = resolve_comm_address(options());
  t.token = options().token.empty() ? AuthToken::from_env() : AuthToken(options().token);
  t.connect_timeout = options().timeout;
  transport_ = std::make_unique<TcpTransport>(this->store(), rank, size, std::move(t));
  start();
}

TcpProcessGroup::~TcpProcessGroup() {
  stop();
  transport_.reset();
}

Algorithm TcpProcessGroup::choose_all_reduce(size_t bytes, int world) {
  // One round (every rank's vector to every other) beats halving-doubling's 2 log2(N) rounds
  // while a message costs its latency more than its bytes.
  if (world <= 4 && bytes <= (size_t{16} << 10)) return Algorithm::direct;
  if (bytes < (size_t{256} << 10)) return Algorithm::halving_doubling;
  return Algorithm::ring;
}

std::string TcpProcessGroup::algorithm_label(const OpContext& ctx) const {
  return std::string(algorithm_name(ctx.algorithm));
}

void TcpProcessGroup::on_abort(const std::string& reason) {
  if (transport_) transport_->abort(reason);
}

std::vector<int> TcpProcessGroup::waiting_for() const {
  return transport_->pending_peers();
}

namespace {

// Runs fn on an accumulation-type copy of a half-precision buffer, then rounds back once.
template <typename Fn>
void with_accumulation(void* data, size_t count, DType dtype, Fn fn) {
  DType acc = accumulation_dtype(dtype);
  if (acc == dtype) {
    fn(data, acc);
    return;
  }
  std::vector<uint8_t> wide(count * dtype_size(acc));
  convert(data, dtype, wide.data(), acc, count);
  fn(wide.data(), acc);
  convert(wide.data(), acc, data, dtype, count);
}

ReduceOp wire_op(ReduceOp op) {
  return op == ReduceOp::avg ? ReduceOp::sum : op;
}

}  // namespace

void TcpProcessGroup::run_all_reduce(OpContext& ctx, void* data, size_t count, DType dtype,
                                     ReduceOp op) {
  if (size() == 1) return;
  Exchange ex(*transport_, ctx.collective_seq, ctx.deadline);
  with_accumulation(data, count, dtype, [&](void* buf, DType acc) {
    Algorithm algo = ctx.algorithm != Algorithm::automatic
                         ? ctx.algorithm
                         : choose_all_reduce(count * dtype_size(acc), size());
    switch (algo) {
      case Algorithm::ring:
        algorithms::all_reduce_ring(ex, buf, count, acc, wire_op(op));
        break;
      case Algorithm::tree:
        algorithms::all_reduce_tree(ex, buf, count, acc, wire_op(op));
        break;
      case Algorithm::direct:
        algorithms::all_reduce_direct(ex, buf, count, acc, wire_op(op));
        break;
      default:
        algorithms::all_reduce_halving_doubling(ex, buf, count, acc, wire_op(op));
        break;
    }
    if (op == ReduceOp::avg) divide_by(buf, count, acc, size());
  });
}

void TcpProcessGroup::run_reduce(OpContext& ctx, void* data, size_t count, DType dtype, ReduceOp op,
                                 int root) {
  if (size() == 1) return;
  Exchange ex(*transport_, ctx.collective_seq, ctx.deadline);
  with_accumulation(data, count, dtype, [&](void* buf, DType acc) {
    algorithms::reduce_tree(ex, buf, count, acc, wire_op(op), root);
    if (op == ReduceOp::avg && rank() == root) divide_by(buf, count, acc, size());
  });
}

void TcpProcessGroup::run_broadcast(OpContext& ctx, void* data, size_t count, DType dtype,
                                    int root) {
  if (size() == 1) return;
  Exchange ex(*transport_, ctx.collective_seq, ctx.deadline);
  size_t bytes = count * dtype_size(dtype);
  if (ctx.algorithm == Algorithm::direct) {
    algorithms::broadcast_direct(ex, data, bytes, root);
  } else {
    algorithms::broadcast_tree(ex, data, bytes, root);
  }
}

void TcpProcessGroup::run_all_gather_v(OpContext& ctx, const void* input, void* output,
                                       const std::vector<size_t>& counts, DType dtype) {
  Exchange ex(*transport_, ctx.collective_seq, ctx.deadline);
  if (ctx.algorithm == Algorithm::direct) {
    algorithms::all_gather_direct(ex, input, output, counts, dtype_size(dtype));
  } else {
    algorithms::all_gather_ring(ex, input, output, counts, dtype_size(dtype));
  }
}

void TcpProcessGroup::run_reduce_scatter(OpContext& ctx, const void* input, void* output,
                                         size_t count, DType dtype, ReduceOp op) {
  Exchange ex(*transport_, ctx.collective_seq, ctx.deadline);
  const int n = size();
  DType acc = accumulation_dtype(dtype);
  std::vector<uint8_t> wide_in, wide_out;
  const void* in = input;
  void* out = output;
  if (acc != dtype) {
    wide_in.resize(count * n * dtype_size(acc));
    wide_out.resize(count * dtype_size(acc));
    convert(input, dtype, wide_in.data(), acc, count * n);
    in = wide_in.data();
    out = wide_out.data();
  }
  if (ctx.algorithm == Algorithm::direct) {
    algorithms::reduce_scatter_direct(ex, in, out, count, acc, wire_op(op));
  } else {
    algorithms::reduce_scatter_ring(ex, in, out, count, acc, wire_op(op));
  }
  if (op == ReduceOp::avg) divide_by(out, count, acc, n);
  if (acc != dtype) convert(wide_out.data(), acc, output, dtype, count);
}

void TcpProcessGroup::run_gather(OpContext& ctx, const void* input, void* output, size_t count,
                                 DType dtype, int root) {
  Exchange ex(*transport_, ctx.collective_seq, ctx.deadline);
  algorithms::gather_direct(ex, input, output, count * dtype_size(dtype), root);
}

void TcpProcessGroup::run_scatter(OpContext& ctx, const void* input, void* output, size_t count,
                                  DType dtype, int root) {
  Exchange ex(*transport_, ctx.collective_seq, ctx.deadline);
  algorithms::scatter_direct(ex, input, output, count * dtype_size(dtype), root);
}

void TcpProcessGroup::run_all_to_all(OpContext& ctx, const void* input, void* output, size_t count,
                                     DType dtype) {
  Exchange ex(*transport_, ctx.collective_seq, ctx.deadline);
  algorithms::all_to_all_pairwise(ex, input, output, count * dtype_size(dtype));
}

void TcpProcessGroup::run_all_to_all_v(OpContext& ctx, const void* input,
                                       const std::vector<size_t>& send_counts, void* output,
                                       const std::vector<size_t>& recv_counts, DType dtype) {
  Exchange ex(*transport_, ctx.collective_seq, ctx.deadline);
  const size_t es = dtype_size(dtype);
  std::vector<size_t> send_bytes(send_counts), recv_bytes(recv_counts);
  for (size_t& b : send_bytes) b *= es;
  for (size_t& b : recv_bytes) b *= es;
  algorithms::all_to_all_v_pairwise(ex, input, send_bytes, output, recv_bytes);
}

void TcpProcessGroup::run_barrier(OpContext& ctx) {
  Exchange ex(*transport_, ctx.collective_seq, ctx.deadline);
  algorithms::barrier_dissemination(ex);
}

}  // namespace meshtrain::comm
