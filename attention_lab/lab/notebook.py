"""The lab's page for one text, inline in a notebook: `attention_lab.show(run, text)`.

The sample page is one self-contained HTML file (template, style, scripts and a JSON data island; nothing
fetched), so a notebook shows it in an iframe whose srcdoc is that file: its scripts run in their own document,
apart from the notebook's, and the output cell keeps working when the notebook is saved and opened offline.
The numbers come from the same functions as the lab's /api/analyze and sample.py's page (interp.analysis,
viewer.report.page_data).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import torch

from attention_lab.interp.analysis import analyze
from attention_lab.interp.interventions import parse_interventions
from attention_lab.sampling import encode_prompt, open_source
from attention_lab.viewer.page import render_page
from attention_lab.viewer.report import page_data
from data.files import atomic_write
from model import has_attention


@dataclass
class NotebookPage:
    """A page a notebook displays (IPython calls _repr_html_); `html` is the whole file, `save(path)` writes it."""

    html: str
    title: str
    height: int = 900

    def _repr_html_(self) -> str:
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" title="{html.escape(self.title)}" '
                f'style="width: 100%; height: {int(self.height)}px; border: 1px solid #ddd" '
                'sandbox="allow-scripts"></iframe>')

    def save(self, path) -> Path:
        path = Path(path)
        with atomic_write(path) as f:
            f.write(self.html)
        return path


def show(run=None, text: str = "", *, checkpoint=None, model: str | None = None, which: str = "best",
         runs_root="runs", interventions=None, height: int = 900) -> NotebookPage:
    """The attention page of `text` under a run's checkpoint (the latest run under runs_root when run is None;
    a checkpoint folder with checkpoint=...; a transformers GPT-2 / GPT-NeoX id or folder with model=...), with
    optional interventions ([{"kind": "zero", "layer": 0, "head": 1}, ...], as the lab's API takes them).
    Display it by leaving it last in a cell."""
    source = open_source(Path(run) if run is not None else None, Path(checkpoint) if checkpoint is not None else None,
                         model, which, Path(runs_root), torch.device("cpu"))
    if not has_attention(source.config):
        raise ValueError(f"{source.label} has no attention to show (model.arch={getattr(source.config, 'arch', '?')})")
    ids, notes = encode_prompt(source.tokenizer, text, source.config.block_size)
    items = parse_interventions(interventions or [], source.config, len(ids))
    found = analyze(source.model, ids, interventions=items)
    data = page_data(source.model, source.tokenizer, found)
    data["notes"] = list(data.get("notes", [])) + notes + [f"intervention: {it.label()}" for it in items]
    title = f"{source.run_dir.name}, step {source.step}: {len(ids)} tokens"
    return NotebookPage(render_page(data, title), title, height)
