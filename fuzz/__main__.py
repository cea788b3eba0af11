"""``python -m fuzz``: run a fuzz target with atheris, replay a corpus, or (re)make the seeds.

    python -m fuzz --list
    python -m fuzz data_file --seconds 60          # fuzz; new inputs go to a scratch corpus
    python -m fuzz data_file --replay              # run every seed once (no atheris needed)
    python -m fuzz --make-corpus                   # rewrite fuzz/corpus/<target>/seed-*

Fuzzing reads the seeds in ``fuzz/corpus/<target>/`` and writes what it finds interesting to a
scratch directory (``--work``, default a new temporary one), never into the repository. A
finding (an exception other than StateError, a crash, a hang over ``--timeout`` seconds) stops
the run with a non-zero exit status and leaves the input as ``crash-*`` / ``timeout-*`` in the
work directory; add it to the target's corpus once fixed.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def _replay(target: str) -> int:
    from fuzz.targets import run_one

    d = os.path.join(CORPUS, target)
    n = 0
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            run_one(target, f.read())
        n += 1
    print(f"{target}: {n} seeds replayed")
    return 0


def _instrumented_targets():
    """:mod:`fuzz.targets` imported with coverage instrumentation of statecore and the targets
    only: instrumenting every loaded module (numpy, pyarrow, the standard library) takes half
    a minute per run and adds no feedback about the code under test. Must run before anything
    imports statecore."""
    import atheris

    with atheris.instrument_imports(include=["statecore", "fuzz.targets"]):
        import fuzz.targets
    return fuzz.targets


def _fuzz(target: str, seconds: int, runs: int | None, timeout: int, work: str | None,
          seed: int) -> int:
    import atheris

    run_one = _instrumented_targets().run_one
    work = work or tempfile.mkdtemp(prefix=f"statecore-fuzz-{target}-")
    scratch = os.path.join(work, "corpus")
    os.makedirs(scratch, exist_ok=True)
    args = [sys.argv[0], scratch, os.path.join(CORPUS, target),
            f"-max_total_time={seconds}", f"-timeout={timeout}", "-rss_limit_mb=4096",
            f"-artifact_prefix={work}/", "-print_final_stats=1", f"-seed={seed}"]
    if runs is not None:
        args.append(f"-runs={runs}")
    print(f"fuzzing {target} for {seconds} s; work directory {work}", flush=True)
    atheris.Setup(args, lambda data: run_one(target, data))
    atheris.Fuzz()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="?", help="a target name (--list shows them)")
    p.add_argument("--list", action="store_true", help="list the targets")
    p.add_argument("--seconds", type=int, default=60, help="fuzzing time (default 60)")
    p.add_argument("--runs", type=int, default=None, help="stop after this many inputs")
    p.add_argument("--timeout", type=int, default=20, help="seconds one input may take")
    p.add_argument("--work", default=None, help="scratch directory for findings")
    p.add_argument("--seed", type=int, default=0,
                   help="libFuzzer's random seed (default 0: a new one each run)")
    p.add_argument("--replay", action="store_true", help="run every seed once, no fuzzing")
    p.add_argument("--make-corpus", action="store_true", help="rewrite the seed corpora")
    args = p.parse_args(argv)
    fuzzing = args.target is not None and not (args.list or args.replay or args.make_corpus)
    if fuzzing and "statecore" not in sys.modules:
        TARGETS = _instrumented_targets().TARGETS
    else:
        from fuzz.targets import TARGETS
    if args.target is not None and args.target not in TARGETS:
        p.error(f"unknown target {args.target!r}; one of {', '.join(sorted(TARGETS))}")
    if args.list:
        for name, fn in sorted(TARGETS.items()):
            print(f"{name:12s} {fn.__doc__.splitlines()[0]}")
        return 0
    if args.make_corpus:
        from fuzz.corpus_seeds import make_corpus

        for old in glob.glob(os.path.join(CORPUS, "*", "seed-*")):  # findings stay
            os.remove(old)
        for target, n in make_corpus(CORPUS).items():
            print(f"{target}: {n} seeds")
        return 0
    if args.target is None:
        p.error("a target is needed (--list shows them)")
    if args.replay:
        return _replay(args.target)
    return _fuzz(args.target, args.seconds, args.runs, args.timeout, args.work, args.seed)


if __name__ == "__main__":
    sys.exit(main())
