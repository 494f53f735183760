"""The ``paperlane`` command line, one module per group of commands:

- ``run`` (``local``): documents processed in this process;
- ``submit`` (``submission``): an ingest registered and queued;
- ``worker``, ``outputs``, ``api`` (``servers``): the long-running processes;
- ``status``, ``review``, ``report`` (``show``): what there is to see;
- ``keys create|list|revoke|rotate-secret|grant|ungrant|grants`` (``api_keys``): tenants' keys and grants;
- ``tenants set|list``, ``usage`` (``accounts``): tenants' weights, budgets and what they used;
- ``db upgrade|retention``, ``dead-letters`` (``maintenance``): the database's schema and history, messages
  workers set aside.

``root`` holds the app, its global options and ``main``, the entry point.
"""

from __future__ import annotations

# isort: off
# Imported in the order ``paperlane --help`` lists their commands.
from paperlane.cli import local, submission, servers, show, maintenance, api_keys, accounts
# isort: on
from paperlane.cli.root import app, main

__all__ = ["accounts", "api_keys", "app", "local", "main", "maintenance", "servers", "show", "submission"]
