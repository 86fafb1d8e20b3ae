"""Ctrl-C (peltbench.interrupts): what it became is an interruption, never a failed run. The command end to end (exit
status 130, one line, the rerun): tests/test_sweep.py and tests/test_cli.py, `test_ctrl_c_*`."""

from __future__ import annotations

import json

import pytest

from conftest import compose_config, tiny_run_overrides
from peltbench import interrupts

# What Ctrl-C became once, in a fused group (issue 26, 5): OmegaConf's cleanup failing in a half-updated node
IN_ITS_PLACE = AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")


@pytest.mark.parametrize("ctrl_c", [True, False], ids=["after Ctrl-C", "a real crash"])
def test_an_exception_raised_in_place_of_ctrl_c_writes_no_failed_record(ctrl_c, tiny_checkpoint, glue_dir, tmp_path,
                                                                         monkeypatch):
    import peltbench.runner
    from peltbench.record import record_path
    from peltbench.runner import run_group

    def fit(*args, **kwargs):
        raise IN_ITS_PLACE

    monkeypatch.setattr(peltbench.runner, "fit", fit)
    monkeypatch.setattr(interrupts, "_received", ctrl_c)
    cfg = compose_config("method=lora", "task=rte", *tiny_run_overrides(tiny_checkpoint, glue_dir, tmp_path))
    path = record_path(cfg, tmp_path)
    if ctrl_c:
        with pytest.raises(KeyboardInterrupt):
            run_group([cfg])
        assert not path.exists()  # the next run of the same command trains it
    else:
        [outcome] = run_group([cfg])
        assert outcome.status == "failed" and json.loads(path.read_text())["error"] == f"AttributeError: {IN_ITS_PLACE}"
    assert not (path.parent / "claim.json").exists()


def test_interruption_says_how_far_the_command_got(monkeypatch):
    with pytest.raises(KeyboardInterrupt, match="^interrupted: 1 of 2 runs done"):
        with interrupts.interruption(lambda: "interrupted: 1 of 2 runs done"):
            raise KeyboardInterrupt
    with pytest.raises(AttributeError):  # no Ctrl-C came: an error is an error
        with interrupts.interruption(lambda: "interrupted"):
            raise IN_ITS_PLACE
    monkeypatch.setattr(interrupts, "_received", True)
    with pytest.raises(KeyboardInterrupt, match="^interrupted$"):
        with interrupts.interruption(lambda: "interrupted"):
            raise IN_ITS_PLACE


def test_sigterm_stops_the_command_as_ctrl_c_does_with_status_143(monkeypatch):
    """Issue 32, 6: SIGTERM (kill, scancel, a time limit) killed the process where it stood, leaving every claim of a
    fused group; it now raises KeyboardInterrupt as Ctrl-C does, so claims are released, and says so."""
    import os
    import signal

    # as a command starts: Python's own SIGINT handler, SIGTERM's default (the test runner's restored after)
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
                signal.SIGTERM: signal.signal(signal.SIGTERM, signal.SIG_DFL)}
    monkeypatch.setattr(interrupts, "_received", False)
    monkeypatch.setattr(interrupts, "_signal", signal.SIGINT)
    try:
        interrupts.catch_ctrl_c()
        assert signal.getsignal(signal.SIGTERM) is interrupts._handler  # else SIGTERM below would end the test run
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()  # the handler runs here at the latest
        assert interrupts.interrupted() and interrupts.exit_status() == 143
        assert interrupts.stopped_by() == "terminated (SIGTERM)"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            signal.pause()
        assert interrupts.exit_status() == 130 and interrupts.stopped_by() == "interrupted"
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_during_training_a_stop_signal_waits_for_the_end_of_the_step_and_twice_stops_at_once(monkeypatch, caplog):
    """Issue 47: inside the training loop (step_boundaries) Ctrl-C and SIGTERM only say that a stop waits (the loop
    writes a checkpoint at the end of the step, then `stop()` raises); the same signal again stops at once; outside
    the loop a signal stops at once, as before."""
    import signal

    monkeypatch.setattr(interrupts, "_received", False)
    monkeypatch.setattr(interrupts, "_pending", None)
    with interrupts.step_boundaries():
        interrupts._handler(signal.SIGINT, None)  # returns: the stop waits
        assert interrupts.stop_pending() and interrupts.interrupted()
        with pytest.raises(KeyboardInterrupt):
            interrupts._handler(signal.SIGINT, None)  # Ctrl-C again: at once
        with pytest.raises(KeyboardInterrupt):
            interrupts.stop()  # the end of the step, after the checkpoint
        assert not interrupts.stop_pending()
        followed = []
        interrupts._defer(signal.SIGUSR2, followed.append, "the job requeues")  # a SLURM job's USR2
        interrupts.stop()
        assert followed == [signal.SIGUSR2]
    assert "Ctrl-C: a checkpoint at the end of this training step, then the command stops (Ctrl-C again to stop at " \
           "once)" in caplog.text
    with pytest.raises(KeyboardInterrupt):
        interrupts._handler(signal.SIGTERM, None)  # outside training
