// The encoded-key layout (key_codec.h, docs/formats.md "Encoded key").
// Expected bytes: tests/data/flink_keygroups.json `rocksdb_composite_key_examples` (real Flink
// RocksDB keys) and Flink's writeVariableIntBytes / StringValue length rules.
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/key_codec.h"
#include "statecore/key_groups.h"

using namespace statecore;

namespace {

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}
std::string hex(const std::vector<uint8_t>& v) { return hex(v.data(), v.size()); }
std::string hex(const KeyEncoder& e) { return hex(e.data(), e.size()); }

}  // namespace

TEST(rocksdb_composite_key_examples) {
  // Integer key 42, VoidNamespace: keyGroup 29 (maxP 128) / 3613 (maxP 4096).
  KeyEncoder e128(KeyType::Int32, NamespaceType::Void, 128);
  const int32_t kg128 = key_group_for_int32(Assigner::Flink, 42, 128);
  CHECK_EQ(kg128, 29);
  e128.key_int32(kg128, 42);
  e128.namespace_void();
  CHECK_EQ(hex(e128), std::string("1d0000002a00"));

  KeyEncoder e4096(KeyType::Int32, NamespaceType::Void, 4096);
  const int32_t kg4096 = key_group_for_int32(Assigner::Flink, 42, 4096);
  CHECK_EQ(kg4096, 3613);
  e4096.key_int32(kg4096, 42);
  e4096.namespace_void();
  CHECK_EQ(hex(e4096), std::string("0e1d0000002a00"));

  // String key 'hello', String namespace 'ns': both variable => key, len(key), ns, len(ns).
  KeyEncoder s128(KeyType::String, NamespaceType::String, 128);
  s128.key_bytes(key_group_for_string(Assigner::Flink, "hello", 5, 128), "hello", 5);
  s128.namespace_string("ns", 2);
  CHECK_EQ(hex(s128), std::string("230668656c6c6f06036e7303"));

  KeyEncoder s4096(KeyType::String, NamespaceType::String, 4096);
  s4096.key_bytes(key_group_for_string(Assigner::Flink, "hello", 5, 4096), "hello", 5);
  s4096.namespace_string("ns", 2);
  CHECK_EQ(hex(s4096), std::string("0aa30668656c6c6f06036e7303"));
}

TEST(no_lenbytes_unless_both_variable) {
  KeyEncoder a(KeyType::String, NamespaceType::Void, 128);
  a.key_bytes(5, "hi", 2);
  a.namespace_void();
  CHECK_EQ(hex(a), std::string("0503686900"));
  KeyEncoder b(KeyType::Int64, NamespaceType::String, 128);
  b.key_int64(1, -2);
  b.namespace_string("w", 1);
  CHECK_EQ(hex(b), std::string("01fffffffffffffffe0277"));
  KeyEncoder c(KeyType::Binary, NamespaceType::Int64, 4096);
  c.key_bytes(300, "\x00\x01", 2);
  c.namespace_int64(7);
  CHECK_EQ(hex(c), std::string("012c0300010000000000000007"));
}

TEST(namespace_can_be_reset_after_key) {
  KeyEncoder e(KeyType::String, NamespaceType::String, 128);
  e.key_bytes(35, "hello", 5);
  e.namespace_string("a-long-namespace", 16);
  e.namespace_string("ns", 2);  // truncates back to the key part
  CHECK_EQ(hex(e), std::string("230668656c6c6f06036e7303"));
}

TEST(prefix_width_and_roundtrip) {
  CHECK_EQ(key_group_prefix_size(1), 1);
  CHECK_EQ(key_group_prefix_size(128), 1);
  CHECK_EQ(key_group_prefix_size(129), 2);
  CHECK_EQ(key_group_prefix_size(32768), 2);
  CHECK_THROWS(key_group_prefix_size(0), std::invalid_argument);
  CHECK_THROWS(key_group_prefix_size(32769), std::invalid_argument);
  for (int32_t maxp : {1, 2, 128, 129, 4096, 32768}) {
    for (int32_t kg = 0; kg < maxp; kg += 1 + maxp / 61) {
      std::vector<uint8_t> out;
      append_key_group_prefix(out, kg, maxp);
      CHECK_EQ(static_cast<int>(out.size()), key_group_prefix_size(maxp));
      CHECK_EQ(read_key_group_prefix(out.data(), out.size(), maxp), kg);
    }
  }
  std::vector<uint8_t> out;
  CHECK_THROWS(append_key_group_prefix(out, 128, 128), std::invalid_argument);
  CHECK_THROWS(append_key_group_prefix(out, -1, 128), std::invalid_argument);
  const uint8_t one = 5;
  CHECK_THROWS(read_key_group_prefix(&one, 1, 4096), std::invalid_argument);
  // Sorting by encoded key sorts by key group: big-endian prefix.
  std::vector<uint8_t> a, b;
  append_key_group_prefix(a, 255, 4096);
  append_key_group_prefix(b, 256, 4096);
  CHECK(std::memcmp(a.data(), b.data(), 2) < 0);
}

