"""Build the shipped multiple-choice tasks from the tutorial's corpus, deterministically.

    python -m operators.tasks.build            # rewrites operators/tasks/*.jsonl and tasks.json

Both tasks draw only from documents the tutorial holds out: a document is used when the ingest operator's
content-hash split (``operators.ingest``, default ``split_salt``) puts it in validation at
``validation_fraction = 0.05``, the tutorial's full setting. Since the split is ``hash < fraction``, those
documents are held out at the CI setting (0.12) too, so no tutorial run trains on a task's text.

- ``pydoc_next_sentence_v1`` (prose, from ``pydoc_data.topics``): the context is one sentence of a prose
  paragraph, the gold choice is the sentence that follows it, the three distractors are sentences from other
  paragraphs of similar length (within a factor 1.5), so that length alone says little.
- ``stdlib_next_line_v1`` (code, from the stdlib's top-level modules): the context is four consecutive source
  lines, the gold choice the next line, the distractors lines from other held-out modules with the same
  indentation and a similar length.

Choices carry their own separator (" " before a sentence, "\\n" before a line) and contexts never end in
whitespace, so lm-evaluation-harness (``target_delimiter: ""``) and our scorer split every pair at the same
place (docs/evaluation.md). The output depends on the Python version's standard library; ``tasks.json``
records the version the shipped files came from.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from operators.ingest import IngestConfig, Source, _in_validation

HERE = Path(__file__).parent
FRACTION, SALT = 0.05, "split-v1"  # the tutorial's full setting and IngestConfig's default salt
SPLIT = {"validation_fraction": FRACTION, "split_salt": SALT}
MAX_ITEMS = 200
N_CHOICES = 4


def _held_out(text: str) -> bool:
    cfg = IngestConfig(sources=(Source("prose", kind="pydoc_topics"),), output_path="unused",
                       validation_fraction=FRACTION, split_salt=SALT)
    return _in_validation(text, cfg)


def _prose_paragraphs(text: str) -> Iterator[str]:
    """Paragraphs of running text: no indented (code, grammar) or heading lines."""
    for block in re.split(r"\n\s*\n", text):
        lines = block.split("\n")
        if any(not ln or ln[0].isspace() or set(ln) <= set("*=-") for ln in lines):
            continue
        yield re.sub(r"\s+", " ", " ".join(lines)).strip()


def _sentences(paragraph: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"(])", paragraph) if 30 <= len(s) <= 220]


def _pick_distractors(rng: random.Random, pool: list[tuple[int, str]], group: int, gold: str,
                      similar: Any) -> list[str] | None:
    options = sorted({s for g, s in pool if g != group and s != gold and similar(s, gold)})
    if len(options) < N_CHOICES - 1:
        return None
    return rng.sample(options, N_CHOICES - 1)


def _item(rng: random.Random, item_id: str, context: str, gold: str, distractors: list[str], sep: str,
          source: str) -> dict[str, Any]:
    choices = [sep + c for c in [gold, *distractors]]
    order = list(range(N_CHOICES))
    rng.shuffle(order)
    return {"id": item_id, "context": context, "choices": [choices[i] for i in order],
            "gold": order.index(0), "source": source}


def _subsample(rng: random.Random, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(items) <= MAX_ITEMS:
        return items
    keep = sorted(rng.sample(range(len(items)), MAX_ITEMS))
    return [items[i] for i in keep]


def next_sentence_items() -> list[dict[str, Any]]:
    """Which sentence follows? Held-out pydoc topics; distractors of similar length from other paragraphs."""
    from pydoc_data.topics import topics

    rng = random.Random("pydoc_next_sentence_v1")
    pool: list[tuple[int, str]] = []
    pairs: list[tuple[int, str, str, str]] = []
    group = 0
    for name in sorted(topics):
        if not _held_out(topics[name]):
            continue
        for para in _prose_paragraphs(topics[name]):
            group += 1
            sents = _sentences(para)
            pool += [(group, s) for s in sents]
            pairs += [(group, a, b, f"pydoc_data.topics:{name}")
                      for a, b in zip(sents, sents[1:], strict=False) if para.find(a) + len(a) < para.find(b)]
    items: list[dict[str, Any]] = []
    for k, (g, a, b, source) in enumerate(pairs):
        distractors = _pick_distractors(rng, pool, g, b, lambda s, t: 1 / 1.5 <= len(s) / len(t) <= 1.5)
        if distractors is not None:
            items.append(_item(rng, f"pns-{k:04d}", a, b, distractors, " ", source))
    return _subsample(rng, items)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def next_line_items() -> list[dict[str, Any]]:
    """Which source line follows four lines of held-out stdlib code? Distractors share the indentation."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rng = random.Random("stdlib_next_line_v1")
    pool: list[tuple[int, str]] = []
    cands: list[tuple[int, str, str, str]] = []
    for g, path in enumerate(sorted(stdlib.glob("*.py"))):
        text = path.read_text(encoding="utf-8", errors="replace").removeprefix("\ufeff")
        if not _held_out(text):
            continue
        lines = [ln.rstrip() for ln in text.split("\n")]
        good = [bool(ln.strip()) and 12 <= len(ln.strip()) <= 90 and "\t" not in ln for ln in lines]
        pool += [(g, ln) for ln, ok in zip(lines, good, strict=True) if ok]
        for i in range(4, len(lines)):
            if good[i] and all(lines[j].strip() for j in range(i - 4, i)):
                cands.append((g, "\n".join(lines[i - 4:i]), lines[i], f"{path.name}:{i + 1}"))
    rng.shuffle(cands)
    items: list[dict[str, Any]] = []
    for g, context, gold, source in cands[: 4 * MAX_ITEMS]:
        def similar(s: str, t: str) -> bool:
            return _indent(s) == _indent(t) and 1 / 1.5 <= len(s) / len(t) <= 1.5

        distractors = _pick_distractors(rng, pool, g, gold, similar)
        if distractors is not None and gold not in context:
            items.append(_item(rng, f"snl-{len(items):04d}", context, gold, distractors, "\n", source))
    return items[:MAX_ITEMS]


BUILDERS = {"pydoc_next_sentence_v1": next_sentence_items, "stdlib_next_line_v1": next_line_items}


def write_tasks(directory: Path) -> dict[str, Any]:
    """Write every task's JSONL and ``tasks.json`` (their metadata) into ``directory``."""
    meta: dict[str, Any] = {"python": ".".join(map(str, sys.version_info[:3])), "split": SPLIT, "tasks": {}}
    for name, build in BUILDERS.items():
        items = build()
        blob = "".join(json.dumps(it, ensure_ascii=False, sort_keys=True) + "\n" for it in items).encode()
        (directory / f"{name}.jsonl").write_bytes(blob)
        digest = hashlib.sha256(blob).hexdigest()
        meta["tasks"][name] = {"items": len(items), "choices": N_CHOICES, "sha256": digest,
                               "doc": (build.__doc__ or "").strip()}
    (directory / "tasks.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    os.makedirs(out, exist_ok=True)
    for task, row in write_tasks(out)["tasks"].items():
        print(f"{task}: {row['items']} items -> {out / (task + '.jsonl')}")
