"""Every Redis key, list and channel paperlane reads or writes, named here and nowhere else.

One style: ``paperlane.<what>`` and, for keys per thing, ``paperlane.<what>.<id>``. Two kinds of names are
kombu's, not ours, and only named here because paperlane reads them: the ``:<priority>`` suffix of a queue's
priority lists (kombu's Redis transport keeps one list per queue and priority, ``sep`` ``:``) and the hash of
messages delivered but not yet acknowledged (``UNACKED``), with its index of delivery times (``UNACKED_INDEX``).

    paperlane.<lane>[:<priority>]     a lane's queue: the Celery messages of its pages, one list per priority
    unacked                            kombu: delivery tag -> [message, exchange, routing key]
    unacked_index                      kombu: delivery tag -> when it was delivered
    paperlane.delayed                  pages due later (sorted set by due time)        priority.delayed
    paperlane.delayed.releasing        ... claimed, being put back on their lane
    paperlane.delayed (channel)        "a page was delayed": wakes every worker's retry clock
    paperlane.dead-letter              messages no worker could take (list, newest first)   priority.deadletter
    paperlane.present                  pages whose message waits on a lane, by fair share or delayed (set of job
                                       ids; taken out when a worker pops the message)         priority.presence
    paperlane.answer.<job>             an engine's answer, kept an hour                   workers.answers
    paperlane.rate.<subject>           the API's requests in the last minute, per key, tenant and (failed
                                       authentications) client address: a sliding log   producer.api.limits
    paperlane.streams.<key>            a key's open event streams and long polls, each until it expires

Fair share within a lane (``priority.fair``): the lane's queue above is a short buffer, and the pages waiting
behind it are kept per tenant and ingest. Only tenants and ingests with pages waiting have keys.

    paperlane.fair.<lane>                           tenants with pages waiting, by pass (sorted set)
    paperlane.fair.<lane>.gone                      tenants that left ahead of the lane's virtual time, by pass
    paperlane.fair.<lane>.state                     seq (messages put), held (messages waiting) (hash)
    paperlane.fair.<lane>.weights                   <tenant> and <tenant>.<ingest> -> weight, while waiting (hash)
    paperlane.fair.<lane>.tenant.<tenant>           a tenant's ingests with pages waiting, by pass (sorted set)
    paperlane.fair.<lane>.ingest.<tenant>.<ingest>  an ingest's waiting messages by (priority, seq) (sorted set)
    paperlane.fair.picks.<minute>                   pages moved to each lane's buffer that minute (hash, 3 min)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PRIORITY_SEP = ":"  # kombu's separator between a queue's name and a priority
UNACKED = "unacked"  # kombu's Redis transport: messages delivered and not yet acknowledged
UNACKED_INDEX = "unacked_index"  # kombu's too: delivery tag -> when it was delivered (epoch seconds)

DELAYED = "paperlane.delayed"
RELEASING = "paperlane.delayed.releasing"
DELAYED_CHANNEL = "paperlane.delayed"
DEAD_LETTERS = "paperlane.dead-letter"
PRESENT = "paperlane.present"
_ANSWER = "paperlane.answer."
_RATE = "paperlane.rate."
_STREAMS = "paperlane.streams."
_QUEUE = "paperlane."
_FAIR = "paperlane.fair."
FAIR_PICKS = "paperlane.fair.picks."  # + the minute (unix time // 60), built inside priority.fair's scripts
NO_TENANT = "-"  # the tenant (and ingest) name of pages that have none: the command line's


def queue(lane: str) -> str:
    """The Celery queue (and Redis list) of the lane called ``lane``."""
    return f"{_QUEUE}{lane}"


def priority_lists(queue_name: str, steps: Iterable[int]) -> list[str]:
    """The Redis lists kombu keeps for ``queue_name``: the queue itself for priority 0, ``queue:N`` for the others."""
    return [queue_name if p == 0 else f"{queue_name}{PRIORITY_SEP}{p}" for p in steps]


def answer(job_id: str) -> str:
    return f"{_ANSWER}{job_id}"


def rate(subject: str) -> str:
    """The sliding log of requests of ``subject`` ("key.<id>", "tenant.<id>", "client.<address>")."""
    return f"{_RATE}{subject}"


def streams(key_id: str) -> str:
    """The open streams of the API key ``key_id`` (a sorted set: stream -> when it lapses)."""
    return f"{_STREAMS}{key_id}"


@dataclass(frozen=True)
class FairKeys:
    """The fair-share keys of one lane; a tenant's and an ingest's own sets are their prefix + the tenant id
    (+ ``.`` + the ingest id), which the scripts append."""

    tenants: str
    gone: str
    state: str
    weights: str
    tenant_prefix: str
    ingest_prefix: str


def fair(lane: str) -> FairKeys:
    base = f"{_FAIR}{lane}"
    return FairKeys(base, f"{base}.gone", f"{base}.state", f"{base}.weights", f"{base}.tenant.", f"{base}.ingest.")
