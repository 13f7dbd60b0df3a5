"""Smoke tests of bench/: every benchmark runs at its --quick setting and writes the table it promises.

These check that the scripts still run and report what they should, not how fast anything is: timings on a
shared CPU are no test. A failure here means a benchmark broke (an API it uses changed, a column was
renamed); run `python -m bench.run --quick --only NAME` to see it.
"""

from __future__ import annotations

import json

import pytest
import torch

from attention_lab.runtime.flops import measure_peak_flops
from bench.common import Column, Table, interleaved, paired_ratio
from bench.run import BENCHMARKS, main
from model import GPT, GPTConfig, generate

# the row keys each table must carry (what README and the trainer read)
EXPECTED_ROW_KEYS = {
    "peak": {"n", "best_gflops", "median_gflops"},
    "train": {"config", "ours_tok_s", "hf_tok_s", "speedup", "ours_mfu", "hf_mfu", "ours_mfu_paired", "loss_diff"},
    "generate": {
        "new_tokens", "ours_cached_tok_s", "ours_uncached_tok_s", "hf_cached_tok_s", "hf_uncached_tok_s",
        "cached_vs_hf_cached", "cached_vs_uncached", "same_tokens",
    },
    "attention": {"T", "method", "fwd_ms", "both_ms", "peak_mib"},
    "kv_cache": {"variant", "length", "computed", "measured", "per_token"},
    "decode": {"variant", "length", "ms", "vs_mha"},
    "data": {"text_mb", "seconds", "mb_s", "tokens_s"},
    "figures": {"figure", "shape", "layers", "heads", "tokens", "fresh_s", "frames_s", "speedup"},
}


def _data_available() -> bool:
    try:
        import data.prepare  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_quick_benchmark_writes_its_table(name, tmp_path, capsys):
    if name == "data" and not _data_available():
        pytest.skip("data.prepare is not importable")
    out = tmp_path / "results.json"
    main(["--quick", "--only", name, "--out", str(out), "--device", "cpu"])

    results = json.loads(out.read_text())
    assert results["quick"] is True
    assert {"cpu", "torch_threads", "torch", "device"} <= set(results["machine"]), results["machine"]
    names = {"attention": ["attention", "kv_cache", "decode"]}.get(name, [name])
    assert list(results["tables"]) == names, f"--only {name} wrote tables {list(results['tables'])}"
    printed = capsys.readouterr().out
    for table_name in names:
        table = results["tables"][table_name]
        assert table["rows"], f"{table_name}: the table has no rows"
        missing = EXPECTED_ROW_KEYS[table_name] - set(table["rows"][0])
        assert not missing, f"{table_name}: rows lack {sorted(missing)}; got {sorted(table['rows'][0])}"
        assert f"### {table['title']}" in printed, f"{table_name}: the markdown table was not printed"
    assert f"CPU {results['machine']['cpu']}" in printed, f"{name}: the machine line is missing above the table"


def test_train_table_compares_equal_models():
    """Both sides of the training comparison compute the same loss from the same weights."""
    from bench.common import Context, describe_machine
    from bench.train_step import run

    device = torch.device("cpu")
    ctx = Context(device=device, quick=True, machine=describe_machine(device), peak_flops=1e9)
    row = run(ctx).rows[0]
    assert row["loss_diff"] < 1e-4, f"ours and Hugging Face's loss differ by {row['loss_diff']} at init"
    assert row["ours_tok_s"] > 0 and row["hf_tok_s"] > 0


def test_interleaved_alternates_and_times_every_call():
    calls = []
    times = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, torch.device("cpu"), reps=3,
                        warmup=1)
    assert calls == ["a", "b"] * 4, f"expected warmup + 3 rounds of a, b in turn; got {calls}"
    assert [len(t) for t in times.values()] == [3, 3]
    assert paired_ratio([2.0, 4.0, 6.0], [1.0, 1.0, 3.0]) == 2.0


