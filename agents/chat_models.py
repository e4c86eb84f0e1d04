"""The one place a chat model is built: ``load_chat_model(spec or settings)``.

Also the one place that knows how a provider's client fails: ``provider_error`` turns what it
raised into one clear ``TrainwrightError`` for the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.core.errors import InputError, ProviderError, TrainwrightError
from tools.core.settings import Settings

if TYPE_CHECKING:
    from langchain_core.language_models.chat_models import BaseChatModel


def load_chat_model(
    spec: str | Settings = "offline",
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 60.0,
    max_retries: int = 1,
) -> BaseChatModel:
    """Build the chat model named by ``spec``, or the one ``Settings`` name (llm, base_url, ...).

    ``offline`` (default) is the deterministic playbook model; ``provider:model`` goes through
    LangChain's ``init_chat_model``; ``openai:NAME`` with ``base_url`` talks to any
    OpenAI-compatible server (vLLM, llama.cpp, LM Studio, Ollama). A request that gets no
    answer within ``timeout_s`` is retried ``max_retries`` times, so a dead server costs at
    most about ``(1 + max_retries) * timeout_s`` before the run fails. For ``openai`` the
    ``timeout_s`` is a total deadline per request (connect, send, headers and the whole body;
    agents/deadline.py), so a server that drips its reply a byte at a time is cut off too.
    """
    if isinstance(spec, Settings):
        return load_chat_model(
            spec.llm,
            base_url=spec.base_url,
            api_key=spec.api_key,
            timeout_s=spec.llm_timeout_s,
            max_retries=max_retries,
        )
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

    kwargs: dict[str, Any] = {"timeout": timeout_s, "max_retries": max_retries}
    if provider == "openai":
        from agents.deadline import deadline_client

        # A total deadline per request (body included), not httpx's per-read timeout: a
        # server that drips one byte at a time is cut off at ``timeout_s`` too.
        kwargs["http_client"] = deadline_client(timeout_s)
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
        raise InputError("--llm", f"cannot set up {spec}: {_first_line(exc)}") from None


def provider_error(exc: Exception, model: BaseChatModel) -> TrainwrightError | None:
    """Translate what a provider's chat client raised into one clear error; None if it is ours.

    LangChain maps every provider's HTTP and network failures onto ``langchain_core``'s
    ``ModelError`` family (``ModelTimeoutError``, ``ModelAPIError`` for 5xx, ...); statuses it
    does not map still carry ``status_code``. Anything else a non-builtin model raises while
    answering means its reply could not be read (e.g. a server that is not OpenAI-compatible).
    A bad key, a forbidden or unknown model is the user's configuration (exit 2); the rest is
    a failure of the server (exit 1).
    """
    from langchain_core.exceptions import (
        ModelAuthenticationError,
        ModelConnectionError,
        ModelError,
        ModelNotFoundError,
        ModelPermissionDeniedError,
        ModelTimeoutError,
    )

    where = _endpoint(exc, model)
    too_large = _reply_too_large(exc)
    if too_large is not None:
        return ProviderError(f"LLM request failed ({model._llm_type}): {too_large}")
    status = getattr(exc, "status_code", None)
    if isinstance(exc, ModelTimeoutError):
        timeout = getattr(model, "request_timeout", None)
        retries = getattr(model, "max_retries", None)
        within = f" within {timeout:g} s" if isinstance(timeout, int | float) else ""
        tries = f", {1 + retries} attempt(s)" if isinstance(retries, int) else ""
        return ProviderError(f"LLM request failed: timed out waiting for {where}{within}{tries}")
    if isinstance(exc, ModelConnectionError):
        return ProviderError(f"LLM request failed: cannot reach {where}: {_first_line(exc)}")
    if isinstance(status, int):
        message = f"LLM request failed: HTTP {status} from {where}: {_detail(exc)}"
        if isinstance(
            exc, ModelAuthenticationError | ModelPermissionDeniedError | ModelNotFoundError
        ):
            return InputError("--llm", message)
        return ProviderError(message)
    if isinstance(exc, ModelError):
        return ProviderError(f"LLM request failed ({type(exc).__name__}): {_first_line(exc)}")
    if type(model).__module__.startswith("agents."):
        return None  # our offline model: an exception there is a bug, not a provider failure
    return ProviderError(
        f"LLM reply from {where} could not be read ({type(exc).__name__}: {_first_line(exc)})"
    )


def _reply_too_large(exc: BaseException) -> BaseException | None:
    """The byte bound's error (agents/deadline.py) behind ``exc``, if that is what stopped it."""
    import sys

    deadline = sys.modules.get("agents.deadline")  # only an OpenAI-compatible model uses it
    seen: BaseException | None = exc
    for _ in range(8):  # a client may wrap it (LangChain's and OpenAI's error types)
        if seen is None or deadline is None:
            return None
        if isinstance(seen, deadline.ReplyTooLarge):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _detail(exc: BaseException) -> str:
    """The server's own error message when its body carries one (OpenAI's ``{"error": {...}}``)."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str) and body["message"]:
        return str(body["message"]).splitlines()[0]
    return _first_line(exc)


def _endpoint(exc: BaseException, model: BaseChatModel) -> str:
    """The URL the failed request went to, else the model's configured server, else its name."""
    try:
        return str(exc.request.url)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError when no request is set
        pass
    base = getattr(model, "openai_api_base", None) or getattr(model, "base_url", None)
    if base:
        return str(base)
    name = getattr(model, "model_name", None) or getattr(model, "model", None)
    return f"{model._llm_type} model {name}" if name else model._llm_type
