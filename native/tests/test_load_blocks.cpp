// Unit tests of load_blocks (bulk_load.h): stored blocks of random runs over many key groups,
// several blocks per key group, restored against a std::map model -- the oldest run into empty
// maps (into_empty), newer incremental runs upserted over it with tombstones, into_empty over a
// map that is not empty, 1- and 2-byte prefixes -- and every kind of bad input: damaged stored
// bytes and keys out of order (corrupt), entries breaking the state's rules and key groups
// outside the table (not corrupt), each naming its block and loading nothing of its key group.
// Fixed seeds.
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "statecore/block_codec.h"
#include "statecore/bulk_load.h"
#include "statecore/hash.h"
#include "table_model.h"

using statecore::BlockLoadResult;
using statecore::BlockLoadSpec;
using statecore::StateTable;
using statecore::StoredBlockRef;

namespace {

// Rows per run are divided by this under ThreadSanitizer (CI runs this suite there for the
// decode-ahead and parallel-slice threads): TSan slows every access ~10x, and the threads meet
// as often on a few thousand rows per key group as on tens of thousands.
#if defined(__SANITIZE_THREAD__)
constexpr uint64_t kRowScale = 8;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr uint64_t kRowScale = 8;
#else
constexpr uint64_t kRowScale = 1;
#endif
#else
constexpr uint64_t kRowScale = 1;
#endif

// Whether the loads of the test running open their blocks on a worker thread
// (BlockLoadSpec::open_ahead); the tests of fallible loads run once each way (both_ways).
bool g_open_ahead = false;

// One entry of a block: key, value (nullptr-like: `live` false is a tombstone).
struct Row {
  std::string key;
  std::string value;
  bool live = true;
};

void put_le32(std::vector<uint8_t>* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// The payload of one block (docs/formats.md "Data file"): entries | key offsets | value offsets
// | keys | values | validity (with has_validity).
std::vector<uint8_t> payload(const std::vector<Row>& rows, bool has_validity) {
  std::vector<uint8_t> p;
  put_le32(&p, static_cast<uint32_t>(rows.size()));
  uint32_t at = 0;
  put_le32(&p, 0);
  for (const Row& r : rows) put_le32(&p, at += static_cast<uint32_t>(r.key.size()));
  at = 0;
  put_le32(&p, 0);
  for (const Row& r : rows) put_le32(&p, at += static_cast<uint32_t>(r.live ? r.value.size() : 0));
  for (const Row& r : rows) p.insert(p.end(), r.key.begin(), r.key.end());
  for (const Row& r : rows)
    if (r.live) p.insert(p.end(), r.value.begin(), r.value.end());
  if (has_validity) {
    std::vector<uint8_t> bits((rows.size() + 7) / 8, 0);
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].live) bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    p.insert(p.end(), bits.begin(), bits.end());
  }
  return p;
}

// Blocks stored back to back, with the key group of each.
struct Stored {
  std::vector<uint8_t> bytes;
  std::vector<StoredBlockRef> refs;
  std::vector<int32_t> kgs;

  void add(const std::vector<Row>& rows, int32_t kg, bool has_validity) {
    const std::vector<uint8_t> p = payload(rows, has_validity);
    const size_t at = bytes.size();
    const size_t n = statecore::lz4_block_compress(p.data(), p.size(), &bytes);
    refs.push_back({at, n, p.size(), rows.size(), statecore::xxh64(bytes.data() + at, n, 0)});
    kgs.push_back(kg);
  }
  BlockLoadResult load(StateTable& t, BlockLoadSpec spec) const {
    spec.open_ahead = g_open_ahead;
    return statecore::load_blocks(t, bytes.data(), bytes.size(), refs.data(), kgs.data(),
                                  refs.size(), spec);
  }
  BlockLoadResult load_parallel(StateTable& t, const BlockLoadSpec& spec, int threads,
                                uint64_t min_slice_bytes = 0) const {
    return statecore::load_blocks_parallel(t, bytes.data(), bytes.size(), refs.data(), kgs.data(),
                                           refs.size(), spec, threads, min_slice_bytes);
  }
};

