"""The claims as data: each names its arms (config overrides on one base preset), what answers it, and the
published result it is read beside. Nothing here runs anything.

An arm's learning rate is not part of its overrides: every arm is swept over `Claim.rates` (multiples of the base
preset's optim.lr) on the claim's `sweep_seeds`, which are never the seeds that decide its verdict (a rate chosen on
seeds 1 and 2 selects those seeds too), and its verdict seeds then train at the rate its sweep chose. A rate at
which any sweep run diverged (claims/trained.py DIVERGED_RULE) is never chosen. An arm with `sweep=False` keeps the
rate its overrides name (the scale claim's rate arms: there the rate is what the claim is about). Every swept arm
is also trained at the base rate on the verdict seeds: the common-rate verdict, a check that the verdict does not
hang on the rates the sweep chose. A claim whose rate is fixed in advance is checked at a second fixed rate
(`Claim.second_rate`, RATE_CHECK unless it says otherwise): every arm's verdict seeds again at that multiple of its
rate, and a verdict word that changes reads "depends on the rate" in the claim's plain sentence.

What a learner reads first (claims/report.py "What we found") is generated from the numbers with the words given
here: an arm's `said` (plain words for it), an expectation's `said` (what the claim predicts, in words), a claim's
`caveats` (a sentence added only when an expectation reads a given word: "we do not know why").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

BASE = ("experiment=claims",)
BASE_LR = 3e-3  # configs/experiment/claims.yaml's optim.lr: the sweep's centre
MIN_LR = 3e-4  # its optim.min_lr, the schedule's floor: a rate bracketed below it gets a floor of its own (runs.job)
RATES = (1 / 3, 1.0, 3.0)  # the sweep: log-spaced around the base rate
SEEDS = (1, 2, 3, 4, 5)  # the seeds that decide a verdict
RATE_CHECK = 1 / 3  # the second fixed rate, as a multiple of each arm's first: 1e-3 beside 3e-3 (9e-3, the other
# neighbour, trained unstably on some seeds in the earlier sweeps)
SWEEP_SEEDS = (101, 102, 103)  # the seeds that choose a rate: 3 at every rate, picked by their mean, none of them a
# verdict seed (two seeds picked rates where other seeds then trained unstably, and the verdict reused the two)
BRACKET = 4  # while an arm's best rate sits at the grid's edge, one more rate beyond it, at most this many times
# --quick: the same arms on a model and a run small enough for seconds (character data, 1 layer, 24 steps)
QUICK = ("data=shakespeare_char", "model.block_size=32", "model.n_layer=1", "model.n_embd=32", "train.batch_size=4",
         "train.max_steps=24", "train.eval_interval=12", "train.eval_batches=2", "optim.warmup_steps=4",
         "train.head_roles=false", "train.film=false", "train.tensorboard=false", "train.dtype=float32")


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: tuple[str, ...] = ()
    sweep: bool = True  # False: trains at the rate its overrides name (no sweep)
    after: str | None = None  # an arm whose finished runs it needs first (its time budget: "{minutes}")
    rate_of: str | None = None  # trains at the rate this other arm's sweep chose (the same model on a budget)
    said: str = ""  # the arm in plain words for the learner's sentence ("one projection for both"); default its name


@dataclass(frozen=True)
class Variable:
    """What a claim's sentence is about (d_k for "divide by sqrt(d_k)"), and the values it is tested at: each
    value's overrides are added to every arm. Rates are swept (or fixed) at `sweep_at` (default: the first value)
    and every other value trains fresh verdict seeds at that value's chosen rate; each expectation is decided at
    every value, and one trend test per expectation (stats.trend) says how the difference moves along it."""

    name: str
    settings: tuple[tuple[float, tuple[str, ...]], ...]  # (value, overrides) per value, ascending
    sweep_at: float | None = None

    @property
    def values(self) -> tuple[float, ...]:
        return tuple(v for v, _ in self.settings)


@dataclass(frozen=True)
class Expect:
    """The claim says `better` reaches a lower `metric` than `worse` (bits/byte on the test plays unless named).
    `worse_metric` compares two numbers of the same arm (a control measured on the same runs). `region`: the
    region of practical equivalence, in the metric's unit."""

    better: str
    worse: str
    metric: str = "bpb"
    worse_metric: str | None = None
    region: float = 0.01
    at: float | None = None  # along a variable: the value this copy is decided at
    of: tuple[str, str] | None = None  # along a variable: the arms' names before the value was added
    chance: float | None = None  # the metric at chance (recall: 4 bits for 16 letters): a value where the worse
    # arm's mean is within CHANCE_MARGIN of it is left out of the trend (a curve saturated at chance has no slope)


