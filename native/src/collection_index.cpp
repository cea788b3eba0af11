// Members of collections stored one entry per member (contract and design: collection_index.h).
#include "statecore/collection_index.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "statecore/detail/key_hash.h"
#include "statecore/key_codec.h"

namespace statecore {

namespace {

constexpr uint32_t kNone = UINT32_MAX;

void check_bytes(const uint8_t* p, size_t n, const char* what) {
  if (p == nullptr && n != 0)
    throw std::invalid_argument(std::string("collection index: null ") + what + " bytes");
}

size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

size_t put_varint(uint8_t* p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  p[n++] = static_cast<uint8_t>(v);
  return n;
}

// Capacity of a table holding `n` slots at load <= 3/4: a power of two >= 8.
uint32_t table_capacity(size_t n) {
  size_t cap = 8;
  while (n * 4 > cap * 3) cap *= 2;
  if (cap > (size_t{1} << 31)) throw std::length_error("collection index: table too large");
  return static_cast<uint32_t>(cap);
}

// Linear probing over a power-of-two table of `mask + 1` slots, ref 0 = free.
template <class S>
void place(S* slots, uint32_t mask, uint32_t h, uint32_t ref) {
  uint32_t i = h & mask;
  while (slots[i].ref != 0) i = (i + 1) & mask;
  slots[i].hash = h;
  slots[i].ref = ref;
}

// Backward-shift deletion of slot i (Knuth 6.4 algorithm R): the later slots of its probe run
// move back so no lookup stops at the gap.
template <class S>
void unplace(S* slots, uint32_t mask, uint32_t i) {
  for (uint32_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    if (slots[j].ref == 0) break;
    const uint32_t home = slots[j].hash & mask;
    // Slot j may move to i iff i lies on its probe path, home .. j (cyclically).
    if (((j - home) & mask) >= ((j - i) & mask)) {
      slots[i] = slots[j];
      i = j;
    }
  }
  slots[i].ref = 0;
  slots[i].hash = 0;
}

}  // namespace

CollectionIndex::CollectionIndex(int32_t kg_start, int32_t kg_end, KeyHashFunction hash)
    : kg_start_(kg_start), kg_end_(kg_end), hash_fn_(hash) {
  if (kg_start < 0 || kg_end < kg_start || kg_end >= 32768)
    throw std::invalid_argument("collection index: key groups [" + std::to_string(kg_start) + ", " +
                                std::to_string(kg_end) + "] outside [0, 32767]");
  groups_.resize(static_cast<size_t>(kg_end - kg_start + 1));
}

CollectionIndex::~CollectionIndex() { clear(); }

uint32_t CollectionIndex::hash(const uint8_t* data, size_t size) const {
  check_bytes(data, size, "key");
  // As detail::map_key_hash (StateMap::hash): the same function, so a kernel's hash of a prefix
  // for the table is this one.
  if (hash_fn_ != nullptr) return detail::fmix32(hash_fn_(data, size));
  return detail::default_key_hash(data, size);
}

CollectionIndex::Group& CollectionIndex::group(int32_t kg) {
  if (kg < kg_start_ || kg > kg_end_)
    throw std::out_of_range("collection index: key group " + std::to_string(kg) + " outside [" +
                            std::to_string(kg_start_) + ", " + std::to_string(kg_end_) + "]");
  return groups_[static_cast<size_t>(kg - kg_start_)];
}

const CollectionIndex::Group& CollectionIndex::group(int32_t kg) const {
  return const_cast<CollectionIndex*>(this)->group(kg);
}

uint32_t CollectionIndex::find_coll_index(const Group& g, uint32_t h, const uint8_t* prefix,
                                          size_t ps) const {
  if (g.colls.empty()) return kNone;
  const uint32_t mask = static_cast<uint32_t>(g.slots.size() - 1);
  for (uint32_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = g.slots[i];
    if (s.ref == 0) return kNone;
    if (s.hash != h) continue;
    const Coll& c = g.colls[s.ref - 1];
    if (c.prefix_size == ps && (ps == 0 || std::memcmp(c.buf, prefix, ps) == 0)) return s.ref - 1;
  }
}

const CollectionIndex::Coll* CollectionIndex::find_coll(const Group& g, uint32_t h,
                                                        const uint8_t* prefix, size_t ps) const {
  check_bytes(prefix, ps, "prefix");
  const uint32_t i = find_coll_index(g, h, prefix, ps);
  return i == kNone ? nullptr : &g.colls[i];
}

uint32_t CollectionIndex::find_member(const Coll& c, const uint8_t* member, size_t ms) const {
  if (c.table != nullptr) {
    const uint32_t h = hash(member, ms);
    for (uint32_t i = h & c.mask;; i = (i + 1) & c.mask) {
      const Slot& s = c.table[i];
      if (s.ref == 0) return kNone;
      if (s.hash != h) continue;
      size_t hs = 0;
      bool erased = false;
      const uint32_t off = s.ref - 1;
      const uint32_t n = read_record(c.buf + off, &hs, &erased);
      if (n == ms && (ms == 0 || std::memcmp(c.buf + off + hs, member, ms) == 0)) return off;
    }
  }
  for (uint32_t at = c.prefix_size; at < c.used;) {
    size_t hs = 0;
    bool erased = false;
    const uint32_t n = read_record(c.buf + at, &hs, &erased);
    if (!erased && n == ms && (ms == 0 || std::memcmp(c.buf + at + hs, member, ms) == 0)) return at;
    at += static_cast<uint32_t>(hs) + n;
  }
  return kNone;
}

void CollectionIndex::free_coll(Coll& c) {
  std::free(c.buf);
  delete[] c.table;
  c.buf = nullptr;
  c.table = nullptr;
}

void CollectionIndex::drop_coll(Group& g, uint32_t idx) {
  const uint32_t mask = static_cast<uint32_t>(g.slots.size() - 1);
  auto slot_of = [&](uint32_t ref) {
    uint32_t i = g.colls[ref - 1].hash & mask;
    while (g.slots[i].ref != ref) i = (i + 1) & mask;
    return i;
  };
  free_coll(g.colls[idx]);
  unplace(g.slots.data(), mask, slot_of(idx + 1));
  const uint32_t last = static_cast<uint32_t>(g.colls.size() - 1);
  if (idx != last) {
    g.slots[slot_of(last + 1)].ref = idx + 1;
    g.colls[idx] = g.colls[last];
  }
  g.colls.pop_back();
}

void CollectionIndex::rebuild_table(Coll& c) {
  std::memset(c.table, 0, (size_t{c.mask} + 1) * sizeof(Slot));
  for (uint32_t at = c.prefix_size; at < c.used;) {
    size_t hs = 0;
    bool erased = false;
    const uint32_t n = read_record(c.buf + at, &hs, &erased);
    if (!erased) place(c.table, c.mask, hash(c.buf + at + hs, n), at + 1);
    at += static_cast<uint32_t>(hs) + n;
  }
}

void CollectionIndex::compact(Coll& c) {
  uint32_t w = c.prefix_size;
  for (uint32_t at = c.prefix_size; at < c.used;) {
    size_t hs = 0;
    bool erased = false;
    const uint32_t n = read_record(c.buf + at, &hs, &erased);
    const uint32_t len = static_cast<uint32_t>(hs) + n;
    if (!erased) {
      if (w != at) std::memmove(c.buf + w, c.buf + at, len);
      w += len;
    }
    at += len;
  }
  c.used = w;
  c.dead = 0;
  if (c.table == nullptr) return;
  if (c.live <= kSmallMembers) {
    delete[] c.table;
    c.table = nullptr;
    c.mask = 0;
    return;
  }
  rebuild_table(c);
}

void CollectionIndex::erase_record(Coll& c, uint32_t off) {
  if (c.table != nullptr) {
    size_t hs = 0;
    bool erased = false;
    const uint32_t n = read_record(c.buf + off, &hs, &erased);
    uint32_t i = hash(c.buf + off + hs, n) & c.mask;
    while (c.table[i].ref != off + 1) i = (i + 1) & c.mask;
    unplace(c.table, c.mask, i);
  }
  c.buf[off] |= 1;  // the erased bit: bit 0 of the varint's first byte
  --c.live;
  ++c.dead;
}

bool CollectionIndex::insert(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                             const uint8_t* member, size_t member_size) {
  return insert_hashed(kg, hash(prefix, prefix_size), prefix, prefix_size, member, member_size);
}

bool CollectionIndex::insert_hashed(int32_t kg, uint32_t prefix_hash, const uint8_t* prefix,
                                    size_t prefix_size, const uint8_t* member, size_t member_size) {
  Group& g = group(kg);
  check_bytes(prefix, prefix_size, "prefix");
  check_bytes(member, member_size, "member");
  if (member_size >= (size_t{1} << 31) || prefix_size >= (size_t{1} << 31))
    throw std::length_error("collection index: a prefix or member of 2^31 bytes or more");
  const size_t rec = varint_size(uint64_t{member_size} << 1) + member_size;
  uint32_t idx = find_coll_index(g, prefix_hash, prefix, prefix_size);
  if (idx == kNone) {
    // A new collection: its buffer `prefix | record`, sized exactly (most maps stay small).
    const size_t need = prefix_size + rec;
    if (need > UINT32_MAX) throw std::length_error("collection index: collection too large");
    if ((g.colls.size() + 1) * 4 > g.slots.size() * 3) {
      std::vector<Slot> grown(table_capacity(g.colls.size() + 1));
      const uint32_t mask = static_cast<uint32_t>(grown.size() - 1);
      for (const Slot& s : g.slots)
        if (s.ref != 0) place(grown.data(), mask, s.hash, s.ref);
      g.slots.swap(grown);
    }
    if (g.colls.size() >= UINT32_MAX - 1)
      throw std::length_error("collection index: too many collections in one key group");
    auto* buf = static_cast<uint8_t*>(std::malloc(need));
    if (buf == nullptr) throw std::bad_alloc();
    try {
      g.colls.push_back(Coll{buf, 0, static_cast<uint32_t>(need),
                             static_cast<uint32_t>(prefix_size), prefix_hash, 1, 0, nullptr, 0});
    } catch (...) {
      std::free(buf);
      throw;
    }
    if (prefix_size) std::memcpy(buf, prefix, prefix_size);
    const size_t hs = put_varint(buf + prefix_size, uint64_t{member_size} << 1);
    if (member_size) std::memcpy(buf + prefix_size + hs, member, member_size);
    g.colls.back().used = static_cast<uint32_t>(need);
    place(g.slots.data(), static_cast<uint32_t>(g.slots.size() - 1), prefix_hash,
          static_cast<uint32_t>(g.colls.size()));
    return true;
  }
  Coll& c = g.colls[idx];
  if (find_member(c, member, member_size) != kNone) return false;
  if (c.live == UINT32_MAX - 1)
    throw std::length_error("collection index: more than 2^32 - 2 members in one collection");
  if (rec > UINT32_MAX - c.used) throw std::length_error("collection index: collection too large");
  // Every allocation before the first change, so a failed one leaves the collection as it was.
  if (c.used + rec > c.cap) {
    size_t cap = size_t{c.cap} + c.cap / 2;
    if (cap < c.used + rec) cap = c.used + rec;
    if (cap > UINT32_MAX) cap = UINT32_MAX;
    auto* buf = static_cast<uint8_t*>(std::realloc(c.buf, cap));
    if (buf == nullptr) throw std::bad_alloc();
    c.buf = buf;
    c.cap = static_cast<uint32_t>(cap);
  }
  const uint32_t off = c.used;
  const bool promote = c.table == nullptr && c.live + 1 > kSmallMembers;
  const bool grow = c.table != nullptr && (size_t{c.live} + 1) * 4 > (size_t{c.mask} + 1) * 3;
  Slot* fresh = nullptr;
  uint32_t fresh_mask = 0;
  if (promote || grow) {
    fresh_mask = table_capacity(size_t{c.live} + 1) - 1;
    fresh = new Slot[size_t{fresh_mask} + 1]();
  }
  const size_t hs = put_varint(c.buf + off, uint64_t{member_size} << 1);
  if (member_size) std::memcpy(c.buf + off + hs, member, member_size);
  c.used = off + static_cast<uint32_t>(rec);
  ++c.live;
  if (fresh != nullptr) {
    if (grow) {
      for (uint32_t i = 0; i <= c.mask; ++i)
        if (c.table[i].ref != 0) place(fresh, fresh_mask, c.table[i].hash, c.table[i].ref);
      delete[] c.table;
      c.table = fresh;
      c.mask = fresh_mask;
      place(c.table, c.mask, hash(member, member_size), off + 1);
    } else {
      c.table = fresh;
      c.mask = fresh_mask;
      rebuild_table(c);
    }
  } else if (c.table != nullptr) {
    place(c.table, c.mask, hash(member, member_size), off + 1);
  }
  return true;
}

bool CollectionIndex::erase(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                            const uint8_t* member, size_t member_size) {
  return erase_hashed(kg, hash(prefix, prefix_size), prefix, prefix_size, member, member_size);
}

bool CollectionIndex::erase_hashed(int32_t kg, uint32_t prefix_hash, const uint8_t* prefix,
                                   size_t prefix_size, const uint8_t* member, size_t member_size) {
  Group& g = group(kg);
  check_bytes(prefix, prefix_size, "prefix");
  check_bytes(member, member_size, "member");
  const uint32_t idx = find_coll_index(g, prefix_hash, prefix, prefix_size);
  if (idx == kNone) return false;
  Coll& c = g.colls[idx];
  const uint32_t off = find_member(c, member, member_size);
  if (off == kNone) return false;
  erase_record(c, off);
  if (c.live == 0) {
    drop_coll(g, idx);
  } else if (c.dead > c.live) {
    compact(c);
  }
  return true;
}

bool CollectionIndex::contains(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                               const uint8_t* member, size_t member_size) const {
  const Coll* c = find_coll(group(kg), hash(prefix, prefix_size), prefix, prefix_size);
  check_bytes(member, member_size, "member");
  return c != nullptr && find_member(*c, member, member_size) != kNone;
}

size_t CollectionIndex::size(int32_t kg, const uint8_t* prefix, size_t prefix_size) const {
  const Coll* c = find_coll(group(kg), hash(prefix, prefix_size), prefix, prefix_size);
  return c == nullptr ? 0 : c->live;
}

std::vector<std::string> CollectionIndex::members(int32_t kg, const uint8_t* prefix,
                                                  size_t prefix_size) const {
  std::vector<std::string> out;
  for_each(kg, prefix, prefix_size, [&](const uint8_t* m, size_t n) {
    out.emplace_back(reinterpret_cast<const char*>(m), n);
  });
  return out;
}

std::vector<std::string> CollectionIndex::take(int32_t kg, const uint8_t* prefix,
                                               size_t prefix_size) {
  Group& g = group(kg);
  check_bytes(prefix, prefix_size, "prefix");
  std::vector<std::string> out;
  const uint32_t idx = find_coll_index(g, hash(prefix, prefix_size), prefix, prefix_size);
  if (idx == kNone) return out;
  const Coll& c = g.colls[idx];
  out.reserve(c.live);
  for (uint32_t at = c.prefix_size; at < c.used;) {
    size_t hs = 0;
    bool erased = false;
    const uint32_t n = read_record(c.buf + at, &hs, &erased);
    if (!erased) out.emplace_back(reinterpret_cast<const char*>(c.buf + at + hs), n);
    at += static_cast<uint32_t>(hs) + n;
  }
  drop_coll(g, idx);
  return out;
}

void CollectionIndex::clear() {
  for (Group& g : groups_) {
    for (Coll& c : g.colls) free_coll(c);
    std::vector<Coll>().swap(g.colls);
    std::vector<Slot>().swap(g.slots);
  }
}

template <bool kInsert>
void CollectionIndex::apply_entry_keys(const uint8_t* data, const int32_t* off, int64_t n,
                                       const KeySchema& key, NamespaceType namespace_type,
                                       int32_t max_parallelism) {
  if (n <= 0) return;
  std::vector<uint32_t> split(static_cast<size_t>(n));
  std::vector<int32_t> kgs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* k = data + off[i];
    const size_t size = static_cast<size_t>(off[i + 1] - off[i]);
    const size_t p = encoded_prefix_size(k, size, key, namespace_type, max_parallelism);
    if (p >= size)
      throw std::invalid_argument("collection index: entry key " + std::to_string(i) +
                                  " holds no member after its prefix");
    kgs[static_cast<size_t>(i)] = read_key_group_prefix(k, size, max_parallelism);
    group(kgs[static_cast<size_t>(i)]);  // range check before any change
    split[static_cast<size_t>(i)] = static_cast<uint32_t>(p);
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* k = data + off[i];
    const size_t size = static_cast<size_t>(off[i + 1] - off[i]);
    const size_t p = split[static_cast<size_t>(i)];
    if (kInsert) insert(kgs[static_cast<size_t>(i)], k, p, k + p, size - p);
    else erase(kgs[static_cast<size_t>(i)], k, p, k + p, size - p);
  }
}

