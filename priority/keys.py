"""Every Redis key, list and channel paperlane reads or writes, named here and nowhere else.

One style: ``paperlane.<what>`` and, for keys per thing, ``paperlane.<what>.<id>``. Two kinds of names are
kombu's, not ours, and only named here because paperlane reads them: the ``:<priority>`` suffix of a queue's
priority lists (kombu's Redis transport keeps one list per queue and priority, ``sep`` ``:``) and the hash of
messages delivered but not yet acknowledged (``UNACKED``).

    paperlane.<lane>[:<priority>]     a lane's queue: the Celery messages of its pages, one list per priority
    unacked                            kombu: delivery tag -> [message, exchange, routing key]
    paperlane.delayed                  pages due later (sorted set by due time)        priority.delayed
    paperlane.delayed.releasing        ... claimed, being put back on their lane
    paperlane.delayed (channel)        "a page was delayed": wakes every worker's retry clock
    paperlane.dead-letter              messages no worker could take (list, newest first)   priority.deadletter
    paperlane.answer.<job>             an engine's answer, kept an hour                   workers.answers
    paperlane.rate.<subject>           the API's requests in the last minute, per key, tenant and (failed
                                       authentications) client address: a sliding log   producer.api.limits
    paperlane.streams.<key>            a key's open event streams and long polls, each until it expires
"""

from __future__ import annotations

from collections.abc import Iterable

PRIORITY_SEP = ":"  # kombu's separator between a queue's name and a priority
UNACKED = "unacked"  # kombu's Redis transport: messages delivered and not yet acknowledged

DELAYED = "paperlane.delayed"
RELEASING = "paperlane.delayed.releasing"
DELAYED_CHANNEL = "paperlane.delayed"
DEAD_LETTERS = "paperlane.dead-letter"
_ANSWER = "paperlane.answer."
_RATE = "paperlane.rate."
_STREAMS = "paperlane.streams."
_QUEUE = "paperlane."


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
