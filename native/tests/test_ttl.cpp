// The TTL suffix and filter (ttl.h). The same cases run in Python against
// statecore.ttl.filter_expired (tests/test_ttl.py), which must agree byte for byte.
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/key_codec.h"
#include "statecore/state_map.h"
#include "statecore/state_table.h"
#include "statecore/ttl.h"

using namespace statecore;
using namespace statecore::ttl;

namespace {

using Bytes = std::vector<uint8_t>;

void put_ts(Bytes& b, int64_t ts) {
  size_t n = b.size();
  b.resize(n + 8);
  store_timestamp(b.data() + n, ts);
}

Bytes value(std::initializer_list<uint8_t> user, int64_t ts) {
  Bytes b(user);
  put_ts(b, ts);
  return b;
}

void fixed_elem(Bytes& b, uint8_t fill, size_t w, int64_t ts) {
  b.insert(b.end(), w, fill);
  put_ts(b, ts);
}

void var_elem(Bytes& b, size_t len, int64_t ts) {
  append_varlen(b, len);
  b.insert(b.end(), len, static_cast<uint8_t>(len));
  put_ts(b, ts);
}

FilterResult run(Layout l, uint32_t w, int64_t ttl, int64_t now, const Bytes& v, Bytes* out) {
  FilterSpec s;
  s.layout = l;
  s.fixed_width = w;
  s.ttl_ms = ttl;
  return filter_value(s, now, ByteView{v.data(), v.size()}, out);
}

}  // namespace

TEST(timestamp_is_big_endian_signed) {
  uint8_t b[8];
  store_timestamp(b, 0x0102030405060708LL);
  CHECK_EQ(b[0], 1);
  CHECK_EQ(b[7], 8);
  CHECK_EQ(load_timestamp(b), 0x0102030405060708LL);
  store_timestamp(b, -2);
  CHECK_EQ(b[0], 0xff);
  CHECK_EQ(b[7], 0xfe);
  CHECK_EQ(load_timestamp(b), -2);
  store_timestamp(b, INT64_MIN);
  CHECK_EQ(load_timestamp(b), INT64_MIN);
}

TEST(expiry_rule_and_overflow_guard) {
  CHECK(!expired(0, 100, 99));
  CHECK(expired(0, 100, 100));  // exactly at ts + ttl it is expired
  CHECK(expired(0, 100, 101));
  CHECK(!expired(10, INT64_MAX, INT64_MAX));  // ts + ttl overflows: never expires
  CHECK(!expired(1, INT64_MAX, INT64_MAX));
  CHECK(expired(0, INT64_MAX, INT64_MAX));
  CHECK(expired(INT64_MIN, 1, INT64_MIN + 1));
  CHECK(!expired(INT64_MIN, 1, INT64_MIN));
}

TEST(value_kept_dropped_short) {
  Bytes out;
  Bytes v = value({1, 2, 3}, 50);
  CHECK(run(Layout::Value, 0, 100, 149, v, &out) == FilterResult::Keep);
  CHECK(run(Layout::Value, 0, 100, 150, v, &out) == FilterResult::Drop);
  CHECK(run(Layout::Value, 0, 100, 150, v, nullptr) == FilterResult::Drop);
  Bytes short_value{1, 2, 3, 4, 5, 6, 7};
  CHECK(run(Layout::Value, 0, 1, INT64_MAX, short_value, &out) == FilterResult::Keep);
  CHECK_THROWS(run(Layout::Value, 0, 0, 0, v, &out), std::invalid_argument);
}

TEST(fixed_width_list_suffix_by_stride) {
  Bytes v;
  fixed_elem(v, 1, 8, 10);
  fixed_elem(v, 2, 8, 20);
  fixed_elem(v, 3, 8, 30);
  Bytes out;
  CHECK(run(Layout::List, 8, 100, 109, v, &out) == FilterResult::Keep);
  CHECK(out.empty());
  CHECK(run(Layout::List, 8, 100, 110, v, &out) == FilterResult::Trim);
  CHECK(out == Bytes(v.begin() + 16, v.end()));
  CHECK(run(Layout::List, 8, 100, 125, v, &out) == FilterResult::Trim);
  CHECK(out == Bytes(v.begin() + 32, v.end()));
  CHECK(run(Layout::List, 8, 100, 130, v, &out) == FilterResult::Drop);
  Bytes truncated(v.begin(), v.end() - 1);
  CHECK_THROWS(run(Layout::List, 8, 100, 200, truncated, &out), std::invalid_argument);
}

