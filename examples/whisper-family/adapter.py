"""A Python implementation (served by plugins/host.py, docs/protocol.md) for a Whisper package laid
out like mlx-whisper: `audio`, `decoding` (DecodingTask, Inference, GreedyDecoder), `transcribe`
(transcribe, ModelHolder) and `tokenizer` modules. The package's own `transcribe` runs; the
mlx-whisper oracle's capture (oracles/mlx-whisper/generate.py `Capture`, oracles/common) records
what it computed, so the record is made exactly as the oracle's own and any difference in it is
the package's. The profile puts examples/whisper-family, oracles/common and oracles/mlx-whisper on
the path (`implementation.path`).

Free runs only: a transcription library has no way to be fed another run's tokens, so a
teacher-forced run is refused (a profile of it leaves teacher_forced_logits out).
"""

import importlib
import importlib.metadata
import os
from pathlib import Path

import whisper_run as common
from generate import Capture


class WhisperPackage:
    def __init__(self, package, distribution, model_dirs_variable=None):
        self.package, self.distribution = package, distribution
        self.model_dirs_variable = model_dirs_variable
        version = importlib.metadata.version(distribution)
        self.info = {
            "name": distribution,
            "version": version,
            "produces": "speech",
            "environment": {distribution: version, "adapter": "examples/whisper-family/adapter.py"},
        }
        self.capture_class = type("Capture", (Capture,), {"package": package})
        self.model_dir = self.loaded_dtype = None

    def load(self, model_dir):
        if self.model_dirs_variable:  # a package that loads only from folders it is told of
            os.environ[self.model_dirs_variable] = str(Path(model_dir).resolve().parent)
        self.model_dir = str(model_dir)
        self.transcribe = importlib.import_module(f"{self.package}.transcribe")
        self.decoding = importlib.import_module(f"{self.package}.decoding")

    def run(self, spec, forced, decode):
        import mlx.core as mx

        if forced is not None:
            raise ValueError("teacher-forced runs: the package's transcribe cannot be fed tokens (free runs only)")
        if decode != "eager":
            raise ValueError(f"decode {decode!r}: only the package's own (eager) decode runs here")
        options = dict(spec.get("options", {}))
        options.setdefault("fp16", False)
        # As the oracle: the package's model cache emptied when a scenario needs the other dtype,
        # and a fresh compiled sampler per scenario (its traced random key is a constant otherwise).
        dtype = mx.float16 if options["fp16"] else mx.float32
        if self.loaded_dtype is None or self.loaded_dtype != dtype:
            self.transcribe.ModelHolder.model = None
        model = self.transcribe.ModelHolder.get_model(self.model_dir, dtype)
        self.loaded_dtype = dtype
        self.decoding.categorical = mx.compile(lambda logits, temp: mx.random.categorical(logits / temp))
        mx.random.seed(spec["seed"])
        capture = self.capture_class()
        with common.patched(capture.patches()):
            transcript = self.transcribe.transcribe(
                spec["audio"], path_or_hf_repo=self.model_dir, verbose=None, **options
            )
        meta, arrays = common.scenario_record(capture, model, spec, options, transcript)
        return meta | {"logits": arrays.pop("logits"), "arrays": arrays}


def vayu():
    """vayu-whisper 1.1.0 (package `whisper_mlx`), which loads models only from the folders named in
    WHISPER_MLX_MODEL_DIRS."""
    return WhisperPackage("whisper_mlx", "vayu-whisper", model_dirs_variable="WHISPER_MLX_MODEL_DIRS")
