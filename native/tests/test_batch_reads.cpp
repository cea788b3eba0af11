// Collection read / removal kernels and clear (batch_reads.h) over hand-built Arrow arrays, on
// entries written by the collection kernels (batch_collections.h): list get (the list's chunks
// through the list index, fixed and variable-width elements, absent keys as empty lists, output
// appended over calls, chunks gone without notice unlisted), map get /
// contains / remove (one entry per user key, absent user keys, repeated rows, the map index
// kept), clear (of a map / list: every entry of it), TTL (expired elements / entries
// dropped and counted, return_expired, update_on_read), the incremental cleanup hook run before
// each row (ttl.h IncrementalCleanup), and errors that leave the table untouched.
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "batch_test_arrays.h"
#include "check.h"
#include "statecore/arrow_abi.h"
#include "statecore/batch.h"
#include "statecore/batch_collections.h"
#include "statecore/batch_reads.h"
#include "statecore/key_codec.h"
#include "statecore/state_table.h"
#include "statecore/ttl.h"

using namespace statecore;
using namespace statecore_test;

namespace {

TtlBatchSpec ttl_at(int64_t now, int64_t ttl_ms = 100) {
  TtlBatchSpec t;
  t.enabled = true;
  t.ttl_ms = ttl_ms;
  t.now = now;
  return t;
}

int64_t i64_at(const std::vector<uint8_t>& v, size_t i) {
  int64_t x;
  std::memcpy(&x, v.data() + i * 8, 8);
  return x;
}

}  // namespace

TEST(list_get_int64_rows_absent_keys_empty_and_chunks_append) {
  StateTable t(0, 127);
  ListIndex ix(0, 127);
  auto keys = fixed<int64_t>("l", I64{1, 2, 1});
  auto vals = fixed<int64_t>("l", I64{10, 20, 11});
  list_append_batch(t, int64_spec(), keys.in(), ValueType::Int64, vals.in(), TtlBatchSpec(), &ix);
  auto q1 = fixed<int64_t>("l", I64{2, 9, 1}, 3);  // sliced
  auto q2 = fixed<int64_t>("l", I64{1});
  std::vector<int64_t> lo{0}, eo{0};
  std::vector<uint8_t> el;
  const TtlBatchSpec none;
  list_get_batch(t, int64_spec(), q1.in(), ValueType::Int64, lo, el, eo, none, nullptr, &ix);
  list_get_batch(t, int64_spec(), q2.in(), ValueType::Int64, lo, el, eo, none, nullptr, &ix);
  CHECK(lo == (std::vector<int64_t>{0, 1, 1, 3, 5}));
  CHECK_EQ(el.size(), size_t(40));
  CHECK_EQ(i64_at(el, 0), 20);
  CHECK_EQ(i64_at(el, 1), 10);
  CHECK_EQ(i64_at(el, 2), 11);
  CHECK_EQ(i64_at(el, 4), 11);
  CHECK(eo == std::vector<int64_t>{0});  // fixed-width elements have no offsets
  CHECK(batch_error([&] { list_get_batch(t, int64_spec(), q2.in(), ValueType::Int64, lo, el, eo); },
                    "list index is required"));
}

