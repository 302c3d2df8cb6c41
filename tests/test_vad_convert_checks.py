"""The Silero VAD converter's and loader's checks (models/vad/convert.py, models/vad/load.py), each
fed a malformed archive built from the shipped silero_vad.jit: its module tree read, edited, and
written back as a TorchScript zip (the same pickle opcodes, persistent ids and storages torch
writes), so each check sees the real graph with one thing wrong and must name it.

The unedited rewrite converts to the shipped weights bit for bit (the writer is faithful: every
failure below is the edit's). The reader's 0-dim tensor path, which the shipped graph never takes,
is judged on a TorchScript file torch itself writes in the oracle venv. The converted-weights forms
(a directory or a safetensors file) load the model the gate judges, bit for bit.
"""

from __future__ import annotations

import copyreg
import io
import json
import pickle
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from harness.artifacts.vad import resolve_vad_weights
from harness.paths import FIXTURES_DIR
from harness.profile.vad import load_vad_profile
from models.vad import load_model, read_wav
from models.vad.convert import _STORAGE_DTYPES, _ScriptModule, convert_silero_jit, read_torchscript_tree

STORAGE_NAMES = {np.dtype(v): k for k, v in _STORAGE_DTYPES.items()}


@pytest.fixture(scope="module")
def jit_path() -> Path:
    return resolve_vad_weights(load_vad_profile())


@pytest.fixture(scope="module")
def shipped(jit_path: Path) -> dict[str, np.ndarray]:
    return convert_silero_jit(jit_path)


# -- a TorchScript writer for edited trees -----------------------------------------------------------


