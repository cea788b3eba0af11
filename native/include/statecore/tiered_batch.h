// The tiered mode's batch step before a kernel runs (statecore.backends.tiered, docs/tiered.md
// "Batches"): the encoded keys of a batch's rows that memory lacks, found natively in one call
// instead of row by row in Python.
#pragma once
#include <cstdint>
#include <vector>

#include "statecore/batch.h"

namespace statecore {

// The encoded keys (docs/formats.md "Encoded key"; the bytes the kernels address, batch.h) of
// the rows of `keys_in` -- every row, or the rows i with rows[i] != 0 when `rows` is not null --
// each once, in the order of their first row; with `only_absent` only those `table` does not
// hold. Validates the keys as the kernels do (BatchError, nothing appended); touches no state.
// Appends them to `offsets` (holding its leading 0) and `data` in Arrow binary layout.
void batch_encoded_keys(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                        const uint8_t* rows, bool only_absent, std::vector<int32_t>* offsets,
                        std::vector<uint8_t>* data);

// Inserts the `n` entries key i -> value i (Arrow binary layout: `key_offsets`/`value_offsets`
// n + 1 each, `validity` with bit offset `validity_offset`, null: no NULL value) into the map of
// key group kgs[i] as CLEAN entries (StateMap::insert_clean), skipping NULL values and keys the
// table holds; the map slots of the rows ahead are prefetched, as the kernels' rows are
// (RowKeys), since a loaded key is by definition one memory did not touch recently. The key
// groups must be the table's (the caller checked them). Returns the entries inserted. Errors as
// insert_clean.
size_t load_clean_batch(StateTable& table, const int32_t* kgs, const int32_t* key_offsets,
                        const uint8_t* key_data, const int32_t* value_offsets,
                        const uint8_t* value_data, const uint8_t* validity, int64_t validity_offset,
                        size_t n);

}  // namespace statecore
