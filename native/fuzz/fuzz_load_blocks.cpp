// libFuzzer target: load_blocks (bulk_load.h), a restore's fused verify + decompress + check +
// insert of one run's stored blocks into a StateTable, against a reference written here from
// bulk_load.h's rules and a std::map model of the state.
//
// Input: a 4-byte header, an optional byte, then blocks.
//   flags: & 1 two-byte key-group prefix (else one); & 2 an incremental run (validity bitmaps:
//     tombstones possible); & 4 into_empty (the oldest run); & 8 key_width = the first key's
//     size; & 16 value_width = the first live value's size; & 32 one block's stored bytes
//     damaged (the next byte picks it); & 64 keys as given (else the key-group prefix is
//     prepended and each block's keys sorted and made unique); & 128 the blocks loaded twice
//     (the second time into maps that hold the first load, into_empty as the first);
//   kg_lo (LE16, below 256 or 32768 by prefix width); span: & 7 key groups past kg_lo in the
//     table, & 8 the chained map engine (else flat), & 16 blocks opened on a worker thread
//     (open_ahead).
//   Up to 8 blocks, each: key group (kg_lo + (byte & 15) - 4: some outside the table), entry
//   count (& 63), then per entry: key size (& 31), key, value size (255: a tombstone in an
//   incremental run; else & 31), value.
//
// Contract: load_blocks fails exactly at the first block the reference refuses (its key group
// outside the table or below the block before it; a damaged block; an entry breaking a rule:
// a key not longer than the prefix, of another width than key_width, of another key group,
// a live value of another width than value_width, a key not above the key group's one before
// it), `corrupt` exactly for damaged bytes and keys out of order; the key groups before the
// failed one's hold the model (each entry's value, tombstones removing theirs), its own and
// later ones nothing of it; the entry count is that of the loaded blocks.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "fuzz_table_model.h"
#include "statecore/block_codec.h"
#include "statecore/bulk_load.h"
#include "statecore/hash.h"
#include "statecore/state_map.h"
#include "statecore/state_table.h"

