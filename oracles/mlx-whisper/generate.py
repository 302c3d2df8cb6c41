"""mlx-whisper oracle generator: runs inside the oracle's own venv, never imports the harness.

Reads a scenario spec (JSON), runs `mlx_whisper.transcribe` on each scenario's WAV file exactly
as a user would (the package's own loader, seek loop, temperature fallback and decoding), and
records what the in-tree port must reproduce. Nothing in the installed package is edited: the
captures wrap a few of its functions at run time, and put the originals back afterwards.

Per scenario it writes
  <id>.mel.npy      the whole clip's log-mel spectrogram as transcribe computes it
                    (frames incl. the 30 s of zero padding, n_mels) f32
  <id>.encoder.npy  the encoder output of every decode call (n_calls, n_audio_ctx, n_audio_state)
  <id>.logits.npy   every decoder step's logits before the logit filters, (rows, n_vocab) f32:
                    decode calls in order, within a call step-major, then batch member
and in result.json `scenarios[id]`: the token chosen after each logits row, one entry per
decode call (each window and each temperature attempt: where its rows start, its steps, batch,
initial tokens, per-member tokens, scores and the fallback decision), and the transcript.

mlx-whisper's decode loop computes one step ahead of what it has checked (it starts step i+1
before it reads whether step i completed the batch); the logits of that discarded look-ahead
step are not part of the output, and each decode call says whether it had one.

Usage: python -I generate.py --job JOB.json --out DIR

The spec check (`validate_spec`) uses the standard library only, so it can be imported and
tested without the oracle venv; mlx and mlx_whisper are imported inside the functions that run.
What both whisper generators share is in oracles/common (whisper_spec.py, whisper_capture.py,
whisper_run.py, oracle_base.py), loaded by file path: here is what is mlx-whisper's own.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from pathlib import Path

# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402
import whisper_capture as capture_base  # noqa: E402
import whisper_run as common  # noqa: E402
import whisper_spec as spec_check  # noqa: E402

SpecError = spec_check.SpecError

# Keyword arguments of mlx_whisper.transcribe (0.4.3) a scenario may set, besides the
# DecodingOptions fields it passes on (whisper_spec.DECODING_OPTIONS).
TRANSCRIBE_OPTIONS = spec_check.TRANSCRIBE_OPTIONS
# Set by the generator itself: the model directory, and no printing.
RESERVED_OPTIONS = frozenset({"path_or_hf_repo", "verbose", "audio", "prompt"})
RULES = spec_check.Rules(
    "mlx_whisper.transcribe",
    TRANSCRIBE_OPTIONS,
    RESERVED_OPTIONS,
    spec_check.BOOL_OPTIONS,
    ("weights.safetensors", "weights.npz"),
)


def validate_spec(spec) -> None:
    """Raise SpecError naming every problem of the spec, before anything is loaded or run."""
    RULES.validate(spec)


# ---------------------------------------------------------------- capture


class Capture(capture_base.CaptureState):
    """What one transcription computed, recorded by wrappers around mlx-whisper's functions.

    The logits rows are kept lazy: evaluated after the decode call, so the capture never changes
    its schedule. The decode loop runs one step ahead: when it stops on a completed batch, the
    last step it computed is unused (`lookahead`)."""

    package = "mlx_whisper"

    def install(self):
        import mlx_whisper  # noqa: F401  (registers the submodules)

        return common.patched(self.patches())

    def pcm(self, path):
        # A machine without the ffmpeg CLI (the lent GPU machine has no package index): the WAV's
        # 16-bit PCM / 32768, which is what ffmpeg gives for these clips (checked on every CPU
        # golden: audio.decoded_equals_wav_pcm). Recorded in the environment block, so such
        # goldens say how their audio was read.
        import mlx.core as mx

        return mx.array(common.wav_pcm(path))

    def f32(self, array):
        import mlx.core as mx
        import numpy as np

        return np.array(array.astype(mx.float32))

    def waveform_array(self, waveform):
        import numpy as np

        return np.array(waveform)

    def steps(self, index, call):
        import mlx.core as mx
        import numpy as np

        loop_tokens = np.array(call["loop_tokens"][0])  # (batch, sample_begin + n_steps) before finalize
        batch, begin = loop_tokens.shape[0], call["sample_begin"]
        n_steps = loop_tokens.shape[1] - begin
        steps_computed = len(call["rows"])
        lookahead = steps_computed - n_steps
        if lookahead not in (0, 1) or len(call["chosen"]) != steps_computed:
            raise common.CaptureError(
                f"decode call {index}: {steps_computed} logits calls and {len(call['chosen'])} token "
                f"updates for {n_steps} kept steps"
            )
        step_logits = [self.f32(r) for r in call["rows"][:n_steps]]
        chosen = np.array(mx.stack(call["chosen"][:n_steps], axis=0)) if n_steps else np.zeros((0, batch), int)
        if chosen.shape != (n_steps, batch) or not np.array_equal(chosen.T, loop_tokens[:, begin:]):
            raise common.CaptureError(
                f"decode call {index}: the tokens the decoder chose differ from the loop's tokens"
            )
        # Per member, the sampled tokens (cut at the first EOT, as the task cuts them).
        members = [[int(t) for t in row[begin:]] for row in loop_tokens]
        return batch, n_steps, lookahead, step_logits, chosen, members


def run_scenario(model_dir: str, model, scenario: dict):
    """One transcription with captures. Returns (meta, arrays by name) ready to write."""
    import mlx.core as mx

    tmod = importlib.import_module("mlx_whisper.transcribe")
    options = dict(scenario.get("options", {}))
    options.setdefault("fp16", False)  # fp32 on the CPU backend; the weights are fp32
    capture = Capture()
    # mlx-whisper's sampler is an @mx.compile'd function: the random key it draws while being
    # traced becomes a constant of that trace, reused by every later call with the same shapes.
    # A fresh compiled function per scenario gives each transcription what it gets in a fresh
    # process (and makes goldens independent of scenario order); the in-tree side does the same.
    decoding = importlib.import_module("mlx_whisper.decoding")
    decoding.categorical = mx.compile(lambda logits, temp: mx.random.categorical(logits / temp))
    mx.random.seed(scenario["seed"])
    with capture.install():
        transcript = tmod.transcribe(scenario["audio"], path_or_hf_repo=model_dir, verbose=None, **options)
    return common.scenario_record(capture, model, scenario, options, transcript)


def environment():
    return base.mlx_environment("mlx", "mlx-whisper", "tiktoken", "numpy") | common.audio_environment("mlx_whisper")


def main():
    args = base.parser("mlx-whisper oracle: goldens of the transcription scenarios").parse_args()
    spec = spec_check.checked_spec(args.job, validate_spec)

    import mlx.core as mx

    tmod = importlib.import_module("mlx_whisper.transcribe")
    model_dir = spec["model_dir"]
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"scenarios": {}}
    loaded_dtype = None
    for scenario in spec["scenarios"]:
        sid = scenario["id"]
        # The loader transcribe uses (and caches) with the dtype transcribe would ask for:
        # float16 when fp16 (mlx-whisper's default), else float32. Its cache keys on the path
        # only, so it is emptied when a scenario needs the other dtype (what a fresh process
        # with that option gets). The weights keep their stored dtype either way.
        dtype = mx.float16 if scenario.get("options", {}).get("fp16", False) else mx.float32
        if loaded_dtype is None or loaded_dtype != dtype:
            tmod.ModelHolder.model = None
        model = tmod.ModelHolder.get_model(model_dir, dtype)
        loaded_dtype = dtype
        common.record_scenario(result, args.out, sid, functools.partial(run_scenario, model_dir, model, scenario))
    result["environment"] = environment()
    (args.out / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
