"""Read Silero VAD's weights out of the package's TorchScript file, without torch.

`silero_vad.jit` (the file `silero_vad.load_silero_vad()` runs) is a zip: `<root>/data.pkl`
pickles the module tree (`__torch__.*` objects whose state dicts hold their tensors) and
`<root>/data/<key>` holds each tensor's raw little-endian storage. A restricted unpickler
reads it: module classes become plain attribute bags, `torch._utils._rebuild_tensor_v2`
becomes a numpy view of the storage, and every other global is refused, so nothing in the
file can run code.

Why the .jit and not the .onnx or the shipped .safetensors: the .jit is the model the
package's own `get_speech_timestamps` runs (the oracle's graph), so its tensors are the
ones whose outputs are gated; reading it needs only the standard library and numpy (no
`onnx` pin in the project). `expected_shapes` is the strict contract: a tensor missing,
extra or misshaped is an error naming it.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

# Converted names (the MLX model's parameter names) -> shapes, for the 16 kHz model.
# PyTorch layouts are kept (conv weights (out, in, kernel)); the model transposes on load.
EXPECTED_SHAPES_16K: dict[str, tuple[int, ...]] = {
    "stft_basis": (258, 1, 256),
    "conv1.weight": (128, 129, 3),
    "conv1.bias": (128,),
    "conv2.weight": (64, 128, 3),
    "conv2.bias": (64,),
    "conv3.weight": (64, 64, 3),
    "conv3.bias": (64,),
    "conv4.weight": (128, 64, 3),
    "conv4.bias": (128,),
    "lstm.weight_ih": (512, 128),
    "lstm.weight_hh": (512, 128),
    "lstm.bias_ih": (512,),
    "lstm.bias_hh": (512,),
    "head.weight": (1, 128, 1),
    "head.bias": (1,),
}

# Where each converted name lives in the TorchScript module tree under `_model` (16 kHz).
_TORCHSCRIPT_PATHS: dict[str, str] = {
    "stft_basis": "stft.forward_basis_buffer",
    "conv1.weight": "encoder.0.reparam_conv.weight",
    "conv1.bias": "encoder.0.reparam_conv.bias",
    "conv2.weight": "encoder.1.reparam_conv.weight",
    "conv2.bias": "encoder.1.reparam_conv.bias",
    "conv3.weight": "encoder.2.reparam_conv.weight",
    "conv3.bias": "encoder.2.reparam_conv.bias",
    "conv4.weight": "encoder.3.reparam_conv.weight",
    "conv4.bias": "encoder.3.reparam_conv.bias",
    "lstm.weight_ih": "decoder.rnn.weight_ih",
    "lstm.weight_hh": "decoder.rnn.weight_hh",
    "lstm.bias_ih": "decoder.rnn.bias_ih",
    "lstm.bias_hh": "decoder.rnn.bias_hh",
    "head.weight": "decoder.decoder.2.weight",
    "head.bias": "decoder.decoder.2.bias",
}

_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "BoolStorage": np.bool_,
}

_JIT_LIST_BUILDERS = ("build_intlist", "build_doublelist", "build_boollist", "build_tensorlist")


class _ScriptModule:
    """A TorchScript object from data.pkl: its pickled state becomes attributes."""

    qualname = "?"

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _rebuild_tensor(storage: np.ndarray, offset: int, shape: tuple[int, ...], stride: tuple[int, ...], *_: Any):
    """numpy twin of torch._utils._rebuild_tensor_v2: a strided view into the flat storage."""
    if not shape:
        return storage[offset : offset + 1].reshape(()).copy()
    if storage.size == 0:
        return np.zeros(shape, dtype=storage.dtype)
    itemsize = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=shape, strides=tuple(s * itemsize for s in stride), writeable=False
    )
    return np.ascontiguousarray(view)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, archive: zipfile.ZipFile, root: str):
        super().__init__(file)
        self._archive = archive
        self._root = root
        self._classes: dict[str, type] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("__torch__"):
            qualname = f"{module}.{name}"
            if qualname not in self._classes:
                self._classes[qualname] = type(name, (_ScriptModule,), {"qualname": qualname})
            return self._classes[qualname]
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if module == "torch.jit._pickle" and name in _JIT_LIST_BUILDERS:
            return list  # typed list attributes (e.g. `sample_rates`): plain lists
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        raise pickle.UnpicklingError(f"TorchScript archive: refusing global {module}.{name}")

    def persistent_load(self, pid: Any) -> np.ndarray:
        kind, dtype, key, _location, numel = pid
        if kind != "storage":
            raise pickle.UnpicklingError(f"TorchScript archive: unknown persistent id {pid!r}")
        raw = self._archive.read(f"{self._root}/data/{key}")
        storage = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
        if storage.size != numel:
            raise pickle.UnpicklingError(f"storage {key}: {storage.size} elements, the pickle says {numel}")
        return storage


def read_torchscript_tree(path: Path) -> _ScriptModule:
    """The unpickled module tree of a TorchScript archive (attributes, tensors as numpy)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Silero VAD TorchScript file not found: {path}")
    with zipfile.ZipFile(path) as archive:
        pkl = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkl) != 1:
            raise ValueError(f"{path}: expected one <root>/data.pkl in the TorchScript zip, found {pkl}")
        root = pkl[0].split("/")[0]
        byteorder = f"{root}/byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() != b"little":
            raise ValueError(f"{path}: big-endian TorchScript archives are not supported")
        with archive.open(pkl[0]) as f:
            tree = _Unpickler(f, archive, root).load()
    if not isinstance(tree, _ScriptModule):
        raise ValueError(f"{path}: data.pkl does not hold a TorchScript module")
    return tree


