"""The tool-calling loop every role runs, and the messages that open a role's turn.

Mistakes the model makes (unknown tool, bad arguments, a tool that failed on its input, a
reply whose tool call cannot be parsed, more tool calls in one reply than
``MAX_TOOL_CALLS_PER_REPLY``) go back to it as a message saying what to do next; the loop is
bounded in turns and in tool calls per turn. A provider that fails (timeout, HTTP error, unreadable reply) ends the
run with one ``TrainwrightError`` from ``agents.chat_models.provider_error``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool
from pydantic import ValidationError

from agents.chat_models import provider_error
from prompts import load_prompts
from tools.core.errors import InputError, TrainwrightError
from tools.core.outputs import OutputRefused
from tools.core.untrusted import MAX_LLM_TEXT, cap_text

# The most tool calls of one reply that run (valid and malformed ones together); a role has
# at most a handful of tools, so more in one reply is a runaway model. The rest are not run,
# not kept in the conversation, and the model is told so.
MAX_TOOL_CALLS_PER_REPLY = 8


def role_messages(
    role: str,
    task: str,
    *,
    brief: dict[str, Any] | None = None,
    context: dict[str, Any] | None = None,
) -> list[BaseMessage]:
    """The system message (role, goal, backstory) and the task message for one role."""
    agents, tasks = load_prompts()
    spec = agents[role]
    t = tasks[task]
    system = (
        f"You are the {spec['role']}.\nGoal: {' '.join(spec['goal'].split())}\n"
        f"Backstory: {' '.join(spec['backstory'].split())}\n"
        "Use your tools for every fact and number; never state a number a tool did not give you. "
        "When you have what you need, answer in a few sentences without calling tools."
    )
    desc = t["description"].format(
        brief=json.dumps(brief or {}, indent=2, default=str),
        context=json.dumps(context or {}, indent=2, default=str),
    )
    human = f"{desc}\nExpected output: {' '.join(t['expected_output'].split())}"
    return [SystemMessage(system), HumanMessage(human)]


def run_tool_loop(
    model: BaseChatModel,
    tools: list[BaseTool],
    messages: list[BaseMessage],
    *,
    max_steps: int = 12,
    on_event: Callable[[str], None] | None = None,
) -> list[BaseMessage]:
    """Let the model call tools until it answers without one (or ``max_steps`` model turns)."""
    try:
        bound = model.bind_tools(tools)
    except NotImplementedError:
        raise InputError(
            "--llm",
            f"{model._llm_type} cannot call tools; choose a model that supports tool calling",
        ) from None
    by_name = {t.name: t for t in tools}
    for _ in range(max_steps):
        try:
            reply = bound.invoke(messages)
        except ValidationError as exc:
            if exc.title != "AIMessage":
                raise
            # The client could not build a message from the reply: a tool call whose arguments
            # are JSON but not an object (e.g. a list). The model's mistake, so tell it.
            messages.append(HumanMessage(_unreadable_reply(exc)))
            continue
        except Exception as exc:
            error = provider_error(exc, model)
            if error is None:
                raise
            raise error from exc
        if not isinstance(reply, AIMessage):
            reply = AIMessage(content=str(getattr(reply, "content", reply)))
        # The reply enters the conversation (and the notes the state keeps) capped in size.
        if isinstance(reply.content, str) and len(reply.content) > MAX_LLM_TEXT:
            reply.content = cap_text(reply.content)
        refused = _cap_tool_calls(reply)
        messages.append(reply)
        bad_calls = list(reply.invalid_tool_calls or [])
        if not reply.tool_calls and not bad_calls:
            break
        if refused and on_event:
            on_event(refused)
        for call in reply.tool_calls:
            name = call["name"]
            args = call.get("args") or {}
            size = len(json.dumps(args, default=str))
            if size > MAX_LLM_TEXT:
                call["args"] = {}  # not kept, not sent back
                result = (
                    f"Error: the arguments of {name} are {size:,} characters long, more than "
                    f"{MAX_LLM_TEXT:,}; nothing was run. Call it again with short arguments."
                )
            else:
                if on_event:
                    on_event(f"tool {name}({json.dumps(args, default=str)[:120]})")
                result = _call_tool(by_name, name, args)
            messages.append(ToolMessage(result, tool_call_id=call["id"] or name, name=name))
        for bad in bad_calls:
            messages.append(
                ToolMessage(
                    f"Error: the call to {str(bad.get('name'))[:80]!r} had arguments that are not "
                    f"valid JSON ({str(bad.get('error') or 'unparseable')[:200]}). Call it again "
                    "with a JSON object of arguments.",
                    tool_call_id=bad.get("id") or "invalid",
                    name=bad.get("name") or "invalid",
                )
            )
        if refused:
            messages.append(HumanMessage(f"Error: {refused}."))
    return messages


def _cap_tool_calls(reply: AIMessage) -> str | None:
    """Keep the first ``MAX_TOOL_CALLS_PER_REPLY`` calls of ``reply``; what was refused, or None.

    The calls kept stay in the message (each gets its tool result, as the protocol wants);
    the rest are dropped from it, raw copies included, so they are neither run nor stored.
    """
    calls, bad = list(reply.tool_calls or []), list(reply.invalid_tool_calls or [])
    total = len(calls) + len(bad)
    if total <= MAX_TOOL_CALLS_PER_REPLY:
        return None
    reply.tool_calls = calls[:MAX_TOOL_CALLS_PER_REPLY]
    reply.invalid_tool_calls = bad[: MAX_TOOL_CALLS_PER_REPLY - len(reply.tool_calls)]
    reply.additional_kwargs.pop("tool_calls", None)
    return (
        f"that reply made {total:,} tool calls; at most {MAX_TOOL_CALLS_PER_REPLY} run per "
        f"reply, so the first {MAX_TOOL_CALLS_PER_REPLY} ran and the other "
        f"{total - MAX_TOOL_CALLS_PER_REPLY:,} were not run. Make at most "
        f"{MAX_TOOL_CALLS_PER_REPLY} tool calls per reply"
    )


def _unreadable_reply(exc: ValidationError) -> str:
    problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
    return (
        f"Your last reply could not be read ({problems}). Tool-call arguments must be a JSON "
        "object of named arguments. Call the tool again that way, or answer in plain text."
    )


def _call_tool(by_name: dict[str, BaseTool], name: str, args: dict[str, Any]) -> str:
    tool = by_name.get(name)
    if tool is None:
        return f"Error: there is no tool {name!r}. Available tools: {', '.join(sorted(by_name))}."
    try:
        return str(tool.invoke(args))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3]
        )
        return f"Error: invalid arguments for {name}: {problems}. Fix them and call {name} again."
    except OutputRefused:
        raise  # a file of the user's is in the way: the run stops, no tool call gets past it
    except TrainwrightError as exc:
        # A tool may word its error for the model apart from the user's (e.g. without saying
        # which files exist on this machine): ``tool_message``.
        said = getattr(exc, "tool_message", None) or str(exc)
        return (
            f"Error: {name} failed: {said}. Change the arguments or call the tool it names first."
        )


def final_text(messages: list[BaseMessage]) -> str:
    """The last plain answer of the model, for the report's agent notes."""
    for msg in reversed(messages):
        if isinstance(msg, AIMessage) and not msg.tool_calls and isinstance(msg.content, str):
            return msg.content.strip()  # capped when the loop received it
    return ""
