// Bulk load of encoded entries (design: bulk_load.h).
#include "statecore/bulk_load.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "batch_internal.h"
#include "block_source.h"
#include "statecore/detail/bytes.h"

namespace statecore {

namespace {

using batch_detail::kernel_put;
using batch_detail::Lanes;
using batch_detail::RowKey;

constexpr int64_t kAhead = 16;  // a power of two: ring positions are masked

// Stores an empty value under `key` (hash `h`) in key group `kg`'s map. A lane takes a value
// size of 0 as "any value size", so empty values go around the lanes, through the map.
void put_empty_value(StateMap& m, Lanes& lanes, int32_t kg, uint32_t h, const uint8_t* key,
                     size_t ks) {
  lanes.close(kg);
  size_t cur = 0;
  bool inserted = false;
  m.upsert(h, key, ks, 0, &cur, &inserted);
  if (cur != 0) m.put(key, ks, 0);
}

struct Entries {
  const ArrowBinaryRun& r;
  int pw;

  const uint8_t* key(int64_t i) const { return r.key_data + r.key_offsets[i]; }
  size_t key_size(int64_t i) const {
    return static_cast<size_t>(r.key_offsets[i + 1] - r.key_offsets[i]);
  }
  int32_t kg(int64_t i) const {
    const uint8_t* k = key(i);
    return pw == 1 ? int32_t{k[0]} : (int32_t{k[0]} << 8) | int32_t{k[1]};
  }
  bool removed(int64_t i) const {
    if (r.validity == nullptr) return false;
    const uint64_t bit = static_cast<uint64_t>(r.validity_bit + i);
    return ((r.validity[bit >> 3] >> (bit & 7)) & 1) == 0;
  }
};

}  // namespace

std::string check_entries(const ArrowBinaryRun& run, int32_t kg_lo, int32_t kg_hi, int prefix_bytes,
                          int64_t value_width, bool tombstones) {
  if (prefix_bytes != 1 && prefix_bytes != 2)
    throw std::invalid_argument("prefix_width must be 1 or 2, got " + std::to_string(prefix_bytes));
  const int64_t n = static_cast<int64_t>(run.size);
  const int64_t bad_key = first_bad_offset(run.key_offsets, run.size, run.key_data_size);
  const int64_t bad_value = first_bad_offset(run.value_offsets, run.size, run.value_data_size);
  if (bad_key >= 0 || bad_value >= 0)
    return std::string(bad_key >= 0 ? "keys" : "values") + ": offset " +
           std::to_string(bad_key >= 0 ? bad_key : bad_value) +
           " is negative, below the one before it or past the data buffer";
  const Entries e{run, prefix_bytes};
  const std::string at = "entry ";
  int32_t prev = kg_lo;
  for (int64_t i = 0; i < n; ++i) {
    if (e.key_size(i) <= static_cast<size_t>(prefix_bytes))
      return at + std::to_string(i) + ": its encoded key is not longer than the " +
             std::to_string(prefix_bytes) + "-byte key-group prefix";
    const int32_t kg = e.kg(i);
    if (kg < prev || kg > kg_hi)
      return at + std::to_string(i) + ": key-group prefix " + std::to_string(kg) + " is outside [" +
             std::to_string(kg_lo) + ", " + std::to_string(kg_hi) +
             "] or below the entry before it (entries must be sorted by key group)";
    prev = kg;
    const int64_t vs = run.value_offsets[i + 1] - run.value_offsets[i];
    if (e.removed(i)) {
      if (!tombstones)
        return at + std::to_string(i) + ": a NULL value (tombstone) where values must be non-null";
    } else if (value_width >= 0 && vs != value_width) {
      return at + std::to_string(i) + ": value is " + std::to_string(vs) +
             " bytes, the state's values are " + std::to_string(value_width);
    }
  }
  return "";
}

void load_entries(StateTable& table, const ArrowBinaryRun& run, int prefix_bytes) {
  const std::string bad =
      check_entries(run, table.kg_start(), table.kg_end(), prefix_bytes, -1, true);
  if (!bad.empty()) throw std::invalid_argument(bad);
  const Entries e{run, prefix_bytes};
  const int64_t n = static_cast<int64_t>(run.size);
  if (n == 0) return;
  const KeyHashFunction hash_fn = table.map_unchecked(table.kg_start()).engine().hash_fn;
  Lanes lanes(table);
  uint32_t ahead[kAhead];
  for (int64_t start = 0; start < n;) {
    const int32_t kg = e.kg(start);
    int64_t end = start + 1;
    while (end < n && e.kg(end) == kg) ++end;
    StateMap& m = table.map_unchecked(kg);
    m.reserve(static_cast<size_t>(end - start));  // a no-op unless the map is empty
    m.give_up_write_log();
    auto hash_and_prefetch = [&](int64_t i) {
      const uint32_t h = detail::map_key_hash(hash_fn, e.key(i), e.key_size(i));
      if (!lanes.view().prefetch(kg, h)) m.prefetch_bucket(h);
      return h;
    };
    for (int64_t j = start; j < std::min(end, start + kAhead); ++j)
      ahead[j & (kAhead - 1)] = hash_and_prefetch(j);
    for (int64_t i = start; i < end; ++i) {
      const uint32_t h = ahead[i & (kAhead - 1)];
      if (i + kAhead < end) ahead[(i + kAhead) & (kAhead - 1)] = hash_and_prefetch(i + kAhead);
      const uint8_t* key = e.key(i);
      const size_t ks = e.key_size(i);
      if (e.removed(i)) {
        m.remove(key, ks);
        lanes.close(kg);
        continue;
      }
      const size_t vs = static_cast<size_t>(run.value_offsets[i + 1] - run.value_offsets[i]);
      if (vs == 0) {
        put_empty_value(m, lanes, kg, h, key, ks);
        continue;
      }
      uint8_t* dst = kernel_put(table, lanes, kg, RowKey{key, ks, h}, vs);
      detail::copy_small(dst, run.value_data + run.value_offsets[i], vs);
    }
    start = end;
  }
}

namespace {

// Bytewise order of two keys, shorter first on a common prefix: <0, 0, >0. Eight bytes at a
// time as big-endian words, inline: a memcmp call an entry was a visible share of the check.
int compare_keys(const uint8_t* a, size_t an, const uint8_t* b, size_t bn) {
  const size_t n = std::min(an, bn);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t x = detail::be64(detail::load_u64(a + i));
    const uint64_t y = detail::be64(detail::load_u64(b + i));
    if (x != y) return x < y ? -1 : 1;
  }
  for (; i < n; ++i)
    if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
  return an < bn ? -1 : an > bn ? 1 : 0;
}

// One checked payload (block_codec.h: entries | key offsets | value offsets | keys | values |
// validity), read in place.
struct Payload {
  uint64_t n = 0;
  const uint8_t* ko = nullptr;
  const uint8_t* vo = nullptr;
  const uint8_t* kd = nullptr;
  const uint8_t* vd = nullptr;
  const uint8_t* bits = nullptr;  // nullptr: no tombstones possible

