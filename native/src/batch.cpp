// Batch kernels over one StateTable (see batch.h for the contract). Every kernel runs in two
// passes: a validation pass that touches no state (Arrow structure, formats, lengths, null keys,
// key groups — computed once and kept in a per-thread scratch vector) and an apply pass that
// encodes each row's key into one reused buffer and reads/writes the row's key-group map.
#include "statecore/batch.h"

#include "batch_internal.h"

#include "statecore/detail/map_impl.h"

#include <algorithm>

#include <cstring>
#include <string>
#include <type_traits>

#include "statecore/hash.h"
#include "statecore/key_codec.h"
#include "statecore/key_columns.h"
#include "statecore/ttl.h"

namespace statecore {
namespace {

using namespace batch_detail;

template <class T>
inline T load_fixed(const uint8_t* p) {
  if constexpr (std::is_same<T, double>::value) return load_f64(p);
  else if constexpr (std::is_same<T, int32_t>::value) return load_i32(p);
  else if constexpr (std::is_same<T, bool>::value) return load_bool(p);
  else if constexpr (std::is_same<T, uint64_t>::value) return load_u64(p);
  else return load_i64(p);
}
template <class T>
inline void store_fixed(uint8_t* p, T v) {
  if constexpr (std::is_same<T, double>::value) store_f64(p, v);
  else if constexpr (std::is_same<T, int32_t>::value) store_i32(p, v);
  else if constexpr (std::is_same<T, bool>::value) store_bool(p, v);
  else if constexpr (std::is_same<T, uint64_t>::value) store_le64(p, v);
  else store_i64(p, v);
}
// The name of an integer accumulator type, for the Sum overflow message.
template <class T>
constexpr const char* int_type_name() {
  return std::is_same<T, int32_t>::value    ? "int32"
         : std::is_same<T, uint64_t>::value ? "uint64"
                                            : "int64";
}

// A null value row leaves the aggregate unchanged and outputs it (null if none); with TTL it is a
// TTL read (ttl_read: may remove, show stale once, renew).
template <class T>
void emit_current(StateMap& m, const RowKeys& rk, int64_t i, T* out, uint8_t* valid,
                  const TtlBatchSpec& ttl, int64_t* expired) {
  out[i] = T{};
  if (ttl.enabled) {
    valid[i] = ttl_read(m, rk, i, fixed_width<T>(ttl), ttl, expired,
                        [&](const uint8_t* p, size_t) { out[i] = load_fixed<T>(p); })
                   ? 1
                   : 0;
    return;
  }
  ByteView v;
  if (kernel_get(m, rk.hash(i, m), rk.data(), rk.size(), &v)) {
    if (v.size != stored_width<T>()) wrong_width(i, v.size, stored_width<T>());
    out[i] = load_fixed<T>(v.data);
    valid[i] = 1;
  } else {
    valid[i] = 0;
  }
}

// add_batch apply pass for accumulator type T. `value_at(values, i)` gives row i's (non-null)
// input; `combine(acc, x, &result)` folds one value and returns false when the result does not fit
// T. With TTL an expired aggregate is replaced by x (counted in *expired) and every write is
// stamped ttl.now; null rows are TTL reads (emit_current).
//
// kUndo (the integer Sums, whose overflow the reference backend rejects): a failed combine must
// leave the aggregates exactly as before the batch, and overflow can only be known while applying,
// so the writes are undone backwards before the error is raised. Rows are applied in order, so
// undoing them in reverse restores every entry, keys repeated in the batch included. Without TTL
// the log holds the rows that inserted their key, ascending: a Sum that did not overflow is
// invertible, so any other row's old aggregate is its output minus its value (a 16-byte {row,
// old} record for every row would cost the common, non-overflowing batch; a "was new" byte a row
// would be a byte store, which may alias anything the row loop keeps in memory). With TTL the old
// timestamp is not derivable, so the log keeps {row (complemented when the key was new), old
// value, old timestamp}. What null rows did (TTL removals and renewals) is not in the log and
// stays, as in the Python path (see batch.h "TTL"): undoing a later write on the same key
// restores the bytes as that null row left them.
// Without kUndo, combine never fails. The log is a raw per-thread buffer sized for the batch up
// front (vector::push_back re-read the thread_local's address, a __tls_get_addr call in a shared
// library, on every row), kept for the next batch unless a large batch grew it.
template <class Rec>
struct UndoLog {
  std::unique_ptr<Rec[]> rows;
  size_t capacity = 0;

