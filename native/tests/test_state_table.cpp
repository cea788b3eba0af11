// Unit tests of StateTable (one StateMap per key group) and TableSnapshot.
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>

#include "check.h"
#include "statecore/state_table.h"

using statecore::ByteView;
using statecore::StateMap;
using statecore::StateTable;
using statecore::TableSnapshot;

namespace {

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }
std::string str(ByteView v) { return std::string(reinterpret_cast<const char*>(v.data), v.size); }

// Encoded key as the key codec lays it out for max parallelism <= 128: 1-byte key-group prefix,
// then an int64 key big-endian, then the void namespace byte.
std::string encoded_key(int32_t kg, uint64_t key) {
  std::string s(1, static_cast<char>(kg));
  for (int i = 7; i >= 0; --i) s.push_back(static_cast<char>((key >> (8 * i)) & 0xff));
  s.push_back('\0');
  return s;
}

void put(StateMap& m, const std::string& k, const std::string& v) {
  uint8_t* p = m.put(u8(k), k.size(), v.size());
  if (!v.empty()) std::memcpy(p, v.data(), v.size());
}

std::string message_of(const std::exception& e) { return e.what(); }

}  // namespace

TEST(range_validation) {
  CHECK_THROWS(StateTable(-1, 3), std::invalid_argument);
  CHECK_THROWS(StateTable(5, 4), std::invalid_argument);
  CHECK_THROWS(StateTable(0, 32768), std::invalid_argument);
  StateTable single(7, 7);
  CHECK_EQ(single.kg_start(), 7);
  CHECK_EQ(single.kg_end(), 7);
  CHECK_EQ(single.map(7).size(), 0u);
  StateTable full(0, 127);
  CHECK_EQ(full.size(), 0u);
}

TEST(map_outside_range_names_the_key_group) {
  StateTable t(10, 19);
  CHECK_THROWS(t.map(9), std::out_of_range);
  CHECK_THROWS(t.map(20), std::out_of_range);
  try {
    t.map(42);
    CHECK(false);
  } catch (const std::out_of_range& e) {
    std::string msg = message_of(e);
    CHECK(msg.find("42") != std::string::npos);
    CHECK(msg.find("[10, 19]") != std::string::npos);
  }
  const StateTable& ct = t;
  CHECK_THROWS(ct.map(-1), std::out_of_range);
}

TEST(maps_are_separate_per_key_group_and_sizes_add_up) {
  StateTable t(4, 11);
  size_t expected_bytes = 0;
  for (int32_t kg = 4; kg <= 11; ++kg) {
    for (uint64_t k = 0; k < static_cast<uint64_t>(kg) * 10; ++k) {
      std::string key = encoded_key(kg, k);
      put(t.map(kg), key, "value");
      expected_bytes += key.size() + 5;
    }
  }
  size_t expected_size = 0;
  for (int32_t kg = 4; kg <= 11; ++kg) {
    CHECK_EQ(t.map(kg).size(), static_cast<size_t>(kg) * 10);
    expected_size += static_cast<size_t>(kg) * 10;
  }
  CHECK_EQ(t.size(), expected_size);
  CHECK_EQ(t.bytes(), expected_bytes);
  // A key written to one key group's map is not visible in another's.
  ByteView v;
  std::string k = encoded_key(5, 1);
  CHECK(t.map(5).get(u8(k), k.size(), &v));
  CHECK(!t.map(6).get(u8(k), k.size(), &v));
}

TEST(table_snapshot_isolation_per_key_group) {
  StateTable t(0, 15);
  std::map<int32_t, std::map<std::string, std::string>> expected;
  for (int32_t kg = 0; kg <= 15; ++kg) {
    for (uint64_t k = 0; k < 300; ++k) {
      std::string key = encoded_key(kg, k * 31 + static_cast<uint64_t>(kg));
      std::string val = std::to_string(k);
      put(t.map(kg), key, val);
      expected[kg][key] = val;
    }
  }
  TableSnapshot snap = t.snapshot();
  CHECK_EQ(snap.kg_start(), 0);
  CHECK_EQ(snap.kg_end(), 15);
  CHECK_EQ(snap.size(), t.size());
  CHECK_THROWS(snap.map(16), std::out_of_range);
  // Keep writing every key group: overwrite, remove, insert.
  for (int32_t kg = 0; kg <= 15; ++kg) {
    StateMap& m = t.map(kg);
    for (uint64_t k = 0; k < 300; k += 2) {
      std::string key = encoded_key(kg, k * 31 + static_cast<uint64_t>(kg));
      m.remove(u8(key), key.size());
    }
    for (uint64_t k = 1000; k < 1500; ++k) put(m, encoded_key(kg, k), "new");
  }
  // Serialize key group by key group on another thread, releasing each after it is read.
  bool ok = true;
  std::thread writer_of_checkpoint([&] {
    for (int32_t kg = 0; kg <= 15; ++kg) {
      auto entries = snap.map(kg)->sorted_entries();
      const auto& want = expected[kg];
      if (entries.size() != want.size()) ok = false;
      size_t i = 0;
      for (const auto& kv : want) {
        if (i >= entries.size() || str(entries[i].key) != kv.first ||
            str(entries[i].value) != kv.second) {
          ok = false;
        }
        ++i;
      }
      snap.map(kg)->release();
    }
  });
  writer_of_checkpoint.join();
  CHECK(ok);
  snap.release();
  snap.release();  // idempotent after per-key-group releases too
  CHECK_THROWS(snap.map(3)->sorted_entries(), std::logic_error);
  // Once released, writes copy nothing.
  auto before = t.map(3).stats();
  for (uint64_t k = 1000; k < 1500; ++k) put(t.map(3), encoded_key(3, k), "xyz");
  auto after = t.map(3).stats();
  CHECK_EQ(after.entry_copies, before.entry_copies);
  CHECK_EQ(after.page_copies, before.page_copies);
  CHECK_EQ(t.map(3).retired_entries(), 0u);
}

TEST(table_destroyed_while_snapshot_alive) {
  TableSnapshot* keep = nullptr;
  std::string key = encoded_key(2, 99);
  {
    StateTable t(1, 3);
    put(t.map(2), key, "before");
    keep = new TableSnapshot(t.snapshot());
    put(t.map(2), key, "after!");
  }
  auto entries = keep->map(2)->sorted_entries();
  CHECK_EQ(entries.size(), 1u);
  CHECK_EQ(str(entries[0].key), key);
  CHECK_EQ(str(entries[0].value), std::string("before"));
  CHECK_EQ(keep->map(1)->size(), 0u);
  delete keep;  // releases every key group
}

TEST_MAIN()
