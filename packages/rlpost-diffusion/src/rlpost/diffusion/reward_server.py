"""Rewards from a reward server over HTTP, in flow_grpo's scorer protocol.

Reward models often need their own environment (PaddleOCR, GenEval's detectors, a VLM
judge); flow_grpo and ddpo-pytorch run them as small HTTP servers. ``reward.name`` set to
a server's address (``http://127.0.0.1:18085``) makes the trainer call it: one ``POST /``
per batch whose body is a pickled dict, ``{"images": [JPEG bytes, ...], "prompts": [...],
"queries": [[prompt], ...], **reward.server_fields}``, answered by a pickled dict holding
the scores under ``reward.server_key`` (``"scores"``), one per image; an error is HTTP
500 with the server's traceback as text.

The answer is unpickled by a restricted unpickler that builds only numbers, strings,
bytes, lists, tuples, dicts and numpy arrays: a server cannot make the trainer run code.
A call that takes longer than ``reward.timeout_s`` fails (the batch's rewards are then
missing and the step is skipped, as for any failed reward).
"""

from __future__ import annotations

import io
import pickle
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

#: what an answer may contain: (module, name) pairs beyond the pickle protocol's own types
_ALLOWED = {
    ("builtins", "dict"), ("builtins", "list"), ("builtins", "tuple"), ("builtins", "set"),
    ("builtins", "frozenset"), ("builtins", "float"), ("builtins", "int"), ("builtins", "str"),
    ("builtins", "bytes"), ("builtins", "bool"), ("builtins", "complex"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
}  # fmt: skip


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(
                f"the reward server's answer holds a pickled {module}.{name}: refused (only "
                "numbers, strings, lists, dicts and numpy arrays are accepted)"
            )
        return super().find_class(module, name)


def loads_answer(data: bytes) -> Any:
    """A server's pickled answer, unpickled without building anything that can run code."""
    return _Restricted(io.BytesIO(data)).load()


def jpeg_bytes(image: Tensor, quality: int = 95) -> bytes:
    """One ``[C, H, W]`` image in ``[0, 1]`` as JPEG (grey for one channel)."""
    from PIL import Image

    arr = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    arr = arr[0].numpy() if arr.shape[0] == 1 else arr.permute(1, 2, 0).numpy()
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


class RemoteReward:
    """A reward ``(images, prompts) -> [B]`` computed by the server at ``url``."""

    def __init__(self, url: str, timeout_s: float = 30.0, key: str = "scores",
                 fields: dict[str, Any] | None = None):  # fmt: skip
        self.url, self.timeout_s, self.key = url, float(timeout_s), key
        self.fields = dict(fields or {})
        self.__name__ = f"server {url}"

    def __call__(self, images: Tensor, prompts: Sequence[Any]) -> Tensor:
        texts = [str(p) for p in prompts]
        body = pickle.dumps({
            "images": [jpeg_bytes(im) for im in images], "prompts": texts,
            "queries": [[t] for t in texts], **self.fields,
        })  # fmt: skip
        req = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/octet-stream"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                data = resp.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace").strip().splitlines()
            raise RuntimeError(
                f"reward server {self.url}: HTTP {exc.code}: {text[-1] if text else exc.reason}"
            ) from None
        except (TimeoutError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)  # (a URLError wraps the socket's error)
            if isinstance(reason, TimeoutError):
                raise TimeoutError(
                    f"reward server {self.url}: no answer within reward.timeout_s="
                    f"{self.timeout_s:g} s"
                ) from None
            raise ConnectionError(f"reward server {self.url}: {reason}") from None
        answer = loads_answer(data)
        if not isinstance(answer, dict) or self.key not in answer:
            keys = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
            raise ValueError(
                f"reward server {self.url}: no {self.key!r} in its answer ({keys}); set "
                "reward.server_key"
            )
        scores = torch.as_tensor(answer[self.key], dtype=torch.float32).reshape(-1)
        if len(scores) != len(images):
            raise ValueError(
                f"reward server {self.url}: {len(scores)} scores for {len(images)} images"
            )
        return scores.to(images.device)


def decode_images(blobs: Sequence[bytes]) -> Tensor:
    """JPEG (or PNG) images as ``[B, C, H, W]`` in ``[0, 1]`` (one channel for grey)."""
    import numpy as np
    from PIL import Image

    arrays = [np.asarray(Image.open(io.BytesIO(b))) for b in blobs]
    images = [torch.from_numpy(a.copy()).float().div(255) for a in arrays]
    return torch.stack([x[None] if x.ndim == 2 else x.permute(2, 0, 1) for x in images])


def serve_reward(reward: Any, host: str = "127.0.0.1", port: int = 18085) -> Any:
    """An HTTP server in flow_grpo's protocol (the module docstring) scoring with
    ``reward(images [B, C, H, W] in [0, 1], prompts) -> [B]``: any of our rewards, or a
    user's. Returns the ``ThreadingHTTPServer`` (``serve_forever()`` to run it,
    ``server_address`` for the port when ``port=0``). Requests are unpickled with the same
    restricted unpickler as answers; an error answers HTTP 500 with its last line."""
    import traceback
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import numpy as np

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # one line per batch is noise
            pass

        def _answer(self, code: int, data: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            try:
                body = loads_answer(self.rfile.read(int(self.headers["Content-Length"])))
                images = decode_images(body["images"])
                with torch.no_grad():
                    scores = reward(images, list(body["prompts"]))
                scores = torch.as_tensor(scores, dtype=torch.float32).reshape(-1)
                answer = {"scores": np.asarray(scores.cpu().numpy(), dtype=np.float32)}
                self._answer(200, pickle.dumps(answer))
            except Exception:
                self._answer(500, traceback.format_exc().encode())

    return ThreadingHTTPServer((host, port), Handler)
