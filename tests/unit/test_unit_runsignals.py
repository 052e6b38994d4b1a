"""What stop signals do to ``elasticrun``: the first stops the job (at once while it follows,
once submitted while it submits); any further one is told and changes nothing; none after the
job ended. The handler (``run.SignalGate``) raises ``Stop`` once, whatever comes after."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticctl import runsignals
from elasticctl.run import STOP_SIGNALS, SignalGate, Stop
from elasticctl.runsignals import Act, Phase, Stops, ended, following, react

NAMES = [s.name for s in STOP_SIGNALS]


def test_the_first_signal_while_following_interrupts_and_every_further_one_is_told() -> None:
    now = following(Stops(), "job-1")
    now, act = react(now, "SIGTERM")
    assert (now.phase, now.why, act) == (Phase.STOPPING, "SIGTERM", Act.INTERRUPT)
    for sig in ("SIGTERM", "SIGINT", "SIGHUP"):
        after, act = react(now, sig)
        assert (after, act) == (now, Act.TELL)
    assert runsignals.told(now, "SIGINT") == "elasticrun: Ctrl-C again: already stopping job job-1\n"


def test_a_signal_during_the_submit_stops_the_job_once_it_is_submitted() -> None:
    now, act = react(Stops(), "SIGINT")
    assert act is Act.DEFER
    now, act = react(now, "SIGTERM")
    assert act is Act.TELL and now.why == "SIGINT"
    assert "as soon as it is submitted" in runsignals.told(now, "SIGTERM")
    now = following(now, "job-1")
    assert (now.phase, now.job) == (Phase.STOPPING, "job-1")
    assert react(now, "SIGTERM")[1] is Act.TELL


def test_after_the_job_ended_a_signal_stops_nothing() -> None:
    now = ended(following(Stops(), "job-1"))
    assert react(now, "SIGTERM") == (now, Act.IGNORE)
    stopping = react(following(Stops(), "job-1"), "SIGTERM")[0]
    assert ended(stopping) == stopping  # a stop under way is not an end


@given(st.lists(st.sampled_from([*NAMES, "submitted", "ended"]), max_size=12))
def test_at_most_one_interrupt_and_none_after_the_end(events: list[str]) -> None:
    now, interrupts, over = Stops(), 0, False
    for event in events:
        if event == "submitted":
            now = following(now, "job-1")
        elif event == "ended":
            over = over or now.phase is Phase.FOLLOWING
            now = ended(now)
        else:
            now, act = react(now, event)
            interrupts += act is Act.INTERRUPT
            assert not (over and act is Act.INTERRUPT)
    assert interrupts <= 1


def test_the_gate_raises_stop_once_and_tells_the_rest(capfd: pytest.CaptureFixture[str]) -> None:
    gate = SignalGate()
    gate.following("job-1")
    with pytest.raises(Stop, match="SIGTERM"):
        gate._on_signal(signal.SIGTERM, None)
    gate._on_signal(signal.SIGTERM, None)
    gate._on_signal(signal.SIGINT, None)
    err = capfd.readouterr().err
    assert "SIGTERM again: already stopping job job-1" in err and "Ctrl-C again" in err
    assert "Traceback" not in err


def test_the_gate_stops_a_job_whose_submit_a_signal_interrupted() -> None:
    gate = SignalGate()
    gate._on_signal(signal.SIGHUP, None)  # during the submit: remembered, not raised
    with pytest.raises(Stop, match="SIGHUP"):
        gate.following("job-1")
    gate._on_signal(signal.SIGTERM, None)  # and nothing more


def test_the_gate_handles_real_signals_in_order() -> None:
    """Installed for real: two SIGTERMs, as ``timeout`` sends them to elasticrun and its group."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    gate = SignalGate()
    try:
        gate.install()
        gate.following("job-1")
        with pytest.raises(Stop):
            signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
        assert gate.now.phase is Phase.STOPPING and gate.now.why == "SIGTERM"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
