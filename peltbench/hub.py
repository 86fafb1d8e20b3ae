"""Reaching the Hugging Face Hub: one check before a model or a data set is fetched from it.

Without a network huggingface_hub retries each file it cannot look up, five times with back-off (about 23 s a
file, two warnings a try, each printed twice: by its own handler and by the root logger Hydra configures), and
only then says what a user needs to hear. `use_hub()` asks the Hub's endpoint once per process instead (a HEAD
request through huggingface_hub's own HTTP client, so proxies and HF_ENDPOINT apply). If it answers, nothing
changes. If it does not, this process goes on as with HF_HUB_OFFLINE=1: what the Hugging Face cache holds still
loads, anything else fails at once with the caller's one-line message.
"""

from __future__ import annotations

import functools
import logging
import sys

log = logging.getLogger("peltbench")

PROBE_TIMEOUT_S = 5.0  # a working connection answers a HEAD request well within this


def use_hub() -> None:
    """Call before loading a model, tokenizer or data set from the Hub (`from_pretrained`, `load_dataset`)."""
    from huggingface_hub import constants

    _one_handler()
    if constants.HF_HUB_OFFLINE:
        return  # asked for: the libraries fail at once on what is not cached
    reason = _unreachable(constants.ENDPOINT)
    if reason is None:
        return
    log.info("the Hugging Face Hub (%s) cannot be reached (%s): using only the local Hugging Face cache, as "
             "with HF_HUB_OFFLINE=1", constants.ENDPOINT, reason)
    _go_offline()


@functools.lru_cache(maxsize=1)
def _unreachable(endpoint: str) -> str | None:
    """Why `endpoint` does not answer, or None when it does (any HTTP status is an answer). Asked once per process."""
    from huggingface_hub import get_session

    try:
        get_session().head(endpoint, timeout=PROBE_TIMEOUT_S)
    except Exception as error:  # no DNS, no route, refused, timed out, a proxy that fails: the Hub is not there
        return (str(error).strip().splitlines() or [type(error).__name__])[0]
    return None


def _go_offline() -> None:
    """HF_HUB_OFFLINE=1 for this process from now on. transformers asks huggingface_hub's flag at each call;
    datasets copies it when imported, so its copy is set too where it is loaded already."""
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = True
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = True


def _one_handler() -> None:
    """huggingface_hub adds its own stderr handler and also propagates to the root logger: where the root logger
    has handlers (Hydra's console and job log), drop huggingface_hub's, so each of its warnings appears once."""
    if not logging.getLogger().handlers:
        return
    library = logging.getLogger("huggingface_hub")
    for handler in list(library.handlers):
        if type(handler) is logging.StreamHandler:
            library.removeHandler(handler)
