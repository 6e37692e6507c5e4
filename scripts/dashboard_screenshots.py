"""Screenshots of every dashboard page for docs/dashboard.md, from real runs, as small PNGs.

    python scripts/dashboard_screenshots.py --prefix LAB [--ladder-prefix LADDER] [--out docs/img/dashboard]

LAB is a prefix where the tutorial ran, with an ablation of it (the compare view compares the two):

    python experiments/tutorials/tiny_moe.py --prefix LAB
    python experiments/exp2_tiny_moe_aux_free.py --prefix LAB

LADDER is a prefix where the reduced scaling ladder ran (its fit and prediction pages and its alerts):

    MARIN_LADDER_SMALL=1 python experiments/exp15_scaling_ladder.py --prefix LADDER --backend local

Each prefix is served by `marin dashboard` in a subprocess on 127.0.0.1 and every page is opened in
Debian's headless Chromium through Playwright (as tests/dashboard/test_browser.py does; run it inside the
private network namespace: `scripts/netns python scripts/dashboard_screenshots.py ...`). A page is laid out
1280 CSS pixels wide and rendered at 1000 pixels, at most `--max-height` CSS pixels of it from the top, then
written as a palette PNG (its exact colours when it has at most 256, else the most used ones; fewer
colours until it is under `--max-kb`), with numpy and zlib only: the browser decodes Chromium's PNG.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
WIDTH, CSS_WIDTH = 1000, 1280  # pixels of the image; CSS pixels of the page's layout
COLOURS = (256, 128, 64, 32)  # palette sizes tried, until a file is under --max-kb


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def served(prefix: str) -> Iterator[str]:
    """`marin dashboard --prefix prefix` on a free loopback port; yields its URL."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "marin.dashboard.cli", "--prefix", prefix, "--port",
                             str(port), "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/api/experiments", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the dashboard on {prefix} did not come up on {url}") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def experiment(url: str, script_stem: str) -> dict[str, Any]:
    """The newest experiment whose script is named `script_stem`, in full (its steps)."""
    items = get(f"{url}/api/experiments?limit=500")["items"]
    found = [e for e in items if Path(str(e.get("script"))).stem == script_stem]
    if not found:
        scripts = sorted({str(e.get("script")) for e in items})
        raise SystemExit(f"no experiment of {script_stem}.py under this prefix (it holds {scripts}); run it "
                         "first (see this script's docstring)")
    return dict(get(f"{url}/api/experiments/{found[0]['id']}"))


def step_path(exp: dict[str, Any], name: str) -> str:
    for s in exp["steps"]:
        if s["name"] == name:
            return urllib.parse.quote(str(s["path"]))
    names = [s["name"] for s in exp["steps"]]
    raise SystemExit(f"experiment {exp['id']} has no step {name!r} (it has {names})")


def lab_pages(url: str) -> list[tuple[str, str]]:
    """(file name, URL) of the pages the tutorial and its ablation show."""
    tutorial, ablation = experiment(url, "tiny_moe"), experiment(url, "exp2_tiny_moe_aux_free")
    issue = (tutorial.get("issue") or {}).get("url") or "/issues"
    return [
        ("experiments.png", f"{url}/"),
        ("experiment.png", f"{url}/experiments/{tutorial['id']}"),
        ("step-train.png", f"{url}/steps/{step_path(tutorial, 'train/tiny_moe')}"),
        ("step-eval.png", f"{url}/steps/{step_path(tutorial, 'eval/tiny_moe')}"),
        ("step-choices.png", f"{url}/steps/{step_path(tutorial, 'eval_choices/tiny_moe')}"),
        ("compare.png", f"{url}/compare?runs={tutorial['id']}&runs={ablation['id']}&smooth=0.9"),
        ("catalogue.png", f"{url}/catalogue"),
        ("issue.png", f"{url}{issue}"),
    ]


def ladder_pages(url: str) -> list[tuple[str, str]]:
    """(file name, URL) of the scaling ladder's pages: the fit, the prediction, the alerts history."""
    ladder = experiment(url, "exp15_scaling_ladder")
    return [
        ("ladder-fit.png", f"{url}/steps/{step_path(ladder, 'exp15/fit')}"),
        ("ladder-prediction.png", f"{url}/steps/{step_path(ladder, 'exp15/prediction')}"),
        ("predictions.png", f"{url}/predictions"),
        ("alerts.png", f"{url}/alerts"),
    ]


DECODE = """async (src) => {
    const img = new Image(); img.src = 'data:image/png;base64,' + src; await img.decode();
    const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
    const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
    const d = ctx.getImageData(0, 0, c.width, c.height).data;
    let s = '';
    for (let i = 0; i < d.length; i += 0x8000) {
        s += String.fromCharCode.apply(null, d.subarray(i, i + 0x8000));
    }
    return [c.width, c.height, btoa(s)];
}"""


