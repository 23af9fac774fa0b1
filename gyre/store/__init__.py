"""The shared store: Redis behind small interfaces (keys, atomic counters, a reliable work queue).

Every key lives under `gyre:<run>:`; keys that one Lua script touches share a hash tag, so the
schema works on Redis Cluster. Works on Redis 6.2 and 7.x.
"""

from gyre.store.connection import connect_redis
from gyre.store.counters import CounterInvariantError, Counters, CounterValues
from gyre.store.keys import Keys
from gyre.store.records import ExecutionRecord, GroupRecord, Records
from gyre.store.workqueue import Claim, WorkQueue

__all__ = [
    "Claim",
    "CounterInvariantError",
    "CounterValues",
    "Counters",
    "ExecutionRecord",
    "GroupRecord",
    "Keys",
    "Records",
    "WorkQueue",
    "connect_redis",
]
