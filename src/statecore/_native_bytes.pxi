# Byte-level codecs shared by keys and stored values: big-/little-endian integers and the
# varlen length prefix (statecore.varint; docs/formats.md "Encoded key").

cdef inline void _put_be(uint8_t* p, uint64_t v, int n):
    cdef int i
    for i in range(n):
        p[i] = <uint8_t>(v >> (8 * (n - 1 - i)))


cdef inline void _put_le(uint8_t* p, uint64_t v, int n):
    cdef int i
    for i in range(n):
        p[i] = <uint8_t>(v >> (8 * i))


cdef inline uint64_t _get_le(const uint8_t* p, int n):
    cdef uint64_t v = 0
    cdef int i
    for i in range(n):
        v |= (<uint64_t>p[i]) << (8 * i)
    return v


cdef inline uint64_t _get_be(const uint8_t* p, int n):
    cdef uint64_t v = 0
    cdef int i
    for i in range(n):
        v = (v << 8) | p[i]
    return v


cdef inline Py_ssize_t _varlen_size(uint64_t n):
    cdef Py_ssize_t k = 1
    while n >= 0x80:
        n >>= 7
        k += 1
    return k


cdef inline void _write_varlen(uint8_t* p, uint64_t n):
    # varint.write_varlen (docs/formats.md "Encoded key").
    while n >= 0x80:
        p[0] = <uint8_t>((n & 0x7F) | 0x80)
        p += 1
        n >>= 7
    p[0] = <uint8_t>n


cdef int _read_varlen(const uint8_t* p, size_t size, size_t* pos, uint64_t* out) except -1:
    """serializers.read_varlen at ``pos[0]`` (same errors); a number beyond 64 bits reads as
    UINT64_MAX, which no blob can hold (Python's unbounded int fails the same length checks)."""
    cdef uint64_t n = 0, b
    cdef int shift = 0
    cdef bint over = False
    while True:
        if pos[0] >= size:
            raise InvalidInputError("truncated varlen")
        b = p[pos[0]]
        pos[0] += 1
        if shift == 63 and (b & 0x7F) > 1:
            over = True
        n |= (b & 0x7F) << shift
        if b < 0x80:
            out[0] = <uint64_t>-1 if over else n
            return 0
        shift += 7
        if shift > 63:
            raise InvalidInputError("varlen longer than 64 bits")