def decode(blank: Any, png: bytes) -> np.ndarray:
    """The PNG's pixels as (height, width, 3) uint8, decoded by the browser (a blank page: no CSP)."""
    width, height, data = blank.evaluate(DECODE, base64.b64encode(png).decode())
    rgba = np.frombuffer(base64.b64decode(data), dtype=np.uint8).reshape(height, width, 4)
    return np.ascontiguousarray(rgba[:, :, :3])


def quantize(rgb: np.ndarray, colours: int) -> tuple[np.ndarray, np.ndarray]:
    """(palette (n, 3), indices (h, w)): the page's exact colours when it has at most `colours`; else the mean
    colours of the most used 4-bit-per-channel boxes (so hundreds of anti-aliasing greys do not crowd out the
    few colours of a chart), every pixel mapped to the nearest of them."""
    flat = rgb.reshape(-1, 3)
    key = (flat[:, 0].astype(np.int64) << 16) | (flat[:, 1].astype(np.int64) << 8) | flat[:, 2]
    uniq, inverse = np.unique(key, return_inverse=True)
    ucol = np.stack([(uniq >> 16) & 255, (uniq >> 8) & 255, uniq & 255], axis=1).astype(np.int32)
    if len(uniq) <= colours:
        return ucol.astype(np.uint8), inverse.reshape(rgb.shape[:2]).astype(np.uint8)
    r, g, b = (flat[:, i].astype(np.int64) >> 4 for i in range(3))
    box = (r << 8) | (g << 4) | b
    boxes, box_of, counts = np.unique(box, return_inverse=True, return_counts=True)
    top = np.argsort(counts)[::-1][:colours]
    sums = np.zeros((len(boxes), 3))
    np.add.at(sums, box_of, flat)
    palette = (sums[top] / counts[top, None]).round().astype(np.int32)
    nearest = np.empty(len(uniq), dtype=np.uint8)
    for i in range(0, len(uniq), 4096):
        d = ((ucol[i:i + 4096, None, :] - palette[None, :, :]) ** 2).sum(axis=2)
        nearest[i:i + 4096] = d.argmin(axis=1)
    return palette.astype(np.uint8), nearest[inverse].reshape(rgb.shape[:2])


def png8(path: Path, palette: np.ndarray, index: np.ndarray) -> None:
    """Write a palette PNG (colour type 3, filter 0 on every row, zlib level 9)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    height, width = index.shape
    rows = np.hstack([np.zeros((height, 1), dtype=np.uint8), index.astype(np.uint8)])
    header = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0)  # 8-bit palette, no interlace
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                     + chunk(b"PLTE", palette.astype(np.uint8).tobytes())
                     + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) + chunk(b"IEND", b""))


def shrink(blank: Any, png: bytes, target: Path, max_kb: int) -> None:
    """`png` as a palette PNG at `target` with the most colours (of COLOURS) that stays under `max_kb`."""
    rgb = decode(blank, png)
    for colours in COLOURS:
        png8(target, *quantize(rgb, colours))
        if target.stat().st_size <= max_kb * 1024:
            return
    print(f"warning: {target} is {target.stat().st_size // 1024} KiB even with {COLOURS[-1]} colours",
          file=sys.stderr)


def shoot(pages: list[tuple[str, str]], out: Path, max_height: int, max_kb: int,
          settle: Callable[[Any], None] | None = None) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            # laid out 1280 CSS pixels wide (the list's columns fit), rendered at WIDTH device pixels
            page = browser.new_page(viewport={"width": CSS_WIDTH, "height": 1000},
                                    device_scale_factor=WIDTH / CSS_WIDTH)
            blank = browser.new_page()
            for name, url in pages:
                response = page.goto(url, wait_until="networkidle")
                if response is None or response.status != 200:
                    raise SystemExit(f"{url} answered {response.status if response else 'nothing'}")
                if settle is not None:
                    settle(page)
                height = min(max_height, int(page.evaluate("document.documentElement.scrollHeight")))
                target = out / name
                png = page.screenshot(full_page=True,
                                      clip={"x": 0, "y": 0, "width": CSS_WIDTH, "height": height})
                shrink(blank, png, target, max_kb)
                print(f"{target}  {target.stat().st_size // 1024} KiB  {url}")
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", required=True, help="where the tutorial and exp2 ran")
    ap.add_argument("--ladder-prefix", help="where the reduced scaling ladder ran (default: --prefix)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "dashboard"))
    ap.add_argument("--max-height", type=int, default=1500, help="CSS pixels of a page kept, from its top")
    ap.add_argument("--max-kb", type=int, default=150)
    args = ap.parse_args(argv)
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} is not installed (apt-get install -y chromium)")
    out = Path(args.out)
    with served(args.prefix) as url:
        shoot(lab_pages(url), out, args.max_height, args.max_kb)
    with served(args.ladder_prefix or args.prefix) as url:
        shoot(ladder_pages(url), out, args.max_height, args.max_kb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
