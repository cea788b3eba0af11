"""The `statecore` command answers a user error with one line and exit code 1 or 2, never a
traceback, and before any work starts (no data landed, no Spark started)."""

from __future__ import annotations

import os

import pytest

from statecore import CheckpointStore, ValueStateDescriptor, create_backend
from statecore.cli import main


def _run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        code = main(argv)
        raise SystemExit(code)
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err


def _checkpoint(root, versions=(1, 2)):
    b = create_backend("python", key_type="int64")
    st = b.get_state(ValueStateDescriptor("v", "int64"))
    store = CheckpointStore(root)
    for v in versions:
        b.set_current_key(v)
        st.update(v)
        store.checkpoint(b, v)
    return store


def _one_line_error(code, err, want_code, match):
    """Exit code ``want_code``; stderr holds no traceback and one error line (argparse puts its
    usage synopsis before it) that contains ``match``."""
    assert code == want_code, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("statecore")
              and "error:" in line]
    assert len(errors) == 1 and match in errors[0], err


def test_inspect_parquet_into_a_directory_or_missing_directory(tmp_path, capsys):
    root = str(tmp_path / "ckpt")
    _checkpoint(root)
    code, _, err = _run(["inspect", root, "--parquet", str(tmp_path)], capsys)
    _one_line_error(code, err, 2, "is a directory")
    code, _, err = _run(["inspect", root, "--parquet", str(tmp_path / "no" / "x.parquet")],
                        capsys)
    _one_line_error(code, err, 2, "does not exist")


def test_inspect_verify_checks_every_retained_version_or_the_one_asked(tmp_path, capsys):
    root = str(tmp_path / "ckpt")
    _checkpoint(root, versions=(1, 2, 3))
    code, out, _ = _run(["inspect", root, "--verify"], capsys)
    assert code == 0 and "verified           versions 1, 2, 3: every block and entry" in out
    code, out, _ = _run(["inspect", root, "--verify", "--version", "2"], capsys)
    assert code == 0 and "verified           version 2: every block and entry" in out
    code, _, err = _run(["inspect", root, "--version", "-1"], capsys)
    _one_line_error(code, err, 2, "expected a non-negative integer")


@pytest.mark.parametrize("argv, code, match", [
    (["--session-gap", "99999999999999999999d"], 2, "longer than 100,000 days"),
    (["--max-parallelism", "40000"], 2, "at most 32768"),
    (["--max-parallelism", "0"], 2, "expected a positive integer"),
])
def test_demo_options_out_of_range(tmp_path, capsys, argv, code, match):
    ckpt = tmp_path / "ckpt"
    got, _, err = _run(["demo", "--checkpoint", str(ckpt)] + argv, capsys)
    _one_line_error(got, err, code, match)
    assert not ckpt.exists()  # refused before anything was landed


def test_demo_checkpoint_on_a_file_or_an_unwritable_path(tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("x")
    code, _, err = _run(["demo", "--checkpoint", str(f)], capsys)
    _one_line_error(code, err, 1, "exists and is not a directory")
    code, _, err = _run(["demo", "--checkpoint", str(f / "below")], capsys)
    _one_line_error(code, err, 1, "statecore: error:")
    if os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        code, _, err = _run(["demo", "--checkpoint", str(ro / "ckpt")], capsys)
        _one_line_error(code, err, 1, "Permission denied")
