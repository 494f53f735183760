"""paperlane: scanned documents to structured text, from one page to millions.

The shared pieces live here (settings, schemas, errors, the CLI); each step of the
flow is its own top-level package: producer, priority, workers, models, storage.
"""

__version__ = "0.1.0"