  Payload(const uint8_t* p, bool has_validity) {
    n = detail::load_le32(p);
    ko = p + 4;
    vo = ko + 4 * (n + 1);
    kd = vo + 4 * (n + 1);
    const uint64_t klen = detail::load_le32(ko + 4 * n);
    vd = kd + klen;
    if (has_validity) bits = vd + detail::load_le32(vo + 4 * n);
  }
  uint32_t koff(uint64_t i) const { return detail::load_le32(ko + 4 * i); }
  uint32_t voff(uint64_t i) const { return detail::load_le32(vo + 4 * i); }
  bool removed(uint64_t i) const { return bits != nullptr && !((bits[i >> 3] >> (i & 7)) & 1); }
};

// What is wrong with an entry of a payload: "" for nothing; `corrupt` as BlockLoadResult's.
struct EntryFault {
  std::string why;
  bool corrupt = false;
};

// The entry checks of load_blocks (bulk_load.h) over payload `p` of a block of key group `kg`:
// the first entry that breaks one, or nothing. `*last` (`*last_size` bytes; nullptr: none) is
// the key group's last key before the payload, and becomes the payload's last key (in `p`).
EntryFault check_payload_entries(const Payload& p, int32_t kg, const BlockLoadSpec& spec,
                                 const uint8_t** last, size_t* last_size) {
  const int pw = spec.prefix_bytes;
  const std::string at = "entry ";
  const int64_t n = static_cast<int64_t>(p.n);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t k0 = p.koff(i);
    const size_t ks = p.koff(i + 1) - k0;
    const uint8_t* key = p.kd + k0;
    if (ks <= static_cast<size_t>(pw))
      return {at + std::to_string(i) + ": its encoded key is not longer than the " +
                  std::to_string(pw) + "-byte key-group prefix",
              false};
    if (spec.key_width >= 0 && static_cast<int64_t>(ks) != spec.key_width)
      return {at + std::to_string(i) + ": encoded key is " + std::to_string(ks) + " bytes, not " +
                  std::to_string(spec.key_width),
              false};
    const int32_t ekg = pw == 1 ? int32_t{key[0]} : (int32_t{key[0]} << 8) | int32_t{key[1]};
    if (ekg != kg)
      return {at + std::to_string(i) + ": key-group prefix " + std::to_string(ekg) +
                  " in a block of key group " + std::to_string(kg),
              false};
    if (!p.removed(i) && spec.value_width >= 0 &&
        static_cast<int64_t>(p.voff(i + 1) - p.voff(i)) != spec.value_width)
      return {at + std::to_string(i) + ": value is " + std::to_string(p.voff(i + 1) - p.voff(i)) +
                  " bytes, the state's values are " + std::to_string(spec.value_width),
              false};
    if (*last != nullptr && compare_keys(*last, *last_size, key, ks) >= 0)
      return {at + std::to_string(i) + ": keys are not strictly ascending within key group " +
                  std::to_string(kg),
              true};
    *last = key;
    *last_size = ks;
  }
  return {};
}