CHANCE_MARGIN = 0.05  # of the chance level: an arm at 3.8 bits or more of 4 is at chance


@dataclass(frozen=True)
class Caveat:
    """A sentence the plain finding adds when the expectation better-vs-worse reads one of `when` (at any value
    of the variable): what the numbers cannot say, e.g. "we do not know why". The words as plain.word_of reads
    them: "holds within" (significant, inside the region) is not "holds"."""

    better: str
    worse: str
    when: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Claim:
    name: str
    statement: str  # the tutorials' claim, one line
    arms: tuple[Arm, ...]
    measures: tuple[str, ...]  # which numbers besides bits/byte (claims/measure.py)
    expect: tuple[Expect, ...]
    published: str
    seeds: tuple[int, ...] = SEEDS
    rates: tuple[float, ...] = RATES
    sweep_seeds: tuple[int, ...] = SWEEP_SEEDS
    choose_by: str = "bpb"  # the number, on the choose plays, that picks each arm's rate
    plot: str = "curves"  # "curves": validation loss over steps; "position": loss by position; "bars:a,b": metrics
    notes: tuple[str, ...] = field(default=())  # what the arms hold constant, said once in the report
    variable: Variable | None = None  # the quantity the sentence is about, tested at several values
    fixed_rate: bool = False  # True: no sweep, every arm at rates[0] x the base rate (a common rate fixed in advance)
    axis: str | None = None  # a variable each run is measured along, no new runs: "length" (the scored context,
    # 1x/2x/4x the trained one) or "position" (the position in the context, log-spaced buckets); a trend per
    # bits/byte expectation along it
    overrides: tuple[str, ...] = ()  # on the base preset for every arm of this claim (--quick's sizes beat them)
    second_rate: float | None = RATE_CHECK  # a claim not swept: every arm again at this multiple of its own rate
    more_rates: tuple[float, ...] = ()  # and at these multiples too (the rnn claim: rates chosen at another context)
    noise_floor: bool = False  # most tokens are unpredictable: divergence is judged on held-out loss (trained.py)
    caveats: tuple[Caveat, ...] = ()
    headline: tuple[int, ...] = (0,)  # the expectations (by index, before along()) the README's one line gives


def at_value(arm: str, variable: Variable, value: float) -> str:
    """An arm's name at one value of the claim's variable: "sqrt, d_k=32"."""
    return f"{arm}, {variable.name}={value:g}"


def along(claim: Claim) -> Claim:
    """The claim with its arms and expectations repeated at every value of its variable (itself if it has none):
    an arm swept at `sweep_at` is trained at the other values at that value's rate (rate_of), an arm that needs
    another's time needs that arm's at the same value."""
    var = claim.variable
    if var is None:
        return claim
    at = var.sweep_at if var.sweep_at is not None else var.values[0]
    arms = []
    for value, overrides in var.settings:
        for a in claim.arms:
            here = at_value(a.name, var, value)
            rate_of = a.rate_of and at_value(a.rate_of, var, at)
            if a.sweep and value != at:
                rate_of = at_value(a.name, var, at)
            arms.append(Arm(here, (*a.overrides, *overrides), sweep=a.sweep and value == at,
                            after=a.after and at_value(a.after, var, value), rate_of=rate_of, said=a.said))
    expect = tuple(Expect(at_value(e.better, var, v), at_value(e.worse, var, v), e.metric, e.worse_metric, e.region,
                          at=v, of=(e.better, e.worse), chance=e.chance) for v in var.values for e in claim.expect)
    return replace(claim, arms=tuple(arms), expect=expect)


