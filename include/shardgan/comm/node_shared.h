#pragma once
/// Node-shared buffers for the stage-3 all-gather without a copy, for ranks on one host
/// (`sharding.<model>.node_shared_gather`). A unit's gathered flat parameter is placed in a
/// slot of a pool that every rank maps: each rank writes its own block there and publishes
/// it, and all ranks compute from the same pages once every block is published. No byte
/// moves between processes, and the node holds one gathered copy instead of one per rank.
///
/// Layout: one POSIX shared-memory object per pool (created by rank 0, opened by the others
/// and unlinked once all have mapped it, so a crash leaves nothing behind): a control area
/// (per slot and rank, the last gather published and the last released, as lock-free
/// atomics) and `slots` slots of `slot_bytes`. The slots are kept (as a caching allocator
/// keeps blocks): freeing and refaulting shared pages at every gather costs more system time
/// than the copy it saves (measured: 1.46M minor faults per step of the 1e9 BigGAN).
///
/// Ordering (the contract the sharded units keep): gathers of a model are numbered 1, 2, ...
/// in the order every rank starts them (collectives start in the same order on all ranks);
/// gather q uses slot q % slots once every rank has released gather q - slots there. A
/// rank's block keeps its values until that rank's next optimizer step, which needs every
/// other rank's gradients of the unit and so comes after they stopped reading it.
#include <cstdint>
#include <functional>
#include <string>

namespace shardgan {

class Communicator;

/// Collective (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED, factory.h's
/// local_rank_and_size): whether every rank of `comm` can share memory with this one. False,
/// without communicating, for a communicator that is not an MpiCommunicator.
bool ranks_share_node(Communicator& comm);

class NodeSharedPool {
 public:
  /// Collective over `comm` (a broadcast and an all-reduce): maps `slots` (1-16) slots of
  /// `slot_bytes` (> 0) on every rank. `name` names the pool in errors. Throws
  /// std::runtime_error naming /dev/shm and `name` on every rank if any rank cannot create,
  /// size or map it, std::invalid_argument for more than 64 ranks or a bad size.
  NodeSharedPool(Communicator& comm, int slots, int64_t slot_bytes, std::string name);
  ~NodeSharedPool();
  NodeSharedPool(const NodeSharedPool&) = delete;
  NodeSharedPool& operator=(const NodeSharedPool&) = delete;

  int slots() const { return slots_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  /// Slot of gather `seq` (>= 1): seq % slots.
  int slot_of(int64_t seq) const { return static_cast<int>(seq % slots_); }
  /// The slot's data: slot_bytes bytes, 4096-aligned, the same pages on every rank.
  void* data(int slot) const;

  /// Whether this rank itself still holds gather seq - slots in seq's slot (then gather seq
  /// cannot use the pool: it would wait for itself). Local.
  bool held_here(int64_t seq) const;
  /// Blocks until every rank has released gather seq - slots from seq's slot. Throws
  /// CollectiveTimeout (communicator.h) after `timeout_s`, naming the pool and the ranks.
  /// `progress` runs now and then while waiting (the MPI progress engine: a rank spinning
  /// here must still serve the point-to-point traffic the others wait for).
  void wait_free(int64_t seq, double timeout_s, const std::function<void()>& progress) const;
  /// Local: this rank's block of gather `seq` is written (release store).
  void publish(int64_t seq);
  /// Blocks until every rank has published gather `seq`; throws as wait_free.
  void wait_published(int64_t seq, double timeout_s, const std::function<void()>& progress) const;
  /// Local: this rank no longer reads gather `seq`.
  void release(int64_t seq);

 private:
  struct Control;
  Control* ctl_ = nullptr;
  void* map_ = nullptr;
  char* data_ = nullptr;
  int slots_ = 0;
  int64_t slot_bytes_ = 0, map_bytes_ = 0;
  int rank_ = 0, world_ = 1;
  std::string name_;
  void wait_until(const char* what, int64_t seq, int64_t want, bool released, double timeout_s,
                  const std::function<void()>& progress) const;
};

}  // namespace shardgan
