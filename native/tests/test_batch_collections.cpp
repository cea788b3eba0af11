// Collection batch kernels (batch_collections.h) over hand-built Arrow arrays: the exact list
// chunks and map entries the per-record path writes (docs/formats.md "List state", "Map state"),
// repeated keys applied in row order, the map index's order, sliced arrays, TTL suffixes, and
// errors that leave the table untouched.
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "batch_test_arrays.h"
#include "check.h"
#include "statecore/arrow_abi.h"
#include "statecore/batch.h"
#include "statecore/batch_collections.h"
#include "statecore/state_table.h"

using namespace statecore;
using namespace statecore_test;

TEST(list_append_int64_fills_chunk_0_in_row_order_without_the_index) {
  StateTable t(0, 127);
  ListIndex ix(0, 127);
  auto keys = fixed<int64_t>("l", I64{1, 2, 1, 1}, 2);  // sliced: offset 2
  auto vals = fixed<int64_t>("l", I64{10, 20, 30, 40}, 3);
  list_append_batch(t, int64_spec(), keys.in(), ValueType::Int64, vals.in(), TtlBatchSpec(), &ix);
  CHECK(lists(t) ==
        (std::multiset<std::string>{le64(10) + le64(30) + le64(40) + "#0", le64(20) + "#0"}));
  CHECK_EQ(ix.lists(), size_t(0));  // lists of chunk 0 alone are not listed
  // A second batch appends after what is stored, in the same chunk.
  auto k2 = fixed<int64_t>("l", I64{2, 3});
  auto v2 = fixed<int64_t>("l", I64{21, 5});
  list_append_batch(t, int64_spec(), k2.in(), ValueType::Int64, v2.in(), TtlBatchSpec(), &ix);
  CHECK(lists(t) == (std::multiset<std::string>{le64(10) + le64(30) + le64(40) + "#0",
                                                le64(20) + le64(21) + "#0", le64(5) + "#0"}));
  CHECK_EQ(t.size(), size_t(3));
}

TEST(list_append_starts_a_new_chunk_when_the_last_is_full) {
  StateTable t(0, 127);
  ListIndex ix(0, 127);
  const size_t k = kListChunkElements;
  I64 ks, vs;
  for (size_t i = 0; i < 2 * k + 3; ++i) {
    ks.push_back(9);
    vs.push_back(static_cast<int64_t>(i));
  }
  auto keys = fixed<int64_t>("l", ks);
  auto vals = fixed<int64_t>("l", vs);
  list_append_batch(t, int64_spec(), keys.in(), ValueType::Int64, vals.in(), TtlBatchSpec(), &ix);
  std::string all;
  for (size_t i = 0; i < 2 * k + 3; ++i) all += le64(static_cast<int64_t>(i));
  CHECK(lists(t) == (std::multiset<std::string>{all + "#0,1,2"}));
  CHECK_EQ(t.size(), size_t(3));
  CHECK_EQ(ix.lists(), size_t(1));
  CHECK_EQ(ix.chunks(), size_t(3));
  // Each chunk holds k elements but the last.
  std::vector<size_t> sizes;
  for (const auto& kv : dump(t)) sizes.push_back(kv.second.size());
  CHECK(sizes == (std::vector<size_t>{8 * k, 8 * k, 24}));
}

TEST(list_append_copies_the_last_chunk_only_under_a_snapshot) {
  StateTable t(0, 127);
  ListIndex ix(0, 127);
  const size_t k = kListChunkElements;
  I64 ks, vs;
  for (size_t i = 0; i < k + 1; ++i) {
    ks.push_back(4);
    vs.push_back(static_cast<int64_t>(i));
  }
  auto keys = fixed<int64_t>("l", ks);
  auto vals = fixed<int64_t>("l", vs);
  list_append_batch(t, int64_spec(), keys.in(), ValueType::Int64, vals.in(), TtlBatchSpec(), &ix);
  const auto before = dump(t);
  TableSnapshot snap = t.snapshot();
  auto k1 = fixed<int64_t>("l", I64{4});
  auto v1 = fixed<int64_t>("l", I64{99});
  list_append_batch(t, int64_spec(), k1.in(), ValueType::Int64, v1.in(), TtlBatchSpec(), &ix);
  // The snapshot keeps both chunks as they were; the live table changed chunk 1 only.
  std::map<std::string, std::string> snapped;
  for (int32_t kg = snap.kg_start(); kg <= snap.kg_end(); ++kg) {
    const SortedRun run = snap.map(kg)->sorted_entries();
    for (size_t i = 0; i < run.size(); ++i)
      snapped[std::string(reinterpret_cast<const char*>(run.key(i).data), run.key(i).size)] =
          std::string(reinterpret_cast<const char*>(run.value(i).data), run.value(i).size);
  }
  CHECK(before == snapped);
  const auto after = dump(t);
  CHECK_EQ(after.size(), size_t(2));
  CHECK(after.begin()->second == before.begin()->second);
  CHECK(std::next(after.begin())->second == le64(static_cast<int64_t>(k)) + le64(99));
}

