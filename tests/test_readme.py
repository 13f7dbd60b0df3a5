"""The README as a learner's front door (issue 42): every command its idea table names runs or names something that
exists, every link and #anchor it names (and every docs page's) exists, every term of the
project it uses is defined in docs/glossary.md and linked there at its first use, the table follows the tutorials'
order, the claims' method paragraph says what attention_lab/claims/catalog.py does, and the page stays short.

Fast: it reads files and runs `python -m attention_lab.ideas --list` and `sample.py --help` once each.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
GLOSSARY = REPO / "docs" / "glossary.md"
MAX_LINES = 170  # "about 150 lines": the engineering lives in docs/
# the ideas the issue asks to see in a trained model, each an `attention_lab.ideas` command the table must name
IDEAS = ("lookup", "scale", "mask", "positions", "meaning", "rnn", "residual", "warmup")
# the project's terms the README may use: each it uses is a heading of docs/glossary.md, linked at its first use
TERMS = ("bits/byte", "held-out plays", "bf16", "step inside", "RoPE", "residual stream", "logit lens", "LSTM",
         "recall curve", "QK-norm", "model view", "head view", "live lab", "role label", "previous-token head",
         "induction head", "stripe", "warmup", "training film", "phase change", "Muon", "preset", "ALiBi", "KV cache",
         "paired", "Holm", "region of practical equivalence", "holds", "reversed", "equivalent", "undecided",
         "Hydra", "TransformerLens", "MFU", "feed-forward layer")
# words a learner meets on the pages and in the commands' output, not in the README (issue 42's walk could not look
# them up): each is in a heading of docs/glossary.md with a definition; the pages' tooltips (explorer.js GLOSSES)
# are held to the same entries by tests/test_viewer.py
OUTPUT_WORDS = ("OV circuit", "QK circuit", "copying score", "copy@text", "\u00b7TL", "ent", "c_proj", "probe", "nats",
                "wsd", "MLP", "\u0394loss", "\u0394val", "prev", "dup", "ind", "first")
TUTORIALS = ('Ryan Xu, "Motivating Self-Attention", *Towards Data Science*, 2023', "Transformer 之自注意力机制(一)",
             "Self-Attention | 自注意力", "注意力机制", "What is Query, Key, and Value (QKV) in the Transformer")
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")
CLAIMS_START, CLAIMS_END = "<!-- claims table: python -m attention_lab.claims docs -->", "<!-- end claims table -->"


def readme() -> str:
    return README.read_text(encoding="utf-8")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, '-', '_' and spaces kept),
    spaces to '-'."""
    text = heading.strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file (outside code blocks), with GitHub's -1, -2 for repeats."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[str, str]]:
    """(text, target) of every markdown link and image outside code blocks."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return LINK.findall(text)


def table_rows() -> list[list[str]]:
    """The idea table's rows: cells of the lines that start with '| <number> |'."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in readme().splitlines()
            if re.match(r"\| \d+ \|", line)]
    assert rows, "the README's idea table (rows '| 1 | idea | where | what you will see |') is missing"
    return rows


@pytest.fixture(scope="module")
def ideas_listed() -> set[str]:
    done = subprocess.run([sys.executable, "-m", "attention_lab.ideas", "--list"], cwd=REPO, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"python -m attention_lab.ideas --list failed:\n{done.stderr[-2000:]}"
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip() and not line.startswith(" ")}


# ------------------------------------------------------------------------------------------------------ the idea table

def test_the_table_follows_the_tutorials_order_and_names_every_idea():
    rows = table_rows()
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1)), "the idea table's rows are numbered 1, 2, ..."
    firsts = []
    for number, idea, where, what in (r[:4] for r in rows):
        cited = re.search(r"\(([1-5](?:, [1-5])*)\)$", idea)
        assert cited, f"row {number}: the idea should end with the tutorials that teach it, e.g. '(1, 4)': {idea!r}"
        firsts.append(min(int(n) for n in cited.group(1).split(", ")))
        assert where and what, f"row {number} says where or what you will see with an empty cell"
    assert firsts == sorted(firsts), (
        f"the table should follow the tutorials' order (each row's first tutorial: {firsts})")
    named = {m for r in rows for m in re.findall(r"attention_lab\.ideas (\w+)", r[2])}
    assert set(IDEAS) <= named, f"ideas the table should point to and does not: {sorted(set(IDEAS) - named)}"


