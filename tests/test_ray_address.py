"""A Ray address is checked before ``ray.init`` joins it: seconds and one line, not minutes of
connection warnings (no Ray needed)."""

from __future__ import annotations

import socket

import pytest

from distilembed.errors import UserError
from distilembed.ray_address import host_port, require_reachable


def test_addresses_parse_or_say_what_they_should_be() -> None:
    assert host_port("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert host_port("ray://head.example:10001") == ("head.example", 10001)
    assert host_port("auto") is None and host_port("local") is None
    for bad in ("head", "head:port", ":6379", "ray://head"):
        with pytest.raises(UserError, match="is not host:port, ray://host:port, auto or local"):
            host_port(bad)


def test_a_listening_address_passes_and_a_closed_one_is_a_one_line_error() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        require_reachable(f"127.0.0.1:{listening.getsockname()[1]}")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: the connect is refused
        with pytest.raises(UserError, match=f"cannot reach the Ray cluster at 127.0.0.1:{port}") as caught:
            require_reachable(f"127.0.0.1:{port}")
    assert "\n" not in str(caught.value)
    require_reachable("auto")  # Ray resolves these itself


def test_the_service_settings_check_the_address_form() -> None:
    from pydantic import ValidationError

    from service.settings import Settings

    assert Settings(bundle="b", ray_address="ray://head:10001").ray_address == "ray://head:10001"
    assert Settings(bundle="b", ray_address="").ray_address is None  # an empty env var: unset
    with pytest.raises(ValidationError, match="is not host:port"):
        Settings(bundle="b", ray_address="head")
