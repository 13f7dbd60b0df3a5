"""`python -m attention_lab.ideas NAME [RUN] [--text "..."] [--out DIR]`: one idea of the tutorials on a run you
trained. Each idea opens the run (sample.py's choice when RUN is left out), measures with
attention_lab/interp/ideas.py from one recorded forward pass, prints a few numbers in plain words, and writes one
figure (attention_lab/viewer/ideas.py) to <run>/ideas/NAME.png, or DIR/NAME.png with --out.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attention_lab.ideas import published
from attention_lab.interp import ideas as measure
from attention_lab.interp.measures import position_losses
from attention_lab.runtime import cli
from attention_lab.runtime.device import cpu_model
from attention_lab.store.checkpoint import Checkpoint, CheckpointError, choose_run, load_checkpoint, run_summary
from attention_lab.store.layout import RunLayout, run_of_checkpoint
from attention_lab.training.config import OptimConfig
from attention_lab.training.evaluate import data_dir_of, tiling_windows
from attention_lab.training.loop import train_step
from attention_lab.training.optim import configure_optimizer, lr_at, lr_multiplier
from attention_lab.viewer import ideas as draw
from data.batches import BatchSampler, windows
from data.files import atomic_write
from data.prepare import PreparedData
from data.tokenizer import Tokenizer
from model import GPTConfig, has_attention, lstm_matching, num_params
from model.positions import RotaryPositions, sinusoidal_table
from model.registry import build_model

DEFAULT_TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?"
# the first is drawn on the right: a word whose contexts split in sense ("bear" the verb, "the bear" the animal);
# "will" stays for contrast: a modal verb in nearly every context
MEANING_WORDS = ("bear", "light", "will", "mean", "state")


@dataclass
class Opened:
    """A run's checkpoint, its model and tokenizer, and the folder its figures go to by default."""

    ckpt: Checkpoint
    model: torch.nn.Module
    tokenizer: Tokenizer
    run_dir: Path
    label: str  # the run folder, for titles


def open_run(run: Path | None, runs_root: Path, which: str = "best", say: Callable = print) -> Opened:
    """The named run, or the one sample.py would open (choose_run: the latest run of the default preset)."""
    choice = None
    if run is None:
        if not any(p.is_dir() for p in Path(runs_root).glob("**/checkpoints")):
            raise CheckpointError(f"no trained run under {Path(runs_root).resolve()}: train one with `make train` "
                                  "(the default run, about 8 minutes on a CPU), or name a run folder: "
                                  "python -m attention_lab.ideas NAME runs/<preset>/<time>")
        choice = choose_run(runs_root)
    ckpt = load_checkpoint(run if run is not None else choice.path, which)
    say(run_summary(ckpt, choice))
    model = ckpt.build_model("cpu")
    run_dir = run_of_checkpoint(ckpt.path)
    return Opened(ckpt, model, ckpt.tokenizer(), run_dir, f"{run_dir.parent.name}/{run_dir.name}")


def need_attention(opened: Opened, idea: str) -> None:
    if not has_attention(opened.model.config):
        raise ValueError(f"{opened.run_dir} is an LSTM (model.arch=lstm): it has no attention for `{idea}`; "
                         "name a transformer run")


def encode(opened: Opened, text: str) -> tuple[list[int], list[str]]:
    ids = opened.tokenizer.encode(text)[-opened.model.config.block_size:]
    if len(ids) < 2:
        raise ValueError(f"--text must encode to 2 tokens or more, got {len(ids)}")
    return ids, opened.tokenizer.token_strings(ids)


