// Batch keys as the Arrow C Data Interface hands them over, read against a KeySchema
// (key_codec.h) without copying: the key group of each row and its ser(key).
//
// Accepted arrays per key column type (the time zone of a timestamp is ignored: the values are
// UTC either way):
//   int32 "i", int64 "l", uint64 "L", float64 "g", bool "b" (bit-packed), timestamp
//   "ts<unit>:<tz>" of the column's unit, string "u"/"U", binary "z"/"Z", fixed_size_binary
//   "w:<width>" of the column's width.
// A scalar key is one such array; a multi-column key (KeySchema::is_struct) is a struct array
// ("+s") with one child per column in order (names are ignored). Offsets are honoured at every
// level (a struct's offset applies on top of its children's), and so are validity bitmaps: a
// null struct row or a null in any column of a row is a null key.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "statecore/arrow_abi.h"
#include "statecore/key_codec.h"
#include "statecore/key_groups.h"

namespace statecore {

// The checks of a variable-width column's data that pyarrow's full validation makes and its
// structural one (Array.validate() without full=True) does not, done here in one O(rows + bytes)
// pass: offsets non-negative and non-decreasing over the viewed rows (of null rows too), a values
// buffer when any byte is referenced, and, for utf8/large_utf8, every non-null element
// well-formed UTF-8 (detail/utf8.h; a null element's bytes are never read, as in pyarrow).
// Returns the first bad row, or -1; *why (may be null) receives what is wrong ("offsets go
// backwards ...", "invalid UTF-8 at byte 2 (overlong form)"). Fixed-width kinds return -1.
//
// The C Data Interface carries no buffer sizes: that the first and last offsets lie within the
// values buffer is the producer's guarantee (pyarrow's structural validation checks it); given
// that, every offset of a column passing this check lies within it too.
int64_t check_column_data(const ArrayView& v, std::string* why);

class KeyArrays {
 public:
  // Validates the arrays' structure and formats against `schema` (the schema is copied). Throws
  // std::invalid_argument naming the problem ("expected an Arrow array of key type
  // timestamp[us], got int64", "field 1: ..."). Offsets of variable-width columns are not walked
  // here: see check_data().
  KeyArrays(const KeySchema& schema, const ArrowSchema* arrow_schema, const ArrowArray* array);
  // Namespaced batch keys (batch.h, BatchKeySpec::has_namespace): a struct array of exactly two
  // children {key, namespace} with offset 0 and no null rows, both children as long as it.
  // Child 0 is read as the constructor above reads keys (a struct array for a multi-column
  // key); child 1, one namespace per row of the scalar type `ns` (the formats of a key column
  // of that type), is namespaces(). Key groups and append_ser() cover the key alone. Throws
  // std::invalid_argument as above ("key: ...", "namespaces: ...").
  KeyArrays(const KeySchema& schema, const KeySchema& ns, const ArrowSchema* arrow_schema,
            const ArrowArray* array);

  // The namespace column of namespaced keys, a one-column KeyArrays; nullptr otherwise.
  const KeyArrays* namespaces() const { return ns_.get(); }

  const KeySchema& schema() const { return schema_; }
  int64_t length() const { return length_; }

  // First row whose data fails check_column_data in any key column (not the namespace column:
  // check namespaces() on its own), or -1; *why (may be null) receives what is wrong, with a
  // "field i: " prefix for a multi-column key. O(rows + bytes).
  int64_t check_data(std::string* why) const;
  // First row whose key is null, or -1; `column` (may be null) receives the column holding the
  // null, -1 when the struct row itself is null. The namespace column is not looked at.
  int64_t first_null(int* column) const;

  // Key group of every row into out[0, length()). For a string column under the Flink assigner,
  // malformed UTF-8 throws std::invalid_argument naming the row.
  void key_groups(Assigner a, int32_t max_parallelism, int32_t* out) const;
  // Appends ser(key) of `row`: each column's serializer, in order (key_codec.h).
  void append_ser(std::vector<uint8_t>& out, int64_t row) const;
  // The column of a scalar (single-column, non-struct) key, for the kernels' fixed-width fast
  // path; nullptr for a multi-column key.
  const ArrayView* scalar_column() const {
    return schema_.is_struct || columns_.size() != 1 ? nullptr : &columns_[0];
  }

 private:
  void add_to(KeyHasher& h, size_t column, int64_t row) const;

  KeySchema schema_;
  std::vector<ArrayView> columns_;
  const uint8_t* struct_validity_ = nullptr;  // null when no struct row is null
  int64_t struct_offset_ = 0;
  int64_t length_ = 0;
  std::shared_ptr<const KeyArrays> ns_;  // shared: KeyArrays is copied by value
};

}  // namespace statecore
