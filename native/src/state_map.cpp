// StateMap / MapSnapshot (chained engine and the engine-independent parts; the flat engine is
// flat_map.cpp). Invariants: StateMap's class comment; design: docs/state-map.md.
#include "statecore/state_map.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "statecore/detail/key_hash.h"
#include "statecore/detail/map_impl.h"

namespace statecore {

using detail::Directory;
using detail::Entry;
using detail::FlatDirectory;
using detail::FlatLayout;
using detail::Page;

namespace {

constexpr size_t kMinTransferredPerStep = 4;  // Flink MIN_TRANSFERRED_PER_INCREMENTAL_REHASH
constexpr size_t kMaxBucketVisitsPerStep = 64;

size_t threshold_for(size_t capacity) { return (capacity >> 1) + (capacity >> 2); }

void check_buffer(const uint8_t* p, size_t n, const char* what) {
  if (n > std::numeric_limits<uint32_t>::max()) {
    throw std::length_error(std::string("StateMap: ") + what + " larger than 4 GiB - 1 bytes");
  }
  if (p == nullptr && n != 0) {
    throw std::invalid_argument(std::string("StateMap: null ") + what +
                                " pointer with nonzero size");
  }
}

std::atomic<int> g_default_engine{-1};  // -1: not read from the environment yet

MapEngine resolve(MapEngine e) { return e == MapEngine::Default ? default_map_engine() : e; }

}  // namespace

void set_default_map_engine(MapEngine engine) {
  g_default_engine.store(engine == MapEngine::Default ? -1 : static_cast<int>(engine));
}

MapEngine default_map_engine() {
  int e = g_default_engine.load();
  if (e < 0) {
    const char* env = std::getenv("STATECORE_MAP_ENGINE");
    e = static_cast<int>(env && std::strcmp(env, "chained") == 0 ? MapEngine::Chained
                                                                 : MapEngine::Flat);
    int unset = -1;
    g_default_engine.compare_exchange_strong(unset, e);
    e = g_default_engine.load();
  }
  return static_cast<MapEngine>(e);
}

// ------------------------------------------------------------------------------------------------
// Impl
// ------------------------------------------------------------------------------------------------

StateMap::Impl::Impl(KeyHashFunction h, bool start_flat)
    : hash_fn(h), flat(start_flat), threshold(threshold_for(detail::kMinCapacity)) {
  if (flat) {
    fprimary = FlatDirectory::make(detail::kMinCapacity, FlatLayout{});
  } else {
    primary = Directory::make(detail::kMinCapacity);
  }
}

StateMap::Impl::~Impl() {
  // Only reached when no snapshot holds this state any more: nothing is needed.
  for (const Retired& r : retired) Entry::destroy(r.entry);
  Directory::unref(primary);
  Directory::unref(rehash_table);
  FlatDirectory::unref(fprimary);
  FlatDirectory::unref(frehash);
}

void StateMap::Impl::begin_op(bool rehash_step_allowed) {
  if (sweep_pending.load(std::memory_order_relaxed) &&
      sweep_pending.exchange(false, std::memory_order_acq_rel)) {
    std::lock_guard<std::mutex> lock(mu);
    sweep_locked();
  }
  req = required.load(std::memory_order_acquire);
  if (!rehash_step_allowed) return;
  if (flat) {
    if (frehash) flat_rehash_step();
  } else if (rehash_table) {
    rehash_step();
  }
}

void StateMap::Impl::begin_batch_write() {
  if (flat && version > detail::kFlatMaxVersion) unflatten();
  if (flat && frehash) {
    begin_op(false);
    flat_finish_rehash();
  }
  while (!flat && rehash_table) begin_op(true);
}

void StateMap::Impl::start_rehash() {
  size_t cap = primary->capacity;
  if (cap >= detail::kMaxCapacity) return;  // as Flink: stay at the maximum, overloaded
  rehash_table = Directory::make(cap * 2);
  rehash_index = 0;
  threshold = threshold_for(cap * 2);
  ++stats.rehashes;
}

void StateMap::Impl::rehash_step() {
  Directory* old = primary;
  const size_t old_cap = old->capacity;
  const size_t new_mask = rehash_table->capacity - 1;
  size_t rh = rehash_index;
  size_t transferred = 0;
  size_t visits = 0;
  while (transferred < kMinTransferredPerStep && visits < kMaxBucketVisitsPerStep && rh < old_cap) {
    ++visits;
    Page* p = old->pages()[rh >> old->page_shift];
    if (!p) {
      rh = (rh | old->page_mask()) + 1;
      continue;
    }
    Entry* e = p->slots()[rh & old->page_mask()];
    while (e) {
      if (e->version < req) {
        Entry* c = copy_entry(e);
        dispose(e);
        e = c;
      }
      Entry* n = e->next;
      Entry** slot = slot_for_write(&rehash_table, e->hash & new_mask);
      e->next = *slot;
      *slot = e;
      e = n;
      ++transferred;
    }
    ++rh;
  }
  primary_size -= transferred;
  rehash_size += transferred;
  rehash_index = rh;
  if (rh == old_cap) {
    Directory::unref(primary);
    primary = rehash_table;
    rehash_table = nullptr;
    primary_size += rehash_size;
    rehash_size = 0;
    rehash_index = 0;
  }
}

StateMap::Impl::Location StateMap::Impl::locate_hashed(uint32_t h, const uint8_t* key, size_t ks) {
  begin_op(true);
  Location at;
  at.h = h;
  at.table = table_for(at.h, &at.bucket);
  at.entry = find(*at.table, at.bucket, at.h, key, ks);
  return at;
}

Entry* StateMap::Impl::own_for_write(const Location& at) {
  Entry* e = at.entry;
  if (e->version >= req) return e;
  Entry** link = writable_link(at.table, at.bucket, e);
  Entry* c = copy_entry(e);
  *link = c;
  dispose(e);
  return c;
}

Directory** StateMap::Impl::table_for(uint32_t h, size_t* bucket) {
  size_t b = h & (primary->capacity - 1);
  if (rehash_table && b < rehash_index) {
    *bucket = h & (rehash_table->capacity - 1);
    return &rehash_table;
  }
  *bucket = b;
  return &primary;
}

Entry* StateMap::Impl::find(const Directory* d, size_t bucket, uint32_t h, const uint8_t* key,
                            size_t ks) const {
  for (Entry* e = d->head(bucket); e; e = e->next) {
    if (e->matches(h, key, ks)) return e;
  }
  return nullptr;
}

Entry** StateMap::Impl::slot_for_write(Directory** table, size_t bucket) {
  Directory* d = *table;
  if (d->refs.load(std::memory_order_acquire) != 1) {
    Directory* c = Directory::make_copy(d);
    Directory::unref(d);
    *table = d = c;
    ++stats.directory_copies;
  }
  Page*& p = d->pages()[bucket >> d->page_shift];
  if (!p) {
    p = Page::make_empty(static_cast<uint32_t>(d->page_mask() + 1));
  } else if (p->refs.load(std::memory_order_acquire) != 1) {
    Page* c = Page::make_copy(p);
    Page::unref(p);
    p = c;
    ++stats.page_copies;
  }
  return &p->slots()[bucket & d->page_mask()];
}

Entry* StateMap::Impl::copy_entry(const Entry* e) {
  ++stats.entry_copies;
  return Entry::make_copy(e, version);
}

Entry** StateMap::Impl::writable_link(Directory** table, size_t bucket, Entry* target) {
  Entry* cur = (*table)->head(bucket);
  if (cur == target) return slot_for_write(table, bucket);
  if (cur->version < req) {
    Entry* c = copy_entry(cur);
    *slot_for_write(table, bucket) = c;
    dispose(cur);
    cur = c;
  }
  // `cur` is writable from here on: either new since the last snapshot or a fresh copy.
  while (cur->next != target) {
    Entry* n = cur->next;
    if (n->version < req) {
      Entry* c = copy_entry(n);
      cur->next = c;
      dispose(n);
      cur = c;
    } else {
      cur = n;
    }
  }
  return &cur->next;
}

uint64_t StateMap::Impl::advance_version() {
  if (flat && version >= detail::kFlatMaxVersion) unflatten();  // slots reserve two meta values
  if (version >= std::numeric_limits<uint32_t>::max()) {
    throw std::overflow_error("StateMap: version counter exhausted (2^32 - 1 snapshots/rebases)");
  }
  return ++version;
}

void StateMap::Impl::dispose(Entry* e) {
  if (e->version < req) {
    retired.push_back({e, version});
    ++stats.entries_retired;
  } else {
    Entry::destroy(e);
  }
}

void StateMap::Impl::sweep_locked() {
  const std::vector<uint64_t>& live = live_versions;
  size_t kept = 0;
  for (size_t i = 0; i < retired.size(); ++i) {
    const Retired& r = retired[i];
    auto it = std::upper_bound(live.begin(), live.end(), r.entry->version);
    if (it != live.end() && *it <= r.unlinked_at) {
      retired[kept++] = r;
    } else {
      Entry::destroy(r.entry);
      ++stats.retired_freed;
    }
  }
  retired.resize(kept);
}

void StateMap::Impl::release_snapshot(uint64_t v) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = std::lower_bound(live_versions.begin(), live_versions.end(), v);
  if (it != live_versions.end() && *it == v) live_versions.erase(it);
  required.store(live_versions.empty() ? 0 : live_versions.back(), std::memory_order_release);
  if (orphaned) {
    sweep_locked();
  } else {
    sweep_pending.store(true, std::memory_order_release);
  }
}

