#include "statecore/ttl.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "statecore/collection_index.h"
#include "statecore/key_codec.h"
#include "statecore/list_index.h"

namespace statecore {
namespace ttl {
namespace {

[[noreturn]] void broken(const char* what, size_t pos) {
  throw std::invalid_argument(std::string(what) + " at byte " + std::to_string(pos) +
                              " of a TTL value");
}

// Reads a varlen at value[pos..) into *n; returns the position after it.
size_t varlen_at(ByteView v, size_t pos, uint64_t* n) {
  size_t used = read_varlen(v.data + pos, v.size - pos, n);
  if (used == 0) broken("truncated or overlong varlen", pos);
  return pos + used;
}

// The one walk over a TTL value's layout: fn(start, end, has_ts) for each list element (bytes
// [start, end), its timestamp at end - 8 when has_ts; a Value layout is a single element), in
// order, until fn returns false. Throws (broken) on a truncated layout. With
// `timestamps` false it walks the same state's layout without TTL (migration reads it): list
// elements have no suffix and has_ts is always false.
template <class Fn>
void for_each_element(const FilterSpec& spec, ByteView v, Fn&& fn, bool timestamps = true) {
  if (spec.layout == Layout::Value) {
    fn(size_t{0}, v.size, timestamps && v.size >= kTimestampBytes);
    return;
  }
  const size_t suffix = timestamps ? kTimestampBytes : 0;
  size_t pos = 0;
  while (pos < v.size) {
    const size_t start = pos;
    uint64_t n = 0;
    n = spec.fixed_width;
    if (n == 0) pos = varlen_at(v, pos, &n);
    if (n > v.size - pos || v.size - pos - n < suffix) broken("truncated list element", start);
    pos += n + suffix;
    if (!fn(start, pos, timestamps)) return;
  }
}

FilterResult filter_list(const FilterSpec& spec, int64_t now, ByteView v, std::vector<uint8_t>* out,
                         size_t* expired_count) {
  size_t dropped = 0;
  FilterResult result = FilterResult::Drop;
  for_each_element(spec, v, [&](size_t start, size_t end, bool) {
    if (expired(load_timestamp(v.data + end - kTimestampBytes), spec.ttl_ms, now)) {
      ++dropped;
      return true;
    }
    // Elements are appended in timestamp order: the rest is unexpired too.
    if (start == 0) {
      result = FilterResult::Keep;
    } else {
      out->assign(v.data + start, v.data + v.size);
      result = FilterResult::Trim;
    }
    return false;
  });
  *expired_count += dropped;
  return result;
}

}  // namespace

FilterResult filter_value(const FilterSpec& spec, int64_t now, ByteView value,
                          std::vector<uint8_t>* out, size_t* expired_count) {
  if (spec.ttl_ms <= 0) throw std::invalid_argument("TTL must be > 0 ms");
  size_t ignored = 0;
  if (expired_count == nullptr) expired_count = &ignored;
  if (out) out->clear();
  switch (spec.layout) {
    case Layout::Value:
      if (value.size < kTimestampBytes ||
          !expired(load_timestamp(value.data + value.size - kTimestampBytes), spec.ttl_ms, now))
        return FilterResult::Keep;
      *expired_count += 1;
      return FilterResult::Drop;
    case Layout::List:
      if (out == nullptr) throw std::invalid_argument("filter_value: a list filter needs `out`");
      return filter_list(spec, now, value, out, expired_count);
  }
  throw std::invalid_argument("filter_value: unknown layout");
}

size_t filter_run(const FilterSpec& spec, int64_t now, const SortedRun& in, SortedRun& out) {
  if (!in.valid.empty()) {
    for (uint8_t v : in.valid)
      if (v == 0) throw std::invalid_argument("filter_run: a tombstone in a full listing");
  }
  out.key_data.clear();
  out.value_data.clear();
  out.key_offsets.assign(1, 0);
  out.value_offsets.assign(1, 0);
  out.valid.clear();
  out.key_data.reserve(in.key_data.size());
  out.value_data.reserve(in.value_data.size());
  out.key_offsets.reserve(in.key_offsets.size());
  out.value_offsets.reserve(in.value_offsets.size());
  std::vector<uint8_t> trimmed;
  size_t expired_count = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const ByteView v = in.value(i);
    const FilterResult r = filter_value(spec, now, v, &trimmed, &expired_count);
    if (r == FilterResult::Drop) continue;
    const ByteView k = in.key(i);
    out.key_data.insert(out.key_data.end(), k.data, k.data + k.size);
    out.key_offsets.push_back(out.key_data.size());
    if (r == FilterResult::Keep) {
      out.value_data.insert(out.value_data.end(), v.data, v.data + v.size);
    } else {
      out.value_data.insert(out.value_data.end(), trimmed.begin(), trimmed.end());
    }
    out.value_offsets.push_back(out.value_data.size());
  }
  return expired_count;
}

namespace {

template <class Offset>
ValuesFiltered filter_values_impl(const FilterSpec& spec, int64_t now, const uint8_t* data,
                                  size_t data_size, const Offset* offsets, size_t n, uint8_t* keep,
                                  Offset* out_offsets, uint8_t* out_data) {
  ValuesFiltered r;
  // The offsets come from a Python caller's Arrow buffers: check them before reading the bytes.
  if (n > 0 && (offsets[0] < 0 || static_cast<uint64_t>(offsets[n]) > data_size))
    throw std::invalid_argument("value offsets [" + std::to_string(offsets[0]) + ", " +
                                std::to_string(offsets[n]) + "] outside the " +
                                std::to_string(data_size) + "-byte data buffer");
  // All of them before a byte is read or written: an offset that only decreases later lets the
  // values before it run past the data, and past out_data (sized by the last offset).
  for (size_t i = 0; i < n; ++i)
    if (offsets[i + 1] < offsets[i])
      throw std::invalid_argument("value " + std::to_string(i) + ": decreasing offsets");
  std::vector<uint8_t> trimmed;
  out_offsets[0] = 0;
  for (size_t i = 0; i < n; ++i) {
    const Offset b = offsets[i], e = offsets[i + 1];
    const ByteView v{data + b, static_cast<size_t>(e - b)};
    FilterResult res;
    try {
      res = filter_value(spec, now, v, &trimmed, &r.expired);
    } catch (const std::invalid_argument& err) {
      throw std::invalid_argument("value " + std::to_string(i) + ": " + err.what());
    }
    // An empty list value holds nothing alive: dropped (expired count 0), as the full
    // snapshot filter drops it.
    keep[i] = res != FilterResult::Drop;
    if (res == FilterResult::Drop) continue;
    const uint8_t* src = res == FilterResult::Keep ? v.data : trimmed.data();
    const size_t size = res == FilterResult::Keep ? v.size : trimmed.size();
    if (size) std::memcpy(out_data + r.data_bytes, src, size);
    r.data_bytes += size;
    out_offsets[++r.kept] = static_cast<Offset>(r.data_bytes);
  }
  return r;
}

}  // namespace

ValuesFiltered filter_values(const FilterSpec& spec, int64_t now, const uint8_t* data,
                             size_t data_size, const int32_t* offsets, size_t n, uint8_t* keep,
                             int32_t* out_offsets, uint8_t* out_data) {
  return filter_values_impl(spec, now, data, data_size, offsets, n, keep, out_offsets, out_data);
}

ValuesFiltered filter_values(const FilterSpec& spec, int64_t now, const uint8_t* data,
                             size_t data_size, const int64_t* offsets, size_t n, uint8_t* keep,
                             int64_t* out_offsets, uint8_t* out_data) {
  return filter_values_impl(spec, now, data, data_size, offsets, n, keep, out_offsets, out_data);
}

CleanupStep cleanup_step(StateMap& map, uint64_t* cursor, size_t min_entries,
                         const FilterSpec& spec, int64_t now, SortedRun* scratch,
                         std::vector<std::string>* removed) {
  CleanupStep step;
  step.wrapped = map.collect_buckets(cursor, min_entries, scratch);
  std::vector<uint8_t> trimmed;
  step.visited = scratch->size();
  for (size_t i = 0; i < scratch->size(); ++i) {
    const ByteView k = scratch->key(i);
    const FilterResult r = filter_value(spec, now, scratch->value(i), &trimmed, &step.expired);
    if (r == FilterResult::Drop) {
      map.remove(k.data, k.size);
      ++step.written;
      if (removed != nullptr) removed->emplace_back(reinterpret_cast<const char*>(k.data), k.size);
    } else if (r == FilterResult::Trim) {
      uint8_t* dst = map.put(k.data, k.size, trimmed.size());
      std::memcpy(dst, trimmed.data(), trimmed.size());
      ++step.written;
    }
  }
  return step;
}

size_t restamp(StateMap& map, const FilterSpec& spec, int64_t from, int64_t to) {
  SortedRun all;
  uint64_t cursor = 0;
  map.collect_buckets(&cursor, SIZE_MAX, &all);
  std::vector<size_t> at;
  size_t rewritten = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const ByteView v = all.value(i);
    at.clear();
    for_each_element(spec, v, [&at](size_t, size_t end, bool has_ts) {
      if (has_ts) at.push_back(end - kTimestampBytes);
      return true;
    });
    bool hit = false;
    for (size_t p : at) hit = hit || load_timestamp(v.data + p) == from;
    if (!hit) continue;
    const ByteView k = all.key(i);
    uint8_t* dst = map.put(k.data, k.size, v.size);
    std::memcpy(dst, v.data, v.size);
    for (size_t p : at) {
      if (load_timestamp(dst + p) == from) {
        store_timestamp(dst + p, to);
        ++rewritten;
      }
    }
  }
  return rewritten;
}