def test_the_tutorials_are_named():
    text = readme()
    for title in TUTORIALS:
        assert title in text, f"the README should name the tutorial {title!r}"


def test_every_command_in_the_idea_table_runs_or_names_what_exists(ideas_listed):
    from attention_lab.claims.catalog import CLAIMS
    from attention_lab.exercises import EXERCISES

    checked = 0
    for row in table_rows():
        where = row[2]
        commands = re.findall(r"`(python [^`]+)`", where)
        notebooks = re.findall(r"\]\((notebooks/[^)]+)\)(?: § \"([^\"]+)\")?", where)
        for cmd in commands:
            words = cmd.split()
            if words[1] == "-m":
                module = words[2]
                assert importlib.util.find_spec(module) is not None, f"row {row[0]}: `{cmd}`: no module {module}"
                if module == "attention_lab.ideas":
                    assert words[3] in ideas_listed, (
                        f"row {row[0]}: `{cmd}`: {words[3]!r} is not one of `python -m attention_lab.ideas --list`'s "
                        f"ideas ({sorted(ideas_listed)})")
                elif module == "attention_lab.exercises":
                    assert words[3] == "start" and words[4] in EXERCISES, f"row {row[0]}: `{cmd}`: no such exercise"
                elif module == "attention_lab.claims":
                    assert words[3] in CLAIMS, f"row {row[0]}: `{cmd}`: no claim {words[3]!r}"
                else:
                    importlib.import_module(module)  # the package the -m names imports
            elif words[1] == "train.py":
                for w in words[2:]:
                    if w.startswith("experiment="):
                        preset = REPO / "configs" / "experiment" / f"{w.split('=', 1)[1]}.yaml"
                        assert preset.exists(), f"row {row[0]}: `{cmd}`: no preset {preset.name}"
            elif words[1] == "sample.py":
                import sample

                args = sample.parse_args([w.strip('"') for w in words[2:]])  # the flags it is given parse
                assert args.prompt, f"row {row[0]}: `{cmd}` parsed without its prompt"
            else:
                pytest.fail(f"row {row[0]}: `{cmd}`: this test does not know how to check it; teach it")
            checked += 1
        for path, section in notebooks:
            nb = REPO / path
            assert nb.exists(), f"row {row[0]}: {path} does not exist"
            if section:
                headings = re.findall(r"^# #+ (.+)$", nb.read_text(encoding="utf-8"), re.M)
                assert any(h.startswith(section) for h in headings), (
                    f"row {row[0]}: {path} has no section {section!r} (its sections: {headings})")
            checked += 1
        assert commands or notebooks, f"row {row[0]} names nothing to run or open: {where!r}"
    assert checked >= len(table_rows())


def test_every_make_target_the_readme_names_exists():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    named = set(re.findall(r"`make ([a-z][\w-]*)", readme()))
    assert named, "the README names `make train` and `make test`"
    assert named <= targets, f"the README names make targets the Makefile lacks: {sorted(named - targets)}"


# ----------------------------------------------------------------------------------------------- links and anchors

