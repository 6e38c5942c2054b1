"""A reward server in flow_grpo's protocol (pickled JPEGs and prompts in, scores out),
here a local test server on 127.0.0.1: scores come back in order, a slow server times
out, a failing one is named, a hostile answer cannot run code, and the trainer trains on
its scores (reward.name=http://...)."""

import io
import os
import pickle
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

from rlpost.diffusion.reward_server import RemoteReward, loads_answer


class _Evil:
    def __reduce__(self):
        return (os.getcwd, ())


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        from PIL import Image

        body = pickle.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/slow":
            time.sleep(3)
        if self.path == "/boom":
            text = b"Traceback (most recent call last):\nValueError: no OCR model loaded"
            self.send_response(500)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
            return
        brightness = [
            float(np.asarray(Image.open(io.BytesIO(b))).mean() / 255) for b in body["images"]
        ]
        answer = {"scores": np.array(brightness), "prompts_seen": body["prompts"]}
        if self.path == "/evil":
            answer = {"scores": _Evil()}
        data = pickle.dumps(answer)
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_scores_come_back_per_image_in_order(server):
    images = torch.stack([torch.full((1, 8, 8), v) for v in (0.1, 0.9, 0.5)])
    scores = RemoteReward(server + "/")(images, [1, 2, 3])
    assert scores.shape == (3,) and scores.dtype == torch.float32
    assert torch.allclose(scores, torch.tensor([0.1, 0.9, 0.5]), atol=0.01)  # JPEG-exact enough


def test_a_slow_failing_or_hostile_server_is_named_and_runs_nothing(server):
    images = torch.rand(2, 3, 8, 8)
    with pytest.raises(TimeoutError, match=r"no answer within reward.timeout_s=1 s"):
        RemoteReward(server + "/slow", timeout_s=1.0)(images, ["a", "b"])
    with pytest.raises(RuntimeError, match=r"HTTP 500: ValueError: no OCR model loaded"):
        RemoteReward(server + "/boom")(images, ["a", "b"])
    with pytest.raises(pickle.UnpicklingError, match=r"pickled posix.getcwd: refused"):
        RemoteReward(server + "/evil")(images, ["a", "b"])
    with pytest.raises(ValueError, match=r"no 'reward' in its answer"):
        RemoteReward(server + "/", key="reward")(images, ["a", "b"])
    with pytest.raises(ConnectionError, match=r"reward server http://127\.0\.0\.1:9/"):
        RemoteReward("http://127.0.0.1:9/", timeout_s=2)(images, ["a", "b"])
    assert loads_answer(pickle.dumps({"scores": [1.0, np.float32(2)]}))["scores"][1] == 2.0


def test_the_trainer_trains_on_a_servers_scores(server, tmp_path):
    from rlpost.diffusion.config import load_config
    from rlpost.diffusion.trainer import Trainer

    cfg = load_config(None, [
        "model.name=digits-random", f"reward.name={server}/", "reward.timeout_s=20",
        "prompts.prompts=[1, 2]", "prompts.per_step=2", "prompts.group_size=2",
        "sampler.steps=2", "sampler.eval_steps=2", "train.steps=1", "run.eval_every=0",
        "run.save_every=0", "run.progress=false", "run.tensorboard=false", f"run.dir={tmp_path}",
    ])  # fmt: skip
    rows = Trainer(cfg, metrics={}).train()
    assert rows[-1]["step"] == 1 and 0.0 < rows[-1]["reward/mean"] < 1.0