void StateMap::Impl::reset_tables(size_t capacity) {
  Directory::unref(primary);
  Directory::unref(rehash_table);
  primary = Directory::make(capacity);
  rehash_table = nullptr;
  rehash_index = 0;
  primary_size = rehash_size = 0;
  live_bytes = 0;
  threshold = threshold_for(capacity);
}

void StateMap::Impl::teardown() {
  begin_op(false);
  FlatDirectory::unref(fprimary);
  FlatDirectory::unref(frehash);
  fprimary = frehash = nullptr;
  visit_live([this](Entry* e) { dispose(e); });
  Directory::unref(primary);
  Directory::unref(rehash_table);
  primary = rehash_table = nullptr;
  primary_size = rehash_size = 0;
  live_bytes = 0;
  std::lock_guard<std::mutex> lock(mu);
  orphaned = true;
  sweep_locked();
}

// ------------------------------------------------------------------------------------------------
// StateMap
// ------------------------------------------------------------------------------------------------

StateMap::StateMap(KeyHashFunction hash, MapEngine engine)
    : impl_(std::make_shared<Impl>(hash, resolve(engine) == MapEngine::Flat)) {}

StateMap::~StateMap() {
  if (impl_) impl_->teardown();
}

size_t StateMap::size() const { return impl_->size(); }
size_t StateMap::bytes() const { return impl_->live_bytes; }

bool StateMap::get(const uint8_t* key, size_t key_size, ByteView* out) {
  check_buffer(key, key_size, "key");
  return get_hashed(impl_->hash_of(key, key_size), key, key_size, out);
}

uint32_t StateMap::hash(const uint8_t* key, size_t key_size) const {
  check_buffer(key, key_size, "key");
  return impl_->hash_of(key, key_size);
}

