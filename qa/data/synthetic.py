"""Deterministic synthetic SQuAD-format data, learnable but not trivial: each paragraph states 3-6 facts
about fictional people from two or three relation kinds, so several sentences hold an answer of the
question's type; 5% are long (9-11 sentences) for the sliding window at 128 tokens; in v2 data about a
third of the questions ask about a relation or entity the paragraph does not state."""
import random
import string

SYLLABLES = ("mar ve lon tes sik ar del vor bel dra kin lo ran thu zel qua nor fen ri sa tor "
             "mel ca dun e ly os pa ren sil ta va win ko bra gal hes im jor").split()
CITY_SUFFIXES = "burg ford holm wick port dale mouth field stead haven".split()
ORG_KINDS = "Guild Society Company Academy Museum Library Bank Theatre Observatory Choir".split()
JOBS = ("baker painter sailor teacher doctor farmer merchant poet carpenter banker lawyer tailor "
        "potter weaver miner soldier singer gardener clockmaker blacksmith fisherman librarian "
        "surgeon judge").split()
COLOURS = ("red blue green yellow white black grey brown orange purple pink golden silver "
           "crimson violet scarlet amber ivory olive navy").split()
ANIMALS = ("goats sheep cows pigs horses ducks geese chickens rabbits donkeys llamas camels "
           "oxen turkeys ponies mules pigeons swans hens alpacas").split()
BOOK_ADJ = "Silent Broken Golden Hidden Last Distant Quiet Burning Frozen Lonely Secret Endless".split()
BOOK_NOUN = "River Garden Tower Winter Harbour Mirror Forest Kingdom Letter Voyage Lantern Bridge".split()

# Slots: P person, O organisation, C city, D second city, Y year, J job, K colour,
# N number, A animals (plural), B book title.  kind -> (sentence templates, {slot: questions}).
KINDS = {
    "found": (["{P} founded the {O} in {Y} in the city of {C}.", "In {Y}, {P} founded the {O} in {C}.",
               "The {O} was founded by {P} in {C} in {Y}."],
              {"Y": ["When did {P} found the {O}?", "In what year was the {O} founded?",
                     "In which year did {P} establish the {O}?"],
               "P": ["Who founded the {O}?", "Who was the founder of the {O}?", "The {O} was founded by whom?"],
               "C": ["In which city did {P} found the {O}?", "Where was the {O} founded?",
                     "What city was the {O} founded in?"],
               "O": ["What did {P} found in {C}?", "Which organisation did {P} found?"]}),
    "born": (["{P} was born in {C} in {Y} and later worked as a {J}.",
              "Born in {Y} in {C}, {P} became a well known {J}.", "{P}, a {J}, was born in {Y} in the town of {C}."],
             {"C": ["Where was {P} born?", "In which town was {P} born?", "What is the birthplace of {P}?"],
              "Y": ["When was {P} born?", "In what year was {P} born?", "What is the birth year of {P}?"],
              "J": ["What did {P} work as?", "What was the occupation of {P}?", "What job did {P} have?"],
              "P": ["Who was born in {C} in {Y}?", "Which {J} was born in {C}?"]}),
    "farm": (["{P} kept {N} {A} on a farm near {C}.", "On a farm outside {C}, {P} raised {N} {A}."],
             {"N": ["How many {A} did {P} keep?", "How many {A} were raised by {P}?"],
              "C": ["Near which city was the farm of {P}?", "Where did {P} keep {A}?"],
              "A": ["What animals did {P} raise?", "What did {P} keep on the farm?"],
              "P": ["Who kept {N} {A}?", "Who raised {A} near {C}?"]}),
    "house": (["{P} lived in a {K} house with {N} windows in {C}.",
               "In {C}, {P} owned a {K} house that had {N} windows."],
              {"K": ["What colour was the house of {P}?", "What colour was {P}'s house?"],
               "N": ["How many windows did the house of {P} have?", "How many windows were in {P}'s house?"],
               "C": ["In which city did {P} live?", "Where did {P} live?"],
               "P": ["Who lived in a {K} house?", "Whose house had {N} windows?"]}),
    "book": (["{P} wrote {B} in {Y}.", "In {Y}, {P} published a novel called {B}.",
              "{B}, a novel by {P}, appeared in {Y}."],
             {"B": ["What novel did {P} write?", "Which book was written by {P}?"],
              "P": ["Who wrote {B}?", "Who is the author of {B}?"],
              "Y": ["When did {P} write {B}?", "In what year was {B} published?"]}),
    "moved": (["In {Y}, {P} moved to {C} to become a {J}.", "{P} moved to {C} in {Y} and worked there as a {J}."],
              {"C": ["Where did {P} move in {Y}?", "To which city did {P} move?"],
               "Y": ["When did {P} move to {C}?", "In what year did {P} move to {C}?"],
               "J": ["What did {P} become in {C}?", "What did {P} work as after moving?"],
               "P": ["Who moved to {C} in {Y}?", "Which person moved to {C} to become a {J}?"]}),
    "travel": (["{P} travelled from {C} to {D} in {N} days.", "It took {P} {N} days to travel from {C} to {D}."],
               {"N": ["How many days did it take {P} to travel from {C} to {D}?", "How long did {P} travel to {D}?"],
                "D": ["Where did {P} travel to from {C}?", "To which city did {P} travel?"],
                "C": ["From which city did {P} travel to {D}?", "Where did the journey of {P} begin?"]}),
    "paint": (["{P} painted the gates of the {O} {K} in {Y}.", "In {Y}, the gates of the {O} were painted {K} by {P}."],
              {"K": ["What colour did {P} paint the gates of the {O}?",
                     "What colour were the gates of the {O} painted?"],
               "Y": ["When did {P} paint the gates of the {O}?", "In which year were the gates of the {O} painted?"],
               "P": ["Who painted the gates of the {O}?", "Who painted the gates of the {O} {K}?"]}),
}
# Kinds whose facts may answer each other's questions: an unanswerable question names people of other groups only.
_GROUP = {"born": 1, "moved": 1, "house": 1, "travel": 1, "found": 2, "paint": 2}
_FMT = string.Formatter()
_SLOTS = {k: sorted({s for t in v[0] for _, s, _, _ in _FMT.parse(t) if s} - {"P"}) for k, v in KINDS.items()}


