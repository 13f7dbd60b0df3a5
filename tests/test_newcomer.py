"""What a newcomer reads says one thing one way (issue 36): `model.attn_impl` is spelled `FILE.py:attention` in the
README, docs/, the exercises' listing and every skeleton `start` writes (with its own path filled in)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attention_lab.exercises import EXERCISES, listing, skeleton, start

REPO = Path(__file__).resolve().parent.parent
SPELLING = re.compile(r"model\.attn_impl=([^\s`'\"),]+)")


def texts(tmp_path: Path) -> dict[str, str]:
    out = {str(p.relative_to(REPO)): p.read_text(encoding="utf-8")
           for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
    out["exercises listing"] = listing()
    for name in EXERCISES:
        out[f"skeleton {name}"] = start(name, tmp_path / "my_attention").read_text(encoding="utf-8")
    return out


def test_model_attn_impl_is_spelled_one_way(tmp_path):
    seen = {}
    for where, text in texts(tmp_path).items():
        if not where.endswith(".md"):  # what `start` wrote and the listing (docs may name the placeholder)
            assert "THIS_FILE" not in text, f"{where} still holds the placeholder THIS_FILE"
        for value in SPELLING.findall(text):
            seen.setdefault(value, where)
            assert value.endswith(".py:attention"), (
                f"{where}: model.attn_impl={value} is not spelled FILE.py:attention, as everywhere else")
    assert "my_attention/attention.py:attention" in seen, sorted(seen)
    written = start("attention", tmp_path / "mine").read_text(encoding="utf-8")
    assert f"model.attn_impl={(tmp_path / 'mine' / 'attention.py').as_posix()}:attention" in written, (
        "the skeleton should name the file it was written to")
    assert skeleton("attention").count("my_attention/attention.py") >= 2


# ------------------------------------------------------------------------------------------------ the lab's API errors

from test_lab_server import BAD, LOCAL, client, post, runs  # noqa: E402,F401  (fixtures: the lab over two runs)

# each error names what to send: an example, the allowed values, or where the valid ones are listed
SAYS_WHAT_TO_SEND = ("send", "such as", "must be", "GET /api/models", "work with it", "at most", "reads at most")


@pytest.mark.parametrize("path, body, status, words", BAD, ids=[f"{i}-{b[0].split('/')[-1]}" for i, b in
                                                                 enumerate(BAD)])
def test_every_api_error_says_what_to_send(client, path, body, status, words):
    got, answer = post(client, path, body)
    assert any(w in answer["error"] for w in SAYS_WHAT_TO_SEND), f"{path}: {answer['error']!r} says not what to send"


def test_compare_on_a_one_model_lab_says_what_to_send(runs):
    from starlette.testclient import TestClient

    from attention_lab.lab.app import create_app
    from attention_lab.lab.models import Registry

    with TestClient(create_app(Registry.open([runs["gpt"]])), base_url=LOCAL) as c:
        got, answer = post(c, "/api/compare", {"text": "ab"})
    assert got == 422, answer
    assert '"models": ["0", "0"]' in answer["error"] and "checkpoints" in answer["error"], answer
    assert "unknown model" not in answer["error"], answer


def test_the_logit_lens_line_shows_a_newline_once_escaped(tmp_path, capsys):
    from test_sample import make_run

    import sample

    run = make_run(tmp_path / "run")
    assert sample.main(["--run", str(run), "--prompt", "ROMEO:\n", "--max-new-tokens", "0", "--out",
                        str(tmp_path / "s"), "--no-html", "--device", "cpu"]) == 0
    line = (tmp_path / "s" / "summary.txt").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert line.startswith("logit lens after '\\n' ("), line
    assert "\\\\" not in line and " p=" in line, line


def test_every_ablation_number_says_what_its_sign_means():
    """A negative Δ (the film's Δprobe -0.78 beside Δval +0.56) is one hover away from its meaning."""
    from attention_lab.interp.heads import format_head_table
    from attention_lab.interp.roles import ABLATION_TABLE, ROLES

    for role in ABLATION_TABLE:
        assert "+ the model needs" in role.help and "- it does better without it" in role.help, role.help
    rows = [{"layer": 0, "head": 0, "role": "mixed", "ablation": -0.5} | {r: 0.1 for r in ROLES}]
    assert "- it does better without it" in format_head_table(rows)