  Rec* reserve(size_t n) {
    if (capacity < n) {
      rows.reset(new Rec[n]);
      capacity = n;
    }
    return rows.get();
  }
  void release() {
    constexpr size_t kKeepUndoRows = 65536;
    if (capacity > kKeepUndoRows) {
      rows.reset();
      capacity = 0;
    }
  }
};

template <class T>
struct TtlUndoRecord {
  int64_t row;  // ~row when the key was new (then `old` is meaningless)
  T old;
  int64_t old_ts;
};

// The kUndo rollback of fold_rows_with: restores the aggregates of rows [0, failed) from the
// undo log (`undo`, `undone` records: with TTL one a row, without TTL the rows that inserted).
// Out of line and given copies, not references, of what the row loop keeps in registers: a
// reference to a row loop's local handed to an outlined call makes the compiler reload that
// local every row.
template <class T, bool kTtl, class Rec, class ValueAt>
[[gnu::noinline, gnu::cold]] void undo_sum_rows(StateTable& table, const int32_t* kgs, RowKeys& rk,
                                                const ArrayView values, ValueAt value_at,
                                                const T* out, const Rec* undo, size_t undone,
                                                int64_t failed) {
  constexpr size_t kTs = stored_width<T>();
  auto restore = [&](int64_t row, bool existed, T v, int64_t ts) {
    rk.encode(row, kgs[row]);
    StateMap& um = table.map_unchecked(kgs[row]);
    if (!existed) {
      um.remove(rk.data(), rk.size());
      return;
    }
    size_t usz = 0;
    uint8_t* up = um.get_for_update(rk.data(), rk.size(), &usz);
    store_fixed<T>(up, v);
    if constexpr (kTtl) ttl::store_timestamp(up + kTs, ts);
  };
  if constexpr (kTtl) {
    (void)failed;
    for (const Rec* it = undo + undone; it-- != undo;)
      restore(it->row >= 0 ? it->row : ~it->row, it->row >= 0, it->old, it->old_ts);
  } else {
    using U = typename std::make_unsigned<T>::type;
    size_t ins = undone;  // undo[ins - 1]: the latest inserting row not undone yet
    for (int64_t r = failed; r-- > 0;) {
      if (!values.is_valid(r)) continue;
      const bool was_new = ins > 0 && undo[ins - 1] == r;
      if (was_new) --ins;
      // Exact: row r's add did not overflow, so out[r] - x wraps back to the old aggregate.
      const T prev = static_cast<T>(static_cast<U>(out[r]) - static_cast<U>(value_at(values, r)));
      restore(r, !was_new, prev, 0);
    }
  }
}

template <class T>
[[noreturn, gnu::noinline, gnu::cold]] void sum_overflows(int64_t row, T old, T x) {
  fail("values: " + row_str(row) + ": " + int_type_name<T>() + " sum overflows (" +
       std::to_string(old) + " + " + std::to_string(x) + "); the batch was not applied");
}

// The hot rows of fold_rows_with without TTL over a group of int64 keys with the void namespace
// (for_rows' `hot`): rows whose key group's lane is open and whose value is not null, that either
// update their key in place (an owned page, a value that combines, and the key already written
// in this map version or an epoch that logs no writes) or insert it (a free slot on an owned
// page, below the load threshold, in an epoch that logs no writes). An epoch logs no writes when
// it is a fresh map's first one or has given up its write log (StateMap::Impl::log_write: a
// Spark micro-batch that touches more than 1/16 of its keys does, after 1,024 records). Those
// are exactly what the row lambda does for such a row, without its calls: the slot stamped with
// the map version, no write log record, and an undo record only for an insert (a Sum row that
// did not insert is undone from its output).
// Every other row (lane not open, first write of the key in a logged epoch, null value,
// overflow, a missing page on the probe, an insert at the threshold) goes back to the lambda,
// which then does everything, its errors included.
// Out of line and without a call, so that the loop keeps its state in registers: in the
// lambda's loop, which has calls on its rarer paths (lane open, log_write, the general upsert),
// GCC keeps the hashes, the output pointer, the aggregate and the key words on the stack.
static_assert(detail::kFlatVarKeyClasses[0] > RowKeys::kInt64WordKey + 1,
              "FoldHotRows tells int64 lanes by key_size alone: no var lane has theirs");
template <class T, bool kUndo, class Combine, class ValueAt>
struct FoldHotRows {
  static constexpr bool kEnabled = true;
  Lanes::View lanes;
  const uint32_t* generation;  // the kernel's Lanes::generation_ptr()
  const int32_t* kgs;
  const ArrayView* values;
  Combine combine;
  ValueAt value_at;
  T* out;
  int64_t* undo;  // kUndo: the rows that inserted (fold_rows_with's log), *undone of them
  size_t* undone;
  bool all_valid;  // values.null_count() == 0