TEST(variable_length_list_walk) {
  Bytes v;
  var_elem(v, 0, 10);
  var_elem(v, 200, 20);  // two-byte varlen
  var_elem(v, 3, 30);
  Bytes out;
  CHECK(run(Layout::List, 0, 100, 105, v, &out) == FilterResult::Keep);
  CHECK(run(Layout::List, 0, 100, 110, v, &out) == FilterResult::Trim);
  CHECK(out == Bytes(v.begin() + 9, v.end()));
  CHECK(run(Layout::List, 0, 100, 120, v, &out) == FilterResult::Trim);
  CHECK(out == Bytes(v.begin() + 9 + 2 + 200 + 8, v.end()));
  CHECK(run(Layout::List, 0, 100, 1000, v, &out) == FilterResult::Drop);
  Bytes broken{0x80};
  CHECK_THROWS(run(Layout::List, 0, 100, 1000, broken, &out), std::invalid_argument);
  Bytes too_long;
  append_varlen(too_long, 50);
  too_long.insert(too_long.end(), 20, 0);
  CHECK_THROWS(run(Layout::List, 0, 100, 1000, too_long, &out), std::invalid_argument);
}

namespace {

uint32_t bad_hash(const uint8_t*, size_t) { return 7; }  // every key collides

std::string key_of(int i) { return "k" + std::to_string(i); }

void put_value(StateMap& m, const std::string& k, int64_t ts) {
  uint8_t* dst = m.put(reinterpret_cast<const uint8_t*>(k.data()), k.size(), 16);
  std::memset(dst, 0xab, 8);
  store_timestamp(dst + 8, ts);
}

std::set<std::string> keys_of(const SortedRun& r) {
  std::set<std::string> s;
  for (size_t i = 0; i < r.size(); ++i) {
    ByteView k = r.key(i);
    s.insert(std::string(reinterpret_cast<const char*>(k.data), k.size));
  }
  return s;
}

// One full pass of collect_buckets in steps of `step` entries; returns how often each key was seen.
std::map<std::string, int> one_pass(StateMap& m, size_t step, int max_calls = 1 << 20) {
  std::map<std::string, int> seen;
  uint64_t cursor = 0;
  SortedRun run;
  for (int calls = 0; calls < max_calls; ++calls) {
    bool wrapped = m.collect_buckets(&cursor, step, &run);
    for (const auto& k : keys_of(run)) seen[k]++;
    if (wrapped) break;
  }
  return seen;
}

}  // namespace

TEST(collect_buckets_visits_every_entry_once_per_pass) {
  for (KeyHashFunction h : {static_cast<KeyHashFunction>(nullptr), &bad_hash}) {
    StateMap m(h);
    for (int i = 0; i < 3000; ++i) put_value(m, key_of(i), i);
    for (size_t step : {1, 5, 1000}) {
      auto seen = one_pass(m, step);
      CHECK_EQ(seen.size(), size_t{3000});
      bool once = true;
      for (auto& kv : seen) once = once && kv.second == 1;
      CHECK(once);
    }
  }
}

TEST(collect_buckets_survives_rehash_and_snapshots) {
  StateMap m;
  for (int i = 0; i < 96; ++i) put_value(m, key_of(i), i);  // capacity 128, threshold 96
  uint64_t cursor = 0;
  SortedRun run;
  std::map<std::string, int> seen;
  bool wrapped = false;
  int next = 96;
  auto snap = m.snapshot();
  while (!wrapped) {
    wrapped = m.collect_buckets(&cursor, 3, &run);
    for (const auto& k : keys_of(run)) seen[k]++;
    // Grow during the walk: rehashes start and run while the cursor moves.
    for (int j = 0; j < 4; ++j, ++next) put_value(m, key_of(next), next);
  }
  CHECK(m.stats().rehashes >= 1);
  // Every key present from start to end of the pass was seen (revisits allowed, no misses).
  for (int i = 0; i < 96; ++i) CHECK(seen.count(key_of(i)) == 1);
  CHECK_EQ(snap->size(), size_t{96});
  // A cursor past the capacity restarts.
  cursor = uint64_t{1} << 40;
  m.collect_buckets(&cursor, 1, &run);
  CHECK(run.size() >= 1);
}