TEST(list_get_string_elements_and_ttl_removes_expired_anywhere) {
  StateTable u(0, 127);
  ListIndex ix(0, 127);
  auto ka = fixed<int64_t>("l", I64{7, 7});
  auto kb = fixed<int64_t>("l", I64{7});
  auto va = varwidth<int32_t>("u", Str{std::string("ab"), std::string("")});
  auto vb = varwidth<int32_t>("u", Str{std::string("xyz")});
  auto vc = varwidth<int32_t>("u", Str{std::string("q")});
  auto append = [&](auto& k, auto& v, int64_t now) {
    list_append_batch(u, int64_spec(), k.in(), ValueType::String, v.in(), ttl_at(now), &ix);
  };
  append(ka, va, 0);    // expired
  append(kb, vb, 120);  // live
  append(kb, vc, 10);   // expired
  TtlBatchSpec tt = ttl_at(150);
  tt.update_on_read = true;
  std::vector<int64_t> lo{0}, eo{0};
  std::vector<uint8_t> el;
  int64_t expired = -1;
  list_get_batch(u, int64_spec(), kb.in(), ValueType::String, lo, el, eo, tt, &expired, &ix);
  CHECK_EQ(expired, 3);
  CHECK(lo == (std::vector<int64_t>{0, 1}));
  CHECK(eo == (std::vector<int64_t>{0, 3}));
  CHECK(std::string(el.begin(), el.end()) == "xyz");
  // The chunk keeps the live element only, restamped 150.
  CHECK(lists(u) == (std::multiset<std::string>{"\x03xyz" + be64(150) + "#0"}));
  CHECK_EQ(ix.lists(), size_t(0));
  append(kb, vc, 150);
  CHECK(lists(u) ==
        (std::multiset<std::string>{"\x03xyz" + be64(150) + "\x01q" + be64(150) + "#0"}));
  // Everything expired at 300: the chunk goes, the row is an empty list.
  lo = {0};
  eo = {0};
  el.clear();
  list_get_batch(u, int64_spec(), kb.in(), ValueType::String, lo, el, eo, ttl_at(300), &expired,
                 &ix);
  CHECK_EQ(expired, 2);
  CHECK(lo == (std::vector<int64_t>{0, 0}));
  CHECK(dump(u).empty());
  CHECK_EQ(ix.lists(), size_t(0));
}

TEST(list_get_ttl_return_expired_shows_all_and_update_on_read_renews) {
  StateTable t(0, 127);
  ListIndex ix(0, 127);
  auto k = fixed<int64_t>("l", I64{4});
  auto a = fixed<int64_t>("l", I64{1});
  auto b = fixed<int64_t>("l", I64{2});
  list_append_batch(t, int64_spec(), k.in(), ValueType::Int64, a.in(), ttl_at(0), &ix);
  list_append_batch(t, int64_spec(), k.in(), ValueType::Int64, b.in(), ttl_at(100), &ix);
  TtlBatchSpec tt = ttl_at(150);
  tt.return_expired = true;
  std::vector<int64_t> lo{0}, eo{0};
  std::vector<uint8_t> el;
  int64_t expired = 0;
  list_get_batch(t, int64_spec(), k.in(), ValueType::Int64, lo, el, eo, tt, &expired, &ix);
  CHECK_EQ(expired, 1);
  CHECK(lo == (std::vector<int64_t>{0, 2}));
  CHECK_EQ(i64_at(el, 0), 1);
  CHECK_EQ(i64_at(el, 1), 2);
  CHECK(lists(t) == (std::multiset<std::string>{le64(2) + be64(100) + "#0"}));  // not renewed
  TtlBatchSpec renew = ttl_at(160);
  renew.update_on_read = true;
  list_get_batch(t, int64_spec(), k.in(), ValueType::Int64, lo, el, eo, renew, &expired, &ix);
  CHECK_EQ(expired, 0);
  CHECK(lists(t) == (std::multiset<std::string>{le64(2) + be64(160) + "#0"}));
}

TEST(list_get_ttl_drops_a_chunk_left_empty_and_unlists_it) {
  StateTable t(0, 127);
  ListIndex ix(0, 127);
  const size_t k = kListChunkElements;
  I64 ks, old_vals, new_vals;
  for (size_t i = 0; i < k; ++i) {
    ks.push_back(6);
    old_vals.push_back(static_cast<int64_t>(i));
    new_vals.push_back(static_cast<int64_t>(100 + i));
  }
  auto keys = fixed<int64_t>("l", ks);
  auto a = fixed<int64_t>("l", old_vals);
  auto b = fixed<int64_t>("l", new_vals);
  list_append_batch(t, int64_spec(), keys.in(), ValueType::Int64, a.in(), ttl_at(0), &ix);
  list_append_batch(t, int64_spec(), keys.in(), ValueType::Int64, b.in(), ttl_at(100), &ix);
  CHECK_EQ(ix.chunks(), size_t(2));
  auto q = fixed<int64_t>("l", I64{6});
  std::vector<int64_t> lo{0}, eo{0};
  std::vector<uint8_t> el;
  int64_t expired = 0;
  list_get_batch(t, int64_spec(), q.in(), ValueType::Int64, lo, el, eo, ttl_at(150), &expired, &ix);
  CHECK_EQ(expired, static_cast<int64_t>(k));
  CHECK(lo == (std::vector<int64_t>{0, static_cast<int64_t>(k)}));
  CHECK_EQ(i64_at(el, 0), 100);
  CHECK_EQ(t.size(), size_t(1));  // chunk 0 removed, chunk 1 kept as it was
  CHECK_EQ(ix.lists(), size_t(1));
  CHECK_EQ(ix.chunks(), size_t(1));
  // The next append goes to chunk 1 (full) and so starts chunk 2.
  auto one = fixed<int64_t>("l", I64{6});
  list_append_batch(t, int64_spec(), one.in(), ValueType::Int64, one.in(), ttl_at(150), &ix);
  CHECK_EQ(ix.chunks(), size_t(2));
  std::vector<uint64_t> cs;
  for (const auto& kv : dump(t)) cs.push_back(static_cast<uint8_t>(kv.first.back()));
  CHECK(cs == (std::vector<uint64_t>{1, 2}));
}

