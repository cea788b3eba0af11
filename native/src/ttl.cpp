#include "statecore/ttl.h"

#include <string>

#include "statecore/key_codec.h"

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

FilterResult filter_list(const FilterSpec& spec, int64_t now, ByteView v,
                         std::vector<uint8_t>* out) {
  size_t pos = 0;
  while (pos < v.size) {
    const size_t start = pos;
    uint64_t n = spec.fixed_width;
    if (n == 0) pos = varlen_at(v, pos, &n);
    if (n > v.size - pos || v.size - pos - n < kTimestampBytes) broken("truncated list element", start);
    const size_t end = pos + n + kTimestampBytes;
    if (!expired(load_timestamp(v.data + end - kTimestampBytes), spec.ttl_ms, now)) {
      if (start == 0) return FilterResult::Keep;
      out->assign(v.data + start, v.data + v.size);
      return FilterResult::Trim;
    }
    pos = end;
  }
  return FilterResult::Drop;
}

FilterResult filter_map(const FilterSpec& spec, int64_t now, ByteView v,
                        std::vector<uint8_t>* out) {
  size_t pos = 0;
  bool dropped = false, kept = false;
  while (pos < v.size) {
    const size_t start = pos;
    uint64_t n = 0, m = 0;
    pos = varlen_at(v, pos, &n);
    if (n > v.size - pos) broken("truncated map user key", start);
    pos = varlen_at(v, pos + n, &m);
    if (m > v.size - pos) broken("truncated map user value", start);
    const size_t end = pos + m;
    if (m >= kTimestampBytes &&
        expired(load_timestamp(v.data + end - kTimestampBytes), spec.ttl_ms, now)) {
      if (!dropped) out->assign(v.data, v.data + start);  // everything before was kept
      dropped = true;
    } else {
      kept = true;
      if (dropped) out->insert(out->end(), v.data + start, v.data + end);
    }
    pos = end;
  }
  if (!kept) return FilterResult::Drop;  // also an empty map, as the Python filter
  return dropped ? FilterResult::Trim : FilterResult::Keep;
}

}  // namespace

FilterResult filter_value(const FilterSpec& spec, int64_t now, ByteView value,
                          std::vector<uint8_t>* out) {
  if (spec.ttl_ms <= 0) throw std::invalid_argument("TTL must be > 0 ms");
  if (out) out->clear();
  switch (spec.layout) {
    case Layout::Value:
      if (value.size < kTimestampBytes) return FilterResult::Keep;
      return expired(load_timestamp(value.data + value.size - kTimestampBytes), spec.ttl_ms, now)
                 ? FilterResult::Drop
                 : FilterResult::Keep;
    case Layout::List:
    case Layout::Map: {
      if (out == nullptr) throw std::invalid_argument("filter_value: a list/map filter needs `out`");
      return spec.layout == Layout::List ? filter_list(spec, now, value, out)
                                         : filter_map(spec, now, value, out);
    }
  }
  throw std::invalid_argument("filter_value: unknown layout");
}

}  // namespace ttl
}  // namespace statecore
