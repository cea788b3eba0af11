// libFuzzer target: what a restore and a catch-up do with the entries a reader decoded --
// check_entries and load_entries (bulk_load.h) into a StateTable, and merge_newest_wins
// (sorted_run.h) over an incremental chain -- on runs whose offsets, key-group prefixes, order,
// widths and tombstones come from the input.
//
// Input: a 6-byte header, then entries.
//   flags: & 1 two-byte key-group prefix (else one); & 2 values carry a validity bitmap (a change
//     set); & 4 corrupt one offset (below); & 8 check_entries allows tombstones; >> 4: the
//     state's value width + 1 (0: any width);
//   kg_lo (LE16, below 256 or 32768 by prefix width); span: & 7 key groups past kg_lo in the
//     table, & 8 the chained map engine (else flat), >> 4 the validity bitmap's first bit (an
//     Arrow array offset);
//   corrupt: & 31 the offset's index, & 32 value (else key) offsets; delta: int8 added to it.
//   Each entry: key size (1 byte), key, value size (1 byte; 255 = tombstone when & 2), value.
//
// Contract: check_entries accepts exactly the runs a reference written here from bulk_load.h's
// rules accepts; load_entries throws std::invalid_argument, before writing anything, for exactly
// the runs check_entries (any width, tombstones allowed) refuses, and otherwise leaves the table
// holding, per key, the last entry's value (none after a tombstone), also when the run is loaded
// twice, and listing those in key order (MapSnapshot::sorted_entries); merge_newest_wins accepts
// exactly the runs with sound offsets and strictly ascending keys and picks the newest entry of
// every key (under a newer run of every other entry too), tombstones only when asked to.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "fuzz_table_model.h"
#include "statecore/bulk_load.h"
#include "statecore/sorted_run.h"
#include "statecore/state_table.h"

namespace {

using statecore_fuzz::check_table;
using statecore_fuzz::Input;

struct Run {
  std::vector<int32_t> ko{0}, vo{0};
  std::vector<uint8_t> kd, vd, validity;
  std::vector<bool> removed;
  int64_t validity_bit = 0;

