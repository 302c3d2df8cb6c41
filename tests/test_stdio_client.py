"""The stdio reference client (examples/stdio-client/client.py) refuses a forced token it cannot
force instead of recording a stand-in (hostile probe 2, L9: forced -1 was recorded as 0 and a
forced 99999999 ran, both answered "ran"). Runs in the mlx-lm oracle's venv, where the client's
imports (mlx, mlx_lm) are."""

from __future__ import annotations

import subprocess

import pytest

from harness.oracle.venvs import ensure_oracle_env
from harness.paths import REPO_ROOT

PROBE = """
import importlib.util, sys
import mlx.core as mx
spec = importlib.util.spec_from_file_location("client", sys.argv[1])
client = importlib.util.module_from_spec(spec)
spec.loader.exec_module(client)
processor = client.force([int(sys.argv[2])])
try:
    out = processor(None, mx.zeros((1, 10)))
    print("forced", int(mx.argmax(out, axis=-1).item()))
except client.Refused as e:
    print("refused", e)
"""


@pytest.mark.parametrize(
    ("token", "answer"),
    [
        ("3", "forced 3"),
        ("-1", "refused forced token -1 at step 0: expected an id in [0, 10)"),
        ("10", "refused forced token 10 at step 0: expected an id in [0, 10)"),
        ("99999999", "refused forced token 99999999 at step 0"),
    ],
)
def test_a_forced_token_outside_the_vocabulary_is_refused_not_replaced(token: str, answer: str) -> None:
    env = ensure_oracle_env("mlx-lm")
    command, environment = env.command("-c", PROBE, str(REPO_ROOT / "examples" / "stdio-client" / "client.py"), token)
    out = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(answer)
