"""Prompts for training and calibrating exit heads: where the text comes from.

The text the heads learn from is the target's own continuations (greedy and sampled) of the
prompts built here, never human-written answers, so no suite's reference answers can leak in.
The prompts are made in this file from templates (explanations, lists, how-to questions, short
factual questions, rewrites, small coding tasks) over topics written for this purpose; they
imitate the kinds of requests the suites hold, on other subjects.

Disjointness from the suites' evaluation items is checked, not assumed (`check_disjoint`): a
prompt is dropped when, after normalisation (case, punctuation, spaces), it equals a suite item's
prompt, shares a run of 8 words with one, or their content words overlap with a Jaccard index of
0.6 or more. Every shipped suite is checked (all items, not only the smoke subset), and the
provenance records how many prompts were dropped and the suites' hashes.

Splits are fixed by a hash of the prompt text (not by order), so adding prompts never moves an
existing prompt to another split: `train` (fits the heads), `valid` (held-out KL and agreement at
the end of training), `calib` (Learn-then-Test calibration) and `test` (the held-out check of the
calibrated bound).
"""
from __future__ import annotations

import hashlib
import re
from functools import lru_cache

SPLITS = {"train": (0, 55), "valid": (55, 65), "calib": (65, 85), "test": (85, 100)}  # percent ranges

TOPICS = (
    "the water cycle", "volcanoes", "earthquakes", "glaciers", "coral reefs", "deserts", "rainforests",
    "the Roman Empire", "the printing press", "the Silk Road", "ancient Egypt", "the Industrial Revolution",
    "the Renaissance", "the Vikings", "medieval castles", "the steam engine", "the telephone",
    "electric cars", "solar panels", "wind turbines", "batteries", "nuclear power plants", "recycling",
    "composting", "honey production", "cheese making", "bread baking", "coffee roasting", "tea ceremonies",
    "chess", "football tactics", "marathon training", "yoga", "swimming technique", "rock climbing",
    "birdwatching", "gardening in small spaces", "keeping houseplants alive", "raising chickens",
    "beekeeping", "sourdough starters", "fermentation", "spices", "chocolate", "olive oil",
    "the human heart", "sleep", "memory", "dreams", "muscles", "bones", "the immune system's fever response",
    "dental hygiene", "hydration", "stretching", "posture", "meditation", "stress",
    "public transport", "bicycles", "airplanes", "submarines", "bridges", "skyscrapers", "tunnels",
    "lighthouses", "maps", "compasses", "clocks", "calendars", "money", "banks", "budgets", "saving for a trip",
    "renting an apartment", "job interviews", "writing a cover letter", "time management", "teamwork",
    "public speaking", "learning a new language", "reading habits", "libraries", "museums", "theatre",
    "jazz", "the piano", "the violin", "photography", "painting with watercolours", "pottery", "knitting",
    "origami", "board games", "video game design", "spreadsheets", "databases", "passwords",
    "backups", "email etiquette", "open source software", "web browsers", "operating systems",
    "compilers", "unit tests", "version numbers", "sorting algorithms", "queues", "linked lists",
    "regular expressions", "JSON files", "the command line", "cloud storage", "robots", "satellites",
    "telescopes", "the Moon's phases", "comets", "black holes", "the northern lights", "clouds",
    "thunderstorms", "snowflakes", "wolves", "octopuses", "elephants", "penguins", "ants", "whales",
    "owls", "bats", "dolphins", "horses", "cats", "dogs' sense of smell",
)

TEMPLATES = (
    "Explain {topic} to a curious twelve-year-old.",
    "Write a short paragraph about {topic}.",
    "Give three interesting facts about {topic}.",
    "What are the most common misconceptions about {topic}?",
    "Describe the history of {topic} in a few sentences.",
    "What should a beginner know about {topic}?",
    "Write a haiku about {topic}.",
    "Compare {topic} with something from everyday life.",
    "Write two quiz questions about {topic}, with answers.",
    "Why do people find {topic} interesting? Answer briefly.",
)

# Small coding tasks; none is a task of the code suite (checked by check_disjoint as well).
CODE_TASKS = (
    "returns the number of words in a sentence that start with a capital letter",
    "returns the product of all numbers in a list",
    "converts minutes into a string of hours and minutes like '2h 05m'",
    "returns True if a list contains any duplicate values",
    "returns the average length of the words in a string",
    "swaps the keys and values of a dictionary whose values are unique",
    "returns the n-th triangular number",
    "pads a string on the left with zeros to a given width",
    "returns every second element of a list",
    "counts how many times each digit appears in an integer",
    "returns the largest even number in a list, or None if there is none",
    "converts a list of (name, score) pairs into a dictionary",
    "returns the initials of a full name",
    "checks whether a year is in the twentieth century",
    "returns the distance between two points in the plane",
    "removes all spaces from a string",
    "returns the number of days between two dates given as datetime.date objects",
    "returns a list of the squares of the odd numbers in a list",
    "replaces every negative number in a list by zero",
    "returns the longest run of equal consecutive elements in a list",
    "converts kilometres per hour to metres per second",
    "returns True if all characters of a string are digits",
    "splits a list into two halves",
    "returns the sum of the numbers on the border of a square matrix",
    "reads a CSV line and returns its fields, without the csv module",
    "returns the index of the smallest element of a list",
    "checks whether two lists have any element in common",
    "returns a string repeated n times with a separator between copies",
    "computes the simple interest on a loan",
    "returns the number of vowels at even positions in a string",
)

