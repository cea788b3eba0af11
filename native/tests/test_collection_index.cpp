// The collection index of map state (collection_index.h) and the prefix splitter it relies on
// (key_codec.h encoded_prefix_size), against keys built by KeyEncoder (docs/formats.md "Encoded
// key" and "Map state").
#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/collection_index.h"
#include "statecore/key_codec.h"
#include "statecore/sorted_run.h"
#include "statecore/state_table.h"
#include "statecore/ttl.h"

using namespace statecore;

namespace {

std::vector<uint8_t> b(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::vector<std::string> members(const CollectionIndex& ix, int32_t kg, const std::string& p) {
  std::vector<std::string> out;
  ix.for_each(
      kg, reinterpret_cast<const uint8_t*>(p.data()), p.size(),
      [&](const uint8_t* m, size_t n) { out.emplace_back(reinterpret_cast<const char*>(m), n); });
  return out;
}

bool ins(CollectionIndex& ix, int32_t kg, const std::string& p, const std::string& m) {
  return ix.insert(kg, reinterpret_cast<const uint8_t*>(p.data()), p.size(),
                   reinterpret_cast<const uint8_t*>(m.data()), m.size());
}

bool era(CollectionIndex& ix, int32_t kg, const std::string& p, const std::string& m) {
  return ix.erase(kg, reinterpret_cast<const uint8_t*>(p.data()), p.size(),
                  reinterpret_cast<const uint8_t*>(m.data()), m.size());
}

size_t sz(const CollectionIndex& ix, int32_t kg, const std::string& p) {
  return ix.size(kg, reinterpret_cast<const uint8_t*>(p.data()), p.size());
}

using V = std::vector<std::string>;

// Every prefix and member hashes alike (as Tessil robin-map's tests do with a constant hash): the
// probing, backward-shift deletion and dropping of collections must still find every key.
uint32_t colliding_hash(const uint8_t*, size_t) { return 7; }

// A reference index: per (key group, prefix) the members in insertion order.
struct Reference {
  std::map<std::pair<int32_t, std::string>, std::vector<std::string>> colls;
  bool insert(int32_t kg, const std::string& p, const std::string& m) {
    auto& v = colls[{kg, p}];
    for (const auto& x : v)
      if (x == m) return false;
    v.push_back(m);
    return true;
  }
  bool erase(int32_t kg, const std::string& p, const std::string& m) {
    auto it = colls.find({kg, p});
    if (it == colls.end()) return false;
    auto& v = it->second;
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] == m) {
        v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
        if (v.empty()) colls.erase(it);
        return true;
      }
    return false;
  }
  V get(int32_t kg, const std::string& p) const {
    auto it = colls.find({kg, p});
    return it == colls.end() ? V() : it->second;
  }
  size_t members() const {
    size_t n = 0;
    for (const auto& kv : colls) n += kv.second.size();
    return n;
  }
};