TEST(list_append_string_elements_are_varlen_framed_and_ttl_suffixed) {
  StateTable t(0, 127);
  ListIndex ix(0, 127);
  auto keys = fixed<int64_t>("l", I64{7, 7});
  auto vals = varwidth<int32_t>("u", Str{std::string("ab"), std::string("")});
  list_append_batch(t, int64_spec(), keys.in(), ValueType::String, vals.in(), TtlBatchSpec(), &ix);
  CHECK(lists(t) == (std::multiset<std::string>{std::string("\x02"
                                                            "ab"
                                                            "\x00",
                                                            4) +
                                                "#0"}));
  StateTable tt(0, 127);
  ListIndex tix(0, 127);
  TtlBatchSpec ttl;
  ttl.enabled = true;
  ttl.ttl_ms = 1000;
  ttl.now = 77;
  auto iv = fixed<int64_t>("l", I64{3, 4});
  list_append_batch(tt, int64_spec(), keys.in(), ValueType::Int64, iv.in(), ttl, &tix);
  CHECK(lists(tt) == (std::multiset<std::string>{le64(3) + be64(77) + le64(4) + be64(77) + "#0"}));
  // A table of int64 lists appended strings: the chunk no longer parses as int64 elements.
  CHECK(batch_error(
      [&] {
        list_append_batch(tt, int64_spec(), keys.in(), ValueType::String, vals.in(), ttl, &tix);
      },
      "does not parse"));
  StateTable ts(0, 127);
  ListIndex six(0, 127);
  list_append_batch(ts, int64_spec(), keys.in(), ValueType::String, vals.in(), ttl, &six);
  CHECK(lists(ts) ==
        (std::multiset<std::string>{"\x02"
                                    "ab" +
                                    be64(77) + std::string(1, '\0') + be64(77) + "#0"}));
}

TEST(list_append_needs_the_index_and_rejects_bad_input_before_any_write) {
  StateTable t(0, 127);
  ListIndex ix(0, 127);
  auto keys = fixed<int64_t>("l", I64{1, 2});
  auto good = fixed<int64_t>("l", I64{1, 2});
  list_append_batch(t, int64_spec(), keys.in(), ValueType::Int64, good.in(), TtlBatchSpec(), &ix);
  const auto before = dump(t);
  CHECK(batch_error(
      [&] { list_append_batch(t, int64_spec(), keys.in(), ValueType::Int64, good.in()); },
      "list index is required"));
  auto null_val = fixed<int64_t>("l", I64{5, std::nullopt});
  auto append = [&](auto& k, auto& v, ValueType vt) {
    list_append_batch(t, int64_spec(), k.in(), vt, v.in(), TtlBatchSpec(), &ix);
  };
  CHECK(batch_error([&] { append(keys, null_val, ValueType::Int64); }, "null at row 1"));
  auto short_vals = fixed<int64_t>("l", I64{5});
  CHECK(batch_error([&] { append(keys, short_vals, ValueType::Int64); }, "length"));
  auto floats = fixed<double>("g", F64{1.0, 2.0});
  CHECK(batch_error([&] { append(keys, floats, ValueType::Int64); },
                    "expected an Arrow array of value type int64"));
  auto null_key = fixed<int64_t>("l", I64{1, std::nullopt});
  CHECK(batch_error([&] { append(null_key, good, ValueType::Int64); }, "null key"));
  CHECK(batch_error(
      [&] {
        validate_list_append_batch(t, int64_spec(), keys.in(), ValueType::Int64, null_val.in());
      },
      "null at row 1"));
  CHECK(dump(t) == before);
  CHECK_EQ(ix.lists(), size_t(0));
}

// A map's entries (docs/formats.md "Map state"): (key, ser(user key)) -> value bytes, from
// the encoded keys of int64 keys in the void namespace (prefix | be64(key) | 00 | ser(uk)).
std::map<std::pair<int64_t, std::string>, std::string> map_entries(StateTable& t) {
  std::map<std::pair<int64_t, std::string>, std::string> out;
  for (const auto& kv : dump(t)) {
    const std::string& k = kv.first;
    int64_t key = 0;
    for (int i = 0; i < 8; ++i) key = (key << 8) | static_cast<uint8_t>(k[1 + i]);
    CHECK_EQ(int(static_cast<uint8_t>(k[9])), 0);
    out[{key, k.substr(10)}] = kv.second;
  }
  return out;
}