// Impl::table_for hands out a writable table pointer for updates; prefetching only reads.
static const Directory* prefetch_table(const StateMap::Impl& m, uint32_t h, size_t* bucket) {
  size_t b = h & (m.primary->capacity - 1);
  if (m.rehash_table && b < m.rehash_index) {
    *bucket = h & (m.rehash_table->capacity - 1);
    return m.rehash_table;
  }
  *bucket = b;
  return m.primary;
}

void StateMap::prefetch_bucket(uint32_t h) const {
  const Impl& m = *impl_;
  if (m.flat) {
    // Into L1 (locality 3), with write intent: the slot is about to be read and usually written.
    // The whole table is often in L3 already, where a locality-1 prefetch does nothing and every
    // row would stall on the meta load.
    m.prefetch(h);
    return;
  }
  size_t b;
  const Directory* d = prefetch_table(*impl_, h, &b);
  const Page* p = d->pages()[b >> d->page_shift];
  if (p) __builtin_prefetch(&p->slots()[b & d->page_mask()], 0, 3);  // into L1: see above
}

void StateMap::prefetch_entry(uint32_t h) const {
  if (impl_->flat) return;  // the slot is the entry: prefetch_bucket fetched it
  size_t b;
  const Directory* d = prefetch_table(*impl_, h, &b);
  const Entry* e = d->head(b);
  if (e) {  // header and key are read, the value usually written
    __builtin_prefetch(e, 1, 3);
    __builtin_prefetch(reinterpret_cast<const char*>(e) + 64, 1, 3);
  }
}

uint8_t* StateMap::put(const uint8_t* key, size_t key_size, size_t value_size) {
  check_buffer(key, key_size, "key");
  if (value_size > std::numeric_limits<uint32_t>::max()) {
    throw std::length_error("StateMap: value larger than 4 GiB - 1 bytes");
  }
  Impl& m = *impl_;
  if (m.flat) {
    if (m.version > detail::kFlatMaxVersion) m.unflatten();
  }
  if (m.flat) {
    uint8_t* value;
    const Impl::FlatLocation at = m.flat_locate(m.hash_of(key, key_size), key, key_size);
    if (m.flat_put(at, key, key_size, value_size, &value)) return value;
  }
  const Impl::Location at = m.locate(key, key_size);
  const uint32_t h = at.h;
  size_t b = at.bucket;
  Directory** t = at.table;
  Entry* e = at.entry;
  if (e) {
    m.log_rewrite(e);
    if (e->value_size == value_size) {
      e = m.own_for_write(at);
      e->modified = static_cast<uint32_t>(m.version);
      return e->value();
    }
    Entry** link = m.writable_link(t, b, e);
    Entry* n = Entry::make(h, key, key_size, value_size, m.version);
    n->next = e->next;
    *link = n;
    m.live_bytes = m.live_bytes - e->value_size + value_size;
    m.dispose(e);
    return n->value();
  }
  return m.chained_insert(at, key, key_size, value_size);
}

uint8_t* StateMap::Impl::chained_insert(const Location& at, const uint8_t* key, size_t ks,
                                        size_t vs) {
  size_t b = at.bucket;
  Directory** t = at.table;
  if (size() > threshold && !rehash_table) {
    start_rehash();
    t = table_for(at.h, &b);
  }
  log_write(at.h, key, ks);
  Entry* n = Entry::make(at.h, key, ks, vs, version);
  Entry** slot = slot_for_write(t, b);
  n->next = *slot;
  *slot = n;
  ++size_of(t);
  live_bytes += ks + vs;
  return n->value();
}

uint8_t* StateMap::Impl::chained_resize(const Location& at, size_t vs) {
  Entry* e = at.entry;
  const size_t old = e->value_size;
  live_bytes = live_bytes - old + vs;
  if (e->version >= req && e->fits(vs)) {
    // No snapshot reaches e and its allocation holds vs bytes: nothing moves, no link changes.
    Entry::resize(e, vs);
    e->modified = static_cast<uint32_t>(version);
    return e->value();
  }
  Entry** link = writable_link(at.table, at.bucket, e);
  Entry* n;
  if (e->version >= req) {
    n = Entry::resize(e, vs);  // no snapshot reaches e: nothing else keeps its address
  } else {
    n = Entry::make_resized_copy(e, vs, version);  // a snapshot keeps the old bytes
    ++stats.entry_copies;
    dispose(e);
  }
  n->modified = static_cast<uint32_t>(version);
  *link = n;
  return n->value();
}

namespace {

void check_value_size(size_t vs) {
  if (vs > std::numeric_limits<uint32_t>::max())
    throw std::length_error("StateMap: value larger than 4 GiB - 1 bytes");
}

// StateMap::update_resized: the new size is plan(ctx, old bytes, old size), called once the key
// is found (or not: nullptr, 0) and before anything is written, so a throwing plan changes
// nothing.
uint8_t* resize_value(StateMap& sm, uint32_t h, const uint8_t* key, size_t ks,
                      StateMap::ResizePlan plan, void* ctx, size_t* old_size) {
  check_buffer(key, ks, "key");
  StateMap::Impl& m = sm.engine();
  m.begin_batch_write();
  if (m.flat) {
    const StateMap::Impl::FlatLocation at = m.flat_locate(h, key, ks);
    if (at.table) {
      const detail::FlatDirectory* d = *at.table;
      const size_t old = d->layout.value_size;
      const size_t vs = plan(ctx, d->slot(at.slot) + 4 + d->layout.suffix_size(), old);
      check_value_size(vs);
      uint8_t* v = m.flat_update(at, key, ks, nullptr);
      *old_size = old;
      if (vs == old) return v;
      // Another size than the layout's: put() converts the map (once per map), which re-creates
      // every entry, so the kept bytes go through a copy.
      std::vector<uint8_t> keep(v, v + std::min(old, vs));
      uint8_t* out = sm.put(key, ks, vs);
      if (!keep.empty()) std::memcpy(out, keep.data(), keep.size());
      return out;
    }
    const size_t vs = plan(ctx, nullptr, 0);
    check_value_size(vs);
    *old_size = 0;
    uint8_t* value;
    if (m.flat_put(at, key, ks, vs, &value)) return value;
    const StateMap::Impl::Location loc = m.locate_hashed(h, key, ks);  // converted: absent
    return m.chained_insert(loc, key, ks, vs);
  }
  const StateMap::Impl::Location at = m.locate_hashed(h, key, ks);
  if (!at.entry) {
    const size_t vs = plan(ctx, nullptr, 0);
    check_value_size(vs);
    *old_size = 0;
    return m.chained_insert(at, key, ks, vs);
  }
  Entry* e = at.entry;
  const size_t old = e->value_size;
  const size_t vs = plan(ctx, e->value(), old);
  check_value_size(vs);
  *old_size = old;
  m.log_rewrite(e);
  if (vs == old) {
    e = m.own_for_write(at);
    e->modified = static_cast<uint32_t>(m.version);
    return e->value();
  }
  return m.chained_resize(at, vs);
}

}  // namespace

