// Unit tests of SortedRunBuilder (sorted_run.h) against a std::map model: its two forms -- whole
// Small records while every key has <= 16 bytes and every value <= 8, the staged slots after the
// first larger entry -- radix and comparison sorts, keys that differ only by trailing zero bytes
// (equal zero-padded words), tombstones, `unique`, and one builder reused across runs of either
// form. Fixed seeds.
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "statecore/sorted_run.h"

using statecore::ByteView;
using statecore::SortedRun;
using statecore::SortedRunBuilder;

namespace {

struct Want {
  std::string value;
  bool removed;
};

ByteView view(const std::string& s) {
  return ByteView{reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// The run equals the model in key order (std::map orders std::string as key_less does: bytes,
// then the shorter first).
bool same(const SortedRun& run, const std::map<std::string, Want>& want) {
  if (run.size() != want.size()) return false;
  size_t i = 0;
  for (const auto& kv : want) {
    const ByteView k = run.key(i), v = run.value(i);
    if (std::string(reinterpret_cast<const char*>(k.data), k.size) != kv.first) return false;
    if (std::string(reinterpret_cast<const char*>(v.data), v.size) != kv.second.value) return false;
    if (run.removed(i) != kv.second.removed) return false;
    ++i;
  }
  return true;
}

// One random run into `b`: `n` entries over keys of 0..max_key bytes from a small alphabet with
// zero bytes (so "a" and "a\0" both occur), values of 0..max_value bytes, some tombstones, some
// keys added twice with the same contents (dropped by `unique`).
std::map<std::string, Want> fill(SortedRunBuilder& b, std::mt19937& rng, int n, size_t max_key,
                                 size_t max_value) {
  std::map<std::string, Want> want;
  std::vector<std::pair<std::string, Want>> added;
  for (int i = 0; i < n; ++i) {
    if (!added.empty() && rng() % 8 == 0) {
      const auto& again = added[rng() % added.size()];
      b.add(view(again.first), view(again.second.value), again.second.removed);
      continue;
    }
    std::string k(rng() % (max_key + 1), '\0');
    for (char& c : k) c = static_cast<char>(rng() % 3 == 0 ? 0 : 'a' + rng() % 3);
    if (want.count(k)) continue;
    const bool removed = rng() % 6 == 0;
    std::string v(removed ? 0 : rng() % (max_value + 1), '\0');
    for (char& c : v) c = static_cast<char>(rng());
    want[k] = Want{v, removed};
    added.push_back({k, want[k]});
    b.add(view(k), view(v), removed);
  }
  return want;
}

}  // namespace

TEST(small_records_sort_like_the_model) {
  std::mt19937 rng(7);
  SortedRunBuilder b;
  bool ok = true;
  for (int trial = 0; trial < 300; ++trial) {
    // Up to 16-byte keys and 8-byte values: the whole run stays in Small records. Below and
    // above the radix sort's minimum size.
    const auto want = fill(b, rng, trial % 2 ? 40 : 2000, 16, 8);
    ok = ok && same(b.finish(/*unique=*/true), want);
  }
  CHECK(ok);
}

TEST(a_larger_entry_stages_the_records_taken_so_far) {
  std::mt19937 rng(8);
  SortedRunBuilder b;
  bool ok = true;
  for (int trial = 0; trial < 300; ++trial) {
    // Keys up to 20 bytes or values up to 12: the first one past 16 / 8 moves the Small records
    // to the staging buffers, at a random point of the run.
    const bool long_keys = trial % 2 == 0;
    const auto want = fill(b, rng, trial % 3 ? 600 : 50, long_keys ? 20 : 16, long_keys ? 8 : 12);
    ok = ok && same(b.finish(/*unique=*/true), want);
  }
  CHECK(ok);
}

TEST(one_builder_alternates_between_its_forms) {
  std::mt19937 rng(9);
  SortedRunBuilder b;
  SortedRun out;
  bool ok = true;
  for (int trial = 0; trial < 60; ++trial) {
    const bool small = trial % 3 != 1;
    const auto want = fill(b, rng, 500, small ? 16 : 24, small ? 8 : 16);
    b.finish(/*unique=*/true, out);  // `out` reused too
    ok = ok && same(out, want);
  }
  CHECK(ok);
}

TEST(int64_keys_with_a_prefix_and_fixed_values) {
  // The checkpoint writer's common case: 9-byte keys (key-group byte + big-endian int64), 8-byte
  // values, listed in hash order; sorted by radix over the differing bytes only.
  std::mt19937_64 rng(10);
  SortedRunBuilder b;
  std::map<std::string, Want> want;
  for (int i = 0; i < 5000; ++i) {
    const uint64_t x = rng() % 1000000;
    std::string k(9, '\0');
    k[0] = 17;
    for (int j = 0; j < 8; ++j) k[1 + j] = static_cast<char>(x >> (56 - 8 * j));
    std::string v(8, '\0');
    for (char& c : v) c = static_cast<char>(rng());
    if (want.count(k)) continue;
    want[k] = Want{v, false};
    b.add(view(k), view(v), false);
  }
  CHECK(same(b.finish(/*unique=*/false), want));
}

TEST(keys_that_differ_only_by_trailing_zeros_sort_shorter_first) {
  // Few differing bytes and enough entries for the radix sort, whose words cannot tell "x" from
  // "x\0": the key size is its least significant word.
  std::mt19937 rng(11);
  SortedRunBuilder b;
  std::map<std::string, Want> want;
  for (int i = 0; i < 1000; ++i) {
    std::string k = std::string(1, 'p') + static_cast<char>('w' + rng() % 4);
    k.append(rng() % 8, '\0');
    want[k] = Want{"v", false};
    b.add(view(k), view("v"), false);
  }
  CHECK(same(b.finish(/*unique=*/true), want));
}

TEST(without_unique_equal_keys_stay) {
  SortedRunBuilder b;
  for (int r = 0; r < 3; ++r) b.add(view("k"), view("v"), false);
  b.add(view("j"), view(""), true);
  const SortedRun run = b.finish(/*unique=*/false);
  CHECK_EQ(run.size(), 4u);
  CHECK(run.removed(0));
  CHECK(!run.removed(3));
  const SortedRun one = [&] {
    for (int r = 0; r < 3; ++r) b.add(view("k"), view("v"), false);
    return b.finish(/*unique=*/true);
  }();
  CHECK_EQ(one.size(), 1u);
}

TEST(first_bad_offset_finds_the_first_decrease_in_any_block) {
  // Against the plain scan, with decreases on and around the 1,024-offset blocks' edges.
  auto plain = [](const std::vector<int32_t>& o, size_t n, size_t data) -> int64_t {
    if (n == 0) return -1;
    if (o[0] < 0) return 0;
    for (size_t i = 0; i < n; ++i)
      if (o[i + 1] < o[i]) return static_cast<int64_t>(i + 1);
    return static_cast<size_t>(o[n]) > data ? static_cast<int64_t>(n) : -1;
  };
  std::mt19937_64 rng(5);
  for (size_t n : {size_t{0}, size_t{1}, size_t{1023}, size_t{1024}, size_t{1025}, size_t{5000}}) {
    std::vector<int32_t> o(n + 1);
    for (size_t i = 1; i <= n; ++i) o[i] = o[i - 1] + static_cast<int32_t>(rng() % 3);
    const size_t data = static_cast<size_t>(o[n]);
    CHECK_EQ(statecore::first_bad_offset(o.data(), n, data), int64_t{-1});
    if (n) CHECK_EQ(statecore::first_bad_offset(o.data(), n, data - 1), plain(o, n, data - 1));
    for (size_t at : {size_t{1}, size_t{1023}, size_t{1024}, size_t{1025}, size_t{2048}, n,
                      static_cast<size_t>(rng() % (n + 1))}) {
      if (at == 0 || at > n) continue;
      std::vector<int32_t> bad = o;
      for (size_t i = at; i <= n; ++i) bad[i] -= 5 + bad[at - 1] - o[at - 1];  // o[at] < o[at - 1]
      if (at + 700 <= n) bad[at + 700] = -100;  // a second decrease after it
      CHECK_EQ(statecore::first_bad_offset(bad.data(), n, data), plain(bad, n, data));
      CHECK_EQ(statecore::first_bad_offset(bad.data(), n, data), static_cast<int64_t>(at));
    }
  }
  std::vector<int32_t> negative{-1, 0, 4};
  CHECK_EQ(statecore::first_bad_offset(negative.data(), 2, 4), int64_t{0});
}

TEST_MAIN()
