#include "statecore/payload_lookup.h"

#include <algorithm>
#include <cstring>

#include "statecore/detail/bytes.h"
#include "statecore/sorted_run.h"

namespace statecore {

using detail::load_le32;

PayloadView PayloadView::of(const uint8_t* p, size_t size, bool has_validity) {
  PayloadView v;
  v.entries = load_le32(p);
  const size_t n = v.entries;
  v.key_offsets = p + 4;
  v.value_offsets = p + 4 + 4 * (n + 1);
  v.key_data = p + 4 + 8 * (n + 1);
  v.value_data = v.key_data + load_le32(v.key_offsets + 4 * n);
  const uint8_t* end = v.value_data + load_le32(v.value_offsets + 4 * n);
  v.validity = has_validity && end < p + size ? end : nullptr;
  return v;
}

uint32_t PayloadView::key_offset(int64_t row) const {
  return load_le32(key_offsets + 4 * static_cast<size_t>(row));
}

uint32_t PayloadView::value_offset(int64_t row) const {
  return load_le32(value_offsets + 4 * static_cast<size_t>(row));
}

int64_t PayloadView::find(const uint8_t* key, size_t key_size) const {
  int64_t lo = 0, hi = entries;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    const uint32_t a = key_offset(mid);
    const size_t len = key_offset(mid + 1) - a;
    const int c = key_compare(ByteView{key_data + a, len}, ByteView{key, key_size});
    if (c == 0) return mid;
    if (c < 0) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return -1;
}

bool PayloadView::has_value(int64_t row) const {
  return validity == nullptr || ((validity[row >> 3] >> (row & 7)) & 1);
}

int64_t open_blocks_into(const uint8_t* data, size_t size, const StoredBlockRef* blocks,
                         size_t count, bool has_validity, const uint8_t* const* last_keys,
                         const size_t* last_key_sizes, uint8_t* const* out, std::string* why) {
  for (size_t b = 0; b < count; ++b) {
    std::string bad = open_block_into(data, size, blocks[b], has_validity, out[b]);
    if (bad.empty()) {
      const PayloadView v = PayloadView::of(out[b], blocks[b].raw_length, has_validity);
      // An empty block has no last key to match the footer's (format.py writes none).
      bool same = v.entries > 0;
      if (same) {
        const uint32_t a = v.key_offset(v.entries - 1);
        const size_t len = v.key_offset(v.entries) - a;
        same = len == last_key_sizes[b] &&
               (len == 0 || std::memcmp(v.key_data + a, last_keys[b], len) == 0);
      }
      if (!same) bad = "last key differs from the footer's";
    }
    if (!bad.empty()) {
      if (why) *why = std::move(bad);
      return static_cast<int64_t>(b);
    }
  }
  return -1;
}

}  // namespace statecore