// The user keys the index lists for int64 key `key` (void namespace), in order.
std::vector<std::string> listed(StateTable& t, const CollectionIndex& ix, int64_t key) {
  std::vector<std::string> out;
  for (const auto& kv : dump(t)) {
    if (kv.first.substr(1, 8) != be64(key)) continue;
    const auto* p = reinterpret_cast<const uint8_t*>(kv.first.data());
    ix.for_each(static_cast<int32_t>(p[0]), p, 10, [&](const uint8_t* m, size_t n) {
      out.emplace_back(reinterpret_cast<const char*>(m), n);
    });
    break;
  }
  return out;
}

using Entries = std::map<std::pair<int64_t, std::string>, std::string>;

TEST(map_put_int64_user_keys_one_entry_each_last_row_wins) {
  StateTable t(0, 127);
  CollectionIndex ix(0, 127);
  auto keys = fixed<int64_t>("l", I64{1, 1, 2, 1, 1}, 1);
  auto uks = fixed<int64_t>("l", I64{5, 2, 1, 5, -1}, 2);
  auto vals = fixed<int64_t>("l", I64{100, 200, 1, 300, 400});
  map_put_batch(t, int64_spec(), keys.in(), KeySchema::scalar(KeyType::Int64), uks.in(),
                ValueType::Int64, vals.in(), TtlBatchSpec(), &ix);
  CHECK(map_entries(t) == (Entries{{{1, be64(5)}, le64(300)},
                                   {{1, be64(2)}, le64(200)},
                                   {{1, be64(-1)}, le64(400)},
                                   {{2, be64(1)}, le64(1)}}));
  // Insertion order: a repeated user key keeps its place.
  CHECK(listed(t, ix, 1) == (std::vector<std::string>{be64(5), be64(2), be64(-1)}));
  CHECK(listed(t, ix, 2) == (std::vector<std::string>{be64(1)}));
}

TEST(map_put_string_user_keys_binary_values_and_ttl) {
  StateTable t(0, 127);
  auto keys = fixed<int64_t>("l", I64{9, 9, 9, 9});
  auto uks = varwidth<int32_t>(
      "u", Str{std::string("b"), std::string("ab"), std::string("a"), std::string("b")});
  auto vals = varwidth<int64_t>(
      "Z", Str{std::string("x"), std::string("yy"), std::string(""), std::string("zzz")});
  map_put_batch(t, int64_spec(), keys.in(), KeySchema::scalar(KeyType::String), uks.in(),
                ValueType::Binary, vals.in());
  // ser(user key) = varlen(len + 1) | bytes; a value shrinking or growing is rewritten whole.
  CHECK(map_entries(t) ==
        (Entries{
            {{9, byte(2) + "b"}, "zzz"}, {{9, byte(3) + "ab"}, "yy"}, {{9, byte(2) + "a"}, ""}}));
  StateTable tt(0, 127);
  TtlBatchSpec ttl;
  ttl.enabled = true;
  ttl.ttl_ms = 10;
  ttl.now = 5;
  auto k1 = fixed<int64_t>("l", I64{1});
  auto u1 = fixed<int64_t>("l", I64{3});
  auto v1 = fixed<int64_t>("l", I64{4});
  map_put_batch(tt, int64_spec(), k1.in(), KeySchema::scalar(KeyType::Int64), u1.in(),
                ValueType::Int64, v1.in(), ttl);
  CHECK(map_entries(tt) == (Entries{{{1, be64(3)}, le64(4) + be64(5)}}));
}

TEST(map_put_rejects_bad_input_before_any_write) {
  StateTable t(0, 127);
  auto keys = fixed<int64_t>("l", I64{1, 2});
  auto uks = fixed<int64_t>("l", I64{1, 2});
  auto vals = fixed<int64_t>("l", I64{1, 2});
  const KeySchema uk = KeySchema::scalar(KeyType::Int64);
  map_put_batch(t, int64_spec(), keys.in(), uk, uks.in(), ValueType::Int64, vals.in());
  const auto before = dump(t);
  auto null_uk = fixed<int64_t>("l", I64{std::nullopt, 2});
  CHECK(batch_error(
      [&] {
        map_put_batch(t, int64_spec(), keys.in(), uk, null_uk.in(), ValueType::Int64, vals.in());
      },
      "user_keys: null at row 0"));
  auto null_v = fixed<int64_t>("l", I64{7, std::nullopt});
  CHECK(batch_error(
      [&] {
        map_put_batch(t, int64_spec(), keys.in(), uk, uks.in(), ValueType::Int64, null_v.in());
      },
      "values: null at row 1"));
  auto strs = varwidth<int32_t>("u", Str{std::string("a"), std::string("b")});
  CHECK(batch_error(
      [&] {
        map_put_batch(t, int64_spec(), keys.in(), uk, strs.in(), ValueType::Int64, vals.in());
      },
      "user_keys:"));
  auto short_uk = fixed<int64_t>("l", I64{1});
  CHECK(batch_error(
      [&] {
        validate_map_put_batch(t, int64_spec(), keys.in(), uk, short_uk.in(), ValueType::Int64,
                               vals.in());
      },
      "differs from keys length"));
  CHECK(dump(t) == before);
}

