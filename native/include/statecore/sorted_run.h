// Entries in encoded-key order in flat buffers: what a map snapshot hands to a checkpoint writer
// (MapSnapshot::sorted_entries / sorted_changes) and what the block serializer cuts into blocks.
//
// Why flat copies rather than views into the map's entries: entries are scattered over the heap
// in hash order, so every pass over them in key order misses the cache once per entry. Listing a
// snapshot touches each entry exactly once, in bucket order, copying its bytes into the builder's
// staging buffers; sorting and cutting into blocks then run over compact memory instead of
// chasing key pointers through the heap once per comparison.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace statecore {

struct ByteView {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// memcmp order of byte strings, a proper prefix before its extensions (the order of encoded keys
// in snapshots and checkpoint files).
bool key_less(ByteView a, ByteView b);
bool key_equal(ByteView a, ByteView b);
// <0, 0, >0 as key_less orders a and b (bytes, then length). Keys of one length of 8 to 16
// bytes (an int64 key with its prefix) compare as two big-endian words without a memcmp call:
// neighbours in a sorted run usually share their first 8 bytes, so the call ran to its end.
inline int key_compare(ByteView a, ByteView b) {
  if (a.size == b.size && a.size >= 8 && a.size <= 16) {
    const auto word = [](const uint8_t* p) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      return __builtin_bswap64(w);
    };
    uint64_t x = word(a.data), y = word(b.data);
    if (x == y) {
      x = word(a.data + a.size - 8);
      y = word(b.data + b.size - 8);
    }
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  const size_t n = a.size < b.size ? a.size : b.size;
  const int c = n ? std::memcmp(a.data, b.data, n) : 0;
  if (c != 0) return c;
  return a.size < b.size ? -1 : (a.size > b.size ? 1 : 0);
}

// One listed entry: a key with its value, or a tombstone (`removed`, empty value) of a key
// removed since an incremental snapshot's base.
struct MapChange {
  ByteView key;
  ByteView value;
  bool removed;
};

// n entries: key i = key_data[key_offsets[i], key_offsets[i+1]), likewise values; `valid` is
// empty (no tombstones) or n bytes, 0 = tombstone (whose value is empty). Sorted ascending by
// key_less, keys unique, when produced by SortedRunBuilder::finish.
struct SortedRun {
  std::vector<uint8_t> key_data;
  std::vector<uint64_t> key_offsets{0};
  std::vector<uint8_t> value_data;
  std::vector<uint64_t> value_offsets{0};
  std::vector<uint8_t> valid;

  size_t size() const { return key_offsets.size() - 1; }
  bool empty() const { return size() == 0; }
  ByteView key(size_t i) const {
    return {key_data.data() + key_offsets[i],
            static_cast<size_t>(key_offsets[i + 1] - key_offsets[i])};
  }
  ByteView value(size_t i) const {
    return {value_data.data() + value_offsets[i],
            static_cast<size_t>(value_offsets[i + 1] - value_offsets[i])};
  }
  bool removed(size_t i) const { return !valid.empty() && valid[i] == 0; }
  MapChange operator[](size_t i) const { return {key(i), value(i), removed(i)}; }

  class const_iterator {
   public:
    const_iterator(const SortedRun* run, size_t i) : run_(run), i_(i) {}
    MapChange operator*() const { return (*run_)[i_]; }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const const_iterator& o) const { return i_ != o.i_; }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }

   private:
    const SortedRun* run_;
    size_t i_;
  };
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size()}; }
};

// Collects entries in any order, then sorts them (finish). The sort works on 24-byte slots that
// carry the first 16 key bytes as two big-endian words (an int64 key with its key-group prefix
// and a void namespace fits), so almost every comparison is between integers next to each other
// in memory; the words are sorted by LSD radix over only the bytes that differ between entries
// (a key group's prefix and the high bytes of small integers cost nothing), std::sort when too
// many bytes differ; equal words fall back to comparing the bytes.
// While every entry's key has at most 16 bytes and its value at most 8 (int64 or float64 state
// under an int64 key, an int32 count under a short string), entries are kept whole in 32-byte
// `Small` records -- words, value, sizes -- and sorted as such: nothing is staged and finish
// writes the run in one sequential pass, where a slot's index would send it to staged bytes at
// random. The first
// larger entry stages the records taken so far and the builder goes on as above.
class SortedRunBuilder {
 public:
  void reserve(size_t entries, size_t key_bytes, size_t value_bytes);
  // Inline: a listing calls it for every changed entry of a key group.
  void add(ByteView key, ByteView value, bool removed) {
    uint64_t hi, lo;
    key_words(key.data, key.size, &hi, &lo);
    if (!staged_ && key.size <= 16 && value.size <= 8) {
      Small x{hi, lo, 0, key.size | (uint64_t{value.size} << 8) | (removed ? kRemovedBit : 0)};
      if (value.size != 0) std::memcpy(&x.value, value.data, value.size);  // a tombstone's is null
      small_.push_back(x);
      small_key_bytes_ += key.size;
      small_value_bytes_ += value.size;
      tombstones_ += removed;
      return;
    }
    add_staged(hi, lo, key, value, removed);
  }
  // Key bytes [0, 8) and [8, 16) of `p` (n bytes) as big-endian words, zero padded: a zero pad
  // sorts before every byte value, as a shorter key sorts before its extensions, so distinct
  // words order keys as key_less does.
  static void key_words(const uint8_t* p, size_t n, uint64_t* hi, uint64_t* lo) {
    uint64_t w;
    if (n >= 16) {
      std::memcpy(&w, p, 8);
      *hi = __builtin_bswap64(w);
      std::memcpy(&w, p + 8, 8);
      *lo = __builtin_bswap64(w);
    } else if (n > 8) {  // the last 8 bytes, shifted up past the bytes [n - 8, 8) again
      std::memcpy(&w, p, 8);
      *hi = __builtin_bswap64(w);
      std::memcpy(&w, p + n - 8, 8);
      *lo = __builtin_bswap64(w) << (8 * (16 - n));
    } else {
      w = 0;
      for (size_t i = 0; i < 8; ++i) w = (w << 8) | (i < n ? p[i] : 0u);
      *hi = w;
      *lo = 0;
    }
  }
  // The entries sorted by key_less. With `unique`, an entry whose key equals the previous one's
  // is dropped (callers use it only where equal keys carry equal contents, e.g. a key removed
  // several times). Leaves the builder empty, its buffers allocated for the next run: a writer
  // that lists key group after key group through one builder and one `out` touches no fresh
  // memory after the first (fresh pages cost a fault each, the largest cost of listing a small
  // key group on a VM).
  SortedRun finish(bool unique);
  void finish(bool unique, SortedRun& out);
  void clear();

