// Unit tests of the background block serializer (snapshot_writer.h): payload layout, cut
// boundaries, tombstone bitmaps, file order across states, backpressure, cancellation, contract
// errors, and a serializer thread reading while the owner writes (run under TSan too). Fixed seeds.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "lz4.h"
#include "statecore/block_codec.h"
#include "statecore/hash.h"
#include "statecore/snapshot_writer.h"
#include "statecore/state_table.h"

using statecore::BlockChunk;
using statecore::BlockPayload;
using statecore::ByteView;
using statecore::SerializerCancelled;
using statecore::SerializerOptions;
using statecore::SerializerSource;
using statecore::SnapshotSerializer;
using statecore::StateMap;
using statecore::StateTable;
using statecore::StaticEntries;
using statecore::TableSnapshot;

namespace {

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

void put(StateMap& m, const std::string& k, const std::string& v) {
  uint8_t* p = m.put(u8(k), k.size(), v.size());
  if (!v.empty()) std::memcpy(p, v.data(), v.size());
}

std::string key(int32_t kg, uint32_t id) {
  std::string s(1, static_cast<char>(kg));
  for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((id >> (8 * i)) & 0xff));
  return s;
}

uint32_t rd32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

struct Decoded {
  std::vector<std::string> keys, values;
  std::vector<bool> valid;
};

// Parses a payload per format.py; CHECKs its structure.
Decoded decode(const BlockPayload& b, bool incremental) {
  Decoded d;
  const uint8_t* p = b.bytes.data();
  uint32_t n = rd32(p);
  CHECK_EQ(n, b.entries);
  const uint8_t* ko = p + 4;
  const uint8_t* vo = ko + 4 * (n + 1);
  uint32_t kb = rd32(ko + 4 * n), vb = rd32(vo + 4 * n);
  const uint8_t* kd = vo + 4 * (n + 1);
  const uint8_t* vd = kd + kb;
  size_t bitmap = incremental ? (n + 7) / 8 : 0;
  CHECK_EQ(b.bytes.size(), 4 + 8 * (size_t{n} + 1) + kb + vb + bitmap);
  CHECK_EQ(rd32(ko), 0u);
  CHECK_EQ(rd32(vo), 0u);
  uint32_t tomb = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t k0 = rd32(ko + 4 * i), k1 = rd32(ko + 4 * (i + 1));
    uint32_t v0 = rd32(vo + 4 * i), v1 = rd32(vo + 4 * (i + 1));
    d.keys.emplace_back(reinterpret_cast<const char*>(kd + k0), k1 - k0);
    d.values.emplace_back(reinterpret_cast<const char*>(vd + v0), v1 - v0);
    bool ok = !incremental || ((vd + vb)[i / 8] >> (i % 8)) & 1;
    d.valid.push_back(ok);
    tomb += !ok;
  }
  for (size_t bit = n; bit < bitmap * 8; ++bit) CHECK_EQ(((vd + vb)[bit / 8] >> (bit % 8)) & 1, 0);
  CHECK_EQ(tomb, b.tombstones);
  return d;
}

std::vector<BlockPayload> drain(SnapshotSerializer& s) {
  std::vector<BlockPayload> out;
  BlockPayload b;
  while (s.next(&b)) out.push_back(std::move(b));
  return out;
}

SerializerOptions opts(int32_t a, int32_t b, size_t target, bool inc = false) {
  SerializerOptions o;
  o.kg_start = a;
  o.kg_end = b;
  o.block_target_bytes = target;
  o.incremental = inc;
  return o;
}

}  // namespace

