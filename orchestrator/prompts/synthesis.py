"""Synthetic instruction prompts for training a drafter: made here, never downloaded, never scored on.

An EAGLE-3 head learns the target's own responses, so what matters is how varied the prompts are,
not who wrote them. The bundled Spec-Bench file has 240 questions (180 in the train split), far
too few: a head trained on their responses alone memorises them. This module makes as many as
asked, deterministically from a seed, in the shapes of the public benchmark's categories:
writing, roleplay, reasoning and math with fresh names and numbers, coding tasks, extraction,
explanation (STEM, humanities), open questions, translation, and summarisation / questions /
rewriting over passages taken from the docstrings of Python's own standard library (text on every
machine), some of them several passages long (copy-heavy responses, long positions).

    prompts = synthetic_prompts(3000, seed=0)       # list[Prompt], categories "synthetic-<kind>"
    python -m orchestrator.prompts.synthesis --n 20     # print a sample

`spectune train-drafter --synthetic-prompts N` adds N of them to the training prompts.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import random
import re
import warnings

from orchestrator.prompts.loading import Prompt


def _items(text: str) -> tuple[str, ...]:
    """A comma-separated list written as one block of text (the formatter keeps it a paragraph)."""
    return tuple(" ".join(t.split()) for t in text.split(",") if t.strip())


TOPICS = _items(
    """
    volcanoes, the Roman Empire, machine learning, climate change, coffee, the human heart, black holes,
    the French Revolution, photosynthesis, electric cars, jazz music, the stock market, honeybees, the
    Internet, ancient Egypt, vaccines, chess, renewable energy, the Moon landing, sleep, social media,
    the Amazon rainforest, democracy, earthquakes, bread baking, the Renaissance, quantum computing,
    marathon running, the printing press, coral reefs, cryptocurrency, Shakespeare, plate tectonics,
    meditation, the Silk Road, recycling, dinosaurs, the water cycle, urban gardening, artificial
    intelligence ethics, the Olympic Games, inflation, antibiotics, the Great Wall of China, solar
    panels, video games, the immune system, mountain climbing, the Industrial Revolution, smartphones,
    ocean tides, minimalism, public libraries, the Cold War, DNA, remote work, tea ceremonies, wind
    turbines, the Mars rovers, classical music, nutrition, bridges, the Byzantine Empire, rainbows,
    personal finance, wolves, the Pythagorean theorem, film photography, desert ecosystems, the printing
    of money, volunteering, cybersecurity, glaciers, impressionist painting, public transport, the
    history of medicine, robotics, friendship, time management, origami, the Vikings, rain forests,
    nuclear power, language learning, board games, the periodic table, hurricanes, space telescopes,
    street food, architecture, the Aztecs, electric guitars, data privacy, birds migration, poetry,
    small businesses, the theory of evolution, compost
    """
)

WRITING = (
    "Write a short blog post about {t}.",
    "Compose a poem about {t}.",
    "Write a persuasive essay arguing that everyone should learn about {t}.",
    "Draft an email to a colleague proposing a workshop on {t}.",
    "Write a short story in which {t} plays an important role.",
    "Write a product description for a board game about {t}.",
    "Write a speech for a school assembly about {t}.",
    "Write a letter to a friend explaining why you became interested in {t}.",
    "Write a news article about a new discovery related to {t}.",
    "Write a limerick about {t}.",
    "Create a catchy slogan and a short advertisement about {t}.",
    "Write a diary entry of someone who spent a day learning about {t}.",
)
ROLES = (
    "a ship captain",
    "a medieval knight",
    "a detective",
    "a science teacher",
    "a travel guide",
    "a chef",
    "an astronaut",
    "a museum curator",
    "a startup founder",
    "a park ranger",
    "a librarian",
    "a famous painter",
    "a sports coach",
    "a doctor",
)
ROLEPLAY = (
    "Pretend you are {r}. Explain {t} to a curious visitor.",
    "You are {r}. A child asks you about {t}. What do you say?",
    "Act as {r} and give three pieces of advice about {t}.",
    "Imagine you are {r} writing a short note about {t} to your team.",
)
EXPLAIN = (
    "Explain {t} in simple terms.",
    "What are the main causes and effects of {t}?",
    "Give me five interesting facts about {t}.",
    "What are the pros and cons of {t}?",
    "Describe the history of {t} in a few paragraphs.",
    "How does {t} affect everyday life?",
    "Compare {t} and {u}. How are they similar and different?",
    "What should a beginner know about {t}?",
    "Summarize the most important ideas about {t} for a high school student.",
    "Why is {t} important?",
    "What are common misconceptions about {t}?",
    "List the key terms someone needs to understand {t}, with short definitions.",
)
QUESTIONS = (
    "Who are some famous people associated with {t}?",
    "When did people first start studying {t}?",
    "Where can I learn more about {t}?",
    "What is the difference between {t} and {u}?",
    "Is {t} good or bad for the environment?",
    "How can I explain {t} to my grandmother?",
)
CODING = (
    "reverses a string",
    "checks whether a number is prime",
    "returns the n-th Fibonacci number",
    "counts the words in a text",
    "merges two sorted lists",
    "finds the most common element of a list",
    "converts Celsius to Fahrenheit",
    "checks whether a string is a palindrome",
    "computes the factorial of a number",
    "removes duplicates from a list while keeping order",
    "flattens a nested list",
    "computes the greatest common divisor of two integers",
    "sorts a list of dictionaries by a key",
    "reads a CSV file and returns the average of a column",
    "validates an email address",
    "implements binary search",
    "transposes a matrix",
    "counts the vowels in a string",
    "returns all permutations of a list",
    "parses a date string",
)
LANGS = ("Python", "JavaScript", "C++", "Java", "Go", "Rust")
CODING_T = (
    "Write a {lang} function that {task}.",
    "Write a {lang} function that {task}, and explain how it works.",
    "Here is a task: write code in {lang} that {task}. Include a few test cases.",
    "How would you write a function that {task} in {lang}?",
)
TARGETS = ("French", "German", "Spanish", "Italian", "Portuguese", "Chinese", "Japanese")
NAMES = (
    "Alice",
    "Bob",
    "Carla",
    "David",
    "Emma",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jamal",
    "Kate",
    "Liam",
    "Mina",
    "Noah",
    "Olga",
    "Pablo",
)
ITEMS = ("apples", "books", "pencils", "stickers", "marbles", "cookies", "tickets", "coins", "flowers", "cards")


def _math(r: random.Random) -> str:
    a, b, c = r.randint(3, 60), r.randint(2, 30), r.randint(2, 12)
    n1, n2 = r.sample(NAMES, 2)
    item = r.choice(ITEMS)
    return r.choice(
        (
            f"{n1} has {a} {item}. {n2} gives {n1} {b} more, and then {n1} shares them equally among {c} friends. How many does each friend get?",
            f"A store sells {item} at {c} dollars each. {n1} buys {a} of them and pays with {a * c + b} dollars. How much change does {n1} get?",
            f"What is {a} times {b} plus {c}? Show your steps.",
            f"A train travels {a * c} kilometers in {c} hours. What is its average speed? Explain.",
            f"{n1} reads {b} pages a day. How many days does it take to read a book of {a * b} pages?",
            f"Solve for x: {c}x + {b} = {c * a + b}.",
            f"The sum of two numbers is {a + b} and their difference is {abs(a - b)}. What are the numbers?",
            f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
        )
    )


def _reasoning(r: random.Random) -> str:
    n1, n2, n3 = r.sample(NAMES, 3)
    return r.choice(
        (
            f"{n1} is taller than {n2}, and {n2} is taller than {n3}. Who is the shortest? Explain your reasoning.",
            f"If all {r.choice(ITEMS)} in the box are red and {n1} takes one from the box, what color is it? Why?",
            f"{n1}, {n2} and {n3} finish a race. {n1} is not first, and {n3} finished right after {n1}. In what order did they finish?",
            f"A clock shows {r.randint(1, 11)}:{r.choice(('15', '30', '45'))}. What is the angle between its hands?",
            f"{n1} says {n2} is lying. {n2} says {n3} is lying. {n3} says both {n1} and {n2} are lying. Who tells the truth?",
        )
    )


STDLIB_MODULES = (
    """
    collections json argparse pathlib datetime random statistics string textwrap logging itertools
    functools os re subprocess threading unittest csv decimal fractions heapq bisect calendar email
    http.client urllib.parse sqlite3 zipfile tarfile shutil tempfile typing dataclasses enum contextlib
    difflib pprint inspect ast dis asyncio socket ssl pickle copy math cmath array queue sched selectors
    configparser gettext locale codecs unicodedata hashlib hmac secrets uuid base64 mailbox mimetypes
    html.parser xml.dom.minidom wave colorsys optparse getopt trace timeit cProfile pdb doctest weakref
    gc types abc numbers operator glob fnmatch
    """
).split()


def docstring_passages(min_words: int = 30, max_words: int = 220) -> list[str]:
    """Paragraph-sized English passages from the standard library's docstrings, in a fixed order."""
    passages: list[str] = []
    for name in STDLIB_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated modules still have docstrings
                mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this Python lacks is skipped
            continue
        objs = [mod] + [v for _, v in sorted(vars(mod).items()) if inspect.isclass(v) or inspect.isfunction(v)]
        for obj in objs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                doc = inspect.getdoc(obj) or ""
            for para in re.split(r"\n\s*\n", doc):
                text = " ".join(para.split())
                words = len(text.split())
                if min_words <= words <= max_words and not text.startswith((">>>", "..")) and "LIABLE" not in text.upper():
                    passages.append(text)
    return list(dict.fromkeys(passages))