// The two big-endian words a key of ks bytes is ordered by after its pw-byte prefix when the
// rest, L = ks - pw bytes, is sizeof(W) to 2 * sizeof(W) long: its first and its last sizeof(W)
// bytes. Keys sharing the prefix are ordered as these pairs are: where the first words are
// equal, so are the bytes the last words share with them, and the last words compare the rest.
template <class W>
[[gnu::always_inline]] inline W ordered_word(const uint8_t* p) {
  W w;
  std::memcpy(&w, p, sizeof(W));
  if constexpr (sizeof(W) == 8) return detail::kBigEndianHost ? w : __builtin_bswap64(w);
  else return detail::kBigEndianHost ? w : __builtin_bswap32(w);
}

template <class W>
bool fixed_keys_ascend(const Payload& p, int32_t kg, int pw, size_t ks, const uint8_t* last) {
  const int64_t n = static_cast<int64_t>(p.n);
  const size_t tail = ks - sizeof(W);
  const uint32_t want = static_cast<uint32_t>(kg);
  const uint8_t* k = p.kd;
  W x0 = 0, x1 = 0;
  int64_t i = 0;
  if (last != nullptr) {
    x0 = ordered_word<W>(last + pw);
    x1 = ordered_word<W>(last + tail);
  } else {  // the first key has nothing to be above
    x0 = ordered_word<W>(k + pw);
    x1 = ordered_word<W>(k + tail);
    if ((pw == 1 ? uint32_t{k[0]} : (uint32_t{k[0]} << 8) | k[1]) != want) return false;
    i = 1;
    k += ks;
  }
  // No branch per entry: the loop only accumulates whether any entry broke a rule.
  bool bad = false;
  for (; i < n; ++i, k += ks) {
    const W y0 = ordered_word<W>(k + pw);
    const W y1 = ordered_word<W>(k + tail);
    const uint32_t pre = pw == 1 ? uint32_t{k[0]} : (uint32_t{k[0]} << 8) | k[1];
    bad |= (pre != want) | !((x0 < y0) | ((x0 == y0) & (x1 < y1)));
    x0 = y0;
    x1 = y1;
  }
  return !bad;
}

// Whether the entries of payload `p` (no validity bitmap) pass the checks
// check_payload_entries makes with key_width ks > pw and value_width vs > 0 (its `last` as
// there, ks bytes), and -- what lets insert_fresh<..., true> address them without their offsets
// -- key i starts at byte i * ks of the keys, value i at i * vs of the values. One pass with no
// branch per entry; false also when the keys' bytes after the prefix are not 4 to 16 bytes, whose
// order it does not compare: the caller then runs check_payload_entries, which names the entry.
bool fixed_entries_ok(const Payload& p, int32_t kg, int pw, size_t ks, size_t vs,
                      const uint8_t* last) {
  const uint64_t n = p.n;
  // Offsets below 2^31 (check_payload), so i * ks <= n * ks = the keys' bytes cannot wrap.
  if (p.koff(n) != n * ks || p.voff(n) != n * vs) return false;
  uint32_t diff = 0;
  for (uint64_t i = 0; i < n; ++i)
    diff |=
        (p.koff(i) ^ static_cast<uint32_t>(i * ks)) | (p.voff(i) ^ static_cast<uint32_t>(i * vs));
  if (diff != 0) return false;
  if (n == 0) return true;
  const size_t rest = ks - static_cast<size_t>(pw);
  if (rest >= 8 && rest <= 16) return fixed_keys_ascend<uint64_t>(p, kg, pw, ks, last);
  if (rest >= 4 && rest < 8) return fixed_keys_ascend<uint32_t>(p, kg, pw, ks, last);
  return false;
}