  // hi, lo: key bytes [0, 8) and [8, 16) big-endian, zero padded; index: the entry's position
  // in the staging buffers, with kRemovedBit set for a tombstone.
  struct Slot {
    uint64_t hi, lo;
    uint64_t index;
  };
  static constexpr uint64_t kRemovedBit = uint64_t{1} << 63;
  // hi, lo as in Slot; value: the value bytes (little-endian load, zero padded); meta: key size
  // (bits 0-7), value size (bits 8-15), kRemovedBit for a tombstone.
  struct Small {
    uint64_t hi, lo;
    uint64_t value;
    uint64_t meta;
  };

 private:
  void add_staged(uint64_t hi, uint64_t lo, ByteView key, ByteView value, bool removed);
  void stage(uint64_t hi, uint64_t lo, ByteView key, ByteView value, bool removed);
  void stage_small();  // moves the Small records to the staging buffers, for good (staged_)
  void finish_small(bool unique, SortedRun& out);

  std::vector<Small> small_;  // the entries while !staged_
  std::vector<Small> small_tmp_;
  uint64_t small_key_bytes_ = 0, small_value_bytes_ = 0;
  bool staged_ = false;  // an entry did not fit a Small record: everything is in the staging
  // Staging: entries in the order added. The data vectors are only grown (their bytes past
  // key_offsets_.back() / value_offsets_.back() are spare room, kept across runs), so adding an
  // entry is two short copies, not two vector inserts.
  std::vector<uint8_t> key_data_;
  std::vector<uint64_t> key_offsets_{0};
  std::vector<uint8_t> value_data_;
  std::vector<uint64_t> value_offsets_{0};
  size_t tombstones_ = 0;
  std::vector<Slot> slots_;
  std::vector<Slot> radix_tmp_;
};

// One sorted run of a key group in Arrow's binary layout (int32 offsets), as a checkpoint reader
// decodes it: key i = key_data[key_offsets[i], key_offsets[i+1]), values likewise; the offset
// pointers already point at the array's first element (Arrow's array offset applied).
// `validity`: null when the run has no tombstones, else the values' Arrow validity bitmap, of
// which bit `validity_bit + i` is entry i (0 = tombstone). key_data_size / value_data_size
// bound the offsets.
struct ArrowBinaryRun {
  const int32_t* key_offsets = nullptr;
  const uint8_t* key_data = nullptr;
  size_t key_data_size = 0;
  const int32_t* value_offsets = nullptr;
  const uint8_t* value_data = nullptr;
  size_t value_data_size = 0;
  const uint8_t* validity = nullptr;
  int64_t validity_bit = 0;
  size_t size = 0;
};

// Index of the first of a run's Arrow binary offsets o[0..n] that is negative, below the one
// before it, or (o[n]) past `data_size` bytes; -1 when they are sound or n == 0. Code that reads
// through offsets from outside (a file, a Python array built from raw buffers) checks them with
// this first.
int64_t first_bad_offset(const int32_t* o, size_t n, size_t data_size);

// Entry `row` of run `run` of a merge_newest_wins input.
struct RunPick {
  uint32_t run;
  uint32_t row;
};

// Newest-wins merge of runs of one key group (a restore or compaction over an incremental chain):
// `runs` newest first, each sorted strictly ascending by key_less. Appends to *out, in key order,
// the newest entry of every key, leaving out keys whose newest entry is a tombstone (kept, as
// that tombstone's pick, with `keep_tombstones`: a change set's deletions). The
// inputs are already sorted, so this is a k-way merge, O(entries * runs) key comparisons for the
// handful of runs a chain holds, instead of sorting their concatenation.
// std::invalid_argument (the input comes from files) when a run's offsets decrease or point
// outside its data, when its keys are not strictly ascending, or beyond 2^32 runs or rows.
void merge_newest_wins(const std::vector<ArrowBinaryRun>& runs, std::vector<RunPick>* out,
                       bool keep_tombstones = false);

}  // namespace statecore
