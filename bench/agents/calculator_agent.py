"""The ``calculator`` env's task written as an OpenAI-client agent program (the env-vs-agent learning comparison).

The same conversation the env builds: its instructions as the system message (the endpoint adds
the tool description, as the env does for a template that does not render tools), its two worked
examples, the question; then up to the env's 4 turns, each tool call run with the env's own
calculator. The run's env scores the final answer (``plugins.openai_agent.env_scores``)::

    agentrl train --env calculator --set rollout=openai_agent \\
        --set plugins.openai_agent.agent=bench/agents/calculator_agent.py:solve
"""

import json

from agentrl_tool_envs import CalculatorEnv, calculator

TOOLS = [tool.schema for tool in CalculatorEnv.tools]  # the env's own schema (its docstring's description)
MAX_TURNS = 4


def solve(task, client):
    messages = [{"role": "system", "content": CalculatorEnv.instructions}]
    for example in CalculatorEnv.demonstrations:
        messages += [dict(m) for m in example]
    messages.append({"role": "user", "content": task["question"]})
    for _ in range(MAX_TURNS):
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except Exception as exc:  # the env answers a bad call with its error, so does the agent
                result = f"Error: {type(exc).__name__}: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "name": "calculator", "content": result})
    return messages