// Entries hashed and their home slots prefetched a group ahead of the inserts (insert_fresh).
constexpr int64_t kGroup = 16;

// Lays an empty flat map out for keys of ks bytes starting as `key` (the key group's prefix)
// and values of vs bytes, as its first insert would (flat_upsert: a fresh directory of the same
// capacity), and gives it every page of its table now, each owned by it. A load of the oldest
// run into a map pre-sized for it fills every page anyway (at least 3/8 of each page's slots),
// and a page made at the load's first insert into it would take that insert off the lane (the
// general path) and leave the slots hashed ahead of it without a page to prefetch. False,
// having changed nothing, when the map is not flat, not empty, rehashing, or its keys have no
// fixed layout (the general loop then loads it).
bool prepare_fresh(StateMap& map, const uint8_t* key, size_t ks, size_t vs) {
  StateMap::Impl& m = map.engine();
  if (!m.flat || m.frehash != nullptr || m.size() != 0) return false;
  if (!m.fprimary->layout.fixed) {
    detail::FlatLayout nl;
    if (!detail::FlatLayout::make(key, ks, vs, &nl)) return false;
    const size_t cap = m.fprimary->capacity;
    detail::FlatDirectory::unref(m.fprimary);
    m.fprimary = detail::FlatDirectory::make(cap, nl);
  }
  for (size_t i = 0; i < m.fprimary->page_count; ++i)
    if (m.fprimary->pages()[i] == nullptr || m.fprimary->owned()[i] != 1)
      m.flat_slot_for_write_slow(&m.fprimary, i << m.fprimary->page_shift);
  return true;
}

// Inserts the entries of payload `p` into the open, fixed-layout lane `ln` of an empty map that
// prepare_fresh laid out (load_blocks `fresh`: keys unique, of the lane's key size, live values
// of its value size -- the caller checked both), tombstones skipped. Per group of kGroup
// entries: the next group's keys hashed and their home slots found and prefetched, then this
// group's keys stored at the first free slot from their home (no key comparisons) with their
// values. What the lane would check and count a row is checked and counted once a payload: room
// below the load threshold for all of its entries, every page owned, the map's size and live
// bytes (and the epoch's first writes, its log given up) added at the end. W: the lane's key
// word (FlatLane::insert_new); kValue: the value size when known at compile time (0: the
// lane's); kFixed: fixed_entries_ok passed for `p` (key i at i * key size, value i at i * value
// size, no tombstones), so no offset is loaded.
// Returns the first entry not inserted, for the caller's general loop: n when all are, 0 (having
// changed nothing) when the lane cannot take the payload that way, an entry whose probe finds no
// free slot (with room below the threshold checked, only a broken map would have none).
template <class W, size_t kValue, bool kFixed>
int64_t insert_fresh(detail::FlatLane& ln, const Payload& p, KeyHashFunction hash_fn) {
  StateMap::Impl& m = *ln.map;
  const int64_t n = static_cast<int64_t>(p.n);
  if (m.size() + p.n >= m.threshold || m.logs_writes() || m.quiet) return 0;
  for (uint32_t i = 0; i <= ln.page_last; ++i)
    if (ln.owned[i] != 1 || ln.pages[i] == nullptr) return 0;
  const size_t ks = ln.key_size;
  const size_t vs = kValue != 0 ? kValue : ln.value_size;
  const size_t tail = ln.suffix - sizeof(W);  // the key's second word, from byte 1 + tail
  const uint32_t version = ln.version;
  auto key_at = [&](int64_t i) {
    return p.kd + (kFixed ? static_cast<size_t>(i) * ks : p.koff(static_cast<uint64_t>(i)));
  };
  auto value_at = [&](int64_t i) {
    return p.vd + (kFixed ? static_cast<size_t>(i) * vs : p.voff(static_cast<uint64_t>(i)));
  };
  uint32_t hashes[2][kGroup];
  uint8_t* slots[2][kGroup];
  auto stage = [&](int64_t g, int buf) {
    const int64_t e = std::min(n, g + kGroup);
    for (int64_t i = g; i < e; ++i) {
      const uint32_t h = detail::map_key_hash(hash_fn, key_at(i), ks);
      uint8_t* s = ln.home_slot(h);
      ln.prefetch_slot(s);
      hashes[buf][i - g] = h;
      slots[buf][i - g] = s;
    }
  };
  uint64_t added = 0;
  int64_t stop = n;
  stage(0, 0);
  int buf = 0;
  for (int64_t g = 0; g < n && stop == n; g += kGroup, buf ^= 1) {
    if (g + kGroup < n) stage(g + kGroup, buf ^ 1);
    const int64_t e = std::min(n, g + kGroup);
    for (int64_t i = g; i < e; ++i) {
      if (!kFixed && p.removed(i)) continue;
      uint8_t* s = slots[buf][i - g];
      size_t pi = 0;
      const auto no_key = [](const uint8_t*) { return false; };
      if (ln.find_with<0>(s, hashes[buf][i - g], no_key, &s, &pi) < 0) {
        stop = i;
        break;
      }
      const uint8_t* key = key_at(i);
      detail::store_u32(s, version);
      std::memcpy(s + 4, key + 1, sizeof(W));
      std::memcpy(s + 4 + tail, key + 1 + tail, sizeof(W));
      uint8_t* v = s + 4 + ln.suffix;
      if (kValue != 0) std::memcpy(v, value_at(i), kValue);
      else detail::copy_small(v, value_at(i), vs);
      ++added;
    }
  }
  m.primary_size += added;
  m.live_bytes += added * (ks + vs);
  m.epoch_writes += added;
  return stop;
}

