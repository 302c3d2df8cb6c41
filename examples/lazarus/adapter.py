"""chuk-lazarus 0.4.1 (PyPI) as a Python implementation served by plugins/host.py (docs/protocol.md,
docs/external.md): its own pure-MLX Llama (chuk_lazarus.models_v2.families.llama: hand-written
RMSNorm, GQA with repeated KV heads over mx.fast.scaled_dot_product_attention and an additive
causal mask, nn.RoPE, SwiGLU, a tied or untied LM head), loaded and driven by its own inference
API the way `UnifiedPipeline.generate` / `inference.generation.generate` run it:

- load: `UnifiedPipeline.from_pretrained(model_dir, UnifiedPipelineConfig(dtype=FLOAT32))` (its
  default is bfloat16; the artifact is float32, as mlx-lm runs it);
- prompt: a plain prompt as `generate` encodes it, `tokenizer.encode(prompt)` (special tokens
  added); a chat scenario rendered by its `format_history` (the tokenizer's chat template) and
  encoded the same way (that is what `UnifiedPipeline.chat` hands `generate`);
- decode: `LlamaForCausalLM.generate(input_ids, max_new_tokens=n, temperature=0.0, stop_tokens=[])`
  (greedy; no stop, as the harness decodes every step), with a tap on the model's calls keeping the
  raw last-position logits of each (the prompt in one call, then one call per token, the last a
  look-ahead `generate` never reads);
- teacher forcing (chuk-lazarus has none): the same calls, `model(ids)` then
  `model(token, cache=cache)`, fed the golden's tokens.
"""

import importlib.metadata

import numpy as np

RUNS = {"id", "kind", "prompt", "messages", "n_tokens", "prefill_step_size", "template_kwargs"}


class Lazarus:
    def __init__(self):
        version = importlib.metadata.version("chuk-lazarus")
        self.info = {
            "name": "chuk-lazarus",
            "version": version,
            "produces": "llm",
            "environment": {
                "chuk-lazarus": version,
                "transformers": importlib.metadata.version("transformers"),
                "adapter": "examples/lazarus/adapter.py",
            },
            # Module taps (docs/protocol.md, taps): its modules under the oracle's names (its
            # LlamaForCausalLM is laid out as mlx-lm's Llama), and its LM head's output as the
            # logits that tell which call made a row.
            "taps": {
                "model.embed_tokens": "model.embed_tokens",
                "model.layers.{i}.input_layernorm": "model.layers.{i}.input_layernorm",
                "model.layers.{i}.self_attn": "model.layers.{i}.self_attn",
                "model.layers.{i}.post_attention_layernorm": "model.layers.{i}.post_attention_layernorm",
                "model.layers.{i}.mlp": "model.layers.{i}.mlp",
                "model.layers.{i}": "model.layers.{i}",
                "model.norm": "model.norm",
                "logits": "lm_head",
            },
        }

    def load(self, model_dir):
        from chuk_lazarus.inference.loader import DType
        from chuk_lazarus.inference.unified import UnifiedPipeline, UnifiedPipelineConfig

        self.pipeline = UnifiedPipeline.from_pretrained(
            str(model_dir), UnifiedPipelineConfig(dtype=DType.FLOAT32), verbose=False
        )
        self.model, self.tokenizer = self.pipeline.model, self.pipeline.tokenizer

    def encode(self, spec):
        from chuk_lazarus.inference.chat import ChatHistory, ChatMessage, Role, format_history

        if spec.get("template_kwargs"):
            raise ValueError("chuk-lazarus's format_history takes no chat-template options")
        if spec["kind"] == "plain":
            rendered, text = None, spec["prompt"]
        elif spec["kind"] == "chat":
            history = ChatHistory()
            for m in spec["messages"]:
                if m["role"] == "system":
                    history.add_system(m["content"])
                else:
                    history.messages.append(ChatMessage(role=Role(m["role"]), content=m["content"]))
            rendered = text = format_history(self.tokenizer, history)
        else:
            raise ValueError(f"kind {spec['kind']!r}: this adapter runs plain and chat scenarios")
        ids = self.tokenizer.encode(text, return_tensors="np")  # inference.generation.generate's encoding
        return rendered, [int(i) for i in ids[0]]

    def run(self, spec, forced, decode):
        import mlx.core as mx

        if decode != "eager":
            raise ValueError(f"decode {decode!r}: chuk-lazarus has one (eager) decode")
        extra = sorted(k for k, v in spec.items() if k not in RUNS and v is not None)
        if extra:
            raise ValueError(f"this adapter runs plain and chat scenarios only, not {extra}")
        n = spec["n_tokens"]
        rendered, prompt_ids = self.encode(spec)
        model = self.model
        rows = []
        cls = type(model)
        call = cls.__call__

        def tapped(self_, *args, **kwargs):  # every forward of this model: keep its last row
            out = call(self_, *args, **kwargs)
            rows.append(out.logits[:, -1, :])
            return out

        cls.__call__ = tapped
        try:
            ids = mx.array([prompt_ids])
            if forced is None:
                out = model.generate(ids, max_new_tokens=n, temperature=0.0, stop_tokens=[])
                tokens = [int(t) for t in np.array(out[0, len(prompt_ids) :])]
            else:
                tokens = [int(t) for t in forced["tokens"]]
                output = model(ids)
                for t in tokens[:-1]:
                    output = model(mx.array([[t]]), cache=output.cache)
        finally:
            cls.__call__ = call
        logits = mx.concatenate(rows[:n], axis=0).astype(mx.float32)  # the look-ahead row dropped
        if len(tokens) != n or logits.shape[0] != n:
            raise RuntimeError(f"expected {n} tokens and rows, got {len(tokens)} and {logits.shape[0]}")
        from chuk_lazarus.inference.generation import get_stop_tokens

        return {
            "rendered_prompt": rendered,
            "prompt_ids": prompt_ids,
            "tokens": tokens,
            "eos_ids": sorted(set(get_stop_tokens(self.tokenizer))),
            "logits": np.array(logits),
        }


def lazarus():
    return Lazarus()
