"""JSON-RPC hardening on top of pygls: every request gets an answer, nothing pops up.

pygls drops some bad messages silently (the client waits forever for its answer), raises
out of its JSON decoding on others, and shows the user an "Error in server" message for
each. :class:`StrictProtocol` answers them the way JSON-RPC 2.0 and LSP say instead:

- not a message object (null, a number, an array: LSP has no batches), a wrong
  ``jsonrpc``, a method or id or params of the wrong type: ``InvalidRequest``;
- a request with params that do not fit the method: pygls's ``InvalidParams`` reply;
- a request before ``initialize``: ``ServerNotInitialized``; after ``shutdown``:
  ``InvalidRequest``;
- a stray or malformed response, or a notification with bad params: logged and ignored.

Unparsable JSON surfaces in the server's error hook (``report_server_error``), which
answers ``ParseError`` through :meth:`StrictProtocol.send_error`.
"""

from __future__ import annotations

import logging
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.protocol import LanguageServerProtocol

log = logging.getLogger(__name__)


class _Answered:
    """Stands in for a message that was already answered with an error: pygls skips it."""

    jsonrpc = "answered"


def valid_id(msg_id: Any) -> bool:
    """Whether ``msg_id`` is a usable JSON-RPC id (an integer or a string, not a bool)."""
    return isinstance(msg_id, int | str) and not isinstance(msg_id, bool)


def _invalid_message(data: dict[str, Any]) -> str | None:
    """Why ``data`` is not a valid JSON-RPC 2.0 message ("response": a stray or malformed
    response, which gets no reply); None if it is valid."""
    if data.get("jsonrpc") != "2.0":
        return "jsonrpc must be \"2.0\""
    if "method" in data:
        if not isinstance(data["method"], str):
            return "method must be a string"
        if "id" in data and not valid_id(data["id"]):
            return "id must be an integer or a string"
        if "params" in data and not isinstance(data["params"], dict | list | type(None)):
            return "params must be an object or an array"
        return None
    if "id" in data and ("result" in data or "error" in data):
        return None
    return "response" if "result" in data or "error" in data else "no method"


class StrictProtocol(LanguageServerProtocol):
    """A pygls LSP protocol that answers malformed and untimely requests with errors."""

    def handle_message(self, message: Any) -> None:
        """Requests before ``initialize`` get the spec's ServerNotInitialized, and requests
        after ``shutdown`` InvalidRequest: pygls would drop them silently and leave the
        client waiting."""
        if not hasattr(message, "jsonrpc"):
            # Valid JSON but no message object: null, a number, an array (LSP has no
            # batches), an object without "jsonrpc".
            msg_id = message.get("id") if isinstance(message, dict) else None
            self._invalid_request(msg_id, "not a JSON-RPC 2.0 message object")
            return
        method = getattr(message, "method", None)
        msg_id = getattr(message, "id", None)
        is_request = method is not None and msg_id is not None and hasattr(message, "params")
        if (self._workspace is None and is_request
                and method not in (types.INITIALIZE, types.EXIT)):
            self.send_error(msg_id, types.ErrorCodes.ServerNotInitialized,
                            "server not initialized")
            return
        if self._shutdown and is_request and method != types.EXIT:
            self.send_error(msg_id, types.ErrorCodes.InvalidRequest, "server is shutting down")
            return
        super().handle_message(message)

    def structure_message(self, data: dict[str, Any]) -> Any:
        """Deserialize a message; a request with invalid params gets an error reply.

        pygls raises out of its JSON decoding here, which leaves the request unanswered
        (the client waits forever) and pops an "Error in server" message at the user.
        """
        # json.loads calls this for every object, innermost first; only a message object
        # carries "jsonrpc" (parameters never do).
        if "jsonrpc" in data:
            problem = _invalid_message(data)
            if problem is not None:
                msg_id = data.get("id")
                if problem == "response":
                    log.warning("unexpected response (id %r) ignored", msg_id)
                else:
                    self._invalid_request(msg_id, problem)
                return _Answered()
            if "method" in data and "params" not in data:
                data = {**data, "params": None}  # optional in JSON-RPC
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if "id" in data and "method" in data:
                log.warning("invalid params for %s (id %r)", data.get("method"), data["id"])
                self._send_response(data["id"], error=exc.to_response_error())
            else:
                log.warning("invalid notification %s ignored", data.get("method"))
            return _Answered()

    def send_error(self, msg_id: Any, code: types.ErrorCodes | types.LSPErrorCodes,
                   message: str) -> None:
        """A JSON-RPC error reply; an id that is not usable becomes null."""
        self._send_data({"jsonrpc": "2.0", "id": msg_id if valid_id(msg_id) else None,
                         "error": {"code": int(code), "message": message}})

    def _invalid_request(self, msg_id: Any, why: str) -> None:
        log.warning("invalid request: %s", why)
        self.send_error(msg_id, types.ErrorCodes.InvalidRequest, f"Invalid Request: {why}")