TEST(full_payloads_cut_like_format_py) {
  StateTable t(0, 3);
  std::mt19937 rng(7);
  std::map<std::pair<int32_t, std::string>, std::string> ref;
  for (uint32_t i = 0; i < 400; ++i) {
    int32_t kg = static_cast<int32_t>(rng() % 4);
    std::string v(rng() % 300, static_cast<char>('a' + i % 26));
    put(t.map(kg), key(kg, i), v);
    ref[{kg, key(kg, i)}] = v;
  }
  auto snap = std::make_shared<TableSnapshot>(t.snapshot());
  const size_t target = 1000;
  SnapshotSerializer s({SerializerSource{"s", snap, false, 0, {}}}, opts(0, 3, target));
  s.start();
  auto blocks = drain(s);
  auto it = ref.begin();
  int32_t last_kg = -1;
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const auto& b = blocks[bi];
    CHECK(b.key_group >= last_kg);
    last_kg = b.key_group;
    Decoded d = decode(b, false);
    size_t body = 0;
    for (size_t i = 0; i < d.keys.size(); ++i, ++it) {
      CHECK_EQ(it->first.first, b.key_group);
      CHECK_EQ(d.keys[i], it->first.second);
      CHECK_EQ(d.values[i], it->second);
      body += 8 + d.keys[i].size() + d.values[i].size();
    }
    // At most the target unless a single entry; maximal: the next entry of the group would not fit.
    CHECK(body + 12 <= target || d.keys.size() == 1);
    if (!b.last_of_group) {
      CHECK(it != ref.end());
      CHECK(body + 8 + it->first.second.size() + it->second.size() + 12 > target);
    }
  }
  CHECK(it == ref.end());
  CHECK_EQ(s.stats().blocks, blocks.size());
}

TEST(incremental_bitmap_and_static_source_interleaved) {
  StateTable t(5, 6);
  put(t.map(5), key(5, 1), "one");
  put(t.map(5), key(5, 2), "two");
  put(t.map(6), key(6, 3), "three");
  uint64_t base = t.snapshot().version();  // snapshot of version 1; changes after it count
  t.mark_base(base);
  t.map(5).remove(u8(key(5, 1)), 5);
  put(t.map(5), key(5, 4), "four");
  auto snap = std::make_shared<TableSnapshot>(t.snapshot());
  StaticEntries timers;
  std::string tk = key(6, 99);
  timers.key_data.assign(tk.begin(), tk.end());
  timers.key_offsets = {0, tk.size()};
  timers.value_offsets = {0, 0};
  SerializerSource a{"a", snap, true, snap->base_version(), {}};
  SerializerSource tm{"__timers__", nullptr, false, 0, {}};
  tm.fixed.emplace(6, timers);
  SnapshotSerializer s({a, tm}, opts(5, 6, 64 * 1024, true));
  s.start();
  auto blocks = drain(s);
  CHECK_EQ(blocks.size(), 2u);  // kg 5: state a; kg 6: a has no change, then the timers
  Decoded d0 = decode(blocks[0], true);
  CHECK_EQ(blocks[0].key_group, 5);
  CHECK_EQ(blocks[0].state, 0u);
  CHECK_EQ(d0.keys.size(), 2u);
  CHECK_EQ(d0.keys[0], key(5, 1));
  CHECK(!d0.valid[0]);
  CHECK_EQ(d0.values[0], std::string());
  CHECK_EQ(d0.keys[1], key(5, 4));
  CHECK(d0.valid[1]);
  CHECK_EQ(d0.values[1], std::string("four"));
  CHECK_EQ(blocks[1].key_group, 6);
  CHECK_EQ(blocks[1].state, 1u);
  Decoded d1 = decode(blocks[1], true);
  CHECK_EQ(d1.keys.size(), 1u);
  CHECK(d1.valid[0]);
}

TEST(backpressure_bounds_the_queue) {
  StateTable t(0, 0);
  for (uint32_t i = 0; i < 2000; ++i) put(t.map(0), key(0, i), std::string(100, 'x'));
  auto snap = std::make_shared<TableSnapshot>(t.snapshot());
  SerializerOptions o = opts(0, 0, 1024);
  o.queue_blocks = 2;
  SnapshotSerializer s({SerializerSource{"s", snap, false, 0, {}}}, o);
  s.start();
  // Wait for the producer to hit the full queue rather than sleeping a fixed time: under TSan
  // the producer can be slower than any fixed sleep.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (s.stats().producer_waits == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  size_t entries = 0;
  BlockPayload b;
  while (s.next(&b)) entries += b.entries;
  CHECK_EQ(entries, 2000u);
  CHECK(s.stats().max_queued <= 2);
  CHECK(s.stats().producer_waits > 0);
}

TEST(cancel_stops_the_producer) {
  StateTable t(0, 7);
  for (uint32_t i = 0; i < 4000; ++i) put(t.map(static_cast<int32_t>(i % 8)), key(i % 8, i), "v");
  auto snap = std::make_shared<TableSnapshot>(t.snapshot());
  SerializerOptions o = opts(0, 7, 256);
  o.queue_blocks = 1;
  SnapshotSerializer s({SerializerSource{"s", snap, false, 0, {}}}, o);
  s.start();
  BlockPayload b;
  CHECK(s.next(&b));
  s.cancel();
  s.cancel();  // idempotent
  CHECK_THROWS(s.next(&b), SerializerCancelled);
  CHECK(s.stats().blocks < 4000 / 20);
}

