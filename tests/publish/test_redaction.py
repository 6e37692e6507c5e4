"""Nothing the policy hides reaches a published byte: file contents, file names, URLs, titles, the index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marin.publish.policy import parse_policy
from marin.publish.site import publish
from tests.publish.planted import PUBLIC, USER, forbidden, write_planted_prefix

POLICY = parse_policy({"select": {"labels": ["marin:public"]},
                       "redact": {"public_repos": ["marin-community/marin"]}})


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prefix = tmp_path_factory.mktemp("planted") / "lab"
    write_planted_prefix(prefix)
    return prefix


def _published(out: Path) -> list[tuple[str, str]]:
    return [(p.relative_to(out).as_posix(), p.read_bytes().decode("utf-8", "replace"))
            for p in sorted(out.rglob("*")) if p.is_file()]


@pytest.mark.parametrize("anonymous", [False, True], ids=["pseudonyms", "anonymous"])
def test_no_planted_secret_reaches_any_published_byte(planted: Path, tmp_path: Path, anonymous: bool) -> None:
    out = tmp_path / "site"
    report = publish(str(planted), str(out), POLICY, anonymous=anonymous)
    assert report.problems == []
    files = _published(out)
    names = {n for n, _ in files}
    assert f"experiments/{PUBLIC}.html" in names
    assert any(n.startswith("steps/sweep00/train/model0-") for n in names)
    hidden = [e for e in report.hidden]
    assert len(hidden) == 3 and PUBLIC not in hidden
    banned = [*forbidden(), *hidden, str(planted), planted.name + "/"]
    if anonymous:
        banned += ["marin-community", "github.com"]
    for name, text in files:
        for bad in banned:
            assert bad.lower() not in name.lower(), (bad, name)
            at = text.lower().find(bad.lower())
            assert at < 0, (bad, name, text[max(0, at - 200):][:400])
    page = dict(files)[f"experiments/{PUBLIC}.html"]
    assert "hypothesis token ***" in page  # the hypothesis is shown, its secret masked
    step_page = next(t for n, t in files if n.startswith("steps/sweep00/train/model0-"))
    assert ("anonymous" if anonymous else "user-") in step_page
    assert USER not in step_page


def test_the_public_store_redacts_and_hides_on_batched_reads() -> None:
    """On an object store the pages read steps' records in batches (`PrefixStore.read_json_many`, issue
    35), not through `read_json`: the public store masks and hides there too, and what a batch cached is
    what a later `read_json` returns."""
    import os
    import time

    import fsspec

    from marin.publish.public import RedactingStore
    from marin.publish.redact import Redactor

    mem = fsspec.filesystem("memory")
    root = f"/public-many-{os.getpid()}-{time.monotonic_ns()}"
    secret = {"status": "SUCCESS", "env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz012345"},
              "owner": "alice-private"}
    for i in range(10):
        mem.pipe_file(f"{root}/fan/s{i}/.marin/status.json", json.dumps(secret).encode())
    store = RedactingStore(f"memory://{root}", ttl=60)
    store.redactor = Redactor([f"memory://{root}", root], ["alice-private"])
    store.hidden_steps = frozenset({"fan/s7"})
    rels = [f"fan/s{i}/.marin/status.json" for i in range(10)]
    got = store.read_json_many(rels, ["fan"] * 10)
    assert got["fan/s7/.marin/status.json"] is None  # hidden: absent, as read_json says
    shown = got["fan/s0/.marin/status.json"]
    assert shown["status"] == "SUCCESS" and shown["env"] == "***" and "alice" not in json.dumps(shown)
    assert store.read_json("fan/s0/.marin/status.json") == shown
    assert "s7" not in store.names("fan") and "s6" in store.names("fan")


def test_an_object_store_prefix_is_redacted_on_its_batched_reads_too(planted: Path, tmp_path: Path) -> None:
    """On an object store the pages read steps' records in batches (`PrefixStore.read_json_many`), not one
    `read_json` at a time: the public store redacts and hides on that path as well. The same planted lab,
    copied to an in-memory object store, publishes no planted secret."""
    import os
    import time

    import fsspec

    mem = fsspec.filesystem("memory")
    root = f"/redact-{os.getpid()}-{time.monotonic_ns()}/lab"
    mem.put(str(planted) + "/", root + "/", recursive=True)
    out = tmp_path / "site"
    report = publish(f"memory://{root}", str(out), POLICY)
    assert report.problems == []
    files = _published(out)
    assert f"experiments/{PUBLIC}.html" in dict(files)
    banned = [*forbidden(), *report.hidden, root]
    for name, text in files:
        for bad in banned:
            assert bad.lower() not in name.lower(), (bad, name)
            at = text.lower().find(bad.lower())
            assert at < 0, (bad, name, text[max(0, at - 200):][:400])


def _page(lines: list[str]) -> str:
    return "<html>\n" + "\n".join(f"  <p>{line}</p>" for line in lines) + "\n</html>\n"


_LINES = ["plain", "hf_token:\n  abcdefghijklmnop", "api_key = 'sk-abcdefghijklmnopqrstu'",
          "Authorization: Bearer\n  qwertyuiopasdf", "/data/lab/out/train-1a2b", "see gs://other-bucket/x",
          "owner/private#12", "bob at bench-host", "HOME=/root/x", "eos_token: 2",
          "https://github.com/owner/private/issues/3", "https://u:pw@example.org/x"]


@pytest.mark.parametrize("names", [("bob", "bench-host"), ("bob", "a>b"), ("x\ny",)],
                         ids=["names", "name-with-bracket", "name-with-newline"])
def test_a_page_redacted_piece_by_piece_equals_the_page_redacted_whole(names: tuple[str, ...]) -> None:
    """Redactor.text cuts a page between tags and redacts the pieces (memoized, the new ones in one pass):
    the result is exactly what the whole page redacted in one pass gives, planted values around the cuts
    included, also where a root's removal makes a new cut and where a name could match across one."""
    from marin.publish.redact import Redactor

    pages = [_page(_LINES), _page(list(reversed(_LINES))), _page(_LINES[3:] + _LINES[:3]),
             "<p>\n<b>/data/lab/</b>\n<i>/data/lab/\n</i>\n<u>x</u>\n</p>\n" * 40,
             _page([f"{a} {b}" for a in _LINES for b in _LINES[:4]])]
    whole = Redactor(["/data/lab"], names)
    cut = Redactor(["/data/lab"], names)
    for page in [*pages, *pages]:  # the second round comes from the memo
        assert len(page) > 256
        assert cut.text(page) == whole._text(page)
    assert cut.text(_page(_LINES)) != _page(_LINES)


