// The list index of list state (list_index.h): chunk sequence numbers per list in order, the
// last one, unlisted lists of chunk 0 alone, lazy removal and compaction, restores out of order,
// entry keys `prefix | seq` (docs/formats.md "List state"), prune against a table, and errors
// that change nothing.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/list_index.h"
#include "statecore/state_table.h"

using namespace statecore;

namespace {

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

std::vector<uint64_t> seqs(const ListIndex& ix, int32_t kg, const std::string& p) {
  std::vector<uint64_t> out;
  ix.for_each(kg, u8(p), p.size(), [&](uint64_t s) { out.push_back(s); });
  return out;
}

std::vector<uint64_t> chunks(const ListIndex& ix, int32_t kg, const std::string& p) {
  std::vector<uint64_t> out{99};
  ix.chunks(kg, u8(p), p.size(), out);
  return out;
}

std::string key(const std::string& prefix, uint64_t seq) {
  std::string k = prefix + std::string(8, '\0');
  store_list_seq(reinterpret_cast<uint8_t*>(&k[prefix.size()]), seq);
  return k;
}

}  // namespace

TEST(a_list_of_chunk_0_alone_is_not_listed) {
  ListIndex ix(0, 3);
  const std::string p = "\x01k1";
  uint64_t last = 7;
  CHECK(!ix.last(1, u8(p), p.size(), &last));
  CHECK_EQ(last, uint64_t{7});  // untouched
  CHECK(!ix.insert(1, u8(p), p.size(), 0));
  CHECK_EQ(ix.lists(), size_t{0});
  CHECK(chunks(ix, 1, p) == (std::vector<uint64_t>{0}));  // a reader looks chunk 0 up
  CHECK(!ix.erase(1, u8(p), p.size(), 0));
  // The second chunk lists the list, chunk 0 with it.
  CHECK(ix.insert(1, u8(p), p.size(), 1));
  CHECK(ix.last(1, u8(p), p.size(), &last));
  CHECK_EQ(last, uint64_t{1});
  CHECK(seqs(ix, 1, p) == (std::vector<uint64_t>{0, 1}));
  CHECK_EQ(ix.size(1, u8(p), p.size()), size_t{2});
  CHECK(ix.insert(1, u8(p), p.size(), 2));
  CHECK(!ix.insert(1, u8(p), p.size(), 0));  // listed already
  CHECK_EQ(ix.chunks(), size_t{3});
  // Down to chunk 0 alone: unlisted again.
  CHECK(ix.erase(1, u8(p), p.size(), 2));
  CHECK(ix.erase(1, u8(p), p.size(), 1));
  CHECK_EQ(ix.lists(), size_t{0});
  CHECK(chunks(ix, 1, p) == (std::vector<uint64_t>{0}));
}

TEST(erase_keeps_order_compacts_and_drops_an_emptied_list) {
  ListIndex ix(0, 3);
  const std::string p = "\x01k1";
  for (uint64_t s = 1; s <= 5; ++s) CHECK(ix.insert(1, u8(p), p.size(), s));
  CHECK(seqs(ix, 1, p) == (std::vector<uint64_t>{0, 1, 2, 3, 4, 5}));
  CHECK(ix.erase(1, u8(p), p.size(), 0));
  CHECK(ix.erase(1, u8(p), p.size(), 2));
  CHECK(!ix.erase(1, u8(p), p.size(), 2));
  CHECK(ix.erase(1, u8(p), p.size(), 5));  // from the end: the last slot stays live
  uint64_t last = 0;
  CHECK(ix.last(1, u8(p), p.size(), &last));
  CHECK_EQ(last, uint64_t{4});
  // Compaction (erased slots outnumbering live ones) keeps the order.
  CHECK(ix.erase(1, u8(p), p.size(), 1));
  CHECK(ix.erase(1, u8(p), p.size(), 3));
  CHECK(chunks(ix, 1, p) == (std::vector<uint64_t>{4}));  // chunk 0 is not looked up
  CHECK(ix.erase(1, u8(p), p.size(), 4));
  CHECK_EQ(ix.lists(), size_t{0});
}

