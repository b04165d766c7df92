"""Tokenizers: the real byte-level BPE rebuilt from the GGUF file, and a byte toy for tests."""
from __future__ import annotations

CONTROL_TOKEN_TYPE = 3  # gguf TokenType.CONTROL: special tokens such as <|im_start|>


class Tokenizer:
    """SmolLM2's byte-level BPE, built with the `tokenizers` library from the GGUF vocab/merges."""

    def __init__(self, backend, chat_template: str, eos_id: int, bos_id: int):
        self.backend = backend
        self.chat_template = chat_template
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.vocab_size = backend.get_vocab_size()

    @classmethod
    def from_gguf(cls, reader) -> "Tokenizer":
        """Build from a parsed GGUF file (gguf.GGUFReader)."""
        from tokenizers import AddedToken, Regex
        from tokenizers import Tokenizer as Backend
        from tokenizers import decoders, models, pre_tokenizers

        fields = reader.fields
        tokens = fields["tokenizer.ggml.tokens"].contents()
        types = fields["tokenizer.ggml.token_type"].contents()
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()]
        backend = Backend(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        # SmolLM2 splits digits one by one, then applies GPT-2's byte-level pre-tokenizer.
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, kind in zip(tokens, types) if kind == CONTROL_TOKEN_TYPE])
        return cls(backend, fields["tokenizer.chat_template"].contents(),
                   eos_id=fields["tokenizer.ggml.eos_token_id"].contents(),
                   bos_id=fields["tokenizer.ggml.bos_token_id"].contents())

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render messages ([{"role": "user", "content": "..."}]) with the GGUF's ChatML template."""
        from jinja2 import Template

        return Template(self.chat_template).render(messages=messages,
                                                   add_generation_prompt=add_generation_prompt)

    def chat_ids(self, prompt: str) -> list[int]:
        """Token ids of a one-turn chat, ending where the assistant's reply begins."""
        return self.encode(self.apply_chat_template([{"role": "user", "content": prompt}]))

    @property
    def stop_ids(self) -> list[int]:
        """Tokens that end a reply: <|endoftext|> and <|im_end|>."""
        return sorted({self.eos_id, self.backend.token_to_id("<|im_end|>")} - {None})


class ByteTokenizer:
    """One token per UTF-8 byte (vocab 256): the tokenizer of the tiny test model."""

    vocab_size = 256
    eos_id = 0
    stop_ids: list[int] = []

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def chat_ids(self, prompt: str) -> list[int]:
        return self.encode(prompt)
