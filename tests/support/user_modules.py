"""Source text of a processor module that a test writes to a directory only the driver (or the
Spark Connect client) has on its ``sys.path``: the Python workers can import it only if the
operator ships it (``StatefulOperator.shipped_modules``)."""


def counter_module(class_name: str) -> str:
    """A module defining ``class_name``: a KeyedProcessor over int64 column ``k`` that emits
    ``(k, count)`` per row, ``count`` the key's running number of rows (a value state)."""
    return f'''
import pyarrow as pa

from statecore.descriptors import ValueStateDescriptor
from statecore.spark import KeyedProcessor

SCHEMA = pa.schema([("k", pa.int64()), ("count", pa.int64())])


def bump(state):
    state.update(state.value() + 1)
    return state.value()


class {class_name}(KeyedProcessor):
    output_schema = SCHEMA

    def open(self, ctx):
        self.count = ctx.backend.get_state(ValueStateDescriptor("count", "int64", default=0))

    def process_batch(self, batch, ctx):
        rows = []
        for k in sorted(batch.column("k").to_pylist()):
            ctx.backend.set_current_key(k)
            rows.append((k, bump(self.count)))
        if rows:
            yield pa.RecordBatch.from_pylist([{{"k": k, "count": c}} for k, c in rows],
                                             schema=SCHEMA)
'''
