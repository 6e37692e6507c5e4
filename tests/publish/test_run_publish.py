"""`marin run --publish` (issue 36, item 3): the site is re-published incrementally after each run, with the
policy checked before anything runs and a failing publish reported without failing the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marin.cli import main as marin_main
from marin.publish.site import MANIFEST

ROOT = Path(__file__).resolve().parents[2]
HELLO = str(ROOT / "experiments" / "hello_world.py")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARIN_PUBLISH_CACHE", str(tmp_path / "cache"))


def _policy(tmp_path: Path) -> Path:
    policy = tmp_path / "publish.toml"
    policy.write_text('[select]\nscripts = ["*hello_world.py"]\n')
    return policy


def test_run_publish_writes_the_site_then_only_what_changed(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    prefix, policy = tmp_path / "out", _policy(tmp_path)
    flags = ["--prefix", str(prefix), "--backend", "local", "-q", "--publish",
             "--publish-policy", str(policy)]
    assert marin_main(["run", HELLO, *flags]) == 0
    site = prefix / "site"  # the default: PREFIX/site
    pages = json.loads((site / MANIFEST).read_text())["pages"]
    experiment = next(f for f in pages if f.startswith("experiments/hello_world-"))
    assert "worked" in (site / experiment).read_text()  # the verdict of the run just finished
    assert any(f.startswith("steps/demo/total-") for f in pages)
    first = capsys.readouterr().out
    assert f"published {site}:" in first
    before = {f: (site / f).stat().st_mtime_ns for f in pages}
    # a second run skips both steps; only its new run in the manifest changes the experiment's pages
    assert marin_main(["run", HELLO, *flags]) == 0
    second = capsys.readouterr().out
    rendered = int(second.split("rendered ")[-1].split(",")[0])
    assert 0 < rendered < len(pages), second
    after = {f: (site / f).stat().st_mtime_ns for f in pages}
    untouched = [f for f in pages if f.startswith("steps/") and before[f] == after[f]]
    assert untouched, "a step page whose records did not change must not be rewritten"


def test_run_publish_into_a_chosen_folder(tmp_path: Path) -> None:
    out = tmp_path / "www"
    assert marin_main(["run", HELLO, "--prefix", str(tmp_path / "p"), "--backend", "local", "-q", "--publish",
                       "--publish-out", str(out), "--publish-policy", str(_policy(tmp_path))]) == 0
    assert (out / "index.html").is_file() and not (tmp_path / "p" / "site").exists()


def test_a_bad_policy_is_an_error_before_anything_runs(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    prefix = tmp_path / "out"
    code = marin_main(["run", HELLO, "--prefix", str(prefix), "--backend", "local", "--publish",
                       "--publish-policy", str(tmp_path / "missing.toml")])
    err = capsys.readouterr().err
    assert code == 2 and "--publish: no publish policy at" in err and "--publish-policy" in err
    assert not (prefix / "experiments").exists()  # nothing ran


def test_a_failing_publish_never_fails_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = marin_main(["run", HELLO, "--prefix", str(tmp_path / "out"), "--backend", "local", "-q",
                       "--publish", "--publish-out", str(blocker / "site"),
                       "--publish-policy", str(_policy(tmp_path))])
    assert code == 0
    assert "marin run --publish: publishing" in capsys.readouterr().err
    # recorded with the run, as every publisher's error is (the experiment manifest's last run)
    [manifest] = (tmp_path / "out" / "experiments").glob("*.json")
    [error] = json.loads(manifest.read_text())["runs"][-1]["publisher_errors"]
    assert error["publisher"] and str(blocker) in error["error"]


def test_run_help_shows_the_publish_flags_with_real_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert marin_main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "  --publish\n" in out and "  --publish-out PATH\n" in out and "  --publish-policy FILE\n" in out
    flat = " ".join(out.split())
    assert "(default: PREFIX/site (the site folder under the prefix))" in flat
    assert "(default: publish.toml)" in flat


def test_run_publish_without_the_site_publisher_installed_is_refused_before_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The engine reaches `marin.publish` only through the `marin.after_run` entry point: an environment
    installed before it existed must refuse --publish with the fix, not run and publish nothing."""
    from marin.execution import after_run

    monkeypatch.setattr(after_run.importlib.metadata, "entry_points", lambda group: [])
    prefix = tmp_path / "out"
    flags = ["--prefix", str(prefix), "--backend", "local", "-q", "--publish",
             "--publish-policy", str(_policy(tmp_path))]
    assert marin_main(["run", HELLO, *flags]) == 2
    err = capsys.readouterr().err
    assert "--publish" in err and "python3 dev.py install" in err
    assert not (prefix / "demo").exists()  # nothing ran
