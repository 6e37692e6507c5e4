"""The health rules on hand-made metrics rows (no training): debounce, pending, silence, resolution, restarts,
guards configured off, risk points, and the files they write."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from moe_trainer.watch import (
    ATTEMPT_ENV,
    BandPoint,
    DropRate,
    EvalBand,
    RiskPoint,
    RunFacts,
    Stall,
    WatchConfig,
    Watcher,
)

FACTS = RunFacts(num_steps=2000, update_window=128, skip_nonfinite=True, max_grad_norm=1.0, n_experts=8,
                 top_k=2, capacity_factor=1.25)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def row(step: int, **kw: Any) -> dict[str, Any]:
    base = {"step": step, "loss": 2.0, "grad_norm": 0.5, "update_norm": 0.1, "skipped": False,
            "tokens_per_s": 1000.0, "mfu": 0.1, "drop_rate": 0.01, "routing_entropy": [1.5, 1.5],
            "expert_load": [[0.125] * 8, [0.125] * 8], "update_filter_armed": step >= 64}
    return {**base, **kw}


def events(path: Path) -> list[dict[str, Any]]:
    f = path / "alerts.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def test_a_rule_firing_for_1000_steps_writes_one_firing_and_one_resolution(tmp_path: Path) -> None:
    clock = Clock()
    w = Watcher(WatchConfig(), str(tmp_path), FACTS, clock=clock)
    for step in range(1, 1201):
        clock.t += 1
        w.observe(row(step, drop_rate=0.2 if 100 <= step < 1100 else 0.01))
    drops = [e for e in events(tmp_path) if e["rule"] == "drop_rate"]
    assert [e["event"] for e in drops] == ["fired", "resolved"]
    fired, resolved = drops
    # pending 5 steps: the fifth bad row fires, and `since` is the first bad one
    assert (fired["step"], fired["since_step"], fired["severity"]) == (104, 100, "warning")
    assert resolved["step"] == 1102 and resolved["id"] == fired["id"]  # three clear rows resolve it
    assert [e for e in events(tmp_path) if e["rule"] != "drop_rate"] == []
    metrics_rows = w.drain()
    assert [r["alert"]["event"] for r in metrics_rows] == ["fired", "resolved"]


def test_pending_steps_and_silence_window(tmp_path: Path) -> None:
    clock = Clock()
    cfg = WatchConfig(drop_rate=DropRate(pending_steps=5, resolve_steps=1, silence_s=100.0))
    w = Watcher(cfg, str(tmp_path), FACTS, clock=clock)
    bad = [*range(10, 14), *range(20, 26), *range(40, 46), *range(300, 306)]  # 4 bad rows never fire
    for step in range(1, 320):
        clock.t += 1
        w.observe(row(step, drop_rate=0.5 if step in bad else 0.0))
    fired = [e for e in events(tmp_path) if e["event"] == "fired"]
    assert [(e["step"], e["silenced"]) for e in fired] == [(24, False), (44, True), (304, False)]


def test_nonfinite_values_and_a_new_attempt_resolving_the_old_ones(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ATTEMPT_ENV, "1")
    w = Watcher(WatchConfig(), str(tmp_path), FACTS)
    w.observe(row(5, loss="nan", grad_norm="nan", skipped=True, nonfinite=True))
    (fired,) = events(tmp_path)
    assert fired["rule"] == "nonfinite" and fired["attempt"] == "1" and fired["values"]["loss"] == "nan"
    # the process dies without close(); the next attempt resolves what it left open
    monkeypatch.setenv(ATTEMPT_ENV, "2")
    Watcher(WatchConfig(), str(tmp_path), FACTS, start_step=4).close()
    last = events(tmp_path)[1]
    assert (last["event"], last["id"], last["reason"]) == ("resolved", fired["id"], "its attempt ended")
    state = json.loads((tmp_path / "watch.json").read_text())
    assert state["closed"] and state["attempt"] == "2" and state["active"] == []


def test_guards_configured_off_fire_on_the_first_row(tmp_path: Path) -> None:
    facts = RunFacts(num_steps=2000, update_window=0, skip_nonfinite=False, max_grad_norm=None)
    w = Watcher(WatchConfig(), str(tmp_path), facts)
    w.observe(row(1))
    (fired,) = events(tmp_path)
    assert fired["rule"] == "guards" and fired["step"] == 1 and fired["severity"] == "critical"
    assert "update-norm clipping is off" in fired["summary"] and "skip_nonfinite=false" in fired["summary"]


def test_update_filter_on_but_never_armed(tmp_path: Path) -> None:
    w = Watcher(WatchConfig(), str(tmp_path), FACTS)
    for step in range(1, 130):
        w.observe(row(step, update_filter_armed=False, skipped=step % 2 == 0))
    guards = [e for e in events(tmp_path) if e["rule"] == "guards"]
    assert guards and guards[0]["step"] == 128 and "not acting" in guards[0]["summary"]


def test_moe_entropy_and_imbalance(tmp_path: Path) -> None:
    w = Watcher(WatchConfig(), str(tmp_path), FACTS)
    collapsed = [[0.5, 0.5] + [0.0] * 6, [0.125] * 8]
    for step in range(1, 31):
        w.observe(row(step, routing_entropy=[0.05, 1.5], expert_load=collapsed))
    fired = {e["rule"]: e for e in events(tmp_path) if e["event"] == "fired"}
    assert fired["router_entropy"]["step"] == 10 and "layer 0" in fired["router_entropy"]["summary"]
    assert fired["load_imbalance"]["step"] == 20 and fired["load_imbalance"]["values"]["imbalance"][0] == 1.0


def test_throughput_below_half_the_median(tmp_path: Path) -> None:
    w = Watcher(WatchConfig(), str(tmp_path), FACTS)
    for step in range(1, 80):
        w.observe(row(step, tokens_per_s=1000.0 if step < 50 else 300.0))
    (fired,) = [e for e in events(tmp_path) if e["event"] == "fired"]
    assert fired["rule"] == "throughput" and fired["step"] == 65  # 16 of the last 20 steps slow
    assert math.isclose(fired["values"]["median_tokens_per_s"], 1000.0)


def test_stall_is_checked_by_time(tmp_path: Path) -> None:
    clock = Clock()
    w = Watcher(WatchConfig(stall=Stall(no_progress_s=60.0)), str(tmp_path), FACTS, clock=clock)
    w.observe(row(1))
    clock.t += 59
    w.tick()
    assert events(tmp_path) == []
    clock.t += 2
    w.tick()
    clock.t += 100
    w.tick()  # still stalled: no second firing
    w.observe(row(2))
    assert [(e["event"], e["rule"]) for e in events(tmp_path)] == [("fired", "stall"), ("resolved", "stall")]


def test_risk_points_pass_or_fail_once(tmp_path: Path) -> None:
    cfg = WatchConfig(risk_points=(
        RiskPoint("quarter", at_fraction=0.25, below=2.5, action="keep going"),
        RiskPoint("half", at_fraction=0.5, below=1.5, action="halve the LR and resume from step 500"),
        RiskPoint("eval band", metric="eval.micro.bpb", at_step=600, above=1.0, below=1.2),
    ))
    w = Watcher(cfg, str(tmp_path), FACTS)
    for step in range(1, 1100):
        w.observe(row(step))
        if step % 300 == 0:
            w.observe({"step": step, "eval": {"micro": {"bpb": 1.3}}})
    got = {e["rule"]: e for e in events(tmp_path)}
    assert got["risk:quarter"]["event"] == "risk_passed" and got["risk:quarter"]["step"] == 500
    assert got["risk:half"]["event"] == "risk_failed" and "halve the LR" in got["risk:half"]["summary"]
    assert got["risk:eval band"]["event"] == "risk_failed" and got["risk:eval band"]["step"] == 600
    assert len(events(tmp_path)) == 3
    with pytest.raises(ValueError, match="give at_step or at_fraction"):
        RiskPoint("x", below=1.0)


def test_eval_regression(tmp_path: Path) -> None:
    w = Watcher(WatchConfig(), str(tmp_path), FACTS)
    for step, bpb in ((100, 2.0), (200, 1.8), (300, 1.9), (400, 1.7)):
        w.observe({"step": step, "eval": {"micro": {"bpb": bpb}}})
    assert [(e["event"], e["step"]) for e in events(tmp_path)] == [("fired", 300), ("resolved", 400)]


def band_eval(step: int, bpb: float) -> dict[str, Any]:
    return {"step": step, "eval": {"micro": {"bpb": bpb}}}


def test_eval_band_fires_outside_resolves_inside_and_ignores_other_steps(tmp_path: Path) -> None:
    clock = Clock()
    band = EvalBand(points=tuple(BandPoint(s, 1.5 - s / 1000, 1.4 - s / 1000, 1.6 - s / 1000, f"{s // 4}%")
                                 for s in (100, 200, 300, 400)), source="prediction.json sha256 ab12")
    w = Watcher(WatchConfig(eval_band=band), str(tmp_path), FACTS, clock=clock)
    for step, bpb in ((50, 9.0), (100, 1.4), (200, 2.0), (250, 1.0), (300, 1.2), (400, 0.5)):
        clock.t += 10
        w.observe(band_eval(step, bpb))
    got = [(e["event"], e["rule"], e["step"], e["silenced"]) for e in events(tmp_path)
           if e["rule"] == "eval_band"]
    # step 50 and 250 are no band points: neither fires nor clears; 300 is back inside: resolved; 400 leaves
    # the band again 10 s later and is posted (no silence by default: each band point is its own check)
    assert got == [("fired", "eval_band", 200, False), ("resolved", "eval_band", 300, False),
                   ("fired", "eval_band", 400, False)]
    fired = next(e for e in events(tmp_path) if e["event"] == "fired" and e["rule"] == "eval_band")
    assert fired["severity"] == "warning" and math.isclose(fired["values"]["low"], 1.2)
    assert "outside the pre-registered band [1.2000, 1.4000]" in fired["summary"] and "(50% of the run)" in \
        fired["summary"] and "ab12" in fired["summary"]
    # the one sign convention, (predicted - actual) / actual: the run came in above the forecast, so negative
    assert math.isclose(fired["values"]["error_pct"], 100 * (1.3 - 2.0) / 2.0)
    assert "forecast error -35.00%" in fired["summary"]


def test_eval_band_silence_is_still_available_by_override(tmp_path: Path) -> None:
    clock = Clock()
    band = EvalBand(points=tuple(BandPoint(s, 1.0, 0.9, 1.1) for s in (100, 200, 300)), silence_s=60.0)
    w = Watcher(WatchConfig(eval_band=band), str(tmp_path), FACTS, clock=clock)
    for step, bpb in ((100, 2.0), (200, 1.0), (300, 2.0)):
        clock.t += 10
        w.observe(band_eval(step, bpb))
    got = [(e["event"], e["step"], e["silenced"]) for e in events(tmp_path) if e["rule"] == "eval_band"]
    assert got == [("fired", 100, False), ("resolved", 200, False), ("fired", 300, True)]


def test_eval_band_refuses_a_malformed_band() -> None:
    with pytest.raises(ValueError, match="low <= point <= high"):
        BandPoint(100, point=2.0, low=1.0, high=1.5)
    with pytest.raises(ValueError, match="one band point per evaluation step"):
        EvalBand(points=(BandPoint(100, 1.0, 0.9, 1.1), BandPoint(100, 1.0, 0.9, 1.1)))


def test_alerts_on_an_object_store_are_rewritten_whole_after_every_event() -> None:
    import fsspec

    out = "memory://watch-test/run"
    w = Watcher(WatchConfig(drop_rate=DropRate(pending_steps=1, resolve_steps=1)), out, FACTS)
    w.observe(row(1, drop_rate=0.5))
    fs = fsspec.filesystem("memory")
    assert [json.loads(x)["event"] for x in fs.cat_file("/watch-test/run/alerts.jsonl").splitlines()] == \
        ["fired"]
    w.observe(row(2))
    Watcher(WatchConfig(), out, FACTS, start_step=2).close()  # a new attempt keeps the earlier lines
    lines = fs.cat_file("/watch-test/run/alerts.jsonl").splitlines()
    assert [json.loads(x)["event"] for x in lines] == ["fired", "resolved"]
    fs.rm("/watch-test", recursive=True)


def test_skipped_steps_fire_on_a_burst_not_on_isolated_skips_of_a_fast_run(tmp_path: Path) -> None:
    clock = Clock()
    sparse = Watcher(WatchConfig(), str(tmp_path / "sparse"), FACTS, clock=clock)
    for step in range(1, 1001):  # 50 steps a second: the whole run is 20 s, one skip every 150 steps
        clock.t += 0.02
        sparse.observe(row(step, skipped=step % 150 == 0))
    assert [e for e in events(tmp_path / "sparse") if e["rule"] == "skipped_steps"] == []
    burst = Watcher(WatchConfig(), str(tmp_path / "burst"), FACTS, clock=clock)
    for step in range(1, 401):
        clock.t += 0.02
        burst.observe(row(step, skipped=step in (150, 300, 330, 349)))
    fired = [e for e in events(tmp_path / "burst") if e["rule"] == "skipped_steps" and e["event"] == "fired"]
    assert [e["step"] for e in fired] == [349] and fired[0]["values"]["skipped"] == 3  # 300, 330, 349
    assert "in the last 900 s and 100 steps" in fired[0]["summary"]


def test_skip_rate_refuses_an_empty_window() -> None:
    from moe_trainer.health_rules import SkipRate

    with pytest.raises(ValueError, match="window_steps"):
        SkipRate(window_steps=0)
