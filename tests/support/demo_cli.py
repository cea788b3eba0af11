"""What ``statecore demo`` makes of its command line, without running the job."""

from statecore.demo import job as job_mod


def parsed_demo_config(monkeypatch, argv):
    """The DemoConfig ``statecore demo ARGV --quiet`` would run: ``run_demo`` is replaced (by
    ``monkeypatch``) by one that records its config and returns an empty summary."""
    from statecore.cli import main

    class Summary:
        def lines(self):
            return []

    seen = []
    monkeypatch.setattr(job_mod, "run_demo",
                        lambda cfg, progress=None: seen.append(cfg) or Summary())
    main(["demo", *argv, "--quiet"])
    (cfg,) = seen
    return cfg