def save(fig, path: Path) -> Path:
    """The figure as a PNG, written atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    with atomic_write(path, "wb") as f:
        f.write(buffer.getvalue())
    return path


def fmt(values, digits: int = 2) -> str:
    return ", ".join(f"{v:.{digits}f}" for v in np.asarray(values).flatten())


# --- the ideas ------------------------------------------------------------------------------------------------------


def find_token(labels: Sequence[str], word: str, after: int = -1) -> int | None:
    """The first position after `after` whose token, stripped, is `word` (or `word` is a position)."""
    if word.lstrip("-").isdigit():
        return int(word) % len(labels)
    return next((i for i, s in enumerate(labels) if i > after and s.strip() == word), None)


def pick_pair(labels: Sequence[str], words: Sequence[str] | None) -> tuple[int, int]:
    wanted = list(words) if words else ["light", "break"]
    a = find_token(labels, wanted[0])
    b = find_token(labels, wanted[1], a if a is not None else -1)
    if a is None or b is None:
        if words:
            raise ValueError(f"--pair {' '.join(words)}: each must be a token of the text or a position; the "
                             f"tokens are {[s for s in labels]}")
        a, b = len(labels) // 3, 2 * len(labels) // 3
    return (a, b) if a < b else (b, a)


def idea_lookup(args, opened: Opened, out: Path) -> None:
    need_attention(opened, "lookup")
    ids, labels = encode(opened, args.text)
    a, b = pick_pair(labels, args.pair)
    lk = measure.lookup(opened.model, ids, a, b)
    n_layer, n_head = lk.ab.shape
    print(f"tokens a = '{labels[a]}' (position {a}) and b = '{labels[b]}' (position {b}); scores q.k / "
          f"sqrt(d_k), d_k = {opened.model.config.head_size}")
    print("q_a.k_b: what a looks for in b; q_b.k_a: what b looks for in a"
          + ("; first as the model computes them (after RoPE), then with q and k turned back (before RoPE: the words "
             "alone)" if lk.rope else ""))
    for line in lookup_table(lk):
        print(line)
    gap = np.abs(lk.ab - lk.ba)
    print(f"the two directions differ by {gap.mean():.3f} on average over the heads (from {gap.min():.3f} to "
          f"{gap.max():.3f}): a query and a key are two projections of a token, so what it looks for is not what it "
          f"offers. The model uses only q_b.k_a (b comes later and sees a, weight {fmt(lk.weight_ba.mean(1), 3)} per block, "
          f"mean over heads); q_a.k_b is masked (-inf): a cannot see b")
    n = lk.ab.size
    print(f"over the whole text ({lk.pairs} pairs of tokens x {n} heads): q_later.k_earlier is the model's own score, "
          f"with a weight above 0, in {lk.later_used:.1%} of them; q_earlier.k_later is -inf with weight exactly 0 in "
          f"{lk.earlier_unused:.1%}. Under the causal mask only what a later token looks for in an earlier one is ever "
          "used: half of each score matrix, and of the asymmetry drawn below, never reaches the output"
          if lk.earlier_unused == 1.0 else
          f"over the whole text ({lk.pairs} pairs x {n} heads): q_earlier.k_later is hidden (-inf, weight 0) in only "
          f"{lk.earlier_unused:.1%} of them: this model's mask ({getattr(opened.model.config, 'causal_mask', '?')}) "
          "lets earlier tokens use what later ones offer")
    layer = args.layer if args.layer is not None else 0
    tied = tied_labels = None
    tied_label = ""
    if args.tied is not None:
        other = open_run(args.tied, args.runs_root, args.which)
        if not getattr(other.model.config, "qk_tied", False):
            raise ValueError(f"--tied {args.tied} is not a qk_tied model: train one with model.qk_tied=true")
        tied_ids, tied_labels = encode(other, args.text)
        ta, tb = pick_pair(tied_labels, args.pair)
        tied = measure.lookup(other.model, tied_ids, ta, tb)
        tied_label = other.label
        print(f"qk_tied model {other.label}: largest |q_a.k_b - q_b.k_a| over heads = "
              f"{np.abs(tied.ab - tied.ba).max():.2e}, before RoPE {np.abs(tied.ab_content - tied.ba_content).max():.2e},"
              f" over every pair of the text {np.abs(tied.asymmetry).max():.2e}")
        print("with k = q the two scores are one number: positions do not change that (RoPE turns q and k of each "
              "token by the same angle, so k stays q); what breaks the symmetry is the mask: only the later "
              "token may look at the earlier one")
    else:
        print("pass --tied RUN (a run trained with model.qk_tied=true) to see the same table where k = q")
    fig = draw.lookup_figure(lk, labels, layer, opened.label, tied, tied_labels, tied_label)
    print(f"figure: {save(fig, out)}")


LOOKUP_COLUMNS = ("head", "q_a.k_b", "q_b.k_a", "before RoPE: q_a.k_b", "before RoPE: q_b.k_a")


def lookup_table(lk) -> list[str]:
    """The lookup table's lines: a header, then one row per head, every number right-aligned under its column's
    name (a column is as wide as its name, and at least 9)."""
    names = LOOKUP_COLUMNS if lk.rope else LOOKUP_COLUMNS[:3]
    widths = [max(len(n), 9) for n in names]
    lines = ["  ".join(n.rjust(w) if i else n.ljust(w) for i, (n, w) in enumerate(zip(names, widths)))]
    n_layer, n_head = lk.ab.shape
    for layer in range(n_layer):
        for h in range(n_head):
            values = [lk.ab[layer, h], lk.ba[layer, h]]
            if lk.rope:
                values += [lk.ab_content[layer, h], lk.ba_content[layer, h]]
            cells = [f"L{layer}H{h}".ljust(widths[0])] + [f"{v:+.3f}".rjust(w) for v, w in zip(values, widths[1:])]
            lines.append("  ".join(cells))
    return lines


def idea_scale(args, opened: Opened, out: Path) -> None:
    need_attention(opened, "scale")
    ids, _ = encode(opened, args.text)
    st = measure.scale_stats(opened.model, ids)
    print(f"d_k = {st.d_k}: the model multiplies q.k by {st.scale:.4f} (= 1/sqrt({st.d_k}))")
    print(f"spread (std) of the scores per block: with the scale {fmt(st.std_scaled)}; without {fmt(st.std_raw)}")
    print(f"softmax's largest weight in a row (mean): with {fmt(st.max_weight_scaled)}; without "
          f"{fmt(st.max_weight_raw)}")
    print(f"entropy of a row's weights (nats, mean): with {fmt(st.entropy_scaled)}; without {fmt(st.entropy_raw)}")
    if st.qk_norm:
        print(f"QK-norm: every q and k is rescaled to length sqrt(d_k) = {st.d_k ** 0.5:.2f} before the dot product "
              f"(measured |q|: {fmt(st.q_norm)}); straight out of the projection |q| ranged "
              + "; ".join(f"block {i}: {r[0]:.2f}..{r[2]:.2f}" for i, r in enumerate(st.q_norm_before)))
        print(f"so |q.k| <= d_k and every score |q.k / sqrt(d_k)| <= {st.bound:g}: the largest here is "
              f"{st.max_abs_scaled:.2f}. The scores cannot grow without limit, whatever the weights learn")
    else:
        print("this model has no QK-norm: the scores are bounded by nothing but the weights")
    print(f"check: softmax of the scaled scores equals the model's own weights to {st.pattern_error:.1e}")
    print(f"figure: {save(draw.scale_figure(st, opened.label), out)}")


def context_text(tokenizer: Tokenizer, window: np.ndarray, last: int = 10) -> str:
    return " ".join(tokenizer.decode(int(t) for t in window[-last:]).split())


def idea_meaning(args, opened: Opened, out: Path) -> None:
    need_attention(opened, "meaning")
    tok = opened.tokenizer
    data = PreparedData.open(data_dir_of(opened.run_dir, opened.ckpt.path))
    tokens = np.asarray(data.tokens("val"))
    width = min(args.width, opened.model.config.block_size)
    continues = frozenset(i for i, s in enumerate(tok.token_strings(range(tok.vocab_size))) if s[:1].isalpha())
    curves, sims, contexts, last = {}, {}, {}, {}
    for word in args.words.split(","):
        word = word.strip()
        ids = tok.encode(" " + word)
        if len(ids) != 1:  # a character vocabulary: the word's own character(s)
            ids = tok.encode(word)
        if len(ids) != 1:
            print(f"'{word}': not one token in this vocabulary ({len(ids)} tokens); left out")
            continue
        ends = measure.word_contexts(tokens, ids[0], width, args.contexts, tok.eot_id, continues)
        if len(ends) < 3:
            print(f"'{word}': {len(ends)} contexts in the held-out text; left out")
            continue
        wins = measure.windows_ending_at(tokens, ends, width)
        vectors = measure.last_token_vectors(opened.model, wins)  # (L + 1, N, C)
        curves[word] = measure.mean_pair_cosine(vectors)
        sims[word] = measure.cosine_matrix(vectors[-1])
        contexts[word], last[word] = wins, vectors[-1]
    if not curves:
        raise ValueError(f"none of {args.words} has 3 contexts in the held-out text; pass --words")
    rng = np.random.default_rng(0)
    starts = rng.choice(np.arange(width - 1, len(tokens) - 1), size=args.contexts * 4, replace=False)
    floor_ends = np.array([e for e in starts if tok.eot_id not in tokens[e - width + 1: e + 1]][: args.contexts])
    floor = measure.mean_pair_cosine(measure.last_token_vectors(opened.model,
                                                                measure.windows_ending_at(tokens, floor_ends, width)))
    layers = ["embedding"] + [f"block {i}" for i in range(len(floor) - 1)]
    docs = ", ".join(data.meta.get("val_docs") or [])
    print(f"held-out text{f' ({docs})' if docs else ''}; each context: the {width} tokens ending at "
          f"the word; mean cosine between the word's vectors in different contexts, at {', '.join(layers)}:")
    for word, c in curves.items():
        print(f"  '{word}' ({len(contexts[word])} contexts): {fmt(c)}")
    print(f"  two unrelated tokens (the floor): {fmt(floor)}")
    print("  (the floor is above 0 where the blocks have added to every token's vector a part they all share: a mean "
          "cosine above 0 means the vectors' directions no longer average out to nothing; what that shared part "
          "carries we have not measured)")
    for word, wins in contexts.items():
        (i, j, c), *_ = measure.nearest_pairs(last[word], 1)
        far = np.unravel_index(np.argmin(sims[word]), sims[word].shape)
        print(f"'{word}' after the last block, the nearest contexts (cosine {c:.2f}): c{i} \"...{context_text(tok, wins[i])}\""
              f" and c{j} \"...{context_text(tok, wins[j])}\"; the farthest ({sims[word][far]:.2f}): "
              f"c{far[0]} \"...{context_text(tok, wins[far[0]])}\" and c{far[1]} \"...{context_text(tok, wins[far[1]])}\"")
    first = next(iter(curves))
    for k, w in enumerate(contexts[first]):
        print(f"  c{k}: ...{context_text(tok, w)}")
    fig = draw.meaning_figure(curves, floor, sims[first], first, opened.label)
    print(f"figure: {save(fig, out)}")


def idea_positions(args, opened: Opened, out: Path) -> None:
    cfg = opened.model.config
    n = min(cfg.block_size, 128)
    table = sinusoidal_table(n, getattr(cfg, "n_embd", 64)).numpy()
    rope_cfg = cfg if isinstance(cfg, GPTConfig) else GPTConfig(n_embd=64, n_head=1)
    pe = opened.model.transformer.wpe if hasattr(opened.model, "transformer") else None
    inv_freq = (pe if isinstance(pe, RotaryPositions) else RotaryPositions(rope_cfg)).inv_freq
    angles = (torch.arange(n, dtype=torch.float32)[:, None] * inv_freq[None, :]).numpy()  # (P, hs/2)
    print(f"this run's positions: {getattr(cfg, 'pos_encoding', 'none (an LSTM reads in order)')}")
    print(f"sinusoid table: {n} positions x {table.shape[1]} dimensions; each pair of columns turns at its own speed, "
          f"from one turn every {2 * np.pi:.1f} positions (the first) to one every "
          f"{2 * np.pi * 10000 ** ((table.shape[1] - 2) / table.shape[1]):,.0f} (the last)")
    print(f"RoPE: each head's {len(inv_freq)} channel pairs turn by position x {float(inv_freq[0]):g} ... "
          f"{float(inv_freq[-1]):.2g} radians; a query at p and a key at p' meet at angle (p - p') x rate: the "
          "score sees their distance, not where they are")
    shuffle = None
    if has_attention(cfg):
        ids, labels = encode(opened, args.text)
        if len(ids) >= 3:
            shuffle = measure.shuffle_test(opened.model, ids, args.shuffles)
            print(f"attention without positions sees a set: block 0's trained attention, the query the last token "
                  f"'{labels[-1]}', the {len(ids) - 1} tokens before it shuffled {len(shuffle.orders)} times (the "
                  f"query kept last); how far the query's output moves (|change|, the output's own length "
                  f"{shuffle.size:.2f}):")
            print("  positions switched off: " + ", ".join(f"{c:.1e}" for c in shuffle.change_off)
                  + " (rounding: the same weighted sum over the same set of keys)")
            print(f"  with the model's {shuffle.encoding}: " + ", ".join(f"{c:.2f}" for c in shuffle.change_on)
                  + " (the order of the keys changes what the query reads)")
            print(f"  (with positions on, this is the model's own block 0 attention to {shuffle.own_error:.1e}; "
                  "switched off, the same trained weights with the rotation left out: what it computes is still a "
                  "softmax-weighted sum over the earlier tokens, whatever weights it has)")
    page = published.read_page()
    numbers = published.positions_by_length(page)
    if numbers:
        print("claim 'positions' (docs/claims.md, bits/byte on the test plays, mean of 5 seeds; 1x = the trained "
              "length, 2x and 4x longer):")
        for arm, v in numbers.items():
            print(f"  {arm:<11} " + ", ".join(f"{k}: {x:.3f}" for k, x in v.items()))
        worst = max(numbers, key=lambda arm: numbers[arm].get("1x", -1.0))
        best = min(numbers, key=lambda arm: numbers[arm].get("1x", float("inf")))
        print(f"at the trained length the worst is '{worst}' and the best '{best}' "
              f"({numbers[worst]['1x'] - numbers[best]['1x']:.3f} bits/byte apart); from 1x to 4x "
              + ", ".join(f"{arm} {v['4x'] - v['1x']:+.3f}" for arm, v in numbers.items() if "4x" in v)
              + ". Without positions a causal model still gets some order: the mask lets a token see how many "
                "tokens came before it")
    fig = draw.positions_figure(table, angles, numbers, opened.label, shuffle)
    print(f"figure: {save(fig, out)}")


SCHEDULE_UNITS = 1000  # the on-the-spot LSTM's schedule runs over this many units of its time budget


def train_lstm(cfg: GPTConfig, tokens: np.ndarray, minutes: float, lr: float, seed: int = 0,
               batch_size: int = 4, say: Callable = print) -> tuple[torch.nn.Module, int, float, float]:
    """The LSTM of the GPT's size (lstm_matching) trained with AdamW on `tokens` until `minutes` are spent (at
    least one step, and the step under way when the time runs out is finished); its schedule (warmup, cosine)
    follows the clock, as a run on a time budget does. -> (the model, the steps taken, the last training loss,
    the seconds spent)."""
    torch.manual_seed(seed)
    lcfg = lstm_matching(cfg)
    model = build_model(lcfg)
    oc = OptimConfig(name="adamw", lr=lr, min_lr=lr / 10, warmup_steps=SCHEDULE_UNITS // 10, schedule="cosine")
    opt = configure_optimizer(model, oc, torch.device("cpu"))
    sampler = BatchSampler(tokens, lcfg.block_size, batch_size, seed)
    model.train()
    start = time.perf_counter()
    budget = 60.0 * minutes
    step, loss, said = 0, float("nan"), 0
    while step == 0 or time.perf_counter() - start < budget:
        at = min(SCHEDULE_UNITS - 1, int((time.perf_counter() - start) / budget * SCHEDULE_UNITS))
        opt.set_lr_multiplier(lr_multiplier(at, oc, SCHEDULE_UNITS))
        loss, _ = train_step(model, opt, sampler, 1, torch.device("cpu"), torch.float32, 1.0)
        step += 1
        spent = time.perf_counter() - start
        if spent >= (said + 1) * budget / 4:
            said = int(spent * 4 // budget)
            say(f"  LSTM step {step}: train loss {loss:.3f} ({spent:.0f} s of {budget:.0f})")
    return model.eval(), step, float(loss), time.perf_counter() - start


def find_lstm_run(runs_root: Path) -> Path | None:
    """The newest run under runs_root whose config says model.arch=lstm and that has a checkpoint; None when
    there is none. (Its vocabulary is the data's, known once it is opened: the config's vocab_size is not it.)"""
    found = []
    for config in Path(runs_root).glob("**/config.json"):
        try:
            model_cfg = json.loads(config.read_text()).get("model", {})
        except (OSError, ValueError):
            continue
        layout = RunLayout(config.parent)
        if model_cfg.get("arch") == "lstm" and layout.checkpoints.is_dir() and any(layout.checkpoints.iterdir()):
            found.append((config.stat().st_mtime, config.parent))
    return max(found)[1] if found else None


def idea_rnn(args, opened: Opened, out: Path) -> None:
    need_attention(opened, "rnn")
    cfg = opened.model.config
    data = PreparedData.open(data_dir_of(opened.run_dir, opened.ckpt.path))
    lstm_run = args.lstm if args.lstm is not None else find_lstm_run(args.runs_root)
    lstm = open_run(lstm_run, args.runs_root, args.which) if lstm_run is not None else None
    if lstm is not None and has_attention(lstm.model.config):
        raise ValueError(f"--lstm {args.lstm} is not an LSTM run (model.arch=lstm)")
    if lstm is not None and lstm.model.config.vocab_size != cfg.vocab_size:
        why = (f"{lstm.label} has a vocabulary of {lstm.model.config.vocab_size} tokens, the transformer "
               f"{cfg.vocab_size}: the two must read the same tokens")
        if args.lstm is not None:
            raise ValueError(f"--lstm {why}; train the LSTM on the same data")
        print(f"the newest LSTM run, {why}; left out")
        lstm = None
    if lstm is not None:
        print(f"the LSTM: {lstm.label}" + ("" if args.lstm is not None else
                                           f" (the newest LSTM run under {args.runs_root}; --lstm RUN names another)"))
        lstm_model, lstm_label = lstm.model, f"LSTM {lstm.label} (step {lstm.ckpt.step})"
    else:
        print(f"no LSTM run of this data under {args.runs_root}: training an LSTM of the transformer's size here for "
              f"{args.minutes:g} minute(s) (--minutes), on the same data. That is far from a fair race: for one, "
              "train `python train.py model.arch=lstm name=lstm` (the default run's 8 minutes), and this command "
              "will use it")
        lstm_model, steps, loss, spent = train_lstm(cfg, data.tokens("train"), args.minutes, args.lstm_lr)
        print(f"  the LSTM took {steps} steps in {spent:.0f} s, train loss {loss:.3f}")
        lstm_label = f"LSTM, {steps} steps here"
    t = min(cfg.block_size, lstm_model.config.block_size)
    val = data.tokens("val")
    starts, first = tiling_windows(len(val), t)
    starts = starts[first == 0]
    starts = starts[np.linspace(0, len(starts) - 1, min(args.windows, len(starts))).astype(np.int64)]
    x, y = windows(val, starts, t)
    curves = {f"transformer (step {opened.ckpt.step})": position_losses(opened.model, x, y, 4),
              lstm_label: position_losses(lstm_model, x, y, 4)}
    p_gpt, p_lstm = num_params(opened.model), num_params(lstm_model)
    print(f"parameters: transformer {p_gpt:,}, LSTM {p_lstm:,}; loss (nats/token) on {len(starts)} held-out "
          f"windows of {t} tokens, by position:")
    print("  (the mean over positions 1, 2, 3-4, 5-8, ...: one number per doubling, named by its last position)")
    for name, c in curves.items():
        ends, means = measure.position_buckets(c)
        print(f"  {name:<28} " + ", ".join(f"{p}: {m:.2f}" for p, m in zip(ends, means)))
    for name, c in curves.items():
        early, late = c[: max(1, t // 16)].mean(), c[t // 2:].mean()
        print(f"  {name}: first {max(1, t // 16)} positions {early:.2f}, second half {late:.2f} "
              f"(context is worth {early - late:.2f} nats/token to it)")
    behind, gap = measure.lstm_behind(*curves.values())
    if behind:
        print(f"the LSTM is too undertrained to compare: its loss is above the transformer's at every position, by "
              f"{gap.min():.2f} to {gap.max():.2f} nats (a fair race, the rnn claim at equal steps, leaves 0.06 to "
              "0.17). It has not learnt to use context yet; its curve says nothing about recurrence against "
              "attention. Train a fair one: python train.py model.arch=lstm name=lstm")
    else:
        print(f"the LSTM's loss minus the transformer's, per doubling of the position: {fmt(gap)} nats")
    recall = published.recall_seeds(published.read_results("recall"))
    if recall:
        print("claim 'recall' (docs/claims.md § recall: one letter to recall from d tokens back): bits per recalled "
              "item (4 = chance, 0 = perfect), the median of the seeds, each seed in brackets (* a seed flagged as "
              "far from its arm; the claim keeps it in its verdicts and says so):")
        for arm, pts in recall.items():
            print(f"  {arm:<11} " + "; ".join(
                f"d={d}: {p.median:.2f} [" + ", ".join(f"{v:.2f}" + ("*" if bad else "")
                                                        for v, bad in zip(p.values, p.flagged)) + "]"
                for d, p in pts.items()))
        print("  the verdicts (which differences these seeds can tell, and at a second rate) are in docs/claims.md "
              "§ recall")
    threads = torch.get_num_threads()
    xb, yb = x[:4], y[:4]
    speed = {"transformer": measure.tokens_per_second(opened.model, xb, yb, args.repeats),
             "LSTM": measure.tokens_per_second(lstm_model, xb, yb, args.repeats)}
    fast, slow = sorted(speed, key=speed.get, reverse=True)
    print(f"training speed here (forward + backward, {xb.shape[0]} x {t} tokens, {threads} thread(s) each, "
          f"{cpu_model()}): transformer {speed['transformer']:,.0f} tokens/s, LSTM {speed['LSTM']:,.0f} tokens/s; "
          f"the {fast} {speed[fast] / speed[slow]:.1f}x faster (measured on the spot: other work on the machine "
          "moves it)")
    print("what 'parallel' means: the transformer computes all positions of a sequence in one matrix product per "
          "layer; the LSTM must loop over time, step t waiting for step t - 1. On a CPU with a few cores there is "
          "little to gain from that: the batch and the width already keep every core busy, so per token the two "
          "come out within a small factor of each other, either way round (the rnn claim's small models on one "
          "thread: the LSTM twice as fast). On a GPU, with thousands of cores, the loop's small steps leave most "
          "of them idle while one big matrix product fills them: that is where attention trains much faster.")
    fig = draw.rnn_figure(curves, recall, speed, threads, opened.label, behind)
    print(f"figure: {save(fig, out)}")


def idea_mask(args, opened: Opened, out: Path) -> None:
    need_attention(opened, "mask")
    ids, labels = encode(opened, args.text)
    row = measure.mask_row(opened.model, ids, args.layer or 0, args.head, args.query)
    q = row.query
    print(f"block {row.layer}, head {row.head}, query {q} '{labels[q]}' (of {len(ids)} tokens):")
    for j, (s, w) in enumerate(zip(row.scores, row.weights)):
        where = "future: hidden" if j > q else ("itself" if j == q else "")
        quoted = f"'{labels[j]}'"
        print(f"  key {j:>2} {quoted:<14} score {s:>8.3f}   weight {w:.4f}   {where}".rstrip())
    future = row.weights[q + 1:]
    print(f"the {len(future)} future keys: score -inf, weight exactly 0 ({int((future == 0).sum())} of "
          f"{len(future)} are 0.0); the {q + 1} visible weights sum to {row.weights[: q + 1].sum():.6f}")
    zero = row.weights_zero[q + 1:]
    if len(zero):
        grad = row.after_grad[q + 1:]
        vis, fut = np.exp(row.scores_open[: q + 1].astype(np.float64)), np.exp(row.scores_open[q + 1:].astype(np.float64))
        raised = vis.sum() / (vis.sum() + np.e * fut.sum())
        print(f"a 0 after the softmax instead (tutorial 4 warns against it): the softmax runs over every key, the "
              f"future's own scores q.k included ({fmt(row.scores_open[q + 1:], 3)}, from the recorded queries and "
              f"keys), and the {len(zero)} future weights are then set to 0. The visible weights sum to "
              f"{row.after_sum:.3f}, not 1: each is the -inf mask's weight times {row.after_sum:.3f}. The future is "
              f"out of the numerator but still in the denominator: the sum moves by {grad.sum():.3f} per unit of "
              f"every future key's score together ({fmt(grad, 3)} each), so with each future score 1 higher it "
              f"would be {raised:.3f}. What the query reads still depends on the tokens it must predict")
        print(f"a score of 0 instead of -inf (the other mistake, which `exercises check mask` names: 0 is a score "
              f"like any other, e^0 = 1): the softmax would give each of the {len(zero)} future keys {zero[0]:.4f}, "
              f"{zero.sum():.3f} of the row's weight in all: the query would read the tokens it must predict")
        first = measure.zero_instead_of_inf(torch.from_numpy(row.scores_all[0]), 0).numpy()
        print(f"  the first query (one visible key, score {row.scores_all[0, 0]:.3f}) would give the future "
              f"{first[1:].sum():.3f} of its weight (e^score against e^0 = 1 for each future key: the lower a row's "
              "visible scores, the more leaks)")
    print("why it matters: with the future hidden, the prediction at every position reads only the tokens before "
          "it, so one forward pass over a text trains all its next-token predictions at once, none of them "
          "able to copy its answer")
    print(f"figure: {save(draw.mask_figure(row, labels, opened.label), out)}")


def idea_residual(args, opened: Opened, out: Path) -> None:
    need_attention(opened, "residual")
    ids, labels = encode(opened, args.text)
    res = measure.residual(opened.model, ids, k=1)
    n = len(res.attn_norm)
    print(f"mean length of each vector per token: embedding {res.embed_norm:.2f}; "
          + "; ".join(f"block {i}: attention adds {res.attn_norm[i]:.2f}, MLP adds {res.mlp_norm[i]:.2f}"
                      for i in range(n)))
    print(f"the stream itself grows {fmt(res.stream_norm)} (entering each block, then leaving the last); "
          f"embedding + every addition = the last stream to {res.final_error:.1e}")
    words = [opened.tokenizer.token_strings(res.lens.ids[layer, :, 0]) for layer in range(n + 1)]
    last = len(ids) - 1
    print(f"logit lens after '{labels[last]}' (the last token), top next token at each depth: "
          + ", ".join(f"{'embedding' if d == 0 else f'block {d - 1}'}: '{words[d][last]}' "
                      f"({res.lens.probs[d, last, 0]:.2f})" for d in range(n + 1)))
    itself = float((res.lens.ids[0, :, 0] == np.asarray(ids)).mean())
    agree = [float((res.lens.ids[d, :, 0] == res.lens.ids[n, :, 0]).mean()) for d in range(n + 1)]
    print(f"read off the embedding, the lens names the input token itself at {itself:.0%} of the positions"
          + (" (the output matrix is the embedding matrix, tied)" if getattr(opened.model.config, "tie_embeddings",
                                                                           False) else "")
          + "; the top token agrees with the model's final one at " + ", ".join(
              f"{'embedding' if d == 0 else f'block {d - 1}'}: {a:.0%}" for d, a in enumerate(agree))
          + " of the positions")
    print(f"figure: {save(draw.residual_figure(res, words, labels, opened.label), out)}")


def logged_rates(metrics: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, lr) from a run's metrics.jsonl; None when it has none."""
    try:
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    pts = [(r["step"], r["lr"]) for r in rows if "lr" in r and "step" in r]
    return (np.array([p[0] for p in pts]), np.array([p[1] for p in pts])) if pts else None