  template <uint32_t kWord>
  int64_t run(const RowKeys::GroupView& gv, int64_t g0, int64_t i, int64_t end) const {
    return all_valid ? rows<kWord, true>(*this, gv, g0, i, end)
                     : rows<kWord, false>(*this, gv, g0, i, end);
  }

  // kAllValid: the values have no nulls (no bitmap test a row). The kernel call's constants
  // are copied into locals: the loop's stores may alias `c`'s members, and GCC reloaded them
  // a row (the key groups' pointer, the lanes' base and epoch).
  template <uint32_t kWord, bool kAllValid>
  [[gnu::noinline]] static int64_t rows(const FoldHotRows& c, const RowKeys::GroupView& gv,
                                        int64_t g0, int64_t i, int64_t end) {
    constexpr uint32_t width = static_cast<uint32_t>(stored_width<T>());
    constexpr uint32_t suffix = kWord - 1;  // a lane's layout keeps the first prefix byte once
    // A slot's bytes (FlatLayout::slot_stride: meta, key suffix, value) in a lane that passes
    // the key and value size checks below.
    constexpr uint32_t stride = 4 + suffix + width;
    const Lanes::View lanes = c.lanes;
    const uint32_t epoch = c.lanes.epoch;
    const int32_t* const kgs = c.kgs;
    const uint8_t* const bytes = gv.bytes;
    const uint32_t* const hashes = gv.hashes;
    const ArrayView values = *c.values;
    T* const out = c.out;
    size_t undone = kUndo ? *c.undone : 0;
    // The group's home slots, unless a lane closed since they were computed.
    uint8_t* const* const slots = gv.generation == *c.generation ? gv.slots : nullptr;
    for (; i < end; ++i) {
      const detail::FlatLane& l = lanes.lane(kgs[i]);
      if (l.epoch != epoch || l.key_size != kWord || l.value_size != width ||
          (!kAllValid && !values.is_valid(i)))
        break;
      const size_t j = static_cast<size_t>(i - g0);
      const uint8_t* key = bytes + j * kWord;
      uint8_t* s = slots ? slots[j] : nullptr;
      if (s == nullptr) {
        s = l.home_slot<stride>(hashes[j]);
        if (s == nullptr) break;
      }
      size_t pi;
      const int r = l.find_key_from<uint64_t, stride, suffix>(s, hashes[j], key, &s, &pi);
      if (r < 0) break;
      if (const uint8_t o = l.owned[pi]; o != 1) {
        // A page written through for an unread snapshot (write_through.h): an update is
        // written in place, the slot saved first on the key's first write since the snapshot
        // while its page is not copied yet. Every other case goes to the lambda's lane.
        detail::WriteThrough* w = l.map->through.get();
        if (o != 2 || r != 1 || w == nullptr ||
            !w->owner_write<stride>(static_cast<uint32_t>(pi),
                                    static_cast<uint32_t>(s - l.pages[pi]->bytes()), s, l.version))
          break;
      }
      const T x = c.value_at(values, i);
      T acc;
      uint8_t* v;
      if (r == 1) {
        v = s + 4 + suffix;
        if (!c.combine(load_fixed<T>(v), x, &acc)) break;
        if (detail::load_u32(s) != l.version) {  // the key's first write in this version
          if (l.map->logs_writes()) break;       // to be logged: the lambda's
          detail::store_u32(s, l.version);
          ++l.map->epoch_writes;
        }
      } else {
        const StateMap::Impl& m = *l.map;
        if (m.size() >= m.threshold || m.logs_writes()) break;
        v = l.fill_new<uint64_t>(s, key);
        ++l.map->epoch_writes;
        if constexpr (kUndo) c.undo[undone++] = i;
        acc = x;
      }
      store_fixed<T>(v, acc);
      out[i] = acc;
    }
    if constexpr (kUndo) *c.undone = undone;
    return i;
  }
};

// kTtl is ttl.enabled as a template parameter: the rows' TTL tests read `ttl` through a
// reference the row's byte stores may alias, so a runtime flag would be reloaded and tested
// several times a row. `values_in` is copied for the same reason.
template <class T, bool kUndo, bool kTtl, class Combine, class ValueAt>
void fold_rows_with(StateTable& table, const int32_t* kgs, RowKeys& rk, const ArrayView& values_in,
                    Combine combine, ValueAt value_at, T* out, uint8_t* valid,
                    const TtlBatchSpec& ttl, int64_t* expired) {
  const ArrayView values = values_in;
  using Rec = typename std::conditional<kTtl, TtlUndoRecord<T>, int64_t>::type;
  thread_local UndoLog<Rec> undo_tls;
  UndoLog<Rec>& log = undo_tls;
  Rec* undo = kUndo ? log.reserve(static_cast<size_t>(values.length())) : nullptr;
  size_t undone = 0;  // records logged
  constexpr size_t width = kTtl ? stored_width<T>() + ttl::kTimestampBytes : stored_width<T>();
  constexpr size_t kTs = stored_width<T>();  // where the TTL timestamp starts
  const int64_t n = values.length();
  // Every row with a value outputs one; null rows (emit_current) overwrite theirs.
  if (n > 0) std::memset(valid, 1, static_cast<size_t>(n));
  Lanes lanes(table);
  auto row = [&](int64_t i, int32_t kg, const RowKey& k) SC_INLINE_ROW {
    if constexpr (kTtl) {
      if (ttl.cleanup != nullptr) cleanup_row(*ttl.cleanup, lanes);
    }
    if (!values.is_valid(i)) {
      rk.encode(i, kg);
      emit_current(table.map_unchecked(kg), rk, i, out, valid, ttl, expired);
      lanes.close(kg);
      return;
    }
    const T x = value_at(values, i);
    bool inserted = false;
    uint8_t* p = nullptr;
    if (detail::FlatLane* ln = lanes.get(kg, k.data, k.size, width, true))
      p = ln->upsert(k.hash, k.data, k.size, &inserted);  // a lane's values are `width` bytes
    if (p == nullptr) {
      size_t sz = width;
      p = table.map_unchecked(kg).upsert(k.hash, k.data, k.size, width, &sz, &inserted);
      lanes.close(kg);
      if (!inserted && sz != width) wrong_width(i, sz, width);
    }
    T acc;
    if (!inserted) {
      const T old = load_fixed<T>(p);
      const int64_t old_ts = kTtl ? ttl::load_timestamp(p + kTs) : 0;
      if (kTtl && ttl::expired(old_ts, ttl.ttl_ms, ttl.now)) {
        // Python `_unexpired`: counted, not removed; the write below overwrites it in place.
        ++*expired;
        acc = x;
      } else if (!combine(old, x, &acc)) {
        if constexpr (kUndo) {
          undo_sum_rows<T, kTtl>(table, kgs, rk, values, value_at, out, undo, undone, i);
          log.release();
        }
        sum_overflows<T>(i, old, x);
      }
      if constexpr (kUndo && kTtl) undo[undone++] = Rec{i, old, old_ts};
    } else {
      acc = x;
      if constexpr (kUndo && kTtl) undo[undone++] = Rec{~i, T{}, 0};
      if constexpr (kUndo && !kTtl) undo[undone++] = i;
    }
    store_fixed<T>(p, acc);
    if constexpr (kTtl) ttl::store_timestamp(p + kTs, ttl.now);
    out[i] = acc;
  };
  if constexpr (kTtl) {
    for_rows(rk, table, lanes, kgs, n, row);
  } else {
    const FoldHotRows<T, kUndo, Combine, ValueAt> hot{
        lanes.view(), lanes.generation_ptr(),  kgs, &values, combine, value_at, out, undo,
        &undone,      values.null_count() == 0};
    for_rows(rk, table, lanes, kgs, n, row, hot);
  }
  if constexpr (kUndo) log.release();
}

template <class T, bool kUndo, class Combine, class ValueAt>
void fold_rows(StateTable& table, const int32_t* kgs, RowKeys& rk, const ArrayView& values,
               Combine combine, ValueAt value_at, T* out, uint8_t* valid, const TtlBatchSpec& ttl,
               int64_t* expired) {
  if (ttl.enabled)
    fold_rows_with<T, kUndo, true>(table, kgs, rk, values, combine, value_at, out, valid, ttl,
                                   expired);
  else
    fold_rows_with<T, kUndo, false>(table, kgs, rk, values, combine, value_at, out, valid, ttl,
                                    expired);
}

template <class T, class ValueAt>
void fold_reducer(Reducer r, StateTable& table, const int32_t* kgs, RowKeys& rk,
                  const ArrayView& values, ValueAt value_at, T* out, uint8_t* valid,
                  const TtlBatchSpec& ttl, int64_t* expired) {
  // add_batch validation rejects Sum/Min/Max on bool (the reference does); not instantiating
  // them keeps bool arithmetic out of the kernels.
  switch (r) {
    case Reducer::Sum:
      if constexpr (std::is_same<T, bool>::value) {
        break;
      } else if constexpr (std::is_integral<T>::value) {
        fold_rows<T, true>(
            table, kgs, rk, values,
            [](T a, T b, T* res) { return !__builtin_add_overflow(a, b, res); }, value_at, out,
            valid, ttl, expired);
      } else {
        fold_rows<T, false>(
            table, kgs, rk, values, [](T a, T b, T* res) { return *res = a + b, true; }, value_at,
            out, valid, ttl, expired);
      }
      break;
    case Reducer::Min:
      if constexpr (std::is_same<T, bool>::value) break;
      else
        fold_rows<T, false>(
            table, kgs, rk, values,
            [](T acc, T v, T* res) { return *res = v < acc ? v : acc, true; }, value_at, out, valid,
            ttl, expired);
      break;
    case Reducer::Max:
      if constexpr (std::is_same<T, bool>::value) break;
      else
        fold_rows<T, false>(
            table, kgs, rk, values,
            [](T acc, T v, T* res) { return *res = v > acc ? v : acc, true; }, value_at, out, valid,
            ttl, expired);
      break;
    case Reducer::First:
      fold_rows<T, false>(
          table, kgs, rk, values, [](T acc, T, T* res) { return *res = acc, true; }, value_at, out,
          valid, ttl, expired);
      break;
    case Reducer::Last:
      fold_rows<T, false>(
          table, kgs, rk, values, [](T, T v, T* res) { return *res = v, true; }, value_at, out,
          valid, ttl, expired);
      break;
    case Reducer::Count: break;  // handled by the caller (different value input)
  }
}

// add_batch's checks of the value type, reducer and values (formats, length).
void check_add_values(const ValueSpec& value_type, Reducer reducer, const KeyArrays& keys,
                      const ArrayView& values) {
  const ValueType t = value_type.type;
  if (reducer == Reducer::Count) {
    if (t != ValueType::Int64)
      fail(std::string("add_batch: a Count state holds int64 counts, not ") +
           value_type_name(value_type));
    if (values.length() != keys.length())
      fail("values: length " + std::to_string(values.length()) + " differs from keys length " +
           std::to_string(keys.length()));
    return;
  }
  if (reducer == Reducer::Sum && t != ValueType::Int64 && t != ValueType::UInt64 &&
      t != ValueType::Float64 && t != ValueType::Int32)
    fail("add_batch: Sum needs an int64, uint64, float64 or int32 state, not " +
         value_type_name(value_type));
  const bool ordered = reducer == Reducer::Min || reducer == Reducer::Max;
  if (!is_fixed(value_type) || (ordered && t == ValueType::Bool))
    fail(std::string("add_batch: ") +
         (ordered ? "Min/Max need a fixed-width state other than bool, not "
                  : "First/Last need a fixed-width state, not ") +
         value_type_name(value_type));
  check_values(value_type, keys, values);
}

// A null value row of a FixedSizeBinary add_batch: emit_current over `w`-byte values.
void emit_current_bytes(StateMap& m, const RowKeys& rk, int64_t i, size_t w, uint8_t* out,
                        uint8_t* valid, const TtlBatchSpec& ttl, int64_t* expired) {
  std::memset(out, 0, w);
  if (ttl.enabled) {
    valid[i] = ttl_read(m, rk, i, fixed_width(w, ttl), ttl, expired,
                        [&](const uint8_t* p, size_t) { std::memcpy(out, p, w); })
                   ? 1
                   : 0;
    return;
  }
  ByteView v;
  if (kernel_get(m, rk.hash(i, m), rk.data(), rk.size(), &v)) {
    if (v.size != w) wrong_width(i, v.size, w);
    std::memcpy(out, v.data, w);
    valid[i] = 1;
  } else {
    valid[i] = 0;
  }
}

// add_batch apply pass of a FixedSizeBinary state: fold_rows over `w`-byte values, whose
// reducers (First, Last, Min, Max by memcmp) never fail, so there is no undo log. Row i's
// output is out[i * w, (i + 1) * w).
void fold_bytes(Reducer r, StateTable& table, const int32_t* kgs, RowKeys& rk,
                const ArrayView& values, size_t w, uint8_t* out, uint8_t* valid,
                const TtlBatchSpec& ttl, int64_t* expired) {
  const size_t width = fixed_width(w, ttl);
  const int64_t n = values.length();
  for (int64_t i = 0; i < n; ++i) {
    if (ttl.cleanup != nullptr) ttl::cleanup_row(*ttl.cleanup);
    rk.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    uint8_t* o = out + static_cast<size_t>(i) * w;
    if (!values.is_valid(i)) {
      emit_current_bytes(m, rk, i, w, o, valid, ttl, expired);
      continue;
    }
    const uint8_t* x = values.fixed_at(i);
    size_t sz = 0;
    bool inserted = false;
    const uint32_t h = rk.hash(i, m);
    uint8_t* p = m.engine().flat_fast_upsert(h, rk.data(), rk.size(), width, &sz, &inserted);
    if (p == nullptr) p = m.upsert(h, rk.data(), rk.size(), width, &sz, &inserted);
    bool take = true;
    if (!inserted) {
      if (sz != width) wrong_width(i, sz, width);
      if (ttl.enabled && ttl::expired(ttl::load_timestamp(p + w), ttl.ttl_ms, ttl.now)) {
        ++*expired;  // Python `_unexpired`: counted, then overwritten in place
      } else if (r == Reducer::First) {
        take = false;
      } else if (r == Reducer::Min || r == Reducer::Max) {
        const int c = std::memcmp(x, p, w);
        take = r == Reducer::Min ? c < 0 : c > 0;
      }
    }
    if (take) std::memcpy(p, x, w);
    if (ttl.enabled) ttl::store_timestamp(p + w, ttl.now);
    std::memcpy(o, p, w);
    valid[i] = 1;
  }
}

}  // namespace

size_t value_width(const ValueSpec& t) {
  switch (t.type) {
    case ValueType::Int64:
    case ValueType::Float64:
    case ValueType::UInt64:
    case ValueType::Timestamp: return 8;
    case ValueType::Int32: return 4;
    case ValueType::Bool: return 1;
    case ValueType::FixedSizeBinary: return t.width > 0 ? static_cast<size_t>(t.width) : 0;
    case ValueType::String:
    case ValueType::Binary: return 0;
  }
  return 0;
}

void validate_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                    const ValueSpec& value_type, BatchOp op, Reducer reducer, ArrowInput values_in,
                    const TtlBatchSpec& ttl) {
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  if (op == BatchOp::Put) {
    const ArrayView values = make_view(values_in, "values");
    check_values(value_type, keys, values);
  } else if (op == BatchOp::Add) {
    const ArrayView values = make_view(values_in, "values");
    check_add_values(value_type, reducer, keys, values);
  }
  check_ttl(ttl);
  validate_keys(table, spec, keys);
}

