"""Prompts: Spec-Bench-style JSONL files -> token id lists, through the checkpoint's tokenizer.

Each line is a JSON object with a `turns` list of strings (the first turn is used) and
optionally a `category`. The tokenizer's chat template is applied when it has one. A checkpoint
without tokenizer files (tiny random test models) gets `ByteTokenizer`: UTF-8 bytes offset by 3.

The bundled file `orchestrator/prompts/data/spec_bench_public.jsonl` holds 240 Spec-Bench questions
(Apache-2.0, see SPEC_BENCH_LICENSE.txt beside it).

Splits (`workload.split`, `--split`): `train` keeps prompts 0, 1, 2 of every 4 within each category
of the file, `heldout` prompt 3 of every 4. A drafter trained on one split (`spectune train-drafter
--split train`, the demo EAGLE-3 head) is scored on the other.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UserError

BUNDLED_PROMPTS = Path(__file__).parent / "data" / "spec_bench_public.jsonl"
SPLITS = ("all", "train", "heldout")


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str
    question_id: str


def load_prompts(
    path: str | Path,
    num_prompts: int | None = None,
    categories: list[str] | None = None,
    per_category: int | None = None,
    split: str = "all",
) -> list[Prompt]:
    """Prompts of `path`: the split (counted over the whole file), filtered by category, then the
    first `per_category` of each, then the first `num_prompts`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"prompts file {str(path)!r} does not exist")
    prompts: list[Prompt] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"prompts file {path}:{lineno} is not valid JSON ({e.msg})") from None
        turns = obj.get("turns") if isinstance(obj, dict) else None
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise UserError(f"prompts file {path}:{lineno} needs a non-empty 'turns' list of strings")
        prompts.append(Prompt(turns[0], str(obj.get("category", "unknown")), str(obj.get("question_id", lineno))))
    if not prompts:
        raise UserError(f"prompts file {path} holds no prompts")
    prompts = split_prompts(prompts, split)
    if categories:
        known = sorted({p.category for p in prompts})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise UserError(f"category {unknown[0]!r} is not in {path} (it has: {', '.join(known)})")
        prompts = [p for p in prompts if p.category in categories]
    if per_category is not None:
        if per_category < 1:
            raise UserError(f"per_category must be at least 1, not {per_category}")
        kept, seen = [], Counter()
        for p in prompts:
            seen[p.category] += 1
            if seen[p.category] <= per_category:
                kept.append(p)
        prompts = kept
    if num_prompts is not None:
        if num_prompts < 1:
            raise UserError(f"num_prompts must be at least 1, not {num_prompts}")
        prompts = prompts[:num_prompts]
    return prompts


def split_prompts(prompts: list[Prompt], split: str) -> list[Prompt]:
    """`train`: prompts 0, 1, 2 of every 4 within each category; `heldout`: prompt 3 of every 4."""
    if split not in SPLITS:
        raise UserError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    if split == "all":
        return prompts
    seen: dict[str, int] = {}
    kept = []
    for p in prompts:
        i = seen[p.category] = seen.get(p.category, -1) + 1
        if (i % 4 == 3) == (split == "heldout"):
            kept.append(p)
    return kept


class ByteTokenizer:
    """Token id = UTF-8 byte + 3 (0 pad, 1 bos, 2 eos): for checkpoints that ship no tokenizer."""

    eos_token_id = 2
    chat_template = None

    def encode(self, text: str) -> list[int]:
        return [1] + [b + 3 for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i - 3 for i in ids if 3 <= i < 259).decode("utf-8", errors="replace")


class Tokenizer:
    """The checkpoint's Hugging Face tokenizer, or ByteTokenizer when it has none."""

    def __init__(self, checkpoint: Path):
        checkpoint = Path(checkpoint)
        if (checkpoint / "tokenizer.json").exists() or (checkpoint / "tokenizer_config.json").exists():
            import transformers
            from transformers import AutoTokenizer

            transformers.logging.set_verbosity_error()
            self.hf = AutoTokenizer.from_pretrained(str(checkpoint))
        else:
            self.hf = None
            self.bytes = ByteTokenizer()

    @property
    def vocab_size(self) -> int:
        return len(self.hf) if self.hf is not None else 259

    @property
    def eos_ids(self) -> tuple[int, ...]:
        eos = self.hf.eos_token_id if self.hf is not None else ByteTokenizer.eos_token_id
        return (eos,) if eos is not None else ()

    def encode_prompt(self, text: str) -> list[int]:
        if self.hf is None:
            return self.bytes.encode(text)
        if self.hf.chat_template:
            text = self.hf.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
            return list(self.hf(text, add_special_tokens=False)["input_ids"])
        return list(self.hf(text)["input_ids"])

    def encode_text(self, text: str) -> list[int]:
        """Plain text as tokens: no BOS, no chat template (a longer context drawn from it, prompts/context.py)."""
        if self.hf is None:
            return self.bytes.encode(text)[1:]
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    @property
    def bos_id(self) -> int | None:
        return self.hf.bos_token_id if self.hf is not None else 1

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True) if self.hf is not None else self.bytes.decode(ids)
