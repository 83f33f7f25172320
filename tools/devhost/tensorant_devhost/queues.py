"""Queue triggers: poll Azure Storage queues with host.json semantics.

batchSize messages per poll, and a new batch once no more than newBatchThreshold are in flight:
at most batchSize + newBatchThreshold messages of one queue function at once, their invocations
run by the worker's one pool that HTTP and timers share (worker.py), as on Azure. base64
message encoding; a message is kept invisible by a 10-minute lease renewed at half while its
function runs (QueueListener's), deleted on success, released for visibilityTimeout on failure
(a functionTimeout, or the worker restarting under it, is a failure) and moved (its original
text) to `<queue>-poison` once dequeueCount reaches maxDequeueCount. A message that is not
base64 is moved there at once, raw, without running anything (the Storage SDK cannot decode it;
the extension poisons it). Idle pollers back off up to maxPollingInterval; notify() wakes them
at once. Tests use pump() / drain() instead of the pollers.
"""

from __future__ import annotations

import base64
import binascii
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from tensorant_devhost.functions import FunctionInfo
from tensorant_devhost.invocation import Invoker
from tensorant_devhost.logger import log

MIN_POLL_S = 0.1


class _Lease:
    """Keeps a message invisible while its function runs: renews its visibility lease at half of it,
    as QueueListener does (update_message hands back a new pop receipt each time), until end()."""

    def __init__(self, client: Any, msg: Any, lease_s: int) -> None:
        self.client, self.msg, self.lease_s = client, msg, lease_s
        self.receipt = msg.pop_receipt
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._renew, name=f"lease-{msg.id}", daemon=True)
        self.thread.start()

    def _renew(self) -> None:
        while not self.done.wait(self.lease_s / 2):
            try:
                updated = self.client.update_message(self.msg.id, self.receipt, visibility_timeout=self.lease_s)
                self.receipt = updated.pop_receipt
            except Exception as exc:  # the message reappears after its lease: a second delivery, which steps allow
                log.error("queue: could not renew the lease of message %s: %s", self.msg.id, exc)
                return

    def end(self) -> str:
        self.done.set()
        self.thread.join()
        return str(self.receipt)


