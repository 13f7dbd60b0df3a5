"""Training: the debug preset end to end, exact resume, Ctrl-C, SIGKILL, NaN, bad input, and TensorBoard logs."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train as train_mod
from attention_lab.store.checkpoint import HOOK_ENV, CheckpointError, load_checkpoint
from attention_lab.training.config import CONFIG_DIR, OptimConfig, compose
from attention_lab.training.optim import configure_optimizer, lr_at
from attention_lab.training.start import TrainingError

REPO = Path(__file__).resolve().parent.parent


def debug_config(cache_dir: Path, *overrides: str):
    return compose(["experiment=debug", f"data.cache_dir={cache_dir}", *overrides])


def read_metrics(run_dir: Path) -> tuple[dict[int, float], dict[int, dict]]:
    train_losses, evals = {}, {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row:
            train_losses[row["step"]] = row["loss"]
        if "val_loss" in row:
            evals[row["step"]] = row
    return train_losses, evals


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory, data_cache):
    run_dir = tmp_path_factory.mktemp("debug_run")
    cfg = debug_config(data_cache, "train.log_interval=1")
    final = train_mod.train(cfg, run_dir)
    return run_dir, final, cfg


def test_debug_run_trains_and_writes_everything(debug_run):
    run_dir, final, cfg = debug_run
    assert final["step"] == cfg.train.max_steps, f"run stopped early: {final}"
    assert math.isfinite(final["val_loss"]) and math.isfinite(final["val_bpb"]), final
    losses, evals = read_metrics(run_dir)
    assert sorted(losses) == list(range(1, cfg.train.max_steps + 1)), "one train loss per step expected"
    first, last = losses[1], losses[cfg.train.max_steps]
    assert last < first, f"loss did not go down over the debug run: {first:.3f} -> {last:.3f}"
    assert sorted(evals) == [10, 20], f"evaluations expected at steps 10 and 20, got {sorted(evals)}"
    for name in ("config.json", "provenance.json", "console.log"):
        assert (run_dir / name).is_file(), f"{name} missing from the run directory"
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["packages"]["torch"] == torch.__version__.split("+")[0] or prov["packages"]["torch"].startswith(
        torch.__version__.split("+")[0]), prov["packages"]
    assert "commit" in prov["git"]
    ckpt = load_checkpoint(run_dir, "latest")
    assert ckpt.step == 20 and (ckpt.path / "train_state.pt").is_file()
    best = load_checkpoint(run_dir, "best")
    assert best.meta["val_loss"] == pytest.approx(min(e["val_loss"] for e in evals.values()))
    state = ckpt.train_state()
    assert set(state) >= {"step", "optimizer", "sampler", "rng", "best_val_loss"}, sorted(state)
    keys = ckpt.build_model().state_dict().keys()
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in keys), "wrapper prefixes leaked into weights"


def test_evaluate_scores_the_whole_val_split_of_a_run(debug_run, tmp_path, capsys):
    from attention_lab.training import evaluate

    run_dir, final, _ = debug_run
    out = tmp_path / "score.json"
    assert evaluate.main([str(run_dir), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    score = json.loads(out.read_text())
    assert f"{score['bits_per_byte']:.4f} bits/byte" in printed, printed
    meta = json.loads((Path(json.loads((run_dir / "provenance.json").read_text())["data_dir"]) / "meta.json")
                      .read_text())
    assert score["tokens"] == meta["val"]["tokens"] - 1, "every val token but the first is scored once"
    # the trainer scored a sample of windows of the same checkpoint: close, not equal
    assert score["bits_per_byte"] == pytest.approx(final["val_bpb"], rel=0.1), (score, final)

    lone = tmp_path / "lone"
    (lone / "checkpoints").mkdir(parents=True)
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())["dir"]
    shutil.copytree(run_dir / "checkpoints" / best, lone / "checkpoints" / best)
    assert evaluate.main([str(lone)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--data" in err, err
    (lone / "provenance.json").write_text(json.dumps({"data_dir": str(tmp_path / "gone")}))
    assert evaluate.main([str(lone)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "gone" in err and "--data" in err, err
    data_dir = json.loads((run_dir / "provenance.json").read_text())["data_dir"]
    assert evaluate.main([str(lone), "--data", data_dir]) == 0, "--data names the prepared folder explicitly"


def test_the_run_folder_holds_its_attention_film(debug_run):
    """The trainer rewrites <run>/attention.html at every evaluation, after the evaluation's metrics line: the
    film holds every evaluation's frame, scores and validation loss, and the closing line names it."""
    import re

    run_dir, final, _ = debug_run
    page = run_dir / "attention.html"
    assert page.is_file(), "the run folder has no attention.html (train.film is on by default)"
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>',
                                page.read_text(encoding="utf-8"), re.S).group(1))
    assert [f["step"] for f in data["frames"]] == [10, 20], "one film frame per evaluation"
    assert [s["step"] for s in data["scores"]] == [10, 20], "head-role scores of every evaluation"
    assert [p[0] for p in data["curves"]["val_loss"]] == [10, 20], "the last evaluation's val loss is in the film"
    assert f"attention film {page}" in (run_dir / "console.log").read_text(), "the closing line names the film"
    assert final["seconds_film"] > 0


