"""Answer extraction and checking, shared by every env and reward plugin.

"The answer" of a reply means one thing everywhere: the content of its last ``\\boxed{...}``
(strict), or that failing, its last number (lenient). Two answers match when they are equal
mathematically: plain numbers compare exactly as decimals, anything else goes to math-verify.
"""

from __future__ import annotations

import re
import threading
from decimal import Decimal, InvalidOperation

__all__ = ["answer_value", "answers_match", "extract_answer", "extract_boxed", "is_correct", "is_number"]

_BOXED = "\\boxed{"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_FRACTION = re.compile(r"-?\d+\s*/\s*\d+|-?\\[dt]?frac\{\d+\}\{\d+\}")
_LAST_NUMBER = re.compile(r"(?:(?<![\w)\]])-)?\d+(?:\.\d+)?")


def extract_boxed(text: str) -> str | None:
    """Content of the last non-empty ``\\boxed{...}`` in ``text`` (braces balanced), else None."""
    found = None
    start = text.find(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        content = text[start + len(_BOXED) : i - 1].strip() if depth == 0 else ""
        if content:
            found = content
        start = text.find(_BOXED, start + 1)
    return found


def extract_answer(text: str) -> str | None:
    """The lenient answer: the last ``\\boxed{}`` content, else the last number (minus allowed).

    A minus counts as a sign only when it does not follow a word character or a closing
    bracket, so "9-3=6" gives "6" and "is -3" gives "-3". Returns None if there is neither.
    """
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    numbers = _LAST_NUMBER.findall(text)
    return numbers[-1] if numbers else None


def is_number(text: str) -> bool:
    """True if ``text`` (stripped) is a plain integer or decimal, with an optional minus."""
    return _NUMBER.fullmatch(text.strip()) is not None


def answer_value(text: str) -> str:
    """What an answer states as its value: the part after its last ``=`` ("8 + 8 = 16" -> "16"),
    without a trailing full stop."""
    return text.rpartition("=")[2].strip().rstrip(".").strip()


def answers_match(predicted: str | None, gold: str) -> bool:
    """True if ``predicted`` equals ``gold`` mathematically ("12.0" matches "12").

    Against a plain-number gold answer, ``predicted`` must state a value after its last ``=``: a
    number, or for a gold answer that is not an integer also a fraction of two integers ("1/2",
    ``\\frac{1}{2}`` for 0.5; "24/2" is not 12 but a division left undone). An unevaluated expression is
    not an answer: math-verify would accept "7 - 8" for -1, and a model trained on it learned to
    box the question (``\\boxed{7 - 8}``) for full marks. Plain numbers compare exactly as
    decimals; anything else goes to math-verify (with its signal-based timeout on the main thread
    only, where signals work).
    """
    if predicted is None:
        return False
    gold = str(gold).strip()
    if is_number(gold):
        predicted = answer_value(predicted)
        fraction_allowed = "." in gold and Decimal(gold) != Decimal(gold).to_integral_value()
        if not (is_number(predicted) or (fraction_allowed and _FRACTION.fullmatch(predicted))):
            return False
    if is_number(predicted) and is_number(gold):
        try:
            return Decimal(predicted.strip()) == Decimal(gold)
        except InvalidOperation:
            return False
    from math_verify import parse, verify  # here: sympy's import (~1 s) is paid by the first symbolic answer

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold_parsed = parse(gold, parsing_timeout=timeout)
    pred_parsed = parse(predicted, parsing_timeout=timeout)
    return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=timeout))


def is_correct(text: str, answer: str) -> bool:
    """Lenient correctness of a reply ``text`` against the gold ``answer`` (see extract_answer)."""
    return answers_match(extract_answer(text), answer)