TEST(list_get_unlists_chunks_gone_without_notice) {
  StateTable t(0, 127);
  ListIndex ix(0, 127);
  const size_t n = 2 * kListChunkElements + 1;  // chunks 0, 1 and 2
  I64 ks, vs;
  for (size_t i = 0; i < n; ++i) {
    ks.push_back(5);
    vs.push_back(static_cast<int64_t>(i));
  }
  auto k = fixed<int64_t>("l", ks);
  auto v = fixed<int64_t>("l", vs);
  list_append_batch(t, int64_spec(), k.in(), ValueType::Int64, v.in(), TtlBatchSpec(), &ix);
  // Remove the middle chunk's entry behind the index's back.
  for (const auto& kv : dump(t)) {
    if (kv.first.back() != '\1') continue;
    const auto* kb = reinterpret_cast<const uint8_t*>(kv.first.data());
    const int32_t kg = read_key_group_prefix(kb, kv.first.size(), 128);
    t.map(kg).remove(kb, kv.first.size());
  }
  auto q = fixed<int64_t>("l", I64{5});
  std::vector<int64_t> lo{0}, eo{0};
  std::vector<uint8_t> el;
  list_get_batch(t, int64_spec(), q.in(), ValueType::Int64, lo, el, eo, TtlBatchSpec(), nullptr,
                 &ix);
  CHECK(lo == (std::vector<int64_t>{0, static_cast<int64_t>(kListChunkElements + 1)}));
  CHECK_EQ(i64_at(el, 0), 0);
  CHECK_EQ(i64_at(el, kListChunkElements), static_cast<int64_t>(n - 1));
  CHECK_EQ(ix.chunks(), size_t(2));
}

TEST(map_get_contains_remove_int64_user_keys) {
  StateTable t(0, 127);
  const KeySchema uk = KeySchema::scalar(KeyType::Int64);
  auto keys = fixed<int64_t>("l", I64{1, 1, 2});
  auto uks = fixed<int64_t>("l", I64{5, 3, 5});
  auto vals = fixed<int64_t>("l", I64{50, 30, 55});
  map_put_batch(t, int64_spec(), keys.in(), uk, uks.in(), ValueType::Int64, vals.in());
  auto qk = fixed<int64_t>("l", I64{1, 1, 1, 2, 3}, 2);
  auto qu = fixed<int64_t>("l", I64{3, 4, 5, 3, 5}, 1);
  std::vector<int64_t> out(5, -1);
  std::vector<uint8_t> valid(5, 9), found(5, 9);
  MapGetOutput o;
  o.fixed = out.data();
  o.valid = valid.data();
  map_get_batch(t, int64_spec(), qk.in(), uk, qu.in(), ValueType::Int64, o);
  CHECK(valid == (std::vector<uint8_t>{1, 0, 1, 0, 0}));
  CHECK_EQ(out[0], 30);
  CHECK_EQ(out[2], 50);
  map_contains_batch(t, int64_spec(), qk.in(), uk, qu.in(), ValueType::Int64, found.data());
  CHECK(found == valid);
  // Remove 5 of key 1 twice (the repeat finds nothing), and 5 of key 2: one entry is left.
  auto rk = fixed<int64_t>("l", I64{1, 1, 2, 9});
  auto ru = fixed<int64_t>("l", I64{5, 5, 5, 5});
  map_remove_batch(t, int64_spec(), rk.in(), uk, ru.in());
  CHECK_EQ(t.size(), size_t(1));
  map_contains_batch(t, int64_spec(), qk.in(), uk, qu.in(), ValueType::Int64, found.data());
  CHECK(found == (std::vector<uint8_t>{1, 0, 0, 0, 0}));
}

