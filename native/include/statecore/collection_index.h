// The members of every collection of a state whose collections are stored one entry per member:
// map state, whose user keys are entries `prefix | ser(user key)` of the state's table (Flink
// RocksDBMapState's layout, docs/formats.md "Map state"), `prefix` being the encoded key of the
// map's (key, namespace). The table answers a lookup of one member in O(1); this index answers
// what the table cannot without a scan: the members of one collection, in insertion order (a
// member inserted again while present keeps its place, one erased and inserted again goes last),
// their count, and clearing a collection. It lives beside the table in memory only: snapshots
// and checkpoints hold the entries, and a restore inserts the loaded entries here (in key order).
//
// Layout. The common state holds many tiny maps (100k keys x 16 user keys), so the design keeps
// one allocation per collection and none per member (node-based hash maps cost ~72 bytes and two
// allocations per member), and touches two cache lines to find a collection:
//  - Per key group an open-addressing table (linear probing, power-of-two capacity, load <= 3/4,
//    backward-shift deletion, no tombstones) of 16-byte slots {prefix hash, collection pointer}:
//    a probe reads a collection only when the hashes agree.
//  - A collection is one malloc'd block: a 40-byte header (sizes, counts, prefix hash, member
//    table), the prefix bytes stored once, then one record per member in insertion order,
//    `varint(size << 1 | erased) | bytes`. Erasing a member sets its erased bit (lazy removal);
//    when the erased records outnumber the live ones they are compacted out in place (and a
//    block far larger than its bytes shrunk), so iteration stays O(live members) amortised.
//    The block grows by 1.5x (realloc), its slot repointed when it moves.
//  - Up to kSmallMembers live members a lookup scans the records (at most 2 * kSmallMembers + 1
//    of them, by the compaction rule): for 8-byte user keys a few cache lines, cheaper than
//    hashing. Beyond that the collection is promoted to an open-addressing member table (same
//    probing) of {member hash, record offset + 1} over its live members, rebuilt when a
//    compaction moves the records and dropped when a compaction leaves kSmallMembers or fewer.
//  - Hashes are the state map's key hash (StateMap::hash under the same KeyHashFunction), so a
//    batch kernel that hashed the prefix for the table passes that hash (insert_hashed).
// Trade-offs: small collections compare members by their bytes, never by a stored hash (short
// user keys make that the cheaper test); a promoted collection rehashes its members on a
// compaction rather than storing a hash per record; a lookup of a collection's prefix always
// reads the collection's block, which the following member scan reads anyway.
//
// Invariants (check_invariants(), run by native/tests/test_collection_index.cpp):
//  I1 a group's slot table holds exactly one slot per collection, found by its prefix;
//  I2 every collection record has live >= 1 (an emptied collection is dropped at once);
//  I3 dead <= live after every public call (compaction), so a scan visits <= 2 * live + 1;
//  I4 a promoted collection's member table holds one slot per live member, none for erased ones.
// Every operation is O(1) amortised (expected, under a hash that spreads keys), for_each O(live).
// Single-threaded: the owner of the table (the thread contract of state_map.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "statecore/key_codec.h"
#include "statecore/state_map.h"
#include "statecore/state_table.h"

namespace statecore {

class CollectionIndex {
 public:
  // Members a collection lists before it is promoted to a member table.
  static constexpr uint32_t kSmallMembers = 16;

  // Key groups [kg_start, kg_end] (0 <= kg_start <= kg_end < 32768); std::invalid_argument
  // otherwise. `hash`: as StateMap's (nullptr: detail::default_key_hash; an injected one is
  // passed through fmix32), used for prefixes and for the members of promoted collections.
  CollectionIndex(int32_t kg_start, int32_t kg_end, KeyHashFunction hash = nullptr);
  ~CollectionIndex();
  CollectionIndex(const CollectionIndex&) = delete;
  CollectionIndex& operator=(const CollectionIndex&) = delete;

  // The hash function given at construction, and the hash of `size` bytes under it (what
  // StateMap::hash returns for a map of the same function): the *_hashed calls take it.
  KeyHashFunction hash_function() const { return hash_fn_; }
  uint32_t hash(const uint8_t* data, size_t size) const;

