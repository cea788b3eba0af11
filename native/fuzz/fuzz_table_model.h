// The check both bulk-load fuzz targets make of a loaded table against their model of it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "fuzz_input.h"
#include "statecore/sorted_run.h"
#include "statecore/state_table.h"

namespace statecore_fuzz {

// `table` holds exactly `model` (encoded key -> value; key-group prefix of `pw` bytes): every
// key found in its key group with its value, and a snapshot lists the model in key order.
inline void check_table(statecore::StateTable& table,
                        const std::map<std::string, std::string>& model, int pw) {
  FUZZ_CHECK(table.size() == model.size(), "the table holds exactly the model's keys");
  for (const auto& [k, v] : model) {
    const int32_t kg = pw == 1 ? uint8_t(k[0]) : uint8_t(k[0]) << 8 | uint8_t(k[1]);
    statecore::ByteView got;
    FUZZ_CHECK(table.map(kg).get(reinterpret_cast<const uint8_t*>(k.data()), k.size(), &got),
               "a loaded key is found in its key group");
    FUZZ_CHECK(std::string(reinterpret_cast<const char*>(got.data), got.size) == v,
               "a loaded key holds its last value");
  }
  statecore::TableSnapshot snap = table.snapshot();
  auto it = model.begin();
  for (int32_t kg = table.kg_start(); kg <= table.kg_end(); ++kg) {
    const statecore::SortedRun run = snap.map(kg)->sorted_entries();
    for (size_t i = 0; i < run.size(); ++i, ++it) {
      FUZZ_CHECK(it != model.end(), "no more entries listed than loaded");
      const statecore::ByteView k = run.key(i), v = run.value(i);
      FUZZ_CHECK(std::string(reinterpret_cast<const char*>(k.data), k.size) == it->first &&
                     std::string(reinterpret_cast<const char*>(v.data), v.size) == it->second,
                 "the listing is the model in key order");
    }
  }
  FUZZ_CHECK(it == model.end(), "every loaded entry is listed");
  snap.release();
}

}  // namespace statecore_fuzz
