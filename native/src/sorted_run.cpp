// Flat sorted runs and their builder (design: sorted_run.h).
#include "statecore/sorted_run.h"

#include "statecore/detail/bytes.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace statecore {

bool key_less(ByteView a, ByteView b) { return key_compare(a, b) < 0; }

bool key_equal(ByteView a, ByteView b) {
  return a.size == b.size && (a.size == 0 || std::memcmp(a.data, b.data, a.size) == 0);
}

namespace {

using Slot = SortedRunBuilder::Slot;
using Small = SortedRunBuilder::Small;

bool words_less(const Slot& a, const Slot& b) { return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo; }

// A small record's key size, value size and tombstone flag (Small::meta).
constexpr uint64_t kKeySizeMask = 0xff;
constexpr int kValueSizeShift = 8;  // as SortedRunBuilder::add packs it

uint64_t small_key_size(const Small& x) { return x.meta & kKeySizeMask; }
uint64_t small_value_size(const Small& x) { return (x.meta >> kValueSizeShift) & kKeySizeMask; }

// key_less for keys of up to 16 bytes: their words, then the shorter first (a zero pad and a
// zero byte give equal words).
bool small_less(const Small& a, const Small& b) {
  if (a.hi != b.hi) return a.hi < b.hi;
  if (a.lo != b.lo) return a.lo < b.lo;
  return small_key_size(a) < small_key_size(b);
}

bool small_same_key(const Small& a, const Small& b) {
  return a.hi == b.hi && a.lo == b.lo && small_key_size(a) == small_key_size(b);
}

// Beyond this many differing bytes a comparison sort wins (radix: one pass per byte).
constexpr int kMaxRadixPasses = 8;
constexpr size_t kMinRadixSize = 256;

// Sorts records by kWords 64-bit words (word(x, 0) least significant): LSD radix over only the
// bytes that differ between records, std::sort with `less` when too many do or too few records.
template <class R, int kWords, class Word, class Less>
void sort_by_words(std::vector<R>& s, std::vector<R>& tmp, Word word, Less less) {
  uint64_t differ[kWords];
  for (int w = 0; w < kWords; ++w) {
    uint64_t and_w = ~uint64_t{0}, or_w = 0;
    for (const R& x : s) {
      and_w &= word(x, w);
      or_w |= word(x, w);
    }
    differ[w] = and_w ^ or_w;
  }
  int passes = 0;
  for (uint64_t d : differ)
    for (int shift = 0; shift < 64; shift += 8) passes += ((d >> shift) & 0xff) != 0;
  if (s.size() < kMinRadixSize || passes > kMaxRadixPasses) {
    std::sort(s.begin(), s.end(), less);
    return;
  }
  tmp.resize(s.size());
  for (int w = 0; w < kWords; ++w) {
    for (int shift = 0; shift < 64; shift += 8) {
      if (((differ[w] >> shift) & 0xff) == 0) continue;
      size_t count[256] = {};
      for (const R& x : s) ++count[(word(x, w) >> shift) & 0xff];
      size_t sum = 0;
      for (size_t& c : count) {
        size_t here = c;
        c = sum;
        sum += here;
      }
      for (const R& x : s) tmp[count[(word(x, w) >> shift) & 0xff]++] = x;
      s.swap(tmp);
    }
  }
}

void sort_words(std::vector<Slot>& s, std::vector<Slot>& tmp) {
  sort_by_words<Slot, 2>(s, tmp, [](const Slot& x, int w) { return w ? x.hi : x.lo; }, words_less);
}

void sort_small(std::vector<Small>& s, std::vector<Small>& tmp) {
  sort_by_words<Small, 3>(
      s, tmp,
      [](const Small& x, int w) { return w == 2   ? x.hi
                                         : w == 1 ? x.lo
                                                  : small_key_size(x); },
      small_less);
}

// The key bytes of a small record: its words big-endian, cut to the key size.
void small_key_bytes(const Small& x, uint8_t out[16]) {
  detail::store_u64(out, __builtin_bswap64(x.hi));
  detail::store_u64(out + 8, __builtin_bswap64(x.lo));
}

}  // namespace