uint8_t* StateMap::update_resized(uint32_t hash, const uint8_t* key, size_t key_size,
                                  ResizePlan plan, void* ctx, size_t* old_value_size) {
  return resize_value(*this, hash, key, key_size, plan, ctx, old_value_size);
}

uint8_t* StateMap::resize(uint32_t hash, const uint8_t* key, size_t key_size, size_t new_value_size,
                          size_t* old_value_size) {
  return resize_value(
      *this, hash, key, key_size,
      [](void* n, const uint8_t*, size_t) { return *static_cast<size_t*>(n); }, &new_value_size,
      old_value_size);
}

uint8_t* StateMap::resize_by(uint32_t hash, const uint8_t* key, size_t key_size, size_t added,
                             size_t* old_value_size) {
  return resize_value(
      *this, hash, key, key_size,
      [](void* n, const uint8_t*, size_t old) { return old + *static_cast<size_t*>(n); }, &added,
      old_value_size);
}

uint8_t* StateMap::get_for_update(const uint8_t* key, size_t key_size, size_t* value_size) {
  check_buffer(key, key_size, "key");
  Impl& m = *impl_;
  if (m.flat) {
    const Impl::FlatLocation at = m.flat_locate(m.hash_of(key, key_size), key, key_size);
    return at.table ? m.flat_update(at, key, key_size, value_size) : nullptr;
  }
  const Impl::Location at = m.locate(key, key_size);
  if (!at.entry) return nullptr;
  m.log_rewrite(at.entry);
  Entry* e = m.own_for_write(at);
  e->modified = static_cast<uint32_t>(m.version);
  if (value_size) *value_size = e->value_size;
  return e->value();
}

uint8_t* StateMap::upsert(uint32_t hash, const uint8_t* key, size_t key_size, size_t new_value_size,
                          size_t* value_size, bool* inserted) {
  check_buffer(key, key_size, "key");
  Impl& m = *impl_;
  m.begin_batch_write();
  if (m.flat) {
    const Impl::FlatLocation at = m.flat_locate(hash, key, key_size);
    if (at.table) {
      *inserted = false;
      return m.flat_update(at, key, key_size, value_size);
    }
    uint8_t* value;
    if (m.flat_put(at, key, key_size, new_value_size, &value)) {
      *inserted = true;
      *value_size = new_value_size;
      return value;
    }
  }
  const Impl::Location at = m.locate_hashed(hash, key, key_size);
  if (at.entry) {
    *inserted = false;
    m.log_rewrite(at.entry);
    Entry* e = m.own_for_write(at);
    e->modified = static_cast<uint32_t>(m.version);
    *value_size = e->value_size;
    return e->value();
  }
  if (new_value_size > std::numeric_limits<uint32_t>::max())
    throw std::length_error("StateMap: value larger than 4 GiB - 1 bytes");
  *inserted = true;
  *value_size = new_value_size;
  return m.chained_insert(at, key, key_size, new_value_size);  // no second lookup
}

bool StateMap::get_hashed(uint32_t hash, const uint8_t* key, size_t key_size, ByteView* out) {
  check_buffer(key, key_size, "key");
  Impl& m = *impl_;
  if (m.flat) {
    const Impl::FlatLocation at = m.flat_locate(hash, key, key_size);
    if (!at.table) return false;
    const FlatDirectory* d = *at.table;
    if (out) *out = ByteView{d->slot(at.slot) + 4 + d->layout.suffix_size(), d->layout.value_size};
    return true;
  }
  const Entry* e = m.locate_hashed(hash, key, key_size).entry;
  if (!e) return false;
  if (out) *out = ByteView{e->value(), e->value_size};
  return true;
}

bool StateMap::remove(const uint8_t* key, size_t key_size) {
  check_buffer(key, key_size, "key");
  Impl& m = *impl_;
  if (m.flat) return m.flat_remove(key, key_size);
  const Impl::Location at = m.locate(key, key_size);
  Entry* e = at.entry;
  if (!e) return false;
  Entry** link = m.writable_link(at.table, at.bucket, e);
  *link = e->next;
  m.log_removal(e);
  --m.size_of(at.table);
  m.live_bytes -= size_t(e->key_size) + e->value_size;
  m.dispose(e);
  return true;
}

void StateMap::clear() {
  Impl& m = *impl_;
  if (m.flat) return m.flat_clear();
  m.begin_op(false);
  m.visit_live([&m](Entry* e) {
    m.log_removal(e);
    m.dispose(e);
  });
  m.reset_tables(m.rehash_table ? m.rehash_table->capacity : m.primary->capacity);
}