TEST(contract_errors_surface_in_next) {
  StaticEntries bad;  // a key of key group 2 listed under key group 1
  std::string k = key(2, 1);
  bad.key_data.assign(k.begin(), k.end());
  bad.key_offsets = {0, k.size()};
  bad.value_offsets = {0, 0};
  SerializerSource src{"x", nullptr, false, 0, {}};
  src.fixed.emplace(1, bad);
  SnapshotSerializer s({src}, opts(0, 3, 100));
  s.start();
  BlockPayload b;
  CHECK_THROWS(s.next(&b), std::invalid_argument);

  StaticEntries unsorted;
  std::string k1 = key(1, 2), k2 = key(1, 1);
  unsorted.key_data.assign(k1.begin(), k1.end());
  unsorted.key_data.insert(unsorted.key_data.end(), k2.begin(), k2.end());
  unsorted.key_offsets = {0, k1.size(), k1.size() + k2.size()};
  unsorted.value_offsets = {0, 0, 0};
  SerializerSource src2{"y", nullptr, false, 0, {}};
  src2.fixed.emplace(1, unsorted);
  SnapshotSerializer s2({src2}, opts(1, 1, 100));
  s2.start();
  CHECK_THROWS(s2.next(&b), std::invalid_argument);

  StateTable t(0, 1);
  auto snap = std::make_shared<TableSnapshot>(t.snapshot());
  CHECK_THROWS(SnapshotSerializer({SerializerSource{"z", snap, false, 0, {}}}, opts(0, 2, 100)),
               std::invalid_argument);
  SerializerOptions o = opts(0, 1, 100);
  o.prefix_bytes = 3;
  CHECK_THROWS(SnapshotSerializer({}, o), std::invalid_argument);
  SnapshotSerializer never_started({}, opts(0, 1, 100));
  CHECK_THROWS(never_started.next(&b), std::logic_error);
}

// The serializer thread reads the snapshot while the owner keeps writing (puts, overwrites with
// new sizes, removals, inserts that trigger incremental rehashes); the payloads hold exactly the
// contents at snapshot time. release_as_written frees the snapshot key group by key group, and
// once it is all released the owner's retired entries drain to 0.
TEST(serializer_reads_while_owner_writes) {
  for (unsigned seed : {1u, 2u, 3u}) {
    StateTable t(0, 7);
    std::mt19937 rng(seed);
    std::map<std::pair<int32_t, std::string>, std::string> ref;
    for (uint32_t i = 0; i < 3000; ++i) {
      int32_t kg = static_cast<int32_t>(rng() % 8);
      std::string v(rng() % 40, static_cast<char>('a' + rng() % 26));
      put(t.map(kg), key(kg, rng() % 5000), v);
    }
    for (int32_t kg = 0; kg < 8; ++kg)
      t.map(kg).for_each([&](ByteView k, ByteView v) {
        ref[{kg, std::string(reinterpret_cast<const char*>(k.data), k.size)}] =
            std::string(reinterpret_cast<const char*>(v.data), v.size);
      });
    auto snap = std::make_shared<TableSnapshot>(t.snapshot());
    SerializerOptions o = opts(0, 7, 512);
    o.queue_blocks = 3;
    o.release_as_written = true;
    SnapshotSerializer s({SerializerSource{"s", snap, false, 0, {}}}, o);
    s.start();
    // The owner writes on this thread, interleaved with draining (as the Python side does).
    std::vector<BlockPayload> blocks;
    BlockPayload b;
    bool more = true;
    uint32_t op = 0;
    while (more) {
      for (int k = 0; k < 50; ++k, ++op) {
        int32_t kg = static_cast<int32_t>(rng() % 8);
        std::string kk = key(kg, rng() % 20000);
        switch (rng() % 3) {
          case 0: put(t.map(kg), kk, std::string(rng() % 60, 'z')); break;
          case 1: t.map(kg).remove(u8(kk), kk.size()); break;
          default: put(t.map(kg), key(kg, 100000 + op), "new"); break;
        }
      }
      more = s.next(&b);
      if (more) blocks.push_back(std::move(b));
    }
    auto it = ref.begin();
    for (const auto& blk : blocks) {
      Decoded d = decode(blk, false);
      for (size_t i = 0; i < d.keys.size(); ++i, ++it) {
        CHECK(it != ref.end());
        if (it == ref.end()) break;
        CHECK_EQ(it->first.first, blk.key_group);
        CHECK_EQ(d.keys[i], it->first.second);
        CHECK_EQ(d.values[i], it->second);
      }
    }
    CHECK(it == ref.end());
    uint64_t rehashes = 0;
    for (int32_t kg = 0; kg < 8; ++kg) rehashes += t.map(kg).stats().rehashes;
    CHECK(rehashes > 0);
    snap->release();
    size_t retired = 0;
    for (int32_t kg = 0; kg < 8; ++kg) {
      t.map(kg).reclaim();
      retired += t.map(kg).retired_entries();
    }
    CHECK_EQ(retired, 0u);
  }
}