void SortedRunBuilder::reserve(size_t entries, size_t key_bytes, size_t value_bytes) {
  small_.reserve(entries);
  slots_.reserve(entries);
  key_offsets_.reserve(entries + 1);
  value_offsets_.reserve(entries + 1);
  if (key_data_.size() < key_bytes) key_data_.resize(key_bytes);
  if (value_data_.size() < value_bytes) value_data_.resize(value_bytes);
}

namespace {

// Appends `n` bytes at `used` of a staging vector grown (never shrunk) geometrically; returns
// the new used size.
inline uint64_t stage_bytes(std::vector<uint8_t>& v, uint64_t used, const uint8_t* p, size_t n) {
  if (v.size() - used < n) v.resize(std::max<size_t>(2 * v.size(), used + n + 64));
  detail::copy_small(v.data() + used, p, n);
  return used + n;
}

// Writes a finished run into `out`: buffers sized once for `n` entries and `key_bytes` /
// `value_bytes` (upper bounds when `unique` drops entries), trimmed by done() to what entry()
// recorded. The caller copies entry i's bytes to kd + kpos / vd + vpos, then calls entry().
struct RunWriter {
  SortedRun& out;
  const bool tombstones;
  uint8_t* kd;
  uint8_t* vd;
  uint64_t kpos = 0, vpos = 0;
  size_t m = 0;

  RunWriter(SortedRun& o, size_t n, uint64_t key_bytes, uint64_t value_bytes, bool has_tombstones)
      : out(o), tombstones(has_tombstones) {
    out.key_offsets.resize(n + 1);
    out.value_offsets.resize(n + 1);
    out.key_data.resize(key_bytes);
    out.value_data.resize(value_bytes);
    out.key_offsets[0] = out.value_offsets[0] = 0;
    out.valid.clear();
    if (tombstones) out.valid.resize(n);
    kd = out.key_data.data();
    vd = out.value_data.data();
  }
  void entry(uint64_t kn, uint64_t vn, bool removed) {
    kpos += kn;
    vpos += vn;
    if (tombstones) out.valid[m] = removed ? 0 : 1;
    ++m;
    out.key_offsets[m] = kpos;
    out.value_offsets[m] = vpos;
  }
  void done() {
    out.key_offsets.resize(m + 1);
    out.value_offsets.resize(m + 1);
    out.key_data.resize(kpos);
    out.value_data.resize(vpos);
    if (tombstones) out.valid.resize(m);
  }
};

}  // namespace

void SortedRunBuilder::add_staged(uint64_t hi, uint64_t lo, ByteView key, ByteView value,
                                  bool removed) {
  if (!staged_) stage_small();
  stage(hi, lo, key, value, removed);
  tombstones_ += removed;
}

void SortedRunBuilder::stage(uint64_t hi, uint64_t lo, ByteView key, ByteView value, bool removed) {
  const uint64_t index = key_offsets_.size() - 1;
  slots_.push_back({hi, lo, index | (removed ? kRemovedBit : 0)});
  key_offsets_.push_back(stage_bytes(key_data_, key_offsets_.back(), key.data, key.size));
  value_offsets_.push_back(stage_bytes(value_data_, value_offsets_.back(), value.data, value.size));
}

void SortedRunBuilder::stage_small() {
  staged_ = true;
  uint8_t kb[16];
  for (const Small& x : small_) {
    small_key_bytes(x, kb);
    stage(x.hi, x.lo, ByteView{kb, static_cast<size_t>(small_key_size(x))},
          ByteView{reinterpret_cast<const uint8_t*>(&x.value),
                   static_cast<size_t>(small_value_size(x))},
          (x.meta & kRemovedBit) != 0);
  }
  small_.clear();
}

void SortedRunBuilder::finish_small(bool unique, SortedRun& out) {
  sort_small(small_, small_tmp_);
  const size_t n = small_.size();
  // 16 bytes of slack let every key and value be written as whole words.
  RunWriter w(out, n, small_key_bytes_ + 16, small_value_bytes_ + 16, tombstones_ != 0);
  for (size_t i = 0; i < n; ++i) {
    const Small& x = small_[i];
    if (unique && i > 0 && small_same_key(x, small_[i - 1])) continue;
    small_key_bytes(x, w.kd + w.kpos);
    detail::store_u64(w.vd + w.vpos, x.value);
    w.entry(small_key_size(x), small_value_size(x), (x.meta & kRemovedBit) != 0);
  }
  w.done();
}

