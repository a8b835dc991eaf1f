"""link_monitor: reading an emulated host's tbf shapers (parsing, arithmetic, the sampler
thread). The tc side needs the emulated cluster; here tc's output is given as text and
read_link is replaced, so nothing needs root."""
from __future__ import annotations

import time

import pytest

from dlcomm.tools.emulation import link_monitor as lm
from dlcomm.tools.emulation.link_monitor import LinkMonitor, LinkSample, parse_tbf_stats

TC_TEXT = ("qdisc tbf 8e3f: root refcnt 3 rate 50Mbit burst 128Kb lat 650ms \n"
           " Sent 1669655 bytes 1222 pkt (dropped 0, overlimits 87 requeues 0) \n"
           " backlog {backlog} 5p requeues 0\n")


@pytest.mark.parametrize("backlog,expected", [
    ("0b", 0), ("72705b", 72705), ("71Kb", 71 * 1024), ("4Mb", 4 << 20), ("1Gb", 1 << 30),
])
def test_parse_reads_sent_and_backlog_with_iproute2_units(backlog: str, expected: int) -> None:
    assert parse_tbf_stats(TC_TEXT.format(backlog=backlog)) == (1669655, expected)


def test_parse_rejects_other_output() -> None:
    with pytest.raises(ValueError, match="no 'Sent N bytes'"):
        parse_tbf_stats("qdisc noqueue 0: root refcnt 2\n")


def test_shaper_commands_name_the_hosts_two_shapers() -> None:
    out, into = lm.shaper_commands(3)
    assert out == ["tc", "-s", "-n", "dlc-h3", "qdisc", "show", "dev", "dlc-eth0"]
    assert into == ["tc", "-s", "-n", "dlc-br", "qdisc", "show", "dev", "dlc-p3"]
    for bad in (-1, True, "3"):
        with pytest.raises(ValueError, match="host must be"):
            lm.shaper_commands(bad)  # type: ignore[arg-type]


def test_summarize_window_gives_bytes_per_step_rate_and_peak_queue() -> None:
    # 1 MB each way per second; samples at 0.5 s steps, one outside the window
    samples = [LinkSample(t, int(t * 1e6), q, int(t * 2e6), 2 * q)
               for t, q in [(0.0, 0), (1.0, 5000), (1.5, 9000), (2.0, 1000), (3.0, 77000)]]
    got = lm.summarize_window(samples, 0.5, 2.5, steps=4)
    # samples at 1.0 and 2.0 span 1 s; the window is 2 s long: 2 MB / 4 steps out
    assert got["out_mb_per_step"] == pytest.approx(0.5)
    assert got["in_mb_per_step"] == pytest.approx(1.0)
    assert got["out_mbit_s"] == pytest.approx(8.0) and got["in_mbit_s"] == pytest.approx(16.0)
    assert got["peak_out_backlog_kb"] == 9.0 and got["peak_in_backlog_kb"] == 18.0
    with pytest.raises(ValueError, match=">= 2 samples"):
        lm.summarize_window(samples, 2.5, 2.9, steps=1)


def test_monitor_samples_until_stopped_and_reports_a_failing_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_read(host: int) -> LinkSample:
        calls.append(host)
        if len(calls) > 5:
            raise RuntimeError("tc failed")
        return LinkSample(float(len(calls)), 0, 0, 0, 0)

    monkeypatch.setattr(lm, "read_link", fake_read)
    with pytest.raises(ValueError, match="interval"):
        LinkMonitor(1, interval=0)
    mon = LinkMonitor(2, interval=0.001).start()
    for _ in range(2000):  # the fake fails at its 6th read
        if mon.error is not None:
            break
        time.sleep(0.001)
    with pytest.raises(RuntimeError, match="link monitor of host 2 failed: tc failed"):
        mon.stop()
    assert set(calls) == {2} and len(mon.samples) == 5