def _name(rng, syllables):
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()


_MAKERS = {"P": lambda r: f"{_name(r, r.randint(2, 3))} {_name(r, 2)}",
           "O": lambda r: f"{_name(r, 2)} {r.choice(ORG_KINDS)}",
           "C": lambda r: _name(r, r.randint(1, 2)) + r.choice(CITY_SUFFIXES),
           "Y": lambda r: str(r.randint(1650, 1999)),
           "J": lambda r: r.choice(JOBS),
           "K": lambda r: r.choice(COLOURS),
           "N": lambda r: str(r.randint(2, 300)),
           "A": lambda r: r.choice(ANIMALS),
           "B": lambda r: f"The {r.choice(BOOK_ADJ)} {r.choice(BOOK_NOUN)}"}
_MAKERS["D"] = _MAKERS["C"]


def _fresh(rng, slot, used):
    """A value for `slot` not yet used in this paragraph (so every answer is unambiguous)."""
    while True:
        if (value := _MAKERS[slot](rng)) not in used:
            used.add(value)
            return value


def _fill(template, values):
    """Format `template`; return (text, {slot: offset of its value in text})."""
    text, offsets = "", {}
    for literal, slot, _, _ in _FMT.parse(template):
        text += literal
        if slot:
            offsets[slot] = len(text)
            text += values[slot]
    return text[0].upper() + text[1:], offsets


def _fact(rng, kind, used, person=None):
    return {**{s: _fresh(rng, s, used) for s in _SLOTS[kind]}, "P": person or _fresh(rng, "P", used)}


def _paragraph(rng, n_questions, v2, ids):
    used = set()
    n_sentences = rng.randint(9, 11) if rng.random() < 0.05 else rng.randint(3, 6)
    theme = rng.sample(sorted(KINDS), rng.randint(2, 3))
    facts, context = [], ""
    for _ in range(n_sentences):
        kind = rng.choice(theme)
        values = _fact(rng, kind, used)
        text, offsets = _fill(rng.choice(KINDS[kind][0]), values)
        start = len(context) + (1 if context else 0)
        context = f"{context} {text}" if context else text
        facts.append((kind, values, {s: start + o for s, o in offsets.items()}))
    qas, seen = [], set()
    while len(qas) < n_questions:
        if v2 and rng.random() < 1 / 3:
            # A relation not stated: a person of the paragraph in a relation it has no fact for, or strangers.
            kind = rng.choice(sorted(KINDS))
            others = [f[1]["P"] for f in facts if _GROUP.get(f[0], f[0]) != _GROUP.get(kind, kind)]
            person = rng.choice(others) if others and rng.random() < 0.6 else None
            values, starts = _fact(rng, kind, used, person), None
        else:
            kind, values, starts = rng.choice(facts)
        slot = rng.choice(sorted(KINDS[kind][1]))
        question, _ = _fill(rng.choice(KINDS[kind][1][slot]), values)
        if question in seen:
            continue
        seen.add(question)
        answers = [] if starts is None else [{"text": values[slot], "answer_start": starts[slot]}]
        qas.append({"id": next(ids), "question": question, "answers": answers,
                    **({"is_impossible": starts is None} if v2 else {})})
    return {"context": context, "qas": qas}


# The "version" field of the generated files: the official formats, marked as generated.
VERSION_1, VERSION_2 = "synthetic-1.1", "synthetic-2.0"
# Seed offsets of the generated evaluation splits, so they never repeat the training questions.
SYNTHETIC_SEED_OFFSET = {"train": 0, "validation": 1_000_003, "test": 2_000_006}


def synthetic_squad(split: str, questions: int, seed: int, version_2: bool) -> dict:
    """The generated `split` of a run with --synthetic_seed `seed`, as official nested SQuAD JSON with exactly
    `questions` questions; same seed, same data. A smaller count gives the first questions of a larger one (none
    depends on how many follow)."""
    seed += SYNTHETIC_SEED_OFFSET[split]
    rng = random.Random(seed)
    ids = (f"syn-{seed}-{i}" for i in range(questions))
    data, remaining, titles = [], questions, set()
    while remaining > 0:
        article = {"title": f"The {_fresh(rng, 'C', titles)} Records", "paragraphs": []}
        for _ in range(rng.randint(5, 10)):
            if remaining <= 0:
                break
            n = min(remaining, rng.randint(3, 6))
            article["paragraphs"].append(_paragraph(rng, n, version_2, ids))
            remaining -= n
        data.append(article)
    return {"version": VERSION_2 if version_2 else VERSION_1, "data": data}
