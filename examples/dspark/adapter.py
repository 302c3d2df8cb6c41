"""dspark-mlx 0.1.0 (PyPI), a DSpark speculative decoder, as a Python implementation served by
plugins/host.py (docs/protocol.md): the harness checks its claim that speculative decoding is
*lossless*, i.e. the tokens it emits equal the target model's own greedy decode (mlx-lm 0.32.2
`generate_step`, the oracle). Imports nothing of the harness.

What runs is the package's own code, unchanged: `dspark_mlx.load_draft` (from a local folder, so
no hub), its reference host `dspark_mlx.hosts.MlxLmHostAdapter` over the mlx-lm model, and its
reference-matched loop `dspark_mlx.generate_eager` (one base forward per cycle over
[anchor, d_1..d_7], `greedy_accept`, KV rollback of the rejected tail). The adapter only watches:
a subclass of the host adapter keeps the rows of each verify forward, so the record's logits row
for an emitted token is the base row `greedy_accept` took it from (row j of the verify pass that
emitted it as its j-th token).

The twin drafter. dspark's drafters are published on the Hugging Face hub only, which is not
reachable here, so `load` makes a deterministic twin in the process's work folder (cwd),
`dspark-twin/config.json` + `model.safetensors`, and loads it through `load_draft`:

- architecture: dspark's `qwen3` drafter (`Qwen3DSparkDrafter`, the format of the published
  `dspark_qwen3_*_block7`: `layers.*` keys, `fc`, `hidden_norm`, `markov_head`,
  `confidence_head`, own `embed_tokens` and `lm_head`), fitted to SmolLM2-135M: hidden 576,
  vocab 49152, 1 layer, 4 heads of 64 (2 KV heads), MLP 512, block_size 7, target_layer_ids
  (1, 15, 28) of 30, mask_token_id 0, markov_rank 64, rms_norm_eps 1e-5, rope_theta 10000;
- weights: float32, every matrix drawn from N(0, 0.02^2) by numpy's default_rng(SEED = 20261204)
  in sorted key order, every norm weight 1, the confidence bias 0. About 60 M parameters.

Two modes (two factories; the profile names one):

- `random_twin`: the twin as made. Its drafts are noise, so nearly every draft is rejected:
  each cycle emits one token, the base's own correction at row 0 of the verify pass. It tests
  that every rejected draft is repaired to the target's token (and that rollback leaves the
  KV cache right), but hardly walks the acceptance path.
- `bigram_twin`: the same twin, with its Markov head (DSpark's low-rank token-transition logit
  bias, which picks each draft from the one before) rewritten per scenario so that it maps each
  token to the token that follows it in the target's own greedy continuation, as dspark's host
  adapter decodes it one token at a time (`prefill` + `decode_step`, what its `bench` calls
  base greedy); where a token is followed by different tokens, its first successor wins, and a
  draft chain breaks there. So runs of drafts are accepted and blocks are partly accepted
  (SmolLM2-135M, 33 tokens: 24 of 70 drafts accepted on plain and on chat, 2.4 a block):
  acceptance, bonus tokens and partial rollbacks, where lossless bugs hide, are exercised. The
  drafter only proposes: every emitted token still comes from the argmax of the verify pass.

Each record's `dspark` field counts the drafts proposed and accepted (dspark's `SummaryEvent`; a
generator note, not kept in the record), also said on stderr and, where DSPARK_STATS names a file,
appended to it.
Free runs only: dspark's loop picks every token itself and has no way to be fed another run's
tokens, so a teacher-forced run is refused: its `info` says it serves free runs only, so a
profile naming a teacher-forced check is refused at its hello (its profiles leave them out).
Greedy and no EOS stop, as the oracle's `generate_step`: `eos_id=None`, `max_new_tokens=n`.
"""

import importlib.metadata
import json
import os
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

