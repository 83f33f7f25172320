"""Chat templates a run may name (the `chat_template` training setting), and its check.

A run trains with the tokenizer's own chat template unless it gives one: a name below, or a Jinja
chat template's text (as in a tokenizer_config.json). The template decides what the model sees
around each turn and which characters are the assistant's (machine.trainer.data finds them by
rendering the conversation turn by turn), so the adapter should be used with the same template:
the manifest's settings carry it. A template's markers (<|im_start|> ...) are special tokens only
when the model's vocabulary has them; otherwise they are learned as plain text.
"""

from __future__ import annotations

from typing import Any

from machine.trainer.data import FALLBACK_TEMPLATE, SENTINEL

PRESETS = {
    # Qwen2.5, SmolLM2 and many others: <|im_start|>role\ncontent<|im_end|>\n
    "chatml": ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    # Llama 3.x: header ids around the role, <|eot_id|> after each turn, BOS first.
    "llama3": ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
               "{{ m['content'] }}<|eot_id|>{% endfor %}"
               "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"),
    # No special tokens at all ("User: ...", "Assistant: ..."): what a tokenizer without a template gets.
    "plain": FALLBACK_TEMPLATE,
}


class TemplateError(ValueError):
    """The run's chat template cannot be used; the message says why."""


def resolve(value: str) -> str:
    """The Jinja text of a chat_template setting (a preset's name, or the text itself)."""
    return PRESETS.get(value, value)


def apply(tokenizer: Any, value: str | None) -> None:
    """Make the run's template the tokenizer's, after checking that it renders a conversation with
    every message's content intact (the assistant's spans are found by its content)."""
    if value is None:
        return
    template = resolve(value)
    probe = [{"role": "system", "content": SENTINEL + "S"}, {"role": "user", "content": SENTINEL + "U"},
             {"role": "assistant", "content": SENTINEL + "A"}]
    try:
        text = tokenizer.apply_chat_template(probe, chat_template=template, tokenize=False,
                                             add_generation_prompt=False)
    except Exception as exc:  # a Jinja syntax or runtime error, in the template's own words
        raise TemplateError(f"training.chat_template does not render a conversation: {exc}") from exc
    missing = [m["role"] for m in probe if m["content"] not in str(text)]
    if missing:
        raise TemplateError(f"training.chat_template leaves out or alters the content of {', '.join(missing)} "
                            "messages; a chat template must render each message's content as it is")
    tokenizer.chat_template = template
