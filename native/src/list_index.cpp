// Sequence numbers of the chunks of lists (contract: list_index.h).
#include "statecore/list_index.h"

#include <algorithm>
#include <stdexcept>

namespace statecore {

namespace {

std::string bytes_of(const uint8_t* p, size_t n) {
  if (p == nullptr && n != 0) throw std::invalid_argument("list index: null bytes");
  return n ? std::string(reinterpret_cast<const char*>(p), n) : std::string();
}

}  // namespace

ListIndex::ListIndex(int32_t kg_start, int32_t kg_end) : kg_start_(kg_start), kg_end_(kg_end) {
  if (kg_start < 0 || kg_end < kg_start || kg_end >= 32768)
    throw std::invalid_argument("list index: key groups [" + std::to_string(kg_start) + ", " +
                                std::to_string(kg_end) + "] outside [0, 32767]");
  groups_.resize(static_cast<size_t>(kg_end - kg_start + 1));
}

ListIndex::Group& ListIndex::group(int32_t kg) {
  if (kg < kg_start_ || kg > kg_end_)
    throw std::out_of_range("list index: key group " + std::to_string(kg) + " outside [" +
                            std::to_string(kg_start_) + ", " + std::to_string(kg_end_) + "]");
  return groups_[static_cast<size_t>(kg - kg_start_)];
}

const ListIndex::Group& ListIndex::group(int32_t kg) const {
  return const_cast<ListIndex*>(this)->group(kg);
}

const ListIndex::List* ListIndex::find(int32_t kg, const uint8_t* prefix,
                                       size_t prefix_size) const {
  const Group& g = group(kg);
  if (g.empty()) return nullptr;  // the common case of small lists: no key to build or hash
  auto it = g.find(bytes_of(prefix, prefix_size));
  return it == g.end() ? nullptr : &it->second;
}

void ListIndex::compact(List& l) {
  size_t w = 0;
  for (size_t i = 0; i < l.seqs.size(); ++i)
    if (!l.erased[i]) l.seqs[w++] = l.seqs[i];
  l.seqs.resize(w);
  l.erased.assign(w, false);
  l.dead = 0;
}

bool ListIndex::last(int32_t kg, const uint8_t* prefix, size_t prefix_size, uint64_t* last) const {
  const List* l = find(kg, prefix, prefix_size);
  if (l == nullptr) return false;
  *last = l->seqs.back();  // the last slot is live
  return true;
}

bool ListIndex::insert(int32_t kg, const uint8_t* prefix, size_t prefix_size, uint64_t seq) {
  if (seq == UINT64_MAX) throw std::length_error("list index: sequence number 2^64 - 1");
  Group& g = group(kg);
  std::string key = bytes_of(prefix, prefix_size);
  auto found = g.find(key);
  if (found == g.end()) {
    if (seq == 0) return false;  // chunk 0 alone: unlisted
    List& l = g[std::move(key)];
    l.seqs = {0, seq};  // chunk 0 may exist: a reader unlists it when it does not
    l.erased = {false, false};
    return true;
  }
  List& l = found->second;
  if (seq > l.seqs.back()) {
    l.seqs.push_back(seq);
    l.erased.push_back(false);
    return true;
  }
  auto it = std::lower_bound(l.seqs.begin(), l.seqs.end(), seq);
  const size_t i = static_cast<size_t>(it - l.seqs.begin());
  if (it != l.seqs.end() && *it == seq) {
    if (!l.erased[i]) return false;
    l.erased[i] = false;
    --l.dead;
    return true;
  }
  // Below listed ones (a change set writing a chunk its base had removed): in sequence order.
  l.seqs.insert(it, seq);
  l.erased.insert(l.erased.begin() + static_cast<std::ptrdiff_t>(i), false);
  return true;
}

bool ListIndex::erase_in(List& l, uint64_t seq) {
  auto it = std::lower_bound(l.seqs.begin(), l.seqs.end(), seq);
  if (it == l.seqs.end() || *it != seq) return false;
  const size_t i = static_cast<size_t>(it - l.seqs.begin());
  if (l.erased[i]) return false;
  l.erased[i] = true;
  ++l.dead;
  return true;
}

void ListIndex::settle(List& l) {
  while (!l.seqs.empty() && l.erased.back()) {
    l.seqs.pop_back();
    l.erased.pop_back();
    --l.dead;
  }
  if (l.dead > l.live()) compact(l);
}

bool ListIndex::erase(int32_t kg, const uint8_t* prefix, size_t prefix_size, uint64_t seq) {
  Group& g = group(kg);
  auto it = g.find(bytes_of(prefix, prefix_size));
  if (it == g.end() || !erase_in(it->second, seq)) return false;
  List& l = it->second;
  settle(l);
  if (l.live() == 0 || (l.live() == 1 && l.seqs.back() == 0)) g.erase(it);
  return true;
}

size_t ListIndex::size(int32_t kg, const uint8_t* prefix, size_t prefix_size) const {
  const List* l = find(kg, prefix, prefix_size);
  return l == nullptr ? 0 : l->live();
}

std::vector<uint64_t> ListIndex::seqs(int32_t kg, const uint8_t* prefix, size_t prefix_size) const {
  std::vector<uint64_t> out;
  const List* l = find(kg, prefix, prefix_size);
  if (l == nullptr) return out;
  out.reserve(l->live());
  for_each(kg, prefix, prefix_size, [&](uint64_t s) { out.push_back(s); });
  return out;
}

void ListIndex::chunks(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                       std::vector<uint64_t>& out) const {
  out.clear();
  const List* l = find(kg, prefix, prefix_size);
  if (l == nullptr) {
    out.push_back(0);
    return;
  }
  out.reserve(l->live());
  for (size_t i = 0; i < l->seqs.size(); ++i)
    if (!l->erased[i]) out.push_back(l->seqs[i]);
}

std::vector<uint64_t> ListIndex::take(int32_t kg, const uint8_t* prefix, size_t prefix_size) {
  std::vector<uint64_t> out;
  chunks(kg, prefix, prefix_size, out);
  Group& g = group(kg);
  auto it = g.find(bytes_of(prefix, prefix_size));
  if (it != g.end()) g.erase(it);
  return out;
}

void ListIndex::clear() {
  for (Group& g : groups_) g.clear();
}

template <bool kInsert>
void ListIndex::apply_entry_keys(const uint8_t* data, const int32_t* off, int64_t n,
                                 int prefix_width) {
  if (prefix_width != 1 && prefix_width != 2)
    throw std::invalid_argument("list index: key-group prefix width must be 1 or 2");
  std::vector<int32_t> kgs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* k = data + off[i];
    const size_t ks = static_cast<size_t>(off[i + 1] - off[i]);
    if (ks <= static_cast<size_t>(prefix_width) + kListSeqBytes)
      throw std::invalid_argument("list index: entry key of " + std::to_string(ks) +
                                  " bytes has no (key, namespace) part and sequence number");
    const int32_t kg = prefix_width == 1 ? k[0] : (k[0] << 8) | k[1];
    group(kg);  // range check before any change
    kgs[static_cast<size_t>(i)] = kg;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* k = data + off[i];
    const size_t ps = static_cast<size_t>(off[i + 1] - off[i]) - kListSeqBytes;
    const uint64_t seq = load_list_seq(k + ps);
    if (kInsert) insert(kgs[static_cast<size_t>(i)], k, ps, seq);
    else erase(kgs[static_cast<size_t>(i)], k, ps, seq);
  }
}

