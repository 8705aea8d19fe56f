#include "meshtrain/comm/detached_group.h"

#include "meshtrain/util/error.h"

namespace meshtrain::comm {

DetachedGroup::DetachedGroup(int rank, int size, std::string why)
    : ProcessGroup(rank, size), why_(std::move(why)) {
  MT_CHECK(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " is not among ", size);
  options_.name = "detached";
}

void DetachedGroup::refuse(const char* op) const {
  MT_THROW(CommError, op, " among ", why_, ": they never meet (rank ", rank(), " of ", size(), ")");
}

WorkPtr DetachedGroup::all_reduce(void*, size_t, DType, const AllReduceOptions&) {
  refuse("all_reduce");
}
WorkPtr DetachedGroup::broadcast(void*, size_t, DType, const BroadcastOptions&) {
  refuse("broadcast");
}
WorkPtr DetachedGroup::reduce(void*, size_t, DType, const ReduceOptions&) {
  refuse("reduce");
}
WorkPtr DetachedGroup::all_gather(const void*, void*, size_t, DType, const AllGatherOptions&) {
  refuse("all_gather");
}
WorkPtr DetachedGroup::all_gather_v(const void*, void*, std::vector<size_t>, DType,
                                    const AllGatherOptions&) {
  refuse("all_gather_v");
}
WorkPtr DetachedGroup::reduce_scatter(const void*, void*, size_t, DType,
                                      const ReduceScatterOptions&) {
  refuse("reduce_scatter");
}
WorkPtr DetachedGroup::gather(const void*, void*, size_t, DType, const GatherOptions&) {
  refuse("gather");
}
WorkPtr DetachedGroup::scatter(const void*, void*, size_t, DType, const ScatterOptions&) {
  refuse("scatter");
}
WorkPtr DetachedGroup::all_to_all(const void*, void*, size_t, DType, const AllToAllOptions&) {
  refuse("all_to_all");
}
WorkPtr DetachedGroup::all_to_all_v(const void*, const std::vector<size_t>&, void*,
                                    const std::vector<size_t>&, DType, const AllToAllOptions&) {
  refuse("all_to_all_v");
}
std::vector<size_t> DetachedGroup::exchange_counts(const std::vector<size_t>&,
                                                   const AllToAllOptions&) {
  refuse("exchange_counts");
}
WorkPtr DetachedGroup::send(const void*, size_t, DType, int, uint32_t, const SendRecvOptions&) {
  refuse("send");
}
WorkPtr DetachedGroup::recv(void*, size_t, DType, int, uint32_t, const SendRecvOptions&) {
  refuse("recv");
}
WorkPtr DetachedGroup::barrier(const BarrierOptions&) {
  refuse("barrier");
}
std::shared_ptr<ProcessGroup> DetachedGroup::split(const std::vector<int>&) {
  refuse("split");
}

}  // namespace meshtrain::comm
