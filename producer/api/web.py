"""The pages a browser opens: the web page at ``/`` and the API's description at ``/docs``, each under a
Content-Security-Policy that lets only this origin's scripts (and their own inline ones, by hash) run, and the
docs' Swagger UI served from here (the files ``fastapi_offline`` ships), never from a CDN: nothing from another
origin runs where API keys are typed."""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from paperlane.producer.api.errors import ApiError

router = APIRouter(include_in_schema=False)

_ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png"}
_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.S)  # inline scripts and styles (no src attribute)


@router.get("/")
def index() -> HTMLResponse:
    return _page(_index_html())


@router.get("/docs")
def docs(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    html = get_swagger_ui_html(openapi_url=f"{root}{request.app.openapi_url}", title="paperlane API",
                               swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
                               swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
                               swagger_favicon_url=f"{root}/docs/assets/favicon.png",
                               swagger_ui_parameters={"validatorUrl": None})
    return _page(bytes(html.body).decode())


@router.get("/docs/assets/{name}")
def docs_asset(name: str) -> FileResponse:
    if name not in _ASSETS:
        raise ApiError(404, "not_found", "no such resource")
    return FileResponse(_assets() / name, media_type=_ASSETS[name], headers={"Cache-Control": "public, max-age=86400"})


def _page(html: str) -> HTMLResponse:
    return HTMLResponse(html, headers={"Content-Security-Policy": policy(html), "X-Content-Type-Options": "nosniff",
                                       "Referrer-Policy": "no-referrer"})


def policy(html: str) -> str:
    """The Content-Security-Policy of a page: this origin's scripts, styles and images, the page's own inline
    scripts and styles by their hash, fetches to this origin only, no frames, no forms posting elsewhere."""
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for kind, body in _INLINE.findall(html):
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        hashes[kind].append(f"'sha256-{digest}'")
    return "; ".join([
        "default-src 'none'", f"script-src 'self' {' '.join(hashes['script'])}".strip(),
        f"style-src 'self' {' '.join(hashes['style'])}".strip(), "img-src 'self' blob: data:", "connect-src 'self'",
        "font-src 'self'", "base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'"])


@cache
def _index_html() -> str:
    return resources.files("paperlane.producer").joinpath("web/index.html").read_text("utf-8")


@cache
def _assets() -> Path:
    return Path(str(resources.files("fastapi_offline").joinpath("static")))
