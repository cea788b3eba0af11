#include "statecore/block_codec.h"

#include <stdexcept>
#include <string>

#include "lz4.h"

namespace statecore {

size_t lz4_block_bound(size_t n) noexcept {
  if (n > static_cast<size_t>(LZ4_MAX_INPUT_SIZE)) return 0;
  return static_cast<size_t>(LZ4_compressBound(static_cast<int>(n)));
}

size_t lz4_block_compress(const uint8_t* src, size_t n, std::vector<uint8_t>* out) {
  const size_t bound = lz4_block_bound(n);
  if (n > 0 && bound == 0)
    throw std::invalid_argument("block of " + std::to_string(n) +
                                " bytes exceeds the LZ4 input limit");
  const size_t at = out->size();
  out->resize(at + bound);
  // The calls of python-lz4's lz4.block.compress (mode "default", no dictionary): a fresh stream
  // and the streaming compressor, whose output can differ from LZ4_compress_default's.
  LZ4_stream_t stream;
  LZ4_initStream(&stream, sizeof(stream));
  const int written = LZ4_compress_fast_continue(
      &stream, reinterpret_cast<const char*>(src), reinterpret_cast<char*>(out->data() + at),
      static_cast<int>(n), static_cast<int>(bound), 1);
  if (written <= 0 && n > 0) {  // cannot happen with a bound-sized destination
    out->resize(at);
    throw std::runtime_error("LZ4 compression failed");
  }
  out->resize(at + static_cast<size_t>(written));
  return static_cast<size_t>(written);
}

}  // namespace statecore
