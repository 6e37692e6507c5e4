"""Files: browse the prefix (listings and previews) and download a file as a stream. Never leaves the
prefix."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from marin.dashboard.context import Dashboard, get_dashboard, page
from marin.dashboard.files import FileNotFound, browse
from marin.dashboard.paths import clean_relpath
from marin.dashboard.schemas import FileListing, FilePreview

router = APIRouter()
Dash = Annotated[Dashboard, Depends(get_dashboard)]


@router.get("/api/files", response_model=FileListing, tags=["files"])
def list_root(dash: Dash) -> FileListing | FilePreview:
    """The top of the prefix."""
    return browse(dash.store, "")


@router.get("/api/files/{file_path:path}", response_model=FileListing | FilePreview, tags=["files"])
def get_file(file_path: str, dash: Dash) -> FileListing | FilePreview:
    """A directory listing, or the first 64 KiB of a file as text."""
    return browse(dash.store, clean_relpath(file_path))


@router.get("/raw/{file_path:path}", tags=["files"], response_class=StreamingResponse)
def raw_file(file_path: str, dash: Dash) -> StreamingResponse:
    """The whole file, streamed in chunks, as an attachment (never rendered as HTML by the browser)."""
    rel = clean_relpath(file_path)
    dash.store.check_inside(rel)
    info = dash.store.info(rel)
    if info is None or info.get("type") != "file":
        raise FileNotFound(f"no file {rel!r} under the prefix")
    name = rel.rsplit("/", 1)[-1].encode("ascii", "replace").decode().replace('"', "_")
    return StreamingResponse(
        dash.store.stream(
            rel, limit=int(info.get("size") or 0)
        ),  # the size announced, even if the file grows
        media_type="application/octet-stream",
        headers={
            "content-disposition": f'attachment; filename="{name}"',
            "content-length": str(info.get("size", 0)),
        },
    )


@router.get("/files", response_class=HTMLResponse, include_in_schema=False)
@router.get("/files/{file_path:path}", response_class=HTMLResponse, include_in_schema=False)
def files_page(request: Request, dash: Dash, file_path: str = "") -> HTMLResponse:
    item = browse(dash.store, clean_relpath(file_path))
    return page(
        request, "files.html", {"prefix": dash.prefix, "item": item}
    )
