"""peltbench: few-shot GLUE sweeps of parameter-efficient language-model tuning (UniPELT, ACL 2022)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("peltbench")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"


class UserError(Exception):
    """A problem with the user's config or inputs: reported as one line, and no result record is written."""


def load_run(run_dir, device=None, *, data_dir=None, model=None):
    """Rebuild a run saved with save.weights=true on its backbone; `.predict()` rescores its test set (runner.load_run).
    `data_dir=` and `model=` say where the run's data and model are, where not where its record says."""
    from .runner import load_run as load

    return load(run_dir, device, data_dir=data_dir, model=model)