// A run of random rows over key groups [lo, hi], sorted by key, cut into blocks of at most
// `per_block` rows that never span two key groups; applied to `model`.
Stored random_run(std::mt19937_64& rng, Model& model, int32_t lo, int32_t hi, uint64_t keys, int pw,
                  int tombstone_pct, size_t per_block) {
  const bool incremental = tombstone_pct > 0;
  std::map<std::string, Row> rows;
  for (uint64_t i = 0; i < keys; ++i) {
    const int32_t kg = lo + static_cast<int32_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
    Row r{encoded_key(kg, rng() % (keys * 2), pw), std::string(8, '\0'), true};
    for (char& c : r.value) c = static_cast<char>(rng());
    r.live = static_cast<int>(rng() % 100) >= tombstone_pct;
    rows[r.key] = r;
  }
  Stored s;
  std::vector<Row> block;
  int32_t kg = -1;
  for (const auto& [k, r] : rows) {
    if (!block.empty() && (kg_of(k, pw) != kg || block.size() == per_block)) {
      s.add(block, kg, incremental);
      block.clear();
    }
    kg = kg_of(k, pw);
    block.push_back(r);
    if (r.live) model[k] = r.value;
    else model.erase(k);
  }
  if (!block.empty()) s.add(block, kg, incremental);
  return s;
}

BlockLoadSpec spec_of(int pw, bool has_validity, bool into_empty) {
  BlockLoadSpec s;
  s.prefix_bytes = pw;
  s.key_width = pw + 9;
  s.value_width = 8;
  s.has_validity = has_validity;
  s.into_empty = into_empty;
  s.open_ahead = g_open_ahead;
  return s;
}

std::vector<Row> rows_of(int32_t kg, std::initializer_list<uint64_t> keys, int pw = 1) {
  std::vector<Row> out;
  for (uint64_t k : keys) out.push_back({encoded_key(kg, k, pw), std::string(8, 'v'), true});
  return out;
}

// Runs `body` with blocks opened on the loading thread, then on a worker thread ahead of it.
void both_ways(void (*body)()) {
  for (const bool ahead : {false, true}) {
    g_open_ahead = ahead;
    body();
  }
  g_open_ahead = false;
}

}  // namespace

static void random_chains_match_a_model_once();
TEST(random_chains_match_a_model) { both_ways(random_chains_match_a_model_once); }
static void random_chains_match_a_model_once() {
  for (int pw : {1, 2}) {
    std::mt19937_64 rng(pw * 11);
    const int32_t lo = pw == 1 ? 3 : 250, hi = pw == 1 ? 40 : 300;
    StateTable t(lo, hi);
    Model model;
    // The oldest run into empty maps, then incremental runs over it.
    for (int round = 0; round < 5; ++round) {
      const Stored s =
          random_run(rng, model, lo, hi, 30000 / kRowScale, pw, round == 0 ? 0 : 10, 97);
      const BlockLoadResult r = s.load(t, spec_of(pw, round > 0, round == 0));
      CHECK_EQ(r.failed_block, int64_t{-1});
      CHECK(r.error.empty());
      check_table(t, model, pw);
    }
  }
}

TEST(into_empty_over_a_map_that_is_not_empty_upserts) {
  StateTable t(0, 3);
  Model model;
  std::mt19937_64 rng(5);
  const Stored first = random_run(rng, model, 0, 3, 2000, 1, 0, 50);
  CHECK_EQ(first.load(t, spec_of(1, false, true)).failed_block, int64_t{-1});
  // The same keys again with other values (and new ones), claimed to be the oldest run.
  const Stored again = random_run(rng, model, 0, 3, 2000, 1, 0, 50);
  CHECK_EQ(again.load(t, spec_of(1, false, true)).failed_block, int64_t{-1});
  check_table(t, model, 1);
}

