// Arrow C Data Interface (https://arrow.apache.org/docs/format/CDataInterface.html): the two ABI
// structs exactly as the specification defines them (guarded by ARROW_C_DATA_INTERFACE so that
// this header coexists with any other copy, e.g. nanoarrow's or pyarrow's), plus a read-only,
// validating view of a flat array. No libarrow is linked: Python hands us the structs through
// `__arrow_c_array__` PyCapsules and we read the producer's buffers in place (zero copy).
#pragma once
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4

struct ArrowSchema {
  // Array type description
  const char* format;
  const char* name;
  const char* metadata;
  int64_t flags;
  int64_t n_children;
  struct ArrowSchema** children;
  struct ArrowSchema* dictionary;

  // Release callback
  void (*release)(struct ArrowSchema*);
  // Opaque producer-specific data
  void* private_data;
};

struct ArrowArray {
  // Array data description
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void** buffers;
  struct ArrowArray** children;
  struct ArrowArray* dictionary;

  // Release callback
  void (*release)(struct ArrowArray*);
  // Opaque producer-specific data
  void* private_data;
};

#endif  // ARROW_C_DATA_INTERFACE

#ifdef __cplusplus
}
#endif

namespace statecore {

// The flat Arrow types the native core reads, by C Data Interface format string.
enum class ArrowKind : uint8_t {
  Int32,            // "i"
  Int64,            // "l"
  UInt64,           // "L"
  Float64,          // "g"
  Bool,             // "b"  (values bit-packed, LSB first)
  Timestamp,        // "tss:<tz>", "tsm:<tz>", "tsu:<tz>", "tsn:<tz>" (int64 values)
  FixedSizeBinary,  // "w:<bytes>"
  Utf8,             // "u"  (int32 offsets)
  LargeUtf8,        // "U"  (int64 offsets)
  Binary,           // "z"  (int32 offsets)
  LargeBinary,      // "Z"  (int64 offsets)
};

// Human-readable name of a kind, for error messages ("int32", "large_utf8", ...).
inline const char* arrow_kind_name(ArrowKind k) {
  switch (k) {
    case ArrowKind::Int32: return "int32";
    case ArrowKind::Int64: return "int64";
    case ArrowKind::UInt64: return "uint64";
    case ArrowKind::Float64: return "float64";
    case ArrowKind::Bool: return "bool";
    case ArrowKind::Timestamp: return "timestamp";
    case ArrowKind::FixedSizeBinary: return "fixed_size_binary";
    case ArrowKind::Utf8: return "utf8";
    case ArrowKind::LargeUtf8: return "large_utf8";
    case ArrowKind::Binary: return "binary";
    case ArrowKind::LargeBinary: return "large_binary";
  }
  return "?";
}

// Parses a format string. `unit` receives a timestamp's unit letter ('s', 'm' = ms, 'u' = us,
// 'n' = ns) and `width` a fixed_size_binary's byte width (>= 0); both are left alone for other
// kinds. False (outputs untouched) for any other type: dates, durations, decimals, dictionaries'
// index formats with parameters, nested types ("+s" structs are read by key_columns.h, not here)
// and the view types ("vu", "vz").
inline bool parse_arrow_format(const char* format, ArrowKind* kind, char* unit = nullptr,
                               int32_t* width = nullptr) {
  if (format == nullptr || format[0] == '\0') return false;
  if (format[0] == 't' && format[1] == 's' && format[2] != '\0' && format[3] == ':') {
    const char u = format[2];
    if (u != 's' && u != 'm' && u != 'u' && u != 'n') return false;
    *kind = ArrowKind::Timestamp;  // the time zone after ':' does not change the int64 values
    if (unit != nullptr) *unit = u;
    return true;
  }
  if (format[0] == 'w' && format[1] == ':') {
    int64_t w = 0;
    const char* p = format + 2;
    if (*p == '\0') return false;
    for (; *p != '\0'; ++p) {
      if (*p < '0' || *p > '9') return false;
      w = w * 10 + (*p - '0');
      if (w > INT32_MAX) return false;
    }
    *kind = ArrowKind::FixedSizeBinary;
    if (width != nullptr) *width = static_cast<int32_t>(w);
    return true;
  }
  if (format[1] != '\0') return false;
  switch (format[0]) {
    case 'i': *kind = ArrowKind::Int32; return true;
    case 'l': *kind = ArrowKind::Int64; return true;
    case 'L': *kind = ArrowKind::UInt64; return true;
    case 'g': *kind = ArrowKind::Float64; return true;
    case 'b': *kind = ArrowKind::Bool; return true;
    case 'u': *kind = ArrowKind::Utf8; return true;
    case 'U': *kind = ArrowKind::LargeUtf8; return true;
    case 'z': *kind = ArrowKind::Binary; return true;
    case 'Z': *kind = ArrowKind::LargeBinary; return true;
    default: return false;
  }
}

inline bool is_variable_width(ArrowKind k) {
  return k == ArrowKind::Utf8 || k == ArrowKind::LargeUtf8 || k == ArrowKind::Binary ||
         k == ArrowKind::LargeBinary;
}

// Read-only view of one flat (non-nested, non-dictionary) Arrow array of a supported kind.
// Element i of the view is element (array->offset + i) of the buffers: sliced arrays are handled.
// The view borrows the producer's buffers; it must not outlive the ArrowArray (nor its release).
//
// The constructor validates the structure (non-null pointers, not released, supported format,
// no dictionary, buffer count, non-negative length/offset, data buffers present when length > 0)
// and throws std::invalid_argument naming the problem. Offsets of variable-width arrays are not
// walked here; call check_column_data (key_columns.h) once before trusting bytes_at() on
// untrusted input.
// The C Data Interface does not carry buffer sizes, so buffers shorter than the declared length
// cannot be detected: the producer is trusted for that (as every Arrow consumer must).
class ArrayView {
 public:
  ArrayView(const ArrowSchema* schema, const ArrowArray* array) { init(schema, array); }

