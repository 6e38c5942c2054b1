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


def _ink_by_prompt(images, prompts):
    """A deterministic reward that reads both inputs: mean ink times the prompt's digit."""
    return images.mean((1, 2, 3)) * torch.tensor([float(p) for p in prompts])


def _broken(images, prompts):
    raise KeyError("no such detector")


@pytest.fixture
def served():
    from rlpost.diffusion.reward_server import serve_reward

    started = []

    def start(fn):
        httpd = serve_reward(fn, port=0)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/"

    yield start
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def test_serve_reward_answers_our_client_with_the_rewards_scores(served):
    """``rlpost-diffusion reward-server``'s server: the scores of the reward it serves, on
    the images as the JPEGs decode (grey and colour), in order."""
    from rlpost.diffusion.reward_server import decode_images, jpeg_bytes

    url = served(_ink_by_prompt)
    for channels in (1, 3):
        images = torch.rand(3, channels, 8, 8)
        scores = RemoteReward(url)(images, ["1", "2", "3"])
        seen = decode_images([jpeg_bytes(im) for im in images])
        assert seen.shape == images.shape
        assert torch.allclose(scores, _ink_by_prompt(seen, ["1", "2", "3"]), atol=1e-6)


def test_a_failing_reward_or_a_hostile_request_is_a_500_naming_it(served):
    url = served(_broken)
    with pytest.raises(RuntimeError, match=r"HTTP 500: KeyError: 'no such detector'"):
        RemoteReward(url)(torch.rand(2, 1, 8, 8), ["1", "2"])
    import urllib.error
    import urllib.request

    ok = served(_ink_by_prompt)
    req = urllib.request.Request(ok, data=pickle.dumps({"images": _Evil(), "prompts": []}))
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert "pickled posix.getcwd: refused" in err.value.read().decode()


def test_the_reward_server_command_refuses_a_bad_port_in_one_line(capsys):
    from rlpost.apps.diffusion.cli import main

    assert main(["reward-server", "--reward", "hackable", "--port", "99999"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "reward-server: cannot listen on 127.0.0.1:99999" in err[0]