def test_tensorboard_has_scalars_text_images_and_hparams(debug_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, cfg = debug_run
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    for tag in ("train/loss", "train/bpb", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/mfu",
                "val/val_loss", "val/val_bpb"):
        assert tag in scalars, f"scalar {tag} not logged; have {sorted(scalars)}"
    images = acc.Tags()["images"]
    for layer in range(cfg.model.n_layer):
        tag = f"attention/layer_{layer:02d}"
        assert tag in images, f"no attention heatmap {tag}: {images}"
        assert len(acc.Images(tag)) == 2, "one heatmap per evaluation (steps 10 and 20) expected"
    texts = [t for t in acc.Tags()["tensors"] if "sample" in t]
    assert texts, f"no generated text sample in TensorBoard: {acc.Tags()['tensors']}"
    assert (run_dir / "tb" / "hparams").is_dir(), "hyperparameters with final metrics not logged"


def test_resume_reproduces_the_uninterrupted_run(tmp_path, data_cache):
    common = ["train.log_interval=1", "optim.decay_steps=20", "train.eval_interval=10", "train.sample_tokens=0"]
    full_dir, split_dir = tmp_path / "full", tmp_path / "split"
    train_mod.train(debug_config(data_cache, *common, "train.max_steps=20"), full_dir)
    train_mod.train(debug_config(data_cache, *common, "train.max_steps=10"), split_dir)
    # re-running in the same directory resumes from its latest checkpoint
    train_mod.train(debug_config(data_cache, *common, "train.max_steps=20"), split_dir)
    full, full_evals = read_metrics(full_dir)
    split, split_evals = read_metrics(split_dir)
    assert sorted(split) == sorted(full) == list(range(1, 21)), (
        f"the resumed run's metrics.jsonl must keep the lines logged before the stop: steps {sorted(split)}")
    assert sorted(split_evals) == sorted(full_evals), f"evaluations {sorted(split_evals)} vs {sorted(full_evals)}"
    for step in range(11, 21):
        assert split[step] == full[step], (
            f"step {step}: resumed run loss {split[step]!r} != uninterrupted {full[step]!r}; "
            "something the loop depends on (optimizer, RNG, sampler position, schedule) is not saved or restored"
        )


def test_resume_refuses_a_checkpoint_of_another_shape(debug_run, tmp_path, data_cache):
    run_dir, _, _ = debug_run
    before = tree_digest(run_dir / "checkpoints")
    cfg = debug_config(data_cache, "model.n_layer=3", f"train.resume={run_dir}")
    with pytest.raises(TrainingError, match="n_layer"):
        train_mod.train(cfg, tmp_path / "other")
    assert tree_digest(run_dir / "checkpoints") == before, "a refused resume modified the checkpoint"


def test_resume_from_missing_or_corrupt_checkpoint_is_a_clear_error(tmp_path, data_cache, debug_run):
    with pytest.raises(CheckpointError, match="no such run"):
        train_mod.train(debug_config(data_cache, f"train.resume={tmp_path / 'nope'}"), tmp_path / "a")
    run_dir, _, _ = debug_run
    broken = tmp_path / "broken"
    ck = load_checkpoint(run_dir, "latest").path
    (broken / "checkpoints").mkdir(parents=True)
    import shutil

    shutil.copytree(ck, broken / "checkpoints" / ck.name)
    (broken / "checkpoints" / ck.name / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="corrupt"):
        train_mod.train(debug_config(data_cache, f"train.resume={broken}"), tmp_path / "b")


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_checkpoint(tmp_path, data_cache, monkeypatch):
    run_dir = tmp_path / "nan"
    real_step = train_mod.train_step
    calls = {"n": 0}

    def step_then_nan(*args, **kwargs):
        calls["n"] += 1
        loss, norm = real_step(*args, **kwargs)
        return (float("nan"), norm) if calls["n"] == 13 else (loss, norm)

    monkeypatch.setattr(train_mod, "train_step", step_then_nan)
    with pytest.raises(TrainingError, match=r"became nan at step 13.*last good checkpoint"):
        train_mod.train(debug_config(data_cache, "train.sample_tokens=0"), run_dir)
    assert load_checkpoint(run_dir, "latest").step == 10, "the last good checkpoint (step 10) must survive"


@pytest.mark.parametrize("override, match", [
    ("model.n_embd=30", "n_embd"),
    ("model.pos_encoding=sinus", "pos_encoding"),
    ("optim.lr=-1", "optim.lr"),
    ("train.batch_size=0", "train.batch_size"),
])
def test_invalid_values_fail_at_start_naming_the_field(override, match, data_cache):
    with pytest.raises(ValueError, match=match):
        debug_config(data_cache, override)


def test_unknown_keys_fail_at_composition(data_cache):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="n_layers"):
        debug_config(data_cache, "model.n_layers=6")