// The producer runs on its own thread while another thread (not the owner) consumes and a
// third cancels: exercises cancel racing next() and the producer's wait (TSan).
TEST(cancel_races_consumer) {
  StateTable t(0, 3);
  for (uint32_t i = 0; i < 5000; ++i) put(t.map(static_cast<int32_t>(i % 4)), key(i % 4, i), "vv");
  for (int round = 0; round < 20; ++round) {
    auto snap = std::make_shared<TableSnapshot>(t.snapshot());
    SerializerOptions o = opts(0, 3, 128);
    o.queue_blocks = 2;
    SnapshotSerializer s({SerializerSource{"s", snap, false, 0, {}}}, o);
    s.start();
    std::thread consumer([&s] {
      BlockPayload b;
      try {
        while (s.next(&b)) {
        }
      } catch (const SerializerCancelled&) {
      }
    });
    std::this_thread::sleep_for(std::chrono::microseconds(100 * round));
    s.cancel();
    consumer.join();
    snap->release();
  }
  CHECK(true);
}

// next_chunk: the same blocks as next(), in order, each stored as lz4_block_compress of its payload
// (which decompresses back to it) with the XXH64 of the stored bytes; chunks reach the target
// unless they end the file; errors leave the chunk empty.
TEST(chunks_hold_compressed_blocks_in_file_order) {
  StateTable t(0, 7);
  std::mt19937 rng(11);
  for (uint32_t i = 0; i < 3000; ++i) {
    int32_t kg = static_cast<int32_t>(rng() % 8);
    put(t.map(kg), key(kg, i), std::string(rng() % 200, static_cast<char>('a' + i % 3)));
  }
  auto snap = std::make_shared<TableSnapshot>(t.snapshot());
  SnapshotSerializer plain({SerializerSource{"s", snap, false, 0, {}}}, opts(0, 7, 4096));
  plain.start();
  auto blocks = drain(plain);
  CHECK(blocks.size() > 40);
  for (size_t target : {size_t{1}, size_t{20000}, size_t{1} << 30}) {
    SnapshotSerializer s({SerializerSource{"s", snap, false, 0, {}}}, opts(0, 7, 4096));
    s.start();
    BlockChunk c;
    size_t bi = 0, chunks = 0;
    while (s.next_chunk(&c, target)) {
      ++chunks;
      CHECK(!c.blocks.empty());
      uint64_t at = 0;
      for (const auto& sb : c.blocks) {
        CHECK(bi < blocks.size());
        const BlockPayload& b = blocks[bi++];
        CHECK_EQ(sb.key_group, b.key_group);
        CHECK_EQ(sb.state, b.state);
        CHECK_EQ(sb.entries, b.entries);
        CHECK_EQ(sb.last_of_group, b.last_of_group);
        CHECK_EQ(sb.offset, at);
        CHECK_EQ(sb.raw_length, b.bytes.size());
        std::vector<uint8_t> alone;
        CHECK_EQ(statecore::lz4_block_compress(b.bytes.data(), b.bytes.size(), &alone),
                 sb.stored_length);
        CHECK(std::memcmp(alone.data(), c.bytes.data() + at, alone.size()) == 0);
        CHECK_EQ(sb.xxh64, statecore::xxh64(c.bytes.data() + at, sb.stored_length, 0));
        std::vector<char> back(b.bytes.size() + 1);
        int got =
            LZ4_decompress_safe(reinterpret_cast<const char*>(c.bytes.data() + at), back.data(),
                                static_cast<int>(sb.stored_length), static_cast<int>(back.size()));
        CHECK_EQ(static_cast<size_t>(got), b.bytes.size());
        CHECK(std::memcmp(back.data(), b.bytes.data(), b.bytes.size()) == 0);
        at += sb.stored_length;
      }
      CHECK_EQ(at, c.bytes.size());
      // A chunk stops at the first block that reaches the target (or at the end of the file).
      uint64_t before_last = at - c.blocks.back().stored_length;
      CHECK(before_last < target);
      CHECK(at >= target || bi == blocks.size());
    }
    CHECK_EQ(bi, blocks.size());
    CHECK(c.blocks.empty() && c.bytes.empty());
    if (target == 1) CHECK_EQ(chunks, blocks.size());
    if (target == (size_t{1} << 30)) CHECK_EQ(chunks, size_t{1});
  }
  // Cancelled: next_chunk throws and leaves nothing behind.
  SnapshotSerializer s({SerializerSource{"s", snap, false, 0, {}}}, opts(0, 7, 4096));
  s.start();
  BlockChunk c;
  CHECK(s.next_chunk(&c, 1));
  s.cancel();
  CHECK_THROWS(s.next_chunk(&c, 1 << 20), SerializerCancelled);
  CHECK(c.blocks.empty() && c.bytes.empty());
}

