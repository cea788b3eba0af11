// The TTL suffix and filter (ttl.h). The same cases run in Python against
// statecore.ttl.filter_expired (tests/test_ttl.py), which must agree byte for byte.
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "check.h"
#include "statecore/key_codec.h"
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

void map_entry(Bytes& b, uint8_t uk, int64_t ts) {
  append_varlen(b, 1);
  b.push_back(uk);
  append_varlen(b, 3 + 8);
  b.insert(b.end(), 3, uk);
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

TEST(map_entries_one_by_one) {
  Bytes v;
  map_entry(v, 'a', 10);
  map_entry(v, 'b', 50);
  map_entry(v, 'c', 20);
  const size_t e = v.size() / 3;
  Bytes out;
  CHECK(run(Layout::Map, 0, 100, 109, v, &out) == FilterResult::Keep);
  CHECK(run(Layout::Map, 0, 100, 110, v, &out) == FilterResult::Trim);
  CHECK(out == Bytes(v.begin() + e, v.end()));
  CHECK(run(Layout::Map, 0, 100, 120, v, &out) == FilterResult::Trim);
  CHECK(out == Bytes(v.begin() + e, v.begin() + 2 * e));
  CHECK(run(Layout::Map, 0, 100, 150, v, &out) == FilterResult::Drop);
  // An entry whose value cannot hold a timestamp is kept.
  Bytes s;
  append_varlen(s, 1);
  s.push_back('x');
  append_varlen(s, 2);
  s.push_back(1);
  s.push_back(2);
  map_entry(s, 'y', 0);
  CHECK(run(Layout::Map, 0, 100, 1000, s, &out) == FilterResult::Trim);
  CHECK(out == Bytes(s.begin(), s.begin() + 5));
  Bytes empty;
  CHECK(run(Layout::Map, 0, 100, 0, empty, &out) == FilterResult::Drop);
  Bytes truncated(v.begin(), v.end() - 3);
  CHECK_THROWS(run(Layout::Map, 0, 100, 0, truncated, &out), std::invalid_argument);
}

TEST_MAIN()
