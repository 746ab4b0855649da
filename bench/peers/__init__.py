"""One module per job queue compared by ``bench/peers.py``.

Each ``*_peer`` module holds that queue's benchmark tasks (imported by its worker process) and
a ``Peer`` adapter (used by the benchmark process to enqueue and to start the worker).
``probe`` is what every job calls to record its start and completion; ``common`` holds the
rest they share: the Redis database, the worker processes and the producer loops.
"""