TEST(insert_keeps_sequence_order_and_take_clears) {
  ListIndex ix(0, 3);
  const std::string p = "\x02k", q = "\x02q";
  CHECK(ix.insert(2, u8(p), p.size(), 5));
  CHECK(ix.insert(2, u8(p), p.size(), 9));
  CHECK(!ix.insert(2, u8(p), p.size(), 9));
  CHECK(ix.insert(2, u8(p), p.size(), 2));  // below listed ones: in order
  CHECK(seqs(ix, 2, p) == (std::vector<uint64_t>{0, 2, 5, 9}));
  CHECK(ix.erase(2, u8(p), p.size(), 5));
  CHECK(ix.insert(2, u8(p), p.size(), 5));  // an erased slot listed again
  CHECK(seqs(ix, 2, p) == (std::vector<uint64_t>{0, 2, 5, 9}));
  CHECK(ix.insert(2, u8(q), q.size(), 3));
  CHECK(ix.take(2, u8(p), p.size()) == (std::vector<uint64_t>{0, 2, 5, 9}));
  CHECK(seqs(ix, 2, p).empty());
  CHECK(ix.take(2, u8(p), p.size()) == (std::vector<uint64_t>{0}));  // unlisted: chunk 0
  CHECK_EQ(ix.chunks(), size_t{2});
  CHECK(ix.bytes() > 0);
  uint64_t last = 0;
  CHECK_THROWS(ix.last(4, u8(p), p.size(), &last), std::out_of_range);
  CHECK_THROWS(ix.insert(4, u8(p), p.size(), 1), std::out_of_range);
  CHECK_THROWS(ix.insert(2, u8(p), p.size(), UINT64_MAX), std::length_error);
  CHECK_THROWS(ListIndex(3, 2), std::invalid_argument);
}

TEST(entry_keys_are_split_before_the_sequence_number_and_checked_first) {
  ListIndex ix(0, 300);
  // Two-byte key-group prefixes (max parallelism > 128): key group 0x0102 = 258.
  const std::string p = std::string("\x01\x02", 2) + "key";
  const std::string solo = std::string("\x01\x02", 2) + "solo";
  std::string data;
  std::vector<int32_t> off{0};
  for (uint64_t s : {uint64_t{0}, uint64_t{1}, uint64_t{7}}) {
    data += key(p, s);
    off.push_back(static_cast<int32_t>(data.size()));
  }
  data += key(solo, 0);
  off.push_back(static_cast<int32_t>(data.size()));
  ix.insert_entry_keys(u8(data), off.data(), 4, 2);
  CHECK(seqs(ix, 258, p) == (std::vector<uint64_t>{0, 1, 7}));
  CHECK_EQ(ix.lists(), size_t{1});  // `solo` has chunk 0 alone
  ix.erase_entry_keys(u8(data), off.data(), 1, 2);
  CHECK(seqs(ix, 258, p) == (std::vector<uint64_t>{1, 7}));
  ix.erase_entry_keys(std::vector<std::string>{key(p, 7), "x"}, 2);  // "x": no chunk key
  CHECK(seqs(ix, 258, p) == (std::vector<uint64_t>{1}));
  // A key too short for a sequence number: nothing changes.
  const std::string bad = data.substr(0, 12) + "\x01\x02" + "abc";
  std::vector<int32_t> boff{0, 12, static_cast<int32_t>(bad.size())};
  CHECK_THROWS(ix.insert_entry_keys(u8(bad), boff.data(), 2, 2), std::invalid_argument);
  CHECK(seqs(ix, 258, p) == (std::vector<uint64_t>{1}));
  CHECK_THROWS(ix.insert_entry_keys(u8(data), off.data(), 1, 3), std::invalid_argument);
}

TEST(prune_unlists_chunks_without_entries) {
  StateTable t(0, 3);
  ListIndex ix(0, 3);
  const std::string p = "\x03k";
  for (uint64_t s = 1; s <= 3; ++s) ix.insert(3, u8(p), p.size(), s);
  for (uint64_t s : {uint64_t{0}, uint64_t{2}}) {
    const std::string k = key(p, s);
    t.map(3).put(u8(k), k.size(), 1)[0] = 'v';
  }
  CHECK_EQ(ix.prune(t), size_t{2});
  CHECK(seqs(ix, 3, p) == (std::vector<uint64_t>{0, 2}));
  StateTable empty(0, 3);
  CHECK_EQ(ix.prune(empty), size_t{2});
  CHECK_EQ(ix.lists(), size_t{0});
}

TEST_MAIN()
