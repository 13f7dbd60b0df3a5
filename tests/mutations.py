"""Plant bugs that matter, one at a time, in a temporary copy of the repository, and check the tests catch each.

    python tests/mutations.py            # every planted bug (a few minutes on 2 cores); exit 1 if one survives
    python tests/mutations.py --list     # what it plants
    python tests/mutations.py rope_not_applied rng_not_restored   # only these

Each entry names a file, an exact piece of its text, what to put instead, and the tests that should fail (files
or pytest node ids `file::test`: name the few tests that catch it, so the whole list runs in minutes).
If the original text is no longer in the file the script fails too (exit 1), so the list cannot rot silently:
when you change code that a mutation targets, update the mutation with it. When you add a feature, add the bug
that would hurt it most.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    what: str
    browser: bool = False  # its tests drive headless Chromium (tests/test_viewer.py)


MUTATIONS = (
    Mutation("rope_not_applied", "model/attention.py",
             "q, k = pe.rotate_qk(q, k, rotation)", "pass",
             ("tests/test_planted_bugs.py",), "RoPE never applied inside attention (RoPE is the default)"),
    Mutation("rope_only_on_q", "model/positions.py",
             "return qk[0], qk[1]", "return qk[0], k",
             ("tests/test_planted_bugs.py",), "RoPE rotates the queries but not the keys (scores no longer relative)"),
    Mutation("rng_not_restored", "attention_lab/training/state.py",
             'torch.set_rng_state(state["rng"]["torch"])', "pass",
             ("tests/test_planted_bugs.py",), "torch RNG state not restored on resume (dropout masks differ)"),
    Mutation("init_from_ignored", "attention_lab/training/start.py",
             "model = load_gpt2(tc.init_from)\n", "model = build_model(load_gpt2(tc.init_from).config)\n",
             ("tests/test_planted_bugs.py",), "train.init_from builds a fresh model instead of loading the weights"),
    Mutation("sampling_flags_dropped", "sample.py",
             "top_k=args.top_k, top_p=args.top_p", "top_k=None, top_p=None",
             ("tests/test_planted_bugs.py",), "sample.py parses --temperature/--top-k/--top-p but does not pass them"),
    Mutation("no_weight_decay", "attention_lab/training/optim.py",
             'return p.dim() >= 2 and not name.endswith("wpe.weight")', "return False",
             ("tests/test_optim.py",), "nothing is weight-decayed"),
    Mutation("muon_on_nothing", "attention_lab/training/optim.py",
             'return p.dim() == 2 and ".h." in f".{name}"', "return False",
             ("tests/test_optim.py",), "Muon configured but given no parameter"),
    Mutation("cosine_is_linear", "attention_lab/training/optim.py",
             "return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - floor)",
             "return floor + (1.0 - progress) * (1.0 - floor)",
             ("tests/test_optim.py",), "the cosine schedule decays linearly"),
    Mutation("wsd_decays_from_the_start", "attention_lab/training/optim.py",
             "if step < max(decay_start, cfg.warmup_steps):\n            return 1.0",
             "if False:\n            return 1.0",
             ("tests/test_optim.py",), "warmup-stable-decay decays from the end of warmup"),
    Mutation("optimizer_state_not_restored", "attention_lab/training/state.py",
             'self.optimizer.load_state_dict(state["optimizer"])', "pass",
             ("tests/test_optim.py",), "the optimizer's state is not restored on resume"),
    Mutation("previous_token_off_by_one", "attention_lab/interp/roles.py",
             "return np.eye(t, k=-1)", "return np.eye(t, k=-2)",
             ("tests/test_head_roles.py",), "the previous-token pattern looks two tokens back"),
    Mutation("induction_is_duplicate", "attention_lab/interp/roles.py",
             "d[:, 1:] = ids[:, None] == ids[None, :-1]", "d[:, :-1] = ids[:, None] == ids[None, :-1]",
             ("tests/test_head_roles.py",), "the induction pattern marks the earlier copy, not the token after it"),
    Mutation("ablation_zeroes_the_wrong_head", "attention_lab/interp/heads.py",
             "self.lo, self.hi = head * hs, (head + 1) * hs", "self.lo, self.hi = 0, hs",
             ("tests/test_head_roles.py",), "head ablation always zeroes head 0"),
    Mutation("exclusions_edit_the_callers_array", "attention_lab/interp/roles.py",
             "a = np.array(a, dtype=np.float64)  # a copy", "a = np.asarray(a, dtype=np.float64)  # a copy",
             ("tests/test_head_roles.py",), "role scores zero parts of the caller's attention pattern in place"),
    Mutation("alibi_bias_dropped_by_sdpa", "model/attention.py",
             "not plain_causal:\n        bias = pe.score_bias(pos, k_pos) if pe.has_score_bias else None",
             "not plain_causal:\n        bias = None",
             ("tests/test_planted_bugs.py",), "the fused (sdpa) path ignores ALiBi's score bias"),
    Mutation("qk_norm_not_applied", "model/attention.py",
             "q, k = qk_norm(q), qk_norm(k)", "pass",
             ("tests/test_planted_bugs.py", "tests/test_model_options.py"), "QK-norm configured but not applied"),
    Mutation("kv_cache_positions_restart", "model/gpt.py",
             "pos = torch.arange(past, past + t, device=idx.device)", "pos = torch.arange(0, t, device=idx.device)",
             ("tests/test_model_generate.py",), "tokens decoded with the KV cache get positions from 0"),
    # the training step (tests/test_train_step.py)
    Mutation("grad_accum_not_divided", "attention_lab/training/loop.py",
             "loss = model(x, y).loss / grad_accum", "loss = model(x, y).loss",
             ("tests/test_train_step.py::test_grad_accum_equals_one_big_batch",),
             "micro-batch losses not divided by grad_accum (gradients grow with it)"),
    Mutation("grad_accum_reports_last_loss", "attention_lab/training/loop.py",
             "total += loss.item()", "total = loss.item()",
             ("tests/test_train_step.py::test_grad_accum_equals_one_big_batch",),
             "with grad_accum the step reports the last micro-batch's loss"),
    Mutation("scaler_not_unscaled", "attention_lab/training/loop.py",
             "scaler.unscale_(opt)", "pass",
             ("tests/test_train_step.py::test_float16_with_grad_scaler_matches_float32",),
             "float16: gradients clipped (and their norm logged) while still scaled"),
    Mutation("loss_not_scaled", "attention_lab/training/loop.py",
             "(scaler.scale(loss) if scaler else loss).backward()", "loss.backward()",
             ("tests/test_train_step.py::test_float16_with_grad_scaler_matches_float32",),
             "float16: backward on the unscaled loss (the unscale then shrinks every gradient)"),
    Mutation("scaler_step_bypassed", "attention_lab/training/loop.py",
             "scaler.step(opt)", "opt.step()",
             ("tests/test_train_step.py::test_grad_scaler_skips_a_step_whose_gradients_overflow",),
             "float16: an overflowing step is applied instead of skipped"),
    Mutation("no_grad_scaler", "train.py",
             "torch.amp.GradScaler(device.type) if dtype == torch.float16 else None", "None",
             ("tests/test_train_step.py::test_train_dtype_float16_runs_every_step_through_a_grad_scaler",),
             "train.dtype=float16 trains without a GradScaler"),
    Mutation("compile_ignored", "attention_lab/training/run.py",
             "model = torch.compile(model)", "pass",
             ("tests/test_train_step.py::test_compile_trains_the_same_numbers_and_saves_the_plain_module",),
             "train.compile=true does not compile"),
    Mutation("checkpoint_of_the_compiled_wrapper", "train.py",
             "run.state.step, run.raw_model, run.data", "run.state.step, run.model, run.data",
             ("tests/test_train_step.py::test_compile_trains_the_same_numbers_and_saves_the_plain_module",),
             "checkpoints saved from the compiled wrapper (_orig_mod. keys)"),
    # resume, Ctrl-C and SIGKILL (tests/test_train.py)
    Mutation("sampler_not_restored", "attention_lab/training/state.py",
             'self.sampler.load_state_dict(state["sampler"])', "pass",
             ("tests/test_train.py::test_resume_reproduces_the_uninterrupted_run",),
             "the data sampler's position not restored on resume"),
    Mutation("ctrl_c_does_not_save", "train.py",
             'elif interrupted:\n                save(run, False, {"interrupted": True})',
             'elif False:\n                save(run, False, {"interrupted": True})',
             ("tests/test_train.py::test_ctrl_c_saves_and_exits_cleanly",),
             "Ctrl-C stops without saving the step it finished"),
    Mutation("pointer_before_the_folder", "attention_lab/store/checkpoint.py",
             "        publish_dir(tmp, final)  # files synced",
             '        write_json_atomic(pointer_path(root, "latest"), {"dir": name, "step": step})\n'
             "        publish_dir(tmp, final)  # files synced",
             ("tests/test_train.py::test_sigkill_inside_save_checkpoint_leaves_a_loadable_run",),
             "latest.json replaced before the checkpoint folder is in place (a kill leaves it dangling)"),
    # benchmarks (tests/test_bench.py, tests/test_planted_bugs.py)
    Mutation("train_bench_skips_twin_check", "bench/train_step.py",
             "check_same_function(cfg, device)", "pass",
             ("tests/test_bench.py::test_benchmarks_refuse_twins_that_compute_different_functions",),
             "the training bench times twins it never checked compute one function"),
    Mutation("generation_bench_skips_twin_check", "bench/generation.py",
             "check_same_function(cfg, device)", "pass",
             ("tests/test_bench.py::test_benchmarks_refuse_twins_that_compute_different_functions",),
             "the generation bench times twins it never checked compute one function"),
    Mutation("generation_bench_ignores_bad_tokens", "bench/generation.py",
             "        if len(bad):", "        if False:",
             ("tests/test_bench.py::test_generation_check_rejects_a_decoder_that_is_not_greedy",),
             "the generation bench times decoders that do not decode greedily"),
    # the attention pages (tests/test_train.py, tests/test_viewer.py)
    Mutation("film_not_rebuilt", "attention_lab/training/callbacks.py",
             "        callbacks.append(Film())\n", "        pass\n",
             ("tests/test_train.py::test_the_run_folder_holds_its_attention_film",),
             "the trainer never writes the run's attention film"),
    Mutation("film_slider_not_wired", "attention_lab/viewer/assets/main.js",
             'this.slider.addEventListener("input", () => this.show(+this.slider.value));', "",
             ("tests/test_viewer.py::test_film_slider_moves_through_training",),
             "the film's step slider moves but the heatmaps stay on one evaluation", browser=True),
    Mutation("evaluate_rescores_overlap", "attention_lab/training/evaluate.py",
             "        y = y.masked_fill(skip, -1)\n", "",
             ("tests/test_evaluate.py",),
             "whole-split scoring counts the last window's overlap twice"),
    Mutation("muon_ns_steps_ignored", "attention_lab/training/optim.py",
             "ns_steps=cfg.muon_ns_steps, ", "",
             ("tests/test_optim.py::test_muon_ns_steps_reaches_the_iteration",),
             "optim.muon_ns_steps is validated but Muon keeps its 5 steps"),
    # the house's rule (tests/test_layering.py)
    Mutation("interp_imports_store", "attention_lab/interp/heads.py",
             "from attention_lab.interp.roles import", "from attention_lab.store.layout import RunLayout  # noqa: F401\n"
             "from attention_lab.interp.roles import",
             ("tests/test_layering.py",), "interpretability code reaches up into the run-folder storage"),
    # the headline numbers (tests/test_headline_numbers.py, tests/test_viewer.py, tests/test_train_step.py)
    Mutation("text_bytes_counts_characters", "data/prepare.py",
             '"text_bytes": [len(t.encode("utf-8")) for t in texts]', '"text_bytes": [len(t) for t in texts]',
             ("tests/test_headline_numbers.py",), "bits per byte divides by characters, not UTF-8 bytes"),
    Mutation("best_val_not_restored", "attention_lab/training/state.py",
             'state["step"], state["best_val_loss"], state["tokens_seen"]', 'state["step"], float("inf"), state["tokens_seen"]',
             ("tests/test_headline_numbers.py::test_best_checkpoint_is_the_lowest_validation_loss",),
             "a resumed run forgets its best loss: a worse evaluation becomes best.json"),
    Mutation("prune_drops_the_best", "attention_lab/store/checkpoint.py",
             '(_read_pointer(root, "best"), _read_pointer(root, "latest"))', '(_read_pointer(root, "latest"),)',
             ("tests/test_headline_numbers.py::test_best_checkpoint_is_the_lowest_validation_loss",),
             "pruning old checkpoints deletes the best one (best.json then dangles)"),
    Mutation("page_swaps_layer_and_head", "attention_lab/viewer/assets/explorer.js",
             "base(l, h) { return (l * this.H + h) * this.n; }", "base(l, h) { return (h * this.L + l) * this.n; }",
             ("tests/test_viewer.py::test_the_weights_a_person_reads_are_attention_npy",),
             "the page reads another head's weights than attention.npy holds", browser=True),
    Mutation("peak_in_float32", "train.py",
             "measure_peak_flops(device, dtype)", "measure_peak_flops(device, torch.float32)",
             ("tests/test_train_step.py::test_mfu_divides_by_the_matmul_peak_of_the_runs_own_dtype",),
             "a bf16 run's MFU is divided by the float32 matmul peak"),
    # attention variants (tests/test_model_variants.py)
    Mutation("gqa_tiles_instead_of_groups", "model/attention.py",
             "x.repeat_interleave(n_rep, dim=1)", "x.repeat(1, n_rep, 1, 1)",
             ("tests/test_model_variants.py",), "grouped-query heads read a tiled (.repeat) kv head, not their group's"),
    Mutation("window_off_by_one", "model/attention.py",
             "seen &= k_pos[None, :] > q_pos[:, None] - window", "seen &= k_pos[None, :] >= q_pos[:, None] - window",
             ("tests/test_model_variants.py",), "the window shows W + 1 keys"),
    Mutation("ring_masked_by_slot", "model/attention.py",
             "return out if t > 1 else (ring_k, ring_v, ring_pos.clone())",
             "return out if t > 1 else (ring_k, ring_v, torch.arange(window, device=k.device))",
             ("tests/test_model_variants.py",), "the windowed cache masks its ring buffer by slot index, not position"),
    Mutation("sink_after_the_softmax", "model/attention.py",
             "weights = F.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]",
             "weights = F.softmax(scores, dim=-1) * torch.sigmoid(-column)",
             ("tests/test_model_variants.py",), "the sink scales the softmax instead of joining its denominator"),
    Mutation("linear_leaks_the_future", "model/linear_attention.py",
             "intra = (fq @ fk.transpose(-2, -1)).tril()", "intra = fq @ fk.transpose(-2, -1)",
             ("tests/test_model_variants.py",), "chunked linear attention lets a token see later ones in its chunk"),
    # inside a head (tests/test_inside.py, tests/test_circuits.py)
    Mutation("inside_skips_rope", "attention_lab/interp/inside.py",
             'q=vec["q"][head, query], k=vec["k"][kv]', 'q=vec["q_normed"][head, query], k=vec["k_normed"][kv]',
             ("tests/test_inside.py",), "step inside takes q and k from before RoPE instead of the cache's"),
    Mutation("copying_score_wrong_axis", "attention_lab/interp/circuits.py",
             "best = (out[start : start + chunk] @ w_u.T).argmax(-1)",
             "best = (out[start : start + chunk] @ w_u.T).argmax(0)",
             ("tests/test_circuits.py",), "the copying score takes the argmax over the wrong axis"),
    Mutation("lens_skips_ln_f", "attention_lab/interp/lens.py",
             "logits = model.lm_head(model.transformer.ln_f(resid))", "logits = model.lm_head(resid)",
             ("tests/test_inside.py",), "the logit lens reads the residual stream without the final LayerNorm"),
    Mutation("inside_page_scales_by_dk", "attention_lab/viewer/assets/inside.js",
             "const scaled = linear ? dot : dot * this.scale;", "const scaled = linear ? dot : dot / this.hs;",
             ("tests/test_viewer.py::test_step_inside_shows_the_computation_with_the_models_own_numbers",),
             "the page's step-inside panel scales the scores by 1/d_k instead of 1/sqrt(d_k)", browser=True),
    Mutation("bigcode_not_multi_query", "attention_lab/interop/convert.py",
             'architectures=["GPTBigCodeForCausalLM"], multi_query=True,',
             'architectures=["GPTBigCodeForCausalLM"], multi_query=False,',
             ("tests/test_export.py::test_every_model_option_exports_with_our_logits",),
             "a multi-query model exported to GPTBigCode as if every head had its own keys and values"),
    # numbers taken on trust before (tests/test_trust_page_bench_export.py, the step-inside browser test)
    Mutation("inside_page_linear_raw_normalised", "attention_lab/viewer/assets/inside.js",
             'const raw = this.d.kind === "linear" && !this.d.denominator;', "const raw = false;",
             ("tests/test_viewer.py::test_step_inside_shows_the_computation_with_the_models_own_numbers"
              "[linear, no denominator]",),
             "the step-inside panel's weighted sum of linear attention without its denominator uses the normalised "
             "weights", browser=True),
    Mutation("head_shares_linear_raw_normalised", "attention_lab/interp/inside.py",
             'raw = cfg.attention == "linear" and not cfg.linear_denominator', "raw = False",
             ("tests/test_trust_page_bench_export.py::test_head_shares_are_what_each_head_hands_c_proj",),
             "what a head adds (the page's share norm, the in-context copying score) of linear attention without "
             "its denominator uses the normalised weights"),
    Mutation("kv_cache_bytes_per_query_head", "bench/attention.py",
             "return 2 * kept * cfg.kv_heads * hs * 4", "return 2 * kept * cfg.n_head * hs * 4",
             ("tests/test_trust_page_bench_export.py::test_predicted_cache_bytes_are_what_a_real_cache_holds",),
             "the decoding-cache table counts keys and values per query head, not per key/value head"),
    Mutation("neox_export_without_rotary_pct", "attention_lab/interop/convert.py",
             "rotary_pct=1.0,  # transformers 4.x names", "# transformers 4.x names",
             ("tests/test_trust_page_bench_export.py::test_exported_config_reads_the_same_in_transformers_4_and_5",),
             "GPT-NeoX config.json without rotary_pct: transformers 4.x rotates a quarter of each head"),
    # the experiment switches (tests/test_model_switches.py)
    Mutation("attn_scale_ignored", "model/config.py",
             'return {"sqrt": 1.0 / math.sqrt(self.head_size), "none": 1.0, "inverse": 1.0 / self.head_size}'
             "[self.attn_scale]",
             "return 1.0 / math.sqrt(self.head_size)",
             ("tests/test_model_switches.py::test_each_switch_in_the_math_backend_is_the_written_out_formula",
              "tests/test_model_switches.py::test_another_scale_changes_the_model"),
             "attn_scale is silently ignored: scores always scaled by 1/sqrt(hs)"),
    Mutation("after_softmax_masks_before", "model/attention.py",
             'if causal_mask == "before_softmax":  # -inf before the softmax',
             'if causal_mask != "none":  # -inf before the softmax',
             ("tests/test_model_switches.py::test_after_softmax_rows_sum_below_one_and_keep_the_full_softmax_weights",
              "tests/test_model_switches.py::test_each_switch_in_the_math_backend_is_the_written_out_formula"),
             "causal_mask=after_softmax masks before the softmax, like before_softmax (rows sum to 1)"),
    Mutation("qk_tied_separate_k", "model/attention.py",
             "self.qk_tied = cfg.qk_tied  # keys are the queries: c_attn has no key rows",
             "self.qk_tied = False  # keys are the queries: c_attn has no key rows",
             ("tests/test_model_switches.py::test_qk_tied_scores_are_symmetric_before_positions",
              "tests/test_model_switches.py::test_qk_tied_has_fewer_parameters_by_the_key_projection"),
             "qk_tied still builds and uses a separate key projection"),
    # the areas make mutate did not look at (tests/test_trust_areas.py)
    Mutation("auto_bf16_on_any_avx512", "attention_lab/runtime/device.py",
             'return bool(caps.get("amx_bf16") or caps.get("avx512_bf16"))',
             'return bool(caps.get("amx_bf16") or caps.get("avx512_bf16") or caps.get("avx512_f"))',
             ("tests/test_trust_areas.py::test_auto_dtype_is_bf16_only_on_cpus_with_native_bf16",
              "tests/test_trust_areas.py::test_muon_iterates_in_the_cpus_native_dtype"),
             "dtype=auto and Muon's iteration pick bf16 on AVX-512 CPUs without native bf16 (Skylake, Cascade Lake)"),
    Mutation("bounded_cache_drops_keep_first", "model/generate.py",
             "unbounded = cache is not None and model.config.bounded_cache and not keep_first",
             "unbounded = cache is not None and model.config.bounded_cache",
             ("tests/test_trust_areas.py::test_generation_far_past_the_context_sees_the_window_the_rule_gives",),
             "an all-windowed model decoding with the cache ignores keep_first (the cached path streams on)"),
    Mutation("probe_ablation_scores_the_first_half", "attention_lab/interp/heads.py",
             "repeat_mask[:, half - 1 :] = True", "repeat_mask[:, : half - 1] = True",
             ("tests/test_trust_areas.py::test_probe_ablation_is_the_repeated_halfs_loss_change_when_that_head_is_zeroed",),
             "the probe ablation scores the probe's first half instead of its repeat"),
    Mutation("ring_kept_across_reset", "model/attention.py",
             "self.k[layer].dtype != k.dtype or self.length == 0:", "self.k[layer].dtype != k.dtype:",
             ("tests/test_trust_areas.py::test_ring_buffer_cache_after_each_reset_equals_a_fresh_forward",),
             "a windowed layer's ring buffer keeps the keys of the window before a rebuild"),
    Mutation("validation_with_dropout", "attention_lab/training/loop.py",
             "    with eval_mode(model):\n        for x, y in batches:",
             "    with contextlib.nullcontext(model):\n        for x, y in batches:",
             ("tests/test_trust_areas.py::test_validation_loss_and_whole_split_scoring_run_in_eval_mode_and_restore_the_mode",
              "tests/test_trust_areas.py::test_validation_of_a_dropout_run_is_the_eval_mode_loss_and_picks_best_by_it"),
             "the trainer's validation loss is computed with dropout on"),
    Mutation("role_scores_read_the_first_sequences_ids", "attention_lab/interp/roles.py",
             "for a, seq in zip(attn, ids):", "for a, seq in zip(attn, [ids[0]] * b):",
             ("tests/test_trust_areas.py::test_role_scores_of_a_batch_are_the_mean_of_each_sequences_by_hand_scores",),
             "role scores of a batch build every sequence's patterns from the first sequence's tokens"),
    Mutation("tokens_per_step_without_grad_accum", "attention_lab/training/run.py",
             "return tc.batch_size * tc.grad_accum * self.info.world_size * self.model_cfg.block_size",
             "return tc.batch_size * self.info.world_size * self.model_cfg.block_size",
             ("tests/test_trust_areas.py::test_tokens_per_step_tokens_per_second_and_mfu_count_every_micro_batch",),
             "tokens per step (tokens/s, MFU, tokens seen) leave out the grad_accum micro-batches"),
    # the LSTM baseline (tests/test_lstm.py)
    Mutation("lstm_width_not_matched", "model/lstm.py",
             "n_embd=width,", "n_embd=gpt.n_embd,",
             ("tests/test_lstm.py::test_matched_lstm_has_the_gpts_parameter_count_within_2_percent",),
             "the 'matched' LSTM takes the GPT's width: about half its parameters, an unfair comparison"),
    Mutation("lstm_state_not_carried", "model/lstm.py",
             "kv_cache.state, kv_cache.length = state, past + t", "kv_cache.length = past + t",
             ("tests/test_lstm.py::test_state_carried_token_by_token_equals_the_whole_window",),
             "cached LSTM decoding restarts every token from a zero state (it samples with one token of context)"),
    # exports TransformerLens opens (tests/test_transformer_lens.py)
    Mutation("neox_export_without_attention_bias", "attention_lab/interop/convert.py",
             "attention_bias=True,  # zeros when bias=False", "attention_bias=cfg.bias,  # zeros when bias=False",
             ("tests/test_transformer_lens.py::test_transformer_lens_patterns_equal_ours[neox-rope-no-bias]",),
             "a RoPE model without biases exports as GPT-NeoX without attention biases: TransformerLens cannot open it"),
    Mutation("bridge_skips_qk_norm", "attention_lab/interop/transformer_lens_bridge.py",
             "if attn.qk_norm:  # before RoPE", "if False:  # before RoPE",
             ("tests/test_transformer_lens.py::test_transformer_lens_patterns_equal_ours[shipped-rope-qk-norm]",),
             "TransformerLens's recomputed attention for the shipped code forgets QK-norm: its patterns are not ours"),
    # the claims' measurements (attention_lab/interp/measures.py, attention_lab/claims.py)
    Mutation("honest_loss_sees_the_future", "attention_lab/interp/measures.py",
             "logits = model(xb[:, : i + 1]).logits[:, -1].float()", "logits = model(xb).logits[:, i].float()",
             ("tests/test_measures.py::test_honest_loss_hides_the_future_that_a_leaking_model_reads",),
             "the honest loss runs the whole window: a model that reads the future looks as good as a causal one"),
    Mutation("similarity_baseline_not_subtracted", "attention_lab/interp/measures.py",
             "return self.self_similarity - self.baseline", "return self.self_similarity",
             ("tests/test_measures.py::test_contextual_similarity_is_one_at_the_embedding_without_positions_and_subtracts_the_baseline",),
             "contextual similarity keeps the drift every vector shares (random pairs are not subtracted)"),
    Mutation("shuffle_moves_the_kept_tail", "attention_lab/interp/measures.py",
             "cut = t - last  # inputs", "cut = t - last + 1  # inputs",
             ("tests/test_measures.py::test_prefix_shuffle_costs_an_order_reading_model_and_not_a_bag_of_tokens",),
             "the prefix-shuffle test also shuffles the first scored token's own input (off by one), not only the context before it"),
    Mutation("verdict_ignores_the_seed_spread", "attention_lab/claims.py",
             "if abs(diff) <= 2 * spread:", "if abs(diff) <= 0:",
             ("tests/test_claims.py::test_verdict_says_no_difference_within_the_spread_and_fails_when_reversed",),
             "a claim's verdict calls any difference real, however small against the seed spread"),
    # plants chosen from the code alone by a helper who had not read the tests (docs/testing.md): the ones the
    # suite let through, each closed with a test of the behaviour
    Mutation("rebuild_window_ignores_keep_first", "model/generate.py",
             "window = window_of(tokens, n, block, keep_first)", "window = window_of(tokens, n, block)",
             ("tests/test_trust_areas.py::test_generation_far_past_the_context_sees_the_window_the_rule_gives",),
             "past block_size the rebuilt window drops keep_first: --keep-first silently does nothing"),
    Mutation("val_loss_without_eval_mode", "attention_lab/training/loop.py",
             "    with eval_mode(model):\n        for x, y in batches:",
             "    with contextlib.nullcontext():\n        for x, y in batches:",
             ("tests/test_trust_areas.py::test_validation_loss_and_whole_split_scoring_run_in_eval_mode_and_restore_the_mode",),
             "validation runs with dropout on: val_loss, val_bpb and best.json's choice are noisy"),
    Mutation("wsd_decay_start_from_front", "attention_lab/training/optim.py",
             "decay_start = decay_steps - round(cfg.decay_frac * decay_steps)",
             "decay_start = round(cfg.decay_frac * decay_steps)",
             ("tests/test_optim.py::test_wsd_decays_over_the_last_decay_frac_of_the_run",),
             "WSD decays from decay_frac of the run instead of over its last decay_frac (the same at 0.5)"),
    Mutation("tokens_per_step_ignores_grad_accum", "attention_lab/training/run.py",
             "return tc.batch_size * tc.grad_accum * self.info.world_size * self.model_cfg.block_size",
             "return tc.batch_size * self.info.world_size * self.model_cfg.block_size",
             ("tests/test_trust_areas.py::test_tokens_per_step_tokens_per_second_and_mfu_count_every_micro_batch",),
             "tokens per step leave out grad_accum: tokens/s, MFU and tokens seen are grad_accum times too low"),
    Mutation("head_roles_cadence_from_measurements", "attention_lab/training/callbacks.py",
             "self.calls = len(evaluations_in(layout.metrics, step))", "self.calls = len(kept) * self.every",
             ("tests/test_train.py::test_head_roles_every_n_keeps_its_cadence_across_a_resume",),
             "a resumed run counts measured evaluations times every, not evaluations: head_roles_every drifts"),
    Mutation("whole_split_bpb_uses_val_counts", "attention_lab/training/evaluate.py",
             "bits_per_byte(nats, data.meta, split)", "bits_per_byte(nats, data.meta)",
             ("tests/test_headline_numbers.py::test_train_and_evaluate_report_bits_per_byte_of_the_held_out_text",),
             "evaluate --split train converts nats to bits/byte with the validation split's counts"),
    Mutation("report_windows_first_layer", "attention_lab/viewer/report.py",
             '"windows": [cfg.layer_window(i) for i in range(n_layer)]',
             '"windows": [cfg.layer_window(0) for i in range(n_layer)]',
             ("tests/test_viewer.py::test_step_inside_shows_the_computation_with_the_models_own_numbers",),
             "the page's step-inside panel gives every layer layer 0's window (global layers shown as local)",
             browser=True),
    Mutation("gpt2_import_ln_eps_key", "attention_lab/interop/convert.py",
             'layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),', 'layer_norm_eps=hf.get("layer_norm_eps", 1e-5),',
             ("tests/test_convert.py::test_load_gpt2_reads_the_layer_norm_epsilon_it_was_saved_with",),
             "a GPT-2 folder's layer_norm_epsilon is ignored on import (always 1e-5)"),
    Mutation("time_calls_divides_by_n", "attention_lab/runtime/flops.py",
             "return (time.perf_counter() - t0) / done", "return (time.perf_counter() - t0) / n",
             ("tests/test_bench.py::test_time_calls_divides_by_the_calls_it_made",),
             "time_calls stopped early divides by the calls asked for: the peak FLOP/s and bench timings inflated"),
    Mutation("sample_tokens_per_s_counts_prompt", "sample.py",
             "{len(new_ids) / max(seconds, 1e-9):.1f} tokens/s",
             "{(len(prompt_ids) + len(new_ids)) / max(seconds, 1e-9):.1f} tokens/s",
             ("tests/test_sample.py::test_the_speed_line_counts_generated_tokens_only",),
             "sample.py's tokens/s counts the prompt as generated"),
    Mutation("gen_bench_hf_slower_setting", "bench/generation.py",
             "hf_best = [min(a, b) for a, b in zip(", "hf_best = [max(a, b) for a, b in zip(",
             ("tests/test_bench.py::test_generation_table_compares_with_hugging_faces_faster_setting_each_round",),
             "the generation bench compares with Hugging Face's slower cached setting: our speedup inflated"),
    # the code-only plants the suite caught already (docs/testing.md), kept so it goes on catching them
    Mutation('alibi_nonpow2_slopes', 'model/positions.py',
             'slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_head - closest]',
             'slopes = power_of_two(closest) + power_of_two(2 * closest)[1::2][: n_head - closest]',
             ('tests/test_export.py::test_every_positional_encoding_exports_with_our_logits_and_round_trips[alibi-3-heads]',),
             'ALiBi with a non-power-of-two head count (e.g. 6 heads) takes the wrong interleaved slopes from the next power of two: the extra heads get other slopes than Press et al. / the exported remote code'),
    Mutation('attn_dropout_in_eval', 'model/attention.py',
             'dropout_p = self.dropout_p if self.training else 0.0',
             'dropout_p = self.dropout_p',
             ('tests/test_attention_maps.py::test_capture_attention_runs_in_eval_fp32_and_restores_training_mode',),
             'softmax attention keeps applying attention dropout in eval mode when model.dropout > 0: validation loss, sampling and captured attention maps are noisy/non-deterministic'),
    Mutation('local_attention_first_block_mask', 'model/attention.py',
             'visible[0, :, :p] = False  # the first block has nothing before it',
             'visible[-1, :, :p] = False  # the first block has nothing before it',
             ('tests/test_export.py::test_every_model_option_exports_with_our_logits[window]',),
             'blocked sliding-window attention (sdpa backend, window>0, T>window) masks the previous keys of the LAST block instead of the first: the first block attends to zero padding, the last loses its window; sdpa and math backends disagree'),
    Mutation('linear_prefill_state_raw_keys', 'model/linear_attention.py',
             'kv_cache.state[layer] = (fk.transpose(-2, -1) @ v, fk.sum(2))',
             'kv_cache.state[layer] = (k.transpose(-2, -1) @ v, fk.sum(2))',
             ('tests/test_model_variants.py::test_linear_attention_decodes_from_a_constant_state_as_a_full_forward',),
             'linear attention prefill stores sum k v^T with raw keys instead of phi(k): cached decoding after a multi-token prompt diverges from the uncached path (different generated tokens)'),
    Mutation('sampler_resume_reseeds', 'data/batches.py',
             'self.generator.set_state(state["generator"])',
             'self.generator.manual_seed(int(state["seed"]))',
             ('tests/test_data_batches.py::test_resume_from_state_dict_continues_the_same_stream',),
             'resuming restores the sampler by re-seeding instead of restoring the generator state: a resumed run replays the batches from the start of training instead of continuing the stream'),
    Mutation('eval_batches_overlap', 'data/batches.py',
             'self.starts[i * self.batch_size:(i + 1) * self.batch_size]',
             'self.starts[i:i + self.batch_size]',
             ('tests/test_data_batches.py::test_eval_batches_are_fixed_and_spread_over_the_array',),
             'evaluation batch i takes starts[i:i+B] (sliding by one) instead of the i-th block: validation loss is computed on heavily overlapping windows from the start of the val split only'),
    Mutation('bpe_cache_key_ignores_vocab', 'data/prepare.py',
             'return {"kind": "bpe", "vocab_size": cfg.vocab_size}',
             'return {"kind": "bpe"}',
             ('tests/test_data_prepare.py::test_key_changes_with_content_and_settings_only',),
             'the data cache key omits the BPE vocab_size: changing data.vocab_size silently reuses the old prepared folder/tokenizer with the old vocabulary'),
    Mutation('train_loss_last_microbatch', 'attention_lab/training/loop.py',
             'total += loss.item()',
             'total = loss.item()',
             ('tests/test_train_step.py::test_grad_accum_equals_one_big_batch[0.0]',),
             "with grad_accum > 1 the reported training loss (console, metrics.jsonl, train bpb) is only the last micro-batch's loss divided by grad_accum"),
    Mutation('muon_lr_scale_inverted', 'attention_lab/training/optim.py',
             'scaled_lr = lr * math.sqrt(max(1.0, shape[0] / shape[1]))',
             'scaled_lr = lr * math.sqrt(max(1.0, shape[1] / shape[0]))',
             ('tests/test_optim.py::test_muon_ns_steps_reaches_the_iteration[3]',),
             "Muon's shape adjustment uses cols/rows: tall matrices (c_fc, 4C x C) lose their sqrt(4)=2x lr boost and wide ones (c_proj) get it instead"),
    Mutation('resume_forgets_best_val', 'attention_lab/training/state.py',
             'self.step, self.best_val, self.tokens_seen = state["step"], state["best_val_loss"], state["tokens_seen"]',
             'self.step, self.tokens_seen = state["step"], state["tokens_seen"]',
             ('tests/test_headline_numbers.py::test_best_checkpoint_is_the_lowest_validation_loss',),
             'best_val_loss is not restored on resume: the first evaluation after resuming always counts as best and best.json can point to a worse checkpoint; final best_val_loss is wrong'),
    Mutation('detection_target_rows_wrong_axis', 'attention_lab/interp/roles.py',
             'a[..., ~np.asarray(d).any(-1), :] = 0.0',
             'a[..., :, ~np.asarray(d).any(-1)] = 0.0',
             ('tests/test_attention_maps.py::test_measured_roles_label_hand_made_heads',),
             'stripe role scores (previous_token, duplicate_token, induction) zero key COLUMNS instead of query rows without a target: denominators wrong, induction/prev scores inflated or deflated'),
    Mutation('probe_half_offbyone', 'attention_lab/interp/heads.py',
             '    first = token_losses[:, : half - 1].mean().item()\n    repeat = token_losses[:, half - 1 :].mean().item()',
             '    first = token_losses[:, :half].mean().item()\n    repeat = token_losses[:, half:].mean().item()',
             ('tests/test_head_roles.py::test_probe_half_losses_split_at_the_repeat',),
             'probe half losses split one position late: the first half includes the first repeated target and the repeat loses it; probe_first_loss/probe_repeat_loss/phase changes shift'),
    Mutation('inside_window_offbyone', 'attention_lab/interp/inside.py',
             'row[: max(0, query - window + 1)] = -np.inf',
             'row[: max(0, query - window)] = -np.inf',
             ('tests/test_inside.py::test_every_step_matches_the_models_own_forward[learned-window]',),
             "step_inside for a sliding-window layer leaves key i-W visible: the recomputed weights/head_out differ from the model's (W+1 keys instead of W)"),
    Mutation('qk_pairs_chunk_offset', 'attention_lab/interp/circuits.py',
             'where = torch.cat([where, top.indices + start * v])[order]',
             'where = torch.cat([where, top.indices + start])[order]',
             ('tests/test_circuits.py::test_chunked_top_pairs_equal_the_full_matrix',),
             'qk_token_pairs offsets flat indices of later chunks by start instead of start*V: top QK pairs found past the first 512 query tokens are reported with the wrong query/key tokens'),
    Mutation('neox_qkv_regroup', 'attention_lab/interop/convert.py',
             'return t.reshape(3, n_head, hs, *rest).transpose(0, 1).reshape(3 * n_head * hs, *rest)',
             'return t.reshape(n_head, 3, hs, *rest).transpose(0, 1).reshape(3 * n_head * hs, *rest)',
             ('tests/test_export.py::test_each_neox_mapping_detail_matters',),
             'RoPE models exported to GPT-NeoX get query_key_value rows regrouped wrongly: the exported folder computes a different function (wrong logits in transformers, round trip broken)'),
    Mutation('cpu_bf16_requires_both', 'attention_lab/runtime/device.py',
             'return bool(caps.get("amx_bf16") or caps.get("avx512_bf16"))',
             'return bool(caps.get("amx_bf16") and caps.get("avx512_bf16"))',
             ('tests/test_device.py::test_auto_dtype_on_the_cpu_is_bf16_only_with_native_bf16[caps1-expected1]',),
             "CPUs with AVX512-BF16 but no AMX (Cooper Lake, Zen 4) are no longer seen as native bf16: dtype=auto and Muon's auto ns dtype pick float32 there"),
    Mutation('prune_deletes_best', 'attention_lab/store/checkpoint.py',
             'keep |= {d for d in (_read_pointer(root, "best"), _read_pointer(root, "latest")) if d}',
             'keep |= {d for d in (_read_pointer(root, "latest"),) if d}',
             ('tests/test_headline_numbers.py::test_best_checkpoint_is_the_lowest_validation_loss',),
             'checkpoint pruning no longer protects the best checkpoint: once it is older than keep_last it is deleted and best.json dangles (sample/evaluate/export --which best silently fall back to latest)'),
    Mutation('long_prompt_keeps_head', 'attention_lab/sampling.py',
             'ids = ids[-block_size:]',
             'ids = ids[:block_size]',
             ('tests/test_sample.py::test_long_prompt_keeps_its_last_block_size_tokens',),
             'a prompt longer than block_size keeps its FIRST block_size tokens (the warning says last): the continuation does not follow the end of the prompt'),
    # one forward pass, one cache (model/hooks.py, interp/analysis.py, interp/interventions.py)
    Mutation("ablation_wrong_head", "attention_lab/interp/analysis.py",
             "            z[r, head] = 0.0", "            z[r, (head + 1) % z.size(1)] = 0.0",
             ("tests/test_hooks.py",), "the batched ablation zeroes the next head, not the one it reports"),
    Mutation("hooks_always_on", "model/attention.py",
             "    hooked = False  # True inside model.hooks.hooked(): the hook points are called\n",
             "    hooked = True  # True inside model.hooks.hooked(): the hook points are called\n",
             ("tests/test_hooks.py",), "attention's hook points are called in training and decoding too"),
    Mutation("hooks_not_switched_off", "model/hooks.py",
             "            m.hooked = False\n", "            pass\n",
             ("tests/test_hooks.py",), "hooked() leaves the points on after the block (training pays for them)"),
    Mutation("pattern_edit_ignored", "model/attention.py",
             "        weights = on_weights(weights)", "        on_weights(weights)",
             ("tests/test_hooks.py",), "an edit of hook_pattern is recorded but the values are averaged with the old weights"),
    Mutation("hide_key_hides_the_wrong_key", "attention_lab/interp/interventions.py",
             'scores[:, heads, key + 1 :, key] = float("-inf")', 'scores[:, heads, key + 1 :, key - 1] = float("-inf")',
             ("tests/test_hooks.py",), "hide_key hides the key before the one asked for"),
    Mutation("uniform_leaks_the_future", "attention_lab/interp/interventions.py",
             "torch.where(torch.isfinite(row), torch.zeros_like(row), row)", "torch.zeros_like(row)",
             ("tests/test_hooks.py",), "uniform spreads the weight over future keys too"),
    Mutation("cache_k_unexpanded_for_gqa", "attention_lab/interp/analysis.py",
             'k = expand_kv(cache.stack("k")[:, 0], cfg.n_head)', 'k = cache.stack("k")[:, 0].repeat(1, cfg.n_head // cfg.kv_heads, 1, 1)',
             ("tests/test_hooks.py",), "grouped-query keys repeated in the wrong order (heads tiled, not grouped)"),
    Mutation("resid_recorded_before_the_edit", "model/gpt.py",
             "        x = x + a\n        if self.hooked:\n            x = self.hook_resid_mid(x)",
             "        if self.hooked:\n            x = self.hook_resid_mid(x)\n        x = x + a",
             ("tests/test_hooks.py",), "resid_mid recorded before the attention's add"),
    # the live lab's page (tests/test_lab_page.py)
    Mutation("lab_slider_keeps_the_old_checkpoint", "attention_lab/viewer/assets/lab.js",
             "    this.checkpoint = ckpts[i].name;\n    this.labelCheckpoint();\n    this.changed(LAB_DEBOUNCE_MS);",
             "    this.labelCheckpoint();\n    this.changed(LAB_DEBOUNCE_MS);",
             ("tests/test_lab_page.py::test_the_checkpoint_slider_shows_that_checkpoints_maps",),
             "the checkpoint slider names a checkpoint but the maps stay those of the one before", browser=True),
    Mutation("lab_click_swaps_layer_and_head", "attention_lab/viewer/assets/lab.js",
             "else next.push({ kind: mode, layer: l, head: h });", "else next.push({ kind: mode, layer: h, head: l });",
             ("tests/test_lab_page.py::test_zeroing_a_head_changes_the_loss_by_its_ablation_effect",),
             "clicking a head in the lab zeroes another head than the one clicked", browser=True),
    Mutation("explorer_binds_again_on_new_data", "attention_lab/viewer/assets/explorer.js",
             "    if (rolesChanged) this.buildRoleOptions();\n",
             "    this.bindHeadView();\n    if (rolesChanged) this.buildRoleOptions();\n",
             ("tests/test_lab_page.py::test_typing_draws_the_texts_maps_and_step_inside_numbers_in_the_same_components",),
             "every answer of the lab binds the head view's listeners again: each event runs once more per text",
             browser=True),
    # the live lab's server (tests/test_lab_server.py)
    Mutation("lab_analyzes_the_default_checkpoint", "attention_lab/lab/models.py",
             "        entry, name = self.resolve(model_id, checkpoint)\n        key = (entry.id, name)",
             "        entry, name = self.resolve(model_id, None)\n        key = (entry.id, name)",
             ("tests/test_lab_server.py",), "the lab computes with the run's default checkpoint, not the one the "
                                            "page names"),
    Mutation("lab_intervenes_on_both_sides", "attention_lab/lab/app.py",
             "_losses(lm.tokenizer, text_losses(lm.model, ids, top_k=TOP_K)),",
             "_losses(lm.tokenizer, text_losses(lm.model, ids, interventions=items, top_k=TOP_K)),",
             ("tests/test_lab_server.py",), "/api/intervene's 'before' is the edited model too (no difference shown)"),
    Mutation("lab_circuits_memo_misfiled", "attention_lab/lab/app.py",
             "for token, label in zip(new, lm.tokenizer.token_strings(new)):",
             "for token, label in zip(new, lm.tokenizer.token_strings(new)[::-1]):",
             ("tests/test_lab_server.py",), "the lab files a token's remembered OV writes under another token"),
    Mutation("lab_second_grid_shows_the_first_model", "attention_lab/viewer/assets/lab.js",
             "    this.cmpGrid.draw(frame, scores, this.cmpCmap);",
             "    this.cmpGrid.draw(this.view.explorer.frame, scores, this.cmpCmap);",
             ("tests/test_lab_page.py::test_a_second_model_is_drawn_beside_the_first_head_for_head",),
             "the second model's grid draws the first model's maps under the second one's name", browser=True),
    # chosen from the code alone by a helper who had not read the tests (docs/testing.md): 11 of 13 caught before
    Mutation('hooks_record_before_edits', 'model/hooks.py',
             '    for name, fn in (edits or {}).items():\n        handles.append(points[name].register_forward_hook(editor(fn)))\n    for name in record or ():  # after the edits: what is recorded is what the model went on with\n        handles.append(points[name].register_forward_hook(keeper(name)))\n',
             '    for name in record or ():\n        handles.append(points[name].register_forward_hook(keeper(name)))\n    for name, fn in (edits or {}).items():\n        handles.append(points[name].register_forward_hook(editor(fn)))\n',
             ('tests/test_hooks.py',), "run_with_cache with edits records the activation before the edit: a zeroed head's cached z (and its 'shares' in analyze) is not zero, the cache no longer shows what the edited model went on with"),
    Mutation('hooks_explicit_path_only_when_recorded', 'model/hooks.py',
             '    explicit = any(n.rsplit(".", 1)[-1] in ("hook_scores", "hook_pattern") for n in [*(edits or {}), *(record or ())])',
             '    explicit = any(n.rsplit(".", 1)[-1] in ("hook_scores", "hook_pattern") for n in (record or ()))',
             ('tests/test_hooks.py',), "an edit of hook_scores without recording runs the fused sdpa path, so hook_scores is never called: uniform / hide_key silently do nothing in text_losses, /api/intervene 'after', generation with interventions and the ablation baseline (analyze's own maps still look edited)"),
    Mutation('attention_on_scores_before_bias_and_mask', 'model/attention.py',
             '    scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, S)\n    if bias is not None:\n        scores = scores + bias\n    if causal_mask == "before_softmax":  # -inf before the softmax makes every hidden key\'s weight exactly 0\n        scores = scores.masked_fill(~visible, float("-inf"))\n    if on_scores is not None:\n        scores = on_scores(scores)\n',
             '    scores = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, S)\n    if on_scores is not None:\n        scores = on_scores(scores)\n    if bias is not None:\n        scores = scores + bias\n    if causal_mask == "before_softmax":  # -inf before the softmax makes every hidden key\'s weight exactly 0\n        scores = scores.masked_fill(~visible, float("-inf"))\n',
             ('tests/test_hooks.py',), "hook_scores sees the raw scaled dot products: recorded scores have no -inf on hidden keys and no ALiBi bias, and a 'uniform' edit on an ALiBi model is not uniform (the bias is added after it)"),
    Mutation('hide_key_hides_from_query_itself', 'attention_lab/interp/interventions.py',
             '        scores[:, heads, key + 1 :, key] = float("-inf")  # the queries after j; query j keeps its own key',
             '        scores[:, heads, key:, key] = float("-inf")  # the queries from j on',
             ('tests/test_hooks.py',), "hide_key also hides key j from query j: hiding key 0 leaves row 0 with no visible key (NaN weights / loss), and query j's own row changes though docs say it still sees its key"),
    Mutation('uniform_unmasks_future_keys', 'attention_lab/interp/interventions.py',
             '        scores[:, head] = torch.where(torch.isfinite(row), torch.zeros_like(row), row)',
             '        scores[:, head] = torch.zeros_like(row)',
             ('tests/test_hooks.py',), "'uniform' zeroes the -inf of hidden keys too: the edited head spreads its weight over all T keys, future tokens included (1/T instead of 1/(i+1)); the future leaks into the edited model's loss"),
    Mutation('ablation_baseline_ignores_interventions', 'attention_lab/interp/analysis.py',
             '        with hooked(model, base):\n            clean = F.cross_entropy(model(x).logits[0].float(), y[0]).item()\n',
             '        clean = F.cross_entropy(model(x).logits[0].float(), y[0]).item()\n',
             ('tests/test_hooks.py',), "with interventions, each head's ablation effect is measured against the unedited model's loss: every entry is offset by the intervention's own effect (no longer equals ablation_effects on the edited model)"),
    Mutation('inside_gqa_strided_kv_head', 'attention_lab/interp/inside.py',
             '    kv = head // (cfg.n_head // cfg.kv_heads)  # grouped-query attention: the key/value head this head reads',
             '    kv = head % cfg.kv_heads  # grouped-query attention: the key/value head this head reads',
             ('tests/test_inside.py', 'tests/test_model_switches.py'), 'step_inside on a grouped-query model (1 < n_kv_head < n_head) uses the wrong key/value head for most query heads: its dots, weights and head_out disagree with the captured attention (MHA/MQA unaffected)'),
    Mutation('inside_window_off_by_one', 'attention_lab/interp/inside.py',
             '        row[: max(0, query - window + 1)] = -np.inf',
             '        row[: max(0, query - window)] = -np.inf',
             ('tests/test_inside.py', 'tests/test_model_switches.py'), "for a sliding-window model step_inside lets query i see key i - W (W + 1 keys): its weights differ from the model's once i >= W"),
    Mutation('lab_before_uses_interventions', 'attention_lab/lab/app.py',
             '                live["before"] = _losses(lm.tokenizer, text_losses(lm.model, ids, top_k=TOP_K))',
             '                live["before"] = _losses(lm.tokenizer, text_losses(lm.model, ids, interventions=items,\n                                                                   top_k=TOP_K))',
             ('tests/test_lab_server.py',), "/api/analyze with interventions: live.before (the 'clean' loss and top) is the edited model's, so before == after and the page's delta loss is always 0"),
    Mutation('lab_intervention_keys_checked_against_block_size', 'attention_lab/lab/app.py',
             '    return lm, ids, _interventions(items, lm.config, len(ids)) if items else []',
             '    return lm, ids, _interventions(items, lm.config, lm.config.block_size) if items else []',
             ('tests/test_lab_server.py',), "a hide_key with key >= the text's token count (but < block_size) passes validation and crashes in the edit: a 500 'this is a bug' instead of the documented 422"),
    Mutation('registry_lru_evicts_newest', 'attention_lab/lab/models.py',
             '            self._loaded.popitem(last=False)',
             '            self._loaded.popitem()',
             ('tests/test_lab_server.py',), 'once CAPACITY checkpoints are loaded, each newly loaded one is evicted at once: moving the checkpoint slider reloads from disk every time (registry.loads grows) while the first ones stay forever'),
    Mutation('read_json_chunked_size_not_summed', 'attention_lab/lab/requests.py',
             '        size += len(chunk)\n        if size > max_bytes:',
             '        size = len(chunk)\n        if size > max_bytes:',
             ('tests/test_lab_server.py',), 'a body without Content-Length (chunked) is only checked chunk by chunk: a multi-megabyte body sent in small chunks is held, parsed and tokenized instead of a 413'),
    Mutation('lab_default_host_all_interfaces', 'attention_lab/lab/__main__.py',
             '    p.add_argument("--host", default="127.0.0.1",',
             '    p.add_argument("--host", default="0.0.0.0",',
             ('tests/test_lab_server.py',), '`python -m attention_lab.lab` listens on every interface by default: anyone on the network can run the models (no login), contrary to the documented 127.0.0.1'),
    Mutation("lab_sends_keys_past_the_end", "attention_lab/viewer/assets/lab.js",
             "             interventions: this.sendable(this.text.value) };",
             "             interventions: this.interventions.map((iv) => ({ ...iv })) };",
             ("tests/test_lab_page.py::test_a_hidden_key_past_the_end_of_a_shorter_text_is_not_sent_and_comes_back",),
             "a hidden key past the end of a shortened text is sent anyway (the page shows a 422)", browser=True),
    Mutation('labjs_stale_ignores_checkpoint', 'attention_lab/viewer/assets/lab.js',
             '    return body.model !== now.model || body.checkpoint !== now.checkpoint ||\n           JSON.stringify(body.interventions) !== JSON.stringify(now.interventions);',
             '    return body.model !== now.model ||\n           JSON.stringify(body.interventions) !== JSON.stringify(now.interventions);',
             ('tests/test_lab_page.py::test_an_answer_for_the_checkpoint_left_behind_is_never_drawn',), "moving the checkpoint slider while an analysis is in flight draws the old checkpoint's maps and losses under the new checkpoint's label (window.lab.drawn names the old checkpoint)", browser=True),
    # the lab's page, chosen from the code alone (docs/testing.md): 6 of 10 caught before, 10 of 10 after; the
    # tenth, a stale answer drawn under the new checkpoint, is labjs_stale_ignores_checkpoint above
    Mutation('page_next_token_off_by_one', 'attention_lab/viewer/assets/lab.js',
             '    } else parts.push(this.nextTable(live.top, i, actual, null));',
             '    } else parts.push(this.nextTable(live.top, i - 1, actual, null));',
             ('tests/test_lab_page.py::test_the_next_token_tables_are_the_models_at_the_pointer_before_and_after',), "without interventions, pointing at token #i shows the next-token top 10 after #i-1 (an empty table at #0), while the heading says 'After #i' and the 'actual' row no longer matches", browser=True),
    Mutation('page_loss_strip_shifted', 'attention_lab/viewer/assets/lab.js',
             '      const v = i > 0 && values ? values[i - 1] : null;',
             '      const v = values && i < values.length ? values[i] : null;',
             ('tests/test_lab_page.py',), "the loss strip (and the before/after and comparison strips) colours token t with token t+1's loss: the first token is coloured, the last is not, and each span's data-value disagrees with its title", browser=True),
    Mutation('page_ab_next_after_from_clean', 'attention_lab/viewer/assets/lab.js',
             '    for (const [side, top] of [["before", live.before.top], ["after", live.top]]) {',
             '    for (const [side, top] of [["before", live.before.top], ["after", live.before.top]]) {',
             ('tests/test_lab_page.py::test_the_next_token_tables_are_the_models_at_the_pointer_before_and_after',), "in the before/after panel the 'edited' column's next-token distribution is the clean model's, so both columns show the same top 10 whatever head is zeroed", browser=True),
    Mutation('page_head_click_layer_head_swapped', 'attention_lab/viewer/assets/lab.js',
             '    else next.push({ kind: mode, layer: l, head: h });',
             '    else next.push({ kind: mode, layer: h, head: l });',
             ('tests/test_lab_page.py::test_zeroing_a_head_changes_the_loss_by_its_ablation_effect',), 'clicking head LlHh zeroes LhHl instead (right only on the diagonal); the mark appears on the transposed head and a second click adds another intervention instead of removing it', browser=True),
    Mutation('page_hidden_key_past_end_sent', 'attention_lab/viewer/assets/lab.js',
             '  fits(iv, text) { return iv.kind !== "hide_key" || iv.key < this.tokensAtLeast(text); }',
             '  fits(iv, text) { return iv.kind !== "hide_key" || iv.key <= this.tokensAtLeast(text); }',
             ('tests/test_lab_page.py::test_a_hidden_key_exactly_one_past_the_end_is_not_sent',), 'after hiding the last token and shortening the text by one token, the key one past the end is still sent: the server answers 422 and an error shows instead of the key being struck out', browser=True),
    Mutation('page_greedy_temperature_dropped', 'attention_lab/viewer/assets/lab.js',
             'temperature: num("lab-temperature") ?? 0.8',
             'temperature: num("lab-temperature") || 0.8',
             ('tests/test_lab_page.py::test_generated_tokens_join_the_text_and_the_maps',), 'temperature 0 (greedy) is sent as 0.8: greedy generation and the before/after continuations are sampled instead, so the same seed gives text that is not the argmax continuation', browser=True),
    Mutation('page_compare_delta_sign_flipped', 'attention_lab/viewer/assets/lab.js',
             '      const d = a == null || b == null ? null : b - a;',
             '      const d = a == null || b == null ? null : a - b;',
             ('tests/test_lab_page.py',), "the second model's per-head delta shows first minus second instead of second minus first: a head stronger in the second model shows a negative, blue delta", browser=True),
    Mutation('page_inside_stale_qkv_cached', 'attention_lab/viewer/assets/inside.js',
             '    [this.q, this.k, this.v] = [d.q, d.k, d.v].map((text) => new LayerFloats(text, this.L, data.H * this.T * this.hs));',
             '    if (!this.q || this.q.per !== data.H * this.T * this.hs) [this.q, this.k, this.v] = [d.q, d.k, d.v].map((text) => new LayerFloats(text, this.L, data.H * this.T * this.hs));',
             ('tests/test_lab_page.py::test_step_inside_follows_the_checkpoint_slider_at_the_same_length',), "after a re-render with the same number of tokens (checkpoint slider, an intervention, one character replaced) the step-inside panel computes from the previous answer's q, k, v: its softmax no longer matches the head view's weights", browser=True),
    Mutation('page_head_view_tokens_duplicated', 'attention_lab/viewer/assets/explorer.js',
             '    if (keep === 0) box.replaceChildren();',
             '    if (keep === 0 && !this.tokNodes.length) box.replaceChildren();',
             ('tests/test_lab_page.py::test_a_text_replaced_from_its_first_token_is_drawn_once',), "when the new text's first token differs from the shown one (text replaced, or pasted over) the head view keeps the old tokens and appends the new ones after them: the text is shown twice and hovers hit stale nodes", browser=True),
    # front door, devices, the LSTM gates (issue 30)
    Mutation("auto_never_picks_mps", "attention_lab/runtime/device.py",
             'if torch.backends.mps.is_available():\n            return torch.device("mps")',
             'if False:\n            return torch.device("mps")',
             ("tests/test_device.py::test_auto_picks_cuda_then_apples_mps_then_the_cpu",),
             "device=auto never picks Apple's MPS: every Mac trains on the CPU"),
    Mutation("auto_prefers_mps_over_cuda", "attention_lab/runtime/device.py",
             "        if torch.cuda.is_available():\n            return torch.device(\"cuda\")\n"
             "        if torch.backends.mps.is_available():\n            return torch.device(\"mps\")\n",
             "        if torch.backends.mps.is_available():\n            return torch.device(\"mps\")\n"
             "        if torch.cuda.is_available():\n            return torch.device(\"cuda\")\n",
             ("tests/test_device.py::test_auto_picks_cuda_then_apples_mps_then_the_cpu",),
             "device=auto asks for MPS before CUDA"),
    Mutation("fused_adamw_on_mps", "attention_lab/training/optim.py",
             'fused=device.type in ("cpu", "cuda")', 'fused=device.type in ("cpu", "cuda", "mps")',
             ("tests/test_device.py::test_mps_runs_keep_the_cuda_only_paths_off",),
             "AdamW's fused kernel asked for on Apple's MPS too"),
    Mutation("several_processes_on_one_mac_gpu", "attention_lab/runtime/distributed.py",
             'if device.type == "mps":\n        raise ValueError', 'if False:\n        raise ValueError',
             ("tests/test_device.py::test_mps_runs_keep_the_cuda_only_paths_off",),
             "torchrun on a Mac puts every process on the one MPS GPU over gloo, which cannot carry MPS tensors"),
    Mutation("lstm_forget_bias_on_input_gate", "model/lstm.py",
             'getattr(lstm, f"bias_ih_l{layer}")[c : 2 * c].fill_(1.0)',
             'getattr(lstm, f"bias_ih_l{layer}")[0:c].fill_(1.0)',
             ("tests/test_lstm_init.py",),
             "the LSTM's bias of 1 sits on the input gate instead of the forget gate: the rnn claim's LSTM starts out forgetting"),
    Mutation("lstm_forget_bias_on_cell_gate", "model/lstm.py",
             'getattr(lstm, f"bias_ih_l{layer}")[c : 2 * c].fill_(1.0)',
             'getattr(lstm, f"bias_ih_l{layer}")[2 * c : 3 * c].fill_(1.0)',
             ("tests/test_lstm_init.py",),
             "the gate order misread (input, cell, forget, output): the bias of 1 lands on the cell candidate"),
    Mutation("lstm_forget_bias_first_layer_only", "model/lstm.py",
             "for layer in range(self.config.n_layer):  # gates stacked", "for layer in range(1):  # gates stacked",
             ("tests/test_lstm_init.py",),
             "only the first LSTM layer gets the forget bias of 1; the layers above start out forgetting"),
    Mutation("lstm_forget_bias_hh_not_zeroed", "model/lstm.py",
             'getattr(lstm, f"bias_hh_l{layer}")[c : 2 * c].zero_()', "pass",
             ("tests/test_lstm_init.py::test_the_forget_gate_bias_is_one_and_only_the_forget_gates",),
             "b_hh's forget slice keeps torch's random init: the gate's bias is 1 plus noise, not 1"),
    Mutation("lstm_embedding_left_at_torch_default", "model/lstm.py",
             "nn.init.uniform_(self.rnn.wte.weight, -0.1, 0.1)", "pass",
             ("tests/test_lstm_init.py::test_the_gates_weights_and_the_embeddings_keep_their_documented_init",),
             "the LSTM's embedding (and tied head) keeps nn.Embedding's N(0, 1) instead of U(-0.1, 0.1): logits 17x too large at the start"),
)


def copy_repo(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files, as they are in the working tree."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    for name in files:
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


NOT_RUN = "not run"  # a browser mutation without Chromium (apt-get install chromium chromium-driver)


def have_browser() -> bool:
    return all(shutil.which(b) for b in ("chromium", "chromedriver"))


def pytest(root: Path, python: str, tests) -> subprocess.CompletedProcess:
    # -p no:cacheprovider: nothing written back; -x: the first failure is enough. With Chromium present the
    # browser tests must run (a skip would let a planted bug "pass")
    env = {**os.environ, **({"REQUIRE_BROWSER_TESTS": "1"} if have_browser() else {})}
    return subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests], cwd=root,
                          capture_output=True, text=True, env=env)


def run(m: Mutation, python: str) -> tuple[str, float]:
    if m.browser and not have_browser():
        return NOT_RUN, 0.0
    with tempfile.TemporaryDirectory(prefix=f"mutant-{m.name}-") as tmp:
        root = Path(tmp)
        copy_repo(root)
        target = root / m.file
        text = target.read_text()
        if text.count(m.original) != 1:
            return f"STALE (the original text occurs {text.count(m.original)} times in {m.file})", 0.0
        target.write_text(text.replace(m.original, m.replacement))
        t0 = time.time()
        verdict = "caught" if pytest(root, python, m.tests).returncode != 0 else "SURVIVED"
        return verdict, time.time() - t0


def baseline(mutations, python: str) -> str | None:
    """The selected tests must pass on the unmutated code, or a "caught" would mean nothing."""
    tests = sorted({t for m in mutations for t in m.tests if have_browser() or not m.browser})
    with tempfile.TemporaryDirectory(prefix="mutant-baseline-") as tmp:
        copy_repo(Path(tmp))
        proc = pytest(Path(tmp), python, tests)
    return None if proc.returncode == 0 else proc.stdout[-2000:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", help="only these mutations (default: all)")
    p.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = p.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"error: unknown mutations {sorted(unknown)}; see --list", file=sys.stderr)
        return 2
    if args.list:
        for m in chosen:
            print(f"{m.name:<36} {m.file:<28} {m.what}")
        return 0
    failing = baseline(chosen, sys.executable)
    if failing is not None:
        print(f"error: the tests fail without any planted bug; fix them first:\n{failing}", file=sys.stderr)
        return 1
    bad = not_run = 0
    print(f"{'mutation':<36} {'verdict':<10} {'seconds':>7}  what")
    for m in chosen:
        verdict, seconds = run(m, sys.executable)
        not_run += verdict == NOT_RUN
        bad += verdict not in ("caught", NOT_RUN)
        print(f"{m.name:<36} {verdict:<10} {seconds:7.1f}  {m.what}", flush=True)
    print(f"\n{len(chosen) - bad - not_run} of {len(chosen)} planted bugs caught")
    if not_run:
        print(f"{not_run} not run: their tests need Chromium (apt-get install chromium chromium-driver)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
