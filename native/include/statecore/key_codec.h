// The encoded-key layout shared by both backends, checkpoints and the batch kernels
// (docs/architecture.md "Encoded key"; after Flink's SerializedCompositeKeyBuilder /
// CompositeKeySerializationUtils):
//
//   prefix | ser(key) [| lenbytes(ser(key))] | ser(namespace) [| lenbytes(ser(namespace))]
//
// - prefix: the key group, 1 byte when max_parallelism <= 128, else 2 bytes big-endian, so that
//   sorting encoded keys groups each key group into one contiguous range.
// - the two lenbytes are written only when BOTH the key and the namespace serializer are
//   variable-length (Flink's ambiguity rule).
// Checked against tests/data/flink_keygroups.json `rocksdb_composite_key_examples`.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "statecore/key_groups.h"

namespace statecore {

// Namespace serializer of a state (the backend's namespace_type).
enum class NamespaceType : uint8_t { Void, Int64, String };

// True for serializers whose output length depends on the value (string, binary).
inline bool is_variable_length(KeyType t) { return t == KeyType::String || t == KeyType::Binary; }
inline bool is_variable_length(NamespaceType t) { return t == NamespaceType::String; }

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
// string (UTF-8 bytes) / binary (raw bytes): varlen(size + 1) then the bytes (Flink
// StringSerializer's length rule; identical to Flink's bytes for ASCII strings).
void append_ser_bytes(std::vector<uint8_t>& out, const void* data, size_t size);
// VoidNamespace: one byte 00.
inline void append_ser_void(std::vector<uint8_t>& out) { out.push_back(0); }

// Builds encoded keys into one reusable buffer (no allocation once the buffer has grown to the
// longest key). Usage per entry: one key_*() call, then one namespace_*() call; data()/size()
// are then the encoded key. A namespace_*() call may be repeated after one key_*() to address the
// same key under several namespaces (it truncates back to the end of the key part).
// Calling a key_/namespace_ method that does not match the configured types throws
// std::invalid_argument, as does a key group outside [0, max_parallelism).
class KeyEncoder {
 public:
  // Throws std::invalid_argument unless 0 < max_parallelism <= 32768.
  KeyEncoder(KeyType key_type, NamespaceType namespace_type, int32_t max_parallelism);

  void key_int32(int32_t key_group, int32_t key);
  void key_int64(int32_t key_group, int64_t key);
  // String (UTF-8 bytes, not validated here) or binary key, per the configured key type.
  void key_bytes(int32_t key_group, const void* data, size_t size);

  void namespace_void();
  void namespace_int64(int64_t ns);
  void namespace_string(const void* utf8, size_t size);

  const uint8_t* data() const { return buf_.data(); }
  size_t size() const { return buf_.size(); }
  KeyType key_type() const { return key_type_; }
  NamespaceType namespace_type() const { return namespace_type_; }
  int32_t max_parallelism() const { return max_parallelism_; }

 private:
  void begin_key(int32_t key_group, bool type_ok);
  void end_key();
  void begin_namespace(bool type_ok);
  void end_namespace();

  KeyType key_type_;
  NamespaceType namespace_type_;
  int32_t max_parallelism_;
  bool ambiguous_;        // both serializers variable-length: write lenbytes after each part
  size_t key_start_ = 0;  // offset of ser(key) (after the prefix)
  size_t key_end_ = 0;    // offset just past the key part (incl. its lenbytes); 0 = no key yet
  size_t ns_start_ = 0;
  std::vector<uint8_t> buf_;
};

}  // namespace statecore