def synthetic_prompts(n: int, seed: int = 0) -> list[Prompt]:
    """n prompts, categories cycling through the kinds above (deterministic for a seed)."""
    r = random.Random(seed)
    passages = docstring_passages()
    sentences = [s for p in passages for s in re.split(r"(?<=[.!?]) ", p) if 6 <= len(s.split()) <= 30]

    def topic() -> str:
        return r.choice(TOPICS)

    def long_passage() -> str:
        # 3-6 consecutive passages (mostly of one module): up to ~1000 words, as long as the articles a
        # summarisation prompt carries, so positions and copying that far back are trained too
        i = r.randrange(len(passages))
        return "\n\n".join(passages[i : i + r.randint(3, 6)])

    makers = {
        "writing": lambda: r.choice(WRITING).format(t=topic()),
        "roleplay": lambda: r.choice(ROLEPLAY).format(r=r.choice(ROLES), t=topic()),
        "explain": lambda: r.choice(EXPLAIN).format(t=topic(), u=topic()),
        "qa": lambda: r.choice(QUESTIONS).format(t=topic(), u=topic()),
        "math": lambda: _math(r),
        "reasoning": lambda: _reasoning(r),
        "coding": lambda: r.choice(CODING_T).format(lang=r.choice(LANGS), task=r.choice(CODING)),
        "translation": lambda: f"Translate the following sentence into {r.choice(TARGETS)}: {r.choice(sentences)}",
        "summarization": lambda: f"Summarize the following text in two sentences.\n\n{r.choice(passages)}",
        "extraction": lambda: f"Read the text below and list the technical terms it uses.\n\n{r.choice(passages)}",
        "rag": lambda: f"Using only the passage below, explain what it describes and when one would use it.\n\n{r.choice(passages)}",
        # copy-heavy kinds: responses that repeat long stretches of their prompt (what n-gram drafting
        # gets for free and a head must learn)
        "summarization-long": lambda: f"Summarize the following document.\n\n{long_passage()}",
        "qa-long": lambda: f"Read the document and answer: what are its main points, in its own words?\n\n{long_passage()}",
        "rewrite": lambda: f"Rewrite the following text so that it is easier to read, keeping every detail.\n\n{r.choice(passages)}",
        "continue": lambda: f"Repeat the following text, then continue it with one more paragraph.\n\n{r.choice(passages)}",
    }
    if not passages:  # no docstrings (python -OO): the kinds that need passages drop out
        for kind in ("translation", "summarization", "extraction", "rag", "summarization-long", "qa-long", "rewrite", "continue"):
            del makers[kind]
    kinds = list(makers)
    out, seen = [], set()
    misses = dict.fromkeys(kinds, 0)
    while len(out) < n and kinds:
        kind = kinds[len(out) % len(kinds)]
        text = makers[kind]()
        if text in seen:
            misses[kind] += 1
            if misses[kind] > 200:  # this kind has run out of new prompts
                kinds.remove(kind)
            continue
        misses[kind] = 0
        seen.add(text)
        out.append(Prompt(text, f"synthetic-{kind}", f"synthetic-{len(out)}"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for p in synthetic_prompts(a.n, a.seed):
        print(f"[{p.category}] {p.text[:200]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