bool migrate_value(const MigrationSpec& spec, ByteView v, std::vector<uint8_t>* out,
                   size_t* expired_count) {
  if (out == nullptr) throw std::invalid_argument("migrate_value needs `out`");
  if (!spec.add_timestamps && spec.ttl_ms <= 0) throw std::invalid_argument("TTL must be > 0 ms");
  size_t ignored = 0;
  if (expired_count == nullptr) expired_count = &ignored;
  out->clear();
  FilterSpec walk;
  walk.layout = spec.layout;
  walk.fixed_width = spec.fixed_width;
  uint8_t ts[kTimestampBytes];
  store_timestamp(ts, spec.ts);
  const bool add = spec.add_timestamps;
  bool any = false;
  // A throw midway leaves *out partial; callers discard it (migrate() never writes it).
  for_each_element(
      walk, v,
      [&](size_t start, size_t end, bool has_ts) {
        if (!add && !has_ts) broken("value shorter than its 8-byte timestamp", start);
        if (!add &&
            expired(load_timestamp(v.data + end - kTimestampBytes), spec.ttl_ms, spec.now)) {
          ++*expired_count;
          return true;
        }
        any = true;
        const size_t body_end = add ? end : end - kTimestampBytes;
        out->insert(out->end(), v.data + start, v.data + body_end);
        if (add) out->insert(out->end(), ts, ts + kTimestampBytes);
        return true;
      },
      !add);
  // Adding keeps every value (an empty list value stays empty, as the Python backend keeps
  // it); stripping removes the entry when nothing in it survived.
  return add || any;
}