void get_batch_fixed(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                     const ValueSpec& value_type, void* out_values, uint8_t* out_valid,
                     const TtlBatchSpec& ttl, int64_t* expired) {
  int64_t local = 0;
  expired = expired_sink(expired, &local);
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  if (!is_fixed(value_type))
    fail(std::string("get_batch_fixed: value type ") + value_type_name(value_type) +
         " is not fixed-width (use get_batch_var)");
  check_ttl(ttl);
  const int32_t* kgs = validate_keys(table, spec, keys);
  const int64_t n = keys.length();
  if (n > 0 && (out_values == nullptr || out_valid == nullptr))
    fail("get_batch_fixed: null output buffer");
  RowKeys rk(spec, keys, table, kgs);
  const size_t user_width = value_width(value_type);
  if (ttl.enabled) {
    const size_t width = fixed_width(user_width, ttl);
    for (int64_t i = 0; i < n; ++i) {
      if (ttl.cleanup != nullptr) ttl::cleanup_row(*ttl.cleanup);
      rk.ahead(i);
      rk.encode(i, kgs[i]);
      out_fixed(value_type, out_values, i, nullptr);
      out_valid[i] =
          ttl_read(table.map_unchecked(kgs[i]), rk, i, width, ttl, expired,
                   [&](const uint8_t* p, size_t) { out_fixed(value_type, out_values, i, p); })
              ? 1
              : 0;
    }
    return;
  }
  Lanes lanes(table);
  for_rows(rk, table, lanes, kgs, n, [&](int64_t i, int32_t kg, const RowKey& k) SC_INLINE_ROW {
    const uint8_t* p;
    if (detail::FlatLane* ln = lanes.get(kg, k.data, k.size, user_width, false)) {
      p = ln->get(k.hash, k.data, k.size);
    } else {
      ByteView v;
      const bool found = kernel_get(table.map_unchecked(kg), k.hash, k.data, k.size, &v);
      if (found && v.size != user_width) wrong_width(i, v.size, user_width);
      p = found ? v.data : nullptr;
    }
    out_fixed(value_type, out_values, i, p);
    out_valid[i] = p != nullptr ? 1 : 0;
  });
}

