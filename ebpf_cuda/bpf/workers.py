"""Worker threads for jobs that wait in the kernel without the GIL: program loads (the
verifier) and link closes (uprobe synchronisation). concurrent.futures would do, but its
import (logging) alone costs ~14 ms of start-up."""
import os
import queue
import threading
from typing import Callable, Optional, Sequence


class Job:
    """One call handed to `Workers`; `result()` waits for it and raises what it raised."""

    def __init__(self, function: Callable, argument: object) -> None:
        self.function, self.argument = function, argument
        self.done = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self.function(self.argument)
        except BaseException as err:  # handed to the waiter
            self.error = err
        finally:
            self.done.set()

    def result(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error


class Workers:
    """Threads taking jobs from one queue; leaving the `with` block waits for them."""

    def __init__(self, count: int) -> None:
        self._jobs = queue.SimpleQueue()  # of Job, and None to stop a thread
        self._threads = [threading.Thread(target=self._work, daemon=True)
                         for _ in range(max(1, count))]
        for thread in self._threads:
            thread.start()

    def submit(self, function: Callable, argument: object) -> Job:
        job = Job(function, argument)
        self._jobs.put(job)
        return job

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job.run()

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()


def close_all(objects: Sequence) -> None:
    """Close these (links, perf events) in parallel: each close of a probe waits for the
    kernel's synchronisation (tens of milliseconds), so one at a time, 80 take seconds."""
    if len(objects) < 2:
        for item in objects:
            item.close()
        return
    with Workers(min(len(objects), 64)) as pool:
        for job in [pool.submit(type(item).close, item) for item in objects]:
            job.result()


def forked_closer() -> Optional[int]:
    """Fork a child that keeps the kernel objects alive until it closes them (the parent's
    closes then only drop its references: fast), its standard streams on /dev/null so that
    nobody waits for its output. In the child: 0, once the parent has closed the returned
    pipe end (or exited). In the parent: that pipe end. None when no child could be made."""
    try:
        done, go = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(done)
        os.close(go)
        return None
    if pid != 0:
        os.close(done)
        return go
    try:
        os.close(go)
        while os.read(done, 1):  # (EOF: the parent has let go)
            pass
        os.close(done)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    except OSError:
        pass
    return 0