CODE_TEMPLATES = (
    "Write a Python function that {task}. Reply with only the code.",
    "In Python, how would you write a function that {task}? Explain briefly.",
)

QUESTIONS = (
    "How many strings does a standard guitar have?", "What colour do you get by mixing blue and yellow?",
    "Which animal is known for building dams in rivers?", "What do bees collect from flowers?",
    "What is the freezing point of water in Fahrenheit?", "How many minutes are in two hours?",
    "Which organ pumps blood through the body?", "What is the opposite of 'ancient'?",
    "How many players are on a volleyball team on court?", "What is the plural of 'mouse'?",
    "What instrument has black and white keys?", "Which season comes after autumn?",
    "How many wheels does a tricycle have?", "What gas do plants release during the day?",
    "What is the main ingredient of guacamole?", "What is 12 times 12?", "What is half of 90?",
    "Which direction does the sun rise from?", "What do you call a baby kangaroo?",
    "How many continents are there?", "What is the hardest natural material?",
    "Which sport uses a shuttlecock?", "What tool measures temperature?", "What is 9 squared?",
    "How many days are in a leap year?", "What is the largest ocean on Earth?",
)

REWRITES = (
    "Rewrite this sentence to sound more cheerful: 'The meeting is moved to Friday.'",
    "Make this sentence more formal: 'Hey, can you send me the file soon?'",
    "Turn this into a question: 'The train leaves at nine.'",
    "Shorten this sentence: 'Due to the fact that it was raining, we decided that we would stay inside.'",
    "Rewrite this in the future tense: 'She walks to school every day.'",
    "Rewrite this sentence without the word 'very': 'The soup was very very hot.'",
    "Correct the grammar: 'Me and him goes to the park yesterday.'",
    "Rewrite this as a polite request: 'Close the window.'",
    "Rewrite this so a child understands it: 'Precipitation is expected this afternoon.'",
    "Write this number in words: 4,315.",
)


def all_prompts() -> tuple[str, ...]:
    out = [t.format(topic=topic) for topic in TOPICS for t in TEMPLATES]
    out += [t.format(task=task) for task in CODE_TASKS for t in CODE_TEMPLATES]
    out += [q + " Answer briefly." for q in QUESTIONS]
    out += list(REWRITES)
    return tuple(dict.fromkeys(out))


# ----------------------------------------------------------------------------- disjointness

_STOP = set("a an the of to in on and or for with is are was be what which who how why do does you your "
            "it its that this as by at from into about give write short few some me my i can would should "
            "answer briefly reply only".split())


def _norm(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


def _grams(words: list[str], n: int = 8) -> set:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def _content(words: list[str]) -> set:
    return {w for w in words if w not in _STOP and len(w) > 2}


def _suite_texts() -> tuple[list[str], dict]:
    """Every prompt of every shipped suite (messages joined), and the suites' hashes."""
    from suites import list_suites, load_suite
    texts, hashes = [], {}
    for name in list_suites():
        try:
            suite = load_suite(name)
        except Exception:  # noqa: BLE001 - a suite that needs an optional package (humaneval) is
            continue       # checked where it loads; its prompts are code docstrings, far from ours
        hashes[suite.name] = suite.hash
        for item in suite.items:
            if item.prompt:
                texts.append(item.prompt)
            for m in item.messages or ():
                texts.append(m["content"])
    return texts, hashes


@lru_cache(maxsize=1)
def check_disjoint() -> tuple[tuple[str, ...], dict]:
    """(kept prompts, report): prompts that overlap a suite item are dropped (see the module
    docstring); the report says how many, and which suites were checked with their hashes."""
    texts, hashes = _suite_texts()
    suite_words = [_norm(t) for t in texts]
    exact = {" ".join(w) for w in suite_words}
    grams = set().union(*(_grams(w) for w in suite_words)) if suite_words else set()
    contents = [_content(w) for w in suite_words]
    kept, dropped = [], []
    for p in all_prompts():
        w = _norm(p)
        c = _content(w)
        clash = (" ".join(w) in exact or bool(_grams(w) & grams)
                 or any(c and s and len(c & s) / len(c | s) >= 0.6 for s in contents))
        (dropped if clash else kept).append(p)
    return tuple(kept), {"suites": hashes, "prompts": len(kept), "dropped_for_overlap": dropped}


def split_of(prompt: str) -> str:
    bucket = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16) % 100
    for name, (lo, hi) in SPLITS.items():
        if lo <= bucket < hi:
            return name
    raise AssertionError(bucket)  # pragma: no cover


def prompts(split: str) -> list[str]:
    """The prompts of one split, in a fixed order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    kept, _ = check_disjoint()
    return [p for p in kept if split_of(p) == split]
