"""A small English -> German grammar whose held-out sentences test generalization.

Every sentence pair is drawn from one grammar by a NumPy generator, so a seed fixes
the corpus. The German side needs what a word-for-word model cannot give:

* gender and case: the article and the adjective ending depend on the noun's gender
  and on its role ("the old dog sees the old dog" -> "der alte Hund sieht den alten
  Hund"); ``helps`` and ``follows`` take the dative ("hilft dem alten Hund");
* mixed, weak and strong adjective endings after ``ein``, ``der`` and numbers, and
  dative plurals ("mit zwei alten Hunden");
* verb-second after a fronted adverb ("heute sieht der Mann ...") and verb-final
  subordinate clauses ("..., weil der Mann den Hund sieht");
* subject-verb agreement and irregular plurals ("men" -> "Männer");
* numbers written as words, with German putting the unit first
  ("twenty-one" -> "einundzwanzig").
"""

from __future__ import annotations

import numpy as np

__all__ = ["english_number", "generate_pairs", "german_number", "sample_pair"]

Gender = str  # "m", "f", "n"; "pl" for plural forms

# english singular, english plural, german singular, german plural, gender
_NOUNS = (
    ("dog", "dogs", "Hund", "Hunde", "m"),
    ("man", "men", "Mann", "Männer", "m"),
    ("teacher", "teachers", "Lehrer", "Lehrer", "m"),
    ("bird", "birds", "Vogel", "Vögel", "m"),
    ("friend", "friends", "Freund", "Freunde", "m"),
    ("cat", "cats", "Katze", "Katzen", "f"),
    ("woman", "women", "Frau", "Frauen", "f"),
    ("mouse", "mice", "Maus", "Mäuse", "f"),
    ("sister", "sisters", "Schwester", "Schwestern", "f"),
    ("child", "children", "Kind", "Kinder", "n"),
    ("girl", "girls", "Mädchen", "Mädchen", "n"),
    ("horse", "horses", "Pferd", "Pferde", "n"),
)
_ADJECTIVES = (
    ("big", "groß"),
    ("small", "klein"),
    ("old", "alt"),
    ("young", "jung"),
    ("tired", "müde"),
    ("clever", "klug"),
    ("happy", "glücklich"),
)
# english 3rd singular, english plural, german singular, german plural, object case
_VERBS = (
    ("sees", "see", "sieht", "sehen", "acc"),
    ("likes", "like", "mag", "mögen", "acc"),
    ("finds", "find", "findet", "finden", "acc"),
    ("visits", "visit", "besucht", "besuchen", "acc"),
    ("helps", "help", "hilft", "helfen", "dat"),
    ("follows", "follow", "folgt", "folgen", "dat"),
    ("thanks", "thank", "dankt", "danken", "dat"),
)
_ADVERBS = (("today", "heute"), ("often", "oft"), ("now", "jetzt"), ("sometimes", "manchmal"))
_CONJUNCTIONS = (("because", "weil"), ("although", "obwohl"), ("when", "wenn"))
# english pronoun, its verb form's index, german pronoun; index 0: I, 1: he/she, 2: we/they
_PRONOUNS = (
    ("i", 0, "ich"),
    ("he", 1, "er"),
    ("she", 1, "sie"),
    ("we", 2, "wir"),
    ("they", 2, "sie"),
)
# english (I/we, he/she), german (ich, er/sie, wir/sie)
_REPORTING = (
    (("know", "knows"), ("weiß", "weiß", "wissen")),
    (("say", "says"), ("sage", "sagt", "sagen")),
    (("think", "thinks"), ("glaube", "glaubt", "glauben")),
)

_DEFINITE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"},
}
_INDEFINITE = {
    "nom": {"m": "ein", "f": "eine", "n": "ein"},
    "acc": {"m": "einen", "f": "eine", "n": "ein"},
    "dat": {"m": "einem", "f": "einer", "n": "einem"},
}
# adjective endings after a definite article (weak), after ``ein`` (mixed), and with
# no article (strong; only plurals here, after a number)
_WEAK = {
    "nom": {"m": "e", "f": "e", "n": "e", "pl": "en"},
    "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"},
    "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"},
}
_MIXED = {
    "nom": {"m": "er", "f": "e", "n": "es"},
    "acc": {"m": "en", "f": "e", "n": "es"},
    "dat": {"m": "en", "f": "en", "n": "en"},
}
_STRONG_PLURAL = {"nom": "e", "acc": "e", "dat": "en"}

_EN_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
_EN_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_DE_ONES = (
    "null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn "
    "vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn"
).split()
_DE_TENS = "_ _ zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig".split()


def english_number(n: int) -> str:
    """``n`` in ``[0, 100)`` in English words: ``21 -> "twenty-one"``."""
    if n < 20:
        return _EN_ONES[n]
    tens, unit = divmod(n, 10)
    return _EN_TENS[tens] + (f"-{_EN_ONES[unit]}" if unit else "")


def german_number(n: int) -> str:
    """``n`` in ``[0, 100)`` in German words, unit first: ``21 -> "einundzwanzig"``."""
    if n < 20:
        return _DE_ONES[n]
    tens, unit = divmod(n, 10)
    if not unit:
        return _DE_TENS[tens]
    return ("ein" if unit == 1 else _DE_ONES[unit]) + "und" + _DE_TENS[tens]