TEST(into_empty_loads_every_key_and_value_width) {
  // The oldest run straight into laid-out maps takes keys below 9 bytes (one-word suffixes),
  // values other than 8 bytes, tombstones (skipped), and key groups large enough to span many
  // pages; with no widths given it goes the general way; without a validity bitmap, block by
  // block (checked in one pass where the key after its prefix is 4 to 16 bytes, entry by entry
  // for the 2- and 21-byte ones). The table must match the model.
  for (const bool validity : {true, false}) {
    for (const size_t kw : {size_t{3}, size_t{6}, size_t{10}, size_t{14}, size_t{22}}) {
      for (const size_t vw : {size_t{3}, size_t{8}, size_t{16}}) {
        for (const bool widths : {true, false}) {
          if (!validity && !widths) continue;  // the general way, as with validity
          std::mt19937_64 rng(kw * 131 + vw * 7 + (widths ? 1 : 0) + (validity ? 0 : 5));
          Model model;
          Stored s;
          for (int32_t kg = 0; kg < 4; ++kg) {
            std::map<std::string, Row> rows;
            const size_t keys = kg == 2 ? 20000 / kRowScale : 300;
            while (rows.size() < keys) {
              std::string key(1, static_cast<char>(kg));
              for (size_t i = 1; i < kw; ++i) key.push_back(static_cast<char>(rng()));
              Row r{key, std::string(vw, '\0'), !validity || rng() % 10 != 0};
              for (char& c : r.value) c = static_cast<char>(rng());
              rows[key] = r;
            }
            std::vector<Row> block;
            for (const auto& [k, r] : rows) {
              block.push_back(r);
              if (r.live) model[k] = r.value;
              if (block.size() == 997) {
                s.add(block, kg, validity);
                block.clear();
              }
            }
            if (!block.empty()) s.add(block, kg, validity);
          }
          BlockLoadSpec spec;
          spec.key_width = widths ? static_cast<int64_t>(kw) : -1;
          spec.value_width = widths ? static_cast<int64_t>(vw) : -1;
          spec.has_validity = validity;
          spec.into_empty = true;
          StateTable t(0, 3);
          const BlockLoadResult r = s.load(t, spec);
          CHECK_EQ(r.failed_block, int64_t{-1});
          std::map<int32_t, size_t> per_kg;
          for (const auto& [k, v] : model) {
            ++per_kg[kg_of(k, 1)];
            statecore::ByteView got;
            const bool found =
                t.map(kg_of(k, 1)).get(reinterpret_cast<const uint8_t*>(k.data()), k.size(), &got);
            CHECK(found);
            if (found) CHECK_EQ(std::string(reinterpret_cast<const char*>(got.data), got.size), v);
          }
          for (int32_t kg = 0; kg < 4; ++kg) CHECK_EQ(t.map(kg).size(), per_kg[kg]);
          // A newer run upserts over what the direct load stored.
          const std::string key = model.begin()->first;
          Stored newer;
          newer.add({Row{key, std::string(vw, 'n'), true}}, kg_of(key, 1), validity);
          spec.into_empty = false;
          CHECK_EQ(newer.load(t, spec).failed_block, int64_t{-1});
          statecore::ByteView got;
          CHECK(t.map(kg_of(key, 1))
                    .get(reinterpret_cast<const uint8_t*>(key.data()), key.size(), &got));
          CHECK_EQ(std::string(reinterpret_cast<const char*>(got.data), got.size),
                   std::string(vw, 'n'));
        }
      }
    }
  }
}

TEST(into_empty_lays_a_map_out_after_an_empty_block) {
  // The key group's first block holds no entries: its layout comes from the next block's keys.
  Stored s;
  s.add({}, 1, false);
  s.add(rows_of(1, {4, 9}), 1, false);
  StateTable t(0, 3);
  const BlockLoadResult r = s.load(t, spec_of(1, false, true));
  CHECK_EQ(r.failed_block, int64_t{-1});
  CHECK_EQ(r.entries, uint64_t{2});
  Model model;
  for (const Row& row : rows_of(1, {4, 9})) model[row.key] = row.value;
  check_table(t, model, 1);
}

static void damaged_bytes_are_corrupt_and_name_their_block_once();
TEST(damaged_bytes_are_corrupt_and_name_their_block) {
  both_ways(damaged_bytes_are_corrupt_and_name_their_block_once);
}
static void damaged_bytes_are_corrupt_and_name_their_block_once() {
  Stored s;
  s.add(rows_of(1, {1, 2, 3}), 1, false);
  s.add(rows_of(2, {1, 2}), 2, false);
  s.add(rows_of(2, {5, 6}), 2, false);
  {
    Stored bad = s;
    bad.bytes[bad.refs[2].offset + 1] ^= 0x10;
    StateTable t(0, 3);
    const BlockLoadResult r = bad.load(t, spec_of(1, false, true));
    CHECK_EQ(r.failed_block, int64_t{2});
    CHECK(r.corrupt);
    CHECK_EQ(r.error, std::string("block checksum mismatch"));
    CHECK_EQ(t.map(1).size(), size_t{3});  // the key groups before it are loaded
    CHECK_EQ(t.map(2).size(), size_t{0});  // nothing of its own key group
  }
  {
    StateTable t(0, 3);
    const BlockLoadResult r =
        statecore::load_blocks(t, s.bytes.data(), s.bytes.size() - 1, s.refs.data(), s.kgs.data(),
                               3, spec_of(1, false, true));
    CHECK_EQ(r.failed_block, int64_t{2});
    CHECK(r.corrupt);
  }
  {
    Stored bad = s;
    bad.refs[0].entries = 4;  // the payload says 3
    StateTable t(0, 3);
    const BlockLoadResult r = bad.load(t, spec_of(1, false, true));
    CHECK_EQ(r.failed_block, int64_t{0});
    CHECK(r.corrupt);
    CHECK_EQ(r.error, std::string("block holds 3 entries, block table says 4"));
  }
}

