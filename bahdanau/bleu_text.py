"""How BLEU reads the text: its case and its tokenisation, sacrebleu's or Moses' (`BleuText`).

By default BLEU is sacrebleu's: cased, on detokenised text, tokenised by its ``13a`` rules (the
number to compare with sacrebleu scores). `BleuText` chooses otherwise: ``lowercase`` (sacrebleu's
own option), sacrebleu's ``intl`` or ``none`` tokenisation, or ``moses``, the scoring of the WMT
shared tasks and of most papers before sacrebleu (among them the WMT17 multimodal task):
hypotheses and references both go through Moses' ``normalize-punctuation.perl -l L`` and
``tokenizer.perl -l L`` (without ``-a``: hyphenated words stay whole, as in the shared task's
preprocessing), then BLEU counts whitespace-separated tokens (sacrebleu with ``tokenize="none"``).
The Moses steps are sacremoses' ports of the two scripts (the ``moses`` extra):
``MosesPunctNormalizer(lang=L).normalize(line)`` then
``MosesTokenizer(lang=L).tokenize(line, escape=False, return_str=True)``. Moses' escaping of
``&``, ``<``, ``'``, ``"`` ... (``&apos;``) is left out: it maps one token to one token in the
hypothesis and the reference alike, so BLEU is the same with or without it.

The signature says all of it: sacrebleu's (``case:lc``, ``tok:none``), and for ``moses`` the
pre-tokenisation, its language and the sacremoses version (`BleuText.signature`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from bahdanau.errors import InputError
from bahdanau.settings import check_settings, field_name, setting

__all__ = ["BleuText", "Tokenize", "check_moses", "moses_tokenize"]

Tokenize = Literal["13a", "intl", "none", "moses"]
# A language code as Moses' scripts take it (-l en, -l fr, -l pt-br is not one of theirs).
_LANG = re.compile(r"[a-z]{2,3}")


def check_moses(asked: str = "tokenize='moses'") -> None:
    """Refuse, in one line, Moses tokenisation without sacremoses (the ``moses`` extra);
    `asked` is how the message names the setting that asks for it."""
    try:
        import sacremoses  # noqa: F401
    except ImportError:
        raise InputError(f"{asked} needs sacremoses: pip install 'bahdanau[moses]' (or score "
                         "with sacrebleu's 13a tokenisation)") from None


@cache
def _moses(lang: str) -> tuple[Any, Any]:
    """sacremoses' punctuation normaliser and tokenizer for `lang`, built once."""
    check_moses()
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Each line through Moses' normalize-punctuation.perl and tokenizer.perl (no ``-a``, no
    escaping) for language `lang`, by sacremoses: "L'homme, qui..." -> "L' homme , qui ...".

    Raises:
        InputError: sacremoses is not installed (the ``moses`` extra).
    """
    normaliser, tokenizer = _moses(lang)
    return [tokenizer.tokenize(normaliser.normalize(line), escape=False, return_str=True)
            for line in lines]


@dataclass(frozen=True)
class BleuText:
    """How BLEU reads hypotheses and references: case and tokenisation (module docstring)."""

    lowercase: bool = setting(False, "score BLEU case-insensitively (sacrebleu's lowercase; "
                                     "chrF then reads lowercased text too)")
    tokenize: Tokenize = setting(
        "13a", "BLEU's tokenisation: sacrebleu's 13a (the default), intl or none, or moses "
        "(Moses' normalize-punctuation.perl and tokenizer.perl on both sides, as the WMT shared "
        "tasks scored; needs the moses extra and the references' language, the option below)")
    moses_lang: str | None = setting(
        None, "the references' language for --tokenize moses (en, fr, de, cs, ...: Moses' "
        "rules for apostrophes and abbreviations depend on it)", metavar="LANG")

    def __post_init__(self) -> None:
        check_settings(self)
        names = {f.name: field_name(f) for f in dataclasses.fields(self)}   # flags, in a job
        tokenize, lang = names["tokenize"], names["moses_lang"]
        if self.tokenize == "moses":
            if self.moses_lang is None:
                raise InputError(f"{tokenize} moses needs {lang} LANG, the references' "
                                 "language (e.g. fr)")
            if not _LANG.fullmatch(self.moses_lang):
                raise InputError(f"{lang} must be a language code such as en or fr, got "
                                 f"{self.moses_lang!r}")
            check_moses(f"{tokenize} moses")                # before any work
        elif self.moses_lang is not None:
            raise InputError(f"{lang} {self.moses_lang} sets Moses tokenisation's language: "
                             f"it needs {tokenize} moses")

    @property
    def sacrebleu_tokenize(self) -> str:
        """The tokenisation sacrebleu applies: ``none`` after Moses' (already tokenised)."""
        return "none" if self.tokenize == "moses" else self.tokenize

    def prepare(self, lines: Sequence[str]) -> list[str]:
        """The lines as BLEU's tokenizer gets them: Moses-tokenised for ``moses``, else as
        they are (sacrebleu lowercases and tokenises them itself)."""
        if self.tokenize == "moses":
            assert self.moses_lang is not None                  # __post_init__
            return moses_tokenize(lines, self.moses_lang)
        return list(lines)

    def signature(self, sacrebleu_signature: str) -> str:
        """sacrebleu's BLEU signature, with what came before it for ``moses``:
        ``nrefs:1|case:lc|eff:no|tok:none|smooth:exp|version:2.6.0|pretok:moses-fr+sacremoses-0.2.0``."""
        if self.tokenize != "moses":
            return sacrebleu_signature
        import sacremoses

        version = getattr(sacremoses, "__version__", "unknown")
        return f"{sacrebleu_signature}|pretok:moses-{self.moses_lang}+sacremoses-{version}"