namespace {

using statecore_fuzz::check_table;
using statecore_fuzz::Input;

struct Entry {
  std::string key;
  std::string value;
  bool live = true;
};

struct Block {
  int32_t kg = 0;
  std::vector<Entry> entries;
};

void put_le32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// docs/formats.md "Data file": entries | key offsets | value offsets | keys | values | validity.
std::vector<uint8_t> payload(const Block& b, bool validity) {
  std::vector<uint8_t> p;
  put_le32(p, static_cast<uint32_t>(b.entries.size()));
  uint32_t at = 0;
  put_le32(p, 0);
  for (const Entry& e : b.entries) put_le32(p, at += static_cast<uint32_t>(e.key.size()));
  at = 0;
  put_le32(p, 0);
  for (const Entry& e : b.entries)
    put_le32(p, at += static_cast<uint32_t>(e.live ? e.value.size() : 0));
  for (const Entry& e : b.entries) p.insert(p.end(), e.key.begin(), e.key.end());
  for (const Entry& e : b.entries)
    if (e.live) p.insert(p.end(), e.value.begin(), e.value.end());
  if (validity) {
    std::vector<uint8_t> bits((b.entries.size() + 7) / 8, 0);
    for (size_t i = 0; i < b.entries.size(); ++i)
      if (b.entries[i].live) bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    p.insert(p.end(), bits.begin(), bits.end());
  }
  return p;
}

std::string prefix_of(int32_t kg, int pw) {
  std::string s;
  if (pw == 2) s.push_back(static_cast<char>((kg >> 8) & 0xff));
  s.push_back(static_cast<char>(kg & 0xff));
  return s;
}

// The reference: the first block load_blocks must refuse (-1: none) and whether as corrupt.
int64_t first_bad(const std::vector<Block>& blocks, int32_t lo, int32_t hi, int pw,
                  int64_t key_width, int64_t value_width, int64_t damaged, bool* corrupt) {
  for (size_t b0 = 0; b0 < blocks.size();) {
    const int32_t kg = blocks[b0].kg;
    *corrupt = false;
    if (kg < lo || kg > hi || (b0 > 0 && kg < blocks[b0 - 1].kg)) return static_cast<int64_t>(b0);
    size_t b1 = b0 + 1;
    while (b1 < blocks.size() && blocks[b1].kg == kg) ++b1;
    const std::string* last = nullptr;
    for (size_t b = b0; b < b1; ++b) {
      if (static_cast<int64_t>(b) == damaged) {
        *corrupt = true;
        return static_cast<int64_t>(b);
      }
      for (const Entry& e : blocks[b].entries) {
        const bool bad =
            e.key.size() <= static_cast<size_t>(pw) ||
            (key_width >= 0 && static_cast<int64_t>(e.key.size()) != key_width) ||
            e.key.compare(0, pw, prefix_of(kg, pw)) != 0 ||
            (e.live && value_width >= 0 && static_cast<int64_t>(e.value.size()) != value_width);
        if (bad) return static_cast<int64_t>(b);
        if (last != nullptr && !(*last < e.key)) {
          *corrupt = true;
          return static_cast<int64_t>(b);
        }
        last = &e.key;
      }
    }
    b0 = b1;
  }
  return -1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t flags = in.u8();
  const int pw = (flags & 1) ? 2 : 1;
  const bool validity = flags & 2;
  const bool into_empty = flags & 4;
  const bool raw_keys = flags & 64;
  const int32_t lo_byte = in.u8();
  const int32_t lo = (lo_byte | int32_t{in.u8()} << 8) % (pw == 1 ? 256 : 32768);
  const uint8_t span = in.u8();
  const int32_t hi = std::min(lo + (span & 7), pw == 1 ? 255 : 32767);
  const int damaged_pick = (flags & 32) ? in.u8() : -1;

  std::vector<Block> blocks;
  while (in.left() > 0 && blocks.size() < 8) {
    Block b;
    b.kg = std::max(0, lo + (in.u8() & 15) - 4);
    const size_t n = in.u8() & 63;
    for (size_t i = 0; i < n && in.left() > 0; ++i) {
      Entry e;
      size_t got = 0;
      const uint8_t* k = in.bytes(in.u8() & 31, &got);
      e.key = (raw_keys ? std::string() : prefix_of(b.kg, pw)) +
              std::string(reinterpret_cast<const char*>(k), got);
      const uint8_t vs = in.u8();
      e.live = !(validity && vs == 255);
      if (e.live) {
        const uint8_t* v = in.bytes(vs & 31, &got);
        e.value.assign(reinterpret_cast<const char*>(v), got);
      }
      b.entries.push_back(e);
    }
    if (!raw_keys) {
      std::sort(b.entries.begin(), b.entries.end(),
                [](const Entry& x, const Entry& y) { return x.key < y.key; });
      b.entries.erase(std::unique(b.entries.begin(), b.entries.end(),
                                  [](const Entry& x, const Entry& y) { return x.key == y.key; }),
                      b.entries.end());
    }
    blocks.push_back(b);
  }
  if (blocks.empty()) return 0;

  statecore::BlockLoadSpec spec;
  spec.prefix_bytes = pw;
  spec.has_validity = validity;
  spec.into_empty = into_empty;
  spec.open_ahead = span & 16;  // blocks opened on a worker thread
  for (const Block& b : blocks)
    for (const Entry& e : b.entries) {
      if ((flags & 8) && spec.key_width < 0) spec.key_width = static_cast<int64_t>(e.key.size());
      if ((flags & 16) && e.live && spec.value_width < 0)
        spec.value_width = static_cast<int64_t>(e.value.size());
    }

  std::vector<uint8_t> bytes;
  std::vector<statecore::StoredBlockRef> refs;
  std::vector<int32_t> kgs;
  for (const Block& b : blocks) {
    const std::vector<uint8_t> p = payload(b, validity);
    const size_t at = bytes.size();
    const size_t n = statecore::lz4_block_compress(p.data(), p.size(), &bytes);
    refs.push_back({at, n, p.size(), b.entries.size(), statecore::xxh64(bytes.data() + at, n, 0)});
    kgs.push_back(b.kg);
  }
  const int64_t damaged =
      damaged_pick < 0 ? -1 : static_cast<int64_t>(damaged_pick % static_cast<int>(refs.size()));
  if (damaged >= 0) bytes[refs[damaged].offset] ^= 0x5a;  // the checksum no longer matches
  // Exact-size copy: ASan sees a read past the stored bytes.
  std::vector<uint8_t> exact(bytes.begin(), bytes.end());

  bool corrupt = false;
  const int64_t bad =
      first_bad(blocks, lo, hi, pw, spec.key_width, spec.value_width, damaged, &corrupt);
  statecore::set_default_map_engine((span & 8) ? statecore::MapEngine::Chained
                                               : statecore::MapEngine::Flat);
  statecore::StateTable table(lo, hi);
  std::map<std::string, std::string> model;
  for (int pass = 0; pass < ((flags & 128) ? 2 : 1); ++pass) {
    const statecore::BlockLoadResult r = statecore::load_blocks(
        table, exact.data(), exact.size(), refs.data(), kgs.data(), refs.size(), spec);
    FUZZ_CHECK(r.failed_block == bad, "load_blocks fails at the first block the reference refuses");
    FUZZ_CHECK(r.error.empty() == (bad < 0), "a failure and only a failure says why");
    if (bad >= 0) FUZZ_CHECK(r.corrupt == corrupt, "corrupt exactly for damage and key order");
    // What the blocks before the failed key group's first block hold, applied to the model.
    size_t end = bad < 0 ? blocks.size() : static_cast<size_t>(bad);
    while (end > 0 && bad >= 0 && blocks[end - 1].kg == blocks[bad].kg) --end;
    uint64_t entries = 0;
    for (size_t b = 0; b < end; ++b) {
      entries += blocks[b].entries.size();
      for (const Entry& e : blocks[b].entries) {
        if (e.live) model[e.key] = e.value;
        else model.erase(e.key);
      }
    }
    FUZZ_CHECK(r.entries == entries, "the entry count is that of the loaded blocks");
    check_table(table, model, pw);
    table.rebase();
  }
  return 0;
}