// Random inserts, erases, takes and reads over a few key groups, prefixes of mixed sizes (empty
// included) and members of mixed sizes, some collections growing past kSmallMembers and
// shrinking back; every result and the full contents compared with the reference.
void differential(uint32_t seed, KeyHashFunction hash, int ops, int prefixes, int members_per) {
  std::mt19937 rng(seed);
  CollectionIndex ix(2, 5, hash);
  Reference ref;
  size_t max_size = 0;
  auto prefix = [&](int i) {
    return i == 0 ? std::string() : std::string(size_t(i % 11), 'p') + std::to_string(i);
  };
  auto member = [&](int i) {
    return i % 7 == 0 ? std::string(40, 'm') + std::to_string(i) : std::to_string(i);
  };
  for (int op = 0; op < ops; ++op) {
    const int32_t kg = 2 + static_cast<int32_t>(rng() % 4);
    const std::string p = prefix(static_cast<int>(rng() % static_cast<uint32_t>(prefixes)));
    // Skewed member choice: phases that grow collections, phases that shrink them.
    const bool grow_phase = (op / 2000) % 2 == 0;
    const std::string m = member(static_cast<int>(rng() % static_cast<uint32_t>(members_per)));
    const uint32_t r = rng() % 100;
    if (r < (grow_phase ? 55u : 25u)) {
      CHECK_EQ(ins(ix, kg, p, m), ref.insert(kg, p, m));
    } else if (r < 90) {
      CHECK_EQ(era(ix, kg, p, m), ref.erase(kg, p, m));
    } else if (r < 92) {
      const auto* pp = reinterpret_cast<const uint8_t*>(p.data());
      CHECK(ix.take(kg, pp, p.size()) == ref.get(kg, p));
      ref.colls.erase({kg, p});
    } else if (r < 96) {
      CHECK(ix.contains(kg, reinterpret_cast<const uint8_t*>(p.data()), p.size(),
                        reinterpret_cast<const uint8_t*>(m.data()), m.size()) == [&] {
        for (const auto& x : ref.get(kg, p))
          if (x == m) return true;
        return false;
      }());
    } else {
      CHECK(members(ix, kg, p) == ref.get(kg, p));
      CHECK_EQ(sz(ix, kg, p), ref.get(kg, p).size());
    }
    max_size = std::max(max_size, ref.get(kg, p).size());
    if (op % 997 == 0) ix.check_invariants();
  }
  ix.check_invariants();
  CHECK(max_size > CollectionIndex::kSmallMembers);  // promoted collections were exercised
  CHECK_EQ(ix.collections(), ref.colls.size());
  CHECK_EQ(ix.members(), ref.members());
  for (const auto& kv : ref.colls) CHECK(members(ix, kv.first.first, kv.first.second) == kv.second);
}

}  // namespace

TEST(differential_against_reference_fixed_seeds) {
  for (uint32_t seed : {1u, 2u, 3u}) differential(seed, nullptr, 20000, 40, 48);
}

TEST(differential_with_an_all_colliding_hash) {
  for (uint32_t seed : {4u, 5u}) differential(seed, colliding_hash, 6000, 24, 40);
}

TEST(all_colliding_hash_many_collections_and_members) {
  CollectionIndex ix(0, 0, colliding_hash);
  for (int p = 0; p < 200; ++p)
    for (int m = 0; m < (p % 5 == 0 ? 40 : 3); ++m)
      CHECK(ins(ix, 0, std::to_string(p), std::to_string(m)));
  ix.check_invariants();
  // Drop every other collection (backward shift over one long probe run), then read the rest.
  for (int p = 0; p < 200; p += 2)
    CHECK_EQ(ix.take(0, reinterpret_cast<const uint8_t*>(std::to_string(p).data()),
                     std::to_string(p).size())
                 .size(),
             size_t(p % 5 == 0 ? 40 : 3));
  ix.check_invariants();
  for (int p = 1; p < 200; p += 2) {
    V want;
    for (int m = 0; m < (p % 5 == 0 ? 40 : 3); ++m) want.push_back(std::to_string(m));
    CHECK(members(ix, 0, std::to_string(p)) == want);
  }
  CHECK_EQ(ix.collections(), size_t(100));
}

TEST(promotion_past_small_members_and_demotion_keep_order) {
  CollectionIndex ix(0, 0);
  const uint32_t k = CollectionIndex::kSmallMembers;
  V want;
  for (uint32_t i = 0; i < k + 1; ++i) {
    CHECK(ins(ix, 0, "p", "m" + std::to_string(i)));
    want.push_back("m" + std::to_string(i));
    ix.check_invariants();
  }
  CHECK(!ins(ix, 0, "p", "m3"));  // found through the member table
  CHECK(members(ix, 0, "p") == want);
  // Erase down to a few: compactions drop the member table; order kept.
  for (uint32_t i = 0; i < k - 2; ++i) {
    CHECK(era(ix, 0, "p", "m" + std::to_string(i)));
    ix.check_invariants();
  }
  want.erase(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(k - 2));
  CHECK(members(ix, 0, "p") == want);
  CHECK(ins(ix, 0, "p", "m0"));
  want.push_back("m0");
  CHECK(members(ix, 0, "p") == want);
  ix.check_invariants();
}