static void keys_out_of_order_are_corrupt_once();
TEST(keys_out_of_order_are_corrupt) { both_ways(keys_out_of_order_are_corrupt_once); }
static void keys_out_of_order_are_corrupt_once() {
  for (const auto& blocks : std::vector<std::vector<std::vector<Row>>>{
           {rows_of(1, {1, 3, 2})},                   // within a block
           {rows_of(1, {1, 2}), rows_of(1, {2, 3})},  // a key repeated across blocks
           {rows_of(1, {5, 6}), rows_of(1, {1})}}) {  // descending across blocks
    Stored s;
    for (const auto& b : blocks) s.add(b, 1, false);
    StateTable t(0, 3);
    const BlockLoadResult r = s.load(t, spec_of(1, false, true));
    CHECK_EQ(r.failed_block, static_cast<int64_t>(blocks.size() - 1));
    CHECK(r.corrupt);
    CHECK(r.error.find("not strictly ascending within key group 1") != std::string::npos);
    CHECK_EQ(t.map(1).size(), size_t{0});
  }
}

static void entries_breaking_the_rules_are_not_corrupt_once();
TEST(entries_breaking_the_rules_are_not_corrupt) {
  both_ways(entries_breaking_the_rules_are_not_corrupt_once);
}
static void entries_breaking_the_rules_are_not_corrupt_once() {
  auto fails = [](std::vector<Row> rows, int32_t block_kg, const std::string& want,
                  bool has_validity = false) {
    Stored s;
    s.add(rows_of(0, {1}), 0, has_validity);
    s.add(rows, block_kg, has_validity);
    StateTable t(0, 3);
    const BlockLoadResult r = s.load(t, spec_of(1, has_validity, true));
    CHECK_EQ(r.failed_block, int64_t{1});
    CHECK(!r.corrupt);
    CHECK_EQ(r.error, want);
  };
  fails(rows_of(2, {1}), 1, "entry 0: key-group prefix 2 in a block of key group 1");
  fails(rows_of(9, {1}), 9,
        "the block's key group 9 is outside [0, 3] or below the block before it (blocks must "
        "be sorted by key group)");
  std::vector<Row> short_key = rows_of(1, {1, 2});
  short_key[1].key.pop_back();
  fails(short_key, 1, "entry 1: encoded key is 9 bytes, not 10");
  std::vector<Row> prefix_only = rows_of(1, {1});
  prefix_only[0].key.resize(1);
  fails(prefix_only, 1, "entry 0: its encoded key is not longer than the 1-byte key-group prefix");
  std::vector<Row> wide = rows_of(1, {1});
  wide[0].value += "x";
  fails(wide, 1, "entry 0: value is 9 bytes, the state's values are 8");
  // A tombstone carries no value: its width is not checked.
  std::vector<Row> dead = rows_of(1, {1, 2});
  dead[0].live = false;
  Stored s;
  s.add(dead, 1, true);
  StateTable t(0, 3);
  CHECK_EQ(s.load(t, spec_of(1, true, false)).failed_block, int64_t{-1});
  CHECK_EQ(t.map(1).size(), size_t{1});
  // Below the block before it.
  Stored back;
  back.add(rows_of(2, {1}), 2, false);
  back.add(rows_of(1, {1}), 1, false);
  StateTable t2(0, 3);
  const BlockLoadResult r = back.load(t2, spec_of(1, false, true));
  CHECK_EQ(r.failed_block, int64_t{1});
  CHECK(!r.corrupt);
  CHECK_THROWS(back.load(t2, spec_of(3, false, true)), std::invalid_argument);
}