void get_batch_var(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
                   const ValueSpec& value_type, std::vector<int64_t>& offsets,
                   std::vector<uint8_t>& data, uint8_t* out_valid, const TtlBatchSpec& ttl,
                   int64_t* expired) {
  int64_t local = 0;
  expired = expired_sink(expired, &local);
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  if (value_type.type != ValueType::String && value_type.type != ValueType::Binary)
    fail(std::string("get_batch_var: value type ") + value_type_name(value_type) +
         " is not variable-width (use get_batch_fixed)");
  check_ttl(ttl);
  const int32_t* kgs = validate_keys(table, spec, keys);
  const int64_t n = keys.length();
  if (n > 0 && out_valid == nullptr) fail("get_batch_var: null validity output buffer");
  offsets.resize(static_cast<size_t>(n) + 1);
  data.clear();
  offsets[0] = 0;
  RowKeys rk(spec, keys, table, kgs);
  // Appends into a buffer trimmed at the end: vector::insert per row would dominate a short
  // binary get. A growth assumes the remaining rows are as large as this one (values of one
  // size, the common case, grow it once) and at least doubles; resize() zero-fills, once per
  // growth.
  size_t used = 0;
  int64_t row = 0;
  auto append = [&](const uint8_t* p, size_t sz) {
    if (used + sz > data.size())
      data.resize(
          std::max({used + sz * static_cast<size_t>(n - row), 2 * data.size(), size_t(4096)}));
    if (sz) std::memcpy(data.data() + used, p, sz);
    used += sz;
  };
  for (int64_t i = 0; i < n; ++i) {
    if (ttl.cleanup != nullptr) ttl::cleanup_row(*ttl.cleanup);
    row = i;
    rk.ahead(i);
    rk.encode(i, kgs[i]);
    StateMap& m = table.map_unchecked(kgs[i]);
    bool found;
    if (ttl.enabled) {
      found = ttl_read(m, rk, i, 0, ttl, expired, append);
    } else {
      ByteView v;
      found = kernel_get(m, rk.hash(i, m), rk.data(), rk.size(), &v);
      if (found) append(v.data, v.size);
    }
    out_valid[i] = found ? 1 : 0;
    offsets[i + 1] = static_cast<int64_t>(used);
  }
  data.resize(used);
}