MigrationResult migrate(StateTable& table, const MigrationSpec& spec) {
  if (!spec.add_timestamps && spec.ttl_ms <= 0) throw std::invalid_argument("TTL must be > 0 ms");
  std::vector<uint8_t> out;
  for (int32_t kg = table.kg_start(); kg <= table.kg_end(); ++kg) {
    try {
      table.map(kg).for_each([&](ByteView, ByteView v) { migrate_value(spec, v, &out); });
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("key group " + std::to_string(kg) + ": " + e.what());
    }
  }
  MigrationResult result;
  SortedRun all;
  for (int32_t kg = table.kg_start(); kg <= table.kg_end(); ++kg) {
    StateMap& map = table.map(kg);
    uint64_t cursor = 0;
    map.collect_buckets(&cursor, SIZE_MAX, &all);
    for (size_t i = 0; i < all.size(); ++i) {
      const ByteView k = all.key(i);
      if (migrate_value(spec, all.value(i), &out, &result.expired)) {
        uint8_t* dst = map.put(k.data, k.size, out.size());
        if (!out.empty()) std::memcpy(dst, out.data(), out.size());
        ++result.rewritten;
      } else {
        map.remove(k.data, k.size);
        ++result.removed;
      }
    }
  }
  return result;
}

CleanupStep cleanup_step(StateTable& table, TableCursor* cursor, size_t min_entries,
                         const FilterSpec& spec, int64_t now, SortedRun* scratch,
                         std::vector<std::string>* removed) {
  CleanupStep total;
  if (cursor->key_group < table.kg_start() || cursor->key_group > table.kg_end()) {
    cursor->key_group = table.kg_start();
    cursor->bucket = 0;
  }
  for (;;) {
    const size_t want = min_entries > total.visited ? min_entries - total.visited : 0;
    CleanupStep s = cleanup_step(table.map(cursor->key_group), &cursor->bucket, want, spec, now,
                                 scratch, removed);
    total.visited += s.visited;
    total.expired += s.expired;
    if (s.written != 0) {
      total.written += s.written;
      if (total.first_written_kg < 0) total.first_written_kg = cursor->key_group;
      total.last_written_kg = cursor->key_group;
    }
    if (s.wrapped) {
      if (cursor->key_group == table.kg_end()) {
        cursor->key_group = table.kg_start();
        total.wrapped = true;
        return total;
      }
      ++cursor->key_group;
    }
    if (total.visited >= min_entries) return total;
  }
}

bool cleanup_row(IncrementalCleanup& c) {
  StateTable& table = *c.table;
  c.first_written_kg = c.last_written_kg = -1;
  for (size_t i = 0; i < c.steps_per_row; ++i) {
    const bool from_start = c.cursor.key_group == table.kg_start() && c.cursor.bucket == 0;
    const bool indexed = c.index != nullptr || c.list_index != nullptr;
    CleanupStep s = cleanup_step(table, &c.cursor, c.cleanup_size, c.spec, c.now, &c.scratch,
                                 indexed ? &c.removed : nullptr);
    c.visited += s.visited;
    c.expired += s.expired;
    if (!c.removed.empty()) {
      if (c.index != nullptr)
        c.index->erase_entry_keys(c.removed, c.index_key, c.index_namespace,
                                  c.index_max_parallelism);
      if (c.list_index != nullptr) c.list_index->erase_entry_keys(c.removed, c.list_prefix_width);
      c.removed.clear();
    }
    if (s.written != 0) {
      if (c.first_written_kg < 0 || s.first_written_kg < c.first_written_kg)
        c.first_written_kg = s.first_written_kg;
      c.last_written_kg = std::max(c.last_written_kg, s.last_written_kg);
    }
    if (s.wrapped && from_start && s.visited == 0) break;  // an empty table
  }
  return c.first_written_kg >= 0;
}

}  // namespace ttl
}  // namespace statecore