// insert_fresh through the lane of key group kg's map opened for `p`'s first key, with the
// word and value size its layout takes: the first entry not inserted (0 when the lane does not
// open or is not of a fixed layout of key size ks).
template <bool kFixed>
int64_t insert_fresh_payload(Lanes& lanes, int32_t kg, const Payload& p, size_t ks, size_t vs,
                             KeyHashFunction hash_fn) {
  detail::FlatLane* ln = lanes.get(kg, p.kd + p.koff(0), ks, vs, true);
  if (ln == nullptr || ln->var || ln->key_size != ks) return 0;
  const bool word = ks >= 9;
  const bool v8 = vs == 8;
  return word ? (v8 ? insert_fresh<uint64_t, 8, kFixed>(*ln, p, hash_fn)
                    : insert_fresh<uint64_t, 0, kFixed>(*ln, p, hash_fn))
              : (v8 ? insert_fresh<uint32_t, 8, kFixed>(*ln, p, hash_fn)
                    : insert_fresh<uint32_t, 0, kFixed>(*ln, p, hash_fn));
}

// Inserts entries [from, n) of payload `p` of key group kg into its map `m` one at a time: the
// general loop of load_blocks (slots prefetched kAhead entries ahead, through the lanes where
// they open). `fresh`: m held none of the key group's keys before the load (see load_blocks).
void insert_entries(StateTable& table, Lanes& lanes, StateMap& m, int32_t kg, const Payload& p,
                    int64_t from, bool fresh, KeyHashFunction hash_fn) {
  const int64_t n = static_cast<int64_t>(p.n);
  uint32_t ahead[kAhead];
  auto hash_and_prefetch = [&](int64_t i) {
    const uint32_t k0 = p.koff(i);
    const uint32_t h = detail::map_key_hash(hash_fn, p.kd + k0, p.koff(i + 1) - k0);
    if (!lanes.view().prefetch(kg, h)) m.prefetch_bucket(h);
    return h;
  };
  for (int64_t j = from; j < std::min<int64_t>(n, from + kAhead); ++j)
    ahead[j & (kAhead - 1)] = hash_and_prefetch(j);
  for (int64_t i = from; i < n; ++i) {
    const uint32_t h = ahead[i & (kAhead - 1)];
    if (i + kAhead < n) ahead[(i + kAhead) & (kAhead - 1)] = hash_and_prefetch(i + kAhead);
    const uint32_t k0 = p.koff(i);
    const uint8_t* key = p.kd + k0;
    const size_t ks = p.koff(i + 1) - k0;
    if (p.removed(i)) {
      if (!fresh) {
        m.remove(key, ks);
        lanes.close(kg);
      }
      continue;
    }
    const uint32_t v0 = p.voff(i);
    const size_t vs = p.voff(i + 1) - v0;
    if (vs == 0) {
      put_empty_value(m, lanes, kg, h, key, ks);
      continue;
    }
    uint8_t* dst = nullptr;
    if (fresh) {
      if (detail::FlatLane* ln = lanes.get(kg, key, ks, vs, true)) dst = ln->insert_new(h, key, ks);
    }
    if (dst == nullptr) dst = kernel_put(table, lanes, kg, RowKey{key, ks, h}, vs);
    detail::copy_small(dst, p.vd + v0, vs);
  }
}

