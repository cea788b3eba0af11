// PUBLIC API CONTRACT of the native state map (implementation: native/src/state_map.cpp,
// internals in detail/). The class comment is the design document and is completed by the
// implementation: trade-offs, invariants, every field.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace statecore {

struct ByteView {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// Hash of an encoded key. Injectable so tests can run over a deliberately colliding hash.
using KeyHashFunction = uint32_t (*)(const uint8_t* data, size_t size);

class MapSnapshot;

// Copy-on-write, incrementally rehashing chained hash map from byte keys to byte values
// (after Flink's CopyOnWriteStateMap). One instance per key group of a state.
// Thread contract: all mutating calls and snapshot() come from one owning thread; a MapSnapshot
// may be read (sorted_entries) from any one other thread while the owner keeps mutating.
class StateMap {
 public:
  explicit StateMap(KeyHashFunction hash = nullptr);  // nullptr: xxh64-based default
  ~StateMap();
  StateMap(const StateMap&) = delete;
  StateMap& operator=(const StateMap&) = delete;

  size_t size() const;
  // Bytes of keys + values held by live entries (not counting snapshot-only copies).
  size_t bytes() const;

  // Lookup; false when absent. *out stays valid until the next mutating call.
  bool get(const uint8_t* key, size_t key_size, ByteView* out);
  // Insert or overwrite: returns `value_size` writable bytes owned by the map (copy-on-write
  // already applied); the caller fills them. Valid until the next mutating call.
  uint8_t* put(const uint8_t* key, size_t key_size, size_t value_size);
  // Writable access to an existing value (copy-on-write applied); nullptr when absent.
  uint8_t* get_for_update(const uint8_t* key, size_t key_size, size_t* value_size);
  // True when the key was present.
  bool remove(const uint8_t* key, size_t key_size);
  void clear();

  // O(1) (independent of the number of entries). Several snapshots may be alive.
  std::shared_ptr<MapSnapshot> snapshot();

  // Visit live entries (unordered). fn(ByteView key, ByteView value).
  template <class Fn> void for_each(Fn&& fn);

  // Introspection for tests and stats.
  bool is_rehashing() const;
  size_t capacity() const;
  uint64_t version() const;
  size_t retired_entries() const;  // entries kept alive only for snapshots

  struct Impl;
 private:
  std::shared_ptr<Impl> impl_;
  friend class MapSnapshot;
  void for_each_impl(void (*cb)(void*, ByteView, ByteView), void* ctx);
};

class MapSnapshot {
 public:
  ~MapSnapshot();  // releases
  void release();  // idempotent; after the last release the map stops copying
  size_t size() const;
  // Entries as of snapshot time, sorted ascending by key bytes (memcmp, shorter prefix first).
  // Views stay valid while this snapshot is not released.
  std::vector<std::pair<ByteView, ByteView>> sorted_entries() const;
  uint64_t version() const;

  struct State;
  explicit MapSnapshot(std::unique_ptr<State> s);
 private:
  std::unique_ptr<State> s_;
};

template <class Fn> void StateMap::for_each(Fn&& fn) {
  for_each_impl([](void* ctx, ByteView k, ByteView v) { (*static_cast<Fn*>(ctx))(k, v); }, &fn);
}

}  // namespace statecore
