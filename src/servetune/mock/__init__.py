"""Mock OpenAI-compatible server (fault injection, client-ceiling yardstick).

    from servetune.mock import MockConfig, mock_in_thread
    with mock_in_thread(MockConfig(faults={"http_500": 0.1})) as srv:
        url = f"http://127.0.0.1:{srv.port}"

`servetune mock-server` runs it standalone (`serve_forever`).
"""

from servetune.mock.server import FAULTS, MockConfig, MockServer, mock_in_thread, serve_forever

__all__ = ["FAULTS", "MockConfig", "MockServer", "mock_in_thread", "serve_forever"]
