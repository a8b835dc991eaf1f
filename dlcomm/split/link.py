"""The edge <-> cloud link: protocol messages over the transport's point-to-point messages.

``SplitLink`` duplicates the communicator dlcomm runs on (so its tags never meet anyone
else's messages) and wraps it in the transport's ``CountingCommunicator`` with a counter of
its own: ``bytes_sent`` is what this rank put across the split, counted at the transport.
Per kind of message it also keeps the bytes sent and received (``sent_by_kind``,
``received_by_kind``), which the tests compare with the transport's count.

Sends return at once: a sender thread posts the two non-blocking sends of each message, in
order, and polls them to completion, so a large activation keeps moving (Open MPI moves a
message past its eager size only while some thread is in MPI) while the training thread
computes the next micro-batch. Receives wait by polling (``dlcomm.comm.polling``), leaving the
core to computation. Without ``MPI_THREAD_MULTIPLE`` the sends progress on the calling thread
instead, whenever the link is used.
"""
from __future__ import annotations

import collections
import queue
import threading
from typing import Any

import numpy as np

from dlcomm.comm.counting import ByteCounter, CountingCommunicator
from dlcomm.comm.polling import wait_polling
from dlcomm.errors import DLCommError
from dlcomm.split.protocol import HEADER_WORDS, Kind, Message, pack, read_header, tags, unpack


class LinkError(DLCommError):
    """The link failed (a send failed, or a message came that the protocol did not expect)."""


class SplitLink:
    """Protocol messages between this rank and its peers over ``comm`` (a transport
    communicator; construction is collective over it, as it duplicates it)."""

    def __init__(self, comm: Any, threaded: bool = True) -> None:
        self.counter = ByteCounter()
        self.comm = CountingCommunicator(comm.dup(), self.counter)
        self.rank = self.comm.rank
        self.sent_by_kind: collections.Counter[str] = collections.Counter()
        self.received_by_kind: collections.Counter[str] = collections.Counter()
        self.messages_sent = 0
        self._error: BaseException | None = None
        self._pending: list[Any] = []  # unthreaded: sends still in flight (with buffers)
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        if threaded:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._send_loop, name="dlcomm-split-link",
                                            daemon=True)
            self._thread.start()

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank sent across the split, as the transport counted them."""
        return self.counter.total

    # --- sending -------------------------------------------------------------------------
    def send(self, peer: int, message: Message) -> None:
        """Queue ``message`` for ``peer``; messages to a peer leave in the order queued."""
        self._raise_failure()
        header, body = pack(message)
        self.sent_by_kind[message.kind.name] += header.nbytes + body.nbytes
        self.messages_sent += 1
        if self._queue is not None:
            self._queue.put((peer, message.kind, message.micro, header, body))
        else:
            self._post(peer, message.kind, message.micro, header, body)
            self._progress()

    def _post(self, peer: int, kind: Kind, micro: int, header: np.ndarray,
              body: np.ndarray) -> list[Any]:
        header_tag, body_tag = tags(kind, micro)
        requests = [self.comm.isend(header, peer, header_tag),
                    self.comm.isend(body, peer, body_tag)]
        self._pending.append((requests, header, body))
        return requests

    def _send_loop(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    requests = self._post(*item)
                    wait_polling(lambda reqs=requests: self.comm.test_all(reqs))
                    self._pending.clear()
            except BaseException as exc:  # reported to the training thread
                self._error = exc
            finally:
                self._queue.task_done()

    def _progress(self) -> None:
        if self._pending and self.comm.test_all([r for reqs, *_ in self._pending
                                                 for r in reqs]):
            self._pending.clear()

    def flush(self) -> None:
        """Return once every message queued so far has left (completed its sends)."""
        if self._queue is not None:
            self._queue.join()
        else:
            while self._pending:
                wait_polling(lambda: self.comm.test_all([r for reqs, *_ in self._pending
                                                         for r in reqs]))
                self._pending.clear()
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise LinkError(f"sending across the split failed: {self._error}") from self._error

    # --- receiving -----------------------------------------------------------------------
    def recv(self, peer: int, kind: Kind | tuple[Kind, ...], micro: int = 0) -> Message:
        """Wait for the next message of ``kind`` (or of one of several kinds that share their
        tags, such as ACTIVATION and CLOSE) and micro-batch ``micro`` from ``peer``."""
        self._raise_failure()
        kinds = kind if isinstance(kind, tuple) else (kind,)
        header_tag, body_tag = tags(kinds[0], micro)
        if any(tags(k, micro) != (header_tag, body_tag) for k in kinds):
            raise ValueError(f"kinds {[k.name for k in kinds]} do not share their tags")
        header = np.empty(HEADER_WORDS, dtype=np.int64)
        self._wait(self.comm.irecv(header, peer, header_tag))
        got_kind, _, got_micro, _, _, _, n_body = read_header(header)
        if got_kind not in kinds or got_micro != micro:
            raise LinkError(f"rank {self.rank} expected {'/'.join(k.name for k in kinds)} "
                            f"micro-batch {micro} from rank {peer}, got {got_kind.name} "
                            f"micro-batch {got_micro}")
        body = np.empty(n_body, dtype=np.uint8)
        self._wait(self.comm.irecv(body, peer, body_tag))
        self.received_by_kind[got_kind.name] += header.nbytes + body.nbytes
        return unpack(header, body)

    def _wait(self, request: Any) -> None:
        if self._queue is None:
            def test() -> bool:
                self._progress()
                return request.test()
            wait_polling(test)
        else:
            wait_polling(request.test)
        self._raise_failure()

    # --- closing -------------------------------------------------------------------------
    def close(self) -> None:
        """Finish queued sends, stop the sender thread and free the communicator
        (collective over the ranks that built the link)."""
        try:
            self.flush()
        finally:
            if self._queue is not None and self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._queue = None
            self.comm.free()
