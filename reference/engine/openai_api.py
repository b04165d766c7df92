"""The OpenAI API's wire format: request bodies (pydantic), errors, response and stream chunks.

Errors are OpenAI-shaped JSON, `{"error": {"message", "type", "param", "code"}}`. Streams are
server-sent events: one `data: {json}` line and a blank line per chunk, then `data: [DONE]`.
"""
from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict

from reference.engine.engine_loop import Progress


class IncrementalText:
    """Stream a request's text as deltas. The engine decodes the whole token list at every step
    (RequestOutput.text); this emits the new suffix, holding back what can still change: an
    incomplete UTF-8 character at the end (decoded as U+FFFD) and the last
    len(longest stop string) - 1 characters, which may begin a stop string the engine will cut.
    """

    def __init__(self, stop: list[str]):
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.sent = ""

    def delta(self, progress: Progress) -> str:
        text = progress.text
        if not progress.finished:
            text = text.rstrip("\ufffd")
            text = text[:max(len(text) - self.hold, 0)]
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        new, self.sent = text[len(self.sent):], text
        return new


class APIError(Exception):
    """An error answered as OpenAI-shaped JSON."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code}}


class Strict(BaseModel):
    """No silent conversions: "16" or true is not an int (an int is still a float)."""
    model_config = ConfigDict(strict=True)


class StreamOptions(Strict):
    include_usage: bool = False


class SamplingFields(Strict):
    """Fields shared by both endpoints (top_k is an extension: pass it in extra_body)."""
    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int]
    max_tokens: int = 16


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def turn(self) -> dict:
        """{"role", "content"} with the content as one string."""
        content = self.content if isinstance(self.content, str) else "".join(
            part.text for part in self.content)
        return {"role": self.role, "content": content}


class ChatRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


FIELD_NAMES = {name for model in (CompletionRequest, ChatRequest, ChatMessage, TextPart,
                                   StreamOptions) for name in model.model_fields}


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """(one-line message, field path) for pydantic's errors about a request body.

    A value that fits none of a field's types gives one error per type, each with the type's name
    in its location (where a field name or a list index would be): those become
    "prompt: should be str or list[int], got 12".
    """
    def path(error):
        return [str(part) for part in error["loc"] if part != "body"]

    def is_type_name(part):
        return not part.isdigit() and part not in FIELD_NAMES

    if errors[0]["type"] == "json_invalid":
        return (f"the body is not valid JSON: {errors[0]['ctx']['error']} "
                f"(at character {errors[0]['loc'][-1]})"), None
    first = path(errors[0])
    if not first:
        return "the body must be a JSON object", None
    for depth in range(len(first)):
        alike = [path(e) for e in errors if path(e)[:depth] == first[:depth]]
        kinds = list(dict.fromkeys(p[depth] for p in alike if len(p) > depth))
        if len(kinds) > 1 and all(map(is_type_name, kinds)):
            field = ".".join(first[:depth])
            return f"{field}: should be {' or '.join(kinds)}, got {errors[0]['input']!r}", field
    field = ".".join(first)
    return f"{field}: {errors[0]['msg']}", field


def chat_prompt(tokenizer, turns: list[dict]) -> list[int]:
    """Token ids of the turns ({"role", "content"}) in the model's chat template, ending where
    the assistant's reply begins. A tokenizer without a template (the tiny model's bytes) gets
    plain `role: content` lines.
    """
    if hasattr(tokenizer, "apply_chat_template"):
        return tokenizer.encode(tokenizer.apply_chat_template(turns))
    return tokenizer.encode("".join(f"{t['role']}: {t['content']}\n" for t in turns) + "assistant: ")


class CompletionShape:
    whole, chunk, text_key, first_delta = "text_completion", "text_completion", "text", None

    @staticmethod
    def choice(text: str, finish_reason: str | None) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def delta_choice(self, delta: dict, finish_reason: str | None) -> dict:
        return self.choice(delta.get("text", ""), finish_reason)


class ChatShape:
    whole, chunk, text_key = "chat.completion", "chat.completion.chunk", "content"
    first_delta = {"role": "assistant", "content": ""}

    @staticmethod
    def choice(text: str, finish_reason: str | None) -> dict:
        return {"index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": finish_reason}

    @staticmethod
    def delta_choice(delta: dict, finish_reason: str | None) -> dict:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def usage(progress: Progress) -> dict:
    return {"prompt_tokens": progress.prompt_tokens, "completion_tokens": len(progress.token_ids),
            "total_tokens": progress.prompt_tokens + len(progress.token_ids)}


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
