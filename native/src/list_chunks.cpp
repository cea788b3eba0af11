// Appends to chunked lists (contract: list_chunks.h).
#include "statecore/list_chunks.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "statecore/key_codec.h"

namespace statecore {

size_t list_chunk_count(const uint8_t* value, size_t size, size_t width, size_t suffix) {
  if (width != 0) {
    const size_t stride = width + suffix;
    if (size % stride != 0)
      throw std::invalid_argument("list chunk of " + std::to_string(size) +
                                  " bytes is not a whole number of " + std::to_string(stride) +
                                  "-byte elements");
    return size / stride;
  }
  size_t n = 0, pos = 0;
  while (pos < size) {
    uint64_t len = 0;
    const size_t used = read_varlen(value + pos, size - pos, &len);
    if (used == 0 || len > size - pos - used || suffix > size - pos - used - len)
      throw std::invalid_argument("list chunk element " + std::to_string(n) +
                                  " runs past the chunk's end");
    pos += used + static_cast<size_t>(len) + suffix;
    ++n;
  }
  return n;
}

void list_append_encoded(StateMap& m, ListIndex& index, int32_t kg, const uint8_t* prefix,
                         size_t prefix_size, const uint8_t* data, const size_t* ends, size_t n,
                         size_t width, size_t suffix, std::vector<uint8_t>& key,
                         const uint32_t* chunk0_hash, const uint8_t* chunk0_key) {
  if (n == 0) return;
  uint64_t seq = 0;
  const bool listed = index.last(kg, prefix, prefix_size, &seq);  // unlisted: chunk 0
  key.assign(prefix, prefix + prefix_size);
  key.resize(prefix_size + kListSeqBytes);
  store_list_seq(key.data() + prefix_size, seq);
  const bool ahead = !listed && chunk0_hash != nullptr;
  uint32_t h = ahead ? *chunk0_hash : m.hash(key.data(), key.size());
  // The bytes the lookups read: the kernel's copy of chunk 0's key, else `key`.
  const uint8_t* k = ahead && chunk0_key != nullptr ? chunk0_key : key.data();
  size_t have = 0;
  ByteView v;
  if (m.get_hashed(h, k, key.size(), &v)) have = list_chunk_count(v.data, v.size, width, suffix);
  size_t i = 0;
  while (i < n) {
    if (have >= kListChunkElements) {
      if (seq >= UINT64_MAX - 1)
        throw std::length_error("list append: chunk sequence numbers of one list exhausted");
      ++seq;
      index.insert(kg, prefix, prefix_size, seq);
      store_list_seq(key.data() + prefix_size, seq);
      h = m.hash(key.data(), key.size());
      k = key.data();
      have = 0;
    }
    const size_t take = std::min(n - i, kListChunkElements - have);
    const size_t start = i == 0 ? 0 : ends[i - 1];
    const size_t bytes = ends[i + take - 1] - start;
    size_t at = 0;
    uint8_t* dst = m.resize_by(h, k, key.size(), bytes, &at);
    if (bytes) std::memcpy(dst + at, data + start, bytes);
    have += take;
    i += take;
  }
}

}  // namespace statecore