@pytest.mark.parametrize("page", ["README.md", *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md")))])
def test_every_link_and_anchor_exists(page):
    """The README's links, and every docs page's (a section moved out of the README leaves no link behind)."""
    source = REPO / page
    broken = []
    for text, target in links(source):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        path, _, anchor = target.partition("#")
        dest = (source.parent / path).resolve() if path else source
        if not dest.exists():
            broken.append(f"[{text}]({target}): no file {dest.relative_to(REPO) if REPO in dest.parents else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"[{text}]({target}): no heading with anchor #{anchor} in {dest.name}")
    assert not broken, f"{page}: broken links:\n" + "\n".join(broken)


def test_the_slug_rule_matches_githubs_on_known_headings():
    assert slug("Is my `make train` normal? Expected scores per CPU kind") == \
        "is-my-make-train-normal-expected-scores-per-cpu-kind"
    assert slug("An induction head in 3.5 minutes: `python train.py experiment=induction`") == \
        "an-induction-head-in-35-minutes-python-trainpy-experimentinduction"
    assert slug("bits/byte") == "bitsbyte" and slug("Holm's correction") == "holms-correction"


# ------------------------------------------------------------------------------------------------------ the glossary

def _occurrence(term: str) -> re.Pattern:
    words = r"\s+".join(re.escape(w) for w in term.split())  # a term may wrap onto the next line
    return re.compile(r"(?<![\w-])" + words + r"(?:s|es)?(?!\w)", re.I)


def test_every_term_the_readme_uses_is_in_the_glossary_and_linked_at_first_use():
    text = readme()
    outside = text.split(CLAIMS_START)[0] + text.split(CLAIMS_END)[-1]  # the generated table is another's text
    glossary = GLOSSARY.read_text(encoding="utf-8")
    entries = dict(re.findall(r"^### ([^\n]+)\n\n(.+?)(?=\n### |\n## |\Z)", glossary, re.M | re.S))
    headings = {slug(h): h for h in entries}
    glossary_links = [(m.start(), m.end(), m.group(2).partition("#")[2]) for m in LINK.finditer(outside)
                      if m.group(2).startswith("docs/glossary.md#")]
    used = [t for t in TERMS if _occurrence(t).search(outside)]
    assert len(used) >= 20, f"the README uses only {used} of the glossary's terms: has the list gone stale?"
    for term in used:
        defined = [h for h in entries if term.lower() in h.lower()]
        assert defined, f"the README uses {term!r} and docs/glossary.md has no entry for it (a '### {term}' heading)"
        assert all(len(entries[h].strip()) >= 80 for h in defined), f"the glossary's entry for {term!r} says nothing"
        first = _occurrence(term).search(outside).start()
        inside = [anchor for start, end, anchor in glossary_links if start <= first < end]
        assert inside, (f"the README's first use of {term!r} (…{outside[max(0, first - 60):first + 40]!r}…) is not "
                        "a link to docs/glossary.md")
        assert inside[0] in headings and term.lower() in headings[inside[0]].lower(), (
            f"the README's first {term!r} links docs/glossary.md#{inside[0]}, which is not its entry")


def glossary_entries() -> dict[str, str]:
    """docs/glossary.md's entries: heading -> its text."""
    return dict(re.findall(r"^### ([^\n]+)\n\n(.+?)(?=\n### |\n## |\Z)", GLOSSARY.read_text(encoding="utf-8"),
                           re.M | re.S))


@pytest.mark.parametrize("word", OUTPUT_WORDS)
def test_the_words_of_the_pages_and_the_commands_output_are_in_the_glossary(word):
    entries = glossary_entries()
    pattern = re.compile(r"(?<![\w·])" + re.escape(word) + r"(?![\w])")
    defined = [h for h in entries if pattern.search(h)]
    assert defined, f"{word!r} appears on the pages or in a command's output and docs/glossary.md has no entry for it"
    assert all(len(entries[h].strip()) >= 80 for h in defined), f"the glossary's entry for {word!r} says nothing"


def test_sample_pys_head_table_points_to_the_glossary_and_every_word_it_prints_has_an_entry():
    """The table sample.py prints before it names the page (interp/heads.py format_head_table, every column on):
    its footnote names docs/glossary.md, and each word of its header (prev·TL read as prev and ·TL) and the
    footnote's own terms (OV circuit, nats) are glossary headings with a definition (issue 42's walk met `OV
    circuit`, `copy`, `·TL`, `ent` there and could not look them up)."""
    import numpy as np

    from attention_lab.interp.heads import format_head_table, head_rows
    from attention_lab.interp.roles import ROLES

    grid = np.full((1, 2), 0.25)
    table = format_head_table(head_rows({r: grid for r in ROLES}, grid, grid, grid))
    n_rows = grid.size
    header, footnote = table.splitlines()[0], "\n".join(table.splitlines()[1 + n_rows:])  # the legend under the rows
    assert "docs/glossary.md" in footnote, f"the table's legend should point to docs/glossary.md: {footnote!r}"
    words = set()
    for column in header.split():
        words |= {column} if "\u00b7" not in column else {column.split("\u00b7")[0], "\u00b7" + column.split("\u00b7")[1]}
    words |= {w for w in ("OV circuit", "nats", "c_proj", "probe") if w in footnote}
    assert {"copy", "copy@text", "ent", "\u00b7TL", "ablation", "OV circuit"} <= words, f"the table changed: {words}"
    # ... and the legend explains every column the header prints, by its name at the start of a legend line
    keys = {k for line in footnote.splitlines()[1:] if line.startswith("  ") and not line.startswith("   ")
            for k in re.split(r"\s{2,}", line.strip())[0].split()}
    header_words = {w for column in header.split()[1:] for w in
                    ([column] if "\u00b7" not in column else ["\u00b7" + column.split("\u00b7")[1]])}
    assert header_words <= keys, f"the legend never explains {sorted(header_words - keys)}:\n{footnote}"
    entries = glossary_entries()
    for word in sorted(words):
        pattern = re.compile(r"(?<![\w\u00b7])" + re.escape(word) + r"(?![\w])", re.I)
        defined = [h for h in entries if pattern.search(h)]
        assert defined, f"sample.py's head table prints {word!r} and docs/glossary.md has no entry for it"
        assert all(len(entries[h].strip()) >= 80 for h in defined), f"the glossary's entry for {word!r} says nothing"


# ------------------------------------------------------------------------------------ the claims section, the length

def test_the_claims_section_comes_after_the_learners_material_and_states_the_method_catalog_runs():
    from attention_lab.claims.catalog import BASE_LR, RATES, SEEDS, SWEEP_SEEDS

    text = readme()
    assert text.count(CLAIMS_START) == 1 and text.count(CLAIMS_END) == 1, "the claims table's markers, once each"
    section = text.index("## The tutorials' claims, tested")
    for learners in ("## From the tutorials to your model", "## The pages you open", "## Write it yourself"):
        assert text.index(learners) < section, f"{learners!r} should come before the claims"
    method = " ".join(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text[section:text.index(CLAIMS_START)]).split())
    rate = re.search(r"\(([\d.e-]+), the base preset's", method)
    assert rate and float(rate.group(1)) == BASE_LR, f"the claims' fixed rate is {BASE_LR:g}, the base preset's"
    assert f"{len(RATES)} rates on {len(SWEEP_SEEDS)} sweep seeds" in method, "the sweep's rates and seeds"
    words = {3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"{words.get(len(SEEDS), len(SEEDS))} seeds paired" in method, f"the verdicts use {len(SEEDS)} paired seeds"
    assert "at the level of its Holm step" in method, "each interval is read at its Holm step's level"
    assert "95%" not in method, "the intervals are at Holm's step's level, not 95% each"


def test_the_readme_stays_short():
    n = len(readme().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; keep it to about 150 and move detail to docs/"


def test_the_file_exercises_start_writes_by_default_is_ignored_by_git():
    """`python -m attention_lab.exercises start mask` (the README's row 11) writes my_attention/mask.py in the
    learner's clone: git must not list it as a change to commit."""
    from attention_lab.exercises.checking import default_file

    folder = default_file("mask").parent.as_posix()  # read from .gitignore: a copy of the tree need not be a clone
    patterns = {line.strip().strip("/") for line in (REPO / ".gitignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert folder in patterns, f"{default_file('mask')} is not git-ignored: add {folder}/ to .gitignore"


def test_the_first_screen_marks_make_test_for_developers_and_names_the_cpu_the_docs_were_measured_on():
    """A learner's first minute: `make train` is their step, `make test` (the whole suite, minutes of CPU) is not;
    and the CPU kind every claim and docs/ideas.md number came from (AMD EPYC with AVX512-BF16) is listed with a
    score docs/recipe.md records for it, so a learner on that machine can tell their run is normal."""
    first = readme().split("\n## ", 1)[0]
    line = next((x for x in first.splitlines() if x.startswith("make test")), "")
    assert "for developers" in line, f"the first screen's `make test` line must say it is for developers: {line!r}"
    said = re.search(r"\*\*(\d\.\d{3}) bits/byte\*\* in ([\d,]+) steps on a 2-core AMD EPYC with\s+AVX512-BF16", first)
    assert said, "the first screen names the AMD EPYC with AVX512-BF16 and its make train score"
    recipe = (REPO / "docs" / "recipe.md").read_text(encoding="utf-8")
    rows = [r for r in recipe.splitlines() if r.startswith("| AMD EPYC, AVX512-BF16")]
    assert any(f"| {said[2]} | {said[1]} |" in r for r in rows), \
        f"{said[1]} bits/byte in {said[2]} steps is no AVX512-BF16 EPYC row of docs/recipe.md"