void StateMap::reserve(size_t entries) {
  Impl& m = *impl_;
  if (m.size() != 0) return;
  size_t cap = detail::kMinCapacity;
  // The flat engine starts a rehash at an insert that finds size() >= threshold, the chained
  // one at size() > threshold: with entries <= threshold_for(cap), neither does.
  while (cap < detail::kMaxCapacity && threshold_for(cap) < entries) cap <<= 1;
  if (m.flat) {
    if (m.frehash || cap <= m.fprimary->capacity) return;
    const detail::FlatLayout layout = m.fprimary->layout;
    // A fresh directory: a snapshot of the empty map may share the current one.
    FlatDirectory::unref(m.fprimary);
    m.fprimary = FlatDirectory::make(cap, layout);
    m.threshold = threshold_for(cap);
    return;
  }
  if (m.rehash_table || cap <= m.primary->capacity) return;
  m.reset_tables(cap);
}

std::shared_ptr<MapSnapshot> StateMap::snapshot() {
  Impl& m = *impl_;
  m.advance_version();
  bool only = false;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.live_versions.push_back(m.version);
    m.required.store(m.version, std::memory_order_release);
    only = m.live_versions.size() == 1;
  }
  // The pages this snapshot shares are immutable for it: a write-through of an older snapshot's
  // pages stops here (that snapshot keeps what was saved so far).
  m.through.reset();
  m.req = m.version;
  ++m.stats.snapshots;
  auto s = std::make_unique<MapSnapshot::State>();
  s->impl = impl_;
  if (m.flat) {
    s->flat = true;
    m.fprimary->ref();
    s->fprimary = m.fprimary;
    if (m.frehash) m.frehash->ref();
    s->frehash = m.frehash;
    if (only && !m.frehash && m.fprimary->layout.fixed && m.version <= detail::kFlatMaxVersion) {
      m.through =
          std::make_shared<detail::WriteThrough>(m.fprimary->stride(), m.fprimary->page_count);
      s->through = m.through;
    }
  } else {
    m.primary->ref();
    s->primary = m.primary;
    if (m.rehash_table) m.rehash_table->ref();
    s->rehash_table = m.rehash_table;
  }
  s->rehash_index = m.rehash_index;
  s->size = m.size();
  s->version = m.version;
  s->base = m.base;
  s->removals = m.removals.view();
  s->writes = m.writes.view();
  s->writes_complete_from = m.writes_complete_from;
  m.start_epoch();
  return std::make_shared<MapSnapshot>(std::move(s));
}

uint64_t StateMap::base_version() const { return impl_->base; }

void StateMap::mark_base(uint64_t version) {
  Impl& m = *impl_;
  if (version > m.version) {
    throw std::invalid_argument("StateMap::mark_base: version " + std::to_string(version) +
                                " is newer than the map version " + std::to_string(m.version));
  }
  if (version <= m.base) return;  // an older completion: the base only moves forward
  m.base = version;
  m.removals.drop_before(version);
  m.writes.drop_before(version);
}

uint64_t StateMap::rebase(bool applied_changes) {
  Impl& m = *impl_;
  // The load counted its first writes in epoch_writes (log_write), logged or not.
  const bool heavy = applied_changes && m.epoch_writes > m.write_log_limit();
  m.advance_version();
  m.base = m.version;
  m.removals.reset();
  m.writes.reset();
  m.writes_complete_from = heavy ? m.version + 1 : 0;
  m.epoch_writes = 0;
  return m.base;
}

namespace {

// Sets Impl::quiet for a scope: the inserts and removals inside are not logged as changes.
struct QuietScope {
  explicit QuietScope(StateMap::Impl& m) : m_(m) { m_.quiet = true; }
  ~QuietScope() { m_.quiet = false; }
  QuietScope(const QuietScope&) = delete;
  QuietScope& operator=(const QuietScope&) = delete;
  StateMap::Impl& m_;
};

}  // namespace

bool StateMap::is_clean(const uint8_t* key, size_t key_size) {
  check_buffer(key, key_size, "key");
  Impl& m = *impl_;
  if (m.flat) {
    const Impl::FlatLocation at = m.flat_locate(m.hash_of(key, key_size), key, key_size);
    return at.table && detail::load_u32((*at.table)->slot(at.slot)) < m.base;
  }
  const Entry* e = m.locate(key, key_size).entry;
  return e && e->modified < m.base;
}

bool StateMap::evict(const uint8_t* key, size_t key_size) {
  if (!is_clean(key, key_size)) return false;
  QuietScope quiet(*impl_);
  return remove(key, key_size);
}

bool StateMap::insert_clean(const uint8_t* key, size_t key_size, const uint8_t* value,
                            size_t value_size) {
  check_buffer(key, key_size, "key");
  check_buffer(value, value_size, "value");
  Impl& m = *impl_;
  if (m.base == 0) {
    throw std::logic_error("StateMap::insert_clean: the map has no base (nothing committed)");
  }
  if (get(key, key_size, nullptr)) return false;
  const auto stamp = static_cast<uint32_t>(m.base - 1);
  QuietScope quiet(m);
  uint8_t* out = put(key, key_size, value_size);
  if (value_size) std::memcpy(out, value, value_size);
  // put() stamped the map version on a slot or entry it made writable (page copied, or a new
  // entry no snapshot reaches): stamping it older in place changes no snapshot's view.
  if (m.flat) {
    const Impl::FlatLocation at = m.flat_locate(m.hash_of(key, key_size), key, key_size);
    detail::store_u32(m.flat_slot_for_write(at.table, at.slot), stamp);
  } else {
    m.locate(key, key_size).entry->modified = stamp;
  }
  return true;
}