def _inflect(stem: str, ending: str) -> str:
    # "müde" + "en" -> "müden": the stem's final e absorbs the ending's.
    return stem + (ending[1:] if stem.endswith("e") else ending)


def _dative_plural(noun: str) -> str:
    return noun if noun.endswith(("n", "s")) else noun + "n"


def _noun_phrase(rng: np.random.Generator, case: str) -> tuple[str, str, bool]:
    """One noun phrase in ``case``: ``(english, german, plural)``."""
    en_sg, en_pl, de_sg, de_pl, gender = _NOUNS[rng.integers(len(_NOUNS))]
    adjective = _ADJECTIVES[rng.integers(len(_ADJECTIVES))] if rng.random() < 0.6 else None
    kind = ("the", "a", "the_plural", "number", "the_number")[rng.integers(5)]
    plural = kind in ("the_plural", "number", "the_number")
    number = int(rng.integers(2, 100)) if "number" in kind else 0
    key = "pl" if plural else gender
    noun = (_dative_plural(de_pl) if case == "dat" else de_pl) if plural else de_sg
    if kind == "a":
        endings, article = _MIXED, _INDEFINITE[case][gender]
    elif kind == "number":
        endings, article = None, german_number(number)
    else:
        endings, article = _WEAK, _DEFINITE[case][key]
        if kind == "the_number":
            article += " " + german_number(number)
    de = [article]
    en = [en_pl if plural else en_sg]
    if adjective:
        ending = _STRONG_PLURAL[case] if endings is None else endings[case][key]
        de.append(_inflect(adjective[1], ending))
        en.insert(0, adjective[0])
    de.append(noun)
    if kind == "a":
        en.insert(0, "an" if en[0][0] in "aeiou" else "a")
    elif kind == "number":
        en.insert(0, english_number(number))
    elif kind == "the_number":
        en[:0] = ["the", english_number(number)]
    else:
        en.insert(0, "the")
    return " ".join(en), " ".join(de), plural


def _clause(rng: np.random.Generator) -> tuple[str, dict[str, str]]:
    """A clause's English and its German parts (subject, verb, object, phrase)."""
    subject_en, subject_de, plural = _noun_phrase(rng, "nom")
    en_sg, en_pl, de_sg, de_pl, case = _VERBS[rng.integers(len(_VERBS))]
    object_en, object_de, _ = _noun_phrase(rng, case)
    en = [subject_en, en_pl if plural else en_sg, object_en]
    parts = {"subject": subject_de, "verb": de_pl if plural else de_sg, "object": object_de}
    parts["phrase"] = ""
    if rng.random() < 0.3:
        with_en, with_de, _ = _noun_phrase(rng, "dat")
        en.append(f"with {with_en}")
        parts["phrase"] = f"mit {with_de}"
    return " ".join(en), parts


def _main(parts: dict[str, str], fronted: str = "") -> str:
    if fronted:  # verb second: the fronted adverb takes the first place
        words = [fronted, parts["verb"], parts["subject"], parts["object"], parts["phrase"]]
    else:
        words = [parts["subject"], parts["verb"], parts["object"], parts["phrase"]]
    return " ".join(w for w in words if w)


def _subordinate(parts: dict[str, str]) -> str:
    words = [parts["subject"], parts["object"], parts["phrase"], parts["verb"]]
    return " ".join(w for w in words if w)


def sample_pair(rng: np.random.Generator) -> tuple[str, str]:
    """One ``(english, german)`` sentence pair, lower-case English, no final stop.

    Example:
      >>> import numpy as np
      >>> en, de = sample_pair(np.random.default_rng(3))
      >>> isinstance(en, str) and isinstance(de, str)
      True
    """
    frame = rng.integers(4)
    en, parts = _clause(rng)
    if frame == 0:
        return en, _main(parts)
    if frame == 1:
        adverb_en, adverb_de = _ADVERBS[rng.integers(len(_ADVERBS))]
        return f"{adverb_en} {en}", _main(parts, adverb_de)
    if frame == 2:
        pronoun_en, person, pronoun_de = _PRONOUNS[rng.integers(len(_PRONOUNS))]
        verbs_en, verbs_de = _REPORTING[rng.integers(len(_REPORTING))]
        verb_en = verbs_en[1] if person == 1 else verbs_en[0]
        return (
            f"{pronoun_en} {verb_en} that {en}",
            f"{pronoun_de} {verbs_de[person]}, dass {_subordinate(parts)}",
        )
    conjunction_en, conjunction_de = _CONJUNCTIONS[rng.integers(len(_CONJUNCTIONS))]
    second_en, second = _clause(rng)
    return (
        f"{en} {conjunction_en} {second_en}",
        f"{_main(parts)}, {conjunction_de} {_subordinate(second)}",
    )


def generate_pairs(seed: int, count: int) -> list[tuple[str, str]]:
    """``count`` distinct sentence pairs (distinct English sides), in drawing order.

    Args:
      seed: seeds the generator; the same seed gives the same list.
      count: how many pairs.

    Returns:
      ``[(english, german), ...]`` of length ``count``.

    Example:
      >>> generate_pairs(0, 3) == generate_pairs(0, 3)
      True
      >>> german_number(21), german_number(97), english_number(97)
      ('einundzwanzig', 'siebenundneunzig', 'ninety-seven')
    """
    rng = np.random.default_rng(seed)
    pairs: dict[str, str] = {}
    while len(pairs) < count:
        en, de = sample_pair(rng)
        pairs.setdefault(en, de)
    return list(pairs.items())