def evaluation_pauses(metrics: Path) -> list[tuple[int, float]]:
    """(step, seconds) of each evaluation a run's metrics.jsonl records (a row with val_loss): the seconds are the
    sum of that row's seconds_* entries (the validation loss and each evaluation callback). No steps are taken
    meanwhile, but a schedule that follows a time budget's clock moves on: a drop in the logged rate there."""
    try:
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []
    return [(int(r["step"]), float(sum(v for k, v in r.items() if k.startswith("seconds_"))))
            for r in rows if "val_loss" in r and "step" in r]


def schedule(oc: OptimConfig, max_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps 0..max_steps - 1, the AdamW rate lr_at gives at each)."""
    steps = np.arange(max_steps)
    return steps, np.array([lr_at(int(s), oc, max_steps) for s in steps])


def followed_phases(steps: np.ndarray, lr: np.ndarray, peak: float, rtol: float = 1e-3) -> tuple[int, int] | None:
    """The logged rates (steps, lr) -> (the first logged step at the peak rate, the first logged step after it
    below the peak: where the decay began, or the last step when it never did); None when the peak was never
    logged (a run stopped inside its warmup)."""
    at_peak = np.flatnonzero(np.isclose(lr, peak, rtol=rtol))
    if not len(at_peak):
        return None
    first = at_peak[0]
    below = np.flatnonzero((np.arange(len(lr)) > first) & (lr < peak * (1 - rtol)))
    return int(steps[first]), int(steps[below[0]] if len(below) else steps[-1])


def idea_warmup(args, opened: Opened, out: Path) -> None:
    layout = RunLayout(opened.run_dir)
    try:
        config = json.loads(layout.config.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{layout.config} cannot be read ({e}): the schedule comes from the run's config") from None
    oc = OptimConfig(**config.get("optim", {}))
    max_steps = int(config.get("train", {}).get("max_steps", 0))
    if max_steps < 1:
        raise ValueError(f"{layout.config} names no train.max_steps")
    steps, lr = schedule(oc, max_steps)
    muon = lr / oc.lr * oc.muon_lr if oc.name == "muon" else None
    logged = logged_rates(layout.metrics)
    print(f"{oc.schedule} schedule over {max_steps} steps: warmup {oc.warmup_steps} steps from "
          f"{lr[0]:.2e} to {oc.lr:g}, then " + ("constant until the last " f"{oc.decay_frac:.0%} of the run, then linear"
                                               if oc.schedule == "wsd" else "cosine") + f" decay to {oc.min_lr:g}"
          + (f"; Muon's rate follows the same shape from {oc.muon_lr:g}" if muon is not None else ""))
    marks = sorted({0, oc.warmup_steps // 2, oc.warmup_steps, max_steps // 2, max_steps - 1} & set(steps.tolist()))
    print("the rate at step " + ", ".join(f"{s}: {lr[s]:.2e}" for s in marks))
    phases = None
    if logged is not None:
        train_cfg = config.get("train", {})
        budget, stop = train_cfg.get("max_minutes"), train_cfg.get("stop", "steps")
        phases = followed_phases(*logged, oc.lr)
        print(f"the schedule the run followed (the {len(logged[0])} rates it logged, the solid line in the figure): "
              + (f"warmup up to step {phases[0]}, {oc.lr:g} from there, decay from about step {phases[1]} (a rate "
                 f"is logged every {config.get('train', {}).get('log_interval', '?')} steps)"
                 if phases else "it never reached the peak rate")
              + f", the last at step {int(logged[0][-1])}: {logged[1][-1]:.2e}")
        if budget:
            print(f"it trained on a time budget ({budget:g} min, train.stop={stop}): the schedule's position is the "
                  "share of the budget spent times max_steps" + (" whenever that is further along than the step"
                                                                 if stop == "steps" else "")
                  + f", so on this machine the {max_steps}-step plan (faint) was squeezed into "
                  f"{int(logged[0][-1])} steps")
            pauses = [(s, sec) for s, sec in evaluation_pauses(layout.metrics) if s < logged[0][-1]]
            if pauses:
                per_second = max_steps / (60 * budget)
                print("the evaluations at step " + ", ".join(f"{s} ({sec:.1f} s)" for s, sec in pauses)
                      + " take no training step, but the clock runs on" + (" (where it leads the step)"
                                                                            if stop == "steps" else "")
                      + f": the schedule moves on about {per_second * np.mean([p[1] for p in pauses]):.0f} of its "
                      "steps during each, so the rate drops at once there: the small steps in the decaying line "
                      "(marked in the figure)")
    else:
        print("the run logged no rates (metrics.jsonl): the figure shows the plan alone")
    print("why warmup: at the start the weights are random and Adam's running estimate of each gradient's size "
          "rests on a handful of steps, so full-size steps can throw the model into a region it never recovers "
          "from (a loss spike); growing the rate over the first steps lets those estimates settle first")
    budgeted = logged is not None and config.get("train", {}).get("max_minutes")
    fig = draw.warmup_figure(steps, lr, muon, logged, oc.warmup_steps, opened.label, phases,
                             oc.muon_lr / oc.lr if muon is not None else None,
                             evaluation_pauses(layout.metrics) if budgeted else None)
    print(f"figure: {save(fig, out)}")


IDEAS: dict[str, tuple[Callable, str]] = {
    "lookup": (idea_lookup, "what a word looks for (q) differs from what it offers (k): q_a.k_b beside q_b.k_a"),
    "scale": (idea_scale, "1/sqrt(d_k): the scores' spread and the softmax with and without it; QK-norm's bound"),
    "meaning": (idea_meaning, "context changes a word's meaning: one word's vectors across contexts, by layer"),
    "positions": (idea_positions, "a shuffle with and without positions, the sinusoid table, RoPE's rotation, the "
                                  "positions claim's numbers"),
    "rnn": (idea_rnn, "the transformer against an LSTM of equal size: loss by position, recall, tokens/s"),
    "mask": (idea_mask, "a middle query's row: the future keys at -inf and weight exactly 0, beside their weights "
                        "zeroed after the softmax (the row no longer sums to 1) and a score of 0"),
    "residual": (idea_residual, "the residual stream through the blocks and the logit lens at each depth"),
    "warmup": (idea_warmup, "the schedule the run followed (its logged rates), the planned one, why it warms up"),
}
# what each idea costs: all of them read a trained run and take seconds; this one may train a model first
TRAINS = {"rnn": "TRAINS an LSTM for --minutes (default 1) unless runs/ holds an LSTM run (model.arch=lstm) or "
                 "--lstm names one; a fair one: python train.py model.arch=lstm name=lstm (8 minutes)"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m attention_lab.ideas",
                                description="One idea of the tutorials on a run you trained: numbers and a figure.")
    p.add_argument("name", nargs="?", help=f"the idea: {', '.join(IDEAS)} (--list says what each shows)")
    p.add_argument("run", nargs="?", type=Path,
                   help="run folder (default: the latest run of the default preset, as sample.py opens)")
    p.add_argument("--list", action="store_true", help="the ideas and what each shows")
    p.add_argument("--text", default=None, help=f"the text to read (default: the run's film prompt, train.probe_prompt, "
                                                  f"{DEFAULT_TEXT!r})")
    p.add_argument("--out", type=Path, default=None, help="folder for the figure (default: <run>/ideas/)")
    p.add_argument("--runs-root", type=Path, default=Path("runs"), help="where to look for the run (default: runs)")
    p.add_argument("--which", choices=("best", "latest"), default="best", help="checkpoint (default: best)")
    p.add_argument("--pair", nargs=2, metavar=("A", "B"), help="lookup: two tokens of the text (words or positions)")
    p.add_argument("--tied", type=Path, help="lookup: a run trained with model.qk_tied=true, for the same table")
    p.add_argument("--layer", type=int, default=None, help="lookup, mask: the block to draw (default 0)")
    p.add_argument("--head", type=int, default=0, help="mask: the head (default 0)")
    p.add_argument("--query", type=int, default=None, help="mask: the query position (default: the middle token)")
    p.add_argument("--words", default=",".join(MEANING_WORDS), help="meaning: words, comma-separated")
    p.add_argument("--contexts", type=int, default=12, help="meaning: contexts per word (default 12)")
    p.add_argument("--width", type=int, default=32, help="meaning: tokens of context before the word (default 32)")
    p.add_argument("--minutes", type=float, default=1.0, help="rnn: minutes to train an LSTM when runs/ has none "
                                                               "(default 1)")
    p.add_argument("--shuffles", type=int, default=5, help="positions: shuffles of the earlier tokens (default 5)")
    p.add_argument("--lstm-lr", type=float, default=0.01, help="rnn: the LSTM's AdamW rate (default 0.01)")
    p.add_argument("--lstm", type=Path, help="rnn: a trained LSTM run (model.arch=lstm) instead of training one")
    p.add_argument("--windows", type=int, default=32, help="rnn: held-out windows for loss by position (default 32)")
    p.add_argument("--repeats", type=int, default=3, help="rnn: timed forward+backward passes per model (default 3)")
    args = p.parse_args(argv)
    if not args.list and args.name is None:
        p.error(f"name an idea: {', '.join(IDEAS)} (or --list)")
    if args.name is not None and args.name not in IDEAS:
        p.error(f"unknown idea {args.name!r}; the ideas are {', '.join(IDEAS)}")
    if args.minutes <= 0:
        p.error(f"--minutes must be positive, got {args.minutes:g}")
    for flag in ("contexts", "width", "shuffles", "windows", "repeats"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be 1 or more, got {getattr(args, flag)}")
    if args.contexts < 3:
        p.error("--contexts must be 3 or more (a mean over pairs, and a nearest pair)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:  # argparse printed the usage and its "error: ..." (or --help)
        return e.code if isinstance(e.code, int) else 2
    if args.list:
        for name, (_, what) in IDEAS.items():
            print(f"{name:<10} {what}")
            print(f"{'':<10} {TRAINS.get(name, 'trains nothing: a few seconds on a trained run')}")
        return 0
    try:
        opened = open_run(args.run, args.runs_root, args.which)
        if args.text is None:
            try:
                probe = json.loads(RunLayout(opened.run_dir).config.read_text())["train"]["probe_prompt"]
            except (OSError, ValueError, KeyError, TypeError):
                probe = None
            args.text = probe or DEFAULT_TEXT
        out = (args.out if args.out is not None else RunLayout(opened.run_dir).ideas) / f"{args.name}.png"
        if out.parent.exists() and not out.parent.is_dir():
            raise ValueError(f"--out {out.parent} is a file; give a folder")
        IDEAS[args.name][0](args, opened, out)
    except (CheckpointError, OSError, *cli.USER_ERRORS) as e:
        return cli.fail(e)
    return 0
