// Chunked lists (list_chunks.h): counting a chunk's elements, appends that fill the last chunk
// and start the next one, the index kept (lists of chunk 0 alone unlisted), a chunk that does
// not parse changing nothing, random appends against a model -- over the default hash and a
// deliberately colliding one -- and appends (copy-on-write of the last chunk) while another
// thread lists a snapshot.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "statecore/key_codec.h"
#include "statecore/list_chunks.h"
#include "statecore/state_map.h"

using namespace statecore;

namespace {

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

uint32_t colliding_hash(const uint8_t*, size_t) { return 7; }

std::string chunk_key(const std::string& prefix, uint64_t seq) {
  std::string k = prefix + std::string(8, '\0');
  store_list_seq(reinterpret_cast<uint8_t*>(&k[prefix.size()]), seq);
  return k;
}

// Appends framed elements `es` (one call) to list `p` of key group 0.
void append(StateMap& m, ListIndex& ix, const std::string& p, const std::vector<std::string>& es,
            size_t width, size_t suffix) {
  std::string data;
  std::vector<size_t> ends;
  for (const std::string& e : es) {
    data += e;
    ends.push_back(data.size());
  }
  std::vector<uint8_t> key;
  list_append_encoded(m, ix, 0, u8(p), p.size(), u8(data), ends.data(), es.size(), width, suffix,
                      key);
}

// Chunks of list `p` in order: the listed ones, or chunk 0.
std::vector<std::string> chunks_of(StateMap& m, const ListIndex& ix, const std::string& p) {
  std::vector<uint64_t> seqs;
  ix.chunks(0, u8(p), p.size(), seqs);
  std::vector<std::string> out;
  for (uint64_t s : seqs) {
    const std::string k = chunk_key(p, s);
    ByteView v;
    if (m.get(u8(k), k.size(), &v)) out.emplace_back(reinterpret_cast<const char*>(v.data), v.size);
  }
  return out;
}

std::string varframed(const std::string& e) {
  std::vector<uint8_t> head;
  append_varlen(head, e.size());
  return std::string(head.begin(), head.end()) + e;
}

}  // namespace

TEST(chunk_count_fixed_and_variable_width) {
  const std::string fixed(24, 'x');
  CHECK_EQ(list_chunk_count(u8(fixed), fixed.size(), 8, 0), size_t{3});
  CHECK_EQ(list_chunk_count(u8(fixed), fixed.size(), 4, 8), size_t{2});
  CHECK_THROWS(list_chunk_count(u8(fixed), fixed.size(), 5, 0), std::invalid_argument);
  const std::string var = varframed("ab") + varframed("") + varframed(std::string(200, 'z'));
  CHECK_EQ(list_chunk_count(u8(var), var.size(), 0, 0), size_t{3});
  CHECK_EQ(list_chunk_count(u8(var), 0, 0, 0), size_t{0});
  CHECK_THROWS(list_chunk_count(u8(var), var.size() - 1, 0, 0), std::invalid_argument);
  const std::string ttl = varframed("ab") + std::string(8, 't');
  CHECK_EQ(list_chunk_count(u8(ttl), ttl.size(), 0, 8), size_t{1});
  CHECK_THROWS(list_chunk_count(u8(ttl), ttl.size() - 1, 0, 8), std::invalid_argument);
}

TEST(appends_fill_the_last_chunk_then_start_the_next) {
  for (KeyHashFunction h : {static_cast<KeyHashFunction>(nullptr), &colliding_hash}) {
    StateMap m(h);
    ListIndex ix(0, 0);
    const std::string p = std::string(1, '\0') + "list";
    const size_t k = kListChunkElements;
    std::vector<std::string> es;
    for (size_t i = 0; i < k - 1; ++i) es.push_back(varframed(std::to_string(i)));
    append(m, ix, p, es, 0, 0);
    CHECK_EQ(ix.lists(), size_t{0});  // chunk 0 alone: unlisted
    CHECK_EQ(m.size(), size_t{1});
    // Three more in one call: one fills chunk 0, two start chunk 1.
    append(m, ix, p, {varframed("a"), varframed("b"), varframed("c")}, 0, 0);
    CHECK_EQ(m.size(), size_t{2});
    CHECK_EQ(ix.lists(), size_t{1});
    const auto cs = chunks_of(m, ix, p);
    CHECK_EQ(cs.size(), size_t{2});
    CHECK_EQ(list_chunk_count(u8(cs[0]), cs[0].size(), 0, 0), k);
    CHECK(cs[1] == varframed("b") + varframed("c"));
    // Another list beside it stays unlisted.
    const std::string other = std::string(1, '\0') + "other";
    append(m, ix, other, {varframed("x")}, 0, 0);
    CHECK_EQ(ix.lists(), size_t{1});
    CHECK(chunks_of(m, ix, other) == (std::vector<std::string>{varframed("x")}));
  }
}