TEST(collect_buckets_during_a_rehash_reads_both_tables) {
  StateMap n;
  int count = 0;
  while (!n.is_rehashing() && count < 100000) put_value(n, key_of(count++), 0);
  CHECK(n.is_rehashing());
  auto seen = one_pass(n, 1);
  CHECK(n.is_rehashing());  // collect_buckets never migrates
  CHECK_EQ(seen.size(), size_t(count));
  bool once = true;
  for (auto& kv : seen) once = once && kv.second == 1;
  CHECK(once);
}

TEST(cleanup_step_removes_expired_and_keeps_snapshots) {
  StateMap m;
  for (int i = 0; i < 1000; ++i) put_value(m, key_of(i), i < 970 ? 0 : 100);
  auto snap = m.snapshot();
  FilterSpec spec;
  spec.ttl_ms = 100;
  uint64_t cursor = 0;
  SortedRun scratch;
  size_t visited = 0, expired_total = 0;
  int steps = 0;
  for (;;) {
    CleanupStep s = cleanup_step(m, &cursor, 5, spec, 120, &scratch);
    visited += s.visited;
    expired_total += s.expired;
    ++steps;
    if (s.wrapped) break;
  }
  CHECK_EQ(expired_total, size_t{970});
  CHECK_EQ(m.size(), size_t{30});
  CHECK(visited >= 1000);
  CHECK(steps >= 1000 / 5 / 4);
  CHECK_EQ(snap->size(), size_t{1000});
  CHECK_EQ(snap->sorted_entries().size(), size_t{1000});
}

TEST(cleanup_step_trims_lists_in_place) {
  StateMap m;
  Bytes v;
  fixed_elem(v, 1, 8, 0);
  fixed_elem(v, 2, 8, 50);
  const std::string k = "list";
  uint8_t* dst = m.put(reinterpret_cast<const uint8_t*>(k.data()), k.size(), v.size());
  std::memcpy(dst, v.data(), v.size());
  FilterSpec spec;
  spec.layout = Layout::List;
  spec.fixed_width = 8;
  spec.ttl_ms = 100;
  uint64_t cursor = 0;
  SortedRun scratch;
  CleanupStep s = cleanup_step(m, &cursor, 10, spec, 120, &scratch);
  CHECK_EQ(s.expired, size_t{1});
  ByteView got;
  CHECK(m.get(reinterpret_cast<const uint8_t*>(k.data()), k.size(), &got));
  CHECK(Bytes(got.data, got.data + got.size) == Bytes(v.begin() + 16, v.end()));
}

TEST(filter_run_keeps_order_and_counts) {
  SortedRun in;
  auto push = [&](const std::string& k, const Bytes& v) {
    in.key_data.insert(in.key_data.end(), k.begin(), k.end());
    in.key_offsets.push_back(in.key_data.size());
    in.value_data.insert(in.value_data.end(), v.begin(), v.end());
    in.value_offsets.push_back(in.value_data.size());
  };
  push("a", value({1}, 0));
  push("b", value({2}, 90));
  push("c", value({3}, 0));
  SortedRun out;
  FilterSpec spec;
  spec.ttl_ms = 100;
  CHECK_EQ(filter_run(spec, 150, in, out), size_t{2});
  CHECK_EQ(out.size(), size_t{1});
  CHECK(keys_of(out) == std::set<std::string>{"b"});
  in.valid.assign(3, 1);
  in.valid[1] = 0;
  CHECK_THROWS(filter_run(spec, 150, in, out), std::invalid_argument);
}

