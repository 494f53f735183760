"""/v1/pages: a page's status and result (or the page in an archive format), and its annotated image."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from paperlane.formats import Scope
from paperlane.formats.registry import names
from paperlane.producer.api.errors import ApiError, public
from paperlane.producer.api.files import PAGE_FILES, annotated_file, page_file
from paperlane.producer.api.options import Id
from paperlane.producer.api.service import CallerDep, ServiceDep
from paperlane.producer.api.turns import TurnDep
from paperlane.schemas import OutputFormat
from paperlane.storage import status_reads, views
from paperlane.storage.results import page_result

router = APIRouter(prefix="/v1/pages", tags=["pages"])
# json (the page's status and result), and each archive format a page has alone.
_FORMATS = f"^(json|{'|'.join(names(scope=Scope.PAGE, archive=True))})$"


@router.get("/{page_id}", response_model=None, responses=PAGE_FILES)
def get_page(page_id: Id, svc: ServiceDep, who: CallerDep, turn: TurnDep,
             format: Annotated[str, Query(pattern=_FORMATS, description="json: its status and "
                                          "result; alto, page (PAGE XML), hocr: the page alone in that format, "
                                          "once it is final")] = "json") -> dict[str, Any] | Response:
    """A page: its status and, once final, its result; or the page in ALTO, PAGE XML or hOCR."""
    found = status_reads.get_page(svc.db, page_id, tenant_id=who.tenant_id)
    if format != "json":
        return page_file(svc, found, OutputFormat(format), tenant_id=who.tenant_id,
                         waiting=turn.give_back_from_thread)
    result = None
    if views.page_state(found.job).final:
        result = page_result(svc.store, found.job, source=found.document.source, page_no=found.page.page_no)
    view = views.page_view(found.page.id, found.document.id, found.page.page_no, found.job, result=result)
    return public(view)


@router.get("/{page_id}/annotated", response_class=Response, responses={200: {
    "description": "the image", "content": {f"image/{t}": {"schema": {"type": "string"}} for t in ("jpeg", "png", "webp")}}})
def get_annotated(page_id: Id, svc: ServiceDep, who: CallerDep, turn: TurnDep) -> Response:
    """The page's annotated image (its lines drawn on it), drawn on request when the worker did not draw it."""
    found = status_reads.get_page(svc.db, page_id, tenant_id=who.tenant_id)
    return annotated_file(svc, found, tenant_id=who.tenant_id, waiting=turn.give_back_from_thread)
