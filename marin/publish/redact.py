"""What never reaches a published byte: credentials, environment variables, private names, foreign paths.

One :class:`Redactor` per build (or per public dashboard) applies, in order:

1. `marin.tracking.redact.redact` (the platform's one credential redactor: registered secrets, token
   environment variables, GitHub token formats, Authorization headers, ``user:password@`` in URLs), plus a
   few more credential shapes (``hf_``, ``sk-``, AWS access keys, long ``key=``/``token:`` values);
2. environment variables: ``NAME=value`` with an upper-case NAME keeps NAME and masks the value; in parsed
   records (:meth:`Redactor.obj`) every value under a key that names a secret or an environment is masked;
3. paths: the prefix itself becomes relative (``/data/lab/out/train-1a2b`` -> ``train-1a2b``); any other
   absolute path (two segments or more, other than the site's own routes) and any bucket URL outside the
   prefix become ``***``;
4. issue links and references (``owner/repo#12``) to repositories not in ``[redact] public_repos`` (all of
   them with ``--anonymous``);
5. names: every user and host named in the records (and ``[redact] names``) becomes a stable pseudonym
   (``user-1a2b3c``, a salted hash) or, anonymous, ``anonymous``; anonymous also removes the owners and
   names of the repositories.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any

from marin.tracking.redact import MASK, known_secrets
from marin.tracking.redact import redact as redact_credentials

# each with the literals one of which every match contains: a text holding none of them is not scanned (a
# full page is about 20 regex scans; these are the cheap exact ones to skip)
_MORE_CREDENTIALS = (
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}\b"), ("hf_",)),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}\b"), ("sk-",)),
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), ("AKIA", "ASIA")),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"), ("xox",)),
)
# a whole word of a key (hf_token, api-key, db.password), never a longer word (tokens, tokenizer, author)
_SECRET_WORDS = (r"(?:token|secret|passw(?:or)?d|api[_-]?key|access[_-]?key|secret[_-]?key|credentials?"
                 r"|private[_-]?key|auth|authorization|cookie|session[_-]?id)")
_SECRET_NAME = rf"(?<![A-Za-z0-9])(?:[A-Za-z0-9]+[_.-])*{_SECRET_WORDS}(?:[_.-][A-Za-z0-9]+)*(?![A-Za-z0-9])"
_SECRET_KEY = re.compile(rf"(?i)^(?:[A-Za-z0-9]+[_.-])*{_SECRET_WORDS}(?:[_.-][A-Za-z0-9]+)*$")
_NOT_SECRET = re.compile(r"(?i)^(?:eos|bos|pad|unk|sep|cls|mask)[_-]?token(?:s|[_-]id)?$")  # tokenizer fields
_ENV_KEY = re.compile(r"(?i)^(?:env|environ|environment|env_vars|runtime_env)$")
_SECRET_ASSIGN = re.compile(rf"(?i)({_SECRET_NAME}\s*(?:[:=]|&#34;:|&quot;:|\":)\s*"
                            r"(?:&#34;|&quot;|&#39;|[\"'])?)([^\s\"'<>&,}]{4,})")
_ENV_ASSIGN = re.compile(r"\b([A-Z][A-Z0-9_]{2,})=([^\s\"'<>&]+)")
_BUCKET = re.compile(r"\b(?:gs|gcs|s3|az|abfs|hdfs)://[^\s\"'<>&)\]]+")
_BUCKET_LITERALS = ("gs://", "gcs://", "s3://", "az://", "abfs://", "hdfs://")
# the site's own routes (/steps/..., /static/...) are URLs, not filesystem paths
_ROUTES = (r"(?:steps|experiments|static|compare|catalogue|predictions|alerts|api|raw|files|issues|data"
           r"|timeline)/")
_ABS_PATH = re.compile(rf"(?:(?<=^)|(?<=[\s\"'(=>\[,:;]))/(?!{_ROUTES})[A-Za-z0-9._~-]+/[^\s\"'<>)\],;&]*")
_ISSUE_REF = re.compile(r"(?<![\w./-])([A-Za-z0-9][\w.-]*)/([A-Za-z0-9][\w.-]*)#(\d+)\b")
_GITHUB = re.compile(r"https?://(?:www\.)?github\.com/([\w.-]+)/([\w.-]+)[^\s\"'<>]*")
# Where a page may be cut into pieces redacted one by one: after a newline that follows a `>` and precedes a
# `<` (with only spaces between). No pattern above matches across such a cut: none lets whitespace follow a
# `>` or precede a `<` inside a match (their whitespace comes after a word, `:` or `=`, and before a value,
# quote or word), and their look-behinds treat a piece's start as the whitespace before it. So a page is the
# concatenation of its redacted pieces, and a piece (the template's lines, the same on every page) is
# redacted once per build and then found in the memo. A name, root or secret (replaced verbatim, so it could
# match across a cut or change the `>`/`<` beside one) holding a newline, `<` or `>` turns the cutting off.
_CUT = re.compile(r"(?<=>)([ \t]*\n)(?=[ \t]*<)")
# The costliest patterns are applied only between tags holding a literal each of their matches contains
# (`_near`): neither matches a `<` or `>`, and both treat one before or after a match as they treat the text's
# edge (not a word character, not a character their look-behinds refuse), so applying one to each stretch
# between tags that holds such a literal, and to nothing else, changes exactly what it changes in the whole.
_SECRET_LITERALS = ("token", "secret", "passw", "key", "credential", "auth", "cookie", "session")
"""Lower-case literals one of which every _SECRET_WORDS match holds (in an ASCII text, where `(?i)` is ASCII
case-folding)."""
_ISSUE_HASH = re.compile(r"#\d")
_ENV_END = re.compile(r"[A-Z0-9_]=")  # the end of every _ENV_ASSIGN name
_PIECE = 512  # pieces longer than this are not memoized (they rarely repeat)


def _env_value(m: re.Match[str]) -> str:
    return f"{m.group(1)}={MASK}"


def _finds(text: str, literal: str) -> list[int]:
    out, i = [], text.find(literal)
    while i >= 0:
        out.append(i)
        i = text.find(literal, i + len(literal))
    return out


def _near(pattern: re.Pattern[str], repl: Callable[[re.Match[str]], str], s: str, hits: list[int]) -> str:
    """`pattern.sub(repl, s)` for a pattern whose matches never hold `<` or `>` and see either beside them as
    the text's edge (see above), every match holding a literal found at one of `hits`: applied to the
    stretches between tags that hold a hit only."""
    if not hits:
        return s
    out: list[str] = []
    last, n = 0, len(s)
    for h in sorted(hits):
        if h < last:
            continue  # in the stretch just done
        start = max(s.rfind("<", last, h), s.rfind(">", last, h)) + 1 or last
        ends = [e for e in (s.find("<", h), s.find(">", h)) if e >= 0]
        last_end = min(ends) if ends else n
        out += (s[last:start], pattern.sub(repl, s[start:last_end]))
        last = last_end
    out.append(s[last:])
    return "".join(out)


def pseudonym(name: str, salt: str) -> str:
    return "user-" + hashlib.sha256(f"{salt}\0{name.lower()}".encode()).hexdigest()[:6]


class Redactor:
    """Redacts text and parsed records for one prefix under one policy (see the module docstring)."""

    def __init__(self, roots: Iterable[str], names: Iterable[str] = (), *, public_repos: Iterable[str] = (),
                 anonymous: bool = False, salt: str = "") -> None:
        self.roots = sorted({r.rstrip("/") for r in roots if r and r.rstrip("/")}, key=len, reverse=True)
        self.public_repos = set() if anonymous else {r.lower() for r in public_repos}
        self.anonymous = anonymous
        self.salt = salt
        self._names: dict[str, str] = {}
        self._name_re: re.Pattern[str] | None = None
        self._memo: dict[str, str] = {}  # records repeat their strings; forgotten when a name is learnt
        self.add_names(names)

    def add_names(self, names: Iterable[str]) -> None:
        """Private names to replace everywhere (users, hosts, and with --anonymous repositories' owners)."""
        new = False
        for n in names:
            n = str(n).strip()
            if len(n) >= 2 and n.lower() not in self._names:
                self._names[n.lower()] = "anonymous" if self.anonymous else pseudonym(n, self.salt)
                new = True
        if new:
            self._memo.clear()
            alts = "|".join(re.escape(n) for n in sorted(self._names, key=len, reverse=True))
            self._name_re = re.compile(rf"(?i)(?<![A-Za-z0-9])(?:{alts})(?![A-Za-z0-9])")

    def fingerprint(self) -> str:
        """Changes whenever what this redactor replaces changes (part of every page's digest)."""
        text = repr((self.roots, sorted(self._names.items()), sorted(self.public_repos), self.anonymous))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _ref(self, m: re.Match[str]) -> str:
        repo = f"{m.group(1)}/{m.group(2)}".lower()
        return m.group(0) if repo in self.public_repos else f"{MASK}#{m.group(3)}"

    def _github(self, m: re.Match[str]) -> str:
        repo = f"{m.group(1)}/{m.group(2)}".lower()
        return m.group(0) if repo in self.public_repos else MASK

    @staticmethod
    def _assign(m: re.Match[str]) -> str:
        name = re.match(r"[\w.-]*", m.group(1))
        return m.group(0) if name and _NOT_SECRET.match(name.group(0)) else m.group(1) + MASK

    def text(self, s: str) -> str:
        """`s` with every credential, environment value, foreign path, private link and name replaced."""
        if len(s) <= 256:
            return self._memoized(s)
        if "\n" not in s or not self._can_cut():
            return self._text(s)
        parts = _CUT.split(s)  # piece, cut, piece, cut, ... (a cut is whitespace: redaction keeps it)
        self._learn_pieces(parts[2:-2:2])
        return "".join(p if k % 2 else self._memoized(p) if len(p) <= _PIECE else self._text(p)
                       for k, p in enumerate(parts))

    def _learn_pieces(self, pieces: list[str]) -> None:
        """Redact the inner pieces (each ends with `>` and starts with spaces and `<`) missing from the memo
        in one pass: joined by newlines they are cut exactly where they join, so the redacted text splits
        back into them (unless redaction made a new cut: then each is left to be redacted alone)."""
        todo = list(dict.fromkeys(p for p in pieces if len(p) <= _PIECE and p not in self._memo))
        if len(todo) < 2:
            return
        done = _CUT.split(self._text("\n".join(todo)))[::2]
        if len(done) == len(todo):
            if len(self._memo) > 500_000:
                self._memo.clear()
            self._memo.update(zip(todo, done, strict=True))

    def _memoized(self, s: str) -> str:
        hit = self._memo.get(s)
        if hit is None:
            if len(self._memo) > 500_000:
                self._memo.clear()
            hit = self._memo[s] = self._text(s)
        return hit

    def _can_cut(self) -> bool:
        """Whether no name, root or known secret holds a newline, `<` or `>` (see `_CUT`)."""
        return not any(c in x for x in (*self._names, *self.roots, *known_secrets()) for c in "\n<>")

    def _text(self, s: str) -> str:
        s = redact_credentials(s)
        for pattern, literals in _MORE_CREDENTIALS:
            if any(x in s for x in literals):
                s = pattern.sub(MASK, s)
        if s.isascii():
            low = s.lower()
            s = _near(_SECRET_ASSIGN, self._assign, s, [i for w in _SECRET_LITERALS for i in _finds(low, w)])
        else:  # (?i) folds some non-ASCII letters onto ASCII ones (the Kelvin sign onto k): scan it all
            s = _SECRET_ASSIGN.sub(self._assign, s)
        s = _near(_ENV_ASSIGN, _env_value, s, [m.start() for m in _ENV_END.finditer(s)])
        for root in self.roots:
            s = s.replace(root + "/", "").replace(root, "(prefix)")
        if any(x in s for x in _BUCKET_LITERALS):
            s = _BUCKET.sub(MASK, s)
        s = _GITHUB.sub(self._github, s)
        s = _near(_ISSUE_REF, self._ref, s, [m.start() for m in _ISSUE_HASH.finditer(s)])
        s = _ABS_PATH.sub(MASK, s)
        if self._name_re is not None:
            s = self._name_re.sub(lambda m: self._names[m.group(0).lower()], s)
        return s

    def obj(self, value: Any, key: str = "") -> Any:
        """A parsed record with secrets and environments masked by key and every string redacted."""
        secret = _SECRET_KEY.match(key) and not _NOT_SECRET.match(key)
        if key and (secret or _ENV_KEY.match(key)) and value not in (None, "", {}, []):
            return MASK
        if isinstance(value, dict):
            return {self.text(str(k)): self.obj(v, str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.obj(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        return value

    def name(self, segment: str) -> str:
        """A file or URL name: itself when redaction leaves it unchanged, else a digest that reveals
        nothing."""
        if self.text(segment) == segment:
            return segment
        return "r-" + hashlib.sha256(f"{self.salt}\0{segment}".encode()).hexdigest()[:12]
