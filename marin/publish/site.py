"""`marin publish`: the static site of the experiments a policy makes public, built incrementally.

Every page but the site's own few (index, interruption timeline, data cards) is the public dashboard's page
at the same URL, rendered in-process by the same route function, readers, templates and partials
(marin.publish.render), so the site and `marin dashboard --public` cannot disagree; `links.rewrite` then
makes its links relative and keeps only the scripts that need no server. The stylesheet is the dashboard's
own app.css, copied.

Incremental: each page has a digest of the inputs it renders (the size and mtime/etag of every file of its
steps, its manifest and verdicts, the pages it depends on, the redactor's fingerprint and the renderer's
code). `publish-manifest.json` in the output keeps page -> digest and content hash; a page whose digest is
unchanged is not rendered, a page rendered to the same bytes is not written, a page no longer published is
deleted. The global pages (index, catalogue, predictions, alerts, timeline, data cards) are rendered every
time. The build reads the prefix only; it writes only under `out`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import posixpath
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import fsspec
from fsspec.implementations.local import LocalFileSystem
from jinja2 import ChoiceLoader, Environment, FileSystemBytecodeCache, FileSystemLoader

from marin.compare.runs import baseline_of
from marin.dashboard.compare_source import DashboardSource
from marin.dashboard.experiments import step_rel
from marin.dashboard.paths import UnsafePathError, clean_relpath
from marin.dashboard.results import with_headline
from marin.dashboard.store import signature
from marin.errors import CorruptFileError
from marin.publish import cards
from marin.publish.links import file_of, rewrite
from marin.publish.policy import Policy
from marin.publish.public import PublicIndex, RedactingStore
from marin.publish.redact import Redactor
from marin.publish.render import MIN_SPLIT, AppPages, can_fork, default_jobs, render_split
from marin.publish.serve import create_public_app
from marin.status.alerts import ALERTS_FILE, WATCH_FILE
from marin.status.manifest import EXPERIMENTS_DIR
from openlab_records import NOTE_FILE, PREDICTION_FILE, TRACKING_FILE, VERDICT_FILE

HERE = Path(__file__).parent
DASHBOARD = HERE.parent / "dashboard"
MANIFEST = "publish-manifest.json"
STATIC = {"app.css": DASHBOARD / "static/app.css", "app.js": DASHBOARD / "static/app.js",
          "charts.js": DASHBOARD / "static/charts.js", "compare.js": DASHBOARD / "static/compare.js",
          "favicon.svg": DASHBOARD / "static/favicon.svg", "publish.js": HERE / "static/publish.js"}
SITE_NAV = (("/timeline", "Interruptions"), ("/data", "Data"))
GLOBAL = ("/", "/catalogue", "/predictions", "/alerts", "/timeline", "/data")
CACHE_VERSION = 3
_FORECAST_FILES = (NOTE_FILE, TRACKING_FILE, VERDICT_FILE, PREDICTION_FILE)
"""What the step page's prediction section reads in the step's folder (dashboard.predictions.for_step)."""
_ALERT_FILES = (ALERTS_FILE, WATCH_FILE, ".marin/status.json")


def cache_dir() -> Path:
    """Where the builder keeps what it learnt of each step (names included: never inside the site)."""
    return Path(os.environ.get("MARIN_PUBLISH_CACHE") or Path(os.environ.get("XDG_CACHE_HOME")
                or Path.home() / ".cache") / "marin" / "publish")


def _bytecode_cache() -> FileSystemBytecodeCache | None:
    """Jinja's cache of compiled templates, beside the private cache: a `marin publish` process loads the
    templates' code instead of compiling them (each entry is checked against its template's source)."""
    folder = cache_dir() / "templates"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # no cache: the templates are compiled, as without one
    return FileSystemBytecodeCache(str(folder))


def _h(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _h_plain(*parts: Any) -> str:
    """`_h` for parts made of strings, numbers and tuples or lists of them (their repr is canonical): about
    four times cheaper, for the digests computed for every step on every build."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def renderer_version() -> str:
    """Changes with any template, script, stylesheet or module of the dashboard or of publishing (by their
    paths inside the package and bytes: a checkout or environment moved elsewhere renders nothing again)."""
    h = hashlib.sha256()
    for root in (DASHBOARD, HERE, HERE.parent / "compare"):
        for p in sorted(root.rglob("*")):
            if p.suffix in (".py", ".html", ".js", ".css", ".svg"):
                h.update(p.relative_to(HERE.parent).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


@dataclass
class Page:
    url: str
    file: str
    digest: str | None
    """None: a global page, rendered every build."""
    render: Callable[[], str] | None = None
    """The site's own pages; None: the dashboard page at `url`."""


@dataclass
class Report:
    out: str
    pages: int = 0
    rendered: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _inside_site(rel: str) -> bool:
    """A path from the site's own manifest that names a file inside the site (what may be deleted)."""
    try:
        return bool(rel) and clean_relpath(rel) == rel and rel != MANIFEST
    except UnsafePathError:
        return False


_URL_SAFE = re.compile(r"[A-Za-z0-9_.~/-]*")  # what quote(segment, safe="") leaves as it is


def _alert_files(rel: str, files: list[Any]) -> list[Any]:
    """The signatures of a step's alert, heartbeat and status files among those of all its files (a step's
    files are under `rel/`: a name's tail decides, one slice per file)."""
    n, folder = len(rel) + 1, rel + "/"
    return [x for x in files if x[0][n:] in _ALERT_FILES and x[0].startswith(folder)]


def _step_url(rel: str) -> str:
    if _URL_SAFE.fullmatch(rel):
        return "/steps/" + rel
    return "/steps/" + "/".join(quote(s, safe="") for s in rel.split("/"))


class Site:
    """One build of the site of `prefix` under `policy` into `out` (a directory or a bucket path)."""

    def __init__(self, prefix: str, out: str, policy: Policy, *, anonymous: bool = False,
                 storage_options: dict[str, Any] | None = None) -> None:
        self.prefix, self.out, self.policy = prefix, out.rstrip("/"), policy
        self.app = create_public_app(prefix, policy, anonymous=anonymous, cache_ttl=1e9,
                                     storage_options=storage_options, rate=1e9, burst=1e9)
        env: Environment = self.app.state.templates.env
        self._forecasting: set[str] = set()
        real = env.globals["prediction_for"]
        assert callable(real)
        env.globals.update(public_nav=SITE_NAV, prediction_for=self._prediction_for(real))
        assert env.loader is not None
        env.bytecode_cache = _bytecode_cache()
        self.env = env.overlay(loader=ChoiceLoader([FileSystemLoader(HERE / "templates"), env.loader]),
                               bytecode_cache=env.bytecode_cache)
        self.dash = self.app.state.dash
        assert isinstance(self.dash.store, RedactingStore)
        self.store: RedactingStore = self.dash.store
        self.redactor: Redactor = self.app.state.redactor
        self.client = AppPages(self.app, policy)
        self.fs, self.root = fsspec.core.url_to_fs(self.out)
        self.index: PublicIndex = self.dash.experiments
        self.index.refresh()
        self.cache_path = cache_dir() / f"{_h(prefix, self.out)}.json"
        cached = self._read_cache()
        self._cache: dict[str, Any] = cached.get("steps", {})
        self._rows: dict[str, Any] = cached.get("rows", {})
        self._files_key: str = cached.get("files_key", "")
        self._known_files: dict[str, str] = cached.get("files", {})
        self._used_files: dict[str, str] = {}
        self._exp_digest: dict[str, str] = {}

    # ---------------------------------------------------------------------------------------- inputs
    def _read_cache(self) -> dict[str, Any]:
        try:
            data = json.loads(self.cache_path.read_text())
        except (OSError, ValueError):
            return {}
        ok = isinstance(data, dict) and data.get("version") == CACHE_VERSION
        return data if ok else {}

    def _steps(self) -> dict[str, list[str]]:
        """Public experiment -> its steps' paths under the prefix."""
        return {key: [step_rel(self.dash.store, e) for e in m.get("steps") or [] if isinstance(e, dict)]
                for key, m in self.index.manifest_map().items()}

    def _signatures(self, steps: set[str]) -> dict[str, list[Any]]:
        """Step path (or experiments/<id>) -> the signatures of its files, from one listing of the prefix;
        also `predictions:` -> the files of every folder holding a forecast or its verdict. Files are
        assigned by folder (a folder's files share their owner: the nearest enclosing step), so the cost per
        file is one stat and one append."""
        owner_of: dict[str, str] = {"": ""}  # folder -> its owner

        def owner(folder: str) -> str:
            if folder not in owner_of:
                if folder in steps:
                    owner_of[folder] = folder
                elif folder.startswith(EXPERIMENTS_DIR + "/"):
                    owner_of[folder] = EXPERIMENTS_DIR + "/" + folder.split("/")[1].removesuffix(".json")
                else:
                    owner_of[folder] = owner(posixpath.dirname(folder))
            return owner_of[folder]

        sigs: dict[str, list[Any]] = {}
        forecasts: list[Any] = []
        for folder, files in self._folders():
            entries = [(f"{folder}/{name}" if folder else name, sig) for name, sig in files]
            if folder == EXPERIMENTS_DIR:  # experiments/<id>.json belongs to experiments/<id>
                for (name, _), entry in zip(files, entries, strict=True):
                    sigs.setdefault(EXPERIMENTS_DIR + "/" + name.removesuffix(".json"), []).append(entry)
            elif found := owner(folder):
                sigs.setdefault(found, []).extend(entries)
            if any(name in (PREDICTION_FILE, VERDICT_FILE) for name, _ in files):
                forecasts.extend(entries)
        for entries in sigs.values():
            entries.sort()
        sigs["predictions:"] = sorted(forecasts)
        return sigs

    def _folders(self) -> Iterable[tuple[str, list[tuple[str, Any]]]]:
        """(folder, [(file name, signature)]) for every folder under the prefix holding files, the site's
        own output path left out; locally one os.scandir walk (fsspec's find stats each file through several
        layers: five times slower on 77,000 files)."""
        store = self.dash.store
        out_rel = store.relative(self.out)
        if not store.is_local:
            by_folder: dict[str, list[tuple[str, Any]]] = {}
            for full, info in store.fs.find(store.root, detail=True).items():
                rel = store.relative(full) or ""
                if not (out_rel and (rel == out_rel or rel.startswith(out_rel + "/"))):
                    folder, _, name = rel.rpartition("/")
                    by_folder.setdefault(folder, []).append((name, signature(info)))
            yield from by_folder.items()
            return
        skip_in, _, skip = (out_rel or "").rpartition("/")  # the output path: skipped where it is listed
        stack = [(store.root, "")]
        while stack:
            path, rel = stack.pop()
            files: list[tuple[str, Any]] = []
            skip_here = skip if out_rel and rel == skip_in else None
            with os.scandir(path) as entries:
                for e in entries:
                    if e.name == skip_here:
                        continue
                    if e.is_dir(follow_symlinks=False):
                        stack.append((e.path, f"{rel}/{e.name}" if rel else e.name))
                    elif e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        files.append((e.name, (st.st_size, st.st_mtime_ns, st.st_ino)))
            if files:
                yield rel, files

    def _prediction_for(self, real: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
        """The step page's prediction section (the dashboard's `prediction_for`), read only for a step whose
        folder held one of the files it reads when the prefix was listed: for any other it is None, as
        `for_step` finds (four reads through fsspec saved on nearly every step page)."""
        def prediction_for(prefix: str, step_path: str) -> Any:
            if step_path in self._forecasting or step_path.startswith("/") or "://" in step_path:
                return real(prefix, step_path)
            return None

        return prediction_for

    def _safe(self, segment: str) -> str:
        return self.redactor.name(segment)

    def _file(self, url: str) -> str:
        """The site file of the page at `url`; kept in the private cache (URLs hold names) under a key of
        the redactor's fingerprint and salt and the renderer's code, the only things it depends on."""
        f = self._known_files.get(url) or file_of(url, self._safe)
        assert f is not None, url
        self._used_files[url] = f
        return f

    # ---------------------------------------------------------------------------------------- pages
    def pages(self) -> list[Page]:
        """Every page of the site, with the digest of what it renders."""
        exp_steps = self._steps()
        steps = {s for rels in exp_steps.values() for s in rels}
        sigs = self._signatures(steps)
        listed = {f for rel in steps for f, _ in sigs.get(rel, ())}
        self._forecasting = {rel for rel in steps if any(f"{rel}/{n}" in listed for n in _FORECAST_FILES)}
        raw = self._learn_steps(exp_steps, sigs)  # the redactor learns every user and host before any page
        fp = (self.redactor.fingerprint(), renderer_version())
        files_key = _h(fp, self.redactor.salt)
        if files_key != self._files_key:
            self._files_key, self._known_files = files_key, {}
        step_digest = {rel: _h_plain(fp, raw[rel]) for rel in steps}
        pages = [Page(_step_url(rel), self._file(_step_url(rel)), d)
                 for rel, d in sorted(step_digest.items())]
        src = DashboardSource(self.dash.store, self.dash.metrics, self.index)
        owners = self.index.owners()
        own: dict[str, str] = {}
        bases: dict[str, str | None] = {}
        for key, rels in sorted(exp_steps.items()):
            bases[key] = base = baseline_of(src, key, owners)
            own[key] = _h(fp, "experiment", key, sigs.get(f"{EXPERIMENTS_DIR}/{key}", []),
                          [step_digest[r] for r in rels], base, self.index.issue_of(key))
        # an experiment shows its baseline's numbers beside its own
        self._exp_digest = {k: _h(d, own.get(bases[k] or "")) for k, d in own.items()}
        pairs = list(self.policy.compare.pairs)
        for key in sorted(exp_steps):
            url = "/experiments/" + quote(key, safe="")
            pages.append(Page(url, self._file(url), self._exp_digest[key]))
            if bases[key] and self.policy.compare.baselines:
                pairs.append((str(bases[key]), key))
        pages += self._compare_pages(pairs, self._exp_digest)
        pages += self._card_pages(steps, step_digest, exp_steps)
        pages += self._global_pages(fp, sigs, step_digest)
        return pages

    def _learn_steps(self, exp_steps: dict[str, list[str]], sigs: dict[str, list[Any]]) -> dict[str, str]:
        """Each step's digest of its files; what the step's records say (its names, its interruptions,
        whether it is a data step) is read only when that digest changed since the last build (the private
        step cache, outside the site: it holds names)."""
        raw: dict[str, str] = {}
        fresh: dict[str, Any] = {}
        for key, rels in sorted(exp_steps.items()):
            for rel in rels:
                raw[rel] = _h_plain("step", rel, sigs.get(rel, []))
                hit = self._cache.get(rel)
                if hit is None or hit.get("raw") != raw[rel]:
                    hit = {"raw": raw[rel], "names": self.store.names_in(f"{rel}/.marin/step.json"),
                           "card": cards.data_card(self.dash.store, rel) is not None,
                           "interruptions": [asdict(i) for i in
                                             cards.interruptions(self.dash.store, rel, key)]}
                fresh[rel] = hit
                self.redactor.add_names(hit["names"])
        self._cache = fresh
        return raw

    def _compare_pages(self, pairs: Iterable[tuple[str, str]], digests: dict[str, str]) -> list[Page]:
        out: dict[str, Page] = {}
        for a, b in pairs:
            if a in digests and b in digests:
                url = f"/compare?runs={quote(a, safe='')}&runs={quote(b, safe='')}"
                out[url] = Page(url, self._file(url), _h("compare", digests[a], digests[b]))
        return list(out.values())

    def _card_pages(self, steps: set[str], digests: dict[str, str],
                    exp_steps: dict[str, list[str]]) -> list[Page]:
        self._cards = [c for rel in sorted(steps) if self._cache[rel]["card"]
                       and (c := cards.data_card(self.dash.store, rel)) is not None]
        self._exp_steps = exp_steps
        pages = []
        for c in self._cards:
            url = "/data/" + "/".join(quote(s, safe="") for s in c.step.split("/"))
            pages.append(Page(url, self._file(url), _h("card", digests[c.step],
                                                       [digests.get(r) for r in c.reads]),
                              render=functools.partial(self._own, "publish_card.html", c=c)))
        return pages

    def _global_pages(self, fp: tuple[str, str], sigs: dict[str, list[Any]],
                      step_digest: dict[str, str]) -> list[Page]:
        """The pages over every public experiment, each with the digest of exactly what it reads: the
        catalogue the experiments' manifests and verdicts; the alerts their manifests and the steps' alert,
        heartbeat and status files; the predictions every forecast's folder (and which steps are public);
        the timeline the interruptions; the data list the cards. The index shows when it was published, so
        it is rendered every time (from each experiment's row, kept by the experiment's digest)."""
        exp_files = [(k, sigs.get(f"{EXPERIMENTS_DIR}/{k}", [])) for k in sorted(self._exp_steps)]
        alert_files = [(rel, _alert_files(rel, sigs.get(rel, []))) for rel in sorted(step_digest)]
        timeline = [(rel, self._cache[rel]["interruptions"]) for rel in sorted(step_digest)]
        watched = [rel for rel, files in alert_files if any(x[0].endswith(WATCH_FILE) for x in files)]
        digests = {"/": None,
                   "/catalogue": _h(fp, "catalogue", exp_files),
                   # a running step's watcher turns blind with the clock, not with a file: say which are now
                   "/alerts": _h(fp, "alerts", exp_files, alert_files, self._blind_now(watched)),
                   "/predictions": _h(fp, "predictions", sigs.get("predictions:", []), sorted(step_digest)),
                   "/timeline": _h(fp, "timeline", timeline, sorted(self._exp_steps.items())),
                   "/data": _h(fp, "data", [(c.step, step_digest[c.step],
                                             [step_digest.get(r) for r in c.reads]) for c in self._cards])}
        own = {"/": self._index_page, "/timeline": self._timeline_page,
               "/data": lambda: self._own("publish_data.html", cards=self._cards)}
        return [Page(url, self._file(url), digests[url], render=own.get(url)) for url in GLOBAL]

    def _blind_now(self, watched: list[str]) -> list[str]:
        """The watched steps whose watcher has missed its heartbeat by now (the engine's blind alert, which
        the alerts page shows while such a step runs): part of that page's digest."""
        now = time.time()
        out = []
        for rel in watched:
            try:
                watch = self.dash.store.read_json(f"{rel}/{WATCH_FILE}")
            except CorruptFileError:
                continue  # shown as a problem by the page itself; its signature is in the digest already
            if isinstance(watch, dict) and not watch.get("closed"):
                beat, limit = watch.get("time"), watch.get("blind_after_s")
                if isinstance(beat, int | float) and isinstance(limit, int | float) and now - beat > limit:
                    out.append(rel)
        return out

    # ---------------------------------------------------------------------------------------- own pages
    def _own(self, template: str, **context: Any) -> str:
        context.setdefault("prefix", self.dash.prefix)
        text: str = self.env.get_template(template).render(**context)
        return self.redactor.text(text)

    def _numbers(self, summary: Any) -> dict[str, Any]:
        """The experiment's verdict and headline (the dashboard's `with_headline`), kept in the private
        cache by the experiment's digest, which covers every file they are computed from."""
        digest = self._exp_digest.get(summary.id)
        hit = self._rows.get(summary.id)
        if digest is None or hit is None or hit.get("digest") != digest:
            e = with_headline(self.dash, summary).model_dump(mode="json")
            hit = {"digest": digest, "verdict": e.get("verdict"), "headline": e.get("headline") or []}
        self._rows[summary.id] = hit
        return hit

    def _index_rows(self) -> list[dict[str, Any]]:
        """The rows `/api/experiments` lists (newest first), from the same index and numbers."""
        rows = []
        for s in self.index.query(limit=1 << 30).items:
            e = {**s.model_dump(mode="json"), **self._numbers(s)}
            m = self.index.manifest_map().get(e["id"], {})
            raw = m.get("notebook")
            nb: dict[str, Any] = raw if isinstance(raw, dict) else {}
            issue = e.get("issue") or {}
            url = str(issue.get("url") or "")
            rows.append({"id": e["id"], "key": _h(e["id"]), "state": e["state"],
                         "verdict": e.get("verdict"),
                         "hypothesis": str(nb.get("hypothesis") or e.get("description") or ""),
                         "headline": e.get("headline") or [], "issue": issue.get("ref"),
                         "issue_url": url if url.startswith("http") else None,
                         "created": e.get("created")})
        self._rows = {r["id"]: self._rows[r["id"]] for r in rows}
        return rows

    def _index_page(self) -> str:
        rows = self._index_rows()
        def text(r: dict[str, Any]) -> str:
            words = [str(r[k] or "") for k in ("id", "hypothesis", "verdict", "issue")]
            return self.redactor.text(" ".join(words + [m["name"] for m in r["headline"]])).lower()

        index = [{"key": r["key"], "state": r["state"], "verdict": r["verdict"] or "", "text": text(r)}
                 for r in rows]
        index_json = json.dumps(index, separators=(",", ":")).replace("</", "<\\/")
        return self._own("publish_index.html", title=self.policy.site.title, rows=rows,
                         published=time.time(),
                         states=sorted({r["state"] for r in rows}),
                         verdicts=sorted({r["verdict"] for r in rows if r["verdict"]}),
                         index_json=index_json)

    def _timeline_page(self) -> str:
        rows = [cards.Interruption(**i) for rels in self._exp_steps.values() for rel in rels
                for i in self._cache[rel]["interruptions"]]
        rows.sort(key=lambda i: -i.ts)
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.event] = counts.get(r.event, 0) + 1
        return self._own("publish_timeline.html", rows=rows, counts=sorted(counts.items()))

    # ---------------------------------------------------------------------------------------- build
    def _old_manifest(self) -> dict[str, Any]:
        try:
            data = json.loads(self.fs.cat_file(f"{self.root}/{MANIFEST}"))
        except (FileNotFoundError, ValueError):
            return {}
        return data.get("pages", {}) if isinstance(data, dict) else {}

    def _render(self, page: Page, published: Callable[[str], bool], targets: set[str]) -> str | None:
        text = page.render() if page.render is not None else self.client.get(page.url)
        if text is None:
            return None
        return rewrite(text, page.file, published, self._safe, targets)

    def _write(self, rel: str, data: bytes) -> None:
        path = f"{self.root}/{rel}"
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.fs.pipe_file(path, data)

    @staticmethod
    def _links(targets: Iterable[str], published: Callable[[str], bool]) -> str:
        """What a page's bytes depend on beyond its records: which of the pages it links to are published
        (a link to an unpublished page is dropped, so publishing or hiding it changes the linking page)."""
        return _h(sorted((t, published(t)) for t in targets))

    def _render_some(self, pages: Iterable[Page], published: Callable[[str], bool],
                     old: dict[str, Any]) -> list[dict[str, Any]]:
        """Render `pages`; write each one whose bytes differ from what the site holds."""
        out: list[dict[str, Any]] = []
        for page in pages:
            targets: set[str] = set()
            text = self._render(page, published, targets)
            if text is None:
                out.append({"file": page.file, "problem": f"{page.url}: the public dashboard refused or "
                            "failed to render it"})
                continue
            data = text.encode("utf-8")
            sha = hashlib.sha256(data).hexdigest()
            linked = sorted(t for t in targets if not t.startswith("static/"))
            entry = {"digest": page.digest, "sha256": sha, "links": self._links(linked, published),
                     "targets": linked}
            written = old.get(page.file, {}).get("sha256") != sha
            if written:
                self._write(page.file, data)
            out.append({"file": page.file, "entry": entry, "written": written})
        return out

    def _unchanged(self, page: Page, prev: dict[str, Any], published: Callable[[str], bool],
                   moved: set[str]) -> bool:
        """Same digest, and the pages it links to published as they were (`moved`: the files published
        last time or now but not both; a page linking to none of them has the links it had)."""
        if page.digest is None or prev.get("digest") != page.digest or "links" not in prev:
            return False
        targets = prev.get("targets") or []
        return moved.isdisjoint(targets) or prev["links"] == self._links(targets, published)

    def build(self, *, check: bool = False, jobs: int | None = None) -> Report:
        """Render what changed and write it (check: only report what would change); a large render is
        split over `jobs` forked processes (default: the CPUs this process may use) where that is safe."""
        t0 = time.perf_counter()
        report = Report(out=self.out, hidden=list(self.index.hidden))
        pages = self.pages()
        old = self._old_manifest()
        files = {p.file for p in pages} | {f"static/{n}" for n in STATIC}
        published = files.__contains__
        moved = set(old) ^ files
        new = {p.file: old[p.file] for p in pages
               if self._unchanged(p, old.get(p.file, {}), published, moved)}
        todo = [p for p in pages if p.file not in new]
        report.rendered = [p.file for p in todo]
        gone = sorted(f for f in old if f not in files)
        report.deleted = [f for f in gone if _inside_site(f)]
        if len(report.deleted) < len(gone):  # the manifest was edited or damaged: never delete outside
            outside = [f for f in gone if not _inside_site(f)]
            report.problems.append(
                f"{MANIFEST} in {self.root} lists {len(outside)} path(s) that are not inside the site "
                f"({', '.join(repr(f) for f in outside[:3])}{', ...' if len(outside) > 3 else ''}); "
                f"they were not deleted. Remove them from {MANIFEST} (or delete the site folder and publish "
                "again)")
        if not check:
            jobs = default_jobs() if jobs is None else max(1, jobs)
            local = self.dash.store.is_local and isinstance(self.fs, LocalFileSystem)
            work = functools.partial(self._render_some, published=published, old=old)
            if jobs > 1 and len(todo) >= MIN_SPLIT and can_fork(local):
                results = render_split(todo, work, jobs, pinned=lambda p: p.render is not None)
            else:
                results = work(todo)
            for r in sorted(results, key=lambda r: r["file"]):
                if "problem" in r:
                    report.problems.append(r["problem"])
                    continue
                new[r["file"]] = r["entry"]
                if r["written"]:
                    report.written.append(r["file"])
            self._finish(report, old, new)
        report.pages, report.seconds = len(pages), round(time.perf_counter() - t0, 3)
        return report

    def _finish(self, report: Report, old: dict[str, Any], new: dict[str, Any]) -> None:
        for name, src in STATIC.items():
            data = src.read_bytes()
            sha = hashlib.sha256(data).hexdigest()
            new[f"static/{name}"] = {"digest": None, "sha256": sha}
            if old.get(f"static/{name}", {}).get("sha256") != sha:
                self._write(f"static/{name}", data)
                report.written.append(f"static/{name}")
        for f in report.deleted:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(f"{self.root}/{f}")
        manifest = {"version": 1, "pages": dict(sorted(new.items()))}
        self._write(MANIFEST, json.dumps(manifest, separators=(",", ":")).encode())
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": CACHE_VERSION, "steps": self._cache, "rows": self._rows,
                                   "files_key": self._files_key, "files": self._used_files}))
        os.replace(tmp, self.cache_path)


def publish(prefix: str, out: str, policy: Policy, *, anonymous: bool = False, check: bool = False,
            storage_options: dict[str, Any] | None = None, jobs: int | None = None) -> Report:
    """Build (or, with check, plan) the site of `prefix` into `out`."""
    return Site(prefix, out, policy, anonymous=anonymous, storage_options=storage_options).build(check=check,
                                                                                                 jobs=jobs)
