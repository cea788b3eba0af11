// The encoded-key codec shared by both backends, checkpoints and the batch kernels, after Flink's
// SerializedCompositeKeyBuilder / CompositeKeySerializationUtils. Layout: docs/formats.md
// "Encoded key". Invariant the rest of the core relies on: the big-endian key-group prefix makes
// the byte-wise order of encoded keys group each key group into one contiguous range.
// Checked against tests/data/flink_keygroups.json `rocksdb_composite_key_examples` and the
// Python reference (statecore.key_types), byte for byte, by the conformance suite.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "statecore/key_groups.h"

namespace statecore {

// Namespace serializer of a state (the backend's namespace_type: statecore.serializers
// NAMESPACE_TYPES). Int32/Int64 serialize as those key columns, String/Binary as varlen(size + 1)
// | bytes (append_ser_bytes).
enum class NamespaceType : uint8_t { Void, Int64, String, Int32, Binary };

// True for serializers whose output length depends on the value (string, binary).
inline bool is_variable_length(KeyType t) { return t == KeyType::String || t == KeyType::Binary; }
inline bool is_variable_length(NamespaceType t) {
  return t == NamespaceType::String || t == NamespaceType::Binary;
}

// A backend's key: one column (a scalar key type), or several (a multi-column key: per batch a
// struct array, per record a tuple). Key groups hash the columns chained (key_groups.h), ser(key)
// concatenates the columns' serializations.
struct KeySchema {
  std::vector<KeyColumn> columns{KeyColumn{}};
  // True for a multi-column key: batch keys come as a struct array (even with one column).
  bool is_struct = false;

  static KeySchema scalar(KeyType t, int32_t width = 0, TimeUnit unit = TimeUnit::Micro) {
    KeySchema s;
    s.columns = {KeyColumn{t, width, unit}};
    return s;
  }
  bool variable_length() const {
    for (const KeyColumn& c : columns)
      if (is_variable_length(c.type)) return true;
    return false;
  }
  // statecore.key_types' name: "int64", "struct<int32,string>", ...
  std::string name() const;
  // Throws std::invalid_argument for no column, a scalar schema of several columns, or a
  // FixedSizeBinary column narrower than 1 byte.
  void validate() const;
  bool operator==(const KeySchema& o) const {
    return is_struct == o.is_struct && columns == o.columns;
  }
  bool operator!=(const KeySchema& o) const { return !(*this == o); }
};

class KeyArrays;  // key_columns.h

// Bytes of the key-group prefix: 1 when max_parallelism <= 128, else 2 (Flink
// CompositeKeySerializationUtils.computeRequiredBytesInKeyGroupPrefix). Throws
// std::invalid_argument unless 0 < max_parallelism <= 32768.
int key_group_prefix_size(int32_t max_parallelism);

// Appends the key-group prefix (big-endian, key_group_prefix_size bytes). Throws
// std::invalid_argument for a bad max_parallelism or key_group outside [0, max_parallelism).
void append_key_group_prefix(std::vector<uint8_t>& out, int32_t key_group, int32_t max_parallelism);

// Reads the key group back from an encoded key of `size` bytes. Throws std::invalid_argument for
// a bad max_parallelism or a key shorter than the prefix.
int32_t read_key_group_prefix(const uint8_t* key, size_t size, int32_t max_parallelism);

// varlen: 7-bit groups, least significant first, high bit set on every byte but the last
// (the length encoding of Flink's StringValue/StringSerializer). 0 -> 00, 300 -> ac 02.
void append_varlen(std::vector<uint8_t>& out, uint64_t n);
// Decodes a varlen at data[0..size). Returns the bytes consumed, or 0 when the input is truncated
// or longer than 10 bytes (not a valid uint64 varlen).
size_t read_varlen(const uint8_t* data, size_t size, uint64_t* value);

// lenbytes: Flink CompositeKeySerializationUtils.writeVariableIntBytes: the low byte of n, then
// n >>>= 8, repeated while n != 0 (6 -> 06, 300 -> 2c 01, 0 -> 00).
void append_lenbytes(std::vector<uint8_t>& out, uint32_t n);

// Serializers (`ser`):
// int32: 4 bytes big-endian two's complement (Flink IntSerializer).
void append_ser_int32(std::vector<uint8_t>& out, int32_t v);
// int64: 8 bytes big-endian two's complement (Flink LongSerializer).
void append_ser_int64(std::vector<uint8_t>& out, int64_t v);
// uint64: 8 bytes big-endian.
void append_ser_uint64(std::vector<uint8_t>& out, uint64_t v);
// float64: 8 bytes big-endian of canonical_double_bits(v) (Flink DoubleSerializer writes
// doubleToLongBits; -0.0 is keyed as 0.0).
void append_ser_float64(std::vector<uint8_t>& out, double v);
// bool: one byte, 01 or 00 (Flink BooleanSerializer).
inline void append_ser_bool(std::vector<uint8_t>& out, bool v) { out.push_back(v ? 1 : 0); }
// timestamp: its int64 value as append_ser_int64. fixed_size_binary: the bytes themselves.
inline void append_ser_fixed(std::vector<uint8_t>& out, const void* data, size_t size) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  out.insert(out.end(), p, p + size);
}
// string (UTF-8 bytes) / binary (raw bytes): varlen(size + 1) then the bytes (Flink
// StringSerializer's length rule; identical to Flink's bytes for ASCII strings).
void append_ser_bytes(std::vector<uint8_t>& out, const void* data, size_t size);
// VoidNamespace: one byte 00.
inline void append_ser_void(std::vector<uint8_t>& out) { out.push_back(0); }