  // A child of a struct array: element i of the view is the child's element (parent_offset + i)
  // (the C Data Interface applies a parent's offset on top of the child's own), for
  // parent_length elements; the child must hold at least parent_offset + parent_length.
  ArrayView(const ArrowSchema* schema, const ArrowArray* array, int64_t parent_offset,
            int64_t parent_length) {
    init(schema, array);
    if (parent_offset < 0 || parent_length < 0 || array->length < parent_offset + parent_length)
      throw std::invalid_argument("struct child array of length " + std::to_string(array->length) +
                                  " is shorter than its parent's offset + length");
    offset_ += parent_offset;
    length_ = parent_length;
    // The child's null_count covers all of it, not this window: count within the window.
    if (null_count_ != 0) null_count_ = -1;
  }

  ArrowKind kind() const { return kind_; }
  int64_t length() const { return length_; }
  char time_unit() const { return unit_; }       // Timestamp: 's', 'm', 'u' or 'n'
  int32_t byte_width() const { return width_; }  // FixedSizeBinary

  // Number of nulls (counts the bitmap when the producer reported -1, "unknown").
  int64_t null_count() const {
    if (validity_ == nullptr) return 0;
    if (null_count_ >= 0) return null_count_;
    int64_t n = 0;
    for (int64_t i = 0; i < length_; ++i) n += is_valid(i) ? 0 : 1;
    return n;
  }

  // Validity of element i (0 <= i < length()); true when there is no bitmap.
  bool is_valid(int64_t i) const {
    if (validity_ == nullptr) return true;
    const int64_t j = offset_ + i;
    return (validity_[j >> 3] >> (j & 7)) & 1;
  }

  // Fixed-width values (the kind must match; not checked here for speed). Read with memcpy so
  // unaligned producer buffers are fine.
  int32_t int32_at(int64_t i) const { return load<int32_t>(i); }
  int64_t int64_at(int64_t i) const { return load<int64_t>(i); }  // also Timestamp
  uint64_t uint64_at(int64_t i) const { return load<uint64_t>(i); }
  double float64_at(int64_t i) const { return load<double>(i); }
  bool bool_at(int64_t i) const {
    const int64_t j = offset_ + i;
    return (static_cast<const uint8_t*>(data_)[j >> 3] >> (j & 7)) & 1;
  }
  // The first element's bytes of a fixed-width array of elem_size-byte elements (the offset
  // applied), for loops that read the buffer directly; nullptr for an empty array without one.
  const uint8_t* fixed_data(size_t elem_size) const {
    return data_ ? static_cast<const uint8_t*>(data_) + offset_ * static_cast<int64_t>(elem_size)
                 : nullptr;
  }
  // The byte_width() bytes of FixedSizeBinary element i.
  const uint8_t* fixed_at(int64_t i) const {
    return static_cast<const uint8_t*>(data_) + (offset_ + i) * static_cast<int64_t>(width_);
  }

