#include "statecore/run_lookup.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "statecore/payload_lookup.h"

namespace statecore {

BlockRef open_table_block(const RunBlockTable& table, int64_t b, const uint8_t* data, size_t size,
                          uint64_t base, std::string* why) {
  StoredBlockRef ref = table.blocks[b];
  // An offset before `base` wraps to a huge one, which open_block's bounds check rejects.
  ref.offset -= base;
  auto opened = std::make_shared<OpenedBlock>();
  // At least one byte: LZ4 gets no null destination.
  opened->bytes.reset(new uint8_t[std::max<uint64_t>(ref.raw_length, 1)]);
  opened->size = ref.raw_length;
  const int64_t a = table.key_offsets[b];
  const uint8_t* last = table.key_data + a;
  const size_t last_size = static_cast<size_t>(table.key_offsets[b + 1] - a);
  uint8_t* out = opened->bytes.get();
  if (open_blocks_into(data, size, &ref, 1, table.has_validity, &last, &last_size, &out, why) >= 0)
    return nullptr;
  return opened;
}

LookupStep::LookupStep(BlockCache* cache, uint64_t open_bytes, uint64_t gap_bytes,
                       uint64_t max_read_bytes)
    : cache_(cache),
      open_bytes_(std::max<uint64_t>(open_bytes, 1)),
      gap_bytes_(gap_bytes),
      max_read_bytes_(max_read_bytes) {}

void LookupStep::add(const RunBlockTable* table, const int64_t* keys, const int64_t* blocks,
                     size_t n) {
  const size_t f = files_.size();
  files_.push_back(table);
  entries_.reserve(entries_.size() + n);
  for (size_t i = 0; i < n; ++i) entries_.push_back(Entry{f, blocks[i], keys[i]});
  planned_ = false;
}

void LookupStep::set_keys(const int32_t* key_offsets, const uint8_t* key_data) {
  key_offsets_ = key_offsets;
  key_data_ = key_data;
}

void LookupStep::plan() {
  // Files in add() order, blocks ascending within one: a file's blocks stay adjacent so that
  // its missing blocks coalesce into ranged reads.
  std::stable_sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    return a.file != b.file ? a.file < b.file : a.block < b.block;
  });
  unique_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (unique_.empty() || unique_.back().file != entries_[i].file ||
        unique_.back().block != entries_[i].block) {
      unique_.push_back(Unique{entries_[i].file, entries_[i].block, i, i});
    }
    unique_.back().end = i + 1;
  }
  next_unique_ = 0;
  planned_ = true;
}

bool LookupStep::next_round(size_t slot) {
  if (!planned_) plan();
  Round& rd = rounds_[slot];
  rd.pins.clear();
  rd.missing.clear();
  rd.missing_slot.clear();
  rd.ranges.clear();
  rd.bytes = 0;
  rd.hits = 0;
  if (next_unique_ >= unique_.size()) {
    rd.begin = rd.end = unique_.size();
    rd.key_begin = rd.key_end = entries_.size();
    return false;
  }
  rd.begin = next_unique_;
  size_t e = rd.begin;
  while (e < unique_.size()) {
    const uint64_t size = files_[unique_[e].file]->blocks[unique_[e].block].raw_length;
    if (e > rd.begin && rd.bytes + size > open_bytes_) break;
    rd.bytes += size;
    ++e;
  }
  rd.end = next_unique_ = e;
  rd.key_begin = unique_[rd.begin].begin;
  rd.key_end = unique_[rd.end - 1].end;
  const size_t n = rd.end - rd.begin;
  rd.pins.resize(n);
  rd.searched.assign(n, 0);
  rd.found.resize(rd.key_end - rd.key_begin);
  probe_files_.resize(n);
  probe_blocks_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    probe_files_[i] = files_[unique_[rd.begin + i].file]->file_id;
    probe_blocks_[i] = unique_[rd.begin + i].block;
  }
  cache_->get_many(probe_files_.data(), probe_blocks_.data(), n, rd.pins.data());
  for (size_t u = rd.begin; u < rd.end; ++u) {
    const Unique& q = unique_[u];
    if (rd.pins[u - rd.begin]) {
      ++rd.hits;
      continue;
    }
    const StoredBlockRef& ref = files_[q.file]->blocks[q.block];
    const uint64_t start = ref.offset, end = ref.offset + ref.stored_length;
    ReadRange* last = rd.ranges.empty() ? nullptr : &rd.ranges.back();
    const bool join = last != nullptr && last->file == q.file &&
                      start >= last->offset + last->length &&
                      start - (last->offset + last->length) <= gap_bytes_ &&
                      end - last->offset <= max_read_bytes_;
    if (join) {
      last->length = end - last->offset;
      ++last->count;
    } else {
      rd.ranges.push_back(ReadRange{q.file, start, end - start, rd.missing.size(), 1});
    }
    rd.missing.emplace_back(q.file, q.block);
    rd.missing_slot.push_back(u - rd.begin);
  }
  return true;
}