namespace {

// A block of values in Arrow binary layout, filtered with filter_values and with filter_value one
// by one: both must give the same kept values, bytes and count.
template <class Offset>
void check_block_agrees(const FilterSpec& spec, int64_t now, const std::vector<Bytes>& values,
                        size_t lead) {
  Bytes data(lead, 0xee);  // the block need not start at byte 0 of its buffer (a sliced array)
  std::vector<Offset> offsets{static_cast<Offset>(lead)};
  for (const auto& v : values) {
    data.insert(data.end(), v.begin(), v.end());
    offsets.push_back(static_cast<Offset>(data.size()));
  }
  const size_t n = values.size();
  std::vector<uint8_t> keep(n, 9);
  std::vector<Offset> out_offsets(n + 1, -1);
  Bytes out_data(data.size() - lead);
  ValuesFiltered r = filter_values(spec, now, data.data(), data.size(), offsets.data(), n,
                                   keep.data(), out_offsets.data(), out_data.data());
  size_t want_expired = 0, kept = 0;
  Bytes trimmed, want_data;
  for (size_t i = 0; i < n; ++i) {
    FilterResult res = filter_value(spec, now, ByteView{values[i].data(), values[i].size()},
                                    &trimmed, &want_expired);
    if (res == FilterResult::Drop && want_expired == 0) res = FilterResult::Keep;  // see ttl.h
    CHECK_EQ(keep[i], res == FilterResult::Drop ? 0 : 1);
    if (res == FilterResult::Drop) continue;
    const Bytes& got = res == FilterResult::Keep ? values[i] : trimmed;
    want_data.insert(want_data.end(), got.begin(), got.end());
    ++kept;
    CHECK_EQ(static_cast<size_t>(out_offsets[kept]), want_data.size());
  }
  CHECK_EQ(out_offsets[0], Offset{0});
  CHECK_EQ(r.kept, kept);
  CHECK_EQ(r.data_bytes, want_data.size());
  CHECK_EQ(r.expired, want_expired);
  CHECK(Bytes(out_data.begin(), out_data.begin() + r.data_bytes) == want_data);
}

}  // namespace

TEST(filter_values_agrees_with_filter_value_per_value) {
  FilterSpec spec;
  spec.ttl_ms = 100;
  std::vector<Bytes> values{value({1}, 0), value({2}, 90), Bytes{1, 2, 3}, Bytes{},
                            value({3, 4}, 10)};
  check_block_agrees<int32_t>(spec, 150, values, 0);
  check_block_agrees<int64_t>(spec, 150, values, 5);
  check_block_agrees<int32_t>(spec, 0, values, 3);  // nothing expires
  spec.layout = Layout::List;
  spec.fixed_width = 8;
  Bytes l1, l2, l3;
  fixed_elem(l1, 1, 8, 10);
  fixed_elem(l1, 2, 8, 60);  // trimmed to this element at 150
  fixed_elem(l2, 3, 8, 0);   // dropped
  fixed_elem(l3, 4, 8, 90);  // kept whole
  check_block_agrees<int32_t>(spec, 150, {l1, l2, l3, Bytes{}}, 2);
  check_block_agrees<int64_t>(spec, 150, {l1, l2, l3}, 0);
  spec.fixed_width = 0;
  Bytes v1, v2;
  var_elem(v1, 0, 10);
  var_elem(v1, 200, 70);
  var_elem(v2, 3, 0);
  check_block_agrees<int32_t>(spec, 150, {v1, v2, v1}, 1);
  check_block_agrees<int64_t>(spec, 150, {v2, Bytes{}, v1}, 3);
  check_block_agrees<int32_t>(spec, 150, {}, 0);
}

TEST(filter_values_drops_empty_values_wherever_they_are) {
  // An empty list value holds nothing alive: dropped with nothing counted, before or after an
  // expiry, as the full-snapshot filter and the Python reference drop it.
  FilterSpec spec;
  spec.layout = Layout::List;
  spec.ttl_ms = 100;
  Bytes m1;
  var_elem(m1, 3, 0);
  const std::vector<Bytes> values{Bytes{}, m1, Bytes{}};
  Bytes data;
  std::vector<int32_t> offsets{0};
  for (const auto& v : values) {
    data.insert(data.end(), v.begin(), v.end());
    offsets.push_back(static_cast<int32_t>(data.size()));
  }
  std::vector<uint8_t> keep(3);
  std::vector<int32_t> out_offsets(4);
  Bytes out(data.size());
  ValuesFiltered r = filter_values(spec, 150, data.data(), data.size(), offsets.data(), 3,
                                   keep.data(), out_offsets.data(), out.data());
  CHECK(keep == (std::vector<uint8_t>{0, 0, 0}));
  CHECK_EQ(r.kept, size_t{0});
  CHECK_EQ(r.expired, size_t{1});
  r = filter_values(spec, 0, data.data(), data.size(), offsets.data(), 3, keep.data(),
                    out_offsets.data(), out.data());  // nothing expires: only m1 stays
  CHECK(keep == (std::vector<uint8_t>{0, 1, 0}));
  CHECK_EQ(r.kept, size_t{1});
  CHECK_EQ(r.expired, size_t{0});
}