void CollectionIndex::insert_entry_keys(const uint8_t* data, const int32_t* off, int64_t n,
                                        const KeySchema& key, NamespaceType namespace_type,
                                        int32_t max_parallelism) {
  apply_entry_keys<true>(data, off, n, key, namespace_type, max_parallelism);
}

void CollectionIndex::erase_entry_keys(const uint8_t* data, const int32_t* off, int64_t n,
                                       const KeySchema& key, NamespaceType namespace_type,
                                       int32_t max_parallelism) {
  apply_entry_keys<false>(data, off, n, key, namespace_type, max_parallelism);
}

void CollectionIndex::erase_entry_keys(const std::vector<std::string>& keys, const KeySchema& key,
                                       NamespaceType namespace_type, int32_t max_parallelism) {
  for (const std::string& k : keys) {
    const auto* p = reinterpret_cast<const uint8_t*>(k.data());
    const size_t n = encoded_prefix_size(p, k.size(), key, namespace_type, max_parallelism);
    if (n >= k.size()) continue;  // no member: never listed
    erase(read_key_group_prefix(p, k.size(), max_parallelism), p, n, p + n, k.size() - n);
  }
}

size_t CollectionIndex::prune(StateTable& table) {
  size_t dropped = 0;
  std::vector<uint8_t> key;
  ByteView out;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const int32_t kg = kg_start_ + static_cast<int32_t>(gi);
    Group& g = groups_[gi];
    if (g.colls.empty()) continue;
    StateMap& m = table.map(kg);
    // Backwards: dropping collection i moves the last one, already visited, into its place.
    for (size_t ci = g.colls.size(); ci-- > 0;) {
      Coll& c = g.colls[ci];
      for (uint32_t at = c.prefix_size; at < c.used;) {
        size_t hs = 0;
        bool erased = false;
        const uint32_t n = read_record(c.buf + at, &hs, &erased);
        if (!erased) {
          key.assign(c.buf, c.buf + c.prefix_size);
          key.insert(key.end(), c.buf + at + hs, c.buf + at + hs + n);
          if (!m.get(key.data(), key.size(), &out)) {
            erase_record(c, at);
            ++dropped;
          }
        }
        at += static_cast<uint32_t>(hs) + n;
      }
      if (c.live == 0) {
        drop_coll(g, static_cast<uint32_t>(ci));
      } else if (c.dead > c.live) {
        compact(c);
      }
    }
  }
  return dropped;
}