void put_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
               const ValueSpec& value_type, ArrowInput values_in, const TtlBatchSpec& ttl) {
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  const ArrayView values = make_view(values_in, "values");
  check_values(value_type, keys, values);
  check_ttl(ttl);
  const int32_t* kgs = validate_keys(table, spec, keys);
  const int64_t n = keys.length();
  const size_t suffix = ttl.enabled ? ttl::kTimestampBytes : 0;
  RowKeys rk(spec, keys, table, kgs);
  Lanes lanes(table);
  ttl::IncrementalCleanup* const cleanup = ttl.cleanup;  // a local: row stores may alias `ttl`
  for_rows(rk, table, lanes, kgs, n, [&](int64_t i, int32_t kg, const RowKey& k) SC_INLINE_ROW {
    if (cleanup != nullptr) cleanup_row(*cleanup, lanes);
    if (!values.is_valid(i)) {
      table.map_unchecked(kg).remove(k.data, k.size);
      lanes.close(kg);
      return;
    }
    uint8_t* dst;
    size_t sz = 8;
    switch (value_type.type) {
      case ValueType::Int64:
      case ValueType::Timestamp:
        dst = kernel_put(table, lanes, kg, k, 8 + suffix);
        store_i64(dst, values.int64_at(i));
        break;
      case ValueType::UInt64:
        dst = kernel_put(table, lanes, kg, k, 8 + suffix);
        store_le64(dst, values.uint64_at(i));
        break;
      case ValueType::FixedSizeBinary:
        sz = static_cast<size_t>(value_type.width);
        dst = kernel_put(table, lanes, kg, k, sz + suffix);
        std::memcpy(dst, values.fixed_at(i), sz);
        break;
      case ValueType::Float64:
        dst = kernel_put(table, lanes, kg, k, 8 + suffix);
        store_f64(dst, values.float64_at(i));
        break;
      case ValueType::Int32:
        sz = 4;
        dst = kernel_put(table, lanes, kg, k, 4 + suffix);
        store_i32(dst, values.int32_at(i));
        break;
      case ValueType::Bool:
        sz = 1;
        dst = kernel_put(table, lanes, kg, k, 1 + suffix);
        store_bool(dst, values.bool_at(i));
        break;
      case ValueType::String:
      case ValueType::Binary:
      default: {
        const uint8_t* src = values.bytes_at(i, &sz);
        dst = kernel_put(table, lanes, kg, k, sz + suffix);
        if (sz > 0) std::memcpy(dst, src, sz);
        break;
      }
    }
    if (ttl.enabled) ttl::store_timestamp(dst + sz, ttl.now);
  });
}

