#include "statecore/state_table.h"

#include <stdexcept>
#include <string>

namespace statecore {

namespace {

constexpr int32_t kMaxKeyGroups = 32768;  // Flink UPPER_BOUND_MAX_PARALLELISM

[[noreturn]] void throw_out_of_range(int32_t kg, int32_t start, int32_t end) {
  throw std::out_of_range("key group " + std::to_string(kg) + " is outside the key-group range [" +
                          std::to_string(start) + ", " + std::to_string(end) + "]");
}

}  // namespace

TableSnapshot::TableSnapshot(int32_t kg_start, int32_t kg_end,
                             std::vector<std::shared_ptr<MapSnapshot>> maps)
    : kg_start_(kg_start), kg_end_(kg_end), maps_(std::move(maps)) {
  if (kg_end < kg_start || maps_.size() != static_cast<size_t>(kg_end - kg_start) + 1) {
    throw std::invalid_argument("TableSnapshot: need one map snapshot per key group of [" +
                                std::to_string(kg_start) + ", " + std::to_string(kg_end) + "]");
  }
}

const std::shared_ptr<MapSnapshot>& TableSnapshot::map(int32_t kg) const {
  if (kg < kg_start_ || kg > kg_end_) throw_out_of_range(kg, kg_start_, kg_end_);
  return maps_[static_cast<size_t>(kg - kg_start_)];
}

size_t TableSnapshot::size() const {
  size_t n = 0;
  for (const auto& m : maps_) n += m->size();
  return n;
}

void TableSnapshot::release() {
  for (const auto& m : maps_) m->release();
}

StateTable::StateTable(int32_t kg_start, int32_t kg_end, KeyHashFunction h)
    : kg_start_(kg_start), kg_end_(kg_end) {
  if (kg_start < 0 || kg_end < kg_start || kg_end >= kMaxKeyGroups) {
    throw std::invalid_argument("StateTable: invalid key-group range [" + std::to_string(kg_start) +
                                ", " + std::to_string(kg_end) + "] (need 0 <= start <= end < " +
                                std::to_string(kMaxKeyGroups) + ")");
  }
  maps_.reserve(static_cast<size_t>(kg_end - kg_start) + 1);
  for (int32_t kg = kg_start; kg <= kg_end; ++kg) maps_.push_back(std::make_unique<StateMap>(h));
}

uint64_t StateTable::version() const { return maps_.front()->version(); }
uint64_t StateTable::base_version() const { return maps_.front()->base_version(); }

void StateTable::mark_base(uint64_t version) {
  if (version > this->version()) {
    throw std::invalid_argument("StateTable::mark_base: version " + std::to_string(version) +
                                " is newer than the table version " +
                                std::to_string(this->version()));
  }
  for (const auto& m : maps_) m->mark_base(version);
}

uint64_t StateTable::rebase(bool applied_changes) {
  uint64_t b = 0;
  for (const auto& m : maps_) b = m->rebase(applied_changes);
  return b;
}

size_t StateTable::removal_log_size() const {
  size_t n = 0;
  for (const auto& m : maps_) n += m->removal_log_size();
  return n;
}

size_t StateTable::evict_clean(size_t target_bytes) {
  size_t total = bytes();
  if (total <= target_bytes) return 0;
  if (evict_cursors_.size() != maps_.size()) evict_cursors_.assign(maps_.size(), 0);
  size_t evicted = 0;
  const size_t n = maps_.size();
  // First round: entries not touched in the last epoch, from every key group; then any clean.
  for (const bool spare_recent : {true, false}) {
    const size_t start = evict_map_;
    for (size_t i = 0; i < n && total > target_bytes; ++i) {
      const size_t at = (start + i) % n;
      StateMap& m = *maps_[at];
      const size_t before = m.bytes();
      if (before == 0) continue;
      const size_t excess = total - target_bytes;
      evicted +=
          m.evict_clean(before > excess ? before - excess : 0, &evict_cursors_[at], spare_recent);
      total -= before - m.bytes();
      evict_map_ = (at + 1) % n;
    }
  }
  return evicted;
}

size_t StateTable::index_of(int32_t kg) const {
  if (kg < kg_start_ || kg > kg_end_) throw_out_of_range(kg, kg_start_, kg_end_);
  return static_cast<size_t>(kg - kg_start_);
}

StateMap& StateTable::map(int32_t kg) { return *maps_[index_of(kg)]; }
const StateMap& StateTable::map(int32_t kg) const { return *maps_[index_of(kg)]; }

size_t StateTable::size() const {
  size_t n = 0;
  for (const auto& m : maps_) n += m->size();
  return n;
}

size_t StateTable::bytes() const {
  size_t n = 0;
  for (const auto& m : maps_) n += m->bytes();
  return n;
}

TableSnapshot StateTable::snapshot() {
  std::vector<std::shared_ptr<MapSnapshot>> snaps;
  snaps.reserve(maps_.size());
  const uint64_t base = base_version();
  for (const auto& m : maps_) snaps.push_back(m->snapshot());
  TableSnapshot t(kg_start_, kg_end_, std::move(snaps));
  t.version_ = version();
  t.base_ = base;
  return t;
}

}  // namespace statecore
