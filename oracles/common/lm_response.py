"""mlx-lm's server split of a token stream into OpenAI-style `reasoning`, `content` and
`tool_calls`, for the `response` check (issue 17), driven through the server's own code.

What runs is mlx-lm's, unedited:
- `ResponseGenerator._tokenize` renders the request (messages + tools + the scenario's template
  options) and derives the initial state from the prompt (inside a think block or not);
- `ResponseGenerator._make_state_machine` builds the stop sequences and the TextStateMachine
  (think markers, the tool parser's call markers);
- `ResponseGenerator._serve_single` runs `stream_generate` (the streaming detokenizer, the EOS
  stop, max_tokens) on a fresh prompt cache and queues its `Response` objects;
- `APIHandler.handle_completion` splits them into chunks (streaming) or one message
  (non-streaming) with the ToolCallFormatter and the tokenizer's tool parser (minicpm5 here).

Only the plumbing around them is stubbed: no HTTP server or socket (the handler writes to a
BytesIO, its header methods do nothing), no generation thread (the queue is filled first,
then read), a model provider holding the loaded model. Forced sequences are made the model's
greedy choices by a proxy that keeps only the forced token's logit at the step it predicts
(the model still runs, the cache still fills). Tool-call ids (uuid4) and the response's id,
timestamp and fingerprint are dropped from what is recorded; everything else is kept.

What the state machine did is recorded too (`moves`, from the streaming run): every piece of
text on which `TextStateMachine.split` changed state, with the text it held from earlier pieces
and the (state, text) segments it returned. The harness reads from it which transitions (and
which marker boundaries) a scenario walked (harness/checks/exercise.py); nothing compares it.
"""

import io
import json
from queue import Queue
from types import SimpleNamespace

import mlx.core as mx
from mlx_lm import server
from mlx_lm.generate import TextStateMachine, generation_stream
from mlx_lm.models.cache import LRUPromptCache


class ForcingModel:
    """The model, with the logits of the position that predicts generated token k replaced by
    a one-hot (0 at forced[k], -inf elsewhere) while k < len(forced)."""

    def __init__(self, model, prompt_length, forced):
        self._model, self._prompt_length, self._forced, self._fed = model, prompt_length, forced, 0

    def __call__(self, inputs, *args, **kwargs):
        out = self._model(inputs, *args, **kwargs)
        self._fed += inputs.shape[1]
        k = self._fed - self._prompt_length
        if self._forced is None or not 0 <= k < len(self._forced):
            return out
        keep = mx.arange(out.shape[-1]) == self._forced[k]
        last = mx.where(keep, mx.array(0.0, out.dtype), mx.array(-float("inf"), out.dtype))
        return mx.concatenate([out[:, :-1, :], mx.broadcast_to(last, out[:, -1:, :].shape)], axis=1)

    def __getattr__(self, name):
        return getattr(self._model, name)


def _arguments(max_tokens, chat_template_kwargs):
    return server.GenerationArguments(
        model=server.ModelDescription(model="default_model", draft=None, adapter=None),
        sampling=server.SamplingArguments(
            temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, xtc_probability=0.0, xtc_threshold=0.0
        ),
        logits=server.LogitsProcessorArguments(
            logit_bias=None,
            repetition_penalty=0.0,
            repetition_context_size=20,
            presence_penalty=0.0,
            presence_context_size=20,
            frequency_penalty=0.0,
            frequency_context_size=20,
        ),
        stop_words=[],
        max_tokens=max_tokens,
        num_draft_tokens=3,
        logprobs=False,
        top_logprobs=0,
        seed=None,
        chat_template_kwargs=chat_template_kwargs,
    )


class _Generator:
    """ResponseGenerator's state that _tokenize / _make_state_machine / _serve_single read."""

    def __init__(self, model, tokenizer, forced):
        self.forced = forced
        self.model_provider = SimpleNamespace(
            model=model,
            tokenizer=tokenizer,
            draft_model=None,
            model_key=("default_model", None, None),
            processor=None,
            cli_args=SimpleNamespace(
                chat_template_args={}, prefill_step_size=2048, kv_bits=None, kv_group_size=64, quantized_kv_start=0
            ),
        )
        self.cli_args = self.model_provider.cli_args
        self.prompt_cache = LRUPromptCache()
        self._state_machine_cache = {}
        self._is_distributed = False
        self.last_prompt = None

    def _log_cache_stats(self):
        pass

    def _tokenize(self, tokenizer, request, args):
        result = server.ResponseGenerator._tokenize(self, tokenizer, request, args)
        self.last_prompt, self.initial_state = result[0], result[3]
        return result

    def _make_state_machine(self, model_key, tokenizer, stop_words):
        return server.ResponseGenerator._make_state_machine(self, model_key, tokenizer, stop_words)

    def generate(self, request, args, progress_callback=None):
        # The prompt's length is known only after _tokenize: wrap the model lazily.
        prompt, *_ = server.ResponseGenerator._tokenize(self, self.model_provider.tokenizer, request, args)
        model = self.model_provider.model
        self.model_provider.model = ForcingModel(model, len(prompt), self.forced)
        queue = Queue()
        try:
            server.ResponseGenerator._serve_single(self, (queue, request, args), generation_stream)
        finally:
            self.model_provider.model = model
        items = []
        while not queue.empty():
            items.append(queue.get())
        errors = [i for i in items if isinstance(i, Exception)]
        if errors:
            raise errors[0]
        ctx = items[0]
        responses = [i for i in items[1:] if isinstance(i, server.Response)]
        self.streamed_tokens = [int(r.token) for r in responses]
        return ctx, iter(responses)