// Format 6: every block carries its last key, the last block of each (state, key group) the
// group's Bloom filter, which passes every key of the group (tombstones included), is sized by
// bits per key, and moves into the chunk's stored block.
TEST(blocks_carry_last_keys_and_group_filters) {
  StateTable t(0, 3);
  std::mt19937 rng(5);
  std::map<int32_t, std::vector<std::string>> keys;
  for (uint32_t i = 0; i < 2000; ++i) {
    int32_t kg = static_cast<int32_t>(rng() % 4);
    put(t.map(kg), key(kg, i), std::string(rng() % 60, 'v'));
    keys[kg].push_back(key(kg, i));
  }
  auto snap = std::make_shared<TableSnapshot>(t.snapshot());
  SerializerOptions o = opts(0, 3, 1024);
  o.bloom_bits_per_key = 12;
  SnapshotSerializer s({SerializerSource{"s", snap, false, 0, {}}}, o);
  s.start();
  const uint32_t k = statecore::bloom_hashes(12);
  CHECK_EQ(k, 8u);
  size_t groups = 0;
  BlockChunk c;
  while (s.next_chunk(&c, 4096)) {
    for (const auto& sb : c.blocks) {
      CHECK(!sb.last_key.empty());
      CHECK_EQ(static_cast<int32_t>(sb.last_key[0]), sb.key_group);
      if (!sb.last_of_group) {
        CHECK(sb.filter.empty());
        continue;
      }
      ++groups;
      auto& ks = keys[sb.key_group];
      std::sort(ks.begin(), ks.end());
      CHECK(std::string(sb.last_key.begin(), sb.last_key.end()) == ks.back());
      CHECK_EQ(sb.filter.size(), statecore::bloom_filter_bytes(ks.size(), 12));
      for (const auto& kk : ks)
        CHECK(statecore::bloom_may_contain(sb.filter.data(), sb.filter.size(), k,
                                           statecore::xxh64(kk.data(), kk.size(), 0)));
      size_t fp = 0;
      for (uint32_t i = 0; i < 20000; ++i) {
        std::string absent = key(sb.key_group, 1000000 + i);
        fp += statecore::bloom_may_contain(sb.filter.data(), sb.filter.size(), k,
                                           statecore::xxh64(absent.data(), absent.size(), 0));
      }
      CHECK(fp < 20000 / 100);  // ~0.3% expected at 12 bits per key
    }
  }
  CHECK_EQ(groups, size_t{4});
  o.bloom_bits_per_key = 0;
  CHECK_THROWS(SnapshotSerializer({SerializerSource{"s", snap, false, 0, {}}}, o),
               std::invalid_argument);
}