void add_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys_in,
               const ValueSpec& value_type, Reducer reducer, ArrowInput values_in, void* out_values,
               uint8_t* out_valid, const TtlBatchSpec& ttl, int64_t* expired) {
  int64_t local = 0;
  expired = expired_sink(expired, &local);
  check_spec(value_type);
  const KeyArrays keys = make_keys(spec, keys_in);
  const ArrayView values = make_view(values_in, "values");
  check_add_values(value_type, reducer, keys, values);
  check_ttl(ttl);
  const int32_t* kgs = validate_keys(table, spec, keys);
  const int64_t n = keys.length();
  if (n > 0 && (out_values == nullptr || out_valid == nullptr))
    fail("add_batch: null output buffer");
  RowKeys rk(spec, keys, table, kgs);
  if (reducer == Reducer::Count) {
    fold_rows<int64_t, false>(
        table, kgs, rk, values,
        [](int64_t a, int64_t b, int64_t* res) {
          *res = static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
          return true;
        },
        [](const ArrayView&, int64_t) { return int64_t{1}; }, static_cast<int64_t*>(out_values),
        out_valid, ttl, expired);
  } else if (value_type.type == ValueType::Int64 || value_type.type == ValueType::Timestamp) {
    // A timestamp is its int64 count of units (Sum was rejected above).
    fold_reducer<int64_t>(
        reducer, table, kgs, rk, values,
        [](const ArrayView& v, int64_t i) { return v.int64_at(i); },
        static_cast<int64_t*>(out_values), out_valid, ttl, expired);
  } else if (value_type.type == ValueType::UInt64) {
    fold_reducer<uint64_t>(
        reducer, table, kgs, rk, values,
        [](const ArrayView& v, int64_t i) { return v.uint64_at(i); },
        static_cast<uint64_t*>(out_values), out_valid, ttl, expired);
  } else if (value_type.type == ValueType::FixedSizeBinary) {
    fold_bytes(reducer, table, kgs, rk, values, static_cast<size_t>(value_type.width),
               static_cast<uint8_t*>(out_values), out_valid, ttl, expired);
  } else if (value_type.type == ValueType::Int32) {
    fold_reducer<int32_t>(
        reducer, table, kgs, rk, values,
        [](const ArrayView& v, int64_t i) { return v.int32_at(i); },
        static_cast<int32_t*>(out_values), out_valid, ttl, expired);
  } else if (value_type.type == ValueType::Bool) {
    // bool is one byte holding 0/1 on every platform the build supports (checked below), so the
    // caller's uint8_t[n] output is written as bool[n].
    static_assert(sizeof(bool) == 1, "bool outputs are written into uint8_t buffers");
    fold_reducer<bool>(
        reducer, table, kgs, rk, values, [](const ArrayView& v, int64_t i) { return v.bool_at(i); },
        static_cast<bool*>(out_values), out_valid, ttl, expired);
  } else {
    fold_reducer<double>(
        reducer, table, kgs, rk, values,
        [](const ArrayView& v, int64_t i) { return v.float64_at(i); },
        static_cast<double*>(out_values), out_valid, ttl, expired);
  }
}

}  // namespace statecore
