"""A Redis client whose every key lives under one prefix: several paperlanes (or tests) on one Redis.

``redis.key_prefix`` (settings) puts all of one deployment's keys under a prefix: paperlane's own (``priority.keys``)
through the client made here, and Celery's and kombu's through kombu's ``global_keyprefix`` transport option
(``priority.broker``). Pub/sub channels carry it too. The names in ``priority.keys`` stay unprefixed; the client
adds the prefix to each key argument of a command on the way out and strips it from keys in replies (BRPOP) and
from channels of messages, so code and scripts are the same with or without one. Key names a Lua script builds
itself from an ARGV prefix (``priority.fair``, ``priority.presence``) take ``prefix_of(client)`` in front.

A command whose key arguments the table below does not know is refused (``UnknownCommand``), never sent
unprefixed: a key outside the prefix would be seen by every other deployment on the same Redis.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.client import Pipeline, PubSub

# Commands whose first argument is their only key (KEYS: its pattern; the keys it returns lose the prefix).
_FIRST = frozenset("""
    KEYS GET SET SETEX PSETEX SETNX GETDEL GETEX INCR INCRBY INCRBYFLOAT DECR DECRBY APPEND STRLEN
    EXPIRE PEXPIRE EXPIREAT PEXPIREAT PERSIST TTL PTTL TYPE PUBLISH
    HGET HSET HSETNX HMSET HMGET HDEL HLEN HGETALL HKEYS HVALS HEXISTS HINCRBY HINCRBYFLOAT HSCAN
    LPUSH RPUSH LPUSHX RPUSHX LPOP RPOP LRANGE LTRIM LLEN LREM LINDEX LSET LPOS
    SADD SREM SMEMBERS SISMEMBER SMISMEMBER SCARD SPOP SSCAN
    ZADD ZREM ZCARD ZRANGE ZRANGEBYSCORE ZREVRANGE ZREVRANGEBYSCORE ZREMRANGEBYSCORE ZREMRANGEBYRANK ZSCORE
    ZMSCORE ZINCRBY ZCOUNT ZRANK ZREVRANK ZPOPMIN ZPOPMAX ZSCAN
""".split())
# Commands whose arguments are all keys (the blocking pops: all but the last, the timeout).
_ALL = frozenset("DEL UNLINK EXISTS TOUCH WATCH MGET".split())
_BLOCKING = frozenset(("BRPOP", "BLPOP"))
_SCRIPTS = frozenset(("EVAL", "EVALSHA"))
# Commands that name no key.
_KEYLESS = frozenset(("PING", "ECHO", "INFO", "TIME", "MULTI", "EXEC", "DISCARD", "UNWATCH", "SCRIPT LOAD",
                      "SCRIPT EXISTS", "CLIENT SETNAME", "CLIENT SETINFO", "SELECT", "AUTH", "HELLO", "QUIT",
                      "RESET"))
_CHANNELS = frozenset(("SUBSCRIBE", "UNSUBSCRIBE", "PSUBSCRIBE", "PUNSUBSCRIBE"))


class UnknownCommand(redis.RedisError):
    """A command the prefixed client cannot place under its prefix (a bug in paperlane: add it to the table)."""


def prefix_of(client: Any) -> str:
    """The key prefix ``client`` puts in front of every key ("" for a plain client)."""
    return str(getattr(client, "key_prefix", ""))


def prefixed_args(prefix: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` (a command and its arguments) with every key argument under ``prefix``."""
    name = str(args[0]).upper()
    rest = list(args[1:])
    if name in _FIRST:
        rest[0] = _key(prefix, rest[0])
    elif name in _ALL:
        rest = [_key(prefix, k) for k in rest]
    elif name in _BLOCKING:
        rest = [*(_key(prefix, k) for k in rest[:-1]), rest[-1]]
    elif name in _SCRIPTS:
        n = int(rest[1])
        rest = [rest[0], rest[1], *(_key(prefix, k) for k in rest[2:2 + n]), *rest[2 + n:]]
    elif name not in _KEYLESS:
        raise UnknownCommand(f"{name}: not known to the key-prefixed Redis client (priority.keyspace)")
    return (args[0], *rest)


def _key(prefix: str, key: Any) -> bytes | str:
    return prefix.encode() + key if isinstance(key, bytes) else f"{prefix}{key}"


def _unprefixed(prefix: str, key: Any) -> Any:
    if isinstance(key, bytes) and key.startswith(prefix.encode()):
        return key[len(prefix):]
    if isinstance(key, str) and key.startswith(prefix):
        return key[len(prefix):]
    return key


class _Prefixing(redis.Redis):
    """The prefixing of commands and replies, shared by the client and its pipelines (a Pipeline is a Redis)."""

    key_prefix = ""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        return super().execute_command(*prefixed_args(self.key_prefix, args), **options)

    def parse_response(self, connection: Any, command_name: str | bytes, **options: Any) -> Any:
        response = super().parse_response(connection, command_name, **options)
        if command_name in _BLOCKING and response:
            key, value = response
            return _unprefixed(self.key_prefix, key), value
        if command_name == "KEYS":
            return [_unprefixed(self.key_prefix, key) for key in response]
        return response


class KeyPrefixedRedis(_Prefixing):
    """``redis.Redis`` with every key under ``key_prefix``; its pipelines and pub/sub alike."""

    def __init__(self, *args: Any, key_prefix: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_prefix = key_prefix

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        pipe = _PrefixedPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.key_prefix = self.key_prefix
        return pipe

    def pubsub(self, **kwargs: Any) -> PubSub:
        return _PrefixedPubSub(self.connection_pool, key_prefix=self.key_prefix, **kwargs)


class _PrefixedPipeline(_Prefixing, Pipeline):
    pass


class _PrefixedPubSub(PubSub):
    def __init__(self, *args: Any, key_prefix: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_prefix = key_prefix

    def execute_command(self, *args: Any) -> None:
        if str(args[0]).upper() in _CHANNELS:
            args = (args[0], *(_key(self.key_prefix, c) for c in args[1:]))
        super().execute_command(*args)

    def parse_response(self, block: bool = True, timeout: float = 0) -> Any:
        response = super().parse_response(block=block, timeout=timeout)
        if isinstance(response, list) and len(response) >= 3:  # [kind, (pattern,) channel, data]
            return [response[0], *(_unprefixed(self.key_prefix, c) for c in response[1:-1]), response[-1]]
        return response


def with_prefix(client: redis.Redis, prefix: str) -> redis.Redis:
    """``client`` itself when ``prefix`` is empty, else a prefixed client on its connection pool (closing it
    closes the pool if closing ``client`` would have)."""
    if not prefix:
        return client
    prefixed = KeyPrefixedRedis(connection_pool=client.connection_pool, key_prefix=prefix)
    # The pool passes to the new client: the old one, dropped, would close it when collected.
    prefixed.auto_close_connection_pool, client.auto_close_connection_pool = client.auto_close_connection_pool, False
    return prefixed
