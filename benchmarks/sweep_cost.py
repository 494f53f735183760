"""What one lost-message sweep costs Redis with a large backlog: the presence check against today's whole read.

A private Redis holds --pages real-shaped page messages (one real message published through paperlane's transport,
the rest made like it with job ids of their own) on the batch lane's list, each marked present as the transport marks
them with fair share off, --in-flight messages un-acked by workers, and --lost pages whose message and marker are
gone (a write lost at a failover). One sweep then asks about --check pages (``worker.lost_check_pages``: the lost
ones among them):

- ``presence``: ``priority.presence.missing`` (one SMISMEMBER per 10,000 pages) and, for the pages with no marker,
  ``in_flight`` (the un-acked messages delivered in the last lost_after seconds): what ``workers.leases`` runs (with
  fair share on it also reads the lanes' buffers, ``in_buffers``: a few messages per lane, not measured here, where
  the lane's list is the whole backlog).
- ``today``: main's ``jobs_in_redis`` at a0249ec (kept below as it was), which reads every queue, fair-share set,
  un-acked message and delayed page in one script; with its shipped limit (5,000 messages) it reads nothing past it
  and finds no lost page, so it is measured with the limit lifted too.

Figures per sweep: Redis commands (INFO commandstats, the scripts' inner calls included), bytes Redis sent, seconds,
and the lost pages found. The messages wait on the lane's list, not in the fair-share sets (a million pipelined
LPUSHes instead of a million scripts): today's read costs the same per message on either. The database side of a
sweep (one SELECT of at most --check queued rows) is not measured here.

    .venv/bin/python benchmarks/sweep_cost.py --pages 1000000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from paperlane.priority import fair, keys, presence  # noqa: E402
from paperlane.priority.broker import make_celery, send_page  # noqa: E402
from paperlane.priority.fair import FairLanes  # noqa: E402
from paperlane.priority.lanes import Lane, broker_keys  # noqa: E402
from paperlane.priority.messages import BadMessage, PageMessage, page_job_id  # noqa: E402
from paperlane.settings import RedisSettings, Settings  # noqa: E402
from tests import services  # noqa: E402
from tests.sentinels import message_like  # noqa: E402

# main at a0249ec, priority/presence.py: the whole read, as it was.
_SNAPSHOT = fair.WAITING_LUA + """
local lanes = #KEYS - 4
local queued = {}
for k = 2, #ARGV - 2 * lanes do
  for _, m in ipairs(redis.call('LRANGE', ARGV[k], 0, -1)) do queued[#queued + 1] = m end
end
for l = 1, lanes do
  waiting(KEYS[4 + l], ARGV[#ARGV - 2 * lanes + 2 * l - 1], ARGV[#ARGV - 2 * lanes + 2 * l], queued)
end
local unacked = {}
for _, tag in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], '+inf')) do
  local value = redis.call('HGET', KEYS[1], tag)
  if value then unacked[#unacked + 1] = value end
end
return {queued, unacked, redis.call('ZRANGE', KEYS[3], 0, -1), redis.call('ZRANGE', KEYS[4], 0, -1)}
"""


def today(client: redis.Redis, *, limit: int, unacked_since: float = 0.0) -> set[str] | None:
    """main's ``jobs_in_redis``: ids of the jobs with a message in Redis, or None past ``limit`` messages."""
    lists = [key for lane in Lane for key in broker_keys(lane)]
    with client.pipeline(transaction=False) as pipe:
        for key in lists:
            pipe.llen(key)
        pipe.hlen(keys.UNACKED)
        pipe.zcard(keys.DELAYED)
        pipe.zcard(keys.RELEASING)
        for lane in Lane:
            fair.held(pipe, lane)
        sizes = pipe.execute()
    if sum(fair.count(n) for n in sizes) > limit:
        return None
    structures = [fair.structure_keys(lane) for lane in Lane]
    queued, unacked, delayed, releasing = client.eval(  # type: ignore[misc]
        _SNAPSHOT, 4 + len(structures), keys.UNACKED, keys.UNACKED_INDEX, keys.DELAYED, keys.RELEASING,
        *(s[0] for s in structures), repr(unacked_since), *lists, *(prefix for s in structures for prefix in s[1:]))
    found: set[str] = set()
    for raw in [*queued, *(json.dumps(json.loads(v)[0]).encode() for v in unacked)]:
        try:
            found.add(page_job_id(raw))
        except BadMessage:
            pass
    found.update(PageMessage.parse(m).job_id for m in (*delayed, *releasing))
    return found


def measure(client: redis.Redis, action: Callable[[], Any]) -> dict[str, Any]:
    def reading() -> tuple[int, int]:
        calls = sum(int(v["calls"]) for v in client.info("commandstats").values())
        return calls, int(client.info("stats")["total_net_output_bytes"])
    calls, sent = reading()
    start = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - start
    calls_after, sent_after = reading()
    return {"commands": calls_after - calls - 2, "bytes": sent_after - sent, "seconds": round(seconds, 3),
            "result": result}


def fill(client: redis.Redis, template: bytes, ids: list[str], in_flight: list[str]) -> None:
    """The backlog on the batch lane's list, each page marked present; ``in_flight`` un-acked by workers."""
    queue = broker_keys(Lane.BATCH)[0]
    for start in range(0, len(ids), 10_000):
        chunk = ids[start:start + 10_000]
        with client.pipeline(transaction=False) as pipe:
            pipe.lpush(queue, *(message_like(template, job_id) for job_id in chunk))
            pipe.sadd(keys.PRESENT, *chunk)
            pipe.execute()
    now = time.time()
    for job_id in in_flight:
        raw = json.loads(message_like(template, job_id))
        client.hset(keys.UNACKED, f"tag-{job_id}", json.dumps([raw, "", Lane.BATCH.queue]))
        client.zadd(keys.UNACKED_INDEX, {f"tag-{job_id}": now})


def template_message(url: str) -> bytes:
    """One page message as paperlane's transport stores it."""
    send_page(make_celery(Settings(redis=RedisSettings(url=url))), "template-job", Lane.BATCH, 5)
    client = redis.Redis.from_url(url)
    lists = [m for key in broker_keys(Lane.BATCH) for m in client.lrange(key, 0, -1)]
    [raw] = lists + FairLanes(client).waiting(Lane.BATCH)
    client.flushall()
    return raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=1_000_000, help="pages waiting")
    ap.add_argument("--check", type=int, default=10_000, help="pages one sweep asks about (lost_check_pages)")
    ap.add_argument("--lost", type=int, default=100, help="of those, pages whose message and marker are gone")
    ap.add_argument("--in-flight", type=int, default=512, help="messages un-acked by workers")
    args = ap.parse_args()
    svc = services.start_redis(Path(tempfile.mkdtemp(prefix="sweep-cost-")))
    try:
        client = redis.Redis.from_url(svc.url, socket_timeout=900)  # the whole read of a million messages is slow
        template = template_message(svc.url)
        ids = [f"page-{i:09d}" for i in range(args.pages)]
        in_flight = [f"running-{i:06d}" for i in range(args.in_flight)]
        started = time.perf_counter()
        fill(client, template, ids, in_flight)
        print(f"filled: {args.pages} pages ({client.info('memory')['used_memory_human']}) in "
              f"{time.perf_counter() - started:.0f}s, {args.in_flight} in flight", flush=True)
        rng = random.Random(7)
        lost = [f"lost-{i:06d}" for i in range(args.lost)]
        asked = rng.sample(ids, args.check - args.lost) + lost

        markers = measure(client, lambda: presence.missing(client, asked))
        running = measure(client, lambda: presence.in_flight(client, since=time.time() - 120))
        rows = {"presence: markers": markers, "presence: in flight": running,
                "today (limit 5,000)": measure(client, lambda: today(client, limit=5000)),
                "today (whole read)": measure(client, lambda: today(client, limit=10**12))}
        found_now = set(markers["result"]) - running["result"]
        for name, row in rows.items():
            result = row.pop("result")
            found = (len(found_now & set(lost)) if name.startswith("presence")
                     else 0 if result is None else len(set(lost) - result))
            print(f"{name:>20}: {row['commands']:>8} commands {row['bytes']:>14,} bytes {row['seconds']:>8.3f}s "
                  f"lost found {found}/{len(lost)}", flush=True)
        ratio = rows["today (whole read)"]["bytes"] / (markers["bytes"] + running["bytes"])
        print(f"bytes_read_today_over_presence={ratio:.0f}")
    finally:
        svc.stop()


if __name__ == "__main__":
    main()