TEST(parallel_loads_match_a_model) {
  // The same chains loaded on 1 to 4 threads (slices of disjoint key groups), and with a slice
  // minimum that leaves one slice: every table matches the model.
  for (int pw : {1, 2}) {
    for (int threads : {2, 3, 4}) {
      for (uint64_t min_slice : {uint64_t{0}, uint64_t{1} << 40}) {
        std::mt19937_64 rng(pw * 7 + threads);
        const int32_t lo = pw == 1 ? 0 : 250, hi = pw == 1 ? 20 : 290;
        StateTable t(lo, hi);
        Model model;
        for (int round = 0; round < 3; ++round) {
          const Stored s =
              random_run(rng, model, lo, hi, 20000 / kRowScale, pw, round == 0 ? 0 : 10, 61);
          const BlockLoadResult r =
              s.load_parallel(t, spec_of(pw, round > 0, round == 0), threads, min_slice);
          CHECK_EQ(r.failed_block, int64_t{-1});
          CHECK(r.error.empty());
          uint64_t entries = 0;
          for (const StoredBlockRef& b : s.refs) entries += b.entries;
          CHECK_EQ(r.entries, entries);
          check_table(t, model, pw);
        }
      }
    }
  }
}

TEST(parallel_load_never_splits_a_key_group) {
  // One key group of many blocks with a key repeated across two of them in the middle: split
  // between threads, each half alone would look sound.
  Stored s;
  for (uint64_t b = 0; b < 40; ++b) s.add(rows_of(1, {3 * b, 3 * b + 1, 3 * b + 2}), 1, false);
  s.add(rows_of(2, {1}), 2, false);
  Stored bad = s;
  bad.refs.clear();
  bad.kgs.clear();
  bad.bytes.clear();
  for (uint64_t b = 0; b < 40; ++b) {
    const uint64_t first = b == 20 ? 3 * b - 1 : 3 * b;  // repeats the key before it
    bad.add(rows_of(1, {first, 3 * b + 1, 3 * b + 2}), 1, false);
  }
  bad.add(rows_of(2, {1}), 2, false);
  StateTable t(0, 3);
  const BlockLoadResult r = bad.load_parallel(t, spec_of(1, false, true), 4);
  CHECK_EQ(r.failed_block, int64_t{20});
  CHECK(r.corrupt);
  CHECK_EQ(t.map(1).size(), size_t{0});
  StateTable good(0, 3);
  CHECK_EQ(s.load_parallel(good, spec_of(1, false, true), 4).failed_block, int64_t{-1});
  CHECK_EQ(good.map(1).size(), size_t{120});
  CHECK_EQ(good.map(2).size(), size_t{1});
}

TEST(parallel_load_reports_the_first_bad_block) {
  // Key groups 0..7, two blocks each; damage in the last key groups' slice, then in the first
  // one's too: the first in block order is reported, with its index among all blocks.
  Stored s;
  for (int32_t kg = 0; kg < 8; ++kg) {
    s.add(rows_of(kg, {1, 2}), kg, false);
    s.add(rows_of(kg, {3, 4}), kg, false);
  }
  Stored late = s;
  late.bytes[late.refs[13].offset + 1] ^= 0x10;
  StateTable t(0, 7);
  BlockLoadResult r = late.load_parallel(t, spec_of(1, false, true), 2);
  CHECK_EQ(r.failed_block, int64_t{13});
  CHECK(r.corrupt);
  CHECK_EQ(r.error, std::string("block checksum mismatch"));
  CHECK_EQ(t.map(6).size(), size_t{0});
  CHECK_EQ(t.map(0).size(), size_t{4});  // the other slice loaded
  Stored both = late;
  both.bytes[both.refs[2].offset + 1] ^= 0x10;
  StateTable t2(0, 7);
  r = both.load_parallel(t2, spec_of(1, false, true), 2);
  CHECK_EQ(r.failed_block, int64_t{2});
  CHECK(r.corrupt);
  // Key groups out of order or outside the table: one slice, which names the block.
  // Cut between them, each slice alone would look sound.
  Stored back;
  back.add(rows_of(5, {1}), 5, false);
  back.add(rows_of(5, {2}), 5, false);
  back.add(rows_of(2, {1}), 2, false);
  back.add(rows_of(2, {2}), 2, false);
  StateTable t3(0, 7);
  r = back.load_parallel(t3, spec_of(1, false, true), 2);
  CHECK_EQ(r.failed_block, int64_t{2});
  CHECK(!r.corrupt);
  CHECK(r.error.find("below the block before it") != std::string::npos);
  CHECK_EQ(t3.map(2).size(), size_t{0});
  StateTable t4(0, 3);
  r = s.load_parallel(t4, spec_of(1, false, true), 2);
  CHECK_EQ(r.failed_block, int64_t{8});
  CHECK(!r.corrupt);
  CHECK_THROWS(s.load_parallel(t4, spec_of(3, false, true), 2), std::invalid_argument);
}