TEST(map_get_string_values_append_chunks) {
  StateTable t(0, 127);
  const KeySchema uk = KeySchema::scalar(KeyType::String);
  auto keys = fixed<int64_t>("l", I64{1, 1});
  auto uks = varwidth<int32_t>("u", Str{std::string("b"), std::string("a")});
  auto vals = varwidth<int32_t>("z", Str{std::string("BB"), std::string("")});
  map_put_batch(t, int64_spec(), keys.in(), uk, uks.in(), ValueType::Binary, vals.in());
  auto q1 = varwidth<int64_t>("U", Str{std::string("a"), std::string("c")});
  auto q2 = varwidth<int32_t>("u", Str{std::string("b")});
  auto k1 = fixed<int64_t>("l", I64{1, 1});
  auto k2 = fixed<int64_t>("l", I64{1});
  std::vector<int64_t> offs{0};
  std::vector<uint8_t> data, valid(3, 9);
  MapGetOutput o;
  o.offsets = &offs;
  o.data = &data;
  o.valid = valid.data();
  map_get_batch(t, int64_spec(), k1.in(), uk, q1.in(), ValueType::Binary, o);
  o.valid = valid.data() + 2;
  map_get_batch(t, int64_spec(), k2.in(), uk, q2.in(), ValueType::Binary, o);
  CHECK(valid == (std::vector<uint8_t>{1, 0, 1}));
  CHECK(offs == (std::vector<int64_t>{0, 0, 0, 2}));
  CHECK(std::string(data.begin(), data.end()) == "BB");
}

TEST(map_ttl_get_removes_expired_entry_counts_and_renews) {
  StateTable t(0, 127);
  const KeySchema uk = KeySchema::scalar(KeyType::Int64);
  auto k = fixed<int64_t>("l", I64{1});
  auto u3 = fixed<int64_t>("l", I64{3});
  auto u5 = fixed<int64_t>("l", I64{5});
  auto v = fixed<int64_t>("l", I64{7});
  map_put_batch(t, int64_spec(), k.in(), uk, u3.in(), ValueType::Int64, v.in(), ttl_at(0));
  map_put_batch(t, int64_spec(), k.in(), uk, u5.in(), ValueType::Int64, v.in(), ttl_at(100));
  int64_t out = -1, expired = -1;
  uint8_t valid = 9;
  MapGetOutput o;
  o.fixed = &out;
  o.valid = &valid;
  TtlBatchSpec tt = ttl_at(150);
  tt.return_expired = true;
  map_get_batch(t, int64_spec(), k.in(), uk, u3.in(), ValueType::Int64, o, tt, &expired);
  CHECK_EQ(valid, 1);  // shown once
  CHECK_EQ(out, 7);
  CHECK_EQ(expired, 1);
  map_contains_batch(t, int64_spec(), k.in(), uk, u3.in(), ValueType::Int64, &valid, tt, &expired);
  CHECK_EQ(valid, 0);  // gone
  CHECK_EQ(expired, 0);
  TtlBatchSpec renew = ttl_at(160);
  renew.update_on_read = true;
  map_contains_batch(t, int64_spec(), k.in(), uk, u5.in(), ValueType::Int64, &valid, renew,
                     &expired);
  CHECK_EQ(valid, 1);
  const auto d = dump(t);
  CHECK_EQ(d.size(), size_t(1));
  CHECK(d.begin()->second.substr(d.begin()->second.size() - 8) == be64(160));
  // The other entry expires: it goes.
  map_get_batch(t, int64_spec(), k.in(), uk, u5.in(), ValueType::Int64, o, ttl_at(500), &expired);
  CHECK_EQ(valid, 0);
  CHECK_EQ(expired, 1);
  CHECK(dump(t).empty());
}

