// route_to_blocks (run_route.h) against a model over the same run: random keys of a few key
// groups, some in the run (their filter passes them and their block is the first whose last
// key is >= theirs), some absent (filter negatives, or past the last block key), key groups
// the run lacks or that lie outside its groups.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/block_codec.h"
#include "statecore/hash.h"
#include "statecore/run_route.h"

using namespace statecore;

namespace {

// Keys as an Arrow binary array, with their key groups and XXH64s.
struct Batch {
  std::vector<int32_t> offsets{0};
  std::vector<uint8_t> data;
  std::vector<int64_t> key_groups;
  std::vector<uint64_t> hashes;
  void add(const std::string& k, int64_t kg) {
    data.insert(data.end(), k.begin(), k.end());
    offsets.push_back(static_cast<int32_t>(data.size()));
    key_groups.push_back(kg);
    hashes.push_back(xxh64(k.data(), k.size(), 0));
  }
  RouteKeys view() const {
    return RouteKeys{offsets.data(), data.data(), key_groups.data(), hashes.data()};
  }
};

std::string random_key(std::mt19937_64& rng) {
  std::string k(1 + rng() % 5, '\0');
  for (char& c : k) c = static_cast<char>(rng() % 4);
  return k;
}

}  // namespace

TEST(routes_keys_as_the_model_does) {
  std::mt19937_64 rng(7);
  const int64_t kg_base = 10;
  const size_t n_groups = 6;  // key group 12 absent from the run
  std::vector<std::vector<std::string>> stored(n_groups);
  std::vector<std::vector<uint8_t>> filters(n_groups);
  std::vector<RouteGroup> groups(n_groups);
  std::vector<int64_t> block_key_offsets{0};
  std::vector<uint8_t> block_key_data;
  std::vector<std::vector<std::string>> last_keys(n_groups);
  int64_t block = 0;
  for (size_t g = 0; g < n_groups; ++g) {
    if (g == 2) continue;
    for (int i = 0; i < 80; ++i) stored[g].push_back(random_key(rng));
    std::sort(stored[g].begin(), stored[g].end());
    stored[g].erase(std::unique(stored[g].begin(), stored[g].end()), stored[g].end());
    std::vector<int32_t> off{0};
    std::string all;
    for (const auto& k : stored[g]) {
      all += k;
      off.push_back(static_cast<int32_t>(all.size()));
    }
    bloom_filter_build(off.data(), reinterpret_cast<const uint8_t*>(all.data()), stored[g].size(),
                       10, &filters[g]);
    // Blocks of 7 entries; the last block key is the group's last key.
    groups[g].first_block = block;
    groups[g].block_count = 0;
    for (size_t e = 6; e < stored[g].size() + 6; e += 7) {
      const std::string& last = stored[g][std::min(e, stored[g].size() - 1)];
      last_keys[g].push_back(last);
      block_key_data.insert(block_key_data.end(), last.begin(), last.end());
      block_key_offsets.push_back(static_cast<int64_t>(block_key_data.size()));
      ++groups[g].block_count;
      ++block;
    }
    // Group 4 has no filter: every key passes to the block search.
    if (g != 4) {
      groups[g].filter = filters[g].data();
      groups[g].filter_bytes = filters[g].size();
      groups[g].hashes = bloom_hashes(10);
    }
  }
  Batch batch;
  for (int i = 0; i < 3000; ++i) {
    const int64_t kg = kg_base - 1 + static_cast<int64_t>(rng() % (n_groups + 2));
    const size_t g = static_cast<size_t>(kg - kg_base);
    const bool pick = kg >= kg_base && g < n_groups && !stored[g].empty() && rng() % 2;
    batch.add(pick ? stored[g][rng() % stored[g].size()] : random_key(rng), kg);
  }
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < 3000; r += 1 + static_cast<int64_t>(rng() % 2)) rows.push_back(r);
  std::vector<int64_t> out(rows.size(), -7);
  RouteCounts counts;
  route_to_blocks(groups.data(), groups.size(), kg_base, block_key_offsets.data(),
                  block_key_data.data(), batch.view(), rows.data(), rows.size(), out.data(),
                  &counts);
  RouteCounts want_counts;
  int64_t found = 0, passed_absent = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i];
    const std::string key(reinterpret_cast<const char*>(batch.data.data() + batch.offsets[r]),
                          static_cast<size_t>(batch.offsets[r + 1] - batch.offsets[r]));
    const int64_t kg = batch.key_groups[r];
    int64_t want = -1;
    const size_t g = static_cast<size_t>(kg - kg_base);
    if (kg >= kg_base && g < n_groups && groups[g].block_count >= 0) {
      const bool held = std::binary_search(stored[g].begin(), stored[g].end(), key);
      const bool pass = groups[g].filter == nullptr ||
                        bloom_may_contain(filters[g].data(), filters[g].size(), bloom_hashes(10),
                                          xxh64(key.data(), key.size(), 0));
      if (held) CHECK(pass);  // a filter never rules out a key it holds
      if (!pass) {
        ++want_counts.filter_negatives;
      } else {
        auto it = std::lower_bound(last_keys[g].begin(), last_keys[g].end(), key);
        if (it == last_keys[g].end()) {
          ++want_counts.range_negatives;
        } else {
          want = groups[g].first_block + (it - last_keys[g].begin());
          if (held) {
            ++found;
          } else {
            ++passed_absent;
          }
        }
      }
    }
    CHECK_EQ(out[i], want);
  }
  CHECK_EQ(counts.filter_negatives, want_counts.filter_negatives);
  CHECK_EQ(counts.range_negatives, want_counts.range_negatives);
  // The draw reaches every case.
  CHECK(found > 100);
  CHECK(passed_absent > 0);
  CHECK(want_counts.filter_negatives > 100);
  CHECK(want_counts.range_negatives > 0);
}

TEST(no_rows_writes_nothing) {
  RouteGroup g;
  RouteCounts counts;
  int64_t out = -7;
  route_to_blocks(&g, 1, 0, nullptr, nullptr, RouteKeys{}, nullptr, 0, &out, &counts);
  CHECK_EQ(out, -7);
  CHECK_EQ(counts.filter_negatives, 0);
}

TEST_MAIN()
