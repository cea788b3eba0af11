// Members of collections stored one entry per member (contract: collection_index.h).
#include "statecore/collection_index.h"

#include <stdexcept>

#include "statecore/key_codec.h"

namespace statecore {

namespace {

std::string bytes_of(const uint8_t* p, size_t n) {
  if (p == nullptr && n != 0) throw std::invalid_argument("collection index: null bytes");
  return n ? std::string(reinterpret_cast<const char*>(p), n) : std::string();
}

}  // namespace

CollectionIndex::CollectionIndex(int32_t kg_start, int32_t kg_end)
    : kg_start_(kg_start), kg_end_(kg_end) {
  if (kg_start < 0 || kg_end < kg_start || kg_end >= 32768)
    throw std::invalid_argument("collection index: key groups [" + std::to_string(kg_start) + ", " +
                                std::to_string(kg_end) + "] outside [0, 32767]");
  groups_.resize(static_cast<size_t>(kg_end - kg_start + 1));
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

void CollectionIndex::compact(Collection& c) {
  std::vector<const std::string*> live;
  live.reserve(c.pos.size());
  for (const std::string* m : c.order)
    if (m != nullptr) live.push_back(m);
  c.order.swap(live);
  for (size_t i = 0; i < c.order.size(); ++i)
    c.pos.find(*c.order[i])->second = static_cast<uint32_t>(i);
  c.dead = 0;
}

bool CollectionIndex::insert(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                             const uint8_t* member, size_t member_size) {
  Group& g = group(kg);
  Collection& c = g[bytes_of(prefix, prefix_size)];
  std::string m = bytes_of(member, member_size);
  // find first: emplace would allocate a node for a member that is listed already.
  if (c.pos.find(m) != c.pos.end()) return false;
  auto it = c.pos.emplace(std::move(m), 0).first;
  if (c.order.size() >= UINT32_MAX) {
    c.pos.erase(it);
    throw std::length_error("collection index: more than 2^32 - 1 members in one collection");
  }
  it->second = static_cast<uint32_t>(c.order.size());
  // Keys of unordered_map nodes stay where they are through rehashes: the slot points at it.
  c.order.push_back(&it->first);
  return true;
}

bool CollectionIndex::erase(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                            const uint8_t* member, size_t member_size) {
  Group& g = group(kg);
  auto cit = g.find(bytes_of(prefix, prefix_size));
  if (cit == g.end()) return false;
  Collection& c = cit->second;
  auto it = c.pos.find(bytes_of(member, member_size));
  if (it == c.pos.end()) return false;
  c.order[it->second] = nullptr;
  c.pos.erase(it);
  ++c.dead;
  if (c.pos.empty()) {
    g.erase(cit);
  } else if (c.dead > c.pos.size()) {
    compact(c);
  }
  return true;
}

bool CollectionIndex::contains(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                               const uint8_t* member, size_t member_size) const {
  const Group& g = group(kg);
  auto cit = g.find(bytes_of(prefix, prefix_size));
  return cit != g.end() && cit->second.pos.count(bytes_of(member, member_size)) != 0;
}

size_t CollectionIndex::size(int32_t kg, const uint8_t* prefix, size_t prefix_size) const {
  const Group& g = group(kg);
  auto cit = g.find(bytes_of(prefix, prefix_size));
  return cit == g.end() ? 0 : cit->second.pos.size();
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
  std::vector<std::string> out;
  auto cit = g.find(bytes_of(prefix, prefix_size));
  if (cit == g.end()) return out;
  out.reserve(cit->second.pos.size());
  for (const std::string* m : cit->second.order)
    if (m != nullptr) out.push_back(*m);
  g.erase(cit);
  return out;
}

void CollectionIndex::clear() {
  for (Group& g : groups_) Group().swap(g);
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
    StateMap& m = table.map(kg);
    for (auto cit = g.begin(); cit != g.end();) {
      Collection& c = cit->second;
      const std::string& prefix = cit->first;
      for (auto it = c.pos.begin(); it != c.pos.end();) {
        key.assign(prefix.begin(), prefix.end());
        key.insert(key.end(), it->first.begin(), it->first.end());
        if (m.get(key.data(), key.size(), &out)) {
          ++it;
          continue;
        }
        c.order[it->second] = nullptr;
        ++c.dead;
        it = c.pos.erase(it);
        ++dropped;
      }
      if (c.pos.empty()) {
        cit = g.erase(cit);
        continue;
      }
      if (c.dead > c.pos.size()) compact(c);
      ++cit;
    }
  }
  return dropped;
}

size_t CollectionIndex::collections() const {
  size_t n = 0;
  for (const Group& g : groups_) n += g.size();
  return n;
}

size_t CollectionIndex::members() const {
  size_t n = 0;
  for (const Group& g : groups_)
    for (const auto& kv : g) n += kv.second.pos.size();
  return n;
}

size_t CollectionIndex::bytes() const {
  // A hash node: the next pointer, the cached hash, the key string and the value, rounded to a
  // malloc chunk; a string's heap buffer only past its small-string capacity (15 bytes).
  auto heap = [](const std::string& s) { return s.size() > 15 ? s.size() + 1 : 0; };
  size_t b = groups_.size() * sizeof(Group);
  for (const Group& g : groups_) {
    b += g.bucket_count() * sizeof(void*);
    for (const auto& kv : g) {
      const Collection& c = kv.second;
      b += 2 * sizeof(void*) + sizeof(std::string) + sizeof(Collection) + heap(kv.first);
      b += c.pos.bucket_count() * sizeof(void*) + c.order.capacity() * sizeof(void*);
      for (const auto& m : c.pos)
        b += 2 * sizeof(void*) + sizeof(std::string) + sizeof(uint32_t) + heap(m.first);
    }
  }
  return b;
}

}  // namespace statecore
