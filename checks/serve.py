"""The page served in this process with a model already loaded, for checks and tests that call its HTTP API."""
from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def served_app(bundle) -> Iterator[str]:
    """The page served in-process on a free local port with `bundle` as its first preset's model; yields its URL."""
    import app
    from app_parts.presets import CACHE, load_presets

    CACHE.put(next(iter(load_presets())), bundle)  # the caller's model, loaded once, on its own device
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = app.build_demo()
    demo.queue().launch(prevent_thread_lock=True, server_port=port, quiet=True, **app.launch_options())
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()