size_t StateMap::evict_clean(size_t target_bytes, uint64_t* cursor, bool spare_recent) {
  Impl& m = *impl_;
  if (m.live_bytes <= target_bytes || m.base == 0) return 0;
  if (spare_recent && m.evict_no_old_at == m.base) return 0;
  QuietScope quiet(m);
  // A clean entry's stamp is the epoch of its last write, or base - 1 when loaded since the base:
  // stamp base - 1 means touched in the last epoch, which a stream re-reading its hot keys every
  // interval will likely read again.
  const uint64_t recent = m.base - 1;
  // The hand's copies carry their stamps: a removal of one victim changes no other's.
  auto evictable = [&m, spare_recent, recent](uint64_t stamp) {
    return stamp < m.base && !(spare_recent && stamp >= recent);
  };
  SortedRun batch;
  std::vector<uint64_t> stamps;
  size_t evicted = 0;
  // At most two passes of the hand: the first may start mid-table, the second sees the rest;
  // a pass that ends with nothing evictable left ends the call.
  int wraps = 0;
  while (m.live_bytes > target_bytes && wraps < 2) {
    if (collect_buckets(cursor, 64, &batch, &stamps)) ++wraps;
    for (size_t i = 0; i < batch.size() && m.live_bytes > target_bytes; ++i) {
      if (!evictable(stamps[i])) continue;
      const ByteView k = batch.key(i);
      if (remove(k.data, k.size)) ++evicted;
    }
  }
  // The hand went round without reaching the target: no older clean entry is left, and none
  // can appear before the base moves (loads are stamped base - 1, writes make entries dirty).
  if (spare_recent && m.live_bytes > target_bytes) m.evict_no_old_at = m.base;
  return evicted;
}

void StateMap::give_up_write_log() {
  if (impl_->logs_writes()) impl_->give_up_epoch_log();
}

size_t StateMap::removal_log_size() const { return impl_->removals.size(); }
size_t StateMap::write_log_size() const { return impl_->writes.size(); }
void StateMap::set_write_log_min(size_t records) { impl_->write_log_min = records; }

void StateMap::for_each_impl(void (*cb)(void*, ByteView, ByteView), void* ctx) {
  if (impl_->flat) {
    impl_->flat_visit_live([&](const FlatDirectory* d, const uint8_t* s) {
      const FlatLayout& l = d->layout;
      uint8_t buf[detail::kFlatMaxKey];
      const size_t ks = detail::flat_full_key(l, s, buf);
      cb(ctx, ByteView{buf, ks}, ByteView{s + 4 + l.suffix_size(), l.value_size});
    });
    return;
  }
  impl_->visit_live([&](Entry* e) {
    cb(ctx, ByteView{e->key(), e->key_size}, ByteView{e->value(), e->value_size});
  });
}

bool StateMap::collect_buckets(uint64_t* cursor, size_t min_entries, SortedRun* out,
                               std::vector<uint64_t>* stamps) const {
  const Impl& m = *impl_;
  out->key_data.clear();
  out->value_data.clear();
  out->key_offsets.assign(1, 0);
  out->value_offsets.assign(1, 0);
  out->valid.clear();
  if (stamps != nullptr) stamps->clear();
  if (m.flat) return m.flat_collect(cursor, min_entries, out, stamps);
  auto add = [out, stamps](const Entry* e) {
    if (stamps != nullptr) stamps->push_back(e->modified);
    out->key_data.insert(out->key_data.end(), e->key(), e->key() + e->key_size);
    out->key_offsets.push_back(out->key_data.size());
    out->value_data.insert(out->value_data.end(), e->value(), e->value() + e->value_size);
    out->value_offsets.push_back(out->value_data.size());
  };
  const Directory* newest = m.rehash_table ? m.rehash_table : m.primary;
  const size_t cap = newest->capacity;
  const size_t max_visits = min_entries <= 16            ? 64
                            : min_entries > SIZE_MAX / 4 ? SIZE_MAX
                                                         : 4 * min_entries;
  size_t b = *cursor < cap ? static_cast<size_t>(*cursor) : 0;
  for (size_t visits = 0; b < cap && out->size() < min_entries && visits < max_visits; ++visits) {
    if (m.rehash_table) {
      const size_t old_mask = m.primary->capacity - 1;
      const size_t ob = b & old_mask;
      if (ob >= m.rehash_index) {
        for (const Entry* e = m.primary->head(ob); e; e = e->next)
          if ((e->hash & (cap - 1)) == b) add(e);
      } else {
        for (const Entry* e = m.rehash_table->head(b); e; e = e->next) add(e);
      }
      ++b;
      continue;
    }
    if (newest->pages()[b >> newest->page_shift] == nullptr) {
      b = (b | newest->page_mask()) + 1;
      continue;
    }
    for (const Entry* e = newest->head(b); e; e = e->next) add(e);
    ++b;
  }
  if (b >= cap) {
    *cursor = 0;
    return true;
  }
  *cursor = b;
  return false;
}

bool StateMap::is_rehashing() const {
  return impl_->flat ? impl_->frehash != nullptr : impl_->rehash_table != nullptr;
}

size_t StateMap::capacity() const {
  const Impl& m = *impl_;
  if (m.flat) return m.frehash ? m.frehash->capacity : m.fprimary->capacity;
  return m.rehash_table ? m.rehash_table->capacity : m.primary->capacity;
}

bool StateMap::is_flat() const { return impl_->flat; }

uint64_t StateMap::version() const { return impl_->version; }
size_t StateMap::retired_entries() const { return impl_->retired.size(); }
StateMap::Stats StateMap::stats() const { return impl_->stats; }