TEST(clear_removes_entries_of_any_kind) {
  StateTable t(0, 127);
  auto keys = fixed<int64_t>("l", I64{1, 2, 3});
  auto vals = fixed<int64_t>("l", I64{1, 2, 3});
  put_batch(t, int64_spec(), keys.in(), ValueType::Int64, vals.in());
  auto ck = fixed<int64_t>("l", I64{2, 2, 4, 3}, 1);
  clear_batch(t, int64_spec(), ck.in());
  CHECK_EQ(t.size(), size_t(1));
}

TEST(clear_of_a_list_removes_every_chunk) {
  StateTable t(0, 127);
  ListIndex ix(0, 127);
  auto keys = fixed<int64_t>("l", I64{1, 2, 1, 3, 1});
  auto vals = fixed<int64_t>("l", I64{1, 2, 3, 4, 5});
  list_append_batch(t, int64_spec(), keys.in(), ValueType::Int64, vals.in(), TtlBatchSpec(), &ix);
  auto ck = fixed<int64_t>("l", I64{1, 3, 1});
  clear_batch(t, int64_spec(), ck.in(), nullptr, &ix);
  CHECK(lists(t) == (std::multiset<std::string>{le64(2) + "#0"}));
  CHECK_EQ(ix.lists(), size_t(0));
  // A list of several chunks: every one goes, and the list is unlisted.
  I64 many_k, many_v;
  for (size_t i = 0; i < 3 * kListChunkElements; ++i) {
    many_k.push_back(8);
    many_v.push_back(static_cast<int64_t>(i));
  }
  auto mk = fixed<int64_t>("l", many_k);
  auto mv = fixed<int64_t>("l", many_v);
  list_append_batch(t, int64_spec(), mk.in(), ValueType::Int64, mv.in(), TtlBatchSpec(), &ix);
  CHECK_EQ(t.size(), size_t(4));
  auto c8 = fixed<int64_t>("l", I64{8});
  clear_batch(t, int64_spec(), c8.in(), nullptr, &ix);
  CHECK_EQ(t.size(), size_t(1));
  CHECK_EQ(ix.lists(), size_t(0));
  // A cleared list starts at chunk 0 again.
  auto k1 = fixed<int64_t>("l", I64{1});
  list_append_batch(t, int64_spec(), k1.in(), ValueType::Int64, k1.in(), TtlBatchSpec(), &ix);
  CHECK(lists(t) == (std::multiset<std::string>{le64(2) + "#0", le64(1) + "#0"}));
}

TEST(map_kernels_keep_the_index_and_clear_a_map_through_it) {
  StateTable t(0, 127);
  CollectionIndex ix(0, 127);
  const KeySchema uk = KeySchema::scalar(KeyType::Int64);
  auto keys = fixed<int64_t>("l", I64{1, 1, 1, 2});
  auto uks = fixed<int64_t>("l", I64{5, 3, 5, 5});
  auto vals = fixed<int64_t>("l", I64{50, 30, 51, 55});
  map_put_batch(t, int64_spec(), keys.in(), uk, uks.in(), ValueType::Int64, vals.in(),
                TtlBatchSpec(), &ix);
  CHECK_EQ(t.size(), size_t(3));  // one entry per (key, user key)
  CHECK_EQ(ix.members(), size_t(3));
  CHECK_EQ(ix.collections(), size_t(2));
  auto rk = fixed<int64_t>("l", I64{1});
  auto ru = fixed<int64_t>("l", I64{5});
  map_remove_batch(t, int64_spec(), rk.in(), uk, ru.in(), &ix);
  CHECK_EQ(ix.members(), size_t(2));
  map_put_batch(t, int64_spec(), rk.in(), uk, ru.in(), ValueType::Int64, ru.in(), TtlBatchSpec(),
                &ix);
  // Key 1's map lists 3 then 5 (removed and put again: last).
  std::vector<std::string> order;
  for (const auto& kv : dump(t)) {
    if (kv.first.size() != 1 + 8 + 1 + 8 || kv.first.substr(1, 8) != be64(1)) continue;
    const auto* p = reinterpret_cast<const uint8_t*>(kv.first.data());
    const int32_t kg = static_cast<int32_t>(p[0]);
    ix.for_each(kg, p, 10, [&](const uint8_t* m, size_t n) {
      order.emplace_back(reinterpret_cast<const char*>(m), n);
    });
    break;
  }
  CHECK(order == (std::vector<std::string>{be64(3), be64(5)}));
  // TTL: an expired entry read is removed and unlisted.
  StateTable tt(0, 127);
  CollectionIndex tix(0, 127);
  map_put_batch(tt, int64_spec(), rk.in(), uk, ru.in(), ValueType::Int64, ru.in(), ttl_at(0), &tix);
  uint8_t found = 9;
  int64_t expired = 0;
  map_contains_batch(tt, int64_spec(), rk.in(), uk, ru.in(), ValueType::Int64, &found, ttl_at(500),
                     &expired, &tix);
  CHECK_EQ(int(found), 0);
  CHECK_EQ(expired, 1);
  CHECK_EQ(tix.members(), size_t(0));
  // Clearing key 1 removes both of its entries, key 2's stays.
  clear_batch(t, int64_spec(), rk.in(), &ix);
  CHECK_EQ(t.size(), size_t(1));
  CHECK_EQ(ix.members(), size_t(1));
}