// How a load of one key group went: failed_block < 0 for loaded.
struct GroupLoad {
  int64_t failed_block = -1;
  EntryFault fault;
  uint64_t entries = 0;
};

// The empty map of key group kg back as it was before load_fresh_group laid it out and loaded
// into it: its directory replaced by an empty one of the same capacity and the layout it had,
// nothing counted (a map the load took off the flat engine is cleared instead).
void unload_fresh(StateMap& map, Lanes& lanes, int32_t kg, const detail::FlatLayout& layout,
                  size_t epoch_writes) {
  lanes.close(kg);
  StateMap::Impl& m = map.engine();
  if (!m.flat || m.frehash != nullptr) {
    map.clear();
    return;
  }
  const size_t cap = m.fprimary->capacity;
  detail::FlatDirectory::unref(m.fprimary);
  m.fprimary = detail::FlatDirectory::make(cap, layout);
  m.primary_size = 0;
  m.live_bytes = 0;
  m.epoch_writes = epoch_writes;
}

// load_blocks of key group kg's blocks [b0, b1) into its empty map when the spec fixes the key
// and value widths and the run has no tombstones (the oldest run of a restore): the map is
// pre-sized and laid out first (prepare_fresh), then block after block is opened into one
// buffer, its entries checked (fixed_entries_ok, check_payload_entries where that does not
// pass) and inserted (insert_fresh<..., true>) while the payload is still in the core's cache --
// rather than every block of the key group opened and checked before any is inserted, which for
// a key group of megabytes reads its payloads back from memory. A bad block empties the map
// again (unload_fresh): nothing of its key group stays. `handled` false when the map cannot be
// laid out that way (having at most pre-sized it; load_blocks' general path then loads it).
GroupLoad load_fresh_group(StateTable& table, Lanes& lanes, int32_t kg, BlockSource& source,
                           const StoredBlockRef* blocks, size_t b0, size_t b1,
                           const BlockLoadSpec& spec, KeyHashFunction hash_fn, bool* handled) {
  GroupLoad out;
  *handled = false;
  const int pw = spec.prefix_bytes;
  const size_t ks = static_cast<size_t>(spec.key_width);
  const size_t vs = static_cast<size_t>(spec.value_width);
  // The entries the block table announces, each block's count capped by what its stored bytes
  // could hold (LZ4 expands at most 255-fold, an entry is at least 8 + ks + vs bytes): a damaged
  // table pre-sizes the map for no more than the bytes given, and the load rejects it anyway.
  uint64_t total = 0;
  for (size_t b = b0; b < b1; ++b)
    total += std::min<uint64_t>(blocks[b].entries, blocks[b].stored_length * 255 / (8 + ks + vs));
  StateMap& m = table.map_unchecked(kg);
  if (total == 0 || m.size() != 0) return out;
  StateMap::Impl& impl = m.engine();
  if (!impl.flat || impl.frehash != nullptr) return out;
  const detail::FlatLayout layout = impl.fprimary->layout;
  const size_t epoch_writes = impl.epoch_writes;
  m.reserve(static_cast<size_t>(total));
  m.give_up_write_log();
  lanes.close(kg);  // reserve() may have replaced the table a lane holds
  // The layout takes the key group's prefix from the first key; every key must carry it.
  const uint8_t prefix[2] = {static_cast<uint8_t>(pw == 1 ? kg : kg >> 8),
                             static_cast<uint8_t>(kg)};
  uint8_t first[detail::kFlatMaxKey] = {};
  std::memcpy(first, prefix, static_cast<size_t>(pw));
  if (ks > detail::kFlatMaxKey || !prepare_fresh(m, first, ks, vs)) return out;
  *handled = true;
  uint8_t last[detail::kFlatMaxKey];
  bool have_last = false;
  for (size_t b = b0; b < b1; ++b) {
    std::string why;
    const uint8_t* payload = source.open(b, nullptr, &why);
    if (payload == nullptr) {
      unload_fresh(m, lanes, kg, layout, epoch_writes);
      out.failed_block = static_cast<int64_t>(b);
      out.fault = {std::move(why), true};
      return out;
    }
    const Payload p(payload, false);
    if (!fixed_entries_ok(p, kg, pw, ks, vs, have_last ? last : nullptr)) {
      const uint8_t* prev = have_last ? last : nullptr;
      size_t prev_size = ks;
      EntryFault f = check_payload_entries(p, kg, spec, &prev, &prev_size);
      if (!f.why.empty()) {
        unload_fresh(m, lanes, kg, layout, epoch_writes);
        out.failed_block = static_cast<int64_t>(b);
        out.fault = std::move(f);
        return out;
      }
    }
    const int64_t n = static_cast<int64_t>(p.n);
    if (n == 0) continue;
    // Passed check_payload_entries: widths as the spec's, so the offsets are i * width.
    const int64_t from = insert_fresh_payload<true>(lanes, kg, p, ks, vs, hash_fn);
    insert_entries(table, lanes, m, kg, p, from, true, hash_fn);
    std::memcpy(last, p.kd + (p.n - 1) * ks, ks);
    have_last = true;
    out.entries += p.n;
  }
  return out;
}

}  // namespace

