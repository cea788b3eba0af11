// libFuzzer target: the TTL readers of stored values in the value layout (ttl.h, docs/formats.md
// "TTL suffix": user bytes | 8-byte big-endian ms timestamp) -- filter_values, the native
// compaction filter over a chunk of a checkpoint's values (int32 and int64 offsets), and
// migrate_value, the restore-time conversion with TTL switched on or off. The list and map
// layouts are left to their own tests: their code is in motion.
//
// Input: flags (& 1: int64 offsets; & 2: offsets from the input, else framed values), now
// (LE64), ttl_ms (LE64; 0 becomes 1), then either framed values (size byte, bytes) or
// n (1 byte, % 32), n + 1 offsets (LE32, signed) and the data bytes.
//
// Contract: filter_values throws std::invalid_argument exactly for offsets that are negative,
// decreasing or past the data, reads and writes nothing outside the buffers it is given (exact
// sizes, ASan), keeps a value exactly when it is shorter than a timestamp or unexpired under
// Flink's rule (ts + ttl <= now, never on overflow), and writes the kept values back to back;
// migrate_value adds a timestamp that stripping removes again, and strips exactly as the filter
// decides.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "fuzz_input.h"
#include "statecore/ttl.h"

namespace {

using statecore_fuzz::Input;

bool ref_expired(const uint8_t* v, size_t size, int64_t ttl, int64_t now) {
  if (size < 8) return false;
  uint64_t ts = 0;
  for (size_t i = size - 8; i < size; ++i) ts = ts << 8 | v[i];
  int64_t deadline = 0;
  if (__builtin_add_overflow(static_cast<int64_t>(ts), ttl, &deadline)) return false;
  return deadline <= now;
}

template <class Offset>
void filter(const std::vector<int64_t>& offs, const std::vector<uint8_t>& data, int64_t now,
            int64_t ttl) {
  const size_t n = offs.size() - 1;
  std::vector<Offset> o(offs.begin(), offs.end());
  bool sound = true;
  for (size_t i = 0; i <= n; ++i)
    sound = sound && o[i] >= 0 && (i == 0 || o[i] >= o[i - 1]) &&
            static_cast<uint64_t>(o[i]) <= data.size();
  if (n == 0) sound = true;  // no value: nothing is read
  // What the caller provides (ttl.h): offsets[n] - offsets[0] bytes; none when the first and
  // the last offset are already refused.
  const bool ends_ok = n && o[0] >= 0 && o[n] >= o[0] && static_cast<uint64_t>(o[n]) <= data.size();
  const int64_t capacity = ends_ok ? int64_t{o[n]} - int64_t{o[0]} : 0;
  std::vector<uint8_t> keep(n), out(static_cast<size_t>(capacity));
  std::vector<Offset> out_offsets(n + 1);
  statecore::ttl::FilterSpec spec;
  spec.layout = statecore::ttl::Layout::Value;
  spec.ttl_ms = ttl;
  statecore::ttl::ValuesFiltered r;
  try {
    r = statecore::ttl::filter_values(spec, now, data.data(), data.size(), o.data(), n, keep.data(),
                                      out_offsets.data(), out.data());
  } catch (const std::invalid_argument&) {
    FUZZ_CHECK(!sound, "filter_values refuses only unsound offsets");
    return;
  }
  FUZZ_CHECK(sound, "filter_values refuses unsound offsets");
  std::vector<uint8_t> want;
  size_t kept = 0, dropped = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* v = data.data() + o[i];
    const size_t size = static_cast<size_t>(o[i + 1] - o[i]);
    const bool stays = !ref_expired(v, size, ttl, now);
    FUZZ_CHECK(keep[i] == stays, "a value stays exactly when it is unexpired");
    if (!stays) {
      ++dropped;
      continue;
    }
    want.insert(want.end(), v, v + size);
    ++kept;
    FUZZ_CHECK(static_cast<size_t>(out_offsets[kept]) == want.size(), "kept values' offsets");
  }
  FUZZ_CHECK(r.kept == kept && r.expired == dropped && r.data_bytes == want.size(), "counts");
  FUZZ_CHECK(out_offsets[0] == 0, "the kept values' offsets start at 0");
  FUZZ_CHECK(want.empty() || std::memcmp(out.data(), want.data(), want.size()) == 0,
             "kept values are copied");

  // Migration of the same values, one by one.
  for (size_t i = 0; i < n; ++i) {
    const statecore::ByteView v{data.data() + o[i], static_cast<size_t>(o[i + 1] - o[i])};
    statecore::ttl::MigrationSpec add;
    add.layout = statecore::ttl::Layout::Value;
    add.ts = now;
    std::vector<uint8_t> with, without;
    FUZZ_CHECK(statecore::ttl::migrate_value(add, v, &with), "adding keeps every value");
    FUZZ_CHECK(
        with.size() == v.size + 8 && statecore::ttl::load_timestamp(with.data() + v.size) == now,
        "adding appends the timestamp");
    statecore::ttl::MigrationSpec strip;
    strip.layout = statecore::ttl::Layout::Value;
    strip.add_timestamps = false;
    strip.ttl_ms = ttl;
    strip.now = now;
    const statecore::ByteView added{with.data(), with.size()};
    const bool live = statecore::ttl::migrate_value(strip, added, &without);
    FUZZ_CHECK(live == !ref_expired(with.data(), with.size(), ttl, now), "strip decides as TTL");
    FUZZ_CHECK(!live || (without.size() == v.size &&
                         (v.size == 0 || std::memcmp(without.data(), v.data, v.size) == 0)),
               "strip(add(v)) == v");
    try {
      const bool stays = statecore::ttl::migrate_value(strip, v, &without);
      FUZZ_CHECK(v.size >= 8 && stays == !ref_expired(v.data, v.size, ttl, now),
                 "strip keeps a value exactly when the filter does");
      FUZZ_CHECK(!stays || (without.size() == v.size - 8 &&
                            std::memcmp(without.data(), v.data, v.size - 8) == 0),
                 "strip removes the 8-byte suffix");
    } catch (const std::invalid_argument&) {
      FUZZ_CHECK(v.size < 8, "strip refuses only a value shorter than its timestamp");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t flags = in.u8();
  const int64_t now = static_cast<int64_t>(in.le64());
  int64_t ttl = static_cast<int64_t>(in.le64() & INT64_MAX);
  if (ttl == 0) ttl = 1;
  std::vector<int64_t> offs{0};
  std::vector<uint8_t> bytes;
  if (flags & 2) {
    const size_t n = in.u8() % 32;
    for (size_t i = 0; i <= n; ++i) offs.push_back(static_cast<int32_t>(in.le32()));
    offs.erase(offs.begin());
    size_t got = 0;
    const uint8_t* p = in.rest(&got);
    bytes.assign(p, p + got);
  } else {
    while (in.left() > 0 && offs.size() <= 256) {
      size_t got = 0;
      const uint8_t* p = in.bytes(in.u8(), &got);
      bytes.insert(bytes.end(), p, p + got);
      offs.push_back(static_cast<int64_t>(bytes.size()));
    }
  }
  if (flags & 1) filter<int64_t>(offs, bytes, now, ttl);
  else filter<int32_t>(offs, bytes, now, ttl);
  return 0;
}