// ---- incremental cleanup before each row (ttl.h IncrementalCleanup, batch.h "TTL")

namespace {

// The hook of a TTL state over `t` (TTL 100 ms) at `now`, `size` entries a step.
ttl::IncrementalCleanup cleanup_hook(StateTable& t, int64_t now, size_t size) {
  ttl::IncrementalCleanup h;
  h.table = &t;
  h.cleanup_size = size;
  h.spec.ttl_ms = 100;
  h.now = now;
  return h;
}

// 300 int64 values written at 0 (keys 0..299, expired from 100 on) and key 1000 written at 50.
void fill_expired(StateTable& t) {
  I64 ks;
  for (int64_t i = 0; i < 300; ++i) ks.push_back(i);
  auto k = fixed<int64_t>("l", ks);
  put_batch(t, int64_spec(), k.in(), ValueType::Int64, k.in(), ttl_at(0));
  auto live = fixed<int64_t>("l", I64{1000});
  put_batch(t, int64_spec(), live.in(), ValueType::Int64, live.in(), ttl_at(50));
}

}  // namespace

TEST(incremental_cleanup_hook_steps_before_each_row) {
  StateTable a(0, 127), b(0, 127), c(0, 127);
  fill_expired(a);
  fill_expired(b);
  fill_expired(c);
  // Reads at 120 under return_expired of the live key and expired ones: 120 rows x 5 entries
  // a step complete a pass, and some rows meet an expired key before a step does.
  I64 q;
  for (int64_t i = 0; i < 120; ++i) q.push_back(i % 3 == 0 ? 1000 : (i * 37) % 300);
  const size_t n = q.size();
  auto qa = fixed<int64_t>("l", q);
  TtlBatchSpec read = ttl_at(120);
  read.return_expired = true;
  // a: one batch with the hook.
  ttl::IncrementalCleanup ha = cleanup_hook(a, 120, 5);
  TtlBatchSpec hooked = read;
  hooked.cleanup = &ha;
  std::vector<int64_t> out_a(n), out_b(n), out_c(n);
  std::vector<uint8_t> valid_a(n), valid_b(n), valid_c(n);
  int64_t exp_a = 0, exp_b = 0, exp_c = 0;
  get_batch_fixed(a, int64_spec(), qa.in(), ValueType::Int64, out_a.data(), valid_a.data(), hooked,
                  &exp_a);
  // b: the rows one at a time, each a step then a one-row read.
  ttl::IncrementalCleanup hb = cleanup_hook(b, 120, 5);
  for (size_t i = 0; i < n; ++i) {
    ttl::cleanup_row(hb);
    auto one = fixed<int64_t>("l", I64{q[i]});
    int64_t e = 0;  // each call reports its own count
    get_batch_fixed(b, int64_spec(), one.in(), ValueType::Int64, &out_b[i], &valid_b[i], read, &e);
    exp_b += e;
  }
  CHECK(out_a == out_b);
  CHECK(valid_a == valid_b);
  CHECK_EQ(exp_a, exp_b);
  CHECK_EQ(ha.expired, hb.expired);
  CHECK_EQ(ha.visited, hb.visited);
  CHECK_EQ(ha.cursor.key_group, hb.cursor.key_group);
  CHECK_EQ(ha.cursor.bucket, hb.cursor.bucket);
  CHECK(dump(a) == dump(b));
  CHECK_EQ(a.size(), size_t(1));  // the pass removed every expired value the rows left
  CHECK_EQ(ha.expired + static_cast<size_t>(exp_a), size_t(300));
  CHECK(exp_a > 0);  // rows that met an expired key first, showing its stale value
  // c: every step first (not the rows one at a time): the expired keys read nothing.
  ttl::IncrementalCleanup hc = cleanup_hook(c, 120, 5);
  for (size_t i = 0; i < n; ++i) ttl::cleanup_row(hc);
  get_batch_fixed(c, int64_spec(), qa.in(), ValueType::Int64, out_c.data(), valid_c.data(), read,
                  &exp_c);
  CHECK(valid_c != valid_a);
  CHECK_EQ(exp_c, 0);
}

