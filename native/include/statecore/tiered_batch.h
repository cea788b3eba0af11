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

}  // namespace statecore