void ListIndex::insert_entry_keys(const uint8_t* data, const int32_t* off, int64_t n,
                                  int prefix_width) {
  apply_entry_keys<true>(data, off, n, prefix_width);
}

void ListIndex::erase_entry_keys(const uint8_t* data, const int32_t* off, int64_t n,
                                 int prefix_width) {
  apply_entry_keys<false>(data, off, n, prefix_width);
}

void ListIndex::erase_entry_keys(const std::vector<std::string>& keys, int prefix_width) {
  for (const std::string& k : keys) {
    if (k.size() <= static_cast<size_t>(prefix_width) + kListSeqBytes) continue;
    const auto* p = reinterpret_cast<const uint8_t*>(k.data());
    const int32_t kg = prefix_width == 1 ? p[0] : (p[0] << 8) | p[1];
    if (kg < kg_start_ || kg > kg_end_) continue;
    const size_t ps = k.size() - kListSeqBytes;
    erase(kg, p, ps, load_list_seq(p + ps));
  }
}

size_t ListIndex::prune(StateTable& table) {
  size_t dropped = 0;
  std::vector<uint8_t> key;
  ByteView out;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const int32_t kg = kg_start_ + static_cast<int32_t>(gi);
    Group& g = groups_[gi];
    StateMap& m = table.map(kg);
    for (auto it = g.begin(); it != g.end();) {
      List& l = it->second;
      const std::string& prefix = it->first;
      key.assign(prefix.begin(), prefix.end());
      key.resize(prefix.size() + kListSeqBytes);
      for (size_t i = 0; i < l.seqs.size(); ++i) {
        if (l.erased[i]) continue;
        store_list_seq(key.data() + prefix.size(), l.seqs[i]);
        if (m.get(key.data(), key.size(), &out)) continue;
        l.erased[i] = true;
        ++l.dead;
        ++dropped;
      }
      settle(l);
      if (l.live() == 0 || (l.live() == 1 && l.seqs.back() == 0)) {
        it = g.erase(it);
        continue;
      }
      ++it;
    }
  }
  return dropped;
}

size_t ListIndex::lists() const {
  size_t n = 0;
  for (const Group& g : groups_) n += g.size();
  return n;
}

size_t ListIndex::chunks() const {
  size_t n = 0;
  for (const Group& g : groups_)
    for (const auto& kv : g) n += kv.second.live();
  return n;
}

size_t ListIndex::bytes() const {
  auto heap = [](const std::string& s) { return s.size() > 15 ? s.size() + 1 : 0; };
  size_t b = groups_.size() * sizeof(Group);
  for (const Group& g : groups_) {
    b += g.bucket_count() * sizeof(void*);
    for (const auto& kv : g) {
      b += 2 * sizeof(void*) + sizeof(std::string) + sizeof(List) + heap(kv.first);
      b += kv.second.seqs.capacity() * sizeof(uint64_t) + kv.second.erased.capacity() / 8;
    }
  }
  return b;
}

}  // namespace statecore
