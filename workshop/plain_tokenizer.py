"""SmolLM2's tokenizer from its ``tokenizer.json`` and chat template with the ``tokenizers`` and
``jinja2`` packages alone: the calls ``workshop.magpie_data`` makes, where transformers is absent
or reads the folder differently (transformers 5 loads it as a slow-style ``LlamaTokenizer`` and
loses the newlines). ``tests/workshop/test_plain_tokenizer.py`` checks it against transformers'
``AutoTokenizer`` of the project's pinned version.
"""
from __future__ import annotations

import json
from pathlib import Path


class PlainTokenizer:
    def __init__(self, folder: Path):
        import jinja2
        from tokenizers import Tokenizer
        folder = Path(folder)
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        self.eos_token = cfg["eos_token"]
        self.eos_token_id = self._tok.token_to_id(self.eos_token)
        if self.eos_token_id is None:
            raise ValueError(f"{folder}: eos token {self.eos_token!r} is not in the vocabulary")
        text = (folder / "chat_template.jinja").read_text() if (folder / "chat_template.jinja").is_file() \
            else cfg["chat_template"]
        self._template = jinja2.Environment().from_string(text)

    def apply_chat_template(self, messages, *, add_generation_prompt: bool = False, tokenize: bool = True):
        text = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt)
        return self(text, add_special_tokens=False)["input_ids"] if tokenize else text

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": self._tok.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
