"""Without a network a Hub model or data set fails within seconds, in one line; with one, nothing changes.

A local HTTP server stands in for a reachable Hub and a closed local port for an unreachable one (HF_ENDPOINT).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from peltbench import hub


class _Answers(BaseHTTPRequestHandler):
    def do_HEAD(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def answering_endpoint():
    server = HTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def closed_endpoint() -> str:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def online(monkeypatch):
    """The process as without HF_HUB_OFFLINE (the tests set it), restored afterwards."""
    import datasets.config
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    hub._unreachable.cache_clear()
    yield constants
    hub._unreachable.cache_clear()


def test_a_hub_that_answers_changes_nothing(online, monkeypatch, answering_endpoint):
    monkeypatch.setattr(online, "ENDPOINT", answering_endpoint)
    hub.use_hub()
    assert online.HF_HUB_OFFLINE is False


def test_an_unreachable_hub_means_the_cache_only_for_this_process(online, monkeypatch, caplog):
    import datasets.config

    monkeypatch.setattr(online, "ENDPOINT", closed_endpoint())
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="peltbench"):
        hub.use_hub()
    assert time.monotonic() - start < hub.PROBE_TIMEOUT_S
    assert online.HF_HUB_OFFLINE is True and datasets.config.HF_HUB_OFFLINE is True
    [line] = [r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert line.startswith(f"the Hugging Face Hub ({online.ENDPOINT}) cannot be reached (")


def test_huggingface_hub_warnings_appear_once(monkeypatch):
    library = logging.getLogger("huggingface_hub")
    own = logging.StreamHandler()
    monkeypatch.setattr(library, "handlers", [own])
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])  # as Hydra configures the root
    hub.use_hub()
    assert own not in library.handlers  # its records reach the console and the job log through the root logger


def test_an_offline_hub_data_set_fails_at_once_in_one_line(online, monkeypatch, tmp_path, caplog):
    import datasets.config

    from conftest import compose_config
    from peltbench import UserError
    from peltbench.data import _load_dataset
    from peltbench.tasks import TaskSpec

    monkeypatch.setattr(online, "ENDPOINT", closed_endpoint())
    monkeypatch.setattr(online, "HF_HUB_CACHE", str(tmp_path / "hub"))  # empty caches
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    task = TaskSpec.from_config(compose_config("method=lora", "task=rte").task)
    with pytest.raises(UserError, match=r"^could not load nyu-mll/glue/rte \(train\) from the Hugging Face Hub or the "
                                        r"local datasets cache: [^\n]*Offline\? Point data.dir at a local copy of its files"):
        _load_dataset(task, "train")
    assert not any("Retry" in record.getMessage() for record in caplog.records)


def test_the_readme_example_offline_fails_in_one_line_without_retries(tmp_path):
    """`peltbench method=lora task=rte` (bert-base-uncased and nyu-mll/glue) with no network and no HF_HUB_OFFLINE.

    Before, huggingface_hub retried for 23 s, with 22 warning lines, before this line."""
    env = {key: value for key, value in os.environ.items() if key != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=closed_endpoint(), HF_HOME=str(tmp_path / "hf"))  # no Hub, an empty Hugging Face cache
    command = [str(Path(sys.executable).with_name("peltbench")), "method=lora", "task=rte", f"results_dir={tmp_path}"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("peltbench: error: task=rte: could not load nyu-mll/glue/rte (train) from the Hugging "
                                    "Face Hub or the local datasets cache: ")  # the data is read before the first run
    assert "Retry" not in result.stdout + result.stderr and "WARNING" not in result.stdout