class _Moves:
    """TextStateMachine.split, watched: each call that changed state, as {"from", "held",
    "piece", "segments"} (the class attribute is put back on exit)."""

    def __enter__(self):
        self.moves, self._split = [], TextStateMachine.split
        split = self._split

        def watched(state, text):
            new, segments = split(state, text)
            if len(segments) > 1:
                self.moves.append(
                    {"from": state[0], "held": state[3], "piece": text, "segments": [list(s) for s in segments]}
                )
            return new, segments

        TextStateMachine.split = staticmethod(watched)
        return self

    def __exit__(self, *exc):
        TextStateMachine.split = staticmethod(self._split)


def _handler(generator, stream):
    handler = server.APIHandler.__new__(server.APIHandler)
    # The attributes mlx-lm's APIHandler sets from a request, at their request defaults (greedy).
    fields = {"requested_model": "default_model", "requested_draft_model": None, "adapter": None, "logit_bias": None}
    fields |= {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "xtc_probability": 0.0, "xtc_threshold": 0.0}
    fields |= {f"{kind}_penalty": 0.0 for kind in ("repetition", "presence", "frequency")}
    fields |= {"num_draft_tokens": 3, "logprobs": False, "top_logprobs": 0, "seed": None, "stream": stream}
    fields |= {f"{kind}_context_size": 20 for kind in ("repetition", "presence", "frequency")}
    fields |= {"stream_options": None, "response_generator": generator, "wfile": io.BytesIO(), "created": 0}
    kind = "chat.completion.chunk" if stream else "chat.completion"
    fields |= {"request_id": "chatcmpl-x", "object_type": kind, "system_fingerprint": "x"}
    for name, value in fields.items():
        setattr(handler, name, value)
    for name in ("_set_stream_headers", "_set_completion_headers", "send_header", "end_headers"):
        setattr(handler, name, lambda *a, **k: None)
    return handler


def _choice(response):
    """What the check compares of one response object: the choice without ids."""
    (choice,) = response["choices"]
    choice = dict(choice)
    choice.pop("index", None)
    for key in ("delta", "message"):
        if key in choice:
            body = dict(choice[key])
            if "tool_calls" in body:
                body["tool_calls"] = [{k: v for k, v in tc.items() if k != "id"} for tc in body["tool_calls"]]
            choice[key] = body
    if "usage" in response:
        choice["usage"] = {k: response["usage"][k] for k in ("prompt_tokens", "completion_tokens")}
    return choice


def serve(model, tokenizer, messages, template_kwargs, max_tokens, forced=None):
    """Streaming chunks and the non-streaming message for one request, as the server answers
    it; `forced` ids (or None: the model's greedy choices) are what is generated."""
    kwargs = {k: v for k, v in template_kwargs.items() if k != "tools"}
    request = server.CompletionRequest("chat", "", messages, template_kwargs.get("tools") or None, None)
    out = {}
    for stream in (True, False):
        generator = _Generator(model, tokenizer, forced)
        handler = _handler(generator, stream)
        handler.max_tokens = max_tokens
        handler.chat_template_kwargs = kwargs
        with _Moves() as moves:
            handler.handle_completion(request, [])
        if stream:
            out["moves"] = moves.moves
        written = handler.wfile.getvalue().decode("utf-8")
        if written.startswith('{"error"'):
            raise RuntimeError(f"the server answered {written}")
        if stream:
            lines = [line[len("data: ") :] for line in written.split("\n\n") if line.startswith("data: ")]
            if not lines or lines[-1] != "[DONE]":
                raise RuntimeError(f"streamed response does not end with [DONE]: {written[-200:]!r}")
            out["stream"] = [_choice(json.loads(line)) for line in lines[:-1]]
        else:
            out["whole"] = _choice(json.loads(written))
        out["prompt_ids"] = [int(t) for t in generator.last_prompt]
        out["initial_state"] = generator.initial_state
        out["tokens"] = generator.streamed_tokens
    return out


def response_record(model, tokenizer, scenario, prompt_ids, tokens):
    """The `response` meta of a scenario: the generated stream (checked to be the golden's
    tokens) and every forced text, each encoded here and sent as a forced sequence."""
    spec = scenario["response"]
    template_kwargs = scenario.get("template_kwargs", {})
    generated = serve(model, tokenizer, scenario["messages"], template_kwargs, scenario["n_tokens"])
    if generated["prompt_ids"] != [int(t) for t in prompt_ids]:
        raise RuntimeError("the server rendered another prompt than mlx-lm's generate for this scenario")
    if generated["tokens"] != [int(t) for t in tokens[: len(generated["tokens"])]]:
        raise RuntimeError(f"the server generated {generated['tokens']}, generate_step {list(tokens)}")
    record = {"generated": generated, "forced": []}
    for item in spec.get("forced", []):
        ids = [int(t) for t in tokenizer.encode(item["text"], add_special_tokens=False)]
        answer = serve(model, tokenizer, scenario["messages"], template_kwargs, len(ids), forced=ids)
        if answer["tokens"] != ids[: len(answer["tokens"])]:
            raise RuntimeError(f"forced {item['id']!r}: the server generated {answer['tokens']}, not {ids}")
        record["forced"].append({"id": item["id"], "text": item["text"], "ids": ids} | answer)
    for entry in [record["generated"], *record["forced"]]:
        entry.pop("prompt_ids")
    return record
