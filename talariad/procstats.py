"""What a long-running process holds (memory, descriptors, tasks, tracked objects): the figures
that stay flat in a daemon that ages well. Read on demand; `gc_objects` walks the heap."""

from __future__ import annotations

import asyncio
import gc
import os

import psutil


def process_stats() -> dict[str, int]:
    proc = psutil.Process(os.getpid())
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:  # no running loop in this thread
        tasks = 0
    return {
        "pid": proc.pid,
        "rss_bytes": proc.memory_info().rss,
        "open_files": proc.num_fds(),
        "asyncio_tasks": tasks,
        "gc_objects": len(gc.get_objects()),
    }
