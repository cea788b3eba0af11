// Batch kernels that read (and remove) collection state and clear entries (the batch calls
// besides list append / map put): ListState.get_batch, MapState.get_batch /
// contains_batch / remove_batch, and clear_batch of every state kind. Same key handling,
// validation rules, thread contract and TTL conventions as batch.h (BatchKeySpec, ValueSpec,
// TtlBatchSpec, ArrowInput; BatchError before any mutation), same stored bytes as
// batch_collections.h ("Stored bytes").
//
// Outputs are Arrow-shaped buffers that the caller wraps without a Python object per row. The
// variable-size outputs are APPENDED to caller-owned vectors, so the kernel calls of one batch
// split into chunks write one result: a data vector grows by the bytes / elements of each row,
// and its `offsets` vector (never empty: start both as data {} and offsets {0}) gets one end
// offset into the data per row / element, i.e. the Arrow offsets buffer of the whole result.
//
// TTL (the Python TTL states of statecore/backends/ttl_states.py are the specification, row for
// row; `ttl.now` is the batch's one clock reading):
//  * list get (`TtlListState.get`): a list is a sequence of chunks (docs/formats.md "List
//    state", list_chunks.h); the expired elements at `now` are removed wherever they are in the
//    list (a chunk left empty is removed and unlisted from the list index) and counted; the row shows the unexpired elements, or under
//    `return_expired` all stored elements; under `update_on_read` each unexpired element is
//    restamped `now`;
//  * map get/contains (`TtlMapState._read_one`): only the row's user key's entry is looked at;
//    expired: the entry is removed (and unlisted from the map index) and counted, the value is
//    shown only under `return_expired`; fresh: shown, restamped `now` under `update_on_read`;
//  * map remove and clear read nothing and remove whatever is stored (no expiry check, no count).
// With TTL the reads MUTATE the table. `*expired` (may be null) receives the number of expired
// elements / pairs removed; it is written also when the call throws mid-batch (the rows before
// the failing row keep their effects, as on the Python path).
//
// Errors only the apply pass can find (a stored blob that does not parse, a value of the wrong
// width: the table was written as another kind or type) are BatchErrors naming the row; the
// rows before it have then been applied.
#pragma once
#include <cstdint>
#include <vector>

#include "statecore/batch.h"
#include "statecore/collection_index.h"
#include "statecore/list_index.h"

namespace statecore {

// Removes the entry of every key, in row order (absent keys are skipped). The value bytes are
// not read, so this serves every state kind and value type (pickle included). Throws BatchError
// before any mutation on bad keys (batch.h's key checks).
// For a map state `index` is its map index (collection_index.h): every entry it lists for the
// row's (key, namespace) is removed, and unlisted. For a list state `list_index` is its list
// index (list_index.h): every chunk of the row's (key, namespace) is removed, and the list
// dropped from it. `cleanup` (a TTL state's incremental cleanup, batch.h "TTL"): run
// before each row when set.
void clear_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                 CollectionIndex* index = nullptr, ListIndex* list_index = nullptr,
                 ttl::IncrementalCleanup* cleanup = nullptr);

// ListState.get_batch: the list of every key, its elements those of its chunks `encoded key |
// seq` in list order (`index`, the state's list index, required, lists them; chunk 0 alone when
// unlisted); a listed chunk without an entry is unlisted. Appends per row the end element offset to
// `list_offsets` (an absent key is an empty list: the per-record `get()` returns []), and per
// element: fixed-width element types -> its value to `elements` in the Arrow layout of
// get_batch_fixed's out_values (int64/timestamp/uint64/float64 8 bytes, int32 4 bytes, bool
// one 0/1 byte, fixed_size_binary[N] N bytes; native byte order); String/Binary -> its bytes to
// `elements` and its end byte offset to `element_offsets` (running, as list_offsets). Throws
// BatchError on bad input. TTL: see above.
void list_get_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                    const ValueSpec& element_type, std::vector<int64_t>& list_offsets,
                    std::vector<uint8_t>& elements, std::vector<int64_t>& element_offsets,
                    const TtlBatchSpec& ttl = TtlBatchSpec(), int64_t* expired = nullptr,
                    ListIndex* index = nullptr);

// Where map_get_batch writes: fixed-width value types -> `fixed` (as get_batch_fixed's
// out_values, row i of this call at index i; zeros where absent); String/Binary -> appended to
// `offsets` (running end byte offsets, one per row, an absent row adds no bytes) and `data`.
// `valid` (uint8_t[n]): 1 = a value is shown, 0 = none (null in the Arrow result).
struct MapGetOutput {
  void* fixed = nullptr;
  std::vector<int64_t>* offsets = nullptr;
  std::vector<uint8_t>* data = nullptr;
  uint8_t* valid = nullptr;
};

// MapState.get_batch: the value of user_keys[i] in the map of keys[i]. `user_key` is the
// user-key type as a scalar KeySchema (as map_put_batch). No null user keys. Throws BatchError
// on bad input (also when the output pointers for the value type are missing and n > 0).
void map_get_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                   const KeySchema& user_key, ArrowInput user_keys, const ValueSpec& value_type,
                   const MapGetOutput& out, const TtlBatchSpec& ttl = TtlBatchSpec(),
                   int64_t* expired = nullptr, CollectionIndex* index = nullptr);

// MapState.contains_batch: found[i] (uint8_t[n]) = 1 when user_keys[i] is in the map of
// keys[i] (with TTL: when map_get_batch would show a value), else 0. The value type is needed
// only to find the TTL timestamp (fixed-width values are checked for their width).
void map_contains_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                        const KeySchema& user_key, ArrowInput user_keys,
                        const ValueSpec& value_type, uint8_t* found,
                        const TtlBatchSpec& ttl = TtlBatchSpec(), int64_t* expired = nullptr,
                        CollectionIndex* index = nullptr);

// MapState.remove_batch: removes the entry of user_keys[i] in the map of keys[i], in row order
// (a repeated row finds nothing left to remove), unlisting it from `index` when given. Values
// are not read, so TTL needs no flag (`cleanup` as clear_batch's). Throws BatchError before any
// mutation on bad input.
void map_remove_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                      const KeySchema& user_key, ArrowInput user_keys,
                      CollectionIndex* index = nullptr, ttl::IncrementalCleanup* cleanup = nullptr);

// Validation passes (see validate_batch in batch.h): throw what the kernels above would throw
// before modifying anything, never touch the table. validate_key_batch stands for clear_batch
// and list_get_batch, validate_map_key_batch for the three map kernels.
void validate_key_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                        const TtlBatchSpec& ttl = TtlBatchSpec());
void validate_map_key_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                            const KeySchema& user_key, ArrowInput user_keys,
                            const TtlBatchSpec& ttl = TtlBatchSpec());

}  // namespace statecore
