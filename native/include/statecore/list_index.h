// The chunks of every list of a list state. A list is stored as a sequence of chunks, each one
// entry `prefix | seq` -> up to kListChunkElements elements in the list-blob layout
// (docs/formats.md "List state"; list_chunks.h reads and writes them), `prefix` the encoded key
// of the list's (key, namespace), `seq` the chunk's sequence number, 8 bytes big-endian, so the
// table's key order is list order. The table answers a lookup of one chunk in O(1); this index
// answers what it cannot without a scan: the sequence numbers of a list's chunks in order and
// the last one (where an append goes), and clearing a list. It lives beside the table in memory
// only: snapshots and checkpoints hold the entries, and a restore lists the loaded entries here.
//
// A list whose chunks are at most chunk 0 is not listed (the common small list costs the index
// nothing): an unlisted list is chunk 0 or nothing. A list is listed once it has a chunk other
// than 0, and then with every chunk it may have (chunk 0 is listed with it when it was not
// known to be absent; a reader unlists a listed chunk it finds without an entry); a list whose
// listed chunks drop to chunk 0 alone is unlisted again.
//
// Per key group a hash map prefix -> list; a list keeps its sequence numbers ascending in a
// vector with a parallel erased mark (an erase finds its slot by binary search and marks it:
// lazy removal; erased slots at the end are popped, so the last slot is live), compacted when
// the erased slots outnumber the live ones, so iteration stays O(live chunks) amortised.
// Single-threaded: the owner of the table (the thread contract of state_map.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "statecore/state_table.h"

namespace statecore {

// Bytes of a sequence number at the end of a list chunk's entry key.
constexpr size_t kListSeqBytes = 8;

class ListIndex {
 public:
  // Key groups [kg_start, kg_end] (0 <= kg_start <= kg_end < 32768); std::invalid_argument
  // otherwise.
  ListIndex(int32_t kg_start, int32_t kg_end);

  // Whether list `prefix` of key group `kg` is listed (it has, or may have, a chunk other than
  // 0); if so *last = its last listed chunk, where an append goes. std::out_of_range for a key
  // group outside the range.
  bool last(int32_t kg, const uint8_t* prefix, size_t prefix_size, uint64_t* last) const;
  // Chunk `seq` of list `prefix` has an entry (an append that started it, a restore, a change
  // set): listed in sequence order (returns whether it was new). Chunk 0 of an unlisted list
  // changes nothing (false); another chunk of an unlisted list lists chunk 0 with it.
  // std::length_error for seq 2^64 - 1 (no next chunk).
  bool insert(int32_t kg, const uint8_t* prefix, size_t prefix_size, uint64_t seq);
  // Chunk `seq` has no entry any more: unlisted (returns whether it was listed); a list left
  // with chunk 0 alone is unlisted.
  bool erase(int32_t kg, const uint8_t* prefix, size_t prefix_size, uint64_t seq);
  // Listed chunks of a list (0 when it is unlisted).
  size_t size(int32_t kg, const uint8_t* prefix, size_t prefix_size) const;
  // fn(uint64_t seq) for each listed chunk, in list order. fn must not change this index.
  template <class Fn>
  void for_each(int32_t kg, const uint8_t* prefix, size_t prefix_size, Fn&& fn) const;
  // The sequence numbers of a list's listed chunks in order (empty when unlisted).
  std::vector<uint64_t> seqs(int32_t kg, const uint8_t* prefix, size_t prefix_size) const;
  // The chunks a reader looks up, in order, into `out` (cleared first): the listed ones, or
  // chunk 0 for an unlisted list.
  void chunks(int32_t kg, const uint8_t* prefix, size_t prefix_size,
              std::vector<uint64_t>& out) const;
  // chunks() with the list dropped (a clear of it).
  std::vector<uint64_t> take(int32_t kg, const uint8_t* prefix, size_t prefix_size);
  // Drops every list of every key group.
  void clear();

  // Entry keys `keys` (`n` keys, key i at data[off[i], off[i + 1])) are listed (insert) or
  // unlisted (erase): each is `prefix | seq`, its key group read from its first `prefix_width`
  // bytes (1 or 2, big-endian). Every key is checked before the first change:
  // std::invalid_argument (nothing changed) for a key not longer than prefix_width + 8 bytes,
  // std::out_of_range for a key group outside the range.
  void insert_entry_keys(const uint8_t* data, const int32_t* off, int64_t n, int prefix_width);
  void erase_entry_keys(const uint8_t* data, const int32_t* off, int64_t n, int prefix_width);
  // erase_entry_keys over encoded entry keys held as strings (what a TTL cleanup step removed);
  // keys that are no list chunk's are skipped.
  void erase_entry_keys(const std::vector<std::string>& keys, int prefix_width);
  // Unlists every chunk whose entry the table no longer holds (after a pass that removed
  // entries without telling the index: a TTL migration). Returns the chunks unlisted.
  size_t prune(StateTable& table);

  // Listed lists and their listed chunks over all key groups.
  size_t lists() const;
  size_t chunks() const;
  // Bytes held, estimated: prefixes, hash nodes and buckets, sequence and mark vectors.
  size_t bytes() const;

 private:
  struct List {
    std::vector<uint64_t> seqs;  // ascending, erased ones included
    std::vector<bool> erased;    // parallel to seqs
    size_t dead = 0;             // erased slots
    size_t live() const { return seqs.size() - dead; }
  };
  using Group = std::unordered_map<std::string, List>;
  Group& group(int32_t kg);
  const Group& group(int32_t kg) const;
  const List* find(int32_t kg, const uint8_t* prefix, size_t prefix_size) const;
  static void compact(List& l);
  static bool erase_in(List& l, uint64_t seq);
  static void settle(List& l);
  template <bool kInsert>
  void apply_entry_keys(const uint8_t* data, const int32_t* off, int64_t n, int prefix_width);

  int32_t kg_start_;
  int32_t kg_end_;
  std::vector<Group> groups_;  // index kg - kg_start
};

template <class Fn>
void ListIndex::for_each(int32_t kg, const uint8_t* prefix, size_t prefix_size, Fn&& fn) const {
  const List* l = find(kg, prefix, prefix_size);
  if (l == nullptr) return;
  for (size_t i = 0; i < l->seqs.size(); ++i)
    if (!l->erased[i]) fn(l->seqs[i]);
}

// The 8 big-endian bytes of `seq` at `out`, and back.
inline void store_list_seq(uint8_t* out, uint64_t seq) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<uint8_t>(seq);
    seq >>= 8;
  }
}
inline uint64_t load_list_seq(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

}  // namespace statecore
