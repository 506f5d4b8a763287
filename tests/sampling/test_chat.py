"""agentrl.sampling.chat: ``ChatTokenizer.delta_ids``, the tokens the chat template adds between the
model's reply and the env's next messages, begin with the template's end-of-turn token when the model
stopped on another EOS or was cut by the length cap."""

from __future__ import annotations

from agentrl.sampling.chat import ChatTokenizer


def test_an_eos_that_is_not_the_end_of_turn_token_keeps_the_run_going(tokenizer):
    chat = ChatTokenizer(tokenizer)
    endoftext, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    assert (endoftext, im_end) == (0, 2)
    history = [{"role": "user", "content": "What is 2 + 3?"}]
    content = chat.encode("5")
    assistant = {"role": "assistant", "content": "5"}
    reply = [{"role": "user", "content": "Sure?"}]
    usual = chat.delta_ids(history, content + [im_end], assistant, reply, stopped=True)
    after = chat.render(history + [assistant] + reply, add_generation_prompt=True)
    before = chat.render(history, add_generation_prompt=True)
    assert chat.decode(usual) == after[len(before) + len("5<|im_end|>") :]  # as before: the stop token closes the turn
    other = chat.delta_ids(history, content + [endoftext], assistant, reply, stopped=True)
    assert other[0] == im_end  # the template's end-of-turn joins the env delta
    assert chat.decode(other) == "<|im_end|>" + chat.decode(usual)
    cut = chat.delta_ids(history, content, assistant, reply, stopped=False)  # length cap: no stop token
    assert cut == other
