"""The site's build: incremental rewrites, --check, policy errors, and the dashboard's public mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from marin.publish.cli import main as publish_main
from marin.publish.policy import PolicyError, load_policy, parse_policy
from marin.publish.serve import create_public_app
from marin.publish.site import MANIFEST, publish
from tests.fakes.synthetic_prefix import write_prefix
from tests.publish.planted import PUBLIC, forbidden, write_planted_prefix

ALL = parse_policy({"select": {"all": True}})
GLOBAL = {"index.html", "catalogue.html", "predictions.html", "alerts.html", "timeline.html", "data.html"}


@pytest.fixture()
def lab(tmp_path: Path) -> Path:
    prefix = tmp_path / "lab"
    write_prefix(str(prefix), experiments=4, metrics_rows=20, groups=4)
    return prefix


def _mtimes(out: Path) -> dict[str, int]:
    return {p.relative_to(out).as_posix(): p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}


def test_one_changed_step_rewrites_only_its_pages_and_the_index(lab: Path, tmp_path: Path) -> None:
    out = tmp_path / "site"
    first = publish(str(lab), str(out), ALL)
    assert first.problems == [] and len(first.written) > 80
    again = publish(str(lab), str(out), ALL)
    assert set(again.rendered) == {"index.html"}  # nothing else is even rendered (not even GLOBAL's others)
    assert set(again.written) <= {"index.html"}
    before = _mtimes(out)
    step = next(lab.glob("sweep00/train/model0-*"))
    with open(step / ".marin" / "events.jsonl", "a") as f:
        event = {"ts": 1764000300.0, "event": "PREEMPTED", "attempt": 1, "message": "spot"}
        f.write(json.dumps(event) + "\n")
    third = publish(str(lab), str(out), ALL)
    step_page = f"steps/sweep00/train/{step.name}.html"
    changed = {f for f, t in _mtimes(out).items() if before.get(f) != t}
    assert step_page in changed and "timeline.html" in changed
    assert changed <= {step_page, "index.html", "timeline.html", MANIFEST} | {
        f for f in third.rendered if f.startswith(("experiments/", "compare/"))}
    assert "spot" in (out / "timeline.html").read_text()


def test_a_tampered_site_manifest_never_deletes_outside_the_site(lab: Path) -> None:
    """The site's own manifest decides what a re-publish deletes. With the site inside the prefix (`marin run
    --publish`'s default), a manifest naming '../...' would delete a step's records: such entries are refused
    and reported, never deleted."""
    out = lab / "site"
    assert publish(str(lab), str(out), ALL).problems == []
    status = next(lab.glob("sweep00/train/model0-*")) / ".marin" / "status.json"
    manifest = json.loads((out / MANIFEST).read_text())
    victim = "../" + status.relative_to(lab).as_posix()
    manifest["pages"][victim] = {"digest": "x"}
    manifest["pages"]["gone.html"] = {"digest": "x"}
    (out / "gone.html").write_text("an old page")
    (out / MANIFEST).write_text(json.dumps(manifest))
    again = publish(str(lab), str(out), ALL)
    assert status.exists() and not (out / "gone.html").exists()
    assert again.deleted == ["gone.html"]
    [problem] = again.problems
    assert victim in problem and "not deleted" in problem and MANIFEST in problem


def test_a_name_learnt_later_renames_the_files_it_appears_in(lab: Path, tmp_path: Path) -> None:
    """The page file names kept from the last build are dropped when the redactor learns a new name: a user
    named like a step's folder hides that folder's name in every file name from then on."""
    out = tmp_path / "site"
    publish(str(lab), str(out), ALL)
    assert any("model0-" in p.name for p in out.rglob("*.html"))
    step = next(lab.glob("sweep00/train/model0-*"))
    info = json.loads((step / ".marin" / "step.json").read_text())
    (step / ".marin" / "step.json").write_text(json.dumps({**info, "user": "model0"}))
    report = publish(str(lab), str(out), ALL)
    assert report.problems == []
    names = [p.relative_to(out).as_posix() for p in out.rglob("*")]
    assert [n for n in names if "model0" in n] == []
    assert "model0" not in (out / MANIFEST).read_text()


def test_an_output_path_inside_a_step_is_not_read_as_the_steps_files(lab: Path) -> None:
    step = next(lab.glob("sweep00/train/model0-*"))
    out = step / "site"
    assert publish(str(lab), str(out), ALL).problems == []
    again = publish(str(lab), str(out), ALL)
    assert set(again.rendered) == {"index.html"}


def test_forked_render_writes_the_same_bytes(lab: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from marin.publish import site

    splits: list[int] = []
    real_split = site.render_split

    def counted(items: Any, *args: Any, **kwargs: Any) -> Any:
        splits.append(len(items))
        return real_split(items, *args, **kwargs)

    monkeypatch.setattr(site, "render_split", counted)
    # forked whatever earlier tests of this process started (JAX, threads): the rule is render.can_fork's
    monkeypatch.setattr(site, "can_fork", lambda local: local)
    one = publish(str(lab), str(tmp_path / "one"), ALL, jobs=1)
    assert splits == []
    two = publish(str(lab), str(tmp_path / "two"), ALL, jobs=2)
    assert len(splits) == 1 and splits[0] > 80  # the second build really was split over forked workers
    assert one.problems == two.problems == [] and sorted(one.written) == sorted(two.written)
    for f in one.written:
        if f != "index.html":  # it says when it was published
            assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f
    manifests = [json.loads((tmp_path / d / MANIFEST).read_text())["pages"] for d in ("one", "two")]
    assert {k: v for k, v in manifests[0].items() if k != "index.html"} == {
        k: v for k, v in manifests[1].items() if k != "index.html"}


def test_a_page_is_rerendered_when_a_page_it_links_to_is_published_or_hidden(lab: Path,
                                                                            tmp_path: Path) -> None:
    out = tmp_path / "site"
    one = parse_policy({"select": {"experiments": ["exp100_*"]}})
    publish(str(lab), str(out), one)
    before = json.loads((out / MANIFEST).read_text())["pages"]
    everything = publish(str(lab), str(out), ALL)
    after = json.loads((out / MANIFEST).read_text())["pages"]
    # pages whose records did not change (same digest) but which link to pages published only now
    relinked = [f for f in before if f in after and before[f]["digest"] == after[f]["digest"]
                and before[f].get("links") != after[f].get("links")]
    assert relinked and set(relinked) <= set(everything.rendered)
    kept = [f for f in before if f in after and before[f] == after[f]]
    assert kept and not set(kept) & set(everything.rendered)  # the rest is not even rendered
    publish(str(lab), str(out), one)  # hiding them again: the links to them are dropped again
    assert json.loads((out / MANIFEST).read_text())["pages"] == {
        **before, "index.html": json.loads((out / MANIFEST).read_text())["pages"]["index.html"]}


def test_check_lists_changes_and_hidden_and_writes_nothing(lab: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "publish.toml"
    policy.write_text('[select]\nexperiments = ["exp100_*"]\n')
    out = tmp_path / "site"
    assert publish_main(["--prefix", str(lab), "--out", str(out), "--policy", str(policy), "--check"]) == 0
    text = capsys.readouterr().out
    assert not out.exists()
    assert "hidden by the policy: 3 experiment(s)" in text and "exp101_sweep-00000001" in text
    assert "changed  experiments/exp100_sweep-00000000.html" in text
    assert publish_main(["--prefix", str(lab), "--out", str(out), "--policy", str(policy)]) == 0
    assert (out / "experiments/exp100_sweep-00000000.html").exists()
    assert not (out / "experiments/exp101_sweep-00000001.html").exists()
    # publishing more, then less: the page of an experiment the policy now hides is deleted
    policy.write_text('[select]\nall = true\n')
    publish_main(["--prefix", str(lab), "--out", str(out), "--policy", str(policy)])
    assert (out / "experiments/exp101_sweep-00000001.html").exists()
    policy.write_text('[select]\nexperiments = ["exp100_*"]\n')
    publish_main(["--prefix", str(lab), "--out", str(out), "--policy", str(policy)])
    assert not (out / "experiments/exp101_sweep-00000001.html").exists()
    assert "exp101" not in (out / "index.html").read_text()


@pytest.mark.parametrize(("text", "message"), [
    ('[select]\nal = true\n',
     "unknown key select.al in the publish policy; valid keys of [select]: all, labels"),
    ('[sites]\ntitle = "x"\n', "unknown table [sites]"),
    ('[select]\nall = "yes"\n', "select.all: expected true or false"),
    ('[compare]\npairs = [["a"]]\n', "compare.pairs: expected a list of [baseline, other]"),
    ('[select\n', "is not valid TOML"),
], ids=["unknown-key", "unknown-table", "bad-bool", "bad-pairs", "bad-toml"])
def test_policy_errors_name_the_key_and_the_valid_ones(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "publish.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=None) as e:
        load_policy(path)
    assert message in str(e.value)


def test_default_policy_publishes_nothing(lab: Path, tmp_path: Path) -> None:
    report = publish(str(lab), str(tmp_path / "site"), load_policy(None))
    assert len(report.hidden) == 4 and not list((tmp_path / "site").glob("experiments/*"))


def test_public_dashboard_applies_the_policy_refuses_raw_and_rate_limits(tmp_path: Path) -> None:
    prefix = tmp_path / "lab"
    step = write_planted_prefix(prefix)
    policy = parse_policy({"select": {"experiments": [PUBLIC]}})
    client = TestClient(create_public_app(str(prefix), policy, rate=0.001, burst=1000))
    rel = f"sweep00/train/{step.name}"
    for url in ("/", f"/experiments/{PUBLIC}", f"/steps/{rel}", f"/api/steps/{rel}", "/catalogue", "/alerts"):
        r = client.get(url)
        assert r.status_code == 200, url
        for bad in forbidden():
            assert bad.lower() not in r.text.lower(), (url, bad)
    for url in ("/experiments/exp101_sweep-00000001", "/files/", f"/raw/{rel}/.marin/step.json",
                f"/api/logs/{rel}", "/issues", "/api/issues", "/docs", "/openapi.json", "/api/files"):
        assert client.get(url).status_code == 404, url
    allowing = parse_policy({"select": {"experiments": [PUBLIC]}, "raw": {"allow": ["*/metrics.jsonl"]}})
    raw = TestClient(create_public_app(str(prefix), allowing))
    assert raw.get(f"/raw/{rel}/metrics.jsonl").status_code == 200
    assert raw.get(f"/raw/{rel}/.marin/step.json").status_code == 404
    limited = TestClient(create_public_app(str(prefix), policy, rate=0.001, burst=3))
    codes = [limited.get("/").status_code for _ in range(5)]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]


def test_publishes_straight_into_a_bucket_path(lab: Path) -> None:
    import fsspec

    out = "memory://publish-test/site"
    report = publish(str(lab), out, ALL)
    fs = fsspec.filesystem("memory")
    assert report.problems == [] and fs.exists("/publish-test/site/index.html")
    assert fs.exists("/publish-test/site/static/app.css")
    assert fs.cat_file("/publish-test/site/static/app.css") == Path(
        "marin/dashboard/static/app.css").read_bytes()  # the dashboard's stylesheet, not a second one
    again = publish(str(lab), out, ALL)
    assert set(again.written) <= {"index.html"}


def test_public_view_never_shows_a_hidden_experiments_steps_or_forecasts(lab: Path) -> None:
    from tests.compare.test_fitplot import RECORD

    public, hidden = "exp100_sweep-00000000", "exp104_sweep-00000004"
    write_prefix(str(lab), experiments=5, metrics_rows=20, groups=4)  # exp104 reruns exp100's step names
    manifests = {k: json.loads((lab / "experiments" / f"{k}.json").read_text()) for k in (public, hidden)}
    train = {k: next(s for s in m["steps"] if s["name"].endswith("train/model0"))
             for k, m in manifests.items()}
    for k in (public, hidden):
        Path(train[k]["output_path"], "prediction.json").write_text(RECORD.read_text())
    everything = TestClient(create_public_app(str(lab), ALL))
    rel = Path(train[public]["output_path"]).relative_to(lab).as_posix()
    assert len(everything.get("/api/predictions").json()["predictions"]) == 2
    assert everything.get(f"/api/steps/{rel}").json()["changes"]["previous"] is not None
    only = TestClient(create_public_app(str(lab), parse_policy({"select": {"experiments": [public]}})))
    rows = only.get("/api/predictions").json()["predictions"]
    assert len(rows) == 1 and train[public]["hash"][:8] in rows[0]["path"]
    step = only.get(f"/api/steps/{rel}").json()
    assert step["changes"]["previous"] is None  # its other version belongs to the hidden experiment
    assert train[hidden]["hash"][:8] not in only.get(f"/steps/{rel}").text
    assert train[hidden]["hash"][:8] not in only.get("/predictions").text


def test_the_alerts_page_is_rendered_again_when_a_running_steps_watcher_turns_blind(lab: Path,
                                                                                     tmp_path: Path) -> None:
    """A watcher's blindness comes with the clock, not with a file: an incremental build must still render
    the alerts page once a running step's heartbeat is older than its limit."""
    import time

    running = next(p.parent.parent for p in lab.rglob(".marin/status.json")
                   if json.loads(p.read_text())["status"] == "RUNNING")
    (running / "watch.json").write_text(json.dumps({"session": "s1", "time": time.time(), "blind_after_s": 2,
                                                   "step": 7, "host": "h", "attempt": 1}))
    out = tmp_path / "site"
    first = publish(str(lab), str(out), ALL)
    assert "alerts.html" in first.rendered and "watcher is blind" not in (out / "alerts.html").read_text()
    assert "alerts.html" not in publish(str(lab), str(out), ALL).rendered  # nothing changed yet
    time.sleep(2.5)
    late = publish(str(lab), str(out), ALL)
    assert "alerts.html" in late.rendered and "watcher is blind" in (out / "alerts.html").read_text()


def test_a_failing_render_leaves_no_worker_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the builder's own share fails, every forked worker is ended and reaped (none stays blocked on a
    pipe nobody reads, outliving the build)."""
    import os

    from marin.publish import render
    from marin.publish.render import render_split

    forked: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            forked.append(pid)
        return pid

    monkeypatch.setattr(render.os, "fork", fork)

    def work(items: Any) -> list[dict[str, Any]]:
        if "boom" in items:
            raise RuntimeError("the builder's page failed")
        return [{"file": i, "blob": "x" * 200_000} for i in items]  # more than a pipe holds

    with pytest.raises(RuntimeError, match="the builder's page failed"):
        render_split(["boom", *[f"p{i}" for i in range(8)]], work, 3, pinned=lambda i: i == "boom")
    assert len(forked) == 2
    for pid in forked:  # each already reaped, not even a zombie (this process may have other children)
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)



def test_the_builder_renders_each_page_as_the_public_server_serves_it(lab: Path, tmp_path: Path) -> None:
    """One rendering path: the builder calls the public app's route functions directly (no HTTP, no thread,
    nothing of FastAPI patched), and gets the same text the public server answers at the same URL; what the
    server refuses (a hidden experiment, a missing step) the builder refuses too."""
    import fastapi.routing
    import starlette.concurrency

    from marin.publish.render import AppPages
    from marin.publish.site import SITE_NAV, Site
    from tests.compare.test_fitplot import RECORD

    policy = parse_policy({"select": {"experiments": ["exp100_*", "exp101_*", "exp102_*"]},
                           "compare": {"pairs": [["exp100_sweep-00000000", "exp101_sweep-00000001"]]}})
    manifest = json.loads((lab / "experiments" / "exp101_sweep-00000001.json").read_text())
    forecast = Path(next(s["output_path"] for s in manifest["steps"] if s["name"].endswith("train/model0")))
    (forecast / "prediction.json").write_text(RECORD.read_text())  # the builder reads it for that step only
    site = Site(str(lab), str(tmp_path / "site"), policy)
    urls = [p.url for p in site.pages() if p.render is None]
    kinds = {u.split("/")[1].split("?")[0] for u in urls}
    assert {"steps", "experiments", "compare", "catalogue", "predictions", "alerts"} <= kinds
    public = create_public_app(str(lab), policy, rate=1e9, burst=1e9)  # (no rate limit, as the builder)
    public.state.templates.env.globals.update(public_nav=SITE_NAV)  # the site's two pages in the menu
    server = TestClient(public)
    pages = AppPages(site.app, policy)
    assert all(server.get(url).status_code == 200 for url in urls)  # the server learns names as it reads
    for url in urls:  # (the builder learnt every step's before its first page)
        assert pages.get(url) == server.get(url).text, url
    assert 'id="prediction"' in pages.get("/steps/" + forecast.relative_to(lab).as_posix())  # type: ignore[operator]
    for refused in ("/experiments/exp103_sweep-00000003", "/steps/nowhere/x-00000000", "/compare?runs=nope"):
        assert server.get(refused).status_code == 404 and pages.get(refused) is None
    assert fastapi.routing.run_in_threadpool is starlette.concurrency.run_in_threadpool
