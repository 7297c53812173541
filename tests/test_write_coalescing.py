import asyncio
import socket
from collections.abc import Awaitable, Callable

import httpx
import uvicorn

from service.connections import CoalescingHttpToolsProtocol, CoalescingTransport


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_writes_of_one_callback_leave_as_one_send() -> None:
    async def scenario() -> RecordingTransport:
        inner = RecordingTransport()
        transport = CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"body")
        assert inner.writes == []  # held until the callback ends
        await asyncio.sleep(0)  # yields one loop iteration, where the flush runs
        assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
        transport.write(b"tail")
        transport.close()  # close sends what is held first
        assert inner.writes[-1] == b"tail" and inner.closed
        assert transport.get_extra_info("peername") == "info:peername"
        return inner

    assert len(asyncio.run(scenario()).writes) == 2


async def _app(scope: dict, receive: object, send: Callable[[dict], Awaitable[None]]) -> None:
    if scope["type"] != "http":
        return
    body = b"x" * (100_000 if scope["path"] == "/big" else 5)
    headers = [(b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def test_real_server_with_coalescing_protocol_answers_keep_alive_requests() -> None:
    async def scenario() -> list[int]:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)  # connections wait in the backlog until the server accepts them
        port = sock.getsockname()[1]
        config = uvicorn.Config(_app, http=CoalescingHttpToolsProtocol, lifespan="off", log_level="warning")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            sizes = [len((await client.get(path)).content) for path in ("/", "/big", "/", "/big")]
        server.should_exit = True
        await task
        return sizes

    assert asyncio.run(scenario()) == [5, 100_000, 5, 100_000]
