// open_blocks_into and PayloadView (payload_lookup.h): blocks opened into buffers of their own
// and searched in place, found keys, tombstones and absent keys; a bad checksum or a last key
// other than the footer's names the block.
#include <map>
#include <string>
#include <vector>

#include "check.h"
#include "payload_builder.h"
#include "statecore/block_codec.h"
#include "statecore/hash.h"
#include "statecore/payload_lookup.h"

using namespace statecore;
using statecore_test::payload;

namespace {

struct Blocks {
  std::vector<uint8_t> bytes;
  std::vector<StoredBlockRef> refs;
  std::vector<std::string> last;
  std::vector<std::map<std::string, std::string>> entries;
};

Blocks make_blocks(bool tombstones) {
  Blocks b;
  b.entries = {{{"a", "1"}, {"ab", ""}, {"b", "22"}},
               {{"c", "333"}, {"cz", "4"}},
               {{"d", ""}, {"e", "5"}, {"f", "6"}, {"g", "77"}}};
  for (auto& e : b.entries) {
    if (!tombstones)
      for (auto& kv : e)
        if (kv.second.empty()) kv.second = "x";
    const std::vector<uint8_t> p = payload(e, tombstones);
    std::vector<uint8_t> stored;
    lz4_block_compress(p.data(), p.size(), &stored);
    StoredBlockRef r;
    r.offset = b.bytes.size();
    r.stored_length = stored.size();
    r.raw_length = p.size();
    r.entries = e.size();
    r.xxh64 = xxh64(stored.data(), stored.size(), 0);
    b.refs.push_back(r);
    b.bytes.insert(b.bytes.end(), stored.begin(), stored.end());
    b.last.push_back(e.rbegin()->first);
  }
  return b;
}

int64_t open_all(const Blocks& b, bool tombstones, std::vector<std::vector<uint8_t>>* out,
                 const std::vector<std::string>& last, std::string* why) {
  std::vector<const uint8_t*> lk;
  std::vector<size_t> lks;
  std::vector<uint8_t*> outs;
  out->assign(b.refs.size(), {});
  for (size_t i = 0; i < b.refs.size(); ++i) {
    lk.push_back(reinterpret_cast<const uint8_t*>(last[i].data()));
    lks.push_back(last[i].size());
    (*out)[i].resize(b.refs[i].raw_length);
    outs.push_back((*out)[i].data());
  }
  return open_blocks_into(b.bytes.data(), b.bytes.size(), b.refs.data(), b.refs.size(), tombstones,
                          lk.data(), lks.data(), outs.data(), why);
}

}  // namespace

TEST(opened_payloads_answer_every_key) {
  for (bool tombstones : {false, true}) {
    const Blocks b = make_blocks(tombstones);
    std::vector<std::vector<uint8_t>> out;
    std::string why;
    CHECK_EQ(open_all(b, tombstones, &out, b.last, &why), int64_t(-1));
    for (size_t i = 0; i < out.size(); ++i) {
      const PayloadView v = PayloadView::of(out[i].data(), out[i].size(), tombstones);
      CHECK_EQ(size_t(v.entries), b.entries[i].size());
      int64_t row = 0;
      for (const auto& kv : b.entries[i]) {
        const auto* k = reinterpret_cast<const uint8_t*>(kv.first.data());
        CHECK_EQ(v.find(k, kv.first.size()), row);
        CHECK_EQ(v.has_value(row), !kv.second.empty());
        const std::string got(reinterpret_cast<const char*>(v.value_data) + v.value_offset(row),
                              v.value_offset(row + 1) - v.value_offset(row));
        CHECK_EQ(got, kv.second);
        ++row;
      }
      for (const std::string& q : {std::string(""), std::string("aa"), std::string("zz")})
        CHECK_EQ(v.find(reinterpret_cast<const uint8_t*>(q.data()), q.size()), int64_t(-1));
    }
  }
}

TEST(bad_blocks_are_named) {
  const Blocks b = make_blocks(true);
  std::vector<std::vector<uint8_t>> out;
  std::string why;
  std::vector<std::string> last = b.last;
  last[1] = "cy";
  CHECK_EQ(open_all(b, true, &out, last, &why), int64_t(1));
  CHECK_EQ(why, std::string("last key differs from the footer's"));
  Blocks flipped = b;
  flipped.bytes[flipped.refs[2].offset] ^= 0xFF;
  CHECK_EQ(open_all(flipped, true, &out, b.last, &why), int64_t(2));
  CHECK_EQ(why, std::string("block checksum mismatch"));
}

TEST_MAIN()
