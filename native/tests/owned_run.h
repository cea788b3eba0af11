// OwnedRun: a run in Arrow's binary layout owning its buffers, for the tests of the code that
// reads runs (merge_newest_wins, load_entries).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "statecore/sorted_run.h"

// A run in Arrow layout owning its buffers; `value == nullptr` marks a tombstone.
struct OwnedRun {
  std::vector<int32_t> key_offsets{0};
  std::string key_data;
  std::vector<int32_t> value_offsets{0};
  std::string value_data;
  std::vector<uint8_t> validity;  // bitmap, bit `bit0 + i`
  int64_t bit0 = 0;
  bool has_tombstones = false;
  size_t n = 0;

  explicit OwnedRun(int64_t bit_offset = 0) : bit0(bit_offset) {}

  void add(const std::string& k, const std::string* v) {
    key_data += k;
    key_offsets.push_back(static_cast<int32_t>(key_data.size()));
    if (v) value_data += *v;
    value_offsets.push_back(static_cast<int32_t>(value_data.size()));
    uint64_t bit = static_cast<uint64_t>(bit0) + n;
    if (validity.size() <= bit / 8) validity.resize(bit / 8 + 1, 0);
    if (v) validity[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
    if (!v) has_tombstones = true;
    ++n;
  }

  statecore::ArrowBinaryRun view() const {
    statecore::ArrowBinaryRun r;
    r.key_offsets = key_offsets.data();
    r.key_data = reinterpret_cast<const uint8_t*>(key_data.data());
    r.key_data_size = key_data.size();
    r.value_offsets = value_offsets.data();
    r.value_data = reinterpret_cast<const uint8_t*>(value_data.data());
    r.value_data_size = value_data.size();
    r.validity = has_tombstones ? validity.data() : nullptr;
    r.validity_bit = bit0;
    r.size = n;
    return r;
  }

  std::string key(size_t i) const {
    return key_data.substr(key_offsets[i], key_offsets[i + 1] - key_offsets[i]);
  }
  std::string value(size_t i) const {
    return value_data.substr(value_offsets[i], value_offsets[i + 1] - value_offsets[i]);
  }
};
