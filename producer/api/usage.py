"""/v1/usage: what the caller's tenant used, per day, and its monthly budget."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any

from fastapi import APIRouter, Query

from paperlane.producer.api.errors import ApiError
from paperlane.producer.api.service import CallerDep, ServiceDep
from paperlane.storage import usage
from paperlane.storage.db import utcnow

router = APIRouter(prefix="/v1/usage", tags=["usage"])


@router.get("")
def get_usage(svc: ServiceDep, who: CallerDep,
              since: Annotated[str | None, Query(pattern=r"^\d{4}-\d{2}-\d{2}$", json_schema_extra={"format": "date"},
                                                 description="first day (UTC), "
                                                 "YYYY-MM-DD; default: this month's first")] = None
              ) -> dict[str, Any]:
    """The tenant's pages by outcome, pages needing review, engine tokens and seconds, per day from ``since``, their
    total, and its monthly page budget (``limit`` null: none) with what it used of it and when it starts again."""
    now = utcnow()
    try:
        start = date.fromisoformat(since) if since else usage.month_start(now)
    except ValueError:
        raise ApiError(422, "invalid_request", "since: not a day (YYYY-MM-DD)") from None
    rows = usage.days(svc.db, since=start, tenant_id=who.tenant_id)
    budget = usage.budget(svc.db, who.tenant_id, now=now)
    return {"tenant": who.tenant, "since": start.isoformat(), "days": [r.as_dict() for r in rows],
            "total": usage.totals(rows),
            "budget": {"monthly_pages": budget.limit, "used": budget.used if budget.limit is not None else None,
                       "resets": budget.resets.isoformat()}}
