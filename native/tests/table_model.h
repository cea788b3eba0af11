// A model of a restored StateTable for the bulk-load tests (load_entries, load_blocks): encoded
// int64 keys of the void namespace, their key groups, and the check of a table against a
// std::map of what it must hold.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "check.h"
#include "statecore/state_table.h"

using Model = std::map<std::string, std::string>;  // encoded key -> value

// `prefix | key (8 bytes big-endian) | void namespace`, the prefix `pw` (1 or 2) bytes.
inline std::string encoded_key(int32_t kg, uint64_t key, int pw) {
  std::string s;
  if (pw == 2) s.push_back(static_cast<char>(kg >> 8));
  s.push_back(static_cast<char>(kg & 0xff));
  for (int i = 7; i >= 0; --i) s.push_back(static_cast<char>((key >> (8 * i)) & 0xff));
  s.push_back('\0');  // the void namespace
  return s;
}

inline int32_t kg_of(const std::string& k, int pw) {
  const auto* p = reinterpret_cast<const uint8_t*>(k.data());
  return pw == 1 ? p[0] : (p[0] << 8) | p[1];
}

// The table's entries against the model (sizes per key group and every value).
inline void check_table(statecore::StateTable& t, const Model& model, int pw) {
  std::map<int32_t, size_t> per_kg;
  for (const auto& [k, v] : model) {
    ++per_kg[kg_of(k, pw)];
    statecore::ByteView got;
    const bool found =
        t.map(kg_of(k, pw)).get(reinterpret_cast<const uint8_t*>(k.data()), k.size(), &got);
    CHECK(found);
    if (found) CHECK_EQ(std::string(reinterpret_cast<const char*>(got.data), got.size), v);
  }
  for (int32_t kg = t.kg_start(); kg <= t.kg_end(); ++kg) CHECK_EQ(t.map(kg).size(), per_kg[kg]);
}