RNN_RATES = {"transformer": 9e-3, "lstm": 0.243}  # what the rnn claim's sweep chose at 128 tokens (sweep seeds
# 101-103; none of its 33 runs diverged; the LSTM's after 4 rates beyond the grid), fixed for the 512-token claim
LONG = ("model.block_size=512", "train.batch_size=4")  # the rnn claim's context: 4 x 512 tokens a step
RECALL_CHANCE = 4.0  # bits per recalled item: log2 of the 16 item letters
HAVIV_REGION = 0.05  # bits/byte: "competitive" for the positions claim's none-vs-learned (Haviv et al. 2022)
HEAD_COUNTS = (1, 4, 8)  # the counts the expectations compare (2 and 16 heads cost runs and decided nothing)
FIXED = ("no sweep: every arm at one rate fixed in advance (3e-3, the base preset's), the common-rate verdict being "
         "the verdict, and checked at a second fixed rate (1e-3): a verdict that differs there depends on the rate. "
         "A sweep of 3 rates on 3 seeds costs 9 or more runs an arm, more than its 5 verdict seeds, and "
         "brings this claim past an hour on 2 cores; in the earlier sweeps the arms' best rates were 3e-3 or 9e-3, "
         "and 9e-3 trained unstably on other seeds. `--rates 0.333,1,3` runs the sweep")
VASWANI_A = ("Vaswani et al. 2017 Table 3 rows (A), English-German dev set at equal compute (d_model 512): "
             "1 head 5.29 perplexity (24.9 BLEU), 4 heads 5.00 (25.5), 8 heads 4.92 (25.8, the base model), "
             "16 heads 4.91 (25.8), 32 heads 5.01 (25.4); Michel et al. 2019: most heads can be removed one at a time "
             "without a significant change in BLEU")


def _heads_claim(name: str, statement: str, pos: str, note: str, caveats: tuple = ()) -> "Claim":
    """The heads series at one positional encoding: 1, 4 and 8 heads at two widths."""
    arms = tuple(Arm(f"{n} head{'s' * (n > 1)}", (f"model.n_head={n}", f"model.pos_encoding={pos}"),
                     said=f"{n} head{'s' * (n > 1)}") for n in HEAD_COUNTS)
    return Claim(name, statement, arms, ("roles", "ablation"),
                 (Expect("4 heads", "1 head"), Expect("8 heads", "1 head"), Expect("8 heads", "4 heads")),
                 VASWANI_A, plot="bars:bpb", variable=WIDTHS, rates=(1.0,), fixed_rate=True, caveats=caveats,
                 headline=(0, 1),
                 notes=(note, "along the width: every head count at 128 and at 256 channels, so a head count is seen "
                              "at two head sizes and a head size (32: 4 heads at 128, 8 at 256) at two head counts",
                        FIXED))


WIDTHS = Variable("n_embd", ((128, ("model.n_embd=128",)), (256, ("model.n_embd=256",))))


