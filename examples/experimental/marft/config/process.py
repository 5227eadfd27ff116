"""Prompt shaping for the MARFT workflows (agent_options.process_path).

``pre_process`` fills the agent's template (``${prompt}`` is the episode so far) and
renders it with the tokenizer's chat template when it has one; ``post_process`` appends the
agent's tag and its reply, which is what the next agent reads.
"""

from string import Template


def _render(tokenizer, text):
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": ""}, {"role": "user", "content": text}]
        return list(tokenizer.apply_chat_template(messages, tokenize=True,
                                                  add_generation_prompt=True))
    return tokenizer.encode(text, add_special_tokens=False)


def pre_process(tokenizer, prompt_id, obs, **kwargs):
    template = Template(kwargs.get("pre_chat_template", "${prompt}"))
    prompt = tokenizer.decode(prompt_id, skip_special_tokens=True)
    return _render(tokenizer, template.safe_substitute(prompt=prompt))


def post_process(tokenizer, prompt_id, response_id, **kwargs):
    tag = kwargs.get("post_chat_template") or ""
    return list(prompt_id) + tokenizer.encode(tag, add_special_tokens=False) + list(response_id)