def test_block_size_larger_than_the_corpus_is_a_clear_error(tmp_path):
    text = tmp_path / "tiny.txt"
    text.write_text("to be or not to be, that is the question\n" * 3)
    cfg = compose(["experiment=debug", "data=text", f"data.files=[{text}]", "data.tokenizer=char",
                   f"data.cache_dir={tmp_path / 'cache'}", "data.val_fraction=0.5", "model.block_size=512"])
    with pytest.raises((TrainingError, ValueError), match="block_size"):
        train_mod.train(cfg, tmp_path / "run")


def test_every_config_composes():
    groups = {g: sorted(p.stem for p in (CONFIG_DIR / g).glob("*.yaml"))
              for g in ("model", "data", "optim", "train", "experiment")}
    for group, options in groups.items():
        assert options, f"configs/{group}/ is empty"
        for option in options:
            cfg = compose([f"{group}={option}"])
            assert cfg.model.n_embd % cfg.model.n_head == 0


def test_lr_schedule_warms_up_then_decays_to_min():

    oc = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10)
    lrs = [lr_at(s, oc, 100) for s in range(120)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3), lrs[:10]
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10])), "warmup must increase"
    assert all(a >= b for a, b in zip(lrs[10:100], lrs[11:101])), "cosine must not increase"
    assert lrs[100] == pytest.approx(1e-4) and lrs[119] == pytest.approx(1e-4)


