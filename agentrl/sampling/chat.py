"""Token-exact conversations: the first prompt, then chat-template deltas after each model turn.

The model's sampled ids are never decoded and re-encoded into the training sequence. After a
turn, the conversation is rendered with the chat template twice (before and after the new
messages); the text the new rendering adds after the sampled tokens is the env delta, encoded on
its own and masked out of the loss. The delta starts right after the sampled stop token, so the
template's separator after it (``\\n`` for ChatML) belongs to the env (loss mask 0) while the stop
token itself belongs to the model (loss mask 1).

The prefix property (rendering a longer conversation only appends text) is checked at every
turn; a template that breaks it raises TemplateError instead of silently training on text the
model never saw.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from agentrl.errors import TemplateError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Message = dict[str, Any]


class ChatTokenizer:
    """Renders conversations with a tokenizer's chat template and computes env deltas as ids."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
                "multi-turn rollouts need one"
            )
        self.tokenizer = tokenizer

    def render(
        self, messages: list[Message], add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None
    ) -> str:
        """The template's text for ``messages`` (with ``tools=`` schemas when given)."""
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return str(text)

    @cached_property
    def renders_tools(self) -> bool:
        """Whether the template renders ``tools=`` (SmolLM2's ignores it; Qwen2.5's does not)."""
        probe = [
            {
                "type": "function",
                "function": {
                    "name": "agentrl_probe_tool",
                    "description": "probe",
                    "parameters": {"type": "object", "properties": {}, "required": []},
                },
            }
        ]
        messages = [{"role": "user", "content": "hi"}]
        return self.render(messages, True, tools=probe) != self.render(messages, True)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` with no special tokens added (the template wrote them as text)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens kept, no whitespace clean-up (lossless for ByteBPE)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def prompt_ids(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Ids of the opening prompt, ending with the assistant header."""
        return self.encode(self.render(messages, add_generation_prompt=True, tools=tools))

    def assistant_text(self, sampled_ids: list[int], stopped: bool) -> str:
        """The assistant message content for ``sampled_ids`` (the stop token, if any, removed)."""
        ids = sampled_ids[:-1] if stopped and sampled_ids else sampled_ids
        return self.decode(ids)

    def delta_ids(
        self,
        history: list[Message],
        sampled_ids: list[int],
        assistant: Message,
        new_messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        stopped: bool = False,
    ) -> list[int]:
        """Ids the env adds after the model's turn: from just after the sampled tokens up to the
        next assistant header.

        ``history`` is the conversation before the model's turn, ``sampled_ids`` what the model
        sampled (ending with its stop token when ``stopped``), ``assistant`` the message the turn
        became, ``new_messages`` what the env answered, ``tools`` the schemas the conversation is
        rendered with. The template renders the assistant's content and then closes the turn its
        own way: when that closing text starts with the sampled stop token (``<|im_end|>`` for
        ChatML) the stop token stands for it; when the model stopped with another end-of-sequence
        token (Qwen2.5's ``<|endoftext|>``), the sampled token stays the model's and the template's
        closing text joins the delta. A turn cut by the length cap has no stop token: the
        template's closing text is all delta.
        """
        content_ids = sampled_ids[:-1] if stopped and sampled_ids else sampled_ids
        stop_text = self.decode(sampled_ids[-1:]) if stopped and sampled_ids else ""
        before = self.render(history, add_generation_prompt=True, tools=tools)
        after = self.render(history + [assistant] + new_messages, add_generation_prompt=True, tools=tools)
        expected_prefix = before + self.decode(content_ids)
        if not after.startswith(expected_prefix):
            where = _first_difference(after, expected_prefix)
            raise TemplateError(
                "chat template is not prefix-preserving: rendering the conversation after the "
                f"model's turn does not start with the tokens the model saw and sampled (first "
                f"difference at character {where}: {after[where : where + 40]!r} vs "
                f"{expected_prefix[where : where + 40]!r}). Use a template that only appends, or a "
                "single-turn env."
            )
        delta = after[len(expected_prefix) :]
        if stop_text and delta.startswith(stop_text):
            delta = delta[len(stop_text) :]  # the sampled stop token already closes the turn
        return self.encode(delta)


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))
