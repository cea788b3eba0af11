"""The operator's worker-side garbage-collector freeze (``freeze_worker_gc``), run in a fresh
interpreter: ``gc.freeze`` affects the whole process, and pytest's must stay as it is."""

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent("""
    import gc, sys, types
    from statecore.spark import worker_gc as op

    op.freeze_worker_gc()                       # first task: freezes what exists
    first = gc.get_freeze_count()
    assert first > 1000, first

    kept = [[i] for i in range(50_000)]          # a task's live objects, no new module
    op.freeze_worker_gc()
    assert gc.get_freeze_count() == first, (gc.get_freeze_count(), first)

    mod = types.ModuleType("statecore_test_late_import")   # what a task's import adds
    mod.table = [[i] for i in range(20_000)]
    sys.modules[mod.__name__] = mod
    op.freeze_worker_gc()                       # the next task: frozen again, imports included
    assert gc.get_freeze_count() >= first + 70_000, (gc.get_freeze_count(), first)
    assert op._GC_FROZEN_COUNT == gc.get_freeze_count()

    again = gc.get_freeze_count()
    op.freeze_worker_gc()                       # nothing imported since: no freeze
    assert gc.get_freeze_count() == again

    def import_one(i):
        m = types.ModuleType(f"statecore_test_late_import_{i}")
        sys.modules[m.__name__] = m

    for i in range(op._GC_MAX_FREEZES - 2):      # up to the cap, each import refreezes
        import_one(i)
        op.freeze_worker_gc()
    assert op._GC_FREEZES == op._GC_MAX_FREEZES
    capped = gc.get_freeze_count()
    late = [[i] for i in range(10_000)]
    import_one("after-cap")
    op.freeze_worker_gc()                       # an import per task: the cap holds
    assert gc.get_freeze_count() == capped
    print("ok")
""")


def test_the_worker_freezes_again_only_after_imports():
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