TEST(incremental_cleanup_hook_in_a_lane_kernel_keeps_snapshots) {
  StateTable a(0, 127), b(0, 127);
  fill_expired(a);
  fill_expired(b);
  TableSnapshot snap = a.snapshot();
  // Writes at 120 through the put kernel's lanes (new keys, overwrites, null rows removing),
  // 2 entries a step: the steps remove expired values from maps the lanes write.
  I64 ks, vs;
  for (int64_t i = 0; i < 400; ++i) {
    ks.push_back(i % 2 ? 500 + i : (i * 7) % 300);
    vs.push_back(i % 5 == 0 ? std::nullopt : std::optional<int64_t>(i));
  }
  auto k = fixed<int64_t>("l", ks);
  auto v = fixed<int64_t>("l", vs);
  ttl::IncrementalCleanup ha = cleanup_hook(a, 120, 2);
  TtlBatchSpec hooked = ttl_at(120);
  hooked.cleanup = &ha;
  put_batch(a, int64_spec(), k.in(), ValueType::Int64, v.in(), hooked);
  ttl::IncrementalCleanup hb = cleanup_hook(b, 120, 2);
  for (size_t i = 0; i < ks.size(); ++i) {
    ttl::cleanup_row(hb);
    auto k1 = fixed<int64_t>("l", I64{ks[i]});
    auto v1 = fixed<int64_t>("l", I64{vs[i]});
    put_batch(b, int64_spec(), k1.in(), ValueType::Int64, v1.in(), ttl_at(120));
  }
  CHECK(dump(a) == dump(b));
  CHECK_EQ(ha.expired, hb.expired);
  CHECK(ha.expired > 0);
  CHECK_EQ(snap.size(), size_t(301));  // the live snapshot still sees every value
  snap.release();
}

TEST(incremental_cleanup_hook_unlists_removed_map_entries) {
  StateTable t(0, 127);
  CollectionIndex ix(0, 127);
  const KeySchema uk = KeySchema::scalar(KeyType::Int64);
  I64 ks;
  for (int64_t i = 0; i < 50; ++i) ks.push_back(i);
  auto keys = fixed<int64_t>("l", ks);
  auto ones = fixed<int64_t>("l", I64(50, int64_t{1}));
  map_put_batch(t, int64_spec(), keys.in(), uk, ones.in(), ValueType::Int64, keys.in(), ttl_at(0),
                &ix);
  CHECK_EQ(ix.members(), size_t(50));
  // 30 reads of an absent key at 200, 2 entries a step: the steps reach all 50 expired entries
  // (one table entry a user key, laid out as a value: docs/formats.md "Map state").
  ttl::IncrementalCleanup h = cleanup_hook(t, 200, 2);
  h.index = &ix;
  h.index_key = KeySchema::scalar(KeyType::Int64);
  h.index_max_parallelism = 128;
  TtlBatchSpec hooked = ttl_at(200);
  hooked.cleanup = &h;
  auto q = fixed<int64_t>("l", I64(30, int64_t{1000}));
  auto qu = fixed<int64_t>("l", I64(30, int64_t{1}));
  std::vector<uint8_t> found(30, 9);
  int64_t expired = 0;
  map_contains_batch(t, int64_spec(), q.in(), uk, qu.in(), ValueType::Int64, found.data(), hooked,
                     &expired, &ix);
  CHECK_EQ(expired, 0);
  CHECK_EQ(h.expired, size_t(50));
  CHECK_EQ(t.size(), size_t(0));
  CHECK_EQ(ix.members(), size_t(0));
}