def test_measure_peak_flops_is_a_positive_rate():
    peak = measure_peak_flops("cpu", torch.float32, quick=True)
    assert isinstance(peak, float) and peak > 1e6, f"implausible peak {peak} FLOP/s"


def test_table_markdown_formats_values_and_missing_cells():
    table = Table("t", "Title", {"cpu": "x", "cpu_count": 2, "torch_threads": 2, "torch": "2", "device": "cpu",
                                 "dtype": "float32", "openmp": "OpenMP defaults"},
                  [Column("a", "A", "{:.1f}"), Column("b", "B")], rows=[{"a": 1.25, "b": None}])
    md = table.markdown()
    assert "| 1.2 | n/a |" in md, md


def test_only_rejects_unknown_names():
    with pytest.raises(SystemExit):
        main(["--quick", "--only", "nope"])


def test_generation_check_rejects_a_decoder_that_is_not_greedy():
    """Planted bugs: the generation bench reporting `same_tokens` without ever acting on it; a broken KV cache
    timed as if it decoded the same function. Every token must be greedy under our model up to a near-tie."""
    from bench.generation import check_greedy
    from model import GPT, GPTConfig
    from model.generate import generate

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32)).eval()
    prompt = torch.randint(64, (1, 4))
    good = generate(model, prompt, 12, greedy=True, use_cache=True)
    assert check_greedy(model, {"cached": good, "uncached": generate(model, prompt, 12, greedy=True,
                                                                     use_cache=False)}, 4) >= 0
    logits = model(good[:, :-1]).logits[0, 3:]  # (12, V): the predictions of the generated tokens
    bad = good.clone()
    bad[0, 4 + 5] = logits[5].argmin()  # the worst token at generated position 5
    with pytest.raises(RuntimeError, match="broken_decoder chose token .* at new position 5"):
        check_greedy(model, {"cached": good, "broken_decoder": bad}, 4)


@pytest.mark.parametrize("bench", ["train_step", "generation"])
def test_benchmarks_refuse_twins_that_compute_different_functions(bench, monkeypatch):
    """Planted bug: q and k swapped in the mapping onto GPT2LMHeadModel, or a benchmark that skips the twin
    check. At GPT-2's init the train table's loss difference hid the swap (4.6e-5 < 1e-4); the check at random
    weights must stop both benchmarks before any timing."""
    import importlib

    import bench.twins as twins
    from bench.common import Context, describe_machine

    real = twins.state_dict_to_hf

    def swapped(sd, cfg):
        out = real(sd, cfg)
        for key in [k for k in out if k.endswith(("attn.c_attn.weight", "attn.c_attn.bias"))]:
            q, k, v = out[key].chunk(3, dim=-1)  # GPT-2's Conv1D keeps q|k|v along the last axis
            out[key] = torch.cat([k, q, v], dim=-1)
        return out

    monkeypatch.setattr(twins, "state_dict_to_hf", swapped)
    module = importlib.import_module(f"bench.{bench}")
    device = torch.device("cpu")
    ctx = Context(device=device, quick=True, machine=describe_machine(device), peak_flops=1e9)
    with pytest.raises(RuntimeError, match="disagree at random weights"):
        module.run(ctx)


