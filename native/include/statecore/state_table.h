// One keyed state of a backend: one StateMap per key group of the backend's key-group range
// (after Flink's CopyOnWriteStateTable, which keeps one CopyOnWriteStateMap per key group so that
// a snapshot can be written key group by key group and a rescale reads only the key groups it
// needs).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "statecore/state_map.h"

namespace statecore {

// Snapshot of a StateTable: one MapSnapshot per key group of [kg_start, kg_end], all taken in the
// same synchronous step. Released key group by key group (e.g. after a key group is serialized)
// through map(kg)->release(), or all at once through release(). Thread contract as MapSnapshot:
// may be read and released from one other thread while the owner keeps writing the table.
class TableSnapshot {
 public:
  TableSnapshot(int32_t kg_start, int32_t kg_end, std::vector<std::shared_ptr<MapSnapshot>> maps);
  int32_t kg_start() const { return kg_start_; }
  int32_t kg_end() const { return kg_end_; }
  // The snapshot of key group `kg`; std::out_of_range (naming the key group and the range) when
  // kg is outside [kg_start, kg_end].
  const std::shared_ptr<MapSnapshot>& map(int32_t kg) const;
  // Entries over all key groups as of snapshot time.
  size_t size() const;
  // Table version of this snapshot (every key group's map snapshot has it) and the table's
  // change-tracking base at snapshot time (the oldest base map(kg)->sorted_changes accepts).
  uint64_t version() const { return version_; }
  uint64_t base_version() const { return base_; }
  // Releases every key group's snapshot; idempotent.
  void release();

 private:
  friend class StateTable;
  int32_t kg_start_;
  int32_t kg_end_;
  std::vector<std::shared_ptr<MapSnapshot>> maps_;  // index kg - kg_start
  uint64_t version_ = 0;
  uint64_t base_ = 0;
};

// Versions: the maps of a table move in lockstep -- created together at version 0, snapshotted
// together (snapshot()) and rebased together (rebase()) -- so one table version names the same
// moment in every key group, and a table-level base (mark_base) applies to every map. Callers
// must not call snapshot()/rebase()/mark_base() on single maps of a table.
class StateTable {
 public:
  // Key groups are 0 <= kg_start <= kg_end < 32768 (Flink's upper bound for max parallelism,
  // KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM); std::invalid_argument otherwise.
  // `h` is passed to every StateMap (nullptr: the map's default key hash).
  StateTable(int32_t kg_start, int32_t kg_end, KeyHashFunction h = nullptr);

  int32_t kg_start() const { return kg_start_; }
  int32_t kg_end() const { return kg_end_; }
  // The map of key group `kg`; std::out_of_range (naming the key group and the range) outside.
  StateMap& map(int32_t kg);
  const StateMap& map(int32_t kg) const;
  // map(kg) without the range check, for kernels whose key groups were validated.
  StateMap& map_unchecked(int32_t kg) { return *maps_[static_cast<size_t>(kg - kg_start_)]; }
  // Live entries / key+value bytes over all key groups.
  size_t size() const;
  size_t bytes() const;
  // One O(1) map snapshot per key group: O(number of key groups), never O(entries).
  TableSnapshot snapshot();

  // Change tracking over every key group (StateMap "Change tracking").
  uint64_t version() const;
  uint64_t base_version() const;
  // The snapshot of table version `version` was checkpointed: std::invalid_argument when it is
  // newer than version(); no-op when not newer than base_version().
  void mark_base(uint64_t version);
  // After bulk-loading (restore; applied_changes: a catch-up's change set, see
  // StateMap::rebase): the contents become the base of every key group. Returns it.
  uint64_t rebase(bool applied_changes = false);
  // Removal-log records over all key groups.
  size_t removal_log_size() const;
  // Tiered mode: StateMap::evict_clean over the key groups, from the table's clock hand (a key
  // group and each map's bucket cursor), until bytes() <= target_bytes or no clean entry is
  // left. Each call starts at the key group after the one the previous call ended in, so the
  // evictions go round the key groups. Entries touched in the last epoch go last: a first
  // round over the key groups spares them (StateMap::evict_clean `spare_recent`). Returns the
  // entries removed.
  size_t evict_clean(size_t target_bytes);

 private:
  size_t index_of(int32_t kg) const;
  int32_t kg_start_;
  int32_t kg_end_;
  std::vector<std::unique_ptr<StateMap>> maps_;  // index kg - kg_start
  std::vector<uint64_t> evict_cursors_;          // evict_clean's bucket hand per map
  size_t evict_map_ = 0;                         // evict_clean's next map
};

}  // namespace statecore
