// libFuzzer target: the readers of encoded keys (key_codec.h, docs/formats.md "Encoded key") a
// restore applies to checkpoint keys -- encoded_prefix_size (where a map entry's user key
// starts: scalar and struct keys, every namespace type, lenbytes), read_key_group_prefix and
// read_varlen (the length framing of keys and of list and map values).
//
// Input: a schema byte (& 3: columns - 1; & 4: a struct key even with one column; >> 3 & 3:
// max_parallelism 8, 128, 129 or 32768; >> 5: namespace type), one byte per column (% 9: the
// KeyType; >> 4: a fixed_size_binary width - 1), then the encoded key.
//
// Contract: encoded_prefix_size returns what a reference parse written here from the format
// returns, or throws std::invalid_argument exactly when that parse fails; a scalar key in
// canonical form (the bytes an encoder writes) re-encodes through KeyEncoder to the very prefix
// bytes; read_varlen consumes at most 10 bytes, and the number it reads encodes back and reads
// back as the same; read_key_group_prefix reads the big-endian prefix or throws for a short key.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "fuzz_input.h"
#include "statecore/key_codec.h"
#include "statecore/key_groups.h"

namespace {

using statecore::KeyType;
using statecore::NamespaceType;
using statecore_fuzz::Input;

constexpr int32_t kMaxParallelism[4] = {8, 128, 129, 32768};

// varlen as docs/formats.md defines it; false when truncated or longer than 10 bytes.
bool ref_varlen(const uint8_t* p, size_t n, uint64_t* v, size_t* used) {
  *v = 0;
  for (size_t i = 0; i < n && i < 10; ++i) {
    *v |= static_cast<uint64_t>(p[i] & 0x7f) << (7 * i);
    if (!(p[i] & 0x80)) {
      *used = i + 1;
      return true;
    }
  }
  return false;
}

// Bytes of one serialized part at k[pos, n), or false.
bool ref_part(const uint8_t* k, size_t n, size_t pos, KeyType t, int32_t width, size_t* len) {
  size_t fixed = 0;
  switch (t) {
    case KeyType::Int32: fixed = 4; break;
    case KeyType::Bool: fixed = 1; break;
    case KeyType::FixedSizeBinary: fixed = static_cast<size_t>(width); break;
    case KeyType::String:
    case KeyType::Binary: {
      uint64_t v = 0;
      size_t used = 0;
      if (!ref_varlen(k + pos, n - pos, &v, &used) || v == 0) return false;
      if (v - 1 > n - pos - used) return false;
      *len = used + (v - 1);
      return true;
    }
    default: fixed = 8;
  }
  if (fixed > n - pos) return false;
  *len = fixed;
  return true;
}

KeyType ns_as_column(NamespaceType t) {
  switch (t) {
    case NamespaceType::Void: return KeyType::Bool;  // one byte
    case NamespaceType::Int64: return KeyType::Int64;
    case NamespaceType::Int32: return KeyType::Int32;
    default: return KeyType::Binary;
  }
}

bool ref_lenbytes(const uint8_t* k, size_t n, size_t pos, size_t part, size_t* len) {
  std::vector<uint8_t> want;
  uint32_t v = static_cast<uint32_t>(part);
  do {
    want.push_back(static_cast<uint8_t>(v));
    v >>= 8;
  } while (v != 0);
  if (want.size() > n - pos || std::memcmp(k + pos, want.data(), want.size()) != 0) return false;
  *len = want.size();
  return true;
}

// The reference parse: the length of prefix | ser(key) [| lenbytes] | ser(ns) [| lenbytes].
bool ref_prefix_size(const uint8_t* k, size_t n, const statecore::KeySchema& s, NamespaceType ns,
                     int32_t mp, size_t* out) {
  size_t pos = mp > 128 ? 2 : 1;
  if (n < pos) return false;
  const bool lenbytes = s.variable_length() && statecore::is_variable_length(ns);
  size_t len = 0;
  const size_t key_start = pos;
  for (const statecore::KeyColumn& c : s.columns) {
    if (!ref_part(k, n, pos, c.type, c.width, &len)) return false;
    pos += len;
  }
  if (lenbytes && !ref_lenbytes(k, n, pos, pos - key_start, &len)) return false;
  if (lenbytes) pos += len;
  const size_t ns_start = pos;
  if (!ref_part(k, n, pos, ns_as_column(ns), 0, &len)) return false;
  pos += len;
  if (lenbytes && !ref_lenbytes(k, n, pos, pos - ns_start, &len)) return false;
  if (lenbytes) pos += len;
  *out = pos;
  return true;
}

uint64_t be(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = v << 8 | p[i];
  return v;
}

// Re-encodes the scalar key at k[0, prefix) through KeyEncoder; false when the bytes are not
// the ones an encoder writes (then there is nothing to compare).
bool reencode(const uint8_t* k, size_t prefix, const statecore::KeyColumn& c, NamespaceType ns,
              int32_t mp, std::vector<uint8_t>* out) {
  const size_t w = mp > 128 ? 2 : 1;
  const int32_t kg = static_cast<int32_t>(be(k, w));
  if (kg >= mp) return false;
  statecore::KeySchema schema = statecore::KeySchema::scalar(c.type, c.width);
  statecore::KeyEncoder enc(schema, ns, mp);
  const uint8_t* p = k + w;
  size_t key_len = 0;
  ref_part(k, prefix, w, c.type, c.width, &key_len);
  switch (c.type) {
    case KeyType::Int32: enc.key_int32(kg, static_cast<int32_t>(be(p, 4))); break;
    case KeyType::Int64: enc.key_int64(kg, static_cast<int64_t>(be(p, 8))); break;
    case KeyType::UInt64: enc.key_uint64(kg, be(p, 8)); break;
    case KeyType::Timestamp: enc.key_timestamp(kg, static_cast<int64_t>(be(p, 8))); break;
    case KeyType::Float64: {
      const uint64_t bits = be(p, 8);
      double d;
      std::memcpy(&d, &bits, 8);
      if (statecore::canonical_double_bits(d) != bits) return false;
      enc.key_float64(kg, d);
      break;
    }
    case KeyType::Bool:
      if (p[0] > 1) return false;
      enc.key_bool(kg, p[0] == 1);
      break;
    case KeyType::FixedSizeBinary: enc.key_fixed(kg, p, key_len); break;
    case KeyType::String:
    case KeyType::Binary: {
      uint64_t v = 0;
      size_t used = 0;
      ref_varlen(p, key_len, &v, &used);
      std::vector<uint8_t> canon;
      statecore::append_varlen(canon, v);
      if (canon.size() != used) return false;
      enc.key_bytes(kg, p + used, key_len - used);
      break;
    }
  }
  size_t pos = w + key_len;
  const bool lenbytes = schema.variable_length() && statecore::is_variable_length(ns);
  size_t len = 0;
  if (lenbytes) {
    ref_lenbytes(k, prefix, pos, key_len, &len);
    pos += len;
  }
  ref_part(k, prefix, pos, ns_as_column(ns), 0, &len);
  if (ns == NamespaceType::Void) {
    if (k[pos] != 0) return false;
    enc.namespace_void();
  } else {
    if (statecore::is_variable_length(ns)) {
      uint64_t v = 0;
      size_t used = 0;
      ref_varlen(k + pos, len, &v, &used);
      std::vector<uint8_t> canon;
      statecore::append_varlen(canon, v);
      if (canon.size() != used) return false;
    }
    enc.namespace_serialized(k + pos, len);
  }
  out->assign(enc.data(), enc.data() + enc.size());
  return true;
}

void check_varlen(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  const size_t used = statecore::read_varlen(p, n, &v);
  uint64_t ref = 0;
  size_t ref_used = 0;
  const bool ok = ref_varlen(p, n, &ref, &ref_used);
  FUZZ_CHECK(ok ? used == ref_used && v == ref : used == 0, "read_varlen follows the format");
  if (!used) return;
  std::vector<uint8_t> canon;
  statecore::append_varlen(canon, v);
  FUZZ_CHECK(canon.size() <= used, "the canonical varlen is never longer");
  uint64_t back = 0;
  FUZZ_CHECK(statecore::read_varlen(canon.data(), canon.size(), &back) == canon.size() && back == v,
             "a written varlen reads back");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t head = in.u8();
  statecore::KeySchema schema;
  schema.columns.clear();
  const size_t ncols = 1 + (head & 3);
  schema.is_struct = ncols > 1 || (head & 4);
  const int32_t mp = kMaxParallelism[(head >> 3) & 3];
  const NamespaceType ns = static_cast<NamespaceType>((head >> 5) % 5);
  for (size_t i = 0; i < ncols; ++i) {
    const uint8_t c = in.u8();
    const KeyType t = static_cast<KeyType>(c % 9);
    schema.columns.push_back({t, t == KeyType::FixedSizeBinary ? 1 + (c >> 4) : 0});
  }
  size_t n = 0;
  const uint8_t* key = in.rest(&n);

  size_t want = 0;
  const bool ok = ref_prefix_size(key, n, schema, ns, mp, &want);
  try {
    const size_t got = statecore::encoded_prefix_size(key, n, schema, ns, mp);
    FUZZ_CHECK(ok && got == want, "encoded_prefix_size agrees with the format");
  } catch (const std::invalid_argument&) {
    FUZZ_CHECK(!ok, "encoded_prefix_size refuses only malformed keys");
  }
  if (ok && !schema.is_struct) {
    std::vector<uint8_t> again;
    if (reencode(key, want, schema.columns[0], ns, mp, &again))
      FUZZ_CHECK(again.size() == want && std::memcmp(again.data(), key, want) == 0,
                 "a canonical key re-encodes to its bytes");
  }

  const size_t w = mp > 128 ? 2 : 1;
  try {
    const int32_t kg = statecore::read_key_group_prefix(key, n, mp);
    FUZZ_CHECK(n >= w && static_cast<uint64_t>(kg) == be(key, w), "the prefix is big-endian");
  } catch (const std::invalid_argument&) {
    FUZZ_CHECK(n < w, "only a key shorter than its prefix is refused");
  }
  for (size_t at = 0; at < n && at < 16; ++at) check_varlen(key + at, n - at);
  return 0;
}
