"""The benchmark harness runs every case end to end (at a tiny scale) and reports records in the
promised shape, for every implementation it claims to compare. Nothing about speed is asserted."""

import json

from statecore import bench
from statecore.cli import main


def test_bench_command_writes_records_for_every_case(tmp_path):
    out = tmp_path / "r.json"
    assert main(["bench", "--quick", "--scale", "0.01", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    assert {r["case"] for r in records} >= {"add_batch_int64", "per_record", "snapshot", "checkpoint_write"}
    for r in records:
        assert set(r) == {"case", "impl", "metric", "value", "unit"}
        assert r["value"] >= 0
    impls = {(r["case"], r["impl"]) for r in records}
    assert ("add_batch_int64", "native") in impls and ("add_batch_int64", "python") in impls
    assert ("add_batch_int64", "dict") in impls
    assert json.loads((tmp_path / "r.json.machine.json").read_text())["cpus"] >= 1


def test_bench_rejects_unknown_case(capsys):
    assert main(["bench", "--case", "no_such_case"]) == 2
    assert "no_such_case" in capsys.readouterr().err


def test_bench_list(capsys):
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for name in bench.CASES:
        assert name in out