BlockLoadResult load_blocks(StateTable& table, const uint8_t* data, size_t size,
                            const StoredBlockRef* blocks, const int32_t* key_groups, size_t count,
                            const BlockLoadSpec& spec) {
  const int pw = spec.prefix_bytes;
  if (pw != 1 && pw != 2)
    throw std::invalid_argument("prefix_width must be 1 or 2, got " + std::to_string(pw));
  BlockLoadResult r;
  auto fail = [&](size_t b, bool corrupt, std::string why) {
    r.failed_block = static_cast<int64_t>(b);
    r.corrupt = corrupt;
    r.error = std::move(why);
    return r;
  };
  if (count == 0) return r;
  const KeyHashFunction hash_fn = table.map_unchecked(table.kg_start()).engine().hash_fn;
  Lanes lanes(table);
  std::vector<std::vector<uint8_t>> scratch;  // one decompressed payload per block of a key group
  std::vector<Payload> payloads;
  const bool fixed = spec.key_width > pw && spec.value_width > 0;
  BlockSource source(data, size, blocks, count, spec.has_validity, spec.open_ahead);
  for (size_t b0 = 0; b0 < count;) {
    const int32_t kg = key_groups[b0];
    if (kg < table.kg_start() || kg > table.kg_end() || (b0 > 0 && kg < key_groups[b0 - 1]))
      return fail(b0, false,
                  "the block's key group " + std::to_string(kg) + " is outside [" +
                      std::to_string(table.kg_start()) + ", " + std::to_string(table.kg_end()) +
                      "] or below the block before it (blocks must be sorted by key group)");
    size_t b1 = b0 + 1;
    while (b1 < count && key_groups[b1] == kg) ++b1;
    if (spec.into_empty && fixed && !spec.has_validity) {
      bool handled = false;
      GroupLoad g =
          load_fresh_group(table, lanes, kg, source, blocks, b0, b1, spec, hash_fn, &handled);
      if (g.failed_block >= 0)
        return fail(static_cast<size_t>(g.failed_block), g.fault.corrupt, std::move(g.fault.why));
      if (handled) {
        r.entries += g.entries;
        b0 = b1;
        continue;
      }
    }
    // Every block of the key group opened and its entries checked before any is inserted: a
    // bad block leaves nothing of its key group behind.
    if (scratch.size() < b1 - b0) scratch.resize(b1 - b0);
    payloads.clear();
    uint64_t total = 0;
    const uint8_t* last_key = nullptr;  // the key group's last key so far (in its payload)
    size_t last_size = 0;
    for (size_t b = b0; b < b1; ++b) {
      std::string why;
      const uint8_t* payload = source.open(b, &scratch[b - b0], &why);
      if (payload == nullptr) return fail(b, true, std::move(why));
      const Payload& p = payloads.emplace_back(payload, spec.has_validity);
      EntryFault f = check_payload_entries(p, kg, spec, &last_key, &last_size);
      if (!f.why.empty()) return fail(b, f.corrupt, std::move(f.why));
      total += p.n;
    }
    StateMap& m = table.map_unchecked(kg);
    const bool fresh = spec.into_empty && m.size() == 0;
    m.reserve(static_cast<size_t>(total));
    m.give_up_write_log();
    // With `fresh`, unique keys go into an empty, pre-sized map: inserted without looking for
    // an equal key, tombstones skipped (nothing to remove). With every key key_width bytes and
    // every live value value_width (checked above), the map is laid out for them first, and a
    // lane that opens for one key takes them all (insert_fresh).
    bool direct = false;
    if (fresh) {
      lanes.close(kg);  // reserve() may have replaced the table a lane holds
      if (fixed) {
        // The layout follows the key group's first key (a block may hold no entries).
        for (const Payload& p : payloads) {
          if (p.n == 0) continue;
          direct = prepare_fresh(m, p.kd + p.koff(0), static_cast<size_t>(spec.key_width),
                                 static_cast<size_t>(spec.value_width));
          break;
        }
      }
    }
    for (const Payload& p : payloads) {
      int64_t from = 0;
      if (direct && p.n > 0)
        from = insert_fresh_payload<false>(lanes, kg, p, static_cast<size_t>(spec.key_width),
                                           static_cast<size_t>(spec.value_width), hash_fn);
      insert_entries(table, lanes, m, kg, p, from, fresh, hash_fn);
    }
    r.entries += total;
    b0 = b1;
  }
  return r;
}