  // `member` of the collection `prefix` of key group `kg` has an entry: appended when it is not
  // listed (returns true), kept in place when it is (false). std::out_of_range for a key group
  // outside the range, std::invalid_argument for null bytes of a non-zero size,
  // std::length_error past 2^31 bytes of a member or 2^32 - 1 bytes of a collection.
  bool insert(int32_t kg, const uint8_t* prefix, size_t prefix_size, const uint8_t* member,
              size_t member_size);
  // insert with prefix_hash = hash(prefix, prefix_size) computed by the caller.
  bool insert_hashed(int32_t kg, uint32_t prefix_hash, const uint8_t* prefix, size_t prefix_size,
                     const uint8_t* member, size_t member_size);
  // `member` has no entry any more: unlisted (returns whether it was listed).
  bool erase(int32_t kg, const uint8_t* prefix, size_t prefix_size, const uint8_t* member,
             size_t member_size);
  bool erase_hashed(int32_t kg, uint32_t prefix_hash, const uint8_t* prefix, size_t prefix_size,
                    const uint8_t* member, size_t member_size);
  bool contains(int32_t kg, const uint8_t* prefix, size_t prefix_size, const uint8_t* member,
                size_t member_size) const;
  // Prefetching for a batch kernel that runs a group of rows ahead: prefetch() requests the
  // group-table slot where a lookup of the collection with prefix hash `prefix_hash` in key group
  // `kg` starts; prefetch_collection(), once that slot has arrived, reads the slots (at most
  // kPrefetchProbes of them) and requests the first cache lines of the collection whose hash
  // agrees: its header, prefix and first records, which an insert reads and appends to. Both
  // change nothing and do nothing for a key group outside the range. Always inlined: GCC deletes
  // a call to an outlined function whose only effect is a prefetch (map_impl.h Impl::prefetch).
  [[gnu::always_inline]] void prefetch(int32_t kg, uint32_t prefix_hash) const {
    const Group* g = group_if(kg);
    if (g == nullptr || g->slots.empty()) return;
    __builtin_prefetch(&g->slots[prefix_hash & (g->slots.size() - 1)], 0, 3);
  }
  [[gnu::always_inline]] void prefetch_collection(int32_t kg, uint32_t prefix_hash) const {
    const Group* g = group_if(kg);
    if (g == nullptr || g->slots.empty()) return;
    const size_t mask = g->slots.size() - 1;
    size_t i = prefix_hash & mask;
    for (int probe = 0; probe < kPrefetchProbes; ++probe, i = (i + 1) & mask) {
      const GroupSlot& s = g->slots[i];
      if (!s.used()) return;
      if (s.hash == prefix_hash) {
        const char* c = reinterpret_cast<const char*>(s.coll);
        __builtin_prefetch(c, 1, 3);
        __builtin_prefetch(c + 64, 1, 3);
        __builtin_prefetch(c + 128, 1, 3);
        return;
      }
    }
  }

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
  // Checks invariants I1-I4 over every key group (O(size of the index), for tests):
  // std::logic_error naming the first one violated.
  void check_invariants() const;

  // Bytes held: the capacity of every table, record vector and buffer (allocator headers not
  // counted).
  size_t bytes() const;

 private:
  // A member table slot (ref 0: free).
  struct Slot {
    uint32_t hash;
    uint32_t ref;  // record offset in data() + 1
    bool used() const { return ref != 0; }
  };
  // A collection: this header, then its bytes `prefix | member records`, in one malloc'd block.
  struct Coll {
    uint32_t used;  // bytes of data() in use
    uint32_t cap;   // bytes of data() allocated
    uint32_t prefix_size;
    uint32_t hash;  // of the prefix
    uint32_t live;  // listed members
    uint32_t dead;  // erased records still in data()
    Slot* table;    // member table of a promoted collection, else nullptr
    uint32_t mask;  // its capacity - 1
    uint8_t* data() { return reinterpret_cast<uint8_t*>(this + 1); }
    const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(this + 1); }
  };
  // A group table slot (coll nullptr: free): the hash beside the pointer, so a probe reads
  // a collection only when the hashes agree.
  struct GroupSlot {
    uint32_t hash;
    Coll* coll;
    bool used() const { return coll != nullptr; }
  };
  struct Group {
    std::vector<GroupSlot> slots;  // empty, or a power-of-two capacity
    size_t count = 0;              // collections
  };
  // A record's header: varint(size << 1 | erased); returns size, *header its byte count.
  static uint32_t read_record(const uint8_t* p, size_t* header, bool* erased) {
    uint64_t v = 0;
    size_t i = 0;
    for (int shift = 0;; shift += 7) {
      const uint8_t byte = p[i++];
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (byte < 0x80) break;
    }
    *header = i;
    *erased = (v & 1) != 0;
    return static_cast<uint32_t>(v >> 1);
  }

  // Group slots prefetch_collection() reads before it gives up (linear probing at load <= 3/4
  // finds nearly every collection within a few).
  static constexpr int kPrefetchProbes = 4;

  Group& group(int32_t kg);
  const Group& group(int32_t kg) const;
  // Key group kg's group, or nullptr outside the range (for the prefetches, which never throw).
  const Group* group_if(int32_t kg) const {
    if (kg < kg_start_ || kg > kg_end_) return nullptr;
    return &groups_[static_cast<size_t>(kg - kg_start_)];
  }
  // The slot of the collection `prefix` in g, or UINT32_MAX.
  uint32_t find_slot(const Group& g, uint32_t h, const uint8_t* prefix, size_t ps) const;
  const Coll* find_coll(const Group& g, uint32_t h, const uint8_t* prefix, size_t ps) const;
  // Offset of the live record of `member` in c's data(), or UINT32_MAX.
  uint32_t find_member(const Coll& c, const uint8_t* member, size_t ms) const;
  // The slot of `c` in g (which holds it).
  static uint32_t slot_of(const Group& g, const Coll* c);
  void drop_coll(Group& g, uint32_t slot);
  void erase_record(Coll& c, uint32_t off);
  // Compacts the collection of g's slot `slot` (its block may move).
  void compact(Group& g, uint32_t slot);
  void rebuild_table(Coll& c);
  static void free_coll(Coll* c);
  template <bool kInsert>
  void apply_entry_keys(const uint8_t* data, const int32_t* off, int64_t n, const KeySchema& key,
                        NamespaceType namespace_type, int32_t max_parallelism);

  int32_t kg_start_;
  int32_t kg_end_;
  KeyHashFunction hash_fn_;
  std::vector<Group> groups_;  // index kg - kg_start
};

template <class Fn>
void CollectionIndex::for_each(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                               Fn&& fn) const {
  const Coll* c = find_coll(group(kg), hash(prefix, prefix_size), prefix, prefix_size);
  if (c == nullptr) return;
  const uint8_t* d = c->data();
  for (size_t at = c->prefix_size; at < c->used;) {
    size_t hs = 0;
    bool erased = false;
    const uint32_t n = read_record(d + at, &hs, &erased);
    if (!erased) fn(d + at + hs, static_cast<size_t>(n));
    at += hs + n;
  }
}

}  // namespace statecore