// Many rows over the same few maps in several batches, against a model: string user keys,
// binary values of random lengths (entries grow, shrink and keep their size), the index's
// order (first put first; a repeated put keeps the place), a snapshot held over each batch that
// must keep its values.
TEST(map_put_random_rows_match_a_model_and_keep_snapshots) {
  StateTable t(0, 127);
  CollectionIndex ix(0, 127);
  std::mt19937_64 rng(5);
  const char* names[] = {"", "a", "ab", "abc", "b", "ba", "c", "\xc3\xbf"};
  Entries model;
  std::map<int64_t, std::vector<std::string>> order;
  auto ser = [](const std::string& u) { return byte(static_cast<int>(u.size() + 1)) + u; };
  for (int batch = 0; batch < 20; ++batch) {
    I64 ks;
    Str us, vs;
    for (int r = 0; r < 150; ++r) {
      const int64_t k = static_cast<int64_t>(rng() % 4);
      const std::string u = names[rng() % 8];
      const std::string v(rng() % 21, static_cast<char>('A' + rng() % 26));
      ks.push_back(k);
      us.push_back(u);
      vs.push_back(v);
      if (model.count({k, ser(u)}) == 0) order[k].push_back(ser(u));
      model[{k, ser(u)}] = v;
    }
    std::vector<std::shared_ptr<MapSnapshot>> snaps;
    for (int32_t kg = 0; kg <= 127; ++kg) snaps.push_back(t.map(kg).snapshot());
    const auto before = blobs(t);
    auto keys = fixed<int64_t>("l", ks);
    auto uks = varwidth<int32_t>("u", us);
    auto vals = varwidth<int32_t>("z", vs);
    map_put_batch(t, int64_spec(), keys.in(), KeySchema::scalar(KeyType::String), uks.in(),
                  ValueType::Binary, vals.in(), TtlBatchSpec(), &ix);
    CHECK(map_entries(t) == model);
    for (const auto& ko : order) CHECK(listed(t, ix, ko.first) == ko.second);
    std::multiset<std::string> held;
    for (const auto& s : snaps)
      for (const MapChange& e : s->sorted_entries())
        held.insert(std::string(reinterpret_cast<const char*>(e.value.data), e.value.size));
    CHECK(held == before);
  }
}

// Every key hashes alike: each map's entries share one chain (chained engine) or probe run
// (flat), and the index's prefixes one probe run, which the kernel's lookups and its
// prefetches a group of rows ahead must walk. The index sharing the table's hash (its prefix
// hashes then come from the row keys) and hashing on its own give the same state.
uint32_t colliding_hash(const uint8_t*, size_t) { return 7; }

TEST(map_put_over_groups_of_rows_with_a_colliding_hash_matches_a_model) {
  for (KeyHashFunction index_hash : {&colliding_hash, static_cast<KeyHashFunction>(nullptr)}) {
    StateTable t(0, 127, &colliding_hash);
    CollectionIndex ix(0, 127, index_hash);
    std::mt19937_64 rng(11);
    Entries model;
    std::map<int64_t, std::vector<std::string>> order;
    for (int batch = 0; batch < 3; ++batch) {
      I64 ks, us, vs;
      for (int r = 0; r < 200; ++r) {  // more rows than two groups of RowKeys
        const int64_t k = static_cast<int64_t>(rng() % 40);
        const int64_t u = static_cast<int64_t>(rng() % 8);
        ks.push_back(k);
        us.push_back(u);
        vs.push_back(static_cast<int64_t>(batch * 1000 + r));
        if (model.count({k, be64(u)}) == 0) order[k].push_back(be64(u));
        model[{k, be64(u)}] = le64(batch * 1000 + r);
      }
      auto keys = fixed<int64_t>("l", ks);
      auto uks = fixed<int64_t>("l", us);
      auto vals = fixed<int64_t>("l", vs);
      map_put_batch(t, int64_spec(), keys.in(), KeySchema::scalar(KeyType::Int64), uks.in(),
                    ValueType::Int64, vals.in(), TtlBatchSpec(), &ix);
      CHECK(map_entries(t) == model);
      for (const auto& ko : order) CHECK(listed(t, ix, ko.first) == ko.second);
    }
    ix.check_invariants();
  }
}

TEST_MAIN()