int64_t LookupStep::open_range(size_t r, const uint8_t* data, size_t size, std::string* why,
                               size_t slot) {
  Round& rd = rounds_[slot];
  const ReadRange& range = rd.ranges[r];
  const RunBlockTable& table = *files_[range.file];
  // The range's opened blocks go into the cache together (one lock per read, not per block);
  // those opened before a bad block are still cached and pinned. Scratch per thread: a call
  // per read, on every fetch thread.
  thread_local std::vector<int64_t> ids, numbers;
  thread_local std::vector<BlockRef> blocks;
  ids.assign(range.count, table.file_id);
  numbers.resize(range.count);
  blocks.clear();
  int64_t bad = -1;
  for (size_t opened = 0; opened < range.count; ++opened) {
    const size_t m = range.first + opened;
    numbers[opened] = rd.missing[m].second;
    BlockRef b = open_table_block(table, numbers[opened], data, size, range.offset, why);
    if (!b) {
      bad = static_cast<int64_t>(opened);
      break;
    }
    const size_t at = rd.missing_slot[m];
    rd.pins[at] = b;
    blocks.push_back(std::move(b));
    if (key_offsets_ != nullptr) {
      search_block(rd, rd.begin + at, key_offsets_, key_data_);
      rd.searched[at] = 1;
    }
  }
  cache_->put_many(ids.data(), numbers.data(), blocks.data(), blocks.size());
  blocks.clear();  // the cache and the round hold them; a thread's scratch pins none
  return bad;
}

