// The chunks of a list state (docs/formats.md "List state"): a list is a sequence of chunks,
// chunk `seq` the entry `prefix | seq` (8 bytes big-endian, list_index.h) whose value holds up
// to kListChunkElements elements in the list-blob layout: fixed-width elements (width w > 0)
// back to back, w bytes each, variable-width ones each `varlen(len) | bytes`, with TTL each
// followed by its 8-byte timestamp (ttl.h Layout::List). An append copies (or grows in place)
// the last chunk only, or starts the next chunk when the last one is full; a reader takes any
// chunk of one element or more (files written with another bound included).
// Single-threaded: the owner of the table (the thread contract of state_map.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "statecore/list_index.h"
#include "statecore/state_map.h"

namespace statecore {

// Elements an append puts into one chunk. A chunk is one entry, so it bounds what an append
// copies when a snapshot shares the last chunk (copy-on-write) and what an incremental
// checkpoint rewrites after it; the reason for the figure: docs/formats.md "List state".
constexpr size_t kListChunkElements = 32;

// Elements of a chunk value of element width `width` (0: variable) and suffix `suffix` bytes
// (0, or 8 with TTL). Throws std::invalid_argument when the value does not parse (a fixed-width
// value not a whole number of elements, a varlen or element running past the end).
size_t list_chunk_count(const uint8_t* value, size_t size, size_t width, size_t suffix);

// Appends `n` elements to list `prefix` (`prefix_size` bytes) of key group `kg` of map `m`,
// whose list index is `index`: element i is data[ends[i - 1], ends[i]) (ends[-1] = 0), framed
// as a chunk holds it (varlen head for width 0, the bytes, the suffix). They fill the last
// chunk (the index's last listed one, chunk 0 for an unlisted list; written anew when it has no
// entry) up to kListChunkElements, then new chunks, each listed. `key` is scratch;
// `chunk0_hash`, when given, is m.hash() of `prefix | 0` (a kernel's, computed ahead), and
// `chunk0_key`, when given too, those prefix_size + 8 bytes as the kernel built them ahead: the
// lookups of chunk 0 read them instead of `key`, whose bytes were just written by narrower
// stores (a key compare loading them at once would stall until the stores complete). Throws
// what list_chunk_count throws for a broken last chunk (nothing changed), std::length_error past
// chunk 2^64 - 2, and what StateMap::resize_by throws.
void list_append_encoded(StateMap& m, ListIndex& index, int32_t kg, const uint8_t* prefix,
                         size_t prefix_size, const uint8_t* data, const size_t* ends, size_t n,
                         size_t width, size_t suffix, std::vector<uint8_t>& key,
                         const uint32_t* chunk0_hash = nullptr,
                         const uint8_t* chunk0_key = nullptr);

}  // namespace statecore
