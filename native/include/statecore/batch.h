// Batch kernels: Arrow arrays of keys (and values) in, state of one StateTable read/written per
// row, Arrow-shaped results out -- without Python objects, without libarrow, without allocating
// per row (one reused key buffer and one per-thread key-group scratch vector).
//
// Scope: value state and reducing state of one state table (list append and map put:
// batch_collections.h; list/map reads, map removals, clear: batch_reads.h). Every row addresses
// the entry whose encoded key is `prefix(kg) | ser(key) | 00` for the VoidNamespace, or
// `prefix(kg) | ser(key) | ser(ns)` (with lenbytes when both are variable-length) for namespaced
// keys (BatchKeySpec::has_namespace) (docs/formats.md "Encoded key", the same bytes as
// KeyEncoder in key_codec.h), kg from the spec's Assigner (key_groups.h), so the per-record
// Python path and these kernels read and write the same entries.
//
// Values are stored as docs/formats.md "Values" defines (the reference serializers,
// statecore/value_types.py); a stored bool reads any nonzero byte as true.
//
// Validation happens BEFORE any mutation: a BatchError leaves the table exactly as it was. Checked
// up front: the Arrow structs (format, buffers, offsets), key/value formats against the declared
// types, equal lengths, no null keys (nor null fields of a multi-column key), every key's key
// group inside [kg_start, kg_end] and inside
// the table, output pointers. The only error that can surface mid-batch is a stored entry of the
// wrong width for the declared value type (the table was written as another value type — a caller
// bug, not bad input); it is reported as a BatchError naming the row, and the rows before it have
// then been applied.
//
// TTL (TtlBatchSpec, statecore/ttl.h): with `ttl.enabled` every stored value is the user bytes
// followed by the 8-byte big-endian last-access timestamp (ms), and each kernel behaves exactly as
// the per-row Python TTL states (statecore/backends/ttl_states.py, `_TtlValue`/`_TtlReducing`:
// the specification these kernels are tested against, row for row):
//  * the batch reads the clock once: `ttl.now` stamps every write and decides every expiry;
//  * a read (get rows, null rows of add_batch) of an expired entry removes it and counts it; it
//    yields null, or under `return_expired` the stale value this once; a fresh entry is returned
//    and under `update_on_read` its timestamp is rewritten to `now` (through get_for_update, so a
//    live snapshot keeps the old bytes);
//  * a write stamps `now`; add_batch folds into the UNEXPIRED aggregate (an expired one counts as
//    absent, whatever the visibility, and counts as one expired entry) and overwrites it.
// So with TTL the get kernels MUTATE the table (removals, renewals) and need the same exclusive
// ownership as the writing kernels. `*expired` receives the number of expired entries the call
// met (removed on read, or found expired under an add); it is written even when the call throws
// mid-batch, since the rows before the error keep their effects (the Python path counts them
// too). An int64 Sum overflow with TTL undoes the aggregate writes (old bytes, timestamp
// included, and entries the batch created), as Python never applies its staged aggregates then,
// but keeps what null rows did before the failing row (expired entries removed on read, renewed
// timestamps) and reports their count: Python's `_fresh` applies those immediately.
// Incremental cleanup (`ttl.cleanup`, ttl.h IncrementalCleanup): when set, every row first runs
// the state access's cleanup steps (ttl::cleanup_row), so row i sees the table after the steps
// of rows 0..i and the writes of rows 0..i-1, as the rows one at a time; unset, a null test a
// row.
//
// Thread contract: as StateTable's — the calling thread owns the table for the call; kernels on
// different tables may run concurrently (no shared mutable state; the scratch is thread_local).
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "statecore/arrow_abi.h"
#include "statecore/key_codec.h"
#include "statecore/key_groups.h"
#include "statecore/state_table.h"