TEST(varlen_and_lenbytes) {
  struct {
    uint64_t n;
    const char* varlen;
  } vl[] = {
      {0, "00"},     {1, "01"},       {127, "7f"},       {128, "8001"},
      {300, "ac02"}, {16383, "ff7f"}, {16384, "808001"}, {UINT64_MAX, "ffffffffffffffffff01"}};
  for (const auto& c : vl) {
    std::vector<uint8_t> out;
    append_varlen(out, c.n);
    CHECK_EQ(hex(out), std::string(c.varlen));
    uint64_t back = 0;
    CHECK_EQ(read_varlen(out.data(), out.size(), &back), out.size());
    CHECK_EQ(back, c.n);
  }
  uint64_t v;
  const uint8_t truncated[] = {0x80, 0x80};
  CHECK_EQ(read_varlen(truncated, 2, &v), size_t{0});
  const uint8_t too_long[11] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
  CHECK_EQ(read_varlen(too_long, 11, &v), size_t{0});

  struct {
    uint32_t n;
    const char* lb;
  } lbs[] = {{0, "00"},
             {6, "06"},
             {255, "ff"},
             {256, "0001"},
             {300, "2c01"},
             {0x01020304, "04030201"},
             {0xFFFFFFFFu, "ffffffff"}};
  for (const auto& c : lbs) {
    std::vector<uint8_t> out;
    append_lenbytes(out, c.n);
    CHECK_EQ(hex(out), std::string(c.lb));
  }
}

TEST(serializers) {
  std::vector<uint8_t> out;
  append_ser_int32(out, 42);
  append_ser_int32(out, -1);
  append_ser_int32(out, INT32_MIN);
  CHECK_EQ(hex(out), std::string("0000002affffffff80000000"));
  out.clear();
  append_ser_int64(out, 1);
  append_ser_int64(out, INT64_MIN);
  CHECK_EQ(hex(out), std::string("00000000000000018000000000000000"));
  out.clear();
  append_ser_bytes(out, "", 0);
  append_ser_bytes(out, "\xe6\x97\xa5", 3);
  CHECK_EQ(hex(out), std::string("0104e697a5"));
  out.clear();
  const std::string big(200, 'x');  // len + 1 = 201 -> varlen c9 01
  append_ser_bytes(out, big.data(), big.size());
  CHECK_EQ(out.size(), size_t{202});
  CHECK_EQ(hex(out.data(), 2), std::string("c901"));
  out.clear();
  append_ser_void(out);
  CHECK_EQ(hex(out), std::string("00"));
}

TEST(encoder_type_and_order_checks) {
  KeyEncoder e(KeyType::Int64, NamespaceType::Void, 128);
  CHECK_THROWS(e.namespace_void(), std::invalid_argument);  // no key yet
  CHECK_THROWS(e.key_int32(0, 1), std::invalid_argument);
  CHECK_THROWS(e.key_bytes(0, "a", 1), std::invalid_argument);
  CHECK_THROWS(e.key_int64(128, 1), std::invalid_argument);
  // A failed key must not leave a stale key for namespace_*() to extend.
  CHECK_THROWS(e.namespace_void(), std::invalid_argument);
  e.key_int64(3, 9);
  CHECK_THROWS(e.namespace_int64(1), std::invalid_argument);
  CHECK_THROWS(e.namespace_string("a", 1), std::invalid_argument);
  e.namespace_void();
  CHECK_EQ(hex(e), std::string("03000000000000000900"));
  CHECK_THROWS(KeyEncoder(KeyType::Int64, NamespaceType::Void, 0), std::invalid_argument);
}

TEST(serialized_key_problem_names_what_a_user_key_lacks) {
  auto problem = [](const std::vector<uint8_t>& b, const KeySchema& s) {
    return serialized_key_problem(b.data(), b.size(), s);
  };
  const KeySchema i64 = KeySchema::scalar(KeyType::Int64);
  const KeySchema str = KeySchema::scalar(KeyType::String);
  std::vector<uint8_t> ok;
  append_ser_int64(ok, -3);
  CHECK(problem(ok, i64).empty());
  CHECK(problem(std::vector<uint8_t>(ok.begin(), ok.end() - 1), i64).find("truncated") == 0);
  ok.push_back(0);
  CHECK(problem(ok, i64) == "1 bytes after the key");
  std::vector<uint8_t> s;
  append_ser_bytes(s, "h\xc3\xa9", 3);
  CHECK(problem(s, str).empty());
  std::vector<uint8_t> empty_string;
  append_ser_bytes(empty_string, "", 0);
  CHECK(problem(empty_string, str).empty());
  CHECK(problem({0x02, 0xff}, str) == "malformed UTF-8 in a string");
  CHECK(problem({0x05, 'a'}, str).find("truncated") == 0);
  CHECK(problem({0x80}, str).find("truncated") == 0);
  CHECK(problem({0x00}, str).find("truncated") == 0);  // length 0: a null string
  CHECK(problem({0x02}, KeySchema::scalar(KeyType::Bool)) == "bool byte other than 00/01");
  CHECK(problem({0x01}, KeySchema::scalar(KeyType::Bool)).empty());
  std::vector<uint8_t> nan{0x7f, 0xf8, 0, 0, 0, 0, 0, 1};  // a NaN other than the canonical one
  CHECK(problem(nan, KeySchema::scalar(KeyType::Float64)) == "non-canonical float64");
  std::vector<uint8_t> f;
  append_ser_float64(f, 1.5);
  CHECK(problem(f, KeySchema::scalar(KeyType::Float64)).empty());
  CHECK(problem({1, 2, 3}, KeySchema::scalar(KeyType::FixedSizeBinary, 4)).find("truncated") == 0);
}

TEST_MAIN()