class _Global:
    """A global the pickle names (GLOBAL opcode), never called here."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __call__(self, *args: Any) -> Any:
        raise AssertionError("only pickled")


class _Call:
    def __init__(self, func: _Global, args: tuple = ()):
        self.func, self.args = func, args


class _Storage:
    def __init__(self, pid: tuple):
        self.pid = pid


REBUILD = _Global("torch._utils", "_rebuild_tensor_v2")
ORDERED_DICT = _Global("collections", "OrderedDict")


class _TreeWriter(pickle._Pickler):
    """Pickles a module tree as torch.jit.save does (protocol 2): modules by their `__torch__`
    class and NEWOBJ + BUILD, tensors as `_rebuild_tensor_v2` of a persistent storage id."""

    def __init__(self, file: Any, pid_kind: str = "storage"):
        super().__init__(file, protocol=2)
        self.storages: list[bytes] = []
        self.pid_kind = pid_kind
        self.storage_types: dict[str, _Global] = {}

    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        if isinstance(obj, _Global) or (isinstance(obj, type) and issubclass(obj, _ScriptModule)):
            if id(obj) in self.memo:
                self.write(self.get(self.memo[id(obj)][0]))
                return
            module, name = (obj.module, obj.name) if isinstance(obj, _Global) else obj.qualname.rsplit(".", 1)
            self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())
            self.memoize(obj)
            return
        super().save(obj, save_persistent_id)

    def persistent_id(self, obj: Any) -> Any:
        return obj.pid if isinstance(obj, _Storage) else None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _ScriptModule):
            return copyreg.__newobj__, (type(obj),), dict(vars(obj))
        if isinstance(obj, _Call):
            return obj.func, obj.args
        if isinstance(obj, np.ndarray):
            key = str(len(self.storages))
            raw = np.ascontiguousarray(obj).astype(obj.dtype.newbyteorder("<")).tobytes()
            self.storages.append(raw[: -obj.itemsize] if isinstance(obj, Short) else raw)
            kind = self.storage_types.setdefault(STORAGE_NAMES[obj.dtype], _Global("torch", STORAGE_NAMES[obj.dtype]))
            pid = (self.pid_kind, kind, key, "cpu", int(obj.size))
            stride = tuple(s // obj.itemsize for s in np.ascontiguousarray(obj).strides)
            return REBUILD, (_Storage(pid), 0, tuple(obj.shape), stride, False, _Call(ORDERED_DICT))
        return NotImplemented


class Short(np.ndarray):
    """A tensor whose storage is written one element short of what the pickle says."""


def write_archive(
    source: Path,
    dest: Path,
    tree: Any,
    *,
    pid_kind: str = "storage",
    byteorder: bytes | None = None,
    pkl_name: str = "data.pkl",
    extra: dict[str, bytes] | None = None,
) -> Path:
    """`source`'s zip with data.pkl and data/ replaced by `tree` written anew; every other member
    (code, constants, version, byteorder) copied unless overridden."""
    buf = io.BytesIO()
    writer = _TreeWriter(buf, pid_kind)
    writer.dump(tree)
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(dest, "w") as zout:
        root = next(n for n in zin.namelist() if n.endswith("/data.pkl")).split("/")[0]
        for info in zin.infolist():
            if info.filename == f"{root}/data.pkl" or info.filename.startswith(f"{root}/data/"):
                continue
            data = zin.read(info)
            if info.filename == f"{root}/byteorder" and byteorder is not None:
                data = byteorder
            zout.writestr(info.filename, data)
        zout.writestr(f"{root}/{pkl_name}", buf.getvalue())
        for key, raw in enumerate(writer.storages):
            zout.writestr(f"{root}/data/{key}", raw)
        for name, data in (extra or {}).items():
            zout.writestr(name, data)
    return dest


def edited(jit_path: Path, tmp_path: Path, edit: Any = None, **kwargs: Any) -> Path:
    tree = read_torchscript_tree(jit_path)
    if edit is not None:
        edit(tree)
    return write_archive(jit_path, tmp_path / "edited.jit", tree, **kwargs)


def test_the_unedited_rewrite_converts_to_the_shipped_weights(jit_path, shipped, tmp_path):
    got = convert_silero_jit(edited(jit_path, tmp_path))
    assert sorted(got) == sorted(shipped)
    for name, tensor in shipped.items():
        assert got[name].dtype == tensor.dtype and np.array_equal(got[name], tensor), name


# -- the archive: file, zip layout, byte order, root object, storages --------------------------------


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="Silero VAD TorchScript file not found: .*nowhere.jit"):
        convert_silero_jit(tmp_path / "nowhere.jit")


def test_an_archive_without_one_data_pkl_is_refused(jit_path, tmp_path):
    with pytest.raises(ValueError, match=r"expected one <root>/data.pkl in the TorchScript zip, found \[\]"):
        read_torchscript_tree(edited(jit_path, tmp_path, pkl_name="model.pkl"))
    two = edited(jit_path, tmp_path, extra={"other/data.pkl": b"\x80\x02N."})
    with pytest.raises(ValueError, match=r"found \['VADr_v6_10_25_noths_re/data.pkl', 'other/data.pkl'\]"):
        convert_silero_jit(two)


def test_a_big_endian_archive_is_refused(jit_path, tmp_path):
    with pytest.raises(ValueError, match="big-endian TorchScript archives are not supported"):
        convert_silero_jit(edited(jit_path, tmp_path, byteorder=b"big"))


def test_a_pickle_that_is_not_a_module_is_refused(jit_path, tmp_path):
    """A state dict (tensors by name) where TorchScript keeps its module tree."""
    state = {name: tensor for name, tensor in convert_silero_jit(jit_path).items()}
    path = write_archive(jit_path, tmp_path / "state.jit", state)
    with pytest.raises(ValueError, match="data.pkl does not hold a TorchScript module"):
        convert_silero_jit(path)


def test_an_unknown_persistent_id_is_refused(jit_path, tmp_path):
    with pytest.raises(pickle.UnpicklingError, match=r"unknown persistent id \('tensor', "):
        convert_silero_jit(edited(jit_path, tmp_path, pid_kind="tensor"))


def test_a_storage_shorter_than_the_pickle_says_is_refused(jit_path, tmp_path):
    def edit(tree: Any) -> None:
        rnn = tree._model.decoder.rnn
        rnn.weight_hh = rnn.weight_hh.view(Short)

    with pytest.raises(pickle.UnpicklingError, match=r"storage \d+: 65535 elements, the pickle says 65536$"):
        convert_silero_jit(edited(jit_path, tmp_path, edit))


# -- the graph: root module, 16 kHz sub-model, tensors ------------------------------------------------


def _retype(node: _ScriptModule, qualname: str) -> None:
    node.__class__ = type(qualname.rsplit(".", 1)[1], (_ScriptModule,), {"qualname": qualname})


def test_another_root_module_is_refused(jit_path, tmp_path):
    path = edited(jit_path, tmp_path, lambda t: _retype(t, "__torch__.vad.model.vad_annotator.VADRNNJIT"))
    with pytest.raises(ValueError, match=r"root module is __torch__.vad.model.vad_annotator.VADRNNJIT, expected"):
        convert_silero_jit(path)


@pytest.mark.parametrize(
    "edit",
    [lambda t: delattr(t, "_model"), lambda t: setattr(t._model, "sample_rate", 8000)],
    ids=["no-model", "8k-model"],
)
def test_no_16k_sub_model_is_refused(jit_path, tmp_path, edit):
    with pytest.raises(ValueError, match=r"no 16 kHz sub-model `_model` \(sample_rate 16000\)"):
        convert_silero_jit(edited(jit_path, tmp_path, edit))


def test_another_context_size_is_refused(jit_path, tmp_path):
    path = edited(jit_path, tmp_path, lambda t: setattr(t._model, "context_size_samples", 32))
    with pytest.raises(ValueError, match="16 kHz context is 32 samples, expected 64"):
        convert_silero_jit(path)


def test_a_missing_tensor_is_named(jit_path, tmp_path):
    path = edited(jit_path, tmp_path, lambda t: delattr(t._model.decoder.rnn, "weight_hh"))
    with pytest.raises(ValueError) as info:
        convert_silero_jit(path)
    problems = str(info.value).split("\n  ")[1:]
    assert problems == ["missing tensor _model.decoder.rnn.weight_hh (for lstm.weight_hh, expected shape [512, 128])"]


def test_a_misshaped_or_mistyped_tensor_is_named(jit_path, tmp_path):
    def edit(tree: Any) -> None:
        block = getattr(tree._model.encoder, "0").reparam_conv
        block.weight = block.weight.astype(np.float64)
        tree._model.decoder.rnn.bias_ih = tree._model.decoder.rnn.bias_ih.reshape(4, 128)

    with pytest.raises(ValueError) as info:
        convert_silero_jit(edited(jit_path, tmp_path, edit))
    assert str(info.value).split("\n  ")[1:] == [
        "tensor _model.encoder.0.reparam_conv.weight is float64 [128, 129, 3], expected float32 [128, 129, 3]",
        "tensor _model.decoder.rnn.bias_ih is float32 [4, 128], expected float32 [512]",
    ]


def test_an_unknown_tensor_is_named(jit_path, tmp_path):
    path = edited(jit_path, tmp_path, lambda t: setattr(t._model.decoder, "extra", np.ones(3, np.float32)))
    with pytest.raises(ValueError) as info:
        convert_silero_jit(path)
    assert str(info.value).split("\n  ")[1:] == ["unknown tensors in _model: ['decoder.extra']"]


# -- reader paths the shipped graph does not take ------------------------------------------------------


def test_a_class_named_twice_reads_as_one_class(jit_path, tmp_path):
    """torch's pickler memoizes globals (and mangles each module type's name), so the shipped file
    names each class once; a pickle naming one twice still gives one class."""
    tree = read_torchscript_tree(jit_path)
    block = tree._model.decoder.rnn
    twin = type("LSTMCell", (_ScriptModule,), {"qualname": type(block).qualname})()
    twin.__dict__.update(vars(block))
    tree._model_8k.decoder.rnn = twin
    back = read_torchscript_tree(write_archive(jit_path, tmp_path / "twice.jit", tree))
    assert type(back._model.decoder.rnn) is type(back._model_8k.decoder.rnn)
    assert np.array_equal(back._model_8k.decoder.rnn.weight_hh, block.weight_hh)


TORCH_WRITES = """
import json, sys, torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.arange(6.0)[4])  # 0-dim, at storage offset 4
        self.register_buffer("eps", torch.tensor(2.5, dtype=torch.float64))  # 0-dim, own storage
        self.register_buffer("w", torch.arange(6.0).reshape(2, 3).t())  # strided view
    def forward(self, x):
        return x * self.scale + self.eps
