"""A real headless Chromium, driven over the DevTools protocol (a websocket, with aiohttp).

Debian's ``chromium`` is started with its own profile folder and a debugging port it
picks itself (read back from ``DevToolsActivePort``); one page is opened. What the page
writes to its console at level error, and every uncaught exception, is kept in
``errors``. The process is stopped by its pid.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str | None:
    return next((found for name in CHROMIUM if (found := shutil.which(name))), None)


class Browser:
    def __init__(self, workdir: Path, width: int = 1280, height: int = 900) -> None:
        self.workdir = Path(workdir)
        self.size = (width, height)
        self.process: subprocess.Popen[bytes] | None = None
        self.session: aiohttp.ClientSession | None = None
        self.socket: aiohttp.ClientWebSocketResponse | None = None
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.errors: list[str] = []
        self.reader: asyncio.Task[None] | None = None

    async def start(self) -> Browser:
        binary = chromium()
        assert binary is not None
        profile = self.workdir / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "chromium.log", "ab")  # noqa: SIM115 - the child's
        self.process = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # as root in a container
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={self.size[0]},{self.size[1]}",
                "about:blank",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        port_file = profile / "DevToolsActivePort"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None or loop.time() > deadline:
                raise RuntimeError(
                    "chromium did not start: "
                    + (self.workdir / "chromium.log").read_text(errors="replace")[-2000:]
                )
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as answer:
            targets = await answer.json()
        page = next(t for t in targets if t.get("type") == "page")
        self.socket = await self.session.ws_connect(
            page["webSocketDebuggerUrl"],
            max_msg_size=0,
            timeout=aiohttp.ClientWSTimeout(ws_close=5),
        )
        self.reader = asyncio.get_running_loop().create_task(self._read())
        await self.send("Runtime.enable")
        await self.send("Log.enable")
        await self.send("Page.enable")
        return self

    async def _read(self) -> None:
        assert self.socket is not None
        async for message in self.socket:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            if "id" in data:
                future = self.waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            self._event(data.get("method", ""), data.get("params", {}))

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            texts = [str(a.get("value", a.get("description", ""))) for a in params.get("args", [])]
            self.errors.append("console.error: " + " ".join(texts))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")

    async def send(self, method: str, params: dict[str, Any] | None = None) -> Any:
        assert self.socket is not None
        number = next(self.ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[number] = future
        await self.socket.send_str(
            json.dumps({"id": number, "method": method, "params": params or {}})
        )
        answer = await asyncio.wait_for(future, 30)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    async def navigate(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    async def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        """Until ``expression`` is truthy in the page, at most ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with contextlib.suppress(RuntimeError):
                value = await self.evaluate(expression)
                if value:
                    return value
            if loop.time() >= deadline:
                raise TimeoutError(f"not true in the page after {timeout} s: {what}")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> None:
        result = await self.send("Page.captureScreenshot", {"format": "png"})
        Path(path).write_bytes(base64.b64decode(result["data"]))

    async def stop(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
        if self.socket is not None:
            with contextlib.suppress(Exception):
                await self.socket.close()
        if self.session is not None:
            await self.session.close()
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
