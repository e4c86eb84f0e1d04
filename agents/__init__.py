"""The three roles (researcher, engineer, reviewer), the chat-model factory and the offline model."""

from agents.chat_models import load_chat_model

__all__ = ["load_chat_model"]
