"""openai-whisper oracle generator (PyTorch on the CPU): runs inside the oracle's own venv,
never imports the harness.

The reference for what mlx-whisper does not implement, beam search: mlx-whisper's
DecodingTask raises NotImplementedError for `beam_size`, openai-whisper's runs its
BeamSearchDecoder. The model is the mlx-whisper model directory the harness converts
(config.json + weights.safetensors, fp32), its tensors mapped at run time into
openai-whisper's `Whisper(ModelDimensions)` state_dict (strict: every tensor used once,
every shape checked), so both sides compute with the same weights. Decoding runs in fp32.

Reads a scenario spec (JSON, the mlx-whisper generator's format) and runs
`whisper.transcribe` on each scenario's WAV file as a user would (its seek loop, temperature
fallback and decoding). Nothing in the installed package is edited: the captures wrap a few
of its functions at run time, and put the originals back afterwards.

Per scenario it writes what the mlx-whisper generator writes, in the same layout:
  <id>.mel.npy      the whole clip's log-mel spectrogram, (frames incl. padding, n_mels) f32
  <id>.encoder.npy  the encoder output of every decode call (n_calls, n_audio_ctx, n_audio_state)
  <id>.logits.npy   every decoder step's logits before the logit filters, (rows, n_vocab) f32:
                    decode calls in order, within a call step-major, then batch member
and in result.json `scenarios[id]` the token after each logits row, the decode calls and the
transcript. With beam search a batch member is a beam row: the logits row is the one the row
fed the step with, its token the last token of the new row i after the step's update (rows
are re-ranked every step, so a member's tokens are not one sequence). openai-whisper's loop
has no look-ahead step (`lookahead_steps` is always 0). The floats (logits, mel, encoder,
log-probabilities) come from PyTorch: they are recorded, not meant to compare bit for bit
with MLX.

Usage: python -I generate.py --job JOB.json --out DIR

Like the mlx-whisper generator's, its spec check needs nothing beyond the standard library
(torch and whisper are imported inside the functions that run), and what the two generators
share it loads by file path from oracles/common: whisper_spec.py, whisper_capture.py,
whisper_run.py and oracle_base.py.
"""

from __future__ import annotations

import functools
import importlib
import json
import platform
import re
import struct
import sys
from pathlib import Path

# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402
import whisper_capture as capture_base  # noqa: E402
import whisper_run as common  # noqa: E402
import whisper_spec as spec_check  # noqa: E402

SpecError = spec_check.SpecError

# Keyword arguments of whisper.transcribe (20250625) a scenario may set, besides the
# DecodingOptions fields it passes on (whisper_spec.DECODING_OPTIONS).
TRANSCRIBE_OPTIONS = spec_check.TRANSCRIBE_OPTIONS | {"carry_initial_prompt"}
# Set by the generator itself: the model, the audio, and no printing.
RESERVED_OPTIONS = frozenset({"model", "path_or_hf_repo", "verbose", "audio", "prompt"})
BOOL_OPTIONS = spec_check.BOOL_OPTIONS | {"carry_initial_prompt"}
# The mlx-whisper config.json fields that are openai-whisper's ModelDimensions.
DIMENSIONS = (
    "n_mels",
    "n_audio_ctx",
    "n_audio_state",
    "n_audio_head",
    "n_audio_layer",
    "n_vocab",
    "n_text_ctx",
    "n_text_state",
    "n_text_head",
    "n_text_layer",
)


class WeightsError(ValueError):
    """The mlx-whisper weights do not map one to one onto openai-whisper's state_dict."""


# ---------------------------------------------------------------- spec validation (stdlib only)


def _beam_problems(where: str, options: dict) -> list[str]:
    """The beam-search options openai-whisper runs (mlx-whisper has no beam search)."""
    problems = []
    is_number = spec_check.is_number
    beam_size = options.get("beam_size")
    if beam_size is not None and (not isinstance(beam_size, int) or isinstance(beam_size, bool) or beam_size < 1):
        problems.append(f"{where}: options.beam_size: expected an integer >= 1, got {beam_size!r}")
    patience = options.get("patience")
    if patience is not None:
        if beam_size is None:
            problems.append(f"{where}: options.patience: requires options.beam_size")
        if not is_number(patience) or patience <= 0:
            problems.append(f"{where}: options.patience: expected a number > 0, got {patience!r}")
    length_penalty = options.get("length_penalty")
    if length_penalty is not None and (not is_number(length_penalty) or not 0 <= length_penalty <= 1):
        problems.append(f"{where}: options.length_penalty: expected a number in [0, 1], got {length_penalty!r}")
    if beam_size is not None and options.get("best_of") is not None:
        problems.append(f"{where}: options.best_of: cannot be given together with options.beam_size")
    return problems


RULES = spec_check.Rules(
    "whisper.transcribe", TRANSCRIBE_OPTIONS, RESERVED_OPTIONS, BOOL_OPTIONS, ("weights.safetensors",), _beam_problems
)


