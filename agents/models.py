"""The one place a chat model is built (STYLE.md 5): ``load_chat_model(spec)``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.errors import InputError

if TYPE_CHECKING:
    from langchain_core.language_models.chat_models import BaseChatModel


def load_chat_model(
    spec: str = "offline",
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 60.0,
) -> BaseChatModel:
    """Build the chat model named by ``spec``.

    ``offline`` (default) is the deterministic playbook model; ``provider:model`` goes through
    LangChain's ``init_chat_model``; ``openai:NAME`` with ``base_url`` talks to any
    OpenAI-compatible server (vLLM, llama.cpp, LM Studio, Ollama).
    """
    spec = (spec or "offline").strip()
    if spec == "offline":
        from agents.offline import OfflinePlaybookModel

        return OfflinePlaybookModel()
    provider, sep, name = spec.partition(":")
    if not sep or not provider or not name:
        raise InputError(
            "--llm",
            f"expected 'offline' or 'provider:model' (e.g. openai:gpt-4o-mini), got {spec!r}",
        )
    if base_url is not None and provider != "openai":
        raise InputError(
            "--base-url", "works with --llm openai:MODEL (any OpenAI-compatible server)"
        )
    from langchain.chat_models import init_chat_model

    kwargs: dict[str, Any] = {"timeout": timeout_s, "max_retries": 1}
    if base_url is not None:
        kwargs["base_url"] = base_url
        # Local servers accept any key; the OpenAI client insists on one being set.
        kwargs["api_key"] = api_key or "not-needed"
    elif api_key:
        kwargs["api_key"] = api_key
    try:
        return init_chat_model(name, model_provider=provider, **kwargs)
    except ImportError as exc:
        raise InputError(
            "--llm", f"provider {provider!r} needs a package that is not installed: {exc}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - providers raise their own types (e.g. a missing API key)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError("--llm", f"cannot set up {spec}: {first}") from None