size_t CollectionIndex::collections() const {
  size_t n = 0;
  for (const Group& g : groups_) n += g.colls.size();
  return n;
}

size_t CollectionIndex::members() const {
  size_t n = 0;
  for (const Group& g : groups_)
    for (const Coll& c : g.colls) n += c.live;
  return n;
}

size_t CollectionIndex::bytes() const {
  size_t b = sizeof(*this) + groups_.capacity() * sizeof(Group);
  for (const Group& g : groups_) {
    b += g.slots.capacity() * sizeof(Slot) + g.colls.capacity() * sizeof(Coll);
    for (const Coll& c : g.colls) {
      b += c.cap;
      if (c.table != nullptr) b += (size_t{c.mask} + 1) * sizeof(Slot);
    }
  }
  return b;
}

void CollectionIndex::check_invariants() const {
  auto fail = [](const std::string& what) {
    throw std::logic_error("collection index invariant: " + what);
  };
  for (const Group& g : groups_) {
    size_t used_slots = 0;
    if (!g.colls.empty() && (g.slots.size() & (g.slots.size() - 1)) != 0)
      fail("I1 group table capacity not a power of two");
    for (const Slot& s : g.slots) {
      if (s.ref == 0) continue;
      ++used_slots;
      if (s.ref > g.colls.size()) fail("I1 slot past the collection records");
      const Coll& c = g.colls[s.ref - 1];
      if (c.hash != s.hash) fail("I1 slot hash differs from its collection's");
      if (find_coll_index(g, c.hash, c.buf, c.prefix_size) != s.ref - 1)
        fail("I1 collection not found by its prefix");
    }
    if (used_slots != g.colls.size()) fail("I1 slots != collection records");
    if (used_slots * 4 > g.slots.size() * 3) fail("I1 group table load above 3/4");
    for (const Coll& c : g.colls) {
      if (c.live == 0) fail("I2 empty collection kept");
      if (c.dead > c.live) fail("I3 more erased records than live ones");
      if (c.hash != hash(c.buf, c.prefix_size)) fail("collection hash differs from its prefix's");
      uint32_t live = 0, dead = 0;
      uint32_t at = c.prefix_size;
      while (at < c.used) {
        size_t hs = 0;
        bool erased = false;
        const uint32_t n = read_record(c.buf + at, &hs, &erased);
        if (erased) {
          ++dead;
        } else {
          ++live;
          if (find_member(c, c.buf + at + hs, n) != at) fail("I4 live member not found");
        }
        at += static_cast<uint32_t>(hs) + n;
      }
      if (at != c.used || c.used > c.cap) fail("records overrun the buffer");
      if (live != c.live || dead != c.dead) fail("live/erased counts differ from the records");
      // Promoted past kSmallMembers; demoted by the first compaction at or below it.
      if (c.live > kSmallMembers && c.table == nullptr) fail("I4 large collection not promoted");
      if (c.table != nullptr && c.live <= kSmallMembers && c.dead == 0)
        fail("I4 compacted small collection kept its member table");
      if (c.table == nullptr) continue;
      uint32_t slots = 0;
      for (uint32_t i = 0; i <= c.mask; ++i) {
        if (c.table[i].ref == 0) continue;
        ++slots;
        size_t hs = 0;
        bool erased = false;
        read_record(c.buf + c.table[i].ref - 1, &hs, &erased);
        if (erased) fail("I4 member table slot of an erased record");
      }
      if (slots != c.live) fail("I4 member table slots != live members");
      if (size_t{slots} * 4 > (size_t{c.mask} + 1) * 3) fail("I4 member table load above 3/4");
    }
  }
}

}  // namespace statecore
