// Batch kernels of the collection states: ListState append and MapState put, with the
// key handling, validation rules, thread contract and TTL conventions of batch.h (same
// BatchKeySpec, ValueSpec, TtlBatchSpec, ArrowInput; BatchError before any mutation).
//
// Stored bytes: docs/formats.md "List state" (chunks `prefix | seq` -> up to
// kListChunkElements elements in the list-blob layout, seq 8 bytes big-endian; list_chunks.h),
// "Map state" (one entry `prefix | ser(uk)` -> `ser(uv)` per user key) and "TTL suffix"; the
// per-record path writes the same.
#pragma once
#include "statecore/batch.h"
#include "statecore/collection_index.h"
#include "statecore/list_chunks.h"
#include "statecore/list_index.h"

namespace statecore {

// Appends values[i] (one element per row, the element type's Arrow format, no nulls) to the list
// of keys[i], in row order (list_append_encoded): the element goes at the end of the list's last
// chunk, or starts the next chunk (listed in `index`, the state's list index, required) when
// that one is full, whatever the list's size. With TTL every appended element is stamped
// `ttl.now` (nothing is read or removed). Throws BatchError before any mutation on bad input:
// batch.h's key checks, values of another format or length, a null value (list elements must not
// be null); BatchError naming the row when a last chunk does not parse (the table holds another
// layout), with the earlier rows applied.
void list_append_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                       const ValueSpec& element_type, ArrowInput values,
                       const TtlBatchSpec& ttl = TtlBatchSpec(), ListIndex* index = nullptr);

// Puts (user_keys[i] -> values[i]) into the map of keys[i], in row order (a repeated user key:
// the last row wins): the entry `encoded key | ser(user_keys[i])` gets the value's bytes, one
// hash lookup a row whatever the map's size. `user_key` is the user-key type as a scalar
// KeySchema (its accepted Arrow formats as a key column's, key_columns.h). No null user keys or
// values (a null value is not a removal here: MapState.remove_batch is). With TTL the put value
// is stamped `ttl.now`. `index` (the state's map index, or nullptr) lists each user key (a new
// one last, collection_index.h). Throws BatchError before any mutation on bad input.
void map_put_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                   const KeySchema& user_key, ArrowInput user_keys, const ValueSpec& value_type,
                   ArrowInput values, const TtlBatchSpec& ttl = TtlBatchSpec(),
                   CollectionIndex* index = nullptr);

// The validation passes of the two kernels (see validate_batch in batch.h): throw what the kernel
// would throw before modifying anything, never touch the table. For callers applying one logical
// batch as several kernel calls (chunks).
void validate_list_append_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                                const ValueSpec& element_type, ArrowInput values,
                                const TtlBatchSpec& ttl = TtlBatchSpec());
void validate_map_put_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                            const KeySchema& user_key, ArrowInput user_keys,
                            const ValueSpec& value_type, ArrowInput values,
                            const TtlBatchSpec& ttl = TtlBatchSpec());

}  // namespace statecore