CLAIMS = {c.name: c for c in (
    Claim("qk", "queries and keys are separate projections because what a word looks for differs from what it "
          "offers",
          (Arm("separate", said="separate query and key projections"),
           Arm("separate, no self", ("model.attend_self=false",),
               said="separate projections with no token attending to itself"),
           Arm("tied", ("model.qk_tied=true", "model.mlp_ratio=4.5"), said="one projection for both"),
           Arm("tied, no self", ("model.qk_tied=true", "model.mlp_ratio=4.5", "model.attend_self=false"),
               said="one projection for both with no token attending to itself")),
          ("diagonal", "previous_head"),
          (Expect("separate", "tied"), Expect("separate, no self", "tied, no self"),
           Expect("separate", "separate, no self")),
          "no published ablation at the scale of a language model; Kitaev et al. 2020 (Reformer, §2 and Figure 3) "
          "share queries and keys, forbid a token to attend to itself (with q = k it would attend to itself "
          "most), and find shared-QK attention no worse than separate on enwik8 and imagenet64",
          rates=(1.0,), fixed_rate=True, headline=(0, 1), plot="bars:bpb",
          notes=("a 2 x 2: tied or separate Q/K, crossed with self or no self, so that tying and Reformer's rule are "
                 "each seen with the other held fixed (separate vs tied at self and at no self; self vs no self "
                 "with separate projections)",
                 "matched parameters: the tied arms' MLP is widened from 4x to 4.5x, which gives back exactly the "
                 "parameters the k projection held (n_embd^2 per layer); no self adds no parameter, so all four arms "
                 "hold the same count",
                 "no self: a token never attends to itself unless it has no other key (model.attend_self=false), "
                 "Reformer's rule: with q = k a token's score with itself is the largest (|q|^2), so without the rule "
                 "a tied head spends its attention on the token itself",
                 "where the symmetry is already broken: tied, the score q_i.q_j is symmetric in i and j, but RoPE "
                 "rotates each side by its own position (the score then depends on the signed offset j - i) and the "
                 "causal mask lets i see j only when j comes first; so a tied head is not forced to relate two words "
                 "the same way both ways here, only the unrotated part of its scores is", FIXED)),
    Claim("scale", "scores are divided by sqrt(d_k) for numerical stability: as d_k grows, unscaled scores "
          "saturate the softmax and its gradient vanishes",
          (Arm("sqrt", said="scores divided by sqrt(d_k)"), Arm("none", ("model.attn_scale=none",),
                                                                  said="unscaled scores"),
           Arm("inverse", ("model.attn_scale=inverse",), said="scores divided by d_k"),
           Arm("sqrt-unit", ("model.qk_init=unit",), said="scores divided by sqrt(d_k), q and k starting at unit variance"),
           Arm("none-unit", ("model.attn_scale=none", "model.qk_init=unit"),
               said="unscaled scores, q and k starting at unit variance")),
          ("saturation",),
          (Expect("sqrt", "none"), Expect("sqrt", "inverse"), Expect("sqrt-unit", "none-unit"),
           Expect("sqrt", "none", "saturated_rows", region=0.02),
           Expect("sqrt-unit", "none-unit", "saturated_rows", region=0.02),
           Expect("none-unit", "sqrt-unit", "log10_score_grad_init", region=0.1)),
          "Vaswani et al. 2017 §3.2.1: for unit-variance q and k the dot product has variance d_k, which pushes "
          "the softmax into regions of tiny gradients (an argument, no ablation numbers); Wortsman et al. 2023: "
          "attention-logit growth makes small models unstable at high learning rates, and QK-layernorm prevents it",
          rates=(1.0,), fixed_rate=True, plot="trend", headline=(2, 4, 5),
          caveats=(Caveat("none-unit", "sqrt-unit", ("reversed", "reversed within"), "the argument's premise fails here: at the start "
                          "the unscaled scores pass more gradient, not less, so the softmax is not saturated at "
                          "initialisation, and whatever the unscaled arms lose in training does not come from the "
                          "start the argument describes; we do not know which step of it fails"),),
          variable=Variable("d_k", ((8, ("model.n_head=16",)), (32, ("model.n_head=4",)), (128, ("model.n_head=1",)))),
          notes=("the variable is the head size d_k at a constant width of 128 (16 heads of 8, 4 of 32, 1 of 128), "
                 "so the head count moves with it; every arm at one rate fixed in advance (3e-3, the base preset's): "
                 "the claim is about saturation as d_k grows, not about which rate each scaling tolerates (the "
                 "instability at high rates Wortsman et al. describe is another question)",
                 "sqrt, none, inverse: GPT-2's initialisation (every weight N(0, 0.02)), under which q and k start "
                 "with a variance of about 0.05 a channel, far from the argument's premise; the unit-init arms start "
                 "q and k at unit variance (their rows N(0, 1/n_embd): model.qk_init=unit), so that unscaled q.k "
                 "starts with variance d_k, the premise itself",
                 "max_weight: a query's largest attention weight, averaged over queries with at least 2 keys, "
                 "heads and layers; saturated_rows: the share of those rows whose largest weight is above 0.99; "
                 "log10_score_grad(_init): log10 of the RMS gradient of the loss at the softmax's input per "
                 "prediction, for the trained model (and for the same config untrained, under the run's seed): "
                 "a saturated softmax passes almost no gradient to its scores")),
    Claim("mask", "future keys get -inf before the softmax, not 0 after it, or the weights no longer sum to 1; "
          "without the mask the model sees the word it must predict",
          (Arm("before_softmax", said="the mask as -inf before the softmax"),
           Arm("after_softmax", ("model.causal_mask=after_softmax",), said="the mask as 0 after the softmax"),
           Arm("none", ("model.causal_mask=none",), said="no mask")),
          ("honest", "sample"),
          (Expect("before_softmax", "after_softmax", "honest_bpb"), Expect("before_softmax", "none", "honest_bpb")),
          "a standard result rather than a paper's table: a leaking mask trains to a low loss that does not "
          "survive hiding the future; its honest score is far worse than a masked model's, though better than "
          "knowing nothing (8 bits/byte)", choose_by="honest_bpb", plot="bars:leaky_bpb,honest_bpb",
          rates=(1.0,), fixed_rate=True, headline=(0, 1),
          notes=("after_softmax: the weights of future keys are set to 0 after the softmax, so they no longer sum "
                 "to 1, and the future still reaches each row through the softmax's denominator (the sum of "
                 "exp(score) over every key, future ones included): the model can read the next token from how much "
                 "its visible weights shrink", FIXED)),
    _heads_claim("heads", "several heads beat one", "rope",
                 "every arm of one width holds the same parameters, so more heads means smaller heads: 1, 4 and 8 "
                 "heads are heads of 128, 32 and 16 channels at 128 wide, of 256, 64 and 32 at 256 wide; under RoPE "
                 "a head of 16 channels has only 8 rotation frequencies, a confound `heads-learned` removes"),
    _heads_claim("heads-learned", "several heads beat one (the control: learned positions, no rotation in the heads)",
                 "learned", "the heads claim again with learned absolute positions added to the embeddings: the head "
                 "size no longer limits how positions are encoded",
                 caveats=tuple(Caveat(b, w, ("reversed", "reversed within"), "we do not know why; under RoPE (the heads claim) more "
                                      "heads win at both widths. Guesses: learned positions may train more slowly "
                                      "at this fixed rate (the rate check below says whether the reversal survives a "
                                      "third of the rate; a higher rate is untested), or a wide single head may use "
                                      "a learned position table better (untested)")
                               for b, w in (("4 heads", "1 head"), ("8 heads", "1 head"), ("8 heads", "4 heads")))),
    Claim("positions", "self-attention has no notion of order, so positions are added (though they may not be "
          "needed)",
          tuple(Arm(p, (f"model.pos_encoding={p}",), said=said)
                for p, said in (("none", "no positions"), ("learned", "learned positions"),
                                ("sinusoidal", "sinusoidal positions"), ("rope", "RoPE"), ("alibi", "ALiBi"))),
          ("position", "shuffle", "long_context"),
          (Expect("rope", "none"), Expect("learned", "none", region=HAVIV_REGION), Expect("sinusoidal", "none"),
           Expect("alibi", "none")),
          "Haviv et al. 2022 (\"Transformer language models without positional encodings still learn positional "
          "information\"; 125M parameters, the Pile): under a causal mask a model without positions is competitive, "
          "perplexity none 22.15, learned 22.04, sinusoidal 21.49, ALiBi 19.94, while a bidirectional one without "
          "positions fails (147 vs 4.06): this is the literature's \"maybe not needed\", and the none-vs-learned "
          "expectation asks it at a stated region. Kazemnejad et al. 2023: on their synthetic reasoning and "
          "arithmetic tasks (not language modelling), a decoder without positions generalises to longer inputs "
          "better than with RoPE or ALiBi; the scored-length trend here asks the same of language modelling",
          plot="position", axis="length", rates=(1.0,), fixed_rate=True, headline=(1, 0),
          caveats=(Caveat("learned", "none", ("equivalent", "holds within", "reversed", "reversed within"),
                          "so this causal model without positions is "
                          "competitive with learned ones, the answer Haviv et al. 2022 found at 125M parameters"),
                   Caveat("learned", "none", ("holds",), "so at this size these seeds cannot call a causal model "
                          "without positions competitive with learned ones at the stated region, where Haviv et al. "
                          "2022 found it was at 125M parameters (their explanation of how it can: under the causal "
                          "mask a model can still count how many tokens it sees)")),
          notes=(FIXED, f"learned vs none is judged at a region of ±{HAVIV_REGION:g} bits/byte (about 2% of these "
                 "models' loss), the question Haviv et al. ask: is a causal model without positions competitive? "
                 "Equivalent there means it is; the other expectations keep ±0.01",
                 "sinusoidal: the fixed table scaled to the embeddings' initial size (model/positions.py "
                 "SINUSOID_SCALE)", "along the length: every run trained at one context and scored on the same "
                 "windows at 1x, 2x and 4x that length; learned positions have no row past their table, so they are "
                 "scored at 1x only (no sliding window)")),
    Claim("rnn", "attention replaced recurrent networks because it relates distant words directly and trains in "
          "parallel",
          (Arm("transformer", (f"optim.lr={RNN_RATES['transformer']:g}",), sweep=False, said="the transformer"),
           Arm("lstm", ("model.arch=lstm", f"optim.lr={RNN_RATES['lstm']:g}"), sweep=False,
               said="an LSTM of the same size and steps"),
           Arm("lstm equal time", ("model.arch=lstm", f"optim.lr={RNN_RATES['lstm']:g}", "train.stop=budget",
                                   "train.max_minutes={minutes}"), sweep=False, after="transformer",
               said="an LSTM given the transformer's wall time")),
          ("position", "speed"), (Expect("transformer", "lstm"), Expect("transformer", "lstm equal time")),
          "Khandelwal et al. 2018: an LSTM language model uses about 200 words of context (PTB and WikiText-2, "
          "word-level), word order only within the last ~20-50 words; Kaplan et al. 2020: LSTM per-token loss "
          "plateaus after <100 tokens while transformers keep improving", plot="position", axis="position",
          more_rates=(1 / 9,), headline=(0, 1),
          overrides=LONG, caveats=(Caveat("transformer", "lstm equal time",
                                          ("undecided", "equivalent", "reversed", "reversed within"),
                                          "\"trains in parallel\" is not what this arm measures: every run here has "
                                          "one thread, where the LSTM processes more tokens a second than the "
                                          "transformer; the parallel advantage needs tokens/s at equal threads "
                                          "(1 and 2) and on a GPU, which this claim's runs do not "
                                          "measure: `python -m bench.rnn_parallel` does"),),
          notes=("every arm reads a context of 512 tokens, 4 sequences a step: the same 2,048 tokens a step as the "
                 "base preset's 16 x 128, over a context of 512 BPE tokens (about 480 words of Shakespeare), past "
                 "the ~200 words Khandelwal et al. found an LSTM uses",
                 "the rates were chosen at 128 tokens and batch 16 and are used at 512 tokens and batch 4, so the "
                 "rate check tries three rates at 512 tokens: each arm's, a third of it and a ninth of it",
                 "the LSTM's recipe: the same AdamW, schedule, batches and steps as the transformer, at a rate of its "
                 "own. The rates are fixed in advance: 9e-3 for the transformer and 0.243 for the LSTM, the rates "
                 "this claim's sweep chose at a context of 128 tokens (rates 1e-3 to 9e-3 on sweep seeds 101-103, "
                 "the LSTM's best at the grid's edge four times, so brought out to 0.729; none of its 33 "
                 "sweep runs diverged), not swept again at 512, which would cost 30 or more runs of 512 tokens. "
                 "`lstm equal time` trains at the LSTM's rate for the "
                 "transformer's mean wall time, on the same schedule stretched over that time (train.stop=budget: "
                 "the warmup and the decay follow the clock, the steps the transformer took set their shares)",)),
    Claim("recall", "attention relates distant words directly: a token d back is one step away, where a recurrent "
          "network must carry it through d steps of its state",
          (Arm("transformer", ("model.n_embd=64", "model.n_head=2"), said="the transformer"),
           Arm("lstm", ("model.n_embd=64", "model.n_head=2", "model.arch=lstm"), said="the LSTM")),
          ("recall",), (Expect("transformer", "lstm", "recall_bits", region=0.1, chance=RECALL_CHANCE),),
          "Graves et al. 2014 (Neural Turing Machines, the copy task) is about length generalisation: trained on "
          "sequences of up to 20 random 8-bit vectors, an LSTM learns to copy them (more slowly than an NTM) but "
          "fails on longer sequences than it was trained on; here every model is trained and tested at the same "
          "distance. Khandelwal et al. 2018: an LSTM language model uses about 200 words of context",
          rates=(1.0,), fixed_rate=True, plot="trend", noise_floor=True,
          overrides=("train.max_steps=1000",),
          variable=Variable("distance", tuple(
              (d, ("data.source=recall", "data.name=recall", "data.tokenizer=char", "data.val_docs=[]",
                   "data.recall_task=item", f"data.distance={d}", f"model.block_size={2 * d}",
                   f"train.batch_size={2048 // d}"))
              for d in (8, 32, 128, 512))),
          notes=("the task (data/recall.py item_task): one of 16 letters, then d - 2 filler letters drawn from 9 "
                 "others, a marker, and the first letter again, one example a document; so the token to recall is "
                 "exactly d back and the load is the same at every distance: one letter, 4 bits, where the delayed "
                 "copy of the earlier runs asked for all d letters at once (4d bits, so that failing at a long "
                 "distance could come from capacity, not distance). The marker says when to answer, so no model "
                 "need count to d. recall_bits, the verdict's number, is bits per recalled item on the held-out test "
                 "part's examples, each read whole from its start (4 bits: chance; 0: always right); "
                 "recall_accuracy the share recalled as the most likely token (chance 1/16)",
                 "at each distance d both arms see 2d tokens a window (a whole example of d + 1 and more) and "
                 "4,096 tokens a step (2048/d windows), the same 1,000 steps, AdamW and schedule; the transformer "
                 "2 layers 64 wide (2 heads of 32), the LSTM 2 layers 78 wide, the width that matches the "
                 "transformer's parameters (model.arch=lstm, as in the rnn claim)",
                 "1,000 steps, not the base preset's 600: in sizing runs of the earlier copy task the transformer "
                 "found the look-back at d = 512 by a sudden drop of its loss after 250 to 500 steps (--quick's 24 "
                 "steps beat them); one recall event a window gives fewer targets a step than the copy did, so at "
                 "d = 512 1,000 steps may be short for either arm, and the report's per-distance verdicts say so",
                 "no sweep: both arms at the base preset's rate (3e-3) fixed in advance, and again at 1e-3 (the rate "
                 "check); in 600-step sizing runs of the copy task (seed 1337, the choose part) the LSTM did no "
                 "better at d = 8 at 10x or 81x that rate, nor at d = 32 at 10x; the LSTM's own sweep on this task "
                 "is not run",
                 "a run is judged diverged on held-out loss only (trained.py HELD_OUT_RULE): almost every token is "
                 "random filler, so a run that has learned the task sits at a noise floor and its last training "
                 "batch lies above or below it by chance; the trend along d is fitted only where the LSTM is not "
                 "at chance")),
    Claim("context", "attention turns a word's context-free embedding into a context-dependent one",
          (Arm("base", said="the trained model"),
           Arm("uniform", ("model.attention=uniform",), said="a model trained with uniform attention")),
          ("similarity",),
          (Expect("base", "base", "context_left", worse_metric="context_left_uniform", region=0.01),
           Expect("base", "uniform", "context_left", region=0.01), Expect("base", "uniform")),
          "Ethayarajh 2019: in all layers of ELMo, BERT and GPT-2, on average less than 5% of the variance in a "
          "word's contextualized representations can be explained by their first principal component (a static "
          "embedding); upper layers produce more context-specific representations",
          notes=("context_left: after the last block, a token's cosine similarity to its other occurrences minus "
                 "that of random pairs (0: its vectors no closer to each other than to other tokens'); "
                 "context_at_embedding is the same number before any block, the value with no attention at all",
                 "two controls. The pasted one: the same trained runs read with every head's attention made uniform "
                 "over the prefix (scores set to 0 before the mask), weights these models never trained with; since "
                 "the MLPs act on one token at a time, any difference can only come from attention, so it asks "
                 "whether the learned weights contextualise more than a plain average of the words before, not "
                 "whether attention contextualises at all. The trained one: the `uniform` arm, the same model "
                 "trained from the start with every head's weights uniform over the prefix (model.attention=uniform: "
                 "its scores are 0, its q and k projections get no gradient), read as it was trained. RoPE acts only "
                 "on q and k, so this arm has no position information at all: it averages the prefix without order, "
                 "as the pasted control does", FIXED),
          rates=(1.0,), fixed_rate=True, plot="bars:context_left,context_left_uniform"),
    Claim("quadratic", "the cost grows with the square of the context", (), ("bench",), (),
          "Vaswani et al. 2017 Table 1: a self-attention layer costs O(n^2 d) for n positions (a recurrent layer O(n "
          "d^2)); Beltagy et al. 2020 (Longformer): a sliding window of w keys costs O(n w), linear in n; Katharopoulos "
          "et al. 2020: linear attention costs O(n)", seeds=()),
)}