static void fresh_loads_check_each_entry_of_a_block_once();
TEST(fresh_loads_check_each_entry_of_a_block) {
  both_ways(fresh_loads_check_each_entry_of_a_block_once);
}
static void fresh_loads_check_each_entry_of_a_block_once() {
  // The oldest run without tombstones goes in block by block, each checked in one pass: every
  // rule still holds for an entry in the middle of a block, for keys that differ only in their
  // last byte (the second of the two words the pass orders keys by), and for a key group
  // whose earlier blocks went in before its bad one (it is emptied again).
  for (const int pw : {1, 2}) {
    const int32_t kg = pw == 1 ? 1 : 300;
    auto key_of = [&](int32_t g, uint8_t last) {
      std::string k = encoded_key(g, 7, pw);
      k.back() = static_cast<char>(last);
      return k;
    };
    auto rows = [&](std::initializer_list<int> lasts) {
      std::vector<Row> out;
      for (int b : lasts) out.push_back({key_of(kg, static_cast<uint8_t>(b)), "12345678", true});
      return out;
    };
    auto load = [&](const std::vector<std::vector<Row>>& blocks, BlockLoadResult* r) {
      Stored st;
      st.add({Row{key_of(kg - 1, 1), "12345678", true}}, kg - 1, false);
      for (const auto& b : blocks) st.add(b, kg, false);
      StateTable t(kg - 1, kg + 1);
      *r = st.load(t, spec_of(pw, false, true));
      return std::make_pair(t.map(kg - 1).size(), t.map(kg).size());
    };
    BlockLoadResult r;
    CHECK(load({rows({1, 2, 3, 200}), rows({201, 255})}, &r) ==
          std::make_pair(size_t{1}, size_t{6}));
    CHECK_EQ(r.failed_block, int64_t{-1});
    CHECK_EQ(r.entries, uint64_t{7});
    const std::string order =
        "keys are not strictly ascending within key group " + std::to_string(kg);
    CHECK(load({rows({1, 2, 3}), rows({4, 6, 5, 7})}, &r) == std::make_pair(size_t{1}, size_t{0}));
    CHECK_EQ(r.failed_block, int64_t{2});
    CHECK(r.corrupt);
    CHECK_EQ(r.error, "entry 2: " + order);
    CHECK(load({rows({1, 2, 3}), rows({3, 4})}, &r) == std::make_pair(size_t{1}, size_t{0}));
    CHECK_EQ(r.error, "entry 0: " + order);
    CHECK(load({rows({1, 2, 2, 3})}, &r) == std::make_pair(size_t{1}, size_t{0}));
    CHECK_EQ(r.error, "entry 2: " + order);
    std::vector<Row> foreign = rows({1, 2, 3});
    foreign[1].key = key_of(kg + 1, 2);
    CHECK(load({rows({0}), foreign}, &r) == std::make_pair(size_t{1}, size_t{0}));
    CHECK_EQ(r.failed_block, int64_t{2});
    CHECK(!r.corrupt);
    CHECK_EQ(r.error, "entry 1: key-group prefix " + std::to_string(kg + 1) +
                          " in a block of key group " + std::to_string(kg));
    std::vector<Row> wide = rows({1, 2, 3});
    wide[2].value += "x";
    CHECK(load({wide}, &r) == std::make_pair(size_t{1}, size_t{0}));
    CHECK(!r.corrupt);
    CHECK_EQ(r.error, "entry 2: value is 9 bytes, the state's values are 8");
    std::vector<Row> longer = rows({1, 2, 3});
    longer[1].key += "z";
    CHECK(load({longer}, &r) == std::make_pair(size_t{1}, size_t{0}));
    CHECK_EQ(r.error, "entry 1: encoded key is " + std::to_string(pw + 10) + " bytes, not " +
                          std::to_string(pw + 9));
  }
}

TEST_MAIN()