SEED = 20261204
TWIN = {
    "model_type": "qwen3",
    "architectures": ["DSparkQwen3Twin"],
    "torch_dtype": "float32",
    "vocab_size": 49152,
    "hidden_size": 576,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "target_layer_ids": [1, 15, 28],
    "num_target_layers": 30,
    "block_size": 7,
    "mask_token_id": 0,
    "markov_rank": 64,
    "enable_confidence_head": True,
    "confidence_head_with_markov": True,
    "temperature": 0.0,
    "max_position_embeddings": 8192,
}
# The spec keys this adapter runs; any other key with a value changes the run and is refused.
RUNS = {"id", "kind", "prompt", "messages", "n_tokens", "prefill_step_size", "template_kwargs"}


def twin_weights(config, seed=SEED):
    """The twin's checkpoint (qwen3 drafter keys, as dspark's `qwen3_key_map` reads them)."""
    h, v, r = config["hidden_size"], config["vocab_size"], config["markov_rank"]
    names = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
    nh, nkv, hd, ff = (config[k] for k in names)
    shapes = {
        "embed_tokens.weight": (v, h),
        "lm_head.weight": (v, h),
        "fc.weight": (h, h * len(config["target_layer_ids"])),
        "markov_head.markov_w1.weight": (v, r),
        "markov_head.markov_w2.weight": (v, r),
        "confidence_head.proj.weight": (1, h + r),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (nh * hd, h),
            p + "self_attn.k_proj.weight": (nkv * hd, h),
            p + "self_attn.v_proj.weight": (nkv * hd, h),
            p + "self_attn.o_proj.weight": (h, nh * hd),
            p + "mlp.gate_proj.weight": (ff, h),
            p + "mlp.up_proj.weight": (ff, h),
            p + "mlp.down_proj.weight": (h, ff),
        }
    rng = np.random.default_rng(seed)
    weights = {k: (0.02 * rng.standard_normal(shapes[k], dtype=np.float32)) for k in sorted(shapes)}
    ones = {"hidden_norm.weight": h, "norm.weight": h}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        ones |= {p + "input_layernorm.weight": h, p + "post_attention_layernorm.weight": h}
        ones |= {p + "self_attn.q_norm.weight": hd, p + "self_attn.k_norm.weight": hd}
    weights |= {k: np.ones((n,), np.float32) for k, n in ones.items()}
    weights["confidence_head.proj.bias"] = np.zeros((1,), np.float32)
    return {k: mx.array(w) for k, w in weights.items()}


def make_twin(folder):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TWIN, indent=1))
    mx.save_safetensors(str(folder / "model.safetensors"), twin_weights(TWIN))
    return folder


def encode(tokenizer, spec):
    """(rendered_prompt, prompt_ids) as mlx-lm's generate builds them (examples/stdio-client)."""
    if spec["kind"] == "plain":
        return None, tokenizer.encode(spec["prompt"], add_special_tokens=True)
    rendered = tokenizer.apply_chat_template(
        spec["messages"], tokenize=False, add_generation_prompt=True, **(spec.get("template_kwargs") or {})
    )
    return rendered, tokenizer.encode(rendered, add_special_tokens=False)


