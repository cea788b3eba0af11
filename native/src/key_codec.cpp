// Encoded-key codec (docs/formats.md "Encoded key", Flink SerializedCompositeKeyBuilder).
#include "statecore/key_codec.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "statecore/hash.h"
#include "statecore/key_columns.h"

namespace statecore {

std::string KeySchema::name() const {
  if (!is_struct) return columns.empty() ? "?" : key_column_name(columns[0]);
  std::string s = "struct<";
  for (size_t i = 0; i < columns.size(); ++i) s += (i ? "," : "") + key_column_name(columns[i]);
  return s + ">";
}

void KeySchema::validate() const {
  if (columns.empty()) throw std::invalid_argument("a key needs at least one column");
  if (!is_struct && columns.size() != 1)
    throw std::invalid_argument("a key of several columns must be a struct key");
  for (const KeyColumn& c : columns)
    if (c.type == KeyType::FixedSizeBinary && c.width < 1)
      throw std::invalid_argument("fixed_size_binary key columns need a width >= 1, got " +
                                  std::to_string(c.width));
}

int key_group_prefix_size(int32_t max_parallelism) {
  check_max_parallelism(max_parallelism);
  return max_parallelism > 128 ? 2 : 1;
}

void append_key_group_prefix(std::vector<uint8_t>& out, int32_t key_group,
                             int32_t max_parallelism) {
  const int width = key_group_prefix_size(max_parallelism);
  if (key_group < 0 || key_group >= max_parallelism)
    throw std::invalid_argument("key group " + std::to_string(key_group) +
                                " outside [0, max_parallelism=" + std::to_string(max_parallelism) +
                                ")");
  if (width == 2) out.push_back(static_cast<uint8_t>(key_group >> 8));
  out.push_back(static_cast<uint8_t>(key_group));
}

int32_t read_key_group_prefix(const uint8_t* key, size_t size, int32_t max_parallelism) {
  const int width = key_group_prefix_size(max_parallelism);
  if (size < static_cast<size_t>(width))
    throw std::invalid_argument("encoded key of " + std::to_string(size) +
                                " bytes is shorter than its " + std::to_string(width) +
                                "-byte key-group prefix");
  return width == 2 ? (static_cast<int32_t>(key[0]) << 8) | key[1] : key[0];
}

void append_varlen(std::vector<uint8_t>& out, uint64_t n) {
  while (n >= 0x80) {
    out.push_back(static_cast<uint8_t>(n | 0x80));
    n >>= 7;
  }
  out.push_back(static_cast<uint8_t>(n));
}

size_t read_varlen(const uint8_t* data, size_t size, uint64_t* value) {
  uint64_t v = 0;
  for (size_t i = 0; i < size && i < 10; ++i) {
    v |= static_cast<uint64_t>(data[i] & 0x7F) << (7 * i);
    if ((data[i] & 0x80) == 0) {
      *value = v;
      return i + 1;
    }
  }
  return 0;
}

void append_lenbytes(std::vector<uint8_t>& out, uint32_t n) {
  do {
    out.push_back(static_cast<uint8_t>(n));
    n >>= 8;
  } while (n != 0);
}

void append_ser_int32(std::vector<uint8_t>& out, int32_t v) {
  const uint32_t u = static_cast<uint32_t>(v);
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(u >> s));
}

void append_ser_int64(std::vector<uint8_t>& out, int64_t v) {
  const uint64_t u = static_cast<uint64_t>(v);
  for (int s = 56; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(u >> s));
}