class QueueTriggers(Invoker):
    _pools: list[ThreadPoolExecutor]  # the pollers' worker pools, shut down by stop()

    def _receive(self, f: FunctionInfo, count: int) -> list[Any]:
        client = self._queue_client(f.connection, f.queue_name)
        pages = client.receive_messages(messages_per_page=count, max_messages=count,
                                        visibility_timeout=self.config.processing_lease_s)
        return list(pages)

    def _process(self, f: FunctionInfo, msg: Any, release_failed: bool = True) -> tuple[str, Any]:
        """Run one message; delete on success, poison or release on failure. Returns (outcome, msg),
        outcome one of "done", "poisoned", "failed" (released, or left for the caller to release)."""
        from azure.functions.queue import QueueMessage

        client = self._queue_client(f.connection, f.queue_name)
        max_count = self.config.max_dequeue_count
        if msg.dequeue_count > max_count:
            # Received more often than allowed without a recorded failure (a crash mid-run): poison it now.
            return self._poison_now(f, msg, "dequeue count over maxDequeueCount before processing")
        try:
            body = self._decode(msg.content)
        except ValueError as exc:
            # Poisoned at once, as the text it is: no retry can decode it (the extension's
            # MessageDecodingFailed handler does the same).
            return self._poison_now(f, msg, str(exc))
        ok = False
        lease = _Lease(client, msg, self.config.processing_lease_s)
        try:
            qm = QueueMessage(id=msg.id, body=body, dequeue_count=msg.dequeue_count, pop_receipt=msg.pop_receipt,
                              insertion_time=msg.inserted_on, expiration_time=msg.expires_on,
                              time_next_visible=msg.next_visible_on)
            self.invoke(f, qm, f"queue={f.queue_name} id={msg.id} dequeueCount={msg.dequeue_count}")
            ok = True
        except Exception as exc:
            if not getattr(exc, "_devhost_logged", False):
                log.error("queue %s: message %s failed before its function ran: %s", f.queue_name, msg.id, exc)
        finally:
            msg.pop_receipt = lease.end()  # the receipt of the last renewal settles the message
        try:
            if ok:
                client.delete_message(msg.id, msg.pop_receipt)
            elif msg.dequeue_count >= max_count:
                self._poison(f, msg, f"failed {msg.dequeue_count} times (maxDequeueCount={max_count})")
            elif release_failed:
                self.release(f, msg)
        except Exception as exc:  # the message reappears after its lease; the host keeps going
            log.error("queue %s: could not settle message %s: %s", f.queue_name, msg.id, exc)
            return "failed", msg
        return ("done" if ok else "poisoned" if msg.dequeue_count >= max_count else "failed"), msg

    def _poison_now(self, f: FunctionInfo, msg: Any, why: str) -> tuple[str, Any]:
        try:
            self._poison(f, msg, why)
        except Exception as exc:  # it reappears after its lease and is poisoned then
            log.error("queue %s: could not move message %s to %s-poison: %s", f.queue_name, msg.id, f.queue_name, exc)
            return "failed", msg
        return "poisoned", msg

    def release(self, f: FunctionInfo, msg: Any) -> None:
        """Make a failed message visible again after visibilityTimeout."""
        client = self._queue_client(f.connection, f.queue_name)
        client.update_message(msg.id, msg.pop_receipt, visibility_timeout=int(self.config.visibility_timeout_s))

    def _poison(self, f: FunctionInfo, msg: Any, why: str) -> None:
        poison = self._queue_client(f.connection, f"{f.queue_name}-poison")
        poison.send_message(msg.content)  # the original text as it was (still encoded, or raw)
        self._queue_client(f.connection, f.queue_name).delete_message(msg.id, msg.pop_receipt)
        log.warning("queue %s: message %s moved to %s-poison (%s)", f.queue_name, msg.id, f.queue_name, why)

    def _decode(self, content: str | bytes) -> bytes:
        raw = content.encode() if isinstance(content, str) else content
        if self.config.message_encoding != "base64":
            return raw
        try:
            return base64.b64decode(raw, validate=True)
        except binascii.Error as exc:
            raise ValueError("message decoding failed: the text is not base64 (host.json messageEncoding "
                             "is base64; send with shared.queues)") from exc

    def _listen(self, f: FunctionInfo) -> None:
        # The host's side of each message in flight (lease, settling) waits here; the function itself
        # runs on the worker's shared pool.
        pool = ThreadPoolExecutor(max_workers=self.config.batch_size + self.config.new_batch_threshold,
                                  thread_name_prefix=f"devhost-{f.queue_name}")
        self._pools.append(pool)
        in_flight: set[Any] = set()
        lock = threading.Lock()
        delay = MIN_POLL_S
        last_error = ""
        wake = self._wake[f.queue_name]

        def done(fut: Any) -> None:
            with lock:
                in_flight.discard(fut)

        while not self._stop.is_set():
            with lock:
                busy = len(in_flight)
            if busy > self.config.new_batch_threshold:
                self._stop.wait(0.05)
                continue
            try:
                msgs = self._receive(f, self.config.batch_size)
                last_error = ""
            except Exception as exc:
                if str(exc) != last_error:  # say it once, not on every poll
                    log.error("queue %s: receive failed (retrying): %s", f.queue_name, exc)
                last_error = str(exc)
                msgs = []
                delay = self.config.max_polling_interval_s
            for m in msgs:
                fut = pool.submit(self._process, f, m)
                with lock:
                    in_flight.add(fut)
                fut.add_done_callback(done)
            if msgs:
                delay = MIN_POLL_S
                if len(msgs) == self.config.batch_size:
                    continue  # probably more waiting: poll again at once
            else:
                delay = min(delay * 2, self.config.max_polling_interval_s)
            if wake.wait(delay):  # notify(): a message was sent here, poll at once
                wake.clear()
                delay = MIN_POLL_S

    def pump(self, max_messages: int = 1000) -> int:
        """Process the messages now visible on every queue trigger, each at most once; return the count.

        Batches of batchSize run concurrently, like the pollers. Failed messages are released only
        when the pump is done, so a message that fails is not received twice by one pump.
        """
        count = 0
        with ThreadPoolExecutor(max_workers=self.config.batch_size) as pool:
            for f in self.by_kind("queue"):
                failed: list[Any] = []
                while count < max_messages:
                    msgs = self._receive(f, min(self.config.batch_size, max_messages - count))
                    if not msgs:
                        break
                    futures = [pool.submit(self._process, f, m, False) for m in msgs]
                    wait(futures)
                    count += len(msgs)
                    for fut in futures:
                        outcome, msg = fut.result()
                        if outcome == "failed":
                            failed.append(msg)
                for msg in failed:
                    try:
                        self.release(f, msg)
                    except Exception as exc:
                        log.error("queue %s: could not release message %s: %s", f.queue_name, msg.id, exc)
        return count

    def drain(self, max_rounds: int = 50) -> int:
        """Pump until a round finds nothing (follows chains of queue messages); return the total."""
        total = 0
        for _ in range(max_rounds):
            n = self.pump()
            total += n
            if n == 0:
                break
        return total