TEST(lz4_block_compress_round_trips_and_appends) {
  std::vector<uint8_t> out{1, 2, 3};
  CHECK_EQ(statecore::lz4_block_compress(nullptr, 0, &out),
           size_t{1});  // an empty block: one token
  CHECK_EQ(out.size(), size_t{4});
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "key" + std::to_string(i % 97);
  size_t n = statecore::lz4_block_compress(u8(text), text.size(), &out);
  CHECK_EQ(out.size(), 4 + n);
  CHECK(n < text.size() / 2);
  std::string back(text.size(), '\0');
  CHECK_EQ(LZ4_decompress_safe(reinterpret_cast<const char*>(out.data() + 4), back.data(),
                               static_cast<int>(n), static_cast<int>(back.size())),
           static_cast<int>(text.size()));
  CHECK(back == text);
  CHECK_EQ(statecore::lz4_block_bound(size_t{1} << 32), size_t{0});
}

// decode_blocks reads back what next_chunk wrote: every entry of a (state, key group), then, over
// flipped and truncated bytes (checksums recomputed, so LZ4 and the payload checks see them),
// a reported failure or a decode -- never a read or write out of bounds (ASan).
TEST(decode_blocks_reads_chunks_back_and_survives_corruption) {
  StateTable t(0, 0);
  std::mt19937 rng(13);
  std::map<std::string, std::string> ref;
  for (uint32_t i = 0; i < 2000; ++i) {
    std::string v(rng() % 60, static_cast<char>('a' + i % 5));
    put(t.map(0), key(0, i), v);
    ref[key(0, i)] = v;
  }
  auto snap = std::make_shared<TableSnapshot>(t.snapshot());
  SnapshotSerializer s({SerializerSource{"s", snap, false, 0, {}}}, opts(0, 0, 2048));
  s.start();
  BlockChunk c;
  CHECK(s.next_chunk(&c, size_t{1} << 30));
  std::vector<statecore::StoredBlockRef> refs;
  uint64_t n = 0, raw = 0;
  for (const auto& b : c.blocks) {
    refs.push_back({b.offset, b.stored_length, b.raw_length, b.entries, b.xxh64});
    n += b.entries;
    raw += b.raw_length;
  }
  CHECK(refs.size() > 10);
  CHECK_EQ(n, uint64_t{ref.size()});
  std::vector<int32_t> ko(n + 1), vo(n + 1);
  std::vector<uint8_t> kd(raw), vd(raw), va((n + 7) / 8);
  statecore::DecodeBuffers out{ko.data(), vo.data(), kd.data(), vd.data(), raw, va.data()};
  auto r = statecore::decode_blocks(c.bytes.data(), c.bytes.size(), refs.data(), refs.size(), false,
                                    out);
  CHECK_EQ(r.failed_block, int64_t{-1});
  size_t i = 0;
  for (const auto& [k, v] : ref) {
    CHECK_EQ(std::string(reinterpret_cast<const char*>(kd.data()) + ko[i], ko[i + 1] - ko[i]), k);
    CHECK_EQ(std::string(reinterpret_cast<const char*>(vd.data()) + vo[i], vo[i + 1] - vo[i]), v);
    ++i;
  }
  CHECK_EQ(r.key_bytes, size_t(ko[n]));
  CHECK_EQ(r.value_bytes, size_t(vo[n]));
  // Incremental reading of a full payload: no room for the bitmap, block 0 is rejected.
  r = statecore::decode_blocks(c.bytes.data(), c.bytes.size(), refs.data(), refs.size(), true, out);
  CHECK_EQ(r.failed_block, int64_t{0});
  size_t failures = 0;
  for (int round = 0; round < 400; ++round) {
    std::vector<uint8_t> bad = c.bytes;
    std::vector<statecore::StoredBlockRef> bad_refs = refs;
    const size_t pos = rng() % bad.size();
    bad[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
    const bool fix_checksums = round % 2;
    if (fix_checksums)
      for (auto& b : bad_refs)
        b.xxh64 = statecore::xxh64(bad.data() + b.offset, b.stored_length, 0);
    size_t size = bad.size();
    if (round % 7 == 0) size = pos;  // truncated
    r = statecore::decode_blocks(bad.data(), size, bad_refs.data(), bad_refs.size(), round % 3 == 0,
                                 out);
    if (!fix_checksums) CHECK(r.failed_block >= 0);
    if (r.failed_block >= 0) {
      ++failures;
      CHECK(!r.error.empty());
    }
  }
  CHECK(failures > 200);
}

TEST_MAIN()
