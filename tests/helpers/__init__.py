"""What the tests share, imported as ``tests.helpers.X`` (pytest puts the checkout on sys.path):
the real clusters' session fixtures (cluster_fixture, pbs_fixture, docker_fixture), the Slurm roots
(slurm_roots, also a script), per-layer helpers (hook_helpers, watch_helpers, ...) and the
stand-ins in fakes/. No test module imports another: what two of them need lives here."""