m = torch.jit.script(M())
torch.jit.save(m, sys.argv[1])
print(json.dumps({k: [str(v.dtype), list(v.shape), v.tolist(), v.storage_offset()] for k, v in m.named_buffers()}))
"""


def test_0_dim_tensors_read_as_torch_writes_them(tmp_path):
    """The shipped graph holds no 0-dim tensor; one torch.jit.save writes (a view at a storage
    offset, and one of its own) reads back with torch's dtype, shape and value."""
    from harness.oracle.venvs import ensure_oracle_env

    script, path = tmp_path / "write.py", tmp_path / "scalars.jit"
    script.write_text(TORCH_WRITES)
    cmd, env = ensure_oracle_env("silero-vad").command(str(script), str(path))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    torch_side = json.loads(out.stdout.strip().splitlines()[-1])
    assert torch_side["scale"][3] == 4  # the case under test: a 0-dim view into a larger storage
    tree = read_torchscript_tree(path)
    dtypes = {"torch.float32": np.float32, "torch.float64": np.float64}
    for name, (dtype, shape, value, _offset) in torch_side.items():
        mine = getattr(tree, name)
        assert (mine.dtype, list(mine.shape), mine.tolist()) == (np.dtype(dtypes[dtype]), shape, value), name


# -- load.py: the converted forms, and their checks ---------------------------------------------------


def test_a_converted_directory_or_file_loads_the_gated_model_bit_for_bit(jit_path, shipped, tmp_path):
    mx.save_safetensors(str(tmp_path / "weights.safetensors"), {k: mx.array(v) for k, v in shipped.items()})
    audio = read_wav(FIXTURES_DIR / "fox.wav")
    gated = load_model(jit_path).probabilities(audio)
    for source in (tmp_path, tmp_path / "weights.safetensors"):
        got = load_model(source).probabilities(audio)
        assert np.array_equal(got.view(np.uint32), gated.view(np.uint32)), source


def test_an_unknown_tensor_in_converted_weights_is_named(shipped, tmp_path):
    weights = {k: mx.array(v) for k, v in shipped.items()} | {"extra.weight": mx.zeros((2,))}
    mx.save_safetensors(str(tmp_path / "weights.safetensors"), weights)
    with pytest.raises(ValueError, match=r"not Silero VAD v6 16 kHz weights:\n  unknown tensors \['extra.weight'\]$"):
        load_model(tmp_path)