TEST(a_collection_that_shrank_gives_memory_back) {
  CollectionIndex ix(0, 0);
  for (int i = 0; i < 10000; ++i) ins(ix, 0, "p", std::to_string(i));
  const size_t big = ix.bytes();
  for (int i = 3; i < 10000; ++i) era(ix, 0, "p", std::to_string(i));
  CHECK(ix.bytes() * 20 < big);  // buffer and member table shrunk, not just emptied
  CHECK(members(ix, 0, "p") == V({"0", "1", "2"}));
  ix.check_invariants();
  for (int i = 0; i < 10000; ++i) ins(ix, 0, "q", std::to_string(i));
  const size_t q_big = ix.bytes();
  for (int i = 100; i < 10000; ++i) era(ix, 0, "q", std::to_string(i));  // stays promoted
  CHECK(ix.bytes() * 20 < q_big);
  CHECK_EQ(sz(ix, 0, "q"), size_t(100));
  CHECK(!ins(ix, 0, "q", "99"));
  ix.check_invariants();
}

TEST(index_hash_is_the_state_map_hash) {
  // A kernel passes the prefix hash it computed for the table (insert_hashed): both must agree,
  // with the default hash and with an injected one.
  for (KeyHashFunction h : {KeyHashFunction(nullptr), KeyHashFunction(colliding_hash)}) {
    CollectionIndex ix(0, 0, h);
    StateMap m(h);
    for (size_t n = 0; n < 40; ++n) {
      std::vector<uint8_t> key(n);
      for (size_t i = 0; i < n; ++i) key[i] = static_cast<uint8_t>(i * 37 + n);
      CHECK_EQ(ix.hash(key.data(), n), m.hash(key.data(), n));
    }
    CHECK(ix.hash_function() == h);
  }
}

// The kernels' prefetches read the group tables of any key group they are given, of any
// collection (present, absent, in a long probe run of one hash), and of none: they never throw
// and change nothing (ASan checks that their reads stay inside the slot tables).
TEST(prefetches_change_nothing_and_never_throw) {
  CollectionIndex ix(3, 5, colliding_hash);
  const auto h = [&](const std::string& p) {
    return ix.hash(reinterpret_cast<const uint8_t*>(p.data()), p.size());
  };
  for (int32_t kg : {-1, 2, 3, 4, 5, 6, 40000}) {  // empty tables and keys outside the range
    ix.prefetch(kg, 7);
    ix.prefetch_collection(kg, 7);
  }
  for (int p = 0; p < 50; ++p) CHECK(ins(ix, 4, std::to_string(p), "m"));
  for (int32_t kg : {-1, 3, 4, 5, 6})
    for (const std::string p : {"0", "49", "absent"}) {
      ix.prefetch(kg, h(p));
      ix.prefetch_collection(kg, h(p));
    }
  ix.check_invariants();
  CHECK_EQ(ix.collections(), size_t(50));
  CHECK(members(ix, 4, "49") == V({"m"}));
  CHECK(!ins(ix, 4, "0", "m"));
}

TEST(bad_arguments_change_nothing) {
  CollectionIndex ix(0, 1);
  ins(ix, 0, "p", "a");
  CHECK_THROWS(ix.insert(0, nullptr, 3, reinterpret_cast<const uint8_t*>("x"), 1),
               std::invalid_argument);
  CHECK_THROWS(ix.insert(0, reinterpret_cast<const uint8_t*>("p"), 1, nullptr, 2),
               std::invalid_argument);
  CHECK_THROWS(ix.erase(0, nullptr, 3, reinterpret_cast<const uint8_t*>("a"), 1),
               std::invalid_argument);
  CHECK_THROWS(ins(ix, 2, "p", "a"), std::out_of_range);
  CHECK_THROWS(ix.size(-1, reinterpret_cast<const uint8_t*>("p"), 1), std::out_of_range);
  CHECK(members(ix, 0, "p") == V({"a"}));
  // Empty prefixes and empty members are ordinary bytes strings.
  CHECK(ins(ix, 1, "", ""));
  CHECK(ins(ix, 1, "", "x"));
  CHECK(!ins(ix, 1, "", ""));
  CHECK(members(ix, 1, "") == V({"", "x"}));
  ix.check_invariants();
}

