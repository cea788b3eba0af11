// The members of every collection of a state whose collections are stored one entry per member:
// map state, whose user keys are entries `prefix | ser(user key)` of the state's table (Flink
// RocksDBMapState's layout, docs/formats.md "Map state"), `prefix` being the encoded key of the
// map's (key, namespace). The table answers a lookup of one member in O(1); this index answers
// what the table cannot without a scan: the members of one collection, in insertion order (a
// member inserted again while present keeps its place, one erased and inserted again goes last),
// their count, and clearing a collection. It lives beside the table in memory only: snapshots
// and checkpoints hold the entries, and a restore inserts the loaded entries here (in key order).
//
// Per key group a hash map prefix -> collection; a collection keeps its members in a hash map
// (member -> slot) and a vector of slots in insertion order pointing at the map's keys. Erasing
// a member empties its slot (lazy removal); when the empty slots outnumber the live members the
// vector is compacted, so iteration stays O(live members) amortised. An emptied collection is
// dropped. Single-threaded: the owner of the table (the thread contract of state_map.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "statecore/key_codec.h"
#include "statecore/state_table.h"

namespace statecore {

class CollectionIndex {
 public:
  // Key groups [kg_start, kg_end] (0 <= kg_start <= kg_end < 32768); std::invalid_argument
  // otherwise.
  CollectionIndex(int32_t kg_start, int32_t kg_end);

  // `member` of the collection `prefix` of key group `kg` has an entry: appended when it is not
  // listed (returns true), kept in place when it is (false). std::out_of_range for a key group
  // outside the range.
  bool insert(int32_t kg, const uint8_t* prefix, size_t prefix_size, const uint8_t* member,
              size_t member_size);
  // `member` has no entry any more: unlisted (returns whether it was listed).
  bool erase(int32_t kg, const uint8_t* prefix, size_t prefix_size, const uint8_t* member,
             size_t member_size);
  bool contains(int32_t kg, const uint8_t* prefix, size_t prefix_size, const uint8_t* member,
                size_t member_size) const;
  // Listed members of a collection (0 when it has none).
  size_t size(int32_t kg, const uint8_t* prefix, size_t prefix_size) const;
  // fn(const uint8_t* member, size_t size) for each listed member, in insertion order. fn must
  // not change this index.
  template <class Fn>
  void for_each(int32_t kg, const uint8_t* prefix, size_t prefix_size, Fn&& fn) const;
  // The members of a collection in order (copies).
  std::vector<std::string> members(int32_t kg, const uint8_t* prefix, size_t prefix_size) const;
  // The members of a collection in order, the collection dropped (a clear of it).
  std::vector<std::string> take(int32_t kg, const uint8_t* prefix, size_t prefix_size);
  // Drops every collection of every key group.
  void clear();

  // For a splitter of encoded entry keys: the entries `keys` (`n` keys, key i at data[off[i],
  // off[i + 1])) are listed (insert) or unlisted (erase), each split into prefix and member by
  // encoded_prefix_size over `key`/`namespace_type`/`max_parallelism`, its key group read from
  // its prefix. Every key is split before the first change: std::invalid_argument (nothing
  // changed) for a key that does not split or leaves no member, std::out_of_range for a key
  // group outside the range.
  void insert_entry_keys(const uint8_t* data, const int32_t* off, int64_t n, const KeySchema& key,
                         NamespaceType namespace_type, int32_t max_parallelism);
  void erase_entry_keys(const uint8_t* data, const int32_t* off, int64_t n, const KeySchema& key,
                        NamespaceType namespace_type, int32_t max_parallelism);

  // erase_entry_keys over encoded entry keys held as strings (what a TTL cleanup step removed).
  void erase_entry_keys(const std::vector<std::string>& keys, const KeySchema& key,
                        NamespaceType namespace_type, int32_t max_parallelism);
  // Unlists every member whose entry `prefix | member` the table no longer holds (after a pass
  // that removed entries without telling the index: a TTL migration), keeping the
  // order of the others. Returns the members unlisted. `table` must cover the index's range.
  size_t prune(StateTable& table);

  // Collections and listed members over all key groups.
  size_t collections() const;
  size_t members() const;
  // Bytes held, estimated: members and prefixes, hash nodes and buckets, order slots.
  size_t bytes() const;

 private:
  struct Collection {
    std::unordered_map<std::string, uint32_t> pos;  // member -> its slot in `order`
    std::vector<const std::string*> order;          // insertion order; nullptr = erased
    size_t dead = 0;                                // nullptr slots
  };
  using Group = std::unordered_map<std::string, Collection>;
  Group& group(int32_t kg);
  const Group& group(int32_t kg) const;
  static void compact(Collection& c);
  template <bool kInsert>
  void apply_entry_keys(const uint8_t* data, const int32_t* off, int64_t n, const KeySchema& key,
                        NamespaceType namespace_type, int32_t max_parallelism);

  int32_t kg_start_;
  int32_t kg_end_;
  std::vector<Group> groups_;  // index kg - kg_start
};

template <class Fn>
void CollectionIndex::for_each(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                               Fn&& fn) const {
  const Group& g = group(kg);
  auto it = g.find(std::string(reinterpret_cast<const char*>(prefix), prefix_size));
  if (it == g.end()) return;
  for (const std::string* m : it->second.order)
    if (m != nullptr) fn(reinterpret_cast<const uint8_t*>(m->data()), m->size());
}

}  // namespace statecore