TEST(filter_values_rejects_bad_offsets_and_names_the_broken_value) {
  FilterSpec spec;
  spec.ttl_ms = 100;
  Bytes data = value({1}, 0);
  std::vector<uint8_t> keep(2);
  std::vector<int32_t> out_offsets(3);
  Bytes out(data.size());
  std::vector<int32_t> past_end{0, static_cast<int32_t>(data.size()) + 1};
  CHECK_THROWS(filter_values(spec, 0, data.data(), data.size(), past_end.data(), 1, keep.data(),
                             out_offsets.data(), out.data()),
               std::invalid_argument);
  std::vector<int32_t> negative{-1, 3};
  CHECK_THROWS(filter_values(spec, 0, data.data(), data.size(), negative.data(), 1, keep.data(),
                             out_offsets.data(), out.data()),
               std::invalid_argument);
  std::vector<int32_t> decreasing{0, 5, 3};
  CHECK_THROWS(filter_values(spec, 0, data.data(), data.size(), decreasing.data(), 2, keep.data(),
                             out_offsets.data(), out.data()),
               std::invalid_argument);
  // Value 1 is a list truncated mid-element: the message names it.
  spec.layout = Layout::List;
  spec.fixed_width = 4;
  Bytes lists;
  fixed_elem(lists, 1, 4, 0);
  fixed_elem(lists, 2, 4, 0);
  lists.pop_back();
  std::vector<int32_t> two{0, 12, static_cast<int32_t>(lists.size())};
  Bytes out2(lists.size());
  std::string what;
  try {
    filter_values(spec, 0, lists.data(), lists.size(), two.data(), 2, keep.data(),
                  out_offsets.data(), out2.data());
  } catch (const std::invalid_argument& e) {
    what = e.what();
  }
  CHECK(what.rfind("value 1: truncated list element", 0) == 0);
}

// Offsets that decrease only after a long value (found by native/fuzz ttl_value): the last offset
// is inside the data, but value 0 runs past it and past out_data, which the last offset sizes.
// Nothing may be read or written before the offsets are refused.
TEST(filter_values_checks_every_offset_before_reading) {
  FilterSpec spec;
  spec.ttl_ms = 100;
  Bytes data = value({1, 2, 3, 4, 5, 6, 7, 8}, 0);  // 16 bytes, unexpired at time 0
  const size_t claimed = 8;                         // the data buffer the caller says it has
  std::vector<int32_t> offsets{0, 16, 4};
  std::vector<uint8_t> keep(2, 0xEE);
  std::vector<int32_t> out_offsets(3, -7);
  Bytes out(4 + 16, 0xEE);  // capacity offsets[2] - offsets[0] = 4, then a guard
  CHECK_THROWS(filter_values(spec, 0, data.data(), claimed, offsets.data(), 2, keep.data(),
                             out_offsets.data(), out.data()),
               std::invalid_argument);
  CHECK(keep[0] == 0xEE && keep[1] == 0xEE);
  for (size_t i = 0; i < out.size(); ++i) CHECK(out[i] == 0xEE);
}

TEST(table_cursor_walks_every_key_group_and_wraps) {
  StateTable t(3, 9);
  // Flink scenario 6 shape: 970 of 1000 entries expired, spread over key groups 3..9.
  for (int i = 0; i < 1000; ++i) put_value(t.map(3 + i % 7), key_of(i), i < 970 ? 0 : 100);
  TableCursor cur;  // key group 0 is outside: restarts at 3
  FilterSpec spec;
  spec.ttl_ms = 100;
  SortedRun scratch;
  size_t visited = 0, expired_total = 0, steps = 0;
  for (;;) {
    CleanupStep s = cleanup_step(t, &cur, 5, spec, 120, &scratch);
    visited += s.visited;
    expired_total += s.expired;
    ++steps;
    if (s.wrapped) break;
  }
  CHECK_EQ(cur.key_group, 3);
  CHECK_EQ(expired_total, size_t{970});
  CHECK_EQ(t.size(), size_t{30});
  CHECK_EQ(visited, size_t{1000});
  CHECK(steps >= 1000 / 5 / 4);
  // An empty table wraps at once.
  StateTable empty(0, 127);
  TableCursor c2;
  CleanupStep s = cleanup_step(empty, &c2, 5, spec, 120, &scratch);
  CHECK(s.wrapped);
  CHECK_EQ(s.visited, size_t{0});
}

