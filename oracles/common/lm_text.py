"""What mlx-lm streams as text for generated tokens: its streaming detokenizer driven the way
`stream_generate` drives it, and the tokenizer's full decode.

For the mlx-lm and mlx-optiq oracle venvs (an mlx-lm TokenizerWrapper); loaded by
`import lm_text` from oracles/common, imports nothing but the stdlib.
"""


def stream_pieces(tokenizer, tokens, stop_ids=()):
    """stream_generate's `text` for a run of exactly these tokens, one piece a token.

    A fresh `tokenizer.detokenizer` (a reset copy); each token is added and `last_segment` read,
    except the last token, whose piece is read after `finalize()`; a token in `stop_ids` (EOS,
    for a scenario that stops there) is never added: the run ends and its piece is the flush.
    """
    detokenizer = tokenizer.detokenizer
    stop = set(stop_ids)
    pieces = []
    for n, token in enumerate(tokens):
        if token in stop:
            break
        detokenizer.add_token(token)
        if n + 1 == len(tokens):
            break
        pieces.append(detokenizer.last_segment)
    detokenizer.finalize()
    pieces.append(detokenizer.last_segment)
    return pieces


def segment_tokens(meta):
    """A record's tokens per segment: its turns or batch rows (row_offset, n_steps), else one."""
    tokens = meta["tokens"]
    for key in ("turns", "rows"):
        if key in meta:
            return [tokens[s["row_offset"] : s["row_offset"] + s["n_steps"]] for s in meta[key]]
    return [tokens]


def stream_text(tokenizer, meta, stop_ids=()):
    """Per segment of a record (the run, a turn, a batch row): {"pieces", "decoded"}, `decoded`
    being the tokenizer's decode of the tokens the detokenizer was given."""
    stop = set(stop_ids)
    out = []
    for tokens in segment_tokens(meta):
        tokens = [int(t) for t in tokens]
        fed = next((i for i, t in enumerate(tokens) if t in stop), len(tokens))
        out.append({"pieces": stream_pieces(tokenizer, tokens, stop), "decoded": tokenizer.decode(tokens[:fed])})
    return {"stream_text": out}