  size_t size() const { return removed.size(); }
  statecore::ArrowBinaryRun view() const {
    statecore::ArrowBinaryRun r;
    r.key_offsets = ko.data();
    r.key_data = kd.data();
    r.key_data_size = kd.size();
    r.value_offsets = vo.data();
    r.value_data = vd.data();
    r.value_data_size = vd.size();
    r.validity = validity.empty() ? nullptr : validity.data();
    r.validity_bit = validity_bit;
    r.size = size();
    return r;
  }
  std::string key(size_t i) const {
    return std::string(kd.begin() + ko[i], kd.begin() + ko[i + 1]);
  }
  std::string value(size_t i) const {
    return std::string(vd.begin() + vo[i], vd.begin() + vo[i + 1]);
  }
};

// The values' validity bitmap from r.removed, starting at bit r.validity_bit.
void set_validity(Run& r) {
  r.validity.assign((r.validity_bit + r.size() + 7) / 8, 0xA5);  // bits outside: noise
  for (size_t i = 0; i < r.size(); ++i) {
    const uint64_t bit = r.validity_bit + i;
    r.validity[bit / 8] &= static_cast<uint8_t>(~(1u << (bit % 8)));
    r.validity[bit / 8] |= static_cast<uint8_t>(!r.removed[i]) << (bit % 8);
  }
}

bool offsets_sound(const std::vector<int32_t>& o, size_t data_size) {
  if (o.size() == 1) return true;  // no entry: first_bad_offset looks at nothing
  for (size_t i = 0; i < o.size(); ++i)
    if (o[i] < 0 || (i > 0 && o[i] < o[i - 1])) return false;
  return static_cast<size_t>(o.back()) <= data_size;
}

// bulk_load.h's rules for check_entries, written apart from bulk_load.cpp.
bool entries_ok(const Run& r, int32_t lo, int32_t hi, int pw, int64_t width, bool tombstones) {
  if (!offsets_sound(r.ko, r.kd.size()) || !offsets_sound(r.vo, r.vd.size())) return false;
  int32_t prev = lo;
  for (size_t i = 0; i < r.size(); ++i) {
    const std::string k = r.key(i);
    if (k.size() <= static_cast<size_t>(pw)) return false;
    const int32_t kg = pw == 1 ? uint8_t(k[0]) : uint8_t(k[0]) << 8 | uint8_t(k[1]);
    if (kg < prev || kg > hi) return false;
    prev = kg;
    if (r.removed[i] && !tombstones) return false;
    if (!r.removed[i] && width >= 0 && static_cast<int64_t>(r.value(i).size()) != width)
      return false;
  }
  return true;
}

bool strictly_ascending(const Run& r) {
  if (!offsets_sound(r.ko, r.kd.size()) || !offsets_sound(r.vo, r.vd.size())) return false;
  for (size_t i = 1; i < r.size(); ++i)
    if (!(r.key(i - 1) < r.key(i))) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t flags = in.u8();
  const int pw = (flags & 1) ? 2 : 1;
  const bool with_validity = flags & 2, corrupt = flags & 4, tombstones_ok = flags & 8;
  const int64_t width = static_cast<int64_t>(flags >> 4) - 1;
  const int32_t kg_limit = pw == 1 ? 256 : 32768;
  const int32_t kg_lo = static_cast<int32_t>((in.u8() | in.u8() << 8) % kg_limit);
  const uint8_t span = in.u8();
  const int32_t kg_hi = std::min(kg_lo + (span & 7), kg_limit - 1);
  const uint8_t corrupt_at = in.u8();
  const int8_t delta = static_cast<int8_t>(in.u8());

  Run r;
  r.validity_bit = span >> 4;
  while (in.left() > 0 && r.size() < 512) {
    size_t got = 0;
    const uint8_t* k = in.bytes(in.u8(), &got);
    r.kd.insert(r.kd.end(), k, k + got);
    const uint8_t vs = in.u8();
    const bool removed = with_validity && vs == 255;
    const uint8_t* v = in.bytes(removed ? 0 : vs, &got);
    r.vd.insert(r.vd.end(), v, v + got);
    r.ko.push_back(static_cast<int32_t>(r.kd.size()));
    r.vo.push_back(static_cast<int32_t>(r.vd.size()));
    r.removed.push_back(removed);
  }
  if (with_validity) set_validity(r);
  if (corrupt) {
    std::vector<int32_t>& o = (corrupt_at & 32) ? r.vo : r.ko;
    o[(corrupt_at & 31) % o.size()] += delta;
  }
  const statecore::ArrowBinaryRun view = r.view();

  const bool ok = entries_ok(r, kg_lo, kg_hi, pw, width, tombstones_ok);
  const std::string bad = statecore::check_entries(view, kg_lo, kg_hi, pw, width, tombstones_ok);
  FUZZ_CHECK(bad.empty() == ok, "check_entries accepts exactly the well-formed runs");

  const bool loadable = entries_ok(r, kg_lo, kg_hi, pw, -1, true);
  // Both engines must load alike (state_map.h); the choice applies to maps created from here.
  statecore::set_default_map_engine((span & 8) ? statecore::MapEngine::Chained
                                               : statecore::MapEngine::Flat);
  statecore::StateTable table(kg_lo, kg_hi);
  std::map<std::string, std::string> model;
  for (int pass = 0; pass < 2; ++pass) {
    try {
      statecore::load_entries(table, view, pw);
      FUZZ_CHECK(loadable, "load_entries refuses a run check_entries refuses");
    } catch (const std::invalid_argument&) {
      FUZZ_CHECK(!loadable, "load_entries loads a run check_entries accepts");
      FUZZ_CHECK(table.size() == 0, "a refused run writes nothing");
      break;
    }
    for (size_t i = 0; i < r.size(); ++i) {
      if (r.removed[i]) model.erase(r.key(i));
      else model[r.key(i)] = r.value(i);
    }
    check_table(table, model, pw);
    table.rebase();
  }

  // merge_newest_wins over the run alone, then under a newer run of every other entry of it
  // (the same keys: those must come from the newer run), with and without tombstones kept.
  const bool mergeable = strictly_ascending(r);
  std::vector<statecore::RunPick> picks;
  try {
    statecore::merge_newest_wins({view}, &picks, false);
    FUZZ_CHECK(mergeable, "merge_newest_wins refuses unsorted runs or unsound offsets");
  } catch (const std::invalid_argument&) {
    FUZZ_CHECK(!mergeable, "merge_newest_wins merges sorted runs");
    return 0;
  }
  size_t at = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed[i]) continue;
    FUZZ_CHECK(at < picks.size() && picks[at].run == 0 && picks[at].row == i,
               "a run's live entries are picked, in order");
    ++at;
  }
  FUZZ_CHECK(at == picks.size(), "nothing but the live entries is picked");
  Run newer;
  for (size_t i = 0; i < r.size(); i += 2) {
    const std::string k = r.key(i), v = r.value(i);
    newer.kd.insert(newer.kd.end(), k.begin(), k.end());
    newer.vd.insert(newer.vd.end(), v.begin(), v.end());
    newer.ko.push_back(static_cast<int32_t>(newer.kd.size()));
    newer.vo.push_back(static_cast<int32_t>(newer.vd.size()));
    newer.removed.push_back(r.removed[i]);
  }
  if (with_validity) set_validity(newer);
  for (bool keep : {false, true}) {
    picks.clear();
    statecore::merge_newest_wins({newer.view(), view}, &picks, keep);
    at = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      if (r.removed[i] && !keep) continue;
      const uint32_t run = i % 2 ? 1 : 0, row = static_cast<uint32_t>(i % 2 ? i : i / 2);
      FUZZ_CHECK(at < picks.size() && picks[at].run == run && picks[at].row == row,
                 "the newest entry of every key is picked, in key order");
      ++at;
    }
    FUZZ_CHECK(at == picks.size(), "one pick per key");
  }
  return 0;
}