void append_ser_uint64(std::vector<uint8_t>& out, uint64_t v) {
  for (int s = 56; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

void append_ser_float64(std::vector<uint8_t>& out, double v) {
  append_ser_uint64(out, canonical_double_bits(v));
}

void append_ser_bytes(std::vector<uint8_t>& out, const void* data, size_t size) {
  append_varlen(out, static_cast<uint64_t>(size) + 1);
  const uint8_t* p = static_cast<const uint8_t*>(data);
  out.insert(out.end(), p, p + size);
}

KeyEncoder::KeyEncoder(KeyType key_type, NamespaceType namespace_type, int32_t max_parallelism)
    : KeyEncoder(KeySchema::scalar(key_type), namespace_type, max_parallelism) {}

KeyEncoder::KeyEncoder(const KeySchema& key, NamespaceType namespace_type, int32_t max_parallelism)
    : key_(key),
      namespace_type_(namespace_type),
      max_parallelism_(max_parallelism),
      ambiguous_(key.variable_length() && is_variable_length(namespace_type)) {
  check_max_parallelism(max_parallelism);
  key.validate();
  buf_.reserve(64);
}

void KeyEncoder::begin_key(int32_t key_group, bool type_ok) {
  if (!type_ok) throw std::invalid_argument("KeyEncoder: key method does not match the key type");
  buf_.clear();
  key_end_ = 0;  // a failed key leaves no half-built key for namespace_*() to extend
  append_key_group_prefix(buf_, key_group, max_parallelism_);
  key_start_ = buf_.size();
}

void KeyEncoder::end_key() {
  if (ambiguous_) append_lenbytes(buf_, static_cast<uint32_t>(buf_.size() - key_start_));
  key_end_ = buf_.size();
}

void KeyEncoder::begin_namespace(bool type_ok) {
  if (!type_ok)
    throw std::invalid_argument("KeyEncoder: namespace method does not match the namespace type");
  if (key_end_ == 0) throw std::invalid_argument("KeyEncoder: namespace set before the key");
  buf_.resize(key_end_);
  ns_start_ = buf_.size();
}

void KeyEncoder::end_namespace() {
  if (ambiguous_) append_lenbytes(buf_, static_cast<uint32_t>(buf_.size() - ns_start_));
}

void KeyEncoder::key_int32(int32_t key_group, int32_t key) {
  begin_key(key_group, scalar_is(KeyType::Int32));
  append_ser_int32(buf_, key);
  end_key();
}

void KeyEncoder::key_int64(int32_t key_group, int64_t key) {
  begin_key(key_group, scalar_is(KeyType::Int64));
  append_ser_int64(buf_, key);
  end_key();
}

void KeyEncoder::key_uint64(int32_t key_group, uint64_t key) {
  begin_key(key_group, scalar_is(KeyType::UInt64));
  append_ser_uint64(buf_, key);
  end_key();
}

void KeyEncoder::key_float64(int32_t key_group, double key) {
  begin_key(key_group, scalar_is(KeyType::Float64));
  append_ser_float64(buf_, key);
  end_key();
}

void KeyEncoder::key_bool(int32_t key_group, bool key) {
  begin_key(key_group, scalar_is(KeyType::Bool));
  append_ser_bool(buf_, key);
  end_key();
}

void KeyEncoder::key_timestamp(int32_t key_group, int64_t key) {
  begin_key(key_group, scalar_is(KeyType::Timestamp));
  append_ser_int64(buf_, key);
  end_key();
}

void KeyEncoder::key_bytes(int32_t key_group, const void* data, size_t size) {
  begin_key(key_group, scalar_is(KeyType::String) || scalar_is(KeyType::Binary));
  append_ser_bytes(buf_, data, size);
  end_key();
}

void KeyEncoder::key_fixed(int32_t key_group, const void* data, size_t size) {
  begin_key(key_group, scalar_is(KeyType::FixedSizeBinary));
  if (size != static_cast<size_t>(key_.columns[0].width)) {
    key_end_ = 0;
    throw std::invalid_argument("KeyEncoder: a key of " + std::to_string(size) +
                                " bytes for key type " + key_.name());
  }
  append_ser_fixed(buf_, data, size);
  end_key();
}

void KeyEncoder::bind(const KeyArrays& keys) {
  if (keys.schema() != key_)
    throw std::invalid_argument("KeyEncoder: batch keys of key type " + keys.schema().name() +
                                " for an encoder of key type " + key_.name());
  bound_ = &keys;
}

void KeyEncoder::key_row(int32_t key_group, int64_t row) {
  begin_key(key_group, bound_ != nullptr);
  bound_->append_ser(buf_, row);
  end_key();
}

void KeyEncoder::namespace_void() {
  begin_namespace(namespace_type_ == NamespaceType::Void);
  append_ser_void(buf_);
  end_namespace();
}

void KeyEncoder::namespace_int64(int64_t ns) {
  begin_namespace(namespace_type_ == NamespaceType::Int64);
  append_ser_int64(buf_, ns);
  end_namespace();
}

void KeyEncoder::namespace_string(const void* utf8, size_t size) {
  begin_namespace(namespace_type_ == NamespaceType::String);
  append_ser_bytes(buf_, utf8, size);
  end_namespace();
}

void KeyEncoder::namespace_serialized(const uint8_t* ser, size_t size) {
  begin_namespace(namespace_type_ != NamespaceType::Void);
  if (size) buf_.insert(buf_.end(), ser, ser + size);
  end_namespace();
}

namespace {

// Bytes of one column's serialization at key[pos..size), or throws (truncated / bad varlen).
size_t column_size(const uint8_t* key, size_t size, size_t pos, KeyType t, int32_t width) {
  size_t n = 0;
  switch (t) {
    case KeyType::Int32: n = 4; break;
    case KeyType::Int64:
    case KeyType::UInt64:
    case KeyType::Float64:
    case KeyType::Timestamp: n = 8; break;
    case KeyType::Bool: n = 1; break;
    case KeyType::FixedSizeBinary: n = static_cast<size_t>(width); break;
    case KeyType::String:
    case KeyType::Binary: {
      uint64_t len = 0;
      const size_t used = read_varlen(key + pos, size - pos, &len);
      if (used == 0 || len == 0 || len - 1 > size - pos - used)
        throw std::invalid_argument("encoded key: malformed or truncated string/binary part");
      return used + static_cast<size_t>(len - 1);
    }
  }
  if (n > size - pos) throw std::invalid_argument("encoded key: truncated part");
  return n;
}

size_t namespace_size(const uint8_t* key, size_t size, size_t pos, NamespaceType t) {
  switch (t) {
    case NamespaceType::Void: return column_size(key, size, pos, KeyType::Bool, 0);
    case NamespaceType::Int64: return column_size(key, size, pos, KeyType::Int64, 0);
    case NamespaceType::Int32: return column_size(key, size, pos, KeyType::Int32, 0);
    case NamespaceType::String:
    case NamespaceType::Binary: return column_size(key, size, pos, KeyType::Binary, 0);
  }
  return 0;
}

// Checks the lenbytes of a part of `part` bytes at key[pos..size); returns their size.
size_t skip_lenbytes(const uint8_t* key, size_t size, size_t pos, size_t part) {
  std::vector<uint8_t> want;
  append_lenbytes(want, static_cast<uint32_t>(part));
  if (want.size() > size - pos || std::memcmp(key + pos, want.data(), want.size()) != 0)
    throw std::invalid_argument("encoded key: lenbytes disagree with the part's length");
  return want.size();
}

}  // namespace

size_t encoded_prefix_size(const uint8_t* key, size_t size, const KeySchema& key_schema,
                           NamespaceType namespace_type, int32_t max_parallelism) {
  if (key == nullptr && size != 0) throw std::invalid_argument("encoded key: null data");
  const size_t w = static_cast<size_t>(key_group_prefix_size(max_parallelism));
  if (size < w) throw std::invalid_argument("encoded key: shorter than its key-group prefix");
  const bool ambiguous = key_schema.variable_length() && is_variable_length(namespace_type);
  size_t pos = w;
  const size_t key_start = pos;
  for (const KeyColumn& c : key_schema.columns) pos += column_size(key, size, pos, c.type, c.width);
  if (ambiguous) pos += skip_lenbytes(key, size, pos, pos - key_start);
  const size_t ns_start = pos;
  pos += namespace_size(key, size, pos, namespace_type);
  if (ambiguous) pos += skip_lenbytes(key, size, pos, pos - ns_start);
  return pos;
}

std::string serialized_key_problem(const uint8_t* data, size_t size, const KeySchema& schema) {
  if (data == nullptr && size != 0) return "null data";
  size_t pos = 0;
  for (const KeyColumn& c : schema.columns) {
    size_t n = 0;
    try {
      n = column_size(data, size, pos, c.type, c.width);
    } catch (const std::invalid_argument&) {
      return "truncated or malformed " + KeySchema::scalar(c.type, c.width).name() + " (" +
             std::to_string(size - pos) + " bytes left)";
    }
    const uint8_t* p = data + pos;
    if (c.type == KeyType::Bool && p[0] > 1) return "bool byte other than 00/01";
    if (c.type == KeyType::Float64) {
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = bits << 8 | p[i];
      double v = 0;
      std::memcpy(&v, &bits, 8);
      if (canonical_double_bits(v) != bits) return "non-canonical float64";
    }
    if (c.type == KeyType::String) {
      uint64_t len = 0;
      const size_t used = read_varlen(p, n, &len);
      try {
        java_hash_string_utf8(reinterpret_cast<const char*>(p + used), n - used);
      } catch (const std::invalid_argument&) {
        return "malformed UTF-8 in a string";
      }
    }
    pos += n;
  }
  if (pos != size) return std::to_string(size - pos) + " bytes after the key";
  return std::string();
}

}  // namespace statecore
