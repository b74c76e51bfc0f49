"""A tokenizer the project trains itself, for models built from scratch (the laptop recipe).

Byte-level BPE (``tokenizers``) trained on the task's own text: the ChatML renderings of
scripted episodes, so the chat scaffolding, the prompts and the ``spawn_clone`` tool-call text
become a handful of tokens each. Digits are always single tokens (numbers are spelled digit by
digit, which small models learn arithmetic on far more easily), a line break is always a token of
its own (so a message's content is tokenized the same inside a rendered conversation as on its
own: what the model samples is what the env re-renders), and the byte-level alphabet keeps every
text encodable and decoding exact. Special tokens: ``<|im_start|>`` and
``<|im_end|>`` (end of turn, ``eos_token`` and ``pad_token``).

The chat template is ChatML with every role the environment writes (``system``, ``user``,
``assistant`` and ``tool``, the latter carrying the clones' ``label: answer`` lines); tool
definitions are not rendered: the ``spawn_clone`` call format is taught by the root's system
prompt and written by the model as plain text, and leaving them out keeps the ledger's count of
a prompt (which renders messages only) equal to what the model reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from selfcest_env.trace import EpisodeTrace, as_episode_trace

END_OF_TURN = "<|im_end|>"
START_OF_TURN = "<|im_start|>"

#: ChatML for every role; a generation prompt opens an assistant turn.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _wrap(backend: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=START_OF_TURN,
        eos_token=END_OF_TURN,
        pad_token=END_OF_TURN,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def _empty_backend() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def render_conversations(traces: Iterable[EpisodeTrace | dict[str, Any]]) -> list[str]:
    """Every context of every trace (typed or ``info["trace"]``) rendered with
    :data:`CHATML_TEMPLATE` (no generation prompt): the text a tokenizer for these episodes
    should compress."""
    renderer = _wrap(_empty_backend())
    return [
        renderer.apply_chat_template(list(context.messages), tokenize=False)
        for trace in traces
        for context in as_episode_trace(trace).contexts
    ]


def train_chat_tokenizer(texts: Sequence[str], vocab_size: int) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts``, with the ChatML
    template and special tokens of the module docstring.

    Raises:
        ValueError: ``vocab_size`` is too small for the byte alphabet and the special tokens.
    """
    from tokenizers import pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 2:
        raise ValueError(
            f"vocab_size must be at least {len(alphabet) + 2} (bytes and special tokens), "
            f"got {vocab_size}"
        )
    backend = _empty_backend()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[START_OF_TURN, END_OF_TURN],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    # Encoding splits the special tokens off before the pre-tokenizer; training must see the
    # same pieces, or its merges would span the special tokens' bytes and never apply.
    specials = re.compile(f"{re.escape(START_OF_TURN)}|{re.escape(END_OF_TURN)}")
    pieces = [piece for text in texts for piece in specials.split(text) if piece]
    backend.train_from_iterator(pieces, trainer)
    return _wrap(backend)