TEST(a_last_chunk_that_does_not_parse_changes_nothing) {
  StateMap m;
  ListIndex ix(0, 0);
  const std::string p = std::string(1, '\0') + "l";
  const std::string k0 = chunk_key(p, 0);
  std::memcpy(m.put(u8(k0), k0.size(), 5), "abcde", 5);  // not whole 8-byte elements
  CHECK_THROWS(append(m, ix, p, {std::string(8, 'e')}, 8, 0), std::invalid_argument);
  ByteView v;
  CHECK(m.get(u8(k0), k0.size(), &v));
  CHECK_EQ(v.size, size_t{5});
  CHECK_EQ(m.size(), size_t{1});
  CHECK_EQ(ix.lists(), size_t{0});
}

TEST(random_appends_match_a_model) {
  for (KeyHashFunction h : {static_cast<KeyHashFunction>(nullptr), &colliding_hash}) {
    StateMap m(h);
    ListIndex ix(0, 0);
    std::mt19937_64 rng(17);
    std::map<std::string, std::vector<std::string>> model;
    for (int round = 0; round < 400; ++round) {
      const std::string p = std::string(1, '\0') + "k" + std::to_string(rng() % 12);
      std::vector<std::string> es;
      const size_t n = rng() % 3 == 0 ? rng() % 70 : 1;
      for (size_t i = 0; i < n; ++i) {
        std::string e(8, '\0');
        const uint64_t x = rng();
        std::memcpy(&e[0], &x, 8);
        es.push_back(e + std::string(8, static_cast<char>(round)));  // a TTL suffix
      }
      append(m, ix, p, es, 8, 8);
      auto& want = model[p];
      want.insert(want.end(), es.begin(), es.end());
    }
    for (const auto& kv : model) {
      const auto cs = chunks_of(m, ix, kv.first);
      std::string all, want;
      for (size_t i = 0; i < cs.size(); ++i) {
        const size_t c = list_chunk_count(u8(cs[i]), cs[i].size(), 8, 8);
        // Every chunk full but the last, which holds at least one element.
        CHECK(i + 1 == cs.size() ? (c >= 1 && c <= kListChunkElements) : c == kListChunkElements);
        all += cs[i];
      }
      for (const std::string& e : kv.second) want += e;
      CHECK(all == want);
      const size_t expect_chunks = (kv.second.size() + kListChunkElements - 1) / kListChunkElements;
      CHECK_EQ(cs.size(), expect_chunks);
    }
  }
}

TEST(appends_while_another_thread_lists_a_snapshot) {
  for (MapEngine engine : {MapEngine::Flat, MapEngine::Chained}) {
    StateMap m(nullptr, engine);
    ListIndex ix(0, 0);
    auto prefix = [](int k) { return std::string(1, '\0') + "k" + std::to_string(k); };
    auto element = [](uint64_t x) {
      std::string e(8, '\0');
      std::memcpy(&e[0], &x, 8);
      return e;
    };
    for (int k = 0; k < 50; ++k)
      for (uint64_t i = 0; i < 40; ++i) append(m, ix, prefix(k), {element(i)}, 8, 0);
    std::map<std::string, std::string> before;
    m.for_each([&](ByteView k, ByteView v) {
      before[std::string(reinterpret_cast<const char*>(k.data), k.size)] =
          std::string(reinterpret_cast<const char*>(v.data), v.size);
    });
    std::shared_ptr<MapSnapshot> snap = m.snapshot();
    std::map<std::string, std::string> listed;
    std::thread reader([&] {
      const SortedRun run = snap->sorted_entries();
      for (size_t i = 0; i < run.size(); ++i)
        listed[std::string(reinterpret_cast<const char*>(run.key(i).data), run.key(i).size)] =
            std::string(reinterpret_cast<const char*>(run.value(i).data), run.value(i).size);
    });
    // The owner appends on: the last chunks (copied) and new ones.
    for (int round = 0; round < 30; ++round)
      for (int k = 0; k < 50; ++k) append(m, ix, prefix(k), {element(1000 + round)}, 8, 0);
    reader.join();
    CHECK(listed == before);
    snap->release();
    for (int k = 0; k < 50; ++k) {
      const auto cs = chunks_of(m, ix, prefix(k));
      CHECK_EQ(cs.size(), size_t{3});  // 70 elements
    }
  }
}

TEST_MAIN()