// The length of the `prefix | ser(key) [| lenbytes] | ser(namespace) [| lenbytes]` part at the
// start of the encoded key key[0..size): what precedes a map entry's ser(user key)
// (docs/formats.md "Map state"). Fixed-width columns are skipped by width, string/binary ones by
// their varlen, a multi-column key column by column; the lenbytes (both parts variable-length)
// are checked against the parts' lengths. Throws std::invalid_argument for a bad
// max_parallelism, a truncated part, a malformed varlen or lenbytes that disagree.
size_t encoded_prefix_size(const uint8_t* key, size_t size, const KeySchema& key_schema,
                           NamespaceType namespace_type, int32_t max_parallelism);

// Why data[0..size) is not exactly one ser(key) of `schema` (the user key of a map entry,
// docs/formats.md "Map state"), or "" when it is: the reason a restore refuses it, the checks of
// the Python reader (statecore.key_types KeySerializer.read): a fixed-width column of another
// width, a malformed, null (length 0) or truncated varlen part, bytes left over, a bool byte other
// than 00/01, a non-canonical float64 (no key serializes to it), malformed UTF-8 in a string.
std::string serialized_key_problem(const uint8_t* data, size_t size, const KeySchema& schema);

// Builds encoded keys into one reusable buffer (no allocation once the buffer has grown to the
// longest key). Usage per entry: one key_*() call, then one namespace_*() call; data()/size()
// are then the encoded key. A namespace_*() call may be repeated after one key_*() to address the
// same key under several namespaces (it truncates back to the end of the key part).
// Calling a key_/namespace_ method that does not match the configured types throws
// std::invalid_argument, as does a key group outside [0, max_parallelism). The scalar key_*()
// methods serve a one-column key of that type; key_row() serves any key from batch arrays.
class KeyEncoder {
 public:
  // Throws std::invalid_argument unless 0 < max_parallelism <= 32768, and for an invalid schema
  // (a FixedSizeBinary key needs the KeySchema form, which carries its width).
  KeyEncoder(KeyType key_type, NamespaceType namespace_type, int32_t max_parallelism);
  KeyEncoder(const KeySchema& key, NamespaceType namespace_type, int32_t max_parallelism);

  void key_int32(int32_t key_group, int32_t key);
  void key_int64(int32_t key_group, int64_t key);
  void key_uint64(int32_t key_group, uint64_t key);
  void key_float64(int32_t key_group, double key);
  void key_bool(int32_t key_group, bool key);
  void key_timestamp(int32_t key_group, int64_t key);
  // String (UTF-8 bytes, not validated here) or binary key, per the configured key type.
  void key_bytes(int32_t key_group, const void* data, size_t size);
  // FixedSizeBinary key: `size` must equal the column's width.
  void key_fixed(int32_t key_group, const void* data, size_t size);
  // Binds batch keys for key_row(): their schema must equal this encoder's (checked once, here;
  // std::invalid_argument otherwise). `keys` must outlive the key_row() calls.
  void bind(const KeyArrays& keys);
  // The key of row `row` of the bound batch keys (std::invalid_argument when none is bound).
  void key_row(int32_t key_group, int64_t row);

  void namespace_void();
  void namespace_int64(int64_t ns);
  void namespace_string(const void* utf8, size_t size);
  // A namespace already serialized by its serializer (`ser`, `size` bytes: e.g. KeyArrays::
  // append_ser of a namespace column), for any namespace type but Void; the encoder adds the
  // lenbytes when the key and the namespace are both variable-length, as for the typed calls.
  void namespace_serialized(const uint8_t* ser, size_t size);

  const uint8_t* data() const { return buf_.data(); }
  size_t size() const { return buf_.size(); }
  const KeySchema& key_schema() const { return key_; }
  NamespaceType namespace_type() const { return namespace_type_; }
  int32_t max_parallelism() const { return max_parallelism_; }

 private:
  void begin_key(int32_t key_group, bool type_ok);
  bool scalar_is(KeyType t) const { return key_.columns.size() == 1 && key_.columns[0].type == t; }
  void end_key();
  void begin_namespace(bool type_ok);
  void end_namespace();

  KeySchema key_;
  NamespaceType namespace_type_;
  int32_t max_parallelism_;
  bool ambiguous_;  // both serializers variable-length: write lenbytes after each part
  const KeyArrays* bound_ = nullptr;
  size_t key_start_ = 0;  // offset of ser(key) (after the prefix)
  size_t key_end_ = 0;    // offset just past the key part (incl. its lenbytes); 0 = no key yet
  size_t ns_start_ = 0;
  std::vector<uint8_t> buf_;
};

}  // namespace statecore
