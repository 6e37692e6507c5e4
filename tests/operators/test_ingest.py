"""ingest: sources to sharded documents, deterministic content-hash split, and the accounting of bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import fsspec
import pytest

from operators.documents import iter_documents, read_manifest
from operators.ingest import IngestConfig, Source, ingest


def _config(out: Path | str, *sources: Source, **kw: object) -> IngestConfig:
    return IngestConfig(sources=tuple(sources), output_path=str(out), **kw)  # type: ignore[arg-type]


def test_ingest_counts_digests_and_domains(corpus: Path, dataset: str) -> None:
    manifest = read_manifest(dataset)
    train, val = manifest["splits"]["train"], manifest["splits"]["validation"]
    assert train["documents"] + val["documents"] == 24 + 40
    assert set(train["domains"]) == {"python", "prose"}
    assert len(train["shards"]) > 1  # shard_bytes=60_000 splits the ~0.5 MB corpus
    docs = list(iter_documents(dataset, "train")) + list(iter_documents(dataset, "validation"))
    assert {d["domain"] for d in docs if d["source"].endswith(".py")} == {"python"}
    by_source = {d["source"].rsplit("/", 1)[-1]: d for d in docs}
    assert by_source["heapq.py"]["text"] == (corpus / "code" / "heapq.py").read_text(encoding="utf-8")
    assert sum(len(d["text"].encode()) for d in docs) == train["bytes"] + val["bytes"]
    assert 0 < val["documents"] < 30  # validation_fraction=0.2 of 64 documents
    assert manifest["skipped"] == {}


def test_split_is_deterministic_and_content_based(corpus: Path, tmp_path: Path) -> None:
    a = ingest(_config(tmp_path / "a", Source("python", (str(corpus / "code" / "*.py"),)),
                       validation_fraction=0.3))
    b = ingest(_config(tmp_path / "b", Source("python", (str(corpus / "code" / "[a-m]*.py"),)),
                       Source("python", (str(corpus / "code" / "[n-z]*.py"),)), validation_fraction=0.3))
    val_a = sorted(d["id"] for d in iter_documents(str(tmp_path / "a"), "validation"))
    val_b = sorted(d["id"] for d in iter_documents(str(tmp_path / "b"), "validation"))
    assert val_a == val_b and val_a  # same texts -> same split, whatever the source grouping
    assert a["splits"]["train"]["shards"][0]["sha256"] == ingest(_config(
        tmp_path / "c", Source("python", (str(corpus / "code" / "*.py"),)), validation_fraction=0.3,
    ))["splits"]["train"]["shards"][0]["sha256"]
    salted = ingest(_config(tmp_path / "d", Source("python", (str(corpus / "code" / "*.py"),)),
                            validation_fraction=0.3, split_salt="other"))
    assert sorted(d["id"] for d in iter_documents(str(tmp_path / "d"), "validation")) != val_a
    assert salted["splits"]["train"]["documents"] + salted["splits"]["validation"]["documents"] == 24
    assert b["splits"]["train"]["documents"] == a["splits"]["train"]["documents"]


def test_bad_inputs_are_counted_not_dropped_silently(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.txt").write_text("a fine document\n", encoding="utf-8")
    (src / "same.txt").write_text("a fine document\n", encoding="utf-8")
    (src / "empty.txt").write_bytes(b"")
    (src / "blank.txt").write_text(" \n\t\n", encoding="utf-8")
    (src / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (src / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (src / "skip_me.txt").write_text("excluded text", encoding="utf-8")
    lines = [json.dumps({"text": "line one"}), "{not json", json.dumps({"body": "no text field"}),
             json.dumps({"text": 42}), "", json.dumps({"text": "line two"})]
    (src / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    manifest = ingest(_config(tmp_path / "out", Source("t", (str(src / "*.txt"),), exclude=("skip_me",)),
                              Source("j", (str(src / "*.jsonl"),), kind="jsonl"), validation_fraction=0.0))
    skipped = {k: v["count"] for k, v in manifest["skipped"].items()}
    assert skipped == {"binary": 1, "undecodable": 1, "empty": 2, "duplicate": 1, "excluded": 1,
                       "malformed_jsonl": 3}
    assert any(e.endswith("docs.jsonl:2") for e in manifest["skipped"]["malformed_jsonl"]["examples"])
    assert any(e.endswith("image.txt") for e in manifest["skipped"]["binary"]["examples"])
    texts = sorted(d["text"] for d in iter_documents(str(tmp_path / "out")))
    assert texts == ["a fine document\n", "line one", "line two"]
    replaced = ingest(_config(tmp_path / "out2", Source("t", (str(src / "latin1.txt"),)),
                              validation_fraction=0.0, decode_errors="replace"))
    assert replaced["skipped"]["undecodable"]["count"] == 1
    assert [d["text"] for d in iter_documents(str(tmp_path / "out2"))] == ["caf\ufffd au lait"]


def test_missing_source_fails_before_writing(tmp_path: Path, corpus: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothing-here/\*\.txt.*matches no file"):
        ingest(_config(tmp_path / "out", Source("python", (str(corpus / "code" / "*.py"),)),
                       Source("x", (str(tmp_path / "nothing-here" / "*.txt"),))))
    assert not (tmp_path / "out").exists()


def test_all_inputs_bad_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "e.txt").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="no training documents.*'empty': 1"):
        ingest(_config(tmp_path / "out", Source("t", (str(tmp_path / "e.txt"),))))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="domain 'bad/name'"):
        Source("bad/name", ("x",))
    with pytest.raises(ValueError, match="has no paths"):
        Source("ok")
    with pytest.raises(ValueError, match="kind 'csv'"):
        Source("ok", ("x",), kind="csv")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="validation_fraction"):
        IngestConfig(sources=(Source("ok", ("x",)),), output_path="o", validation_fraction=1.0)
    with pytest.raises(ValueError, match="sources is empty"):
        IngestConfig(sources=(), output_path="o")


def test_parquet_gzip_and_fsspec_urls(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8") as f:
        f.write("compressed document")
    fs = fsspec.filesystem("memory")
    fs.pipe("/in/b.txt", b"remote document")
    out = "memory://ingest-out"
    manifest = ingest(_config(out, Source("d", (str(tmp_path / "*.gz"), "memory://in/*.txt")),
                              validation_fraction=0.0, file_format="parquet"))
    assert manifest["file_format"] == "parquet"
    assert manifest["splits"]["train"]["shards"][0]["path"].endswith(".parquet")
    docs = list(iter_documents(out))
    assert sorted(d["text"] for d in docs) == ["compressed document", "remote document"]
    assert any(d["source"].startswith("memory://") for d in docs)


def test_pydoc_topics_source(tmp_path: Path) -> None:
    manifest = ingest(_config(tmp_path, Source("prose", kind="pydoc_topics"), validation_fraction=0.0))
    from pydoc_data.topics import topics

    assert manifest["splits"]["train"]["documents"] == len({t for t in topics.values() if t.strip()})


def test_tampered_shard_is_detected(tmp_path: Path, corpus: Path) -> None:
    ingest(_config(tmp_path, Source("python", (str(corpus / "code" / "heapq.py"),)), validation_fraction=0.0))
    shard = tmp_path / "train" / "00000.jsonl"
    shard.write_text(shard.read_text(encoding="utf-8").replace("heap", "HEAP"), encoding="utf-8")
    with pytest.raises(ValueError, match="does not match the sha256"):
        list(iter_documents(str(tmp_path)))


def test_http_url_source(tmp_path: Path) -> None:
    """A URL source read through fsspec's HTTP filesystem (a real server on loopback; https works the
    same)."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    served = tmp_path / "www"
    served.mkdir()
    (served / "page.txt").write_text("text fetched over http ✓", encoding="utf-8")
    class QuietHandler(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # keep the test output clean
            pass

    handler = functools.partial(QuietHandler, directory=str(served))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/page.txt"
        manifest = ingest(_config(tmp_path / "out", Source("web", (url,)), validation_fraction=0.0))
    finally:
        server.shutdown()
        thread.join()
    docs = list(iter_documents(str(tmp_path / "out")))
    assert [d["text"] for d in docs] == ["text fetched over http ✓"]
    assert docs[0]["source"] == url and docs[0]["relpath"] == "page.txt"
    nbytes = len("text fetched over http ✓".encode())
    assert manifest["splits"]["train"]["domains"] == {"web": {"documents": 1, "bytes": nbytes}}