def validate_spec(spec) -> None:
    """Raise SpecError naming every problem of the spec, before anything is loaded or run."""
    RULES.validate(spec)


# ---------------------------------------------------------------- the model, in openai-whisper's format

_SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "BOOL": "|b1"}


def read_safetensors(path: Path) -> dict:
    """name -> numpy array; the format is an 8-byte header length, a JSON header, raw bytes."""
    import numpy as np

    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    body = memoryview(data)[8 + header_len :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise WeightsError(f"{path}: {name}: unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        array = np.frombuffer(body[begin:end], dtype=_SAFETENSORS_DTYPES[info["dtype"]])
        tensors[name] = array.reshape(info["shape"]).copy()
    return tensors


def openai_key(mlx_key: str) -> str:
    """openai-whisper's state_dict name of an mlx-whisper tensor (the MLP's Linear layers are
    `mlp1`/`mlp2` in mlx-whisper, `mlp.0`/`mlp.2` of an nn.Sequential in openai-whisper)."""
    return re.sub(r"\.mlp([12])\.", lambda m: f".mlp.{2 * int(m.group(1)) - 2}.", mlx_key)


def load_openai_model(model_dir: str):
    """openai-whisper's Whisper with the mlx-whisper directory's weights, fp32 on the CPU.

    Every mlx-whisper tensor goes to exactly one state_dict entry of the same shape (the
    convolutions transposed: MLX keeps Conv1d weights as [out, kernel, in], PyTorch as
    [out, in, kernel]); every state_dict entry is filled, except the encoder's sinusoidal
    positional embedding, which both libraries compute themselves and mlx-whisper does not
    store. `alignment_heads`, when stored, becomes the model's alignment-heads mask.
    """
    import numpy as np
    import torch
    from whisper.model import ModelDimensions, Whisper

    config = json.loads((Path(model_dir) / "config.json").read_text())
    missing = [k for k in DIMENSIONS if k not in config]
    if missing:
        raise WeightsError(f"{model_dir}/config.json: missing model dimensions {missing}")
    model = Whisper(ModelDimensions(**{k: int(config[k]) for k in DIMENSIONS}))
    state = model.state_dict()
    computed = {"encoder.positional_embedding"}  # sinusoids, built by the model itself

    weights = read_safetensors(Path(model_dir) / "weights.safetensors")
    heads = weights.pop("alignment_heads", None)
    mapped, problems = {}, []
    for name, array in weights.items():
        key = openai_key(name)
        if key not in state or key in computed:
            problems.append(f"{name}: no openai-whisper state_dict entry {key!r}")
            continue
        if key in mapped:
            problems.append(f"{name}: {key!r} is already mapped")
            continue
        if array.dtype != np.float32:
            problems.append(f"{name}: expected float32 weights, got {array.dtype}")
            continue
        if re.fullmatch(r"encoder\.conv[12]\.weight", key):
            array = array.transpose(0, 2, 1)
        if tuple(array.shape) != tuple(state[key].shape):
            problems.append(f"{name}: shape {tuple(array.shape)}, {key} expects {tuple(state[key].shape)}")
            continue
        mapped[key] = torch.from_numpy(np.ascontiguousarray(array))
    unfilled = sorted(set(state) - set(mapped) - computed)
    if unfilled:
        problems.append(f"state_dict entries without a weight: {unfilled}")
    if problems:
        raise WeightsError(f"{model_dir}: the weights do not map onto openai-whisper:\n  " + "\n  ".join(problems))
    for key in computed:
        mapped[key] = state[key]
    model.load_state_dict(mapped, strict=True)

    if heads is not None:
        dims = model.dims
        if heads.ndim != 2 or heads.shape[1] != 2:
            raise WeightsError(f"{model_dir}: alignment_heads: expected [n, 2] (layer, head) pairs, got {heads.shape}")
        mask = torch.zeros(dims.n_text_layer, dims.n_text_head, dtype=torch.bool)
        for layer, head in heads.tolist():
            mask[layer, head] = True
        model.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
    return model.float().eval()


# ---------------------------------------------------------------- capture


class Capture(capture_base.CaptureState):
    """What one transcription computed, recorded by wrappers around openai-whisper's functions.

    Its loop has no look-ahead step: one logits call and one update per kept step."""

    package = "whisper"
    inference = "PyTorchInference"
    decoders = ("GreedyDecoder", "BeamSearchDecoder")
    no_speech_override_needs_low_logprob = True

    def install(self):
        return common.patched(self.patches())

    def patches(self):
        """The shared captures, and beam search's finished candidates: what BeamSearchDecoder's
        finalize hands the sequence ranker (per audio, every finished sequence and its sum)."""
        decoding = importlib.import_module("whisper.decoding")
        orig_finalize = decoding.BeamSearchDecoder.finalize
        cap = self

        def finalize(decoder, preceding_tokens, sum_logprobs):
            out = orig_finalize(decoder, preceding_tokens, sum_logprobs)
            if cap.current is not None:
                sequences, sums = out
                cap.current["finalized"] = (
                    [[[int(t) for t in seq.tolist()] for seq in group] for group in sequences],
                    [[float(v) for v in group] for group in sums],
                )
            return out

        return [*super().patches(), (decoding.BeamSearchDecoder, "finalize", finalize)]

    def candidates(self, index, call):
        """A beam-search call's candidates as the record has them: its one audio's finished
        sequences, sampled tokens up to EOT (as DecodingTask.run cuts them), and their sums."""
        if not call["beam"]:
            return None
        if "finalized" not in call or len(call["finalized"][0]) != 1:
            raise common.CaptureError(f"decode call {index}: beam search finalized no candidates for one audio")
        (sequences,), (sums,) = call["finalized"]
        begin, eot = call["sample_begin"], call["eot"]
        return [
            {"tokens": seq[begin : seq.index(eot)], "sum_logprob": total}
            for seq, total in zip(sequences, sums, strict=True)
        ]

    def keep(self, kind, value):
        """A copy now: the logit filters, for one, write -inf into the logits tensor in place."""
        import torch

        if kind == "rows":
            return value.detach().to(torch.float32).clone()
        if kind in ("loop_tokens", "chosen"):
            return value.clone()
        return value.detach().clone()

    def pcm(self, path):
        # No ffmpeg CLI: the WAV's 16-bit PCM / 32768, what ffmpeg gives for these clips
        # (checked whenever ffmpeg is there: audio.decoded_equals_wav_pcm).
        return common.wav_pcm(path)

    def call_extra(self, task):
        return {"beam": task.options.beam_size is not None}

    def f32(self, tensor):
        import torch

        return tensor.to(torch.float32).numpy()

    def mel_array(self, mel):
        return self.f32(mel).T.copy()  # (frames, n_mels), as mlx-whisper lays it out

    def steps(self, index, call):
        import numpy as np
        import torch

        loop_tokens = call["loop_tokens"][0].numpy()  # (batch, sample_begin + n_steps) before finalize
        batch, begin = loop_tokens.shape[0], call["sample_begin"]
        n_steps = loop_tokens.shape[1] - begin
        if len(call["rows"]) != n_steps or len(call["chosen"]) != n_steps:
            raise common.CaptureError(
                f"decode call {index}: {len(call['rows'])} logits calls and {len(call['chosen'])} token "
                f"updates for {n_steps} steps"
            )
        step_logits = [r.numpy() for r in call["rows"]]
        chosen = torch.stack(call["chosen"], dim=0).numpy() if n_steps else np.zeros((0, batch), int)
        # Greedy rows are whole sequences; beam rows are re-ranked each step, so only the last
        # step's tokens are the final rows' last tokens.
        if chosen.shape != (n_steps, batch) or (n_steps and not np.array_equal(chosen[-1], loop_tokens[:, -1])):
            raise common.CaptureError(
                f"decode call {index}: the tokens the decoder chose differ from the loop's tokens"
            )
        if not call["beam"] and not np.array_equal(chosen.T, loop_tokens[:, begin:]):
            raise common.CaptureError(f"decode call {index}: the sampled rows differ from the loop's tokens")
        # Per member (beam row), the tokens it held after each step, cut at the first EOT: what
        # the in-tree recorder collects from its observer.
        members = [[int(t) for t in column] for column in chosen.T]
        return batch, n_steps, 0, step_logits, chosen, members


def run_scenario(model, scenario: dict):
    """One transcription with captures. Returns (meta, arrays by name) ready to write."""
    import torch

    tmod = importlib.import_module("whisper.transcribe")
    options = dict(scenario.get("options", {}))
    options.setdefault("fp16", False)  # fp32 on the CPU; the weights are fp32
    capture = Capture()
    torch.manual_seed(scenario["seed"])  # sampling at T > 0 draws from torch's generator
    with capture.install():
        transcript = tmod.transcribe(model, scenario["audio"], verbose=None, **options)
    meta, arrays = common.scenario_record(capture, model, scenario, options, transcript)
    for index, (call, entry) in enumerate(zip(capture.calls, meta["decode_calls"], strict=True)):
        candidates = capture.candidates(index, call)
        if candidates is not None:
            entry["candidates"] = candidates
    return meta, arrays


def environment():
    import torch

    return {
        "mlx": None,  # no MLX here: PyTorch computes, the goldens are compared on tokens
        "torch": torch.__version__,
        **base.versions("openai-whisper", "tiktoken", "numpy"),
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        **common.audio_environment("whisper"),
    }


def main():
    args = base.parser("openai-whisper oracle: goldens of the transcription scenarios").parse_args()
    spec = spec_check.checked_spec(args.job, validate_spec)
    try:
        model = load_openai_model(spec["model_dir"])
    except WeightsError as e:
        print(f"oracle: {e}", file=sys.stderr)
        sys.exit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"scenarios": {}}
    for scenario in spec["scenarios"]:
        sid = scenario["id"]
        common.record_scenario(result, args.out, sid, functools.partial(run_scenario, model, scenario))
    result["environment"] = environment()
    (args.out / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