TEST(bytes_per_member_of_tiny_maps) {
  // 16 int64 user keys per map over many maps (the map_put bench's shape): a few bytes of slots
  // and records per member besides the 8 member bytes, not the ~72 of node-based hash maps.
  CollectionIndex ix(0, 127);
  const KeySchema key = KeySchema::scalar(KeyType::Int64);
  KeyEncoder e(key, NamespaceType::Void, 128);
  for (int64_t k = 0; k < 20000; ++k) {
    e.key_int64(static_cast<int32_t>(k % 128), k);
    e.namespace_void();
    for (int64_t uk = 0; uk < 16; ++uk) {
      std::vector<uint8_t> m;
      append_ser_int64(m, uk);
      ix.insert(static_cast<int32_t>(k % 128), e.data(), e.size(), m.data(), m.size());
    }
  }
  CHECK_EQ(ix.members(), size_t(20000 * 16));
  const double per = static_cast<double>(ix.bytes()) / static_cast<double>(ix.members());
  CHECK(per < 24.0);
  ix.check_invariants();
}

TEST(insertion_order_reinsert_keeps_place_erased_goes_last) {
  CollectionIndex ix(0, 3);
  CHECK(ins(ix, 1, "p", "b"));
  CHECK(ins(ix, 1, "p", "a"));
  CHECK(ins(ix, 1, "p", "c"));
  CHECK(!ins(ix, 1, "p", "b"));  // present: keeps its place
  CHECK(members(ix, 1, "p") == V({"b", "a", "c"}));
  CHECK(era(ix, 1, "p", "b"));
  CHECK(!era(ix, 1, "p", "b"));
  CHECK(ins(ix, 1, "p", "b"));
  CHECK(members(ix, 1, "p") == V({"a", "c", "b"}));
  CHECK_EQ(sz(ix, 1, "p"), size_t(3));
  CHECK_EQ(sz(ix, 1, "q"), size_t(0));
  CHECK_EQ(sz(ix, 2, "p"), size_t(0));  // collections are per key group
  CHECK(ix.contains(1, reinterpret_cast<const uint8_t*>("p"), 1,
                    reinterpret_cast<const uint8_t*>("a"), 1));
  CHECK_EQ(ix.collections(), size_t(1));
  CHECK_EQ(ix.members(), size_t(3));
  CHECK(ix.bytes() > 0);
}

TEST(emptied_collection_is_dropped_and_take_clears) {
  CollectionIndex ix(5, 5);
  ins(ix, 5, "p", "x");
  era(ix, 5, "p", "x");
  CHECK_EQ(ix.collections(), size_t(0));
  ins(ix, 5, "p", "x");
  ins(ix, 5, "p", "y");
  ins(ix, 5, "q", "z");
  const auto taken = ix.take(5, reinterpret_cast<const uint8_t*>("p"), 1);
  CHECK(taken == V({"x", "y"}));
  CHECK_EQ(sz(ix, 5, "p"), size_t(0));
  CHECK_EQ(sz(ix, 5, "q"), size_t(1));
  ix.clear();
  CHECK_EQ(ix.members(), size_t(0));
  CHECK_THROWS(ins(ix, 4, "p", "x"), std::out_of_range);
  CHECK_THROWS(CollectionIndex(3, 2), std::invalid_argument);
}

