"""Dispatch (docs/architecture.md): how due notifications are claimed, delivered and finished.

* ``claim``: which rows are due, and claiming them under a lease (``FOR UPDATE SKIP LOCKED``).
* ``runner``: the dispatch pass — claims batches and delivers them on a thread pool.
* ``finish``: recording each attempt's result with a conditional update.
* ``wait``: the one worker that waits for the next due time.

The arrows point one way: ``wait`` → ``runner`` → ``claim`` and ``finish``.
"""
