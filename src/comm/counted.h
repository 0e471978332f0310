#pragma once
// Traffic counting of a communicator that forwards some collectives to another one (private
// to src/comm): HybridCommunicator's shard and replica groups, NcclCommunicator's host
// communicator for CPU tensors.
#include <type_traits>

#include "shardgan/comm/communicator.h"

namespace shardgan::detail {

// stats += after - before, field by field.
inline void add_delta(CommStats& stats, const CommStats& before, const CommStats& after) {
  stats.all_gather_calls += after.all_gather_calls - before.all_gather_calls;
  stats.reduce_scatter_calls += after.reduce_scatter_calls - before.reduce_scatter_calls;
  stats.all_reduce_calls += after.all_reduce_calls - before.all_reduce_calls;
  stats.broadcast_calls += after.broadcast_calls - before.broadcast_calls;
  stats.barrier_calls += after.barrier_calls - before.barrier_calls;
  stats.all_gather_bytes += after.all_gather_bytes - before.all_gather_bytes;
  stats.reduce_scatter_bytes += after.reduce_scatter_bytes - before.reduce_scatter_bytes;
  stats.all_reduce_bytes += after.all_reduce_bytes - before.all_reduce_bytes;
  stats.broadcast_bytes += after.broadcast_bytes - before.broadcast_bytes;
  stats.all_to_all_calls += after.all_to_all_calls - before.all_to_all_calls;
  stats.all_to_all_bytes += after.all_to_all_bytes - before.all_to_all_bytes;
}

// Runs `call` (a collective on `group`) and adds the traffic it counted there to `stats`.
template <class Call>
auto counted(CommStats& stats, Communicator& group, Call&& call) {
  const CommStats before = group.stats();
  if constexpr (std::is_void_v<decltype(call())>) {
    call();
    add_delta(stats, before, group.stats());
  } else {
    auto r = call();
    add_delta(stats, before, group.stats());
    return r;
  }
}

}  // namespace shardgan::detail
