"""The fixed English text the twins' BPE merges are trained on, written for this project.

Its only job is to give merges that cut ordinary prose, numbers, code, JSON, chat turns
and tool calls into pieces of several characters, so prompts are realistically long in
tokens and random-model output decodes to varied text. Any edit changes every twin's
vocabulary: bump TWIN_VERSION with it.
"""

from __future__ import annotations

CORPUS: list[str] = [
    """The harbour town woke slowly. Fishing boats came back before sunrise, and the market
opened at six with baskets of mackerel, crabs and bright green seaweed. By eight the
bakers had sold most of their bread, and the children were walking to school along the
sea wall, counting the gulls and arguing about whose turn it was to carry the ball.""",
    """In the afternoon the wind turned west and the sky filled with low grey clouds. The
ferry to the island left ten minutes late, carrying two vans, a tractor, a crate of
chickens and a group of walkers in bright jackets who wanted to reach the lighthouse
before dark. The captain, who had made the crossing for thirty years, said the sea would
be calm until the evening, and he was right, as he usually was.""",
    """A language model reads text as a sequence of tokens. Each token is a small piece of a
word, a whole word, a number or a mark of punctuation. The model predicts the next token
from the ones before it, one step at a time, and a sampler picks which token to keep.
Greedy decoding always keeps the most likely token; temperature sampling draws at random
from the distribution, and a lower temperature makes the likely tokens even likelier.""",
    """Every layer of a transformer mixes information between positions with attention and
then transforms each position on its own with a small feed-forward network. Queries,
keys and values are linear projections of the hidden state; grouped-query attention lets
several query heads share one key and value head, which shrinks the cache. Rotary
position embeddings rotate queries and keys by an angle that grows with the position.""",
    """Quantization stores each weight in a few bits instead of sixteen or thirty-two. With
affine quantization, a group of sixty-four consecutive weights shares one scale and one
bias, and every weight becomes a small integer between zero and fifteen when four bits
are used. The model is then four times smaller than in half precision, and the matrix
products read far less memory, which is what limits the speed of decoding on most
machines.""",
    """To check the weather, the assistant calls a function named get_weather with the
parameter city set to the name of the city and the parameter unit set to celsius or
fahrenheit. The tool returns a small JSON object such as {"temperature": 21, "condition":
"sunny", "wind_kph": 12}. The assistant then answers the user in one or two sentences,
for example: "It is sunny in Paris, 21 degrees, with a light wind from the west." """,
    """A search tool takes a query and returns a list of results, each with a title, a link
and a short snippet. A calculator takes an expression such as (3 + 4) * 12 / 2 and
returns the value 42. A file tool reads or writes a path such as /home/user/notes.txt.
When a request needs several tools, the assistant calls them one after another, reads
each response, and only then writes the final answer for the user.""",
    """Think before you answer. First restate the question, then list what you know, then
work through the steps in order, and check each result before you use it. When the
question is simple, answer directly; when it is hard, write down the reasoning, compare
two approaches and keep the one that explains every fact without extra assumptions.
If something is unknown, say so plainly instead of guessing.""",
    """def greedy_decode(model, prompt, steps):
    tokens = list(prompt)
    cache = model.make_cache()
    for step in range(steps):
        logits = model(tokens[-1:] if step else tokens, cache=cache)
        next_token = int(logits[-1].argmax())
        if next_token in model.eos_token_ids:
            break
        tokens.append(next_token)
    return tokens
""",
    """class Message:
    def __init__(self, role: str, content: str) -> None:
        self.role = role
        self.content = content

    def to_dict(self) -> dict:
        return {"role": self.role, "content": self.content}
""",
    """{"name": "get_weather", "description": "Get the current weather in a city",
"parameters": {"type": "object", "properties": {"city": {"type": "string",
"description": "The name of the city"}, "unit": {"type": "string", "enum": ["celsius",
"fahrenheit"]}}, "required": ["city"]}}""",
    """The system message sets the rules of the conversation. The user asks; the assistant
replies; a tool message carries the result of a function call back to the model. In a
long session the history grows with every turn, and the cache keeps the keys and values
of earlier tokens so that each new step only computes attention for the latest token.
When the conversation ends, the assistant writes an end token and generation stops.""",
    """Numbers appear everywhere: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 32, 64, 128, 256,
512, 1024, 2048, 4096, 6144 and 130560. Dates such as 2026-09-10 and times such as 07:45
are common too, as are prices like 3.50 euros, percentages like 99.5% and measurements
like 21 degrees, 12 km/h, 1.5 GB or 5000000 hertz.""",
    """The garden behind the library is quiet in the morning. An old gardener waters the
roses, pulls weeds from between the stones and talks to the blackbirds that follow him
along the path. Students sit on the benches with their books open and their coffee
cooling beside them, and sometimes one of them looks up, watches the gardener for a
while, and forgets for a moment what the chapter was about.""",
    """Good tests are small, fast and specific. Each one checks a single behaviour, fails
with a message that says what went wrong, and would fail if that behaviour broke. A test
that builds the same artifact twice and compares every byte catches hidden randomness;
a test that changes one number in a configuration and expects a different answer
catches a check that was written too loosely.""",
    """Recipe for a simple soup: chop two onions, three carrots and a stick of celery. Warm
a spoon of olive oil in a large pot, cook the vegetables for ten minutes, add a litre of
stock and a tin of tomatoes, and simmer for twenty minutes. Season with salt, pepper and
a little thyme, blend until smooth, and serve with fresh bread.""",
]
