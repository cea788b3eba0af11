"""A pyarrow filesystem handler that forwards everything to the local disk; tests subclass it to
count reads or inject failures by overriding only the calls they care about."""

import io

import pyarrow as pa
import pyarrow.fs as pafs


class LocalDelegatingHandler(pafs.FileSystemHandler):
    """Every call goes to ``pafs.LocalFileSystem()`` (``self.fs``); ``type_name`` names it."""

    type_name = "local-delegating"

    def __init__(self):
        self.fs = pafs.LocalFileSystem()

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def get_type_name(self):
        return self.type_name

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise NotImplementedError

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.fs.open_input_stream(path)

    def open_input_file(self, path):
        if type(self).on_read is LocalDelegatingHandler.on_read:
            return self.fs.open_input_file(path)
        return pa.PythonFile(_HookedInput(self, path), mode="r")

    def on_read(self, path, offset, data) -> None:
        """Called after every read of an input file opened at ``path``: ``data`` (bytes) was read
        at ``offset``; subclasses record or count it, or raise to fail the read."""

    def open_output_stream(self, path, metadata):
        if type(self).before_write is LocalDelegatingHandler.before_write:
            return self.fs.open_output_stream(path)
        return pa.PythonFile(_HookedOutput(self, self.fs.open_output_stream(path), path), mode="w")

    def before_write(self, stream, data) -> None:
        """Called before every write of ``data`` to an output stream (``stream.path``: the path
        it was opened at; ``stream.written``: bytes it took so far); subclasses delay, block or
        raise."""

    def open_append_stream(self, path, metadata):
        return self.fs.open_append_stream(path)


class _HookedInput(io.RawIOBase):
    """Local input file that calls ``handler.on_read(path, offset, data)`` after each read."""

    def __init__(self, handler, path):
        self.handler = handler
        self.path = path
        self.f = open(path, "rb")

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, off, whence=0):
        return self.f.seek(off, whence)

    def tell(self):
        return self.f.tell()

    def read(self, n=-1):
        at = self.f.tell()
        data = self.f.read(n)
        self.handler.on_read(self.path, at, data)
        return data

    def readinto(self, b):
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self):
        self.f.close()
        super().close()


class _HookedOutput:
    """Output stream that calls ``handler.before_write(self, data)`` and then writes to
    ``inner``."""

    def __init__(self, handler, inner, path):
        self.handler = handler
        self.inner = inner
        self.path = path
        self.closed = False
        self.written = 0

    def write(self, data):
        self.handler.before_write(self, data)
        self.written += len(data)
        return self.inner.write(data)

    def flush(self):
        self.inner.flush()

    def close(self):
        self.closed = True
        self.inner.close()