namespace {

// Block indexes where load_blocks_parallel's slices start, and `count` last: at most `threads`
// slices of about equal stored bytes, each of at least `min_slice_bytes`, cut only between two
// key groups; {0, count} when the key groups are not sorted and inside the table's range.
std::vector<size_t> slice_starts(const StateTable& table, const StoredBlockRef* blocks,
                                 const int32_t* key_groups, size_t count, size_t size, int threads,
                                 uint64_t min_slice_bytes) {
  std::vector<size_t> cuts{0};
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    const int32_t kg = key_groups[i];
    if (kg < table.kg_start() || kg > table.kg_end() || (i > 0 && kg < key_groups[i - 1])) {
      cuts.push_back(count);
      return cuts;
    }
    // A block claiming more than `data` holds fails in load_blocks; here it only must not
    // overflow the sum.
    total += std::min<uint64_t>(blocks[i].stored_length, size);
  }
  const uint64_t most = min_slice_bytes > 0 ? total / min_slice_bytes : total;
  const uint64_t n = std::min<uint64_t>(threads > 1 ? static_cast<uint64_t>(threads) : 1, most);
  uint64_t acc = 0;
  size_t i = 0;
  for (uint64_t s = 1; s < n; ++s) {
    const uint64_t target = total / n * s;
    while (i < count && acc < target) acc += std::min<uint64_t>(blocks[i++].stored_length, size);
    while (i > 0 && i < count && key_groups[i] == key_groups[i - 1])
      acc += std::min<uint64_t>(blocks[i++].stored_length, size);
    if (i >= count) break;
    if (i > cuts.back()) cuts.push_back(i);
  }
  cuts.push_back(count);
  return cuts;
}

}  // namespace

BlockLoadResult load_blocks_parallel(StateTable& table, const uint8_t* data, size_t size,
                                     const StoredBlockRef* blocks, const int32_t* key_groups,
                                     size_t count, const BlockLoadSpec& spec, int threads,
                                     uint64_t min_slice_bytes) {
  const std::vector<size_t> cuts =
      slice_starts(table, blocks, key_groups, count, size, threads, min_slice_bytes);
  const size_t k = cuts.size() - 1;
  if (k <= 1) return load_blocks(table, data, size, blocks, key_groups, count, spec);
  std::vector<BlockLoadResult> results(k);
  std::vector<std::exception_ptr> errors(k);
  auto run = [&](size_t s) {
    try {
      results[s] = load_blocks(table, data, size, blocks + cuts[s], key_groups + cuts[s],
                               cuts[s + 1] - cuts[s], spec);
    } catch (...) {
      errors[s] = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  std::vector<size_t> here{0};  // slices the calling thread loads
  workers.reserve(k - 1);
  for (size_t s = 1; s < k; ++s) {
    try {
      workers.emplace_back(run, s);
    } catch (const std::system_error&) {
      here.push_back(s);
    }
  }
  for (size_t s : here) run(s);
  for (std::thread& w : workers) w.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  BlockLoadResult out;
  for (size_t s = 0; s < k; ++s) {
    out.entries += results[s].entries;
    if (out.failed_block < 0 && results[s].failed_block >= 0) {
      out.failed_block = results[s].failed_block + static_cast<int64_t>(cuts[s]);
      out.corrupt = results[s].corrupt;
      out.error = std::move(results[s].error);
    }
  }
  return out;
}

}  // namespace statecore
