"""A tuning sweep spread over the GPUs of one machine: one worker process per GPU.

Items (one per registry key) wait in one queue, longest first as the caller orders them;
each worker is a spawned process pinned to its GPU (started with ``CUDA_VISIBLE_DEVICES`` set
to it, so neither torch nor Helion's own benchmarking subprocesses see another), takes the next
item, runs ``job(payload)`` and reports its result (a :class:`~.tuning.TuneResult`: any object
with ``key``, ``status`` and ``message``; ``failed(key, message)`` builds one for an item whose
job raised or whose worker died). The parent shows one
progress display for the whole sweep. Every worker writes the same registry files, which
:func:`~.registry.save_entry` serialises with a file lock and replaces atomically, so a
finished item is saved whatever happens to the others; a rerun skips what is saved.

A worker that crashes (a segfault, an out-of-memory kill) loses only the item it was on: the
item is reported failed and a fresh worker takes the GPU's place (at most
``MAX_RESTARTS`` times per GPU, so a worker that cannot even start does not loop).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue
import time
import traceback
from typing import Any, Callable

MAX_RESTARTS = 3
_POLL_SECONDS = 0.5
# How a sweep prints each result's status (rich markup); the statuses of tuning.TuneResult.
STATUS_STYLES = {"tuned": "green", "skipped": "dim", "not started": "yellow", "failed": "red"}


def result_line(result) -> str:
    """One finished key as a sweep prints it (rich markup): status, key, message."""
    return f"[{STATUS_STYLES[result.status]}]{result.status:11}[/] {result.key}  {result.message}"


@dataclasses.dataclass(frozen=True)
class Item:
    """One unit of a sweep: its registry ``key``, a ``label`` for the display, and the
    picklable ``payload`` the job receives."""

    key: Any
    label: str
    payload: Any


def error_text(err: BaseException) -> str:
    """One line for a failed item: the exception and, when its message says nothing (a bare
    ``assert``), the file and line that raised it."""
    if str(err):
        return f"{type(err).__name__}: {err}"
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return type(err).__name__
    last = frames[-1]
    return f"{type(err).__name__} at {'/'.join(last.filename.split('/')[-3:])}:{last.lineno} ({last.line})"


def _worker(slot: int, job: Callable, failed: Callable, tasks, results, current) -> None:
    """Run ``job`` on queued items until the queue is empty (on the GPU the process was
    started pinned to). ``current[slot]`` holds the index of the item in progress (-1: none),
    written before the job starts, so the parent knows what a crash lost even if no message
    got out."""
    while True:
        try:
            index, item = tasks.get(timeout=_POLL_SECONDS * 4)
        except queue.Empty:
            return
        current[slot] = index
        results.put(("start", slot, index, None))
        t0 = time.perf_counter()
        try:
            result = job(item.payload)
        except Exception as err:  # the job's own failure: report it, take the next item
            traceback.print_exc()  # to the worker's stderr: where it failed
            result = failed(item.key, f"{error_text(err)} (after {time.perf_counter() - t0:.0f} s)")
        results.put(("done", slot, index, result))
        current[slot] = -1


def run_parallel(title: str, items: list[Item], job: Callable, failed: Callable, gpus: list[str],
                 console=None) -> list:
    """Run ``job(item.payload)`` for every item on worker processes, one per entry of
    ``gpus`` (CUDA device indices as strings), in the order given; return the results in that
    order. ``job`` and ``failed`` (``(key, message) -> result``) must be module-level
    functions: they are pickled to spawned processes.

    Raises:
        ValueError: no GPUs given.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not gpus:
        raise ValueError("run_parallel needs at least one GPU")
    ctx = multiprocessing.get_context("spawn")
    # Results go through a SimpleQueue, whose put writes to the pipe before returning: a worker
    # that crashes right after reporting an item cannot take the report down with it.
    tasks, results = ctx.Queue(), ctx.SimpleQueue()
    for index, item in enumerate(items):
        tasks.put((index, item))
    current = ctx.Array("i", [-1] * len(gpus))
    restarts = [0] * len(gpus)

    def start(slot: int):
        proc = ctx.Process(target=_worker, args=(slot, job, failed, tasks, results, current),
                           name=f"tune-gpu{gpus[slot]}", daemon=True)
        # The spawned process inherits this environment: pinned before it imports anything
        # (torch fixes the visible devices the first time anything asks CUDA about them).
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[slot]
        try:
            proc.start()
        finally:
            if saved is None:
                del os.environ["CUDA_VISIBLE_DEVICES"]
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
        return proc

    workers = [start(slot) for slot in range(len(gpus))]
    done: dict[int, Any] = {}
    running: dict[int, int] = {}  # slot -> item index
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console or Console(stderr=True)) as progress:
        task = progress.add_task(title, total=len(items))

        def finish(index: int, result) -> None:
            if index in done:  # a crash already counted it
                return
            done[index] = result
            progress.console.print(result_line(result))
            progress.advance(task)

        def describe() -> None:
            now = "; ".join(f"gpu {gpus[s]}: {items[i].label}" for s, i in sorted(running.items()))
            progress.update(task, description=f"{title} [{len(gpus)} GPUs] {now}")

        while len(done) < len(items):
            kind = None
            if not results.empty():
                kind, slot, index, result = results.get()
            if kind == "start":
                running[slot] = index
                describe()
            elif kind == "done":
                running.pop(slot, None)
                finish(index, result)
                describe()
            if kind is not None:
                continue
            time.sleep(_POLL_SECONDS / 5)
            for slot, proc in enumerate(workers):
                if proc.is_alive():
                    continue
                lost = current[slot]
                if lost >= 0 and lost not in done:  # it died on this item
                    running.pop(slot, None)
                    current[slot] = -1
                    finish(lost, failed(items[lost].key,
                                        f"the worker on GPU {gpus[slot]} died (exit code {proc.exitcode})"))
                    describe()
                crashed = proc.exitcode != 0
                if crashed and len(done) < len(items) and restarts[slot] < MAX_RESTARTS:
                    restarts[slot] += 1
                    workers[slot] = start(slot)
            if all(not p.is_alive() for p in workers) and results.empty() and len(done) < len(items):
                time.sleep(_POLL_SECONDS)  # let a last message through
                if results.empty():
                    for index, item in enumerate(items):  # no worker left to take them
                        if index not in done:
                            finish(index, failed(item.key, "no worker left (every restart crashed)"))
    for proc in workers:
        proc.join(timeout=5)
    return [done[i] for i in range(len(items))]


def parse_gpus(value: str, available: int) -> list[str]:
    """``--gpus`` as the devices the workers pin (``CUDA_VISIBLE_DEVICES`` entries): ``"all"``
    or a count N, the first N of this process's visible devices.

    Raises:
        ValueError: not "all" or a positive integer, or more GPUs than ``available``.
    """
    if value == "all":
        count = available
    else:
        try:
            count = int(value)
        except ValueError:
            raise ValueError(f"--gpus must be a positive integer or 'all', got {value!r}") from None
        if count < 1:
            raise ValueError(f"--gpus must be a positive integer or 'all', got {value!r}")
    if count > available or count == 0:
        raise ValueError(f"--gpus {value}: this machine has {available} CUDA GPU(s)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(available)]
    return names[:count]