_NEAR = ["<td>hf_token: abcdefgh</td>", "<a href='x'>token=abcdef12</a>", "api-key=zzzzzz<b>",
         ">password: 'hunter22'<", "<code>owner/repo#12</code>", "x owner/repo#12>",
         "<p>see acme/secret-repo#7 and a/b#1<c/d#2>e/f#3</p>",
         "&quot;secret_key&quot;: &quot;abcd1234&quot;", "to\u212aen=abcdefgh", "<x>tokens: 1234567</x>",
         "eos_token: abcdef", '<i title="SESSION_ID=qwertyuiop">', 'fill="#57606a">owner/x#5',
         "Cookie:\n  zzzzzzzz>", "<b>HOME=/root/x</b>", "X_1=y AB=c>ABC=<d DEF_9=ok&x", 'run(MY_VAR="v")']


@pytest.mark.parametrize("text", [*_NEAR, "".join(_NEAR), "\n".join(reversed(_NEAR)), "  ".join(_NEAR * 3)])
def test_patterns_applied_between_tags_change_what_they_change_in_the_whole(text: str) -> None:
    """The key-value secret and issue-reference patterns are applied only to the stretches between tags that
    hold a literal of theirs (`_near`): the text is exactly what applying them to the whole gives."""
    from marin.publish import redact
    from marin.publish.redact import Redactor

    r = Redactor(["/data/lab"], ["bob"])
    hits = [i for w in redact._SECRET_LITERALS for i in redact._finds(text.lower(), w)]
    whole = redact._SECRET_ASSIGN.sub(r._assign, text)
    assert redact._near(redact._SECRET_ASSIGN, r._assign, text, hits) == whole
    refs = [m.start() for m in redact._ISSUE_HASH.finditer(text)]
    assert redact._near(redact._ISSUE_REF, r._ref, text, refs) == redact._ISSUE_REF.sub(r._ref, text)
    ends = [m.start() for m in redact._ENV_END.finditer(text)]
    assert (redact._near(redact._ENV_ASSIGN, redact._env_value, text, ends)
            == redact._ENV_ASSIGN.sub(redact._env_value, text))
    if len(text) > 300:  # the texts of several values: planted secrets are masked, references too
        assert "hunter22" not in whole and "SESSION_ID=***" in whole and "***#12" in r.text(text)
        assert "HOME=***" in r.text(text) and "DEF_9=***" in r.text(text)