int64_t LookupStep::read_open_ranges(const int* fds, size_t worker, size_t workers, size_t* range,
                                     std::string* why, size_t slot) {
  const std::vector<ReadRange>& ranges = rounds_[slot].ranges;
  // Kept across calls: the fetch threads read every round, and a fresh buffer per call would
  // be zeroed (and, at this size, mapped) each time.
  thread_local std::vector<uint8_t> buffer;
  for (size_t r = worker; r < ranges.size(); r += std::max<size_t>(workers, 1)) {
    const ReadRange& rr = ranges[r];
    *range = r;
    // Grown only: a shrink and a regrow would zero the regrown bytes on every read.
    if (buffer.size() < std::max<uint64_t>(rr.length, 1))
      buffer.resize(std::max<uint64_t>(rr.length, 1));
    uint64_t got = 0;
    while (got < rr.length) {
      const ssize_t n = ::pread(fds[rr.file], buffer.data() + got, rr.length - got,
                                static_cast<off_t>(rr.offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        *why = std::strerror(errno);
        return kReadFailed;
      }
      if (n == 0) {
        *why = "the file ends at byte " + std::to_string(rr.offset + got);
        return kReadShort;
      }
      got += static_cast<uint64_t>(n);
    }
    const int64_t bad = open_range(r, buffer.data(), rr.length, why, slot);
    if (bad >= 0) return bad;
  }
  return -1;
}

void LookupStep::search_block(Round& rd, size_t u, const int32_t* key_offsets,
                              const uint8_t* key_data) const {
  const Unique& q = unique_[u];
  const OpenedBlock& blk = *rd.pins[u - rd.begin];
  const PayloadView v = PayloadView::of(blk.bytes.get(), blk.size, files_[q.file]->has_validity);
  for (size_t j = q.begin; j < q.end; ++j) {
    const int64_t k = entries_[j].key;
    Found& f = rd.found[j - rd.key_begin];
    f.row =
        v.find(key_data + key_offsets[k], static_cast<size_t>(key_offsets[k + 1] - key_offsets[k]));
    f.value = nullptr;
    f.size = 0;
    if (f.row >= 0 && v.has_value(f.row)) {
      const uint32_t a = v.value_offset(f.row);
      f.value = v.value_data + a;
      f.size = v.value_offset(f.row + 1) - a;
    }
  }
}

void LookupStep::start_reads(FetchPool* pool, const int* fds, size_t nfds, size_t workers,
                             size_t slot) {
  Round& rd = rounds_[slot];
  rd.fds.assign(fds, fds + nfds);
  workers = std::max<size_t>(workers, 1);
  rd.outcomes.assign(workers, Round::Outcome{});
  rd.reads.reset(workers);
  pool->run(
      workers,
      [this, &rd, slot, workers](size_t w) {
        Round::Outcome& o = rd.outcomes[w];
        try {
          o.bad = read_open_ranges(rd.fds.data(), w, workers, &o.range, &o.why, slot);
        } catch (const std::exception& e) {  // bad_alloc: reported as a failed read
          o.bad = kReadFailed;
          o.why = e.what();
        }
      },
      &rd.reads);
}

int64_t LookupStep::finish_reads(size_t* range, std::string* why, size_t slot) {
  Round& rd = rounds_[slot];
  rd.reads.wait();
  const Round::Outcome* first = nullptr;
  for (const Round::Outcome& o : rd.outcomes)
    if (o.bad != -1 && (first == nullptr || o.range < first->range)) first = &o;
  int64_t bad = -1;
  if (first != nullptr) {
    bad = first->bad;
    *range = first->range;
    *why = first->why;
  }
  rd.outcomes.clear();
  return bad;
}

LookupStep::~LookupStep() {
  for (Round& rd : rounds_) rd.reads.wait();
}

size_t LookupStep::round_searched_on_open(size_t slot) const {
  size_t n = 0;
  for (uint8_t b : rounds_[slot].searched) n += b;
  return n;
}

uint64_t LookupStep::search(const int32_t* key_offsets, const uint8_t* key_data, int64_t* rows,
                            size_t slot) {
  Round& rd = rounds_[slot];
  for (size_t u = rd.begin; u < rd.end; ++u)
    if (!rd.searched[u - rd.begin]) search_block(rd, u, key_offsets, key_data);
  uint64_t total = 0;
  for (size_t i = 0; i < rd.found.size(); ++i) {
    rows[i] = rd.found[i].row;
    total += rd.found[i].size;
  }
  return total;
}

int64_t LookupStep::gather(int32_t* out_offsets, uint8_t* out_data, uint8_t* out_validity,
                           size_t slot) const {
  const Round& rd = rounds_[slot];
  int64_t nulls = 0;
  int64_t at = 0;
  out_offsets[0] = 0;
  for (size_t i = 0; i < rd.found.size(); ++i) {
    const Found& f = rd.found[i];
    if (f.value != nullptr) {  // found, not a tombstone
      if (f.size) std::memcpy(out_data + at, f.value, f.size);
      at += f.size;
      out_validity[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
    } else {
      ++nulls;
    }
    out_offsets[i + 1] = static_cast<int32_t>(at);
  }
  return nulls;
}

}  // namespace statecore
