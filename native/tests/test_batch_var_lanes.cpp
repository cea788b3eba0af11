// The batch kernels over string keys, whose flat maps take the var layout (detail/flat_table.h)
// and whose rows go through var lanes (detail/flat_lane.h): add_batch, put_batch and
// get_batch_fixed against a model while maps grow, move up var classes (relayouts), keep
// snapshots alive during a batch, and -- with keys too long for any var class -- convert to
// the chained engine part way through a batch. A colliding hash makes probes cross pages.
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "batch_test_arrays.h"
#include "check.h"
#include "statecore/batch.h"
#include "statecore/key_groups.h"
#include "statecore/state_table.h"

using namespace statecore;
using namespace statecore_test;

namespace {

BatchKeySpec string_spec(int32_t maxp) { return full_range_spec(KeyType::String, maxp); }

uint32_t colliding_hash(const uint8_t* data, size_t size) {
  return size > 1 ? data[size - 2] & 1 : 0;
}

// Key number k: 0-40 bytes (a multiplicative hash of k picks the size), or 70 bytes for one
// number in 97 when `too_long` (no var class holds it: the map converts), then "#" and k in
// decimal, so that distinct numbers give distinct keys.
std::string key_of(uint64_t k, bool too_long) {
  size_t n = static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 58) % 41;
  if (too_long && k % 97 == 5) n = 70;
  std::string s(n, 'a');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (k >> (3 * (i % 7))) % 26);
  if (n) s[n - 1] = static_cast<char>('0' + k % 10);
  return s + "#" + std::to_string(k);  // distinct for distinct k
}

// Random batches against a model; returns how many maps ended flat.
size_t run_model(int32_t maxp, KeyHashFunction hash, uint64_t domain, int batches, int rows,
                 uint32_t seed, bool too_long) {
  const BatchKeySpec sp = string_spec(maxp);
  StateTable t(0, maxp - 1, hash);
  std::map<std::string, int64_t> model;
  std::mt19937_64 rng(seed);
  for (int b = 0; b < batches; ++b) {
    std::optional<TableSnapshot> snap;
    std::map<std::string, std::string> before;
    if (b % 3 == 1) {
      snap.emplace(t.snapshot());
      before = dump(t);
    }
    Str keys;
    I64 vals;
    for (int r = 0; r < rows; ++r) {
      keys.push_back(key_of(rng() % domain, too_long));
      if (rng() % 16 == 0) vals.push_back(std::nullopt);
      else vals.push_back(static_cast<int64_t>(rng() % 1000) - 500);
    }
    TestArray k = varwidth<int32_t>("u", keys, 1), v = fixed<int64_t>("l", vals, 2);
    const int op = b % 4;
    if (op == 0 || op == 3) {
      std::vector<int64_t> out(rows);
      std::vector<uint8_t> valid(rows);
      add_batch(t, sp, k.in(), ValueType::Int64, Reducer::Sum, v.in(), out.data(), valid.data());
      check_running_sums(model, keys, vals, out.data(), valid.data());
    } else if (op == 1) {
      put_batch(t, sp, k.in(), ValueType::Int64, v.in());
      for (int r = 0; r < rows; ++r) {
        if (vals[r]) model[*keys[r]] = *vals[r];
        else model.erase(*keys[r]);
      }
    }
    // Every model key reads back its value, and nothing else is stored.
    Str all;
    for (const auto& kv : model) all.push_back(kv.first);
    TestArray ak = varwidth<int32_t>("u", all);
    check_reads_back(t, sp, ak, model);
    CHECK_EQ(t.size(), model.size());
    if (snap) {
      std::map<std::string, std::string> seen;
      for (int32_t kg = 0; kg < maxp; ++kg) {
        const SortedRun run = snap->map(kg)->sorted_entries();
        for (size_t i = 0; i < run.size(); ++i)
          seen[std::string(reinterpret_cast<const char*>(run.key(i).data), run.key(i).size)] =
              std::string(reinterpret_cast<const char*>(run.value(i).data), run.value(i).size);
      }
      CHECK(seen == before);  // the batch wrote copies of shared pages, not the snapshot's
    }
    if (snap && (op == 0 || op == 3)) {
      // Change tracking: every key the batch wrote, once.
      std::set<std::string> written;
      for (int r = 0; r < rows; ++r)
        if (vals[r]) written.insert(*keys[r]);
      const TableSnapshot after = t.snapshot();
      size_t changed = 0;
      for (int32_t kg = 0; kg < maxp; ++kg) {
        const SortedRun run = after.map(kg)->sorted_changes(snap->version());
        for (size_t i = 0; i < run.size(); ++i) changed += run.removed(i) ? 0 : 1;
      }
      CHECK_EQ(changed, written.size());
    }
  }
  size_t flat = 0;
  for (int32_t kg = 0; kg < maxp; ++kg) flat += t.map(kg).is_flat() ? 1 : 0;
  return flat;
}

// Maps start flat unless the suite runs over the chained engine (the *_chained ctest).
size_t flat_maps(int32_t maxp) {
  return statecore::default_map_engine() == MapEngine::Chained ? 0 : static_cast<size_t>(maxp);
}

}  // namespace

TEST(string_keys_stay_flat_and_match_the_model) {
  // 40k keys: past 16k entries RowKeys hashes rows ahead, below it encodes row by row.
  CHECK_EQ(run_model(128, nullptr, 40000, 12, 9000, 1, false), flat_maps(128));
  CHECK_EQ(run_model(4, nullptr, 3000, 8, 4000, 2, false), flat_maps(4));
}

TEST(string_keys_with_a_two_byte_key_group_prefix) {
  CHECK_EQ(run_model(1024, nullptr, 20000, 8, 6000, 3, false), flat_maps(1024));
}

TEST(string_keys_with_a_colliding_hash_cross_pages) {
  CHECK_EQ(run_model(4, &colliding_hash, 3000, 8, 3000, 4, false), flat_maps(4));
}

TEST(string_keys_too_long_for_a_var_class_convert_mid_batch) {
  const size_t flat = run_model(8, nullptr, 20000, 8, 6000, 5, true);
  CHECK(flat < 8);
}

TEST_MAIN()
