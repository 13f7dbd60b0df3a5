"""Everything around the model: the rooms of the house and the one rule for who may import whom.

    model/                pure math (torch only)                                   imports nothing of the project
    data/                 corpus -> tokenizer -> token files -> batches; atomic files    imports only data/
    attention_lab/
      runtime/            device and dtype, autocast, eval_mode, OpenMP, distributed, FLOPs and the matmul peak,
                          the CLI error line                                       imports nothing of the project
      exercises/          write attention yourself: checks against model/ that name the mistake; the learner's
                          file loaded with guards and plugged into a model                  imports model, runtime
      store/              what a run folder holds: its layout (one module names every path), the run lock,
                          checkpoints, the logger (console, metrics.jsonl, TensorBoard, provenance)
      interp/             what the heads do: the role table, scores, the probe, ablation, phase changes, attention
                          capture, figures (pure functions: no files)
      viewer/             what a person opens: the attention pages and their assets, the sample report, the role
                          timeline read back from TensorBoard
      interop/            transformers: the weight and config mapping, import and export, the shipped remote code
      sampling.py         a prompt encoded, its continuation generated and streamed as text
      training/           the config schema, optimizers and schedules, the evaluation callbacks, TrainState, the
                          loop's parts, the whole-split evaluation
      claims.py           the tutorials' claims as experiments: arms trained by train.py, measured, reported
      ideas/              each idea of the tutorials seen in a run you trained: `python -m attention_lab.ideas NAME`
                          prints its numbers and draws one figure (measured in interp/ideas.py, drawn in viewer/)
      lab/                the live lab: a local web app over the rooms above (one forward pass, one cache per
                          text; interventions as hooks); `show(run, text)` puts one text's page in a notebook
    train.py, sample.py   entry points: short stories over the rooms above
    bench/                benchmark scripts: import the library, never the entry points

Imports run one way, down this list of layers: a room may import the rooms named for it in ROOMS below (and
itself), nothing else of the project; and nowhere does a circle of imports close. tests/test_layering.py reads
every module's imports (ast, lazy imports inside functions included) and fails on a violation.
"""

# room -> the rooms of the project it may import besides itself. A module belongs to the longest room its
# dotted name starts with ("attention_lab.store.checkpoint" -> "attention_lab.store").
ROOMS: dict[str, tuple[str, ...]] = {
    "model": (),
    "data": (),
    "attention_lab.runtime": (),
    # write attention yourself: the exercises checked against model/, the learner's file loaded and plugged in
    "attention_lab.exercises": ("model", "attention_lab.runtime"),
    "attention_lab.store": ("model", "data", "attention_lab.runtime", "attention_lab.exercises"),
    "attention_lab.interp": ("model", "data", "attention_lab.runtime"),
    "attention_lab.sampling": ("model", "data", "attention_lab.runtime", "attention_lab.store", "attention_lab.interop"),
    "attention_lab.viewer": ("model", "data", "attention_lab.runtime", "attention_lab.store", "attention_lab.interp"),
    "attention_lab.interop": ("model", "data", "attention_lab.runtime", "attention_lab.store"),
    "attention_lab.training": ("model", "data", "attention_lab.runtime", "attention_lab.exercises", "attention_lab.store",
                               "attention_lab.interp", "attention_lab.viewer", "attention_lab.interop"),
    # experiments: the tutorials' claims as arms trained by train.py (subprocesses), measured and reported
    "attention_lab.claims": ("model", "data", "attention_lab.runtime", "attention_lab.store", "attention_lab.interp",
                             "attention_lab.training"),
    # the tutorials' ideas on a trained run: one command per idea, numbers printed and one figure written
    "attention_lab.ideas": ("model", "data", "attention_lab.runtime", "attention_lab.store", "attention_lab.interp",
                            "attention_lab.viewer", "attention_lab.training"),
    # the live lab: a local server and page over the library's functions (nothing imports it but `show`)
    "attention_lab.lab": ("model", "data", "attention_lab.runtime", "attention_lab.store", "attention_lab.interp",
                          "attention_lab.viewer", "attention_lab.sampling", "attention_lab.interop"),
    # the old `python -m attention_lab.<command>` paths: thin entry points over the rooms
    "attention_lab": ("attention_lab.training", "attention_lab.interop", "attention_lab.viewer", "attention_lab.lab"),
    "bench": ("model", "data", "attention_lab.runtime", "attention_lab.store", "attention_lab.interp",
              "attention_lab.sampling", "attention_lab.interop", "attention_lab.training",
              "attention_lab.lab"),  # bench/lab_load.py serves the real app on loopback
    "train": ("model", "data", "attention_lab.runtime", "attention_lab.store", "attention_lab.interp",
              "attention_lab.viewer", "attention_lab.interop", "attention_lab.training"),
    "sample": ("model", "data", "attention_lab.runtime", "attention_lab.store", "attention_lab.interp",
               "attention_lab.sampling", "attention_lab.viewer", "attention_lab.interop", "attention_lab.training"),
}


def show(run=None, text: str = "", **options):
    """One text's attention page inline in a notebook (attention_lab/lab/notebook.py): `attention_lab.show(
    "runs/default/<time>", "ROMEO: ...")` as the last line of a cell. Options: checkpoint, model (a transformers id
    or folder), which, runs_root, interventions, height."""
    from attention_lab.lab.notebook import show as page  # the lab's room loads torch: only when asked for

    return page(run, text, **options)
