"""paperlane's Celery app for Celery's own tools: ``celery -A paperlane.priority.celery_app inspect active``,
``... inspect ping``, ``... control``, or Flower.

An entry point, like the CLI: importing this module builds the settings from the ``PAPERLANE_*``
environment (the same variables the workers use), because ``celery -A`` needs a module attribute.
Nothing in paperlane imports it. A bare ``celery -b redis://...`` cannot talk to paperlane's workers:
the lane queues use their own Redis key layout (``priority.broker``), which only this app knows.
"""

from __future__ import annotations

from paperlane.priority.broker import make_celery
from paperlane.settings import load_settings

app = make_celery(load_settings())
