"""paperlane's HTTP API (FastAPI): another producer and reader over the same ingests, documents and pages.

Every answer about state is read from the database, so any replica answers for any worker; uploads are
registered exactly as ``paperlane submit`` registers files (``Submitter``), as an ingest of the caller's
tenant. ``/docs`` serves the OpenAPI description, ``/`` a web page to try it.

    app          the app: its routers, error handlers, metrics, the webhook dispatcher      create_app, serve
    guard        before any body is read: the caller's key, failed-key throttling, rates, body caps
    limits       sliding request windows and open streams, kept in Redis for every replica
    service      what the routes share (database, store, broker, Redis, threads by kind), and who is calling
    errors       one error shape: {"error": {"code", "message"}}, a public message only, reasons redacted
    options      the options of an upload or an ingest, defined once
    uploads      a multipart upload read within its limits, and registered
    documents    /v1/documents: upload, status (long poll), result, events (SSE)
    ingests      /v1/ingests: an S3 ingest, status
    pages        /v1/pages: a page (in any output format), its annotated image
    files        a document's or a page's output in one format, stored or built on request
    usage        /v1/usage: the caller's tenant's metered use and monthly budget
    health       /healthz, /readyz, /metrics
    web          the web page at / and the docs at /docs, under a Content-Security-Policy
"""
