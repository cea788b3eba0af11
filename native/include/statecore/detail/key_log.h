// Key logs of the state map's change tracking (engine internal; invariants C1-C5 in StateMap's
// class comment, design in docs/state-map.md "Change tracking"): the removal log and the write log.
//
// Records {map version, key hash, key bytes} in version order, in fixed-size chunks
// linked oldest -> newest through shared_ptr. The owner appends at the tail; a snapshot keeps a
// shared_ptr to the head chunk as of snapshot time plus the tail chunk and its record count, so it
// reads exactly the records logged before it, from any thread, while the owner keeps appending:
// the owner only ever writes record slots and the `next` link beyond what a snapshot recorded,
// never the ones it may read. Trimming (mark_base) drops whole chunks from the head: chunks stay
// alive while a snapshot references them, so a listing taken earlier never loses its records.
//
// Memory: records logged at versions >= the base, plus at most one partially-old chunk
// (kChunkRecords records) -- i.e. bounded by the removals (writes) since the last completed
// checkpoint.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

namespace statecore {
namespace detail {

struct KeyRecord {
  uint64_t version = 0;  // map version when the key was removed (first written in the epoch)
  uint32_t hash = 0;     // mixed key hash (as Entry::hash), so readers never call the hash fn
  uint32_t key_size = 0;
  uint8_t* key = nullptr;  // `small`, or owned by the chunk (new[]); nullptr for an empty key
  // Keys up to 16 bytes (int64 keys with their prefix and namespace) stay in the record: a bulk
  // load logs up to write_log_min records per map, and an allocation each would cost more than
  // the write itself.
  uint8_t small[16];

  void set_key(const uint8_t* k, size_t n) {
    key_size = static_cast<uint32_t>(n);
    if (n == 0) return;
    key = n <= sizeof(small) ? small : new uint8_t[n];
    std::memcpy(key, k, n);
  }
  void free_key() {
    if (key != small) delete[] key;
    key = nullptr;
  }
};

struct KeyLogChunk {
  static constexpr size_t kChunkRecords = 64;
  KeyRecord recs[kChunkRecords];
  std::shared_ptr<KeyLogChunk>
      next;  // newer chunk; written by the owner only while this is the tail

  KeyLogChunk() = default;
  KeyLogChunk(const KeyLogChunk&) = delete;
  KeyLogChunk& operator=(const KeyLogChunk&) = delete;
  ~KeyLogChunk() {
    for (KeyRecord& r : recs) r.free_key();
    // Unlink the rest of the chain iteratively: a recursive shared_ptr release of thousands of
    // chunks could overflow the stack.
    std::shared_ptr<KeyLogChunk> n = std::move(next);
    while (n && n.use_count() == 1) {
      std::shared_ptr<KeyLogChunk> after = std::move(n->next);
      n = std::move(after);
    }
  }
};

// What a snapshot sees of the log: records of head..tail, the tail holding `tail_count` of them.
struct KeyLogView {
  std::shared_ptr<const KeyLogChunk> head;
  const KeyLogChunk* tail = nullptr;
  size_t tail_count = 0;

  template <class Fn>
  void for_each(Fn&& fn) const {  // fn(const KeyRecord&), oldest first
    for (const KeyLogChunk* c = head.get(); c; c = c->next.get()) {
      size_t n = c == tail ? tail_count : KeyLogChunk::kChunkRecords;
      for (size_t i = 0; i < n; ++i) fn(c->recs[i]);
      if (c == tail) break;
    }
  }
};

// Owner-thread side of the log.
class KeyLog {
 public:
  void append(uint64_t version, uint32_t hash, const uint8_t* key, size_t key_size) {
    if (!tail_ || tail_count_ == KeyLogChunk::kChunkRecords) {
      auto c = std::make_shared<KeyLogChunk>();
      if (tail_) {
        tail_->next = c;
      } else {
        head_ = c;
      }
      tail_ = c.get();
      tail_count_ = 0;
    }
    KeyRecord& r = tail_->recs[tail_count_];
    r.version = version;
    r.hash = hash;
    r.set_key(key, key_size);
    ++tail_count_;
    ++size_;
  }

  // Drops the chunks whose records all have version < base (whole chunks only, see file comment).
  void drop_before(uint64_t base) {
    while (head_) {
      const bool is_tail = head_.get() == tail_;
      const size_t n = is_tail ? tail_count_ : KeyLogChunk::kChunkRecords;
      if (n == 0 || head_->recs[n - 1].version >= base) return;
      size_ -= n;
      if (is_tail) {
        head_.reset();
        tail_ = nullptr;
        tail_count_ = 0;
        return;
      }
      head_ = head_->next;
    }
  }

  // Drops the records with version >= v from the tail. Only for records no snapshot can see
  // (appended since the newest snapshot): the record slots and chunks it frees lie beyond every
  // snapshot's view. O(chunks) to find the cut; the write log calls it once per epoch at most.
  void drop_from(uint64_t v) {
    KeyLogChunk* c = head_.get();
    size_t n = 0;
    for (; c; c = c->next.get()) {
      n = c == tail_ ? tail_count_ : KeyLogChunk::kChunkRecords;
      if (n > 0 && c->recs[n - 1].version >= v) break;
      if (c == tail_) return;
    }
    if (!c) return;
    size_t i = 0;
    while (i < n && c->recs[i].version < v) ++i;
    size_t dropped = n - i;
    for (KeyLogChunk* d = c == tail_ ? nullptr : c->next.get(); d;
         d = d == tail_ ? nullptr : d->next.get())
      dropped += d == tail_ ? tail_count_ : KeyLogChunk::kChunkRecords;
    for (size_t j = i; j < n; ++j) {
      c->recs[j].free_key();
      c->recs[j].version = 0;
      c->recs[j].hash = 0;
      c->recs[j].key_size = 0;
    }
    c->next.reset();
    tail_ = c;
    tail_count_ = i;
    size_ -= dropped;
  }

  void reset() {
    head_.reset();
    tail_ = nullptr;
    tail_count_ = 0;
    size_ = 0;
  }

  KeyLogView view() const { return KeyLogView{head_, tail_, tail_count_}; }
  size_t size() const { return size_; }  // records held (including the old part of the head chunk)

 private:
  std::shared_ptr<KeyLogChunk> head_;
  KeyLogChunk* tail_ = nullptr;
  size_t tail_count_ = 0;
  size_t size_ = 0;
};

}  // namespace detail
}  // namespace statecore