TEST(read_kernels_reject_bad_input_before_any_change) {
  StateTable t(0, 127);
  const KeySchema uk = KeySchema::scalar(KeyType::Int64);
  auto keys = fixed<int64_t>("l", I64{1, 2});
  auto uks = fixed<int64_t>("l", I64{1, 2});
  auto vals = fixed<int64_t>("l", I64{1, 2});
  map_put_batch(t, int64_spec(), keys.in(), uk, uks.in(), ValueType::Int64, vals.in(), ttl_at(0));
  const auto before = dump(t);
  auto null_key = fixed<int64_t>("l", I64{1, std::nullopt});
  auto null_uk = fixed<int64_t>("l", I64{2, std::nullopt});
  auto short_uk = fixed<int64_t>("l", I64{2});
  auto str_keys = varwidth<int32_t>("u", Str{std::string("a"), std::string("b")});
  CHECK(batch_error([&] { clear_batch(t, int64_spec(), null_key.in()); }, "null key at row 1"));
  CHECK(batch_error([&] { clear_batch(t, int64_spec(), str_keys.in()); }, "keys"));
  CHECK(batch_error([&] { map_remove_batch(t, int64_spec(), keys.in(), uk, null_uk.in()); },
                    "null at row 1"));
  CHECK(batch_error([&] { map_remove_batch(t, int64_spec(), keys.in(), uk, short_uk.in()); },
                    "length"));
  uint8_t found[2];
  CHECK(batch_error(
      [&] {
        map_contains_batch(t, int64_spec(), keys.in(), uk, uks.in(), ValueType::Int64, found,
                           ttl_at(500, 0));
      },
      "ttl_ms"));
  // Key group outside the table's range.
  StateTable small(0, 3);
  BatchKeySpec s = int64_spec();
  s.kg_end = 3;
  auto far = fixed<int64_t>("l", I64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  CHECK(batch_error([&] { clear_batch(small, s, far.in()); }, "outside"));
  CHECK(dump(t) == before);
  // A chunk that does not parse as the element type (an int64 chunk read with the TTL layout,
  // a string chunk read as int64) is a BatchError.
  StateTable lt(0, 127);
  ListIndex lix(0, 127);
  auto lk = fixed<int64_t>("l", I64{1});
  auto ls = varwidth<int32_t>("u", Str{std::string("ab")});
  list_append_batch(lt, int64_spec(), lk.in(), ValueType::Int64, lk.in(), TtlBatchSpec(), &lix);
  auto lk2 = fixed<int64_t>("l", I64{2});
  list_append_batch(lt, int64_spec(), lk2.in(), ValueType::String, ls.in(), TtlBatchSpec(), &lix);
  const auto lbefore = dump(lt);
  std::vector<int64_t> lo{0}, eo{0};
  std::vector<uint8_t> el;
  CHECK(batch_error(
      [&] {
        list_get_batch(lt, int64_spec(), lk.in(), ValueType::Int32, lo, el, eo, ttl_at(0, 1000),
                       nullptr, &lix);
      },
      "does not parse"));
  CHECK(batch_error(
      [&] {
        list_get_batch(lt, int64_spec(), lk2.in(), ValueType::Int64, lo, el, eo, TtlBatchSpec(),
                       nullptr, &lix);
      },
      "does not parse"));
  CHECK(dump(lt) == lbefore);
  CHECK(dump(t) == before);
}

TEST_MAIN()