SortedRun SortedRunBuilder::finish(bool unique) {
  SortedRun out;
  finish(unique, out);
  return out;
}

void SortedRunBuilder::finish(bool unique, SortedRun& out) {
  if (!staged_) {
    finish_small(unique, out);
    clear();
    return;
  }
  sort_words(slots_, radix_tmp_);
  auto key_at = [this](const Slot& s) {
    const uint64_t i = s.index & ~kRemovedBit;
    return ByteView{key_data_.data() + key_offsets_[i],
                    static_cast<size_t>(key_offsets_[i + 1] - key_offsets_[i])};
  };
  // Equal words: keys longer than 16 bytes sharing their first 16, or equal keys.
  for (size_t i = 0; i < slots_.size();) {
    size_t j = i + 1;
    while (j < slots_.size() && slots_[j].hi == slots_[i].hi && slots_[j].lo == slots_[i].lo) ++j;
    if (j - i > 1) {
      std::sort(slots_.begin() + static_cast<std::ptrdiff_t>(i),
                slots_.begin() + static_cast<std::ptrdiff_t>(j),
                [&key_at](const Slot& a, const Slot& b) { return key_less(key_at(a), key_at(b)); });
    }
    i = j;
  }
  RunWriter w(out, slots_.size(), key_offsets_.back(), value_offsets_.back(), tombstones_ != 0);
  for (size_t i = 0; i < slots_.size(); ++i) {
    const uint64_t at = slots_[i].index & ~kRemovedBit;
    const uint64_t k0 = key_offsets_[at], kn = key_offsets_[at + 1] - k0;
    // Different words are different keys; only equal words need the bytes compared.
    if (unique && i > 0 && slots_[i].hi == slots_[i - 1].hi && slots_[i].lo == slots_[i - 1].lo &&
        key_equal(key_at(slots_[i]), key_at(slots_[i - 1])))
      continue;
    const uint64_t v0 = value_offsets_[at], vn = value_offsets_[at + 1] - v0;
    detail::copy_small(w.kd + w.kpos, key_data_.data() + k0, kn);
    detail::copy_small(w.vd + w.vpos, value_data_.data() + v0, vn);
    w.entry(kn, vn, (slots_[i].index & kRemovedBit) != 0);
  }
  w.done();
  clear();
}

void SortedRunBuilder::clear() {
  key_offsets_.assign(1, 0);  // the data vectors keep their bytes as spare room
  value_offsets_.assign(1, 0);
  tombstones_ = 0;
  slots_.clear();
  small_.clear();
  small_key_bytes_ = small_value_bytes_ = 0;
  staged_ = false;
}

int64_t first_bad_offset(const int32_t* o, size_t n, size_t data_size) {
  if (n == 0) return -1;
  if (o[0] < 0) return 0;
  // Blocks OR-reduced without a branch (GCC vectorizes them; the early-exit loop it cannot),
  // searched only when one holds a decrease: a catch-up checks ~200k offsets several times.
  constexpr size_t kBlock = 1024;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = b + kBlock < n ? b + kBlock : n;
    int decreases = 0;
    for (size_t i = b; i < e; ++i) decreases |= o[i + 1] < o[i];
    if (decreases)
      for (size_t i = b; i < e; ++i)
        if (o[i + 1] < o[i]) return static_cast<int64_t>(i + 1);
  }
  return static_cast<size_t>(o[n]) > data_size ? static_cast<int64_t>(n) : -1;
}

namespace {

void check_offsets(const int32_t* offsets, size_t n, size_t data_size, size_t run,
                   const char* what) {
  if (n == 0) return;
  if (offsets == nullptr) throw std::invalid_argument("merge_newest_wins: null offsets");
  const int64_t bad = first_bad_offset(offsets, n, data_size);
  if (bad < 0) return;
  const std::string where = "merge_newest_wins: run " + std::to_string(run) + ": ";
  if (bad == 0) throw std::invalid_argument(where + "negative " + what + " offset");
  if (offsets[bad] < offsets[bad - 1])
    throw std::invalid_argument(where + what + " offsets decrease at entry " +
                                std::to_string(bad - 1));
  throw std::invalid_argument(where + what + " offsets point past the data");
}

inline ByteView run_key(const ArrowBinaryRun& r, size_t i) {
  return {r.key_data + r.key_offsets[i],
          static_cast<size_t>(r.key_offsets[i + 1] - r.key_offsets[i])};
}

inline bool is_tombstone(const ArrowBinaryRun& r, size_t i) {
  if (r.validity == nullptr) return false;
  uint64_t bit = static_cast<uint64_t>(r.validity_bit) + i;
  return ((r.validity[bit >> 3] >> (bit & 7)) & 1u) == 0;
}

}  // namespace

