"""The dashboard shows a step's interruption ledger: in its JSON (`/api/steps/...`) and on its page."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi.testclient import TestClient

from marin import Step, this_output_path
from marin.dashboard import create_app
from marin.status.interruptions import record_interruption, record_resume
from marin.storage.fs import storage_for
from tests.marin.fns import WriteConfig, write_numbers


def test_a_steps_ledger_is_in_its_json_and_on_its_page(run_marin: Any, marin_prefix: str) -> None:
    result = run_marin(
        [Step(name="led/x", fn=write_numbers, config=WriteConfig(output_path=this_output_path()))]
    )
    out = result.output_path("led/x")
    storage = storage_for(out)
    record_interruption(
        storage,
        out,
        name="led/x",
        attempt=1,
        run_id="r",
        cause="node_died",
        hosts=["10.0.0.7"],
        started=0.0,
        ended=30.0,
    )
    record_resume(storage, out, attempt=2, started=45.0)
    rel = quote(str(Path(out).relative_to(marin_prefix)))
    with TestClient(create_app(marin_prefix, cache_ttl=0)) as client:
        detail = client.get(f"/api/steps/{rel}").json()
        page = client.get(f"/steps/{rel}").text
    [entry] = detail["interruptions"]["interruptions"]
    assert entry["cause"] == "node_died" and entry["time_lost_s"] == 45.0
    assert '<table class="list" id="interruptions">' in page and "node_died" in page and "10.0.0.7" in page