def _lookup(node: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not hasattr(node, part):
            return None
        node = getattr(node, part)
    return node


def convert_silero_jit(path: Path) -> dict[str, np.ndarray]:
    """The 16 kHz model's float32 tensors under the MLX model's names, strictly checked."""
    tree = read_torchscript_tree(path)
    if not tree.qualname.endswith("VADRNNJITMerge"):
        raise ValueError(f"{path}: root module is {tree.qualname}, expected Silero's VADRNNJITMerge")
    model_16k = _lookup(tree, "_model")
    if model_16k is None or getattr(model_16k, "sample_rate", None) != 16000:
        raise ValueError(f"{path}: no 16 kHz sub-model `_model` (sample_rate 16000)")
    if getattr(model_16k, "context_size_samples", None) != 64:
        raise ValueError(f"{path}: 16 kHz context is {model_16k.context_size_samples} samples, expected 64")
    weights: dict[str, np.ndarray] = {}
    problems = []
    for name, ts_path in _TORCHSCRIPT_PATHS.items():
        tensor = _lookup(model_16k, ts_path)
        expected = EXPECTED_SHAPES_16K[name]
        if not isinstance(tensor, np.ndarray):
            problems.append(f"missing tensor _model.{ts_path} (for {name}, expected shape {list(expected)})")
        elif tensor.shape != expected or tensor.dtype != np.float32:
            problems.append(
                f"tensor _model.{ts_path} is {tensor.dtype} {list(tensor.shape)}, expected float32 {list(expected)}"
            )
        else:
            weights[name] = tensor
    found = _tensor_paths(model_16k)
    unknown = sorted(set(found) - set(_TORCHSCRIPT_PATHS.values()))
    if unknown:
        problems.append(f"unknown tensors in _model: {unknown}")
    if problems:
        raise ValueError(f"{path}: not the Silero VAD v6 graph this port implements:\n  " + "\n  ".join(problems))
    return weights


def _tensor_paths(node: _ScriptModule, prefix: str = "") -> list[str]:
    """Every non-empty tensor attribute below a module (empty ones are runtime state)."""
    out = []
    for key, value in vars(node).items():
        if isinstance(value, _ScriptModule):
            out += _tensor_paths(value, f"{prefix}{key}.")
        elif isinstance(value, np.ndarray) and value.size:
            out.append(f"{prefix}{key}")
    return out