  // Start/end byte offsets of variable-width element i in the values buffer.
  void offsets_at(int64_t i, int64_t* begin, int64_t* end) const {
    const int64_t j = offset_ + i;
    if (kind_ == ArrowKind::LargeUtf8 || kind_ == ArrowKind::LargeBinary) {
      const auto* o = static_cast<const int64_t*>(data_);
      *begin = o[j];
      *end = o[j + 1];
    } else {
      const auto* o = static_cast<const int32_t*>(data_);
      *begin = o[j];
      *end = o[j + 1];
    }
  }

  // The values buffer of a variable-width array (its byte 0; offsets index into it), or nullptr
  // (absent: then no element may reference a byte).
  const uint8_t* values_buffer() const { return values_; }

  // Bytes of variable-width element i (utf8/binary, either offset width).
  const uint8_t* bytes_at(int64_t i, size_t* size) const {
    int64_t b, e;
    offsets_at(i, &b, &e);
    *size = static_cast<size_t>(e - b);
    return values_ + b;
  }

 private:
  void init(const ArrowSchema* schema, const ArrowArray* array) {
    if (schema == nullptr || array == nullptr)
      throw std::invalid_argument("null ArrowSchema/ArrowArray pointer");
    if (schema->release == nullptr || array->release == nullptr)
      throw std::invalid_argument("ArrowSchema/ArrowArray has already been released");
    if (!parse_arrow_format(schema->format, &kind_, &unit_, &width_))
      throw std::invalid_argument(std::string("unsupported Arrow format '") +
                                  (schema->format ? schema->format : "(null)") +
                                  "' (supported: i, l, L, g, b, ts?:, w:N, u, U, z, Z)");
    if (schema->dictionary != nullptr || array->dictionary != nullptr)
      throw std::invalid_argument("dictionary-encoded arrays are not supported");
    if (array->length < 0 || array->offset < 0 || array->null_count < -1)
      throw std::invalid_argument("ArrowArray has a negative length, offset or null_count");
    const int64_t want_buffers = is_variable_width(kind_) ? 3 : 2;
    if (array->n_buffers != want_buffers || array->buffers == nullptr)
      throw std::invalid_argument(std::string("ArrowArray of ") + arrow_kind_name(kind_) +
                                  " must have " + std::to_string(want_buffers) + " buffers");
    length_ = array->length;
    offset_ = array->offset;
    validity_ = static_cast<const uint8_t*>(array->buffers[0]);
    if (array->null_count == 0) validity_ = nullptr;  // spec: the bitmap may be omitted/ignored
    data_ = array->buffers[1];
    values_ = is_variable_width(kind_) ? static_cast<const uint8_t*>(array->buffers[2]) : nullptr;
    // A zero-width fixed_size_binary has nothing to read, so its data buffer may be absent.
    const bool needs_data = !(kind_ == ArrowKind::FixedSizeBinary && width_ == 0);
    if (length_ > 0 && needs_data && data_ == nullptr)
      throw std::invalid_argument("ArrowArray has a null data/offsets buffer");
    null_count_ = array->null_count;
  }

  template <class T>
  T load(int64_t i) const {
    T v;
    std::memcpy(
        &v, static_cast<const uint8_t*>(data_) + (offset_ + i) * static_cast<int64_t>(sizeof(T)),
        sizeof(T));
    return v;
  }

  ArrowKind kind_ = ArrowKind::Int64;
  char unit_ = 'u';
  int32_t width_ = 0;
  int64_t length_ = 0;
  int64_t offset_ = 0;
  int64_t null_count_ = 0;
  const uint8_t* validity_ = nullptr;
  const void* data_ = nullptr;
  const uint8_t* values_ = nullptr;
};

}  // namespace statecore
