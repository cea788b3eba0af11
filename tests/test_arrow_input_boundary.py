"""The trust boundary of the batch API: Arrow data whose buffers, offsets or UTF-8 are
invalid is an InvalidInputError in both backends, with the state unchanged -- never a crash,
never garbage stored (pyarrow's full validation of every column; for the native backend's
kernels, pyarrow's structural validation and the kernels' own checks of string and binary
columns)."""

from __future__ import annotations

import ctypes
import re

import pyarrow as pa
import pytest

import statecore
from statecore import MapStateDescriptor, ValueStateDescriptor
from statecore.errors import InvalidInputError

BACKENDS = ["python", "native"]


def _strings(offsets, data: bytes):
    import struct

    offs = pa.py_buffer(struct.pack(f"<{len(offsets)}i", *offsets))
    return pa.Array.from_buffers(pa.string(), len(offsets) - 1, [None, offs, pa.py_buffer(data)])


def _past_the_data():
    """A string array whose last offset is changed to point far past its 4-byte data buffer
    after pyarrow checked it (the offsets live in a mutable buffer)."""
    import struct

    raw = bytearray(struct.pack("<3i", 0, 2, 4))
    arr = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(raw), pa.py_buffer(b"abcd")])
    struct.pack_into("<i", raw, 8, 4000)
    return arr


BAD_UTF8 = _strings([0, 2], b"\xff\xfe")
DESCENDING = _strings([0, 3, 1], b"abcd")
PAST_THE_DATA = _past_the_data()


class _ArrowSchema(ctypes.Structure):
    _fields_ = [("format", ctypes.c_char_p), ("name", ctypes.c_char_p),
                ("metadata", ctypes.c_char_p), ("flags", ctypes.c_int64),
                ("n_children", ctypes.c_int64), ("children", ctypes.c_void_p),
                ("dictionary", ctypes.c_void_p), ("release", ctypes.c_void_p),
                ("private_data", ctypes.c_void_p)]


class _ArrowArray(ctypes.Structure):
    _fields_ = [("length", ctypes.c_int64), ("null_count", ctypes.c_int64),
                ("offset", ctypes.c_int64), ("n_buffers", ctypes.c_int64),
                ("n_children", ctypes.c_int64), ("buffers", ctypes.c_void_p),
                ("children", ctypes.c_void_p), ("dictionary", ctypes.c_void_p),
                ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p)]


_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype = ctypes.py_object
_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class _LyingProducer:
    """Exports a valid array through the Arrow C data interface (Arrow C data interface
    spec: ArrowSchema / ArrowArray) with some of its ArrowArray fields overwritten."""

    def __init__(self, arr, **fields):
        self.arr, self.fields = arr, fields

    def __arrow_c_array__(self, requested_schema=None):
        self.schema, self.array = _ArrowSchema(), _ArrowArray()
        self.arr._export_to_c(ctypes.addressof(self.array), ctypes.addressof(self.schema))
        for k, v in self.fields.items():
            setattr(self.array, k, v)
        return (_capsule(ctypes.addressof(self.schema), b"arrow_schema", None),
                _capsule(ctypes.addressof(self.array), b"arrow_array", None))


def _backend(kind):
    b = statecore.create_backend(kind, key_type="string")
    v = b.get_state(ValueStateDescriptor("v", "string"))
    n = b.get_state(ValueStateDescriptor("n", "int64"))
    m = b.get_state(MapStateDescriptor("m", "string", "int64"))
    v.put_batch(pa.array(["a", "b"]), pa.array(["x", "y"]))
    m.put_batch(pa.array(["a"]), pa.array(["u"]), pa.array([1], pa.int64()))
    return b, v, n, m


def _dump(b, v, m):
    out = {}
    for k in ("a", "b"):
        b.set_current_key(k)
        out[k] = (v.value(), m.items())
    return out


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("bad, match", [
    (BAD_UTF8, "(?i:invalid UTF-?8)"),
    (PAST_THE_DATA, "invalid Arrow data"),
    (DESCENDING, "invalid Arrow data"),
])
def test_invalid_string_columns_are_refused_everywhere(kind, bad, match):
    b, v, n, m = _backend(kind)
    before = _dump(b, v, m)
    keys = pa.array(["a"] * len(bad))
    calls = [
        ("keys", lambda: v.put_batch(bad, pa.array(["z"] * len(bad)))),
        ("values", lambda: v.put_batch(keys, bad)),
        ("user_keys", lambda: m.put_batch(keys, bad, pa.array([5] * len(bad), pa.int64()))),
        ("keys", lambda: v.get_batch(bad)),
        ("user_keys", lambda: m.get_batch(keys, bad)),
        ("user_keys", lambda: m.remove_batch(keys, bad)),
    ]
    for what, call in calls:
        with pytest.raises(InvalidInputError, match=f"{what}.*{match}"):
            call()
    assert _dump(b, v, m) == before


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("fields, match", [
    ({"length": -5}, "length is negative"),
    ({"offset": -1}, "negative"),
    ({"null_count": -7}, "Negative null count"),
])
def test_negative_lengths_from_a_c_data_producer_are_refused(kind, fields, match):
    b, v, n, m = _backend(kind)
    with pytest.raises(InvalidInputError, match=f"values: .*{match}"):
        n.put_batch(pa.array(["a", "b"]), _LyingProducer(pa.array([1, 2], pa.int64()), **fields))
    b.set_current_key("a")
    assert n.value() is None


