// Unit tests of merge_newest_wins (sorted_run.h): random chains against a std::map model
// (newest wins, tombstones delete), keys that are prefixes of others, empty and single runs,
// validity bitmaps with a bit offset, and the errors a corrupt file must raise. Fixed seeds.
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "owned_run.h"
#include "statecore/sorted_run.h"

using statecore::ArrowBinaryRun;
using statecore::merge_newest_wins;
using statecore::RunPick;

namespace {

// The merge's picks as (key, value); with keep_tombstones a kept tombstone's value reads "<del>".
std::vector<std::pair<std::string, std::string>> merged(const std::vector<OwnedRun>& runs,
                                                        bool keep_tombstones = false) {
  std::vector<ArrowBinaryRun> views;
  for (const auto& r : runs) views.push_back(r.view());
  std::vector<RunPick> picks;
  merge_newest_wins(views, &picks, keep_tombstones);
  std::vector<std::pair<std::string, std::string>> out;
  for (const RunPick& p : picks) {
    const OwnedRun& r = runs[p.run];
    const uint64_t bit = static_cast<uint64_t>(r.bit0) + p.row;
    const bool live = !r.has_tombstones || ((r.validity[bit / 8] >> (bit % 8)) & 1);
    out.emplace_back(r.key(p.row), live ? r.value(p.row) : "<del>");
  }
  return out;
}

// Keys drawn from a small alphabet, mostly short, so prefixes and shared keys are common.
std::string random_key(std::mt19937_64& rng) {
  // The empty key too (it sorts first), and keys around 16 bytes, where the merge's cached
  // 16-byte prefix words stop deciding.
  size_t len = rng() % 4 == 0 ? 14 + rng() % 6 : rng() % 4;
  std::string k;
  for (size_t i = 0; i < len; ++i) k.push_back(static_cast<char>("\x00\x01\x7f\xff"[rng() % 4]));
  return k;
}

}  // namespace

TEST(random_chains_match_a_newest_wins_model) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 300; ++round) {
    size_t nruns = 1 + rng() % 6;
    // Oldest first into the model, then reversed: the merge takes runs newest first.
    std::vector<OwnedRun> oldest_first;
    std::map<std::string, std::string> model;
    std::map<std::string, std::string> changes;  // the same with a key's newest tombstone kept
    for (size_t r = 0; r < nruns; ++r) {
      size_t m = rng() % 40;
      std::map<std::string, std::pair<bool, std::string>> entries;  // sorted, unique keys
      for (size_t i = 0; i < m; ++i) {
        bool tomb = r > 0 && rng() % 4 == 0;
        entries[random_key(rng)] = {tomb, std::to_string(rng() % 1000)};
      }
      OwnedRun run_arrow(static_cast<int64_t>(rng() % 8));
      for (const auto& [k, tv] : entries) {
        run_arrow.add(k, tv.first ? nullptr : &tv.second);
        if (tv.first) model.erase(k);
        else model[k] = tv.second;
        changes[k] = tv.first ? "<del>" : tv.second;
      }
      oldest_first.push_back(run_arrow);
    }
    std::vector<OwnedRun> newest_first(oldest_first.rbegin(), oldest_first.rend());
    std::vector<std::pair<std::string, std::string>> want(model.begin(), model.end());
    CHECK(merged(newest_first) == want);
    std::vector<std::pair<std::string, std::string>> want_changes(changes.begin(), changes.end());
    CHECK(merged(newest_first, true) == want_changes);
  }
}

TEST(single_and_empty_runs) {
  std::vector<OwnedRun> none;
  CHECK(merged(none).empty());
  OwnedRun empty;
  CHECK(merged({empty, empty}).empty());
  OwnedRun one;
  std::string a = "a", b = "b";
  one.add("k1", &a);
  one.add("k2", nullptr);
  one.add("k3", &b);
  auto got = merged({empty, one, empty});
  CHECK_EQ(got.size(), size_t{2});
  CHECK(got[0] == std::make_pair(std::string("k1"), a));
  CHECK(got[1] == std::make_pair(std::string("k3"), b));
}

TEST(newer_tombstone_deletes_and_newer_value_wins) {
  std::string old_v = "old", new_v = "new";
  OwnedRun older, newer;
  older.add("a", &old_v);
  older.add("ab", &old_v);  // "a" is a proper prefix of "ab": sorts before it
  older.add("b", &old_v);
  newer.add("a", nullptr);
  newer.add("ab", &new_v);
  newer.add("c", &new_v);
  auto got = merged({newer, older});
  std::vector<std::pair<std::string, std::string>> want = {
      {"ab", "new"}, {"b", "old"}, {"c", "new"}};
  CHECK(got == want);
}

TEST(corrupt_runs_raise) {
  std::string v = "v";
  OwnedRun unsorted;
  unsorted.add("b", &v);
  unsorted.add("a", &v);
  std::vector<RunPick> picks;
  CHECK_THROWS(merge_newest_wins({unsorted.view()}, &picks), std::invalid_argument);
  OwnedRun dup;
  dup.add("a", &v);
  dup.add("a", &v);
  OwnedRun other;
  other.add("0", &v);
  CHECK_THROWS(merge_newest_wins({other.view(), dup.view()}, &picks), std::invalid_argument);
  OwnedRun bad_offsets;
  bad_offsets.add("a", &v);
  bad_offsets.add("b", &v);
  bad_offsets.key_offsets[1] = 2;  // past key 2's end: offsets decrease
  CHECK_THROWS(merge_newest_wins({bad_offsets.view()}, &picks), std::invalid_argument);
  OwnedRun past_end;
  past_end.add("a", &v);
  ArrowBinaryRun view = past_end.view();
  view.value_data_size = 0;
  CHECK_THROWS(merge_newest_wins({view}, &picks), std::invalid_argument);
}

TEST(key_compare_orders_as_bytes_then_length) {
  // Short alphabets and shared prefixes, so the two-word fast path (equal sizes of 8-16 bytes)
  // meets equal first words, overlapping second words and keys that differ only in the last
  // byte; other sizes take the memcmp path.
  std::mt19937_64 rng(11);
  auto key = [&rng]() {
    std::string k(rng() % 21, '\0');
    for (char& c : k) c = static_cast<char>(rng() % 3 == 0 ? 0x80 + rng() % 3 : rng() % 2);
    return k;
  };
  auto view = [](const std::string& k) {
    return statecore::ByteView{reinterpret_cast<const uint8_t*>(k.data()), k.size()};
  };
  for (int i = 0; i < 200000; ++i) {
    std::string a = key(), b = key();
    if (i % 3 == 0) b = a.substr(0, a.size() / 2) + b.substr(std::min(b.size(), a.size() / 2));
    if (i % 7 == 0 && !a.empty()) {
      b = a;
      b[rng() % b.size()] ^= 1;
    }
    // std::string compares chars as unsigned through char_traits<char>::compare (memcmp).
    const int want = a.compare(b) < 0 ? -1 : (a.compare(b) > 0 ? 1 : 0);
    const int got = statecore::key_compare(view(a), view(b));
    CHECK_EQ((got > 0) - (got < 0), want);
    CHECK_EQ(statecore::key_less(view(a), view(b)), want < 0);
  }
}

TEST_MAIN()
