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
// Records a new collection's block has room for.
constexpr size_t kFirstRecords = 4;

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

// Linear probing over a power-of-two table of `mask + 1` slots.
template <class S>
void place(S* slots, uint32_t mask, const S& s) {
  uint32_t i = s.hash & mask;
  while (slots[i].used()) i = (i + 1) & mask;
  slots[i] = s;
}

// Backward-shift deletion of slot i (Knuth 6.4 algorithm R): the later slots of its probe run
// move back so no lookup stops at the gap.
template <class S>
void unplace(S* slots, uint32_t mask, uint32_t i) {
  for (uint32_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    if (!slots[j].used()) break;
    const uint32_t home = slots[j].hash & mask;
    // Slot j may move to i iff i lies on its probe path, home .. j (cyclically).
    if (((j - home) & mask) >= ((j - i) & mask)) {
      slots[i] = slots[j];
      i = j;
    }
  }
  slots[i] = S{};
}

// Compares a few bytes inline: prefixes and int64 user keys are 8-20 bytes, where a memcmp call
// costs more than the compare.
inline bool same_bytes(const uint8_t* a, const uint8_t* b, size_t n) {
  if (n == 8) {
    uint64_t x, y;
    std::memcpy(&x, a, 8);
    std::memcpy(&y, b, 8);
    return x == y;
  }
  if (n > 8 && n <= 16) {
    uint64_t x0, y0, x1, y1;
    std::memcpy(&x0, a, 8);
    std::memcpy(&y0, b, 8);
    std::memcpy(&x1, a + n - 8, 8);
    std::memcpy(&y1, b + n - 8, 8);
    return ((x0 ^ y0) | (x1 ^ y1)) == 0;
  }
  return n == 0 || std::memcmp(a, b, n) == 0;
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

uint32_t CollectionIndex::find_slot(const Group& g, uint32_t h, const uint8_t* prefix,
                                    size_t ps) const {
  if (g.count == 0) return kNone;
  const uint32_t mask = static_cast<uint32_t>(g.slots.size() - 1);
  for (uint32_t i = h & mask;; i = (i + 1) & mask) {
    const GroupSlot& s = g.slots[i];
    if (!s.used()) return kNone;
    if (s.hash == h && s.coll->prefix_size == ps && same_bytes(s.coll->data(), prefix, ps))
      return i;
  }
}

const CollectionIndex::Coll* CollectionIndex::find_coll(const Group& g, uint32_t h,
                                                        const uint8_t* prefix, size_t ps) const {
  check_bytes(prefix, ps, "prefix");
  const uint32_t i = find_slot(g, h, prefix, ps);
  return i == kNone ? nullptr : g.slots[i].coll;
}

uint32_t CollectionIndex::slot_of(const Group& g, const Coll* c) {
  const uint32_t mask = static_cast<uint32_t>(g.slots.size() - 1);
  uint32_t i = c->hash & mask;
  while (g.slots[i].coll != c) i = (i + 1) & mask;
  return i;
}

uint32_t CollectionIndex::find_member(const Coll& c, const uint8_t* member, size_t ms) const {
  const uint8_t* d = c.data();
  if (c.table != nullptr) {
    const uint32_t h = hash(member, ms);
    for (uint32_t i = h & c.mask;; i = (i + 1) & c.mask) {
      const Slot& s = c.table[i];
      if (!s.used()) return kNone;
      if (s.hash != h) continue;
      size_t hs = 0;
      bool erased = false;
      const uint32_t off = s.ref - 1;
      const uint32_t n = read_record(d + off, &hs, &erased);
      if (n == ms && same_bytes(d + off + hs, member, ms)) return off;
    }
  }
  for (uint32_t at = c.prefix_size; at < c.used;) {
    size_t hs = 0;
    bool erased = false;
    const uint32_t n = read_record(d + at, &hs, &erased);
    if (!erased && n == ms && same_bytes(d + at + hs, member, ms)) return at;
    at += static_cast<uint32_t>(hs) + n;
  }
  return kNone;
}

void CollectionIndex::free_coll(Coll* c) {
  delete[] c->table;
  std::free(c);
}

void CollectionIndex::drop_coll(Group& g, uint32_t slot) {
  free_coll(g.slots[slot].coll);
  unplace(g.slots.data(), static_cast<uint32_t>(g.slots.size() - 1), slot);
  --g.count;
}

void CollectionIndex::rebuild_table(Coll& c) {
  std::memset(static_cast<void*>(c.table), 0, (size_t{c.mask} + 1) * sizeof(Slot));
  const uint8_t* d = c.data();
  for (uint32_t at = c.prefix_size; at < c.used;) {
    size_t hs = 0;
    bool erased = false;
    const uint32_t n = read_record(d + at, &hs, &erased);
    if (!erased) place(c.table, c.mask, Slot{hash(d + at + hs, n), at + 1});
    at += static_cast<uint32_t>(hs) + n;
  }
}

void CollectionIndex::compact(Group& g, uint32_t slot) {
  Coll* c = g.slots[slot].coll;
  uint8_t* d = c->data();
  uint32_t w = c->prefix_size;
  for (uint32_t at = c->prefix_size; at < c->used;) {
    size_t hs = 0;
    bool erased = false;
    const uint32_t n = read_record(d + at, &hs, &erased);
    const uint32_t len = static_cast<uint32_t>(hs) + n;
    if (!erased) {
      if (w != at) std::memmove(d + w, d + at, len);
      w += len;
    }
    at += len;
  }
  c->used = w;
  c->dead = 0;
  // A collection that shrank gives back what a regrowth by 1.5x would not reuse soon; a failed
  // shrink keeps the larger block.
  if (c->cap / 2 > c->used + 64) {
    if (auto* moved = static_cast<Coll*>(std::realloc(c, sizeof(Coll) + c->used))) {
      c = moved;
      c->cap = c->used;
      g.slots[slot].coll = c;
    }
  }
  if (c->table == nullptr) return;
  if (c->live <= kSmallMembers) {
    delete[] c->table;
    c->table = nullptr;
    c->mask = 0;
    return;
  }
  // The table too, once 4x larger than its live members need (kept when the smaller one
  // cannot be allocated: compaction must not throw).
  const uint32_t want = table_capacity(c->live);
  if (size_t{c->mask} + 1 > size_t{want} * 4) {
    if (Slot* t = new (std::nothrow) Slot[want]) {
      delete[] c->table;
      c->table = t;
      c->mask = want - 1;
    }
  }
  rebuild_table(*c);
}

void CollectionIndex::erase_record(Coll& c, uint32_t off) {
  uint8_t* d = c.data();
  if (c.table != nullptr) {
    size_t hs = 0;
    bool erased = false;
    const uint32_t n = read_record(d + off, &hs, &erased);
    uint32_t i = hash(d + off + hs, n) & c.mask;
    while (c.table[i].ref != off + 1) i = (i + 1) & c.mask;
    unplace(c.table, c.mask, i);
  }
  d[off] |= 1;  // the erased bit: bit 0 of the varint's first byte
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
  const uint32_t si = find_slot(g, prefix_hash, prefix, prefix_size);
  if (si == kNone) {
    // A new collection: its block `header | prefix | record`, with room for kFirstRecords
    // records of this size (the common maps grow to a handful: fewer reallocs).
    const size_t need = prefix_size + rec;
    if (need > UINT32_MAX - sizeof(Coll))
      throw std::length_error("collection index: collection too large");
    size_t cap = prefix_size + rec * kFirstRecords;
    if (cap > UINT32_MAX - sizeof(Coll)) cap = need;
    if ((g.count + 1) * 4 > g.slots.size() * 3) {
      std::vector<GroupSlot> grown(table_capacity(g.count + 1));
      const uint32_t mask = static_cast<uint32_t>(grown.size() - 1);
      for (const GroupSlot& s : g.slots)
        if (s.used()) place(grown.data(), mask, s);
      g.slots.swap(grown);
    }
    auto* c = static_cast<Coll*>(std::malloc(sizeof(Coll) + cap));
    if (c == nullptr) throw std::bad_alloc();
    *c = Coll{static_cast<uint32_t>(need),
              static_cast<uint32_t>(cap),
              static_cast<uint32_t>(prefix_size),
              prefix_hash,
              1,
              0,
              nullptr,
              0};
    uint8_t* d = c->data();
    if (prefix_size) std::memcpy(d, prefix, prefix_size);
    const size_t hs = put_varint(d + prefix_size, uint64_t{member_size} << 1);
    if (member_size) std::memcpy(d + prefix_size + hs, member, member_size);
    place(g.slots.data(), static_cast<uint32_t>(g.slots.size() - 1), GroupSlot{prefix_hash, c});
    ++g.count;
    return true;
  }
  Coll* c = g.slots[si].coll;
  if (find_member(*c, member, member_size) != kNone) return false;
  if (c->live == UINT32_MAX - 1)
    throw std::length_error("collection index: more than 2^32 - 2 members in one collection");
  if (rec > UINT32_MAX - sizeof(Coll) - c->used)
    throw std::length_error("collection index: collection too large");
  // Every allocation before the first change, so a failed one leaves the collection as it was.
  if (c->used + rec > c->cap) {
    size_t cap = size_t{c->cap} + c->cap / 2;
    if (cap < c->used + rec) cap = c->used + rec;
    if (cap > UINT32_MAX - sizeof(Coll)) cap = UINT32_MAX - sizeof(Coll);
    auto* moved = static_cast<Coll*>(std::realloc(c, sizeof(Coll) + cap));
    if (moved == nullptr) throw std::bad_alloc();
    c = moved;
    g.slots[si].coll = c;
    c->cap = static_cast<uint32_t>(cap);
  }
  const uint32_t off = c->used;
  const bool promote = c->table == nullptr && c->live + 1 > kSmallMembers;
  const bool grow = c->table != nullptr && (size_t{c->live} + 1) * 4 > (size_t{c->mask} + 1) * 3;
  Slot* fresh = nullptr;
  uint32_t fresh_mask = 0;
  if (promote || grow) {
    fresh_mask = table_capacity(size_t{c->live} + 1) - 1;
    fresh = new Slot[size_t{fresh_mask} + 1]();
  }
  uint8_t* d = c->data();
  const size_t hs = put_varint(d + off, uint64_t{member_size} << 1);
  if (member_size) std::memcpy(d + off + hs, member, member_size);
  c->used = off + static_cast<uint32_t>(rec);
  ++c->live;
  if (fresh != nullptr) {
    if (grow) {
      for (uint32_t i = 0; i <= c->mask; ++i)
        if (c->table[i].used()) place(fresh, fresh_mask, c->table[i]);
      delete[] c->table;
      c->table = fresh;
      c->mask = fresh_mask;
      place(c->table, c->mask, Slot{hash(member, member_size), off + 1});
    } else {
      c->table = fresh;
      c->mask = fresh_mask;
      rebuild_table(*c);
    }
  } else if (c->table != nullptr) {
    place(c->table, c->mask, Slot{hash(member, member_size), off + 1});
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
  const uint32_t si = find_slot(g, prefix_hash, prefix, prefix_size);
  if (si == kNone) return false;
  Coll& c = *g.slots[si].coll;
  const uint32_t off = find_member(c, member, member_size);
  if (off == kNone) return false;
  erase_record(c, off);
  if (c.live == 0) {
    drop_coll(g, si);
  } else if (c.dead > c.live) {
    compact(g, si);
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
  const uint32_t si = find_slot(g, hash(prefix, prefix_size), prefix, prefix_size);
  if (si == kNone) return out;
  const Coll& c = *g.slots[si].coll;
  const uint8_t* d = c.data();
  out.reserve(c.live);
  for (uint32_t at = c.prefix_size; at < c.used;) {
    size_t hs = 0;
    bool erased = false;
    const uint32_t n = read_record(d + at, &hs, &erased);
    if (!erased) out.emplace_back(reinterpret_cast<const char*>(d + at + hs), n);
    at += static_cast<uint32_t>(hs) + n;
  }
  drop_coll(g, si);
  return out;
}

void CollectionIndex::clear() {
  for (Group& g : groups_) {
    for (GroupSlot& s : g.slots)
      if (s.used()) free_coll(s.coll);
    std::vector<GroupSlot>().swap(g.slots);
    g.count = 0;
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
  std::vector<Coll*> colls;
  ByteView out;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const int32_t kg = kg_start_ + static_cast<int32_t>(gi);
    Group& g = groups_[gi];
    if (g.count == 0) continue;
    StateMap& m = table.map(kg);
    // The collections first: dropping one moves other slots (backward shift).
    colls.clear();
    for (const GroupSlot& s : g.slots)
      if (s.used()) colls.push_back(s.coll);
    for (Coll* c : colls) {
      const uint8_t* d = c->data();
      for (uint32_t at = c->prefix_size; at < c->used;) {
        size_t hs = 0;
        bool erased = false;
        const uint32_t n = read_record(d + at, &hs, &erased);
        if (!erased) {
          key.assign(d, d + c->prefix_size);
          key.insert(key.end(), d + at + hs, d + at + hs + n);
          if (!m.get(key.data(), key.size(), &out)) {
            erase_record(*c, at);
            ++dropped;
          }
        }
        at += static_cast<uint32_t>(hs) + n;
      }
      if (c->live == 0) {
        drop_coll(g, slot_of(g, c));
      } else if (c->dead > c->live) {
        compact(g, slot_of(g, c));
      }
    }
  }
  return dropped;
}

size_t CollectionIndex::collections() const {
  size_t n = 0;
  for (const Group& g : groups_) n += g.count;
  return n;
}

size_t CollectionIndex::members() const {
  size_t n = 0;
  for (const Group& g : groups_)
    for (const GroupSlot& s : g.slots)
      if (s.used()) n += s.coll->live;
  return n;
}

size_t CollectionIndex::bytes() const {
  size_t b = sizeof(*this) + groups_.capacity() * sizeof(Group);
  for (const Group& g : groups_) {
    b += g.slots.capacity() * sizeof(GroupSlot);
    for (const GroupSlot& s : g.slots) {
      if (!s.used()) continue;
      b += sizeof(Coll) + s.coll->cap;
      if (s.coll->table != nullptr) b += (size_t{s.coll->mask} + 1) * sizeof(Slot);
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
    if ((g.slots.size() & (g.slots.size() - 1)) != 0)
      fail("I1 group table capacity not a power of two");
    for (const GroupSlot& s : g.slots) {
      if (!s.used()) continue;
      ++used_slots;
      const Coll& c = *s.coll;
      if (c.hash != s.hash) fail("I1 slot hash differs from its collection's");
      if (find_slot(g, c.hash, c.data(), c.prefix_size) == kNone ||
          g.slots[find_slot(g, c.hash, c.data(), c.prefix_size)].coll != s.coll)
        fail("I1 collection not found by its prefix");
      if (c.live == 0) fail("I2 empty collection kept");
      if (c.dead > c.live) fail("I3 more erased records than live ones");
      if (c.hash != hash(c.data(), c.prefix_size))
        fail("collection hash differs from its prefix's");
      uint32_t live = 0, dead = 0;
      uint32_t at = c.prefix_size;
      while (at < c.used) {
        size_t hs = 0;
        bool erased = false;
        const uint32_t n = read_record(c.data() + at, &hs, &erased);
        if (erased) {
          ++dead;
        } else {
          ++live;
          if (find_member(c, c.data() + at + hs, n) != at) fail("I4 live member not found");
        }
        at += static_cast<uint32_t>(hs) + n;
      }
      if (at != c.used || c.used > c.cap) fail("records overrun the block");
      if (live != c.live || dead != c.dead) fail("live/erased counts differ from the records");
      // Promoted past kSmallMembers; demoted by the first compaction at or below it.
      if (c.live > kSmallMembers && c.table == nullptr) fail("I4 large collection not promoted");
      if (c.table != nullptr && c.live <= kSmallMembers && c.dead == 0)
        fail("I4 compacted small collection kept its member table");
      if (c.table == nullptr) continue;
      uint32_t slots = 0;
      for (uint32_t i = 0; i <= c.mask; ++i) {
        if (!c.table[i].used()) continue;
        ++slots;
        size_t hs = 0;
        bool erased = false;
        read_record(c.data() + c.table[i].ref - 1, &hs, &erased);
        if (erased) fail("I4 member table slot of an erased record");
      }
      if (slots != c.live) fail("I4 member table slots != live members");
      if (size_t{slots} * 4 > (size_t{c.mask} + 1) * 3) fail("I4 member table load above 3/4");
    }
    if (used_slots != g.count) fail("I1 slots != collections");
    if (used_slots * 4 > g.slots.size() * 3) fail("I1 group table load above 3/4");
  }
}

}  // namespace statecore
