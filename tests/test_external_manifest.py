"""Metadata-only manifests (``CheckpointStore.commit_external``, docs/formats.md "Checkpoint
store and manifests"): a version whose keyed state is in an external store is committed as a
manifest without runs that names the store's epoch and write-ahead logs. It reads back
validated, is refused when tampered with, is not restorable, shows in ``statecore inspect``,
obeys the replace rule and retention like any version; manifests with marker runs written
before it keep giving the Spark driver their epoch."""

import json
import os

import pytest

from statecore import CheckpointStore, ValueStateDescriptor, create_backend
from statecore.cli import main
from statecore.errors import CorruptCheckpointError, InvalidInputError
from statecore.inspect import entries_table, summary_lines, version_stats
from statecore.spark.external_commit import decided_epoch
from support.manifests import forge_manifest

LOGS = ["statecore:{job/op}:wal:3:p0of2", "statecore:{job/op}:wal:3:p1of2"]


def _commit(cs, version=3, **kw):
    args = dict(store="redis", namespace="job/op", epoch=version, logs=LOGS, base_epoch=2,
                max_parallelism=64, key_type="int64", assigner="spark",
                metadata={"operator": "op", "state_store": {"namespace": "job/op"}})
    args.update(kw)
    return cs.commit_external(version, **args)


def test_commit_external_reads_back(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    written = _commit(store)
    m = store.manifest(3)
    assert m == written
    assert m["format_version"] == 3 and m["files"] == [] and m["states"] == []
    assert m["external"] == {"store": "redis", "namespace": "job/op", "epoch": 3,
                             "logs": LOGS, "base_epoch": 2}
    assert (m["max_parallelism"], m["key_type"], m["assigner"]) == (64, "int64", "spark")
    assert m["metadata"]["operator"] == "op" and len(m["commit_id"]) == 32
    assert decided_epoch(m) == (LOGS, 2)
    d = store.describe(3)
    assert d["external"] == m["external"] and d["runs"] == 0 and d["bytes"] == 0
    store.verify(3)
    # Nothing but the manifest was written.
    assert sorted(os.listdir(tmp_path / "ckpt")) == [store.manifest_name(3)]
    with store.open(3) as r:
        assert r.state_metas() == []
    b = create_backend("python", key_type="int64", max_parallelism=64)
    with pytest.raises(InvalidInputError, match="external store .*redis namespace 'job/op'"):
        store.restore(b, 3)


def test_replace_rule_and_bad_arguments_write_nothing(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    _commit(store, 3)
    with pytest.raises(InvalidInputError, match="not above the latest committed version 3"):
        _commit(store, 3)
    first = store.manifest(3)["commit_id"]
    assert _commit(store, 3, replace=True)["commit_id"] != first  # a replayed micro-batch
    bad = [dict(logs=[]), dict(logs=["a", "a"]), dict(base_epoch=4), dict(epoch=-1),
           dict(store=""), dict(max_parallelism=0), dict(metadata={"x": object()}),
           dict(namespace=None)]
    for kw in bad:
        with pytest.raises(InvalidInputError):
            _commit(store, 4, **kw)
    assert store.versions() == [3]


def test_first_epoch_and_retention(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    _commit(store, 0, base_epoch=None, logs=["l0"])
    for v in (1, 2, 3):
        _commit(store, v, base_epoch=v - 1, logs=[f"l{v}"])
    assert decided_epoch(store.manifest(0)) == (["l0"], None)
    store.retain(2)
    assert store.versions() == [2, 3]


@pytest.mark.parametrize("change, what", [
    (lambda d: d.update(format_version=2), "format_version 3"),
    (lambda d: d.pop("external"), "format_version 3"),
    (lambda d: d["external"].update(logs=[]), "external.logs"),
    (lambda d: d["external"].update(extra=1), "external has fields"),
    (lambda d: d["external"].update(base_epoch=3), "base_epoch"),
    (lambda d: d.update(key_group_range=[0, 63]), "no runs and no states"),
    (lambda d: d.update(states=[{"name": "count", "kind": "value", "value_type": "int64"}]),
     "no runs and no states|state"),
])
def test_tampered_metadata_only_manifest_is_corrupt(tmp_path, change, what):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    _commit(store)
    forge_manifest(store, 3, change)
    with pytest.raises(CorruptCheckpointError, match=what):
        CheckpointStore(store.uri).manifest(3)


def test_an_ordinary_manifest_cannot_carry_external(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    b = create_backend("python", key_type="int64", max_parallelism=64)
    b.get_state(ValueStateDescriptor("count", "int64"))
    store.commit(1, [store.write_snapshot(b.snapshot(), 1)])
    forge_manifest(store, 1, lambda d: d.update(external={
        "store": "redis", "namespace": "n", "epoch": 1, "logs": ["l"], "base_epoch": None}))
    with pytest.raises(CorruptCheckpointError, match="format_version 3"):
        CheckpointStore(store.uri).manifest(1)


def test_marker_run_manifests_still_give_their_epoch(tmp_path):
    """A version committed with marker runs (the logs in the metadata) before metadata-only
    manifests existed: it reads as before and the driver finds its epoch's logs."""
    store = CheckpointStore(str(tmp_path / "ckpt"))
    b = create_backend("python", key_type="int64", max_parallelism=64)
    store.commit(5, [store.write_snapshot(b.snapshot(), 5)], {
        "state_store": {"namespace": "job/op", "wals": LOGS, "prev_epoch": 4}})
    m = store.manifest(5)
    assert m["format_version"] == 2 and "external" not in m
    assert decided_epoch(m) == (LOGS, 4)
    assert decided_epoch({"metadata": {}}) is None


def test_inspect_shows_a_metadata_only_version(tmp_path, capsys):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    _commit(store)
    stats = version_stats(store.uri)
    assert stats["external"]["epoch"] == 3 and stats["runs"] == 0 and stats["states"] == []
    text = "\n".join(summary_lines(store.uri))
    assert "metadata only" in text and "redis namespace 'job/op', epoch 3" in text
    assert "2 write-ahead log(s)" in text
    with pytest.raises(InvalidInputError, match="metadata only"):
        entries_table(store.uri)
    assert main(["inspect", store.uri, "--entries", "5"]) == 0
    out = capsys.readouterr().out
    assert "metadata only" in out and "no entries in the checkpoint" in out
    assert main(["inspect", store.uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["roots"][0]["external"]["logs"] == LOGS