TEST(restamp_rewrites_only_the_given_timestamp) {
  StateMap m;
  put_value(m, "a", INT64_MIN);
  put_value(m, "b", 5);
  Bytes lv;
  fixed_elem(lv, 1, 4, INT64_MIN);
  fixed_elem(lv, 2, 4, 7);
  fixed_elem(lv, 3, 4, INT64_MIN);
  auto snap = m.snapshot();
  FilterSpec vs;
  CHECK_EQ(restamp(m, vs, INT64_MIN, 1000), size_t{1});
  ByteView got;
  CHECK(m.get(reinterpret_cast<const uint8_t*>("a"), 1, &got));
  CHECK_EQ(load_timestamp(got.data + 8), 1000);
  CHECK(m.get(reinterpret_cast<const uint8_t*>("b"), 1, &got));
  CHECK_EQ(load_timestamp(got.data + 8), 5);
  // The snapshot still sees the old stamp (copy-on-write).
  SortedRun r = snap->sorted_entries();
  CHECK_EQ(load_timestamp(r.value(0).data + 8), INT64_MIN);
  StateMap l;
  uint8_t* dst = l.put(reinterpret_cast<const uint8_t*>("l"), 1, lv.size());
  std::memcpy(dst, lv.data(), lv.size());
  FilterSpec ls;
  ls.layout = Layout::List;
  ls.fixed_width = 4;
  CHECK_EQ(restamp(l, ls, INT64_MIN, 9), size_t{2});
  CHECK(l.get(reinterpret_cast<const uint8_t*>("l"), 1, &got));
  CHECK_EQ(load_timestamp(got.data + 4), 9);
  CHECK_EQ(load_timestamp(got.data + 16), 7);
  CHECK_EQ(load_timestamp(got.data + 28), 9);
}

namespace {

Bytes migrated(const MigrationSpec& spec, const Bytes& v, bool* kept, size_t* expired) {
  Bytes out;
  *kept = migrate_value(spec, ByteView{v.data(), v.size()}, &out, expired);
  return out;
}

MigrationSpec adding(Layout l, uint32_t w, int64_t ts) {
  MigrationSpec s;
  s.layout = l;
  s.fixed_width = w;
  s.add_timestamps = true;
  s.ts = ts;
  return s;
}

MigrationSpec stripping(Layout l, uint32_t w, int64_t ttl, int64_t now) {
  MigrationSpec s;
  s.layout = l;
  s.fixed_width = w;
  s.add_timestamps = false;
  s.ttl_ms = ttl;
  s.now = now;
  return s;
}

}  // namespace

TEST(migrate_value_adds_and_strips_every_layout) {
  bool kept = false;
  size_t expired = 0;
  // Value: suffix appended / removed.
  CHECK(migrated(adding(Layout::Value, 0, 42), Bytes{1, 2, 3}, &kept, &expired) ==
        value({1, 2, 3}, 42));
  CHECK(kept);
  CHECK(migrated(stripping(Layout::Value, 0, 10, 100), value({1, 2, 3}, 95), &kept, &expired) ==
        (Bytes{1, 2, 3}));
  CHECK(kept);
  migrated(stripping(Layout::Value, 0, 10, 100), value({1, 2, 3}, 90), &kept, &expired);
  CHECK(!kept);
  CHECK_EQ(expired, size_t{1});
  // Fixed-width list: stride w -> w + 8 and back; expired elements dropped wherever they are.
  Bytes plain{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}, with, expect;
  fixed_elem(with, 1, 4, 7);
  fixed_elem(with, 2, 4, 7);
  fixed_elem(with, 3, 4, 7);
  CHECK(migrated(adding(Layout::List, 4, 7), plain, &kept, &expired) == with);
  Bytes mixed;
  fixed_elem(mixed, 1, 4, 95);
  fixed_elem(mixed, 2, 4, 50);  // expired, between two live ones
  fixed_elem(mixed, 3, 4, 99);
  expired = 0;
  CHECK(migrated(stripping(Layout::List, 4, 10, 100), mixed, &kept, &expired) ==
        (Bytes{1, 1, 1, 1, 3, 3, 3, 3}));
  CHECK(kept);
  CHECK_EQ(expired, size_t{1});
  // Variable-length list: the element varlen counts the bytes only, so it stays.
  Bytes vplain, vwith;
  append_varlen(vplain, 2);
  vplain.insert(vplain.end(), 2, 2);
  append_varlen(vplain, 0);
  var_elem(vwith, 2, -5);
  var_elem(vwith, 0, -5);
  CHECK(migrated(adding(Layout::List, 0, -5), vplain, &kept, &expired) == vwith);
  CHECK(migrated(stripping(Layout::List, 0, 1, -5), vwith, &kept, &expired) == vplain);
  expired = 0;
  migrated(stripping(Layout::List, 0, 1, -4), vwith, &kept, &expired);
  CHECK(!kept);
  CHECK_EQ(expired, size_t{2});
  // The empty list stays on add, is removed on strip.
  CHECK(migrated(adding(Layout::List, 4, 1), Bytes{}, &kept, &expired).empty());
  CHECK(kept);
  migrated(stripping(Layout::List, 4, 1, 0), Bytes{}, &kept, &expired);
  CHECK(!kept);
}

