"""Served graph nodes: stopped when their run is cancelled, and bounded in how many work at once.

The LangGraph server runs a graph with ``astream`` and cancels a run by cancelling that task.
A plain (sync) node runs in an executor thread that the cancellation never reaches: its work,
a smoke run included, would go on, and the server would start the next run beside it. Here a
node runs in a thread of its own (``cancellable``); when its task is cancelled, the smoke runs
that thread supervises are told to stop (their process groups are killed), and
``NodeCancelled`` is raised in the thread at its next bytecode, so an LLM request or a tool
ends too. A node holds one of ``Slots`` while its thread works, and gives it back only when the
thread has ended, so work that outlives its run still counts; a node that finds no slot free
waits for one and says so in the run's stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import threading
from collections.abc import Callable
from typing import Any

# How long a cancelled node waits for its thread to end before it lets the run go (the slot
# stays taken until the thread does end): a smoke run's groups get SIGTERM, then SIGKILL 1 s on.
STOP_WAIT_S = 15.0
SLOT_POLL_S = 0.1


class NodeCancelled(KeyboardInterrupt):
    """Raised in a node's thread when its run is cancelled (stops like Ctrl-C does)."""


class Slots:
    """At most ``limit`` node threads at work at once in this process; the rest wait.

    The event loop's side never blocks on a lock (the dev server raises on blocking calls in
    the loop): it only tries to take one.
    """

    def __init__(self, limit: int) -> None:
        """``limit`` slots (at least 1)."""
        self.limit = max(1, int(limit))
        self._used = 0
        self._lock = threading.Lock()

    @property
    def in_use(self) -> int:
        """How many slots are taken now."""
        return self._used

    def _try_take(self) -> bool:
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._used >= self.limit:
                return False
            self._used += 1
            return True
        finally:
            self._lock.release()

    async def take(self, on_wait: Callable[[], None]) -> None:
        """Take a slot, waiting (polling, so the event loop runs on) until one is free."""
        if self._try_take():
            return
        on_wait()
        while not self._try_take():
            await asyncio.sleep(SLOT_POLL_S)

    def give_back(self) -> None:
        """Free a slot taken with ``take``."""
        with self._lock:
            self._used -= 1


class _Work:
    """One node call in its own thread; its outcome lands in an asyncio future."""

    def __init__(self, name: str, node: Callable[[Any], Any], state: Any, slots: Slots) -> None:
        self._loop = asyncio.get_running_loop()
        self.outcome: asyncio.Future[Any] = self._loop.create_future()
        self._slots = slots
        self._lock = threading.Lock()
        self._in_node = False
        context = contextvars.copy_context()  # the run's config: stream writer, interrupt()
        self.thread = threading.Thread(
            target=self._main, args=(context, node, state), name=f"served-{name}", daemon=True
        )

    def _main(self, context: contextvars.Context, node: Callable[[Any], Any], state: Any) -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            try:
                with self._lock:
                    self._in_node = True
                result = context.run(node, state)
            except BaseException as exc:  # noqa: BLE001 - handed to the node's task
                error = exc
            with self._lock:
                self._in_node = False
        except NodeCancelled as exc:  # the stop came just as the node ended
            error = error or exc
        finally:
            self._slots.give_back()
        with contextlib.suppress(RuntimeError):  # the server's loop is already closed
            self._loop.call_soon_threadsafe(self._settle, result, error)

    def _settle(self, result: Any, error: BaseException | None) -> None:
        if self.outcome.done():
            return
        if error is not None:
            self.outcome.set_exception(error)
        else:
            self.outcome.set_result(result)

    async def stop(self) -> None:
        """Stop the thread's smoke runs and raise NodeCancelled in it; wait a while for its end."""
        from tools.smoke import stop_runs_in_thread

        ident = self.thread.ident
        if ident is None:
            return
        await asyncio.to_thread(stop_runs_in_thread, ident)
        while not self._lock.acquire(blocking=False):  # never block the event loop
            await asyncio.sleep(0.01)
        try:
            if self._in_node:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(ident), ctypes.py_object(NodeCancelled)
                )
        finally:
            self._lock.release()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self.outcome), STOP_WAIT_S)


def cancellable(name: str, node: Callable[[Any], Any], slots: Slots) -> Any:
    """``node`` as a graph node that stops when its run is cancelled and waits for a slot.

    The returned runnable keeps ``node`` as its sync form (``invoke``, ``stream``); under
    ``astream`` (the server) it is the async form above.
    """
    from langchain_core.runnables import RunnableLambda
    from langgraph.config import get_stream_writer

    async def served(state: Any) -> Any:
        def waiting() -> None:
            with contextlib.suppress(RuntimeError):  # not streamed
                get_stream_writer()(
                    {
                        "agent": name,
                        "kind": "waiting",
                        "text": f"waiting for a free slot: at most {slots.limit} served run(s) "
                        "work at once (TRAINWRIGHT_SERVE_MAX_ACTIVE)",
                    }
                )

        await slots.take(waiting)
        try:
            work = _Work(name, node, state, slots)
            work.thread.start()
        except BaseException:
            slots.give_back()
            raise
        try:
            return await asyncio.shield(work.outcome)
        except asyncio.CancelledError:
            await work.stop()
            raise

    return RunnableLambda(node, afunc=served, name=name)