class DSpark:
    def __init__(self, mode):
        if mode not in ("random", "bigram"):
            raise ValueError(f"twin mode {mode!r}: random or bigram")
        self.mode = mode
        versions = {d: importlib.metadata.version(d) for d in ("dspark-mlx", "mlx-lm")}
        self.info = {
            "name": "dspark-mlx",
            "version": versions["dspark-mlx"],
            "produces": "llm",
            "serves": ["free"],  # its loop picks every token: no teacher-forced run (plugins/host.py)
            "environment": versions
            | {"adapter": "examples/dspark/adapter.py", "drafter": f"{mode} twin (qwen3 drafter, seed {SEED})"},
        }

    def load(self, model_dir):
        from dspark_mlx import load_draft
        from dspark_mlx.hosts import MlxLmHostAdapter
        from mlx_lm.utils import load

        twin = make_twin(Path.cwd() / "dspark-twin")
        self.drafter, config = load_draft(str(twin))  # a local folder: no hub
        self.model, self.tokenizer = load(str(model_dir))

        class Watched(MlxLmHostAdapter):
            """dspark's host adapter, keeping the rows of its last verify forward (float32)."""

            def verify_forward(self, block_tokens):
                out = super().verify_forward(block_tokens)
                self.rows = np.array(out.per_pos_logits[0].astype(mx.float32))
                self.verifies += 1
                return out

        self.host = Watched(self.model, config["target_layer_ids"])
        self.host.verifies = 0

    def base_greedy(self, prompt_ids, n):
        """dspark's own base greedy (its cli's `_base_greedy`): prefill, then decode_step per token."""
        self.host.reset()
        step = self.host.prefill(mx.array([prompt_ids], dtype=mx.int32))
        out = []
        while True:
            out.append(int(mx.argmax(step.logits[0].astype(mx.float32)).item()))
            if len(out) == n:
                return out
            step = self.host.decode_step(mx.array([out[-1]], dtype=mx.int32))

    def set_bigrams(self, sequence):
        """Rewrite the twin's Markov head: token -> its first successor in `sequence`, bias 100."""
        rank = self.drafter.args.markov_rank
        vocab = self.drafter.args.vocab_size
        w1 = np.zeros((vocab, rank), np.float32)
        w2 = np.zeros((vocab, rank), np.float32)
        slots = {}
        for prev, nxt in zip(sequence, sequence[1:], strict=False):
            if prev in slots or len(slots) == rank:
                continue
            slots[prev] = len(slots)
            w1[prev, slots[prev]] = 1.0
            w2[nxt, slots[prev]] = 100.0
        head = self.drafter.markov_head
        head.markov_w1.weight = mx.array(w1)
        head.markov_w2.weight = mx.array(w2)
        mx.eval(head.parameters())

    def run(self, spec, forced, decode):
        from dspark_mlx import SummaryEvent, TokenEvent, generate_eager

        if forced is not None:
            raise ValueError("teacher-forced runs: dspark's speculative loop chooses its own tokens (free runs only)")
        if decode != "eager":
            raise ValueError(f"decode {decode!r}: only dspark's eager loop runs here")
        unknown = [key for key, value in spec.items() if key not in RUNS and value is not None]
        if unknown or spec.get("kind") not in ("plain", "chat"):
            what = ", ".join(unknown) or f"kind {spec.get('kind')!r}"
            raise ValueError(f"this adapter runs plain and chat scenarios only: {what}")
        n = spec["n_tokens"]
        rendered, prompt_ids = encode(self.tokenizer, spec)
        if self.mode == "bigram":
            self.set_bigrams([prompt_ids[-1], *self.base_greedy(prompt_ids, n)])

        self.host.reset()
        self.drafter.reset()
        tokens, rows, summary, at, block = [], [], None, 0, None
        for event in generate_eager(self.host, self.drafter, [prompt_ids], max_new_tokens=n, eos_id=None):
            if isinstance(event, SummaryEvent):
                summary = event
                continue
            assert isinstance(event, TokenEvent)
            if block != self.host.verifies:  # the first token of a new verify pass: its row 0
                block, at = self.host.verifies, 0
            tokens.append(event.token)
            rows.append(self.host.rows[at])
            at += 1
        said = f"dspark {spec['id']}: {self.mode} twin, {summary.n_accepted} of {summary.n_drafted} drafts accepted"
        print(said, file=sys.stderr, flush=True)
        if os.environ.get("DSPARK_STATS"):  # the harness keeps no stderr of a run that succeeds
            with open(os.environ["DSPARK_STATS"], "a") as f:
                f.write(said + "\n")
        if len(tokens) != n:
            raise RuntimeError(f"expected {n} tokens, dspark emitted {len(tokens)}")
        return {
            "rendered_prompt": rendered,
            "prompt_ids": [int(i) for i in prompt_ids],
            "tokens": tokens,
            "eos_ids": sorted(int(i) for i in self.tokenizer.eos_token_ids),
            "dspark": {
                "twin": self.mode,
                "n_drafted": summary.n_drafted,
                "n_accepted": summary.n_accepted,
                "acceptance_rate": summary.acceptance_rate,
            },
            "logits": np.stack(rows),
        }


def random_twin():
    return DSpark("random")


def bigram_twin():
    return DSpark("bigram")