@pytest.mark.parametrize("kind", BACKENDS)
def test_invalid_data_behind_the_c_data_interface_is_refused(kind):
    """A producer exporting through ``__arrow_c_array__`` whose data is invalid is caught by
    the same validation after the import."""
    b, v, n, m = _backend(kind)

    class Producer:
        def __init__(self, arr):
            self.arr = arr

        def __arrow_c_array__(self, requested_schema=None):
            return self.arr.__arrow_c_array__(requested_schema)

    with pytest.raises(InvalidInputError, match="values: invalid Arrow data.*(?i:UTF-?8)"):
        v.put_batch(pa.array(["a"]), Producer(BAD_UTF8))
    b.set_current_key("a")
    assert v.value() == "x"


@pytest.mark.parametrize("bad, why", [
    ("overlong", "invalid UTF-8 at byte 0 (overlong form)"),
    ("overlong 3-byte", "invalid UTF-8 at byte 0 (overlong form)"),
    ("surrogate", "invalid UTF-8 at byte 0 (encoded surrogate)"),
    ("truncated", "invalid UTF-8 at byte 1 (truncated sequence)"),
    ("above U+10FFFF", "invalid UTF-8 at byte 0 (code point above U+10FFFF)"),
    ("stray continuation", "invalid UTF-8 at byte 0 (unexpected continuation byte)"),
    ("invalid byte", "invalid UTF-8 at byte 0 (invalid byte)"),
    ("a character split over two rows", "row 1: invalid UTF-8 at byte 0 (truncated sequence)"),
    ("offsets going backwards", "offsets go backwards (end 2 < start 3)"),
    ("an offset past the data buffer", "offset 4000 past the array's last offset 4"),
])
def test_native_kernels_name_the_row_and_what_is_wrong(bad, why):
    """The native kernels' own checks of string columns (the structural ones left to pyarrow)
    name the column, the first bad row and the reason."""
    from statecore.testing.arrow_inputs import malformed_string_columns

    col = malformed_string_columns()[bad]
    b, v, n, m = _backend("native")
    row = "" if why.startswith("row") else "row 2: "
    for what, call in [("keys", lambda: v.put_batch(col, pa.array(["z"] * 4))),
                       ("values", lambda: v.put_batch(pa.array(["a"] * 4), col)),
                       ("user_keys", lambda: m.get_batch(pa.array(["a"] * 4), col))]:
        want = re.escape(f"{what}: invalid Arrow data: {row}{why}")
        with pytest.raises(InvalidInputError, match=want):
            call()


@pytest.mark.parametrize("kind", BACKENDS)
def test_utf8_of_null_rows_is_not_checked_but_their_offsets_are(kind):
    """A null value's bytes are never read: they need not be UTF-8 (as pyarrow's validation
    has it); its offsets must still be in order."""
    import struct

    b, v, n, m = _backend(kind)
    offsets = pa.py_buffer(struct.pack("<4i", 0, 1, 3, 4))
    validity = pa.py_buffer(bytes([0b101]))
    vals = pa.Array.from_buffers(pa.string(), 3, [validity, offsets, pa.py_buffer(b"x\xff\xfey")],
                                 null_count=1)
    v.put_batch(pa.array(["a", "b", "c"]), vals)
    b.set_current_key("c")
    assert v.value() == "y"
    b.set_current_key("b")
    assert v.value() is None  # a null value removes
    backwards = pa.Array.from_buffers(
        pa.string(), 3, [validity, pa.py_buffer(struct.pack("<4i", 0, 3, 1, 4)),
                         pa.py_buffer(b"xyzw")], null_count=1)
    with pytest.raises(InvalidInputError, match="values: invalid Arrow data"):
        v.put_batch(pa.array(["a", "b", "c"]), backwards)


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_null_count_that_lies_is_refused(kind):
    """A producer whose null_count disagrees with its validity bitmap (pyarrow's full
    validation checks it; the structural one does not)."""
    b, v, n, m = _backend(kind)
    arr = pa.array(["p", None, "q"])
    lying = _LyingProducer(arr, null_count=0)
    with pytest.raises(InvalidInputError, match="values: .*null_count"):
        v.put_batch(pa.array(["a", "b", "c"]), lying)
    b.set_current_key("a")
    assert v.value() == "x"