TEST(migrate_value_rejects_broken_layouts) {
  Bytes out;
  auto bv = [](const Bytes& b) { return ByteView{b.data(), b.size()}; };
  Bytes short_value{1, 2, 3};
  CHECK_THROWS(migrate_value(stripping(Layout::Value, 0, 1, 0), bv(short_value), &out),
               std::invalid_argument);
  Bytes ragged{1, 1, 1, 1, 2};  // not a multiple of the element width
  CHECK_THROWS(migrate_value(adding(Layout::List, 4, 0), bv(ragged), &out), std::invalid_argument);
  Bytes m;
  append_varlen(m, 5);  // a variable-length element whose bytes end early
  m.push_back(1);
  CHECK_THROWS(migrate_value(adding(Layout::List, 0, 0), bv(m), &out), std::invalid_argument);
  CHECK_THROWS(migrate_value(stripping(Layout::Value, 0, 0, 0), bv(short_value), &out),
               std::invalid_argument);
}

TEST(migrate_table_all_or_nothing_and_copy_on_write) {
  StateTable t(0, 3);
  auto k = [](const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); };
  for (int kg = 0; kg <= 3; ++kg) {
    for (int i = 0; i < 50; ++i) {
      std::string key = key_of(kg * 100 + i);
      uint8_t* dst = t.map(kg).put(k(key), key.size(), 4);
      std::memset(dst, i, 4);
    }
  }
  TableSnapshot snap = t.snapshot();
  // A broken value in the last key group: nothing is converted.
  std::string bad = "bad";
  t.map(3).put(k(bad), bad.size(), 5);
  CHECK_THROWS(migrate(t, adding(Layout::List, 4, 9)), std::invalid_argument);
  ByteView got;
  std::string k0 = key_of(0);
  CHECK(t.map(0).get(k(k0), k0.size(), &got));
  CHECK_EQ(got.size, size_t{4});
  t.map(3).remove(k(bad), bad.size());
  MigrationResult r = migrate(t, adding(Layout::List, 4, 9));
  CHECK_EQ(r.rewritten, size_t{200});
  CHECK_EQ(r.removed, size_t{0});
  CHECK(t.map(0).get(k(k0), k0.size(), &got));
  CHECK_EQ(got.size, size_t{12});
  CHECK_EQ(load_timestamp(got.data + 4), 9);
  // The snapshot taken before keeps the old format.
  SortedRun before = snap.map(0)->sorted_entries();
  CHECK_EQ(before.size(), size_t{50});
  CHECK_EQ(before.value(0).size, size_t{4});
  // And back, dropping nothing (ttl far from expiring): the original bytes again.
  r = migrate(t, stripping(Layout::List, 4, 1000, 10));
  CHECK_EQ(r.rewritten, size_t{200});
  CHECK_EQ(r.expired, size_t{0});
  CHECK(t.map(0).get(k(k0), k0.size(), &got));
  CHECK_EQ(got.size, size_t{4});
  // Stripping with everything expired removes every entry.
  migrate(t, adding(Layout::Value, 0, 0));
  r = migrate(t, stripping(Layout::Value, 0, 1, 1));
  CHECK_EQ(r.removed, size_t{200});
  CHECK_EQ(r.expired, size_t{200});
  CHECK_EQ(t.size(), size_t{0});
  snap.release();
}

TEST_MAIN()
