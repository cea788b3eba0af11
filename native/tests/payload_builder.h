// Test helper: block payloads (docs/formats.md "Block payload") built from a model, for the
// tests of the code that opens and searches them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace statecore_test {

inline void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// The payload of sorted `entries`; with `tombstones` a validity bitmap follows, a value ""
// being a tombstone (its bit clear).
inline std::vector<uint8_t> payload(const std::map<std::string, std::string>& entries,
                                    bool tombstones) {
  std::vector<uint8_t> p;
  put_u32(p, static_cast<uint32_t>(entries.size()));
  uint32_t at = 0;
  put_u32(p, 0);
  for (const auto& kv : entries) put_u32(p, at += static_cast<uint32_t>(kv.first.size()));
  at = 0;
  put_u32(p, 0);
  for (const auto& kv : entries) put_u32(p, at += static_cast<uint32_t>(kv.second.size()));
  for (const auto& kv : entries) p.insert(p.end(), kv.first.begin(), kv.first.end());
  for (const auto& kv : entries) p.insert(p.end(), kv.second.begin(), kv.second.end());
  if (tombstones) {
    std::vector<uint8_t> bits((entries.size() + 7) / 8, 0);
    size_t i = 0;
    for (const auto& kv : entries) {
      if (!kv.second.empty()) bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
      ++i;
    }
    p.insert(p.end(), bits.begin(), bits.end());
  }
  return p;
}

}  // namespace statecore_test
