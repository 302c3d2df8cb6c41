"""Module taps: record what each named sub-module of an MLX model returns, on one model call.

Plain MLX, no project imports: the oracle side (inside its own venv, loaded by file path)
and the in-tree side (the harness) use this same file, so both record the same modules the
same way. A tapped module is replaced in its parent by a proxy that calls it and keeps the
output's last position; attribute access goes through to the module, so code like
`embed_tokens.as_linear(h)` still works.

Which call is recorded is counted on the model body (`model.model`): call 0 is the first
prefill chunk, and so on. Only the target call's outputs are kept.
"""

from __future__ import annotations

import numpy as np

# Sub-modules of a Llama block, in the order a block calls them.
BLOCK_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")


class _Tap:
    def __init__(self, inner, name, taps):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_taps", taps)

    def __call__(self, *args, **kwargs):
        out = self._inner(*args, **kwargs)
        self._taps._record(self._name, out)
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _CallCounter(_Tap):
    """The body: counts model calls and arms the other taps on the target one."""

    def __call__(self, *args, **kwargs):
        self._taps.armed = self._taps.calls == self._taps.target_call
        try:
            out = self._inner(*args, **kwargs)
            self._taps._record(self._name, out)
            return out
        finally:
            self._taps.armed = False
            self._taps.calls += 1


class ModuleTaps:
    """Install on a Llama-shaped model (`model.model.{embed_tokens, layers, norm}`)."""

    def __init__(self, model, target_call):
        self.model = model
        self.target_call = target_call
        self.calls = 0
        self.armed = False
        self.records = []  # (name, lazy array) in execution order
        body = model.model
        self._restore = [(model, "model", body)]
        self._swap(body, "embed_tokens", "model.embed_tokens")
        for i, layer in enumerate(body.layers):
            for part in BLOCK_PARTS:
                if part in layer:
                    self._swap(layer, part, f"model.layers.{i}.{part}")
            self._restore.append((body.layers, i, layer))
            body.layers[i] = _Tap(layer, f"model.layers.{i}", self)
        self._swap(body, "norm", "model.norm")
        model.model = _CallCounter(body, "model", self)

    def _swap(self, parent, key, name):
        inner = parent[key]
        self._restore.append((parent, key, inner))
        setattr(parent, key, _Tap(inner, name, self))

    def _record(self, name, out):
        if self.armed and name != "model":
            self.records.append((name, out))

    def remove(self):
        for parent, key, inner in reversed(self._restore):
            if isinstance(parent, list):
                parent[key] = inner
            else:
                vars(parent).pop(key, None)  # the proxy lives in the instance dict, the module in the Module dict
                setattr(parent, key, inner)

    def outputs(self):
        """{name: float32 vector of the last position}, in execution order (names are unique)."""
        import mlx.core as mx

        out = {}
        for name, array in self.records:
            last = array[0, -1] if array.ndim == 3 else array.reshape(-1)
            out[name] = np.array(last.astype(mx.float32))
        return out


def prefill_calls(n_prompt, prefill_step_size):
    """Model calls before the one that predicts step 0: the prompt but its last token, in chunks."""
    remaining, calls = n_prompt, 0
    while remaining > 1:
        remaining -= min(prefill_step_size, remaining - 1)
        calls += 1
    return calls