void StateMap::reclaim() {
  Impl& m = *impl_;
  m.sweep_pending.store(false, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(m.mu);
  m.sweep_locked();
}

// ------------------------------------------------------------------------------------------------
// MapSnapshot
// ------------------------------------------------------------------------------------------------

MapSnapshot::MapSnapshot(std::unique_ptr<State> s) : s_(std::move(s)) {
  if (!s_ || !s_->impl || (s_->flat ? s_->fprimary == nullptr : s_->primary == nullptr)) {
    throw std::invalid_argument("MapSnapshot: constructed without snapshot state");
  }
}

MapSnapshot::~MapSnapshot() { release(); }

void MapSnapshot::release() {
  if (!s_ || s_->released) return;
  s_->released = true;
  if (s_->through) {
    s_->through->done.store(true, std::memory_order_release);
    s_->through.reset();
  }
  s_->impl->release_snapshot(s_->version);
  Directory::unref(s_->primary);
  Directory::unref(s_->rehash_table);
  s_->primary = s_->rehash_table = nullptr;
  FlatDirectory::unref(s_->fprimary);
  FlatDirectory::unref(s_->frehash);
  s_->fprimary = s_->frehash = nullptr;
  s_->impl.reset();  // may destroy the engine state when the map is already gone
}

void MapSnapshot::capture() const {
  State& st = *s_;
  if (!st.through) return;
  detail::WriteThrough& u = *st.through;
  // Everything that may fail (the copy's pages) before the first page is copied: the owner
  // writes a copied page in place without saving its slots, so a capture cannot start over.
  const FlatDirectory* d = st.fprimary;
  const uint32_t stride = d->stride();
  std::vector<const uint8_t*> src(d->page_count, nullptr);
  std::vector<uint8_t*> dst(d->page_count, nullptr);
  FlatDirectory* c = FlatDirectory::make(d->capacity, d->layout);
  try {
    for (size_t i = 0; i < d->page_count; ++i) {
      if (const detail::FlatPage* p = d->pages()[i]) {
        c->pages()[i] = detail::FlatPage::make_empty(p->slot_count, stride, /*pooled=*/false);
        src[i] = p->bytes();
        dst[i] = c->pages()[i]->bytes();
      }
    }
  } catch (...) {
    FlatDirectory::unref(c);  // nothing copied yet: the snapshot stays as it was
    throw;
  }
  // Page by page while the owner keeps writing (WriteThrough::copy_pages), then the saved
  // slots put back, newest first, so each slot ends with its bytes at snapshot time.
  u.copy_pages(src.data(), dst.data(), d->page_count, size_t(d->page_mask() + 1) * stride);
  u.for_each_newest_first([&](uint32_t page, uint32_t offset, const uint8_t* bytes) {
    std::memcpy(c->pages()[page]->bytes() + offset, bytes, stride);
  });
  FlatDirectory::unref(st.fprimary);  // the owner finds the pages exclusive again
  st.fprimary = c;
  u.done.store(true, std::memory_order_release);
  st.through.reset();
}

size_t MapSnapshot::size() const { return s_->size; }
uint64_t MapSnapshot::version() const { return s_->version; }

uint64_t MapSnapshot::base_version() const { return s_->base; }

namespace {

// Visits every entry of `d` from bucket `from` on, in bucket order. The entries are scattered
// over the heap: the head a few buckets ahead is prefetched so its miss overlaps this bucket's.
template <class Fn>
void walk_entries(const Directory* d, size_t from, Fn&& fn) {
  if (!d) return;
  constexpr size_t kAhead = 8;
  for (size_t b = from; b < d->capacity;) {
    const Page* p = d->pages()[b >> d->page_shift];
    if (!p) {
      b = (b | d->page_mask()) + 1;
      continue;
    }
    const size_t slot = b & d->page_mask();
    if (slot + kAhead <= d->page_mask()) {
      if (const Entry* ahead = p->slots()[slot + kAhead]) __builtin_prefetch(ahead);
    }
    for (const Entry* e = p->slots()[slot]; e; e = e->next) fn(e);
    ++b;
  }
}

// fn(r) for every record r of `log` with from <= r.version < to, oldest first, after
// prefetch(r.hash) was called kAhead records earlier: a listing from the log looks up every
// record's key in a table that, at a million entries, is far out of cache, and one lookup at a
// time would wait for each miss in turn.
template <class Prefetch, class Fn>
void for_each_logged(const detail::KeyLogView& log, uint64_t from, uint64_t to, Prefetch&& prefetch,
                     Fn&& fn) {
  constexpr size_t kAhead = 8;  // a power of two
  const detail::KeyRecord* ring[kAhead];
  size_t n = 0;
  log.for_each([&](const detail::KeyRecord& r) {
    if (r.version < from || r.version >= to) return;
    prefetch(r.hash);
    const detail::KeyRecord*& at = ring[n++ & (kAhead - 1)];
    if (n > kAhead) fn(*at);
    at = &r;
  });
  for (size_t i = n > kAhead ? n - kAhead : 0; i < n; ++i) fn(*ring[i & (kAhead - 1)]);
}

}  // namespace

// fn(key, value, modified) for every live slot of a flat table from slot `from` on whose
// `modified` passes keep(modified), with its full key rebuilt (only for the slots kept).
template <class Keep, class Fn>
void walk_flat(const FlatDirectory* d, size_t from, Keep&& keep, Fn&& fn) {
  uint8_t buf[detail::kFlatMaxKey];
  detail::flat_for_each_kept(d, from, keep, [&](const uint8_t* s, uint32_t meta) {
    const FlatLayout& l = d->layout;
    const size_t ks = detail::flat_full_key(l, s, buf);
    fn(ByteView{buf, ks}, ByteView{s + 4 + l.suffix_size(), l.value_size}, meta);
  });
}

// fn(key, value, modified) for every entry of snapshot state `st` whose `modified` passes
// keep(modified), unordered. Inlined into its two callers, with the test ahead of the key's
// rebuild: an incremental listing walks the whole table when many keys changed (no log), and
// through a callback a call and, in the flat engine, a rebuilt key would be paid for every
// entry, changed or not.
template <class Keep, class Fn>
void walk_snapshot(const MapSnapshot::State& st, Keep&& keep, Fn&& fn) {
  if (st.flat) {
    walk_flat(st.fprimary, st.frehash ? st.rehash_index : 0, keep, fn);
    walk_flat(st.frehash, 0, keep, fn);
    return;
  }
  auto entry = [&](const Entry* e) {
    if (keep(e->modified))
      fn(ByteView{e->key(), e->key_size}, ByteView{e->value(), e->value_size}, e->modified);
  };
  walk_entries(st.primary, st.rehash_table ? st.rehash_index : 0, entry);
  walk_entries(st.rehash_table, 0, entry);
}

bool MapSnapshot::find_hashed(uint32_t hash, const uint8_t* key, size_t key_size, ByteView* value,
                              uint32_t* modified) const {
  if (s_->flat) {
    const FlatLayout& l = s_->fprimary->layout;
    if (!l.fixed || !l.fits_key(key, key_size)) return false;
    uint64_t buf[detail::kFlatMaxKey / 8];
    const uint8_t* suffix = l.probe_key(key, key_size, buf);
    const FlatDirectory* d = s_->frehash;
    size_t i;
    if (!d || !detail::flat_probe(d, hash, suffix, 0, &i)) {
      d = s_->fprimary;
      if (!detail::flat_probe(d, hash, suffix, s_->frehash ? s_->rehash_index : 0, &i))
        return false;
    }
    const uint8_t* slot = d->slot(i);
    *value = ByteView{slot + 4 + l.suffix_size(), l.value_size};
    *modified = detail::load_u32(slot);
    return true;
  }
  const Directory* d = s_->primary;
  size_t b = hash & (d->capacity - 1);
  if (s_->rehash_table && b < s_->rehash_index) {
    d = s_->rehash_table;
    b = hash & (d->capacity - 1);
  }
  for (const Entry* e = d->head(b); e; e = e->next) {
    if (e->matches(hash, key, key_size)) {
      *value = ByteView{e->value(), e->value_size};
      *modified = e->modified;
      return true;
    }
  }
  return false;
}

void MapSnapshot::prefetch(uint32_t hash) const {
  if (s_->flat) {
    for (const FlatDirectory* d : {s_->fprimary, s_->frehash}) {
      if (const uint8_t* slot = d ? d->slot(hash & d->mask()) : nullptr) __builtin_prefetch(slot);
    }
    return;
  }
  for (const Directory* d : {s_->primary, s_->rehash_table}) {
    if (!d) continue;
    const size_t b = hash & (d->capacity - 1);
    if (const Page* p = d->pages()[b >> d->page_shift])
      __builtin_prefetch(p->slots() + (b & d->page_mask()));
  }
}

bool MapSnapshot::changes_from_log(uint64_t base) const { return base >= s_->writes_complete_from; }

SortedRun MapSnapshot::sorted_changes(uint64_t base) const {
  SortedRunBuilder run;
  SortedRun out;
  sorted_changes(base, run, out);
  return out;
}

void MapSnapshot::sorted_changes(uint64_t base, SortedRunBuilder& run, SortedRun& out) const {
  if (s_->released) throw std::logic_error("MapSnapshot::sorted_changes() after release()");
  capture();
  if (base < s_->base || base > s_->version) {
    throw std::invalid_argument("MapSnapshot::sorted_changes: base " + std::to_string(base) +
                                " outside the tracked versions [" + std::to_string(s_->base) +
                                ", " + std::to_string(s_->version) + "]");
  }
  const uint64_t s = s_->version;
  run.clear();
  const auto changed = [base, s](uint32_t modified) { return (modified >= base) & (modified < s); };
  ByteView value;
  uint32_t modified;
  const auto prefetch_slot = [this](uint32_t h) { prefetch(h); };
  if (changes_from_log(base)) {
    // Every key written in [base, s) has a record there (C5): look each one up instead of
    // walking every entry. A key written in several epochs has several records: `unique`.
    for_each_logged(s_->writes, base, s, prefetch_slot, [&](const detail::KeyRecord& r) {
      if (find_hashed(r.hash, r.key, r.key_size, &value, &modified) && changed(modified))
        run.add(ByteView{r.key, r.key_size}, value, false);
    });
  } else {
    walk_snapshot(*s_, changed, [&](ByteView k, ByteView v, uint32_t) { run.add(k, v, false); });
  }
  for_each_logged(s_->removals, base, s, prefetch_slot, [&](const detail::KeyRecord& r) {
    if (!find_hashed(r.hash, r.key, r.key_size, &value, &modified))
      run.add(ByteView{r.key, r.key_size}, ByteView{}, true);
  });
  // A key removed several times is logged several times: `unique` keeps one tombstone. Puts and
  // tombstones never share a key (a tombstone's key is absent from the snapshot).
  run.finish(/*unique=*/true, out);
}

SortedRun MapSnapshot::sorted_entries() const {
  SortedRunBuilder run;
  SortedRun out;
  sorted_entries(run, out);
  return out;
}

void MapSnapshot::sorted_entries(SortedRunBuilder& run, SortedRun& out) const {
  if (s_->released) throw std::logic_error("MapSnapshot::sorted_entries() after release()");
  capture();
  run.clear();
  run.reserve(s_->size, 0, 0);
  walk_snapshot(
      *s_, [](uint32_t) { return true; },
      [&](ByteView k, ByteView v, uint32_t) { run.add(k, v, false); });
  run.finish(/*unique=*/false, out);
}

}  // namespace statecore