TEST(lazy_removal_compacts_and_keeps_order) {
  CollectionIndex ix(0, 0);
  V want;
  for (int i = 0; i < 1000; ++i) ins(ix, 0, "p", std::to_string(i));
  for (int i = 0; i < 1000; ++i)
    if (i % 3 != 0) era(ix, 0, "p", std::to_string(i));
  for (int i = 0; i < 1000; i += 3) want.push_back(std::to_string(i));
  CHECK(members(ix, 0, "p") == want);
  ins(ix, 0, "p", "1");  // erased earlier: last
  want.push_back("1");
  CHECK(members(ix, 0, "p") == want);
  CHECK_EQ(sz(ix, 0, "p"), want.size());
  // Erase and insert again in a loop: the slots stay bounded by compaction.
  for (int r = 0; r < 5000; ++r) {
    era(ix, 0, "p", "0");
    ins(ix, 0, "p", "0");
  }
  CHECK_EQ(sz(ix, 0, "p"), want.size());
  CHECK(members(ix, 0, "p").back() == "0");
}

TEST(encoded_prefix_size_of_keys_built_by_the_encoder) {
  struct Case {
    KeySchema key;
    NamespaceType ns;
    int32_t mp;
  };
  KeySchema pair;
  pair.is_struct = true;
  pair.columns = {KeyColumn{KeyType::Int32}, KeyColumn{KeyType::String}};
  std::vector<Case> cases = {
      {KeySchema::scalar(KeyType::Int64), NamespaceType::Void, 128},
      {KeySchema::scalar(KeyType::String), NamespaceType::Void, 300},
      {KeySchema::scalar(KeyType::String), NamespaceType::String, 128},  // lenbytes
      {KeySchema::scalar(KeyType::Binary), NamespaceType::Int64, 128},
      {KeySchema::scalar(KeyType::FixedSizeBinary, 3), NamespaceType::Int32, 128},
      {pair, NamespaceType::Binary, 128},
  };
  for (const Case& c : cases) {
    KeyEncoder e(c.key, c.ns, c.mp);
    if (c.key.is_struct) {
      continue;  // struct keys are written through key_row (batch arrays), checked below
    }
    switch (c.key.columns[0].type) {
      case KeyType::Int64: e.key_int64(7, -5); break;
      case KeyType::FixedSizeBinary: e.key_fixed(7, "abc", 3); break;
      default: e.key_bytes(7, "hello", 5); break;
    }
    switch (c.ns) {
      case NamespaceType::Void: e.namespace_void(); break;
      case NamespaceType::Int64: e.namespace_int64(42); break;
      default: {
        std::vector<uint8_t> ser;
        if (c.ns == NamespaceType::Int32) {
          append_ser_int32(ser, 9);
        } else {
          append_ser_bytes(ser, "ns", 2);
        }
        e.namespace_serialized(ser.data(), ser.size());
      }
    }
    std::vector<uint8_t> k(e.data(), e.data() + e.size());
    const size_t p = k.size();
    std::vector<uint8_t> uk;
    append_ser_bytes(uk, "user", 4);
    k.insert(k.end(), uk.begin(), uk.end());
    CHECK_EQ(encoded_prefix_size(k.data(), k.size(), c.key, c.ns, c.mp), p);
    // Truncated inside the prefix: an error, never a size past the key.
    CHECK_THROWS(encoded_prefix_size(k.data(), p - 1, c.key, c.ns, c.mp), std::invalid_argument);
  }
  // A struct key (int32, string) and a binary namespace: both variable-length -> lenbytes.
  std::vector<uint8_t> k = {0x07};
  append_ser_int32(k, 1);
  append_ser_bytes(k, "ab", 2);
  append_lenbytes(k, 4 + 3);
  append_ser_bytes(k, "n", 1);
  append_lenbytes(k, 2);
  const size_t p = k.size();
  append_ser_int64(k, 3);
  CHECK_EQ(encoded_prefix_size(k.data(), k.size(), pair, NamespaceType::Binary, 128), p);
  k[1 + 4 + 3] = 9;  // wrong lenbytes
  CHECK_THROWS(encoded_prefix_size(k.data(), k.size(), pair, NamespaceType::Binary, 128),
               std::invalid_argument);
}

