"""The tutorials' claims about attention, each an experiment a learner runs on a CPU, judged as a reviewer would.

    python -m attention_lab.claims --list                 # the claims, their statements and arms
    python -m attention_lab.claims qk                     # seeds at two fixed rates, measures, verdict -> claims/qk/report.md
    python -m attention_lab.claims qk --quick             # a tiny version in seconds (for tests and trying)
    python -m attention_lab.claims qk --launcher joblib   # the runs side by side (any Hydra launcher)
    python -m attention_lab.claims docs                   # docs/claims.md and the README's table, from the reports
    python -m attention_lab.claims compare RUN RUN ...    # a table and a plot of any runs

The modules, in the order a claim runs:

    catalog.py     the claims as data: arms (config overrides on configs/experiment/claims.yaml), expectations,
                   the published result, the seeds, the rate sweep, the variable the sentence is about (along())
    runs.py        the runs to train as one Hydra multirun of train.py (any launcher); finished runs reused, a twin
                   only when launched the same way; a run stopped on a non-finite loss recorded, not fatal
    trained.py     what a finished run's files say (curve, speed, wall time, rate) and the divergence rule
    measure.py     one run's final checkpoint measured on one half of the held-out plays
    stats.py       paired seeds -> mean difference, p, Holm, the interval at Holm's level, equivalence, verdict;
                   the trend along a variable (in the claim's Holm family); a seed far from its arm; a log-log slope
    experiment.py  one claim end to end: a sweep only when asked (--rates), the verdict seeds at each arm's rate and
                   again at the rate check's, measure on the test plays, decide (one Holm family), flag far seeds
    plain.py       the results in plain words: "What we found" and the README's one line per claim
    report.py      report.md and results.json; docs/claims.md and the README's list assembled from the results
                   (each real results.json kept as docs/claims/results_<name>.json, to regenerate without runs)
    cli.py         the command
"""

from attention_lab.claims.catalog import CLAIMS, Arm, Claim, Expect
from attention_lab.claims.experiment import run_claim, select

__all__ = ["CLAIMS", "Arm", "Claim", "Expect", "run_claim", "select"]