namespace statecore {
namespace ttl {
struct IncrementalCleanup;
}

// Bad batch input (wrong Arrow type, null key, length mismatch, key group outside the table's
// range, ...). The message says what and, when a row is at fault, which row (0-based, relative to
// the array's logical start, i.e. after its offset). Thrown before any state is modified.
class BatchError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Value type of the state (its descriptor's value type). Accepted Arrow formats per type:
// Int64 <- "l", Float64 <- "g", Int32 <- "i", Bool <- "b", UInt64 <- "L", Timestamp <- "ts?:"
// of the spec's unit (any time zone), FixedSizeBinary <- "w:N" of the spec's width, String <-
// "u" or "U", Binary <- "z" or "Z". All but String and Binary are fixed-width (8, 8, 4, 1, 8, 8,
// N stored bytes).
enum class ValueType : uint8_t {
  Int64,
  Float64,
  String,
  Binary,
  Int32,
  Bool,
  UInt64,
  Timestamp,
  FixedSizeBinary
};

// A value type with its parameter: the unit of a Timestamp ('s', 'm' = ms, 'u' = us, 'n' = ns:
// the letters of ArrayView::time_unit) and the byte width of a FixedSizeBinary (>= 1). The
// other types take none, so a ValueType converts implicitly. A Timestamp without a valid unit
// or a FixedSizeBinary with a width < 1 makes every kernel throw BatchError.
struct ValueSpec {
  ValueType type = ValueType::Int64;
  char unit = 0;
  int32_t width = 0;

  ValueSpec() = default;
  ValueSpec(ValueType t) : type(t) {}  // NOLINT(google-explicit-constructor): see above
  static ValueSpec timestamp(char unit) {
    ValueSpec s(ValueType::Timestamp);
    s.unit = unit;
    return s;
  }
  static ValueSpec fixed_size_binary(int32_t width) {
    ValueSpec s(ValueType::FixedSizeBinary);
    s.width = width;
    return s;
  }
};

// Stored width of a fixed-width value type (without the TTL timestamp), 0 for String/Binary.
size_t value_width(const ValueSpec& t);

// Reducing functions of add_batch. Sum keeps the value type (Int64, UInt64, Float64 or Int32);
// Min/Max too, on any fixed-width type but Bool (which the reference rejects for them; a
// FixedSizeBinary compares as bytes, memcmp = Python's bytes order; a Timestamp as its int64);
// Count keeps an int64 count of non-null values (any supported value format; only validity is
// read). An Int64, UInt64 or Int32 Sum that overflows its type throws BatchError and leaves the
// table as before the batch (the reference backend's rule; an undo log makes it exact). Min/Max
// follow Python's min(acc, v)/max(acc, v): the accumulator is replaced only when v < acc (resp.
// v > acc), so a NaN value never replaces an accumulator and a NaN accumulator is never replaced.
// First keeps the first value added, Last the latest (any fixed-width value type, Bool included).
enum class Reducer : uint8_t { Sum, Min, Max, Count, First, Last };

// How keys map to entries of the table.
struct BatchKeySpec {
  // The backend's key: its columns decide the accepted Arrow arrays, the key serializer and the
  // hash under `assigner` (key_columns.h, key_groups.h): int32 "i", int64 "l", uint64 "L",
  // float64 "g", bool "b", timestamp "ts?:" of the column's unit, string "u"/"U", binary
  // "z"/"Z", fixed_size_binary "w:N"; a multi-column key is a struct array of those.
  KeySchema key = KeySchema::scalar(KeyType::Int64);
  Assigner assigner = Assigner::Spark;
  int32_t max_parallelism = 128;
  // Inclusive key-group range served by the table (the operator's key-group range); must satisfy
  // 0 <= kg_start <= kg_end < max_parallelism and lie inside the table's own range.
  int32_t kg_start = 0;
  int32_t kg_end = 127;
  // Namespaces. Without (the default) every row addresses `prefix | ser(key) | 00`, the
  // VoidNamespace. With `has_namespace` the keys input of every kernel is a struct array
  // {key, namespace} (offset 0, no null rows; key_columns.h): child 0 the keys as described
  // above, child 1 one namespace per row of the scalar type `ns` (int32, int64, string or binary:
  // the state's namespace type; no nulls), and row i addresses `prefix | ser(key) [| lenbytes] |
  // ser(ns) [| lenbytes]` (key_codec.h; lenbytes when key and namespace are both
  // variable-length), the key group coming from the key alone. A null namespace is a BatchError
  // naming the row, raised before any mutation like a null key.
  bool has_namespace = false;
  KeySchema ns = KeySchema::scalar(KeyType::Int64);
};

// TTL of the state a kernel serves (see "TTL" above). Default: disabled, values carry no
// timestamp and the kernels never mutate on read.
struct TtlBatchSpec {
  bool enabled = false;
  int64_t ttl_ms = 1;           // time to live, ms; must be > 0 when enabled (else BatchError)
  int64_t now = 0;              // the batch's clock reading, ms (processing time or watermark)
  bool update_on_read = false;  // UpdateType.OnReadAndWrite: renew on a successful read
  bool return_expired = false;  // StateVisibility.ReturnExpiredIfNotCleanedUp
  // Incremental cleanup before each row (see "TTL" above; ttl.h); nullptr: none.
  ttl::IncrementalCleanup* cleanup = nullptr;
};

// One Arrow array as received through the C Data Interface (e.g. from `__arrow_c_array__`).
// Borrowed: the kernels neither release nor retain it.
struct ArrowInput {
  const ArrowSchema* schema = nullptr;
  const ArrowArray* array = nullptr;
};

// Looks up every key. For fixed-width value types:
//   out_values: int64_t[n] (Int64, Timestamp), uint64_t[n] (UInt64), double[n] (Float64),
//               int32_t[n] (Int32), uint8_t[n] 0/1 (Bool) or uint8_t[n * width] (FixedSizeBinary:
//               row i at i * width), n = keys length; written for present keys, zeros for absent
//               ones;
//   out_valid:  uint8_t[n] byte map, 1 = present, 0 = absent (-> null in the Arrow result).
// Both may be null only when n == 0. Throws BatchError on bad input (see above) or when value_type
// is not fixed-width. Without TTL it does not modify the table; with TTL it removes the expired
// entries it reads and renews read ones under update_on_read (stored width then
// value_width + 8 bytes), and
// `expired` (may be null) receives the number of expired entries removed.
void get_batch_fixed(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                     const ValueSpec& value_type, void* out_values, uint8_t* out_valid,
                     const TtlBatchSpec& ttl = TtlBatchSpec(), int64_t* expired = nullptr);

// Looks up every key of a String/Binary-valued state, producing the large_binary/large_utf8
// layout: `offsets` is resized to n + 1 int64 byte offsets into `data` (offsets[0] = 0; an absent
// key gets an empty slot), `data` receives the concatenated value bytes (cleared first), and
// out_valid (uint8_t[n], may be null only when n == 0) gets 1 = present, 0 = absent.
// int64 offsets because one batch's values may exceed 2 GiB; Python wraps them as
// pa.large_binary()/pa.large_string() (cast to binary/string when small, if needed).
// Throws BatchError on bad input or when value_type is not String/Binary. TTL as
// get_batch_fixed: the timestamp suffix is not part of the output, a stored value shorter than 8
// bytes is a BatchError naming the row.
void get_batch_var(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                   const ValueSpec& value_type, std::vector<int64_t>& offsets,
                   std::vector<uint8_t>& data, uint8_t* out_valid,
                   const TtlBatchSpec& ttl = TtlBatchSpec(), int64_t* expired = nullptr);

// Writes values[i] for keys[i], in row order (so for repeated keys the last row wins). A null
// value removes the key (Flink: ValueState.update(null) == clear()). keys and values must have
// the same length. Throws BatchError before any mutation on bad input. With TTL every written
// value is stamped `ttl.now` (a put reads nothing, so nothing expires here).
void put_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
               const ValueSpec& value_type, ArrowInput values,
               const TtlBatchSpec& ttl = TtlBatchSpec());

// Folds values[i] into the state of keys[i] with `reducer`, in row order, and writes the
// aggregate AFTER each row:
//   out_values: as get_batch_fixed for the state's type (int64_t[n] always for Count);
//   out_valid:  uint8_t[n], 1 = an aggregate exists, 0 = none (null in the Arrow result).
// An absent state starts at the first non-null value (Count: 1). A null value leaves the state
// unchanged and outputs the current aggregate (null when none). value_type is the state's type:
// Int64, UInt64, Float64 or Int32 for Sum, any fixed-width type but Bool for Min/Max, any
// fixed-width type for First/Last (values of the type's format), Int64 for Count (values any
// supported format). Throws BatchError before any mutation on bad input.
// With TTL (see "TTL" above): a row with a value folds into the unexpired aggregate, writes
// aggregate | now and outputs the aggregate; a null row outputs what get_batch would (removing an
// expired aggregate, showing it once under return_expired, renewing under update_on_read).
// Because every aggregate written here is fresh at `now`, applying rows immediately gives the
// same results as Python's staged writes for any sequence, repeated keys included. `expired` (may
// be null) receives the expired entries met (see "TTL" for the overflow case).
void add_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
               const ValueSpec& value_type, Reducer reducer, ArrowInput values, void* out_values,
               uint8_t* out_valid, const TtlBatchSpec& ttl = TtlBatchSpec(),
               int64_t* expired = nullptr);

// The kernel a validate_batch call stands for.
enum class BatchOp : uint8_t { Get, Put, Add };

// The validation pass of one kernel call, without the kernel: throws the BatchError that
// get_batch_fixed/get_batch_var (op Get; `values` ignored), put_batch (Put) or add_batch (Add,
// with `reducer`) would throw before modifying anything for the same arguments, and returns
// normally when that kernel would pass validation. Never touches the table. A caller applying one
// logical batch as several kernel calls (one per chunk of an Arrow stream) validates every chunk
// first, so bad input in a later chunk raises before an earlier chunk is applied. What only the
// apply pass can detect (an Int64/Int32 Sum overflow, a stored value of the wrong width) is not
// covered: such callers must not split an overflow-checked Sum.
void validate_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                    const ValueSpec& value_type, BatchOp op, Reducer reducer, ArrowInput values,
                    const TtlBatchSpec& ttl = TtlBatchSpec());

}  // namespace statecore