void merge_newest_wins(const std::vector<ArrowBinaryRun>& runs, std::vector<RunPick>* out,
                       bool keep_tombstones) {
  constexpr size_t kMax = std::numeric_limits<uint32_t>::max();
  if (runs.size() > kMax) throw std::invalid_argument("merge_newest_wins: too many runs");
  size_t total = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    const ArrowBinaryRun& run = runs[r];
    if (run.size > kMax) throw std::invalid_argument("merge_newest_wins: run too large");
    check_offsets(run.key_offsets, run.size, run.key_data_size, r, "key");
    check_offsets(run.value_offsets, run.size, run.value_data_size, r, "value");
    if (run.size && run.key_data == nullptr && run.key_offsets[run.size] > run.key_offsets[0]) {
      throw std::invalid_argument("merge_newest_wins: null key data");
    }
    total += run.size;
  }
  // Heads of the runs still holding entries: a linear scan per key beats a heap for the few
  // runs of a chain (max_runs, default 8), and needs no indirection. Each head caches its
  // key's first 16 bytes as two big-endian words, so comparing heads is mostly two integer
  // comparisons (an int64 key with its key-group prefix and namespace fits in them).
  struct Head {
    uint64_t hi, lo;
    ByteView key;
    uint32_t run;
    size_t pos;
  };
  auto load = [&runs](Head& h) {
    h.key = run_key(runs[h.run], h.pos);
    SortedRunBuilder::key_words(h.key.data, h.key.size, &h.hi, &h.lo);
  };
  auto compare = [](const Head& a, const Head& b) -> int {
    if (a.hi != b.hi) return a.hi < b.hi ? -1 : 1;
    if (a.lo != b.lo) return a.lo < b.lo ? -1 : 1;
    // Equal words: keys of up to 16 bytes differ only in length (zero padding sorts first,
    // as a shorter key before its extensions); longer ones need their remaining bytes.
    if (a.key.size <= 16 && b.key.size <= 16) {
      return a.key.size == b.key.size ? 0 : (a.key.size < b.key.size ? -1 : 1);
    }
    return key_compare(a.key, b.key);
  };
  std::vector<Head> live;
  for (size_t r = 0; r < runs.size(); ++r) {
    if (!runs[r].size) continue;
    Head h{0, 0, {}, static_cast<uint32_t>(r), 0};
    load(h);
    live.push_back(h);
  }
  out->reserve(out->size() + total);
  while (!live.empty()) {
    // The smallest head key; on a tie the newest run (lowest index, live is ascending) wins.
    size_t best = 0;
    for (size_t j = 1; j < live.size(); ++j) {
      if (compare(live[j], live[best]) < 0) best = j;
    }
    const Head top = live[best];
    if (keep_tombstones || !is_tombstone(runs[top.run], top.pos)) {
      out->push_back({top.run, static_cast<uint32_t>(top.pos)});
    }
    // Advance every run whose head is this key (older versions of it are overwritten), checking
    // that each run's next key is larger: the merge is only right on strictly ascending runs.
    size_t kept = 0;
    for (size_t j = 0; j < live.size(); ++j) {
      Head h = live[j];
      if (j == best || compare(h, top) == 0) {
        const Head prev = h;
        if (++h.pos == runs[h.run].size) continue;
        load(h);
        if (compare(h, prev) <= 0) {
          throw std::invalid_argument("merge_newest_wins: run " + std::to_string(h.run) +
                                      ": keys not strictly ascending at entry " +
                                      std::to_string(h.pos));
        }
      }
      live[kept++] = h;
    }
    live.resize(kept);
  }
}

}  // namespace statecore