def test_weight_decay_only_on_matrices():
    """The decayed set is exactly the 2-D weights other than the position table, and not empty (a check on each
    decayed parameter alone holds when nothing is decayed)."""
    from model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16, pos_encoding="learned",
                          bias=True))
    opt = configure_optimizer(model, OptimConfig(name="adamw", weight_decay=0.1), torch.device("cpu"))
    name = {id(p): n for n, p in model.named_parameters()}
    decayed = {name[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    plain = {name[id(p)] for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert all(g["weight_decay"] in (0.0, 0.1) for g in opt.param_groups), opt.param_groups
    expected = {n for n, p in model.named_parameters() if p.dim() == 2 and n != "transformer.wpe.weight"}
    assert decayed == expected and decayed, f"decayed {sorted(decayed)}, expected {sorted(expected)}"
    assert decayed | plain == set(name.values()) and not decayed & plain, "every parameter in exactly one group"


def _spawn_training(run_dir: Path, cache: Path, *overrides: str, hook: str | None = None) -> subprocess.Popen:
    """train.py in a subprocess. hook: "<point>@<step>:<marker>" stops its save of <step> at <point>
    (attention_lab/store/checkpoint.py HOOK_POINTS), where it writes <marker> and waits until the marker is deleted."""
    cmd = [sys.executable, "train.py", "experiment=debug", f"data.cache_dir={cache}", f"hydra.run.dir={run_dir}",
           "train.eval_interval=5", "train.sample_tokens=0", "train.head_roles=false", "train.tensorboard=false",
           *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if hook:
        env[HOOK_ENV] = hook
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _wait_for_marker(marker: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    """Until the trainer has reached the hook's point (it wrote the marker and now waits there)."""
    deadline = time.time() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"training exited (code {proc.returncode}) before reaching the hook's point "
                                 f"{marker.name}:\n{proc.stdout.read()}")
        if time.time() > deadline:
            proc.kill()
            raise AssertionError(f"training did not reach the hook's point {marker.name} in {timeout} s")
        time.sleep(0.05)


def test_ctrl_c_saves_and_exits_cleanly(tmp_path, data_cache):
    """Ctrl-C lands at a known point: while the step-5 checkpoint is saved. The loop finishes step 6, saves it
    and exits 0 with the resume command."""
    run_dir, marker = tmp_path / "sigint", tmp_path / "at_step_5"
    proc = _spawn_training(run_dir, data_cache, "train.max_steps=8", hook=f"after_latest@5:{marker}")
    try:
        _wait_for_marker(marker, proc)
        proc.send_signal(signal.SIGINT)
        marker.unlink()  # let the trainer go on
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"exit code {proc.returncode} after Ctrl-C:\n{out}"
    assert "Traceback" not in out, out
    assert "stop requested" in out, out
    assert "stopped at step 6;" in out and "Resume with" in out, (
        f"Ctrl-C during step 5's save must stop after step 6 (the next step) and say how to resume:\n{out}")
    ckpt = load_checkpoint(run_dir, "latest")
    assert ckpt.step == 6 and ckpt.meta.get("interrupted") is True, (ckpt.step, ckpt.meta)
    ckpt.build_model()
    ckpt.train_state()


def _complete_step_dirs(root: Path) -> list[int]:
    """Every step_* folder must be a whole checkpoint: a killed save may leave a hidden temp folder, never half
    of a visible one."""
    steps = []
    for d in sorted(root.glob("step_*")):
        ckpt = load_checkpoint(d)
        ckpt.build_model()
        ckpt.train_state()
        steps.append(ckpt.step)
    return steps


# SIGKILL at each point of saving the step-4 checkpoint (the step-2 one is complete): which checkpoint each
# pointer must then name, and whether step_4 is in place. The points are attention_lab/store/checkpoint.py's HOOK_POINTS.
KILL_POINTS = {
    "writing": (2, 2, False),         # the temp folder half written
    "before_publish": (2, 2, False),  # the temp folder complete, not yet renamed into place
    "after_publish": (2, 2, True),    # step_4 in place, latest.json still names step_2
    "after_latest": (4, 2, True),     # latest.json names step_4, best.json not yet
    "after_best": (4, 4, True),       # (the debug run's step 4 is its best so far)
}


@pytest.fixture(scope="module")
def killed_runs(tmp_path_factory, data_cache):
    """One trainer per kill point, started together (their start-up is most of the cost), each SIGKILLed once
    it waits at its point."""
    root = tmp_path_factory.mktemp("sigkill")
    procs = {point: _spawn_training(root / point, data_cache, "train.eval_interval=2", "train.max_steps=6",
                                    hook=f"{point}@4:{root / (point + '.marker')}") for point in KILL_POINTS}
    try:
        for point, proc in procs.items():
            _wait_for_marker(root / f"{point}.marker", proc)
            proc.kill()
            proc.wait(timeout=60)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    return {point: (root / point, proc.returncode) for point, proc in procs.items()}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_sigkill_inside_save_checkpoint_leaves_a_loadable_run(point, killed_runs, data_cache):
    """Killed at `point`: the pointers name whole checkpoints, no step folder is half written, and the run
    resumes from `latest`."""
    latest, best, step_4_in_place = KILL_POINTS[point]
    run_dir, returncode = killed_runs[point]
    assert returncode == -signal.SIGKILL, f"the trainer was not killed at {point} (exit code {returncode})"
    root = run_dir / "checkpoints"
    for which, step in (("latest", latest), ("best", best)):
        pointer = json.loads((root / f"{which}.json").read_text())
        assert (root / pointer["dir"]).is_dir(), f"killed at {point}: {which}.json names a missing folder {pointer}"
        assert load_checkpoint(run_dir, which).step == step, f"killed at {point}: {which} should be step {step}"
    complete = _complete_step_dirs(root)
    assert complete == ([2, 4] if step_4_in_place else [2]), f"killed at {point}: step folders {complete}"
    leftovers = list(root.glob(".step_*"))
    assert bool(leftovers) == (not step_4_in_place), f"killed at {point}: temp folders {leftovers}"
    # the run resumes from `latest`, and its next save clears what the killed one left behind
    final = train_mod.train(debug_config(data_cache, "train.max_steps=6", "train.eval_interval=2",
                                         "train.sample_tokens=0", "train.head_roles=false",
                                         "train.tensorboard=false"), run_dir)
    assert final["step"] == 6 and final["steps_this_session"] == 6 - latest, final
    assert _complete_step_dirs(root)[-1] == 6
    assert not list(root.glob(".step_*")), "the killed save's temp folder must be cleaned up"


def test_two_process_ddp_matches_one_process_with_the_same_global_batch(tmp_path, data_cache):
    """torchrun with 2 CPU processes (gloo), batch 2 each == 1 process with batch 4: same windows, same losses."""
    common = ["experiment=debug", f"data.cache_dir={data_cache}", "train.max_steps=6", "train.eval_interval=6",
              "train.log_interval=1", "train.sample_tokens=0", "train.tensorboard=false", "train.num_threads=1"]
    single = tmp_path / "single"
    train_mod.train(compose([*common, "train.batch_size=4"]), single)
    # run from tmp_path with Hydra's default run directory: every rank must agree on rank 0's
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO / "train.py"), *common, "train.batch_size=2", "name=ddp"]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, f"torchrun failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    run_dirs = list((tmp_path / "runs" / "ddp").iterdir())
    assert len(run_dirs) == 1, f"2 processes must share one run directory, found {run_dirs}"
    ddp = run_dirs[0]
    one, _ = read_metrics(single)
    two, _ = read_metrics(ddp)
    assert sorted(two) == sorted(one) == list(range(1, 7)), (sorted(one), sorted(two))
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5, abs=1e-5), (
            f"step {step}: 2-process loss {two[step]} != 1-process loss {one[step]}; the processes' batches or "
            "gradient averaging differ from one process with the same global batch"
        )
    assert load_checkpoint(ddp, "latest").step == 6, "rank 0 must write the checkpoint"


def test_init_from_gpt2_weights_starts_from_them_and_resumes(tmp_path, data_cache, debug_run):
    """train.init_from loads a GPT-2-format folder (here: one exported from a tiny model, no download)."""
    from attention_lab.interop.hf import export_gpt2
    from model import GPT, GPTConfig

    _, _, cfg = debug_run
    vocab = load_checkpoint(debug_run[0], "latest").config.vocab_size  # the char tokenizer's size
    torch.manual_seed(3)
    source = GPT(GPTConfig(vocab_size=vocab, block_size=48, n_layer=1, n_head=2, n_embd=16, pos_encoding="learned"))
    gpt2_dir = export_gpt2(source, tmp_path / "tiny-gpt2")
    run_dir = tmp_path / "finetune"
    overrides = [f"train.init_from={gpt2_dir}", "train.max_steps=4", "train.eval_interval=2", "train.sample_tokens=0"]
    train_mod.train(debug_config(data_cache, *overrides), run_dir)
    ckpt = load_checkpoint(run_dir, "latest")
    assert (ckpt.config.n_layer, ckpt.config.n_embd, ckpt.config.block_size) == (1, 16, 48), \
        f"the run must keep the GPT-2 folder's shape, got {ckpt.config}"
    # resuming the same run (its config still says the debug model's shape) continues from the checkpoint
    final = train_mod.train(debug_config(data_cache, *overrides[:-3], "train.max_steps=6", "train.eval_interval=2",
                                         "train.sample_tokens=0"), run_dir)
    assert final["step"] == 6


def test_head_roles_every_n_keeps_its_cadence_across_a_resume(tmp_path, data_cache):
    """head_roles_every=2 measures at evaluations 1, 3, 5, ...; a run resumed after the third evaluation (an odd
    count: a measured one) must measure at the same steps as the uninterrupted run."""
    base = ["train.eval_interval=2", "train.head_roles_every=2", "train.head_ablation=false", "train.film=false",
            "train.sample_tokens=0"]

    def measured(run: Path) -> list[int]:
        return [json.loads(line)["step"] for line in (run / "attention" / "heads.jsonl").read_text().splitlines()]

    whole = tmp_path / "whole"
    train_mod.train(debug_config(data_cache, *base, "train.max_steps=10"), whole)
    assert measured(whole) == [2, 6, 10], measured(whole)
    split = tmp_path / "split"
    train_mod.train(debug_config(data_cache, *base, "train.max_steps=6"), split)
    train_mod.train(debug_config(data_cache, *base, "train.max_steps=10"), split)
    assert measured(split) == measured(whole), f"resumed: {measured(split)}, uninterrupted: {measured(whole)}"