TEST(entry_keys_split_into_prefix_and_member) {
  const KeySchema key = KeySchema::scalar(KeyType::Int64);
  std::vector<uint8_t> data;
  std::vector<int32_t> off = {0};
  auto add = [&](int32_t kg, int64_t k, int64_t uk) {
    KeyEncoder e(key, NamespaceType::Void, 128);
    e.key_int64(kg, k);
    e.namespace_void();
    data.insert(data.end(), e.data(), e.data() + e.size());
    append_ser_int64(data, uk);
    off.push_back(static_cast<int32_t>(data.size()));
  };
  add(1, 10, 2);
  add(1, 10, 1);
  add(2, 20, 5);
  CollectionIndex ix(0, 3);
  ix.insert_entry_keys(data.data(), off.data(), 3, key, NamespaceType::Void, 128);
  CHECK_EQ(ix.members(), size_t(3));
  KeyEncoder e(key, NamespaceType::Void, 128);
  e.key_int64(1, 10);
  e.namespace_void();
  const std::string p(reinterpret_cast<const char*>(e.data()), e.size());
  std::vector<uint8_t> one, two;
  append_ser_int64(one, 1);
  append_ser_int64(two, 2);
  CHECK(members(ix, 1, p) ==
        V({std::string(two.begin(), two.end()), std::string(one.begin(), one.end())}));
  ix.erase_entry_keys(data.data(), off.data(), 1, key, NamespaceType::Void, 128);
  CHECK(members(ix, 1, p) == V({std::string(one.begin(), one.end())}));
  // A key without a member, or of a key group outside the index: nothing changes.
  std::vector<int32_t> bad_off = {0, off[1] - 8, off[1]};
  CHECK_THROWS(ix.insert_entry_keys(data.data(), bad_off.data(), 1, key, NamespaceType::Void, 128),
               std::invalid_argument);
  CollectionIndex small(1, 1);
  CHECK_THROWS(small.insert_entry_keys(data.data(), off.data(), 3, key, NamespaceType::Void, 128),
               std::out_of_range);
  CHECK_EQ(small.members(), size_t(0));
  (void)b;
}

// A TTL cleanup step reports the entries it removes; the index unlists them (as the native
// table does after each step), keeping the order of the others.
TEST(ttl_cleanup_step_reports_removed_entries_for_the_index) {
  const KeySchema key = KeySchema::scalar(KeyType::Int64);
  StateTable t(0, 127);
  CollectionIndex ix(0, 127);
  KeyEncoder e(key, NamespaceType::Void, 128);
  e.key_int64(3, 42);
  e.namespace_void();
  const std::vector<uint8_t> prefix(e.data(), e.data() + e.size());
  for (int64_t uk = 0; uk < 6; ++uk) {
    std::vector<uint8_t> k = prefix;
    append_ser_int64(k, uk);
    std::vector<uint8_t> v;
    append_ser_int64(v, uk);                      // any 8 value bytes
    append_ser_int64(v, uk % 2 == 0 ? 0 : 1000);  // even user keys written at 0: expire first
    std::memcpy(t.map(3).put(k.data(), k.size(), v.size()), v.data(), v.size());
    ix.insert(3, prefix.data(), prefix.size(), k.data() + prefix.size(), 8);
  }
  ttl::FilterSpec spec;
  spec.layout = ttl::Layout::Value;
  spec.ttl_ms = 100;
  SortedRun scratch;
  std::vector<std::string> removed;
  ttl::TableCursor cur;
  const ttl::CleanupStep step = ttl::cleanup_step(t, &cur, 1000, spec, 500, &scratch, &removed);
  CHECK_EQ(step.expired, size_t(3));
  CHECK_EQ(removed.size(), size_t(3));
  ix.erase_entry_keys(removed, key, NamespaceType::Void, 128);
  std::vector<uint8_t> one, three, five;
  append_ser_int64(one, 1);
  append_ser_int64(three, 3);
  append_ser_int64(five, 5);
  const std::string p(prefix.begin(), prefix.end());
  CHECK(members(ix, 3, p) ==
        V({std::string(one.begin(), one.end()), std::string(three.begin(), three.end()),
           std::string(five.begin(), five.end())}));
  CHECK_EQ(ix.prune(t), size_t(0));  // nothing left to prune
}

TEST_MAIN()