def test_threads_bench_runs_each_setting_in_its_own_environment(tmp_path, monkeypatch):
    """bench/threads.py: every sample is a fresh process with the setting's OpenMP environment (libgomp reads it
    once, at load), idle and beside a busy loop; ratios are against PASSIVE under the same load."""
    import bench.threads as threads

    seen = []
    real = threads.subprocess.run

    def spy(cmd, env=None, **kw):
        seen.append({k: env.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")})
        return real(cmd, env=env, **kw)

    monkeypatch.setattr(threads.subprocess, "run", spy)
    out = tmp_path / "threads.json"
    threads.main(["--quick", "--rounds", "1", "--seconds", "0.05", "--settings", "ACTIVE,1 thread",
                  "--workloads", "decode", "--out", str(out)])
    table = json.loads(out.read_text())
    rows = {r["setting"]: r for r in table["rows"]}
    assert set(rows) == {"PASSIVE", "ACTIVE", "1 thread"}, "PASSIVE is always measured: it is the baseline"
    assert rows["PASSIVE"]["idle_vs_passive"] == 1.0 and rows["PASSIVE"]["contended_vs_passive"] == 1.0
    assert all(r["idle_tok_s"] > 0 and r["contended_tok_s"] > 0 for r in rows.values()), rows
    assert {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": None, "GOMP_SPINCOUNT": None} in seen
    assert {"OMP_WAIT_POLICY": None, "OMP_NUM_THREADS": "1", "GOMP_SPINCOUNT": None} in seen
    assert len(seen) == 6, f"3 settings x idle and contended, one process each: {len(seen)}"
    assert "cpu" in table["machine"], "the table names the machine it ran on"


def test_time_calls_divides_by_the_calls_it_made():
    """time_calls stops early at max_s: seconds per call is the time over the calls made, not the calls asked
    for (a fake clock: each call takes 1 s)."""
    from attention_lab.runtime import flops

    clock = {"now": 0.0}

    def call():
        clock["now"] += 1.0

    real = flops.time.perf_counter
    flops.time.perf_counter = lambda: clock["now"]
    try:
        assert flops.time_calls(call, 10, torch.device("cpu"), max_s=2.5) == pytest.approx(1.0)
        assert flops.time_calls(call, 4, torch.device("cpu")) == pytest.approx(1.0)
    finally:
        flops.time.perf_counter = real


def test_generation_table_compares_with_hugging_faces_faster_setting_each_round(monkeypatch):
    """cached_vs_hf_cached pairs each round's faster of Hugging Face's two cached settings with ours."""
    import bench.generation as generation
    from bench.common import Context, describe_machine

    def fake_times(fns, device, reps, warmup=0):
        base = {"ours_cached": 1.0, "ours_uncached": 5.0, "hf_cached": 3.0, "hf_cached_our_threads": 2.0,
                "hf_uncached": 9.0}
        return {name: [base.get(name, 4.0)] * reps for name in fns}

    monkeypatch.setattr(generation, "interleaved", fake_times)
    ctx = Context(device=torch.device("cpu"), quick=True, machine=describe_machine(torch.device("cpu")), peak_flops=1e9)
    table = generation.run(ctx)
    rows = table.rows if hasattr(table, "rows") else table["rows"]
    assert rows and all(r["cached_vs_hf_cached"] == pytest.approx(2.0) for r in rows), (
        f"Hugging Face's faster cached setting takes 2 s to our 1 s: 2.0x, got {[r['cached_vs_hf_cached'] for r in rows]}")


def test_the_median_interval_is_the_order_statistics_that_bracket_the_median_at_its_stated_coverage():
    """n samples: the k-th smallest and k-th largest cover the median with 1 - 2 P(Bin(n, 1/2) < k)."""
    from bench.common import median_interval

    assert median_interval([3.0, 1.0, 2.0, 4.0]) == (1.0, 4.0, pytest.approx(1 - 2 / 16)), "4 rounds: the range, 87.5%"
    xs = [float(i) for i in range(1, 21)]  # 20 rounds: k = 6 is the last with coverage >= 0.9 (0.958; k = 7: 0.885)
    lo, hi, cov = median_interval(xs)
    assert (lo, hi) == (6.0, 15.0) and cov == pytest.approx(0.9586, abs=1e-4), (lo, hi, cov)
    assert median_interval([2.5]) == (2.5, 2.5, 0.0)


@pytest.mark.parametrize("ratios, want", [
    ([2.1, 2.2, 2.3, 2.4, 2.5, 2.6], "met"),
    ([1.5, 1.6, 1.7, 1.8, 1.9, 1.95], "missed"),
    ([1.8, 1.9, 1.95, 2.05, 2.1, 2.2], "cannot tell"),
])
def test_the_generation_bench_says_met_missed_or_cannot_tell_from_the_rounds(monkeypatch, ratios, want):
    """The 2x verdict reads the interval of the rounds' ratios, not their median alone: a median of 2.0x from rounds
    between 1.8x and 2.2x cannot tell."""
    import bench.generation as generation
    from bench.common import Context, describe_machine

    def fake_times(fns, device, reps, warmup=0):
        times = {name: [4.0] * reps for name in fns}
        times["ours_cached"] = [1.0] * reps
        times["hf_cached"] = times["hf_cached_our_threads"] = [ratios[i % len(ratios)] for i in range(reps)]
        return times

    monkeypatch.setattr(generation, "interleaved", fake_times)
    monkeypatch.setitem(generation.QUICK, "reps", len(ratios))
    ctx = Context(device=torch.device("cpu"), quick=True, machine=describe_machine(torch.device("cpu")), peak_flops=1e9)
    table = generation.run(ctx)
    assert [r["hf_verdict"] for r in table.rows] == [want] * len(table.rows), [r["hf_verdict"] for r in table.rows]
    assert table.summary["hf_target"] == want


@pytest.mark.parametrize("measured, want", [({1: 1.0, 2: 1.5}, 1), ({1: 1.5, 2: 1.0}, 2)])
def test_the_generation_bench_decodes_ours_and_hfs_our_threads_in_the_count_sampling_measures(
        monkeypatch, tmp_path, torch_threads, measured, want):
    """Ours cached and Hugging Face's 'our threads' run in the thread count sampling's measurement picks
    (runtime/decoding.decoding_thread_count); the other calls keep torch's threads."""
    import bench.generation as generation
    from attention_lab.runtime import decoding

    state = torch_threads
    monkeypatch.setattr(decoding, "time_candidates", lambda run, counts: {n: measured[n] for n in counts})
    monkeypatch.setenv(decoding.CACHE_DIR_ENV, str(tmp_path))  # a measurement of its own, in memory and on disk
    decoding.forget_measurements()
    seen = []
    real = generation.generate
    monkeypatch.setattr(generation, "generate", lambda *a, **k: (seen.append(("ours", state["n"])), real(*a, **k))[1])

    class HF:
        def generate(self, prompt, **kwargs):
            seen.append(("hf", state["n"]))
            return prompt

    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    prompt = torch.tensor([[1, 2, 3]])
    threads = generation.cached_threads(ours, prompt)
    assert threads == want, f"measured {measured}: the bench should decode ours in {want} thread(s), got {threads}"
    seen.clear()
    fns = generation.decoders(ours, HF(), prompt, 2, threads)
    for name in ("ours_cached", "hf_cached_our_threads", "hf_cached", "ours_uncached"):
        fns[name]()
    assert seen == [("ours", want), ("hf", want), ("hf", 2), ("ours", 2)], seen
    assert state["n"] == 2, "torch's thread count was not restored"
    decoding.forget_measurements()


def test_the_generation_benchs_probes_run_every_step_in_the_way_being_measured(monkeypatch, tmp_path, torch_threads):
    """The probes bench.generation hands to the measurements, one decoding step a next() as sampling's, run each of
    their steps (every forward pass) in the thread count being measured, and the layout's in one thread: a probe
    whose thread count was restored before its steps ran would time torch's threads under every name."""
    import bench.generation as generation
    from attention_lab.runtime import decoding

    state = torch_threads
    monkeypatch.setenv(decoding.CACHE_DIR_ENV, str(tmp_path))
    decoding.forget_measurements()
    in_forward = []
    real_forward = GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, *a, **k: (in_forward.append(state["n"]), real_forward(self, *a, **k))[1])
    steps = {}

    def measure(run, names):
        for name in names:
            in_forward.clear()
            for _ in run(name):
                pass
            steps[name] = in_forward[:]
        return {name: 1.0 for name in names}

    monkeypatch.setattr(decoding, "time_layouts", lambda run: measure(run, decoding.LAYOUTS))
    monkeypatch.setattr(decoding, "time_candidates", measure)
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    prompt = torch.tensor([[1, 2, 3]])
    generation.cached_decoder(ours, prompt)
    generation.cached_threads(ours, prompt)
    assert steps == {"rows": [1] * 8, "columns": [1] * 8, 1: [1] * 8, 2: [2] * 8}, steps
    assert state["n"] == 2, "torch's thread count was not restored"
    decoding.forget_measurements()


@pytest.mark.parametrize("measured, want", [({"rows": 1.0, "columns": 1.5}, "rows"), ({"rows": 1.5, "columns": 1.0},
                                                                                       "columns")])
def test_the_generation_bench_decodes_ours_cached_in_the_layout_sampling_measures(monkeypatch, tmp_path, measured,
                                                                                  want):
    """Ours cached runs with the weights stored the way sampling's measurement picks (runtime/decoding.decoding_layout),
    the same numbers; ours uncached keeps the model as trained."""
    import bench.generation as generation
    from attention_lab.runtime import decoding

    monkeypatch.setattr(decoding, "time_layouts", lambda decode: dict(measured))
    monkeypatch.setenv(decoding.CACHE_DIR_ENV, str(tmp_path))
    decoding.forget_measurements()
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    prompt = torch.tensor([[1, 2, 3]])
    cached, layout = generation.cached_decoder(ours, prompt)
    assert layout == want and (cached is ours) == (want == "rows"), (layout, cached is ours)
    seen = []
    real = generation.generate
    monkeypatch.setattr(generation, "generate", lambda m, *a, **k: (
        seen.append(m.lm_head.weight.is_contiguous()), real(m, *a, **k))[1])
    fns = generation.decoders(ours, None, prompt, 4, 1, cached)
    out = fns["ours_cached"]()
    fns["ours_uncached"]()
    assert seen == [want == "rows", True], f"ours cached by {want}, uncached by rows: {seen}"
    assert torch.equal(out, generate(ours, prompt, 4, greedy=True)), "the layout changed the tokens"
    decoding.forget_measurements()


def test_the_peak_bench_mends_the_trainers_kept_peak_and_says_so(fresh_measurements, monkeypatch):
    """bench/peak.py's full measurement raises the peak the trainer keeps where it ran faster (a peak kept from a
    busy moment makes every later MFU too high), and its table says what it did; --quick keeps nothing."""
    import bench.peak as peak_bench
    from attention_lab.runtime import flops
    from bench.common import Context, describe_machine

    cpu = torch.device("cpu")
    flops.kept_peak_flops(cpu, torch.float32, lambda d, t: {512: [1e9], 1024: [2e9], 2048: [3e9]})  # a busy start
    monkeypatch.setattr(peak_bench, "matmul_rates", lambda *a, **k: {512: [4e9], 1024: [6e9, 1e9], 2048: [5e9]})
    table = peak_bench.run(Context(device=cpu, quick=False, machine=describe_machine(cpu), peak_flops=None))
    assert table.summary["peak_flops"] == pytest.approx(6e9)
    assert flops.kept_peak_flops(cpu, torch.float32)[0] == pytest.approx(6e9), "the trainer divides by the mended peak"
    assert any("was 3.0 GFLOP/s" in n and "**6.0**" in n for n in table.notes), table.notes
    monkeypatch.setattr(peak_bench, "matmul_rates", lambda *a, **k: {256: [9e9, 9e9]})
    table = peak_bench.run(Context(device=cpu, quick=True, machine=describe_machine(cpu), peak_flops=None))
    assert flops.kept_peak_flops(cpu, torch.float32)[0] == pytest.approx(6e9), "--quick's small size keeps nothing"
