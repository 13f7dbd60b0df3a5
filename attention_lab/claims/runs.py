"""Training a claim's runs as one Hydra multirun, with any launcher; reusing every run that already finished.

Each run to train is a job: an arm's overrides, a learning rate and a seed. The jobs are written as config files of
a group `claims_job` into <out>/jobs/ and train.py runs them as one sweep over that group:

    python train.py -m experiment=claims name=claims-qk +claims_job=separate-lr0.003-s1,tied-lr0.003-s1,...
        hydra.searchpath=[file://<out>/jobs] hydra.sweep.dir=<out>/runs hydra.sweep.subdir=<the job's name>
        [hydra/launcher=joblib | hydra/launcher=submitit_slurm ...]

so Hydra's launcher schedules them: in one process one after another (basic), side by side on the cores
(joblib: pip install hydra-joblib-launcher), or on a cluster (submitit). Each run is an ordinary run folder
<out>/runs/<job>/. A job whose folder holds claims_done.json is not trained again, and one whose run config
another claim beside this one already trained (the base arm is in six claims) is copied from there first, but
only if that run was launched the same way: its claims_done.json records the launch (`launch_of`: the launcher,
the CPU threads a run had and the torch version), and a twin is reused only when all three match. Its seed fixes
a run's initialisation and batches, but not every float32 sum: two launches that give a run different threads
give numbers that differ in the last digits, and training at a high rate amplifies that into different runs.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from attention_lab.claims.catalog import BASE_LR, MIN_LR, QUICK
from attention_lab.training.config import compose
from data.files import atomic_write, write_json_atomic

REPO = Path(__file__).resolve().parents[2]
DONE = "claims_done.json"
NON_FINITE = "the training loss became"  # train.py's message when it stops a run on a non-finite loss
GUESS_SECONDS = 60.0  # one run of the base preset on 2 cores, until a finished run says otherwise
GUESS_QUICK_SECONDS = 4.0  # one --quick run (3 took 10.9 s on 2 shared cores), until a finished one says otherwise


@dataclass(frozen=True)
class Job:
    arm: str
    seed: int
    lr: float | None  # None: the rate the arm's own overrides name
    overrides: tuple[str, ...]  # the arm's, the rate and the seed (key=value, no config groups)

    @property
    def name(self) -> str:
        rate = "" if self.lr is None else f"-lr{self.lr:.2e}"
        return f"{self.arm.replace(' ', '_').replace(',', '').replace('=', '')}{rate}-s{self.seed}"


def job(arm, seed: int, lr: float | None, minutes: float | None = None) -> Job:
    overrides = [o.replace("{minutes}", f"{minutes:.3f}") if minutes is not None else o for o in arm.overrides]
    if any("{minutes}" in o for o in overrides):
        raise ValueError(f"arm {arm.name!r} needs the time budget of arm {arm.after!r} first")
    if lr is not None:
        overrides.append(f"optim.lr={lr:.6g}")
        if lr < MIN_LR:  # bracketed below the preset's floor (a floor above the rate is refused): as far below it
            overrides.append(f"optim.min_lr={lr * MIN_LR / BASE_LR:.6g}")  # as the base rate's floor is below it
    return Job(arm.name, seed, lr, (*overrides, f"train.seed={seed}"))


@dataclass
class Runner:
    """Where a claim's runs live and how they are launched: `common` overrides precede every job's (the base
    preset, --quick's, data.cache_dir=...); `launcher` are Hydra overrides choosing and configuring one."""

    out: Path
    claim: str
    common: tuple[str, ...]
    launcher: tuple[str, ...] = ()
    log: callable = print
    progress: bool = True
    seconds: list[float] = field(default_factory=list)  # wall time of the runs this claim trained
    # arms whose wall time is another arm's budget (the equal-time LSTM's): never copied from another claim, so
    # their time is measured here, beside the runs that spend it, not under whatever load another claim ran
    timed: frozenset[str] = frozenset()

    @property
    def launch(self) -> dict:
        """How this runner's runs are launched, as claims_done.json records it and a twin must match."""
        return launch_of(self.launcher)

    @property
    def run_values(self) -> list[str]:
        """The launcher's settings that reach each run's config (train.num_threads=1 under joblib): a twin's
        config.json holds them, so the config it is compared with must too."""
        return [o for o in self.launcher if not o.startswith("hydra")]

    def run_dir(self, j: Job) -> Path:
        return self.out / "runs" / j.name

    def overrides(self, j: Job) -> list[str]:
        return [*self.common, f"name=claims-{self.claim}", *j.overrides]

    def train(self, jobs: list[Job]) -> dict[Job, Path]:
        """Train every job not finished yet (reused, or copied from another claim unless its arm is timed);
        -> each job's run folder."""
        todo = []
        for j in dict.fromkeys(jobs):
            run_dir = self.run_dir(j)
            if finished(run_dir):
                continue
            twin = None if j.arm in self.timed else finished_twin(self.out, [*self.overrides(j), *self.run_values],
                                                                   skip=run_dir, launch=self.launch)
            if twin is not None:  # the same run, trained for another claim: copied, so this claim's folder is whole
                self.log(f"  {j.name}: the same run as {twin}, copied")
                shutil.copytree(twin, run_dir, dirs_exist_ok=True)
                continue
            todo.append(j)
        if todo:
            self._launch(todo)
        return {j: self.run_dir(j) for j in jobs}

    def _launch(self, todo: list[Job]) -> None:
        jobs_dir = self.out / "jobs"
        group = jobs_dir / "claims_job"
        group.mkdir(parents=True, exist_ok=True)
        choices = [o for o in self.common if "." not in o.partition("=")[0]]  # groups (experiment=claims, data=...)
        for j in todo:
            with atomic_write(group / f"{j.name}.yaml") as f:
                f.write("# @package _global_\n" + yaml.safe_dump(job_values(self.common, j.overrides), sort_keys=True))
        cmd = [sys.executable, str(REPO / "train.py"), "-m", *choices, f"name=claims-{self.claim}",
               f"+claims_job={','.join(j.name for j in todo)}", f"hydra.searchpath=[file://{jobs_dir.resolve()}]",
               f"hydra.sweep.dir={(self.out / 'runs').resolve()}",
               "hydra.sweep.subdir=${hydra:runtime.choices.claims_job}", *self.launcher]
        estimate = self.estimate()
        self.log(f"  {len(todo)} run{'s' * (len(todo) > 1)} to train, "
                 f"about {minutes_or_seconds(len(todo) * estimate)} at "
                 f"{estimate:.0f} s a run one at a time ({' '.join(self.launcher) or 'the basic launcher'})")
        log_path = self.out / "multirun.log"
        t0 = time.time()
        start = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "a") as log_file:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, text=True)
            watch = threading.Thread(target=self._watch, args=(proc, todo), daemon=True)
            watch.start()
            proc.wait()
            watch.join()
        with open(log_path, errors="replace") as f:
            f.seek(start)
            said = f.read()
        if proc.returncode != 0 and NON_FINITE in said:
            self._stopped(todo, said)
            return
        if proc.returncode != 0:
            tail = "\n".join(said.strip().splitlines()[-12:])
            raise RuntimeError(f"claim {self.claim}: train.py -m failed (exit {proc.returncode}; the whole log: "
                               f"{log_path}):\n{tail}")
        missing = [j.name for j in todo if not finished(self.run_dir(j))]
        if missing:
            raise RuntimeError(f"claim {self.claim}: the sweep ended without finishing {', '.join(missing)} "
                               f"(see {log_path})")
        for j in todo:  # how each was launched, so that a twin is only ever one launched the same way
            done = self.run_dir(j) / DONE
            write_json_atomic(done, json.loads(done.read_text()) | {"launch": self.launch})
        self.log(f"  trained in {(time.time() - t0) / 60:.1f} min")

    def _stopped(self, todo: list[Job], said: str) -> None:
        """The trainer stopped a run on a non-finite loss, and the multirun with it. With one run in flight that
        run is the diverged one: it is recorded so (claims_done.json: `stopped`, the trainer's message) and
        counts as finished; with several, each is trained again alone to learn which; then the rest."""
        started = [j for j in todo if self.run_dir(j).exists() and not finished(self.run_dir(j))]
        if len(todo) == 1 or len(started) == 1:
            j = todo[0] if len(todo) == 1 else started[0]
            message = next(line for line in said.splitlines() if NON_FINITE in line).removeprefix("error: ")
            run_dir = self.run_dir(j)
            run_dir.mkdir(parents=True, exist_ok=True)
            began = min((p.stat().st_mtime for p in run_dir.rglob("*") if p.is_file()), default=time.time())
            write_json_atomic(run_dir / DONE, {"seconds": max(0.0, time.time() - began), "stopped": message,
                                               "launch": self.launch})
            self.log(f"  {j.name}: diverged ({message.split(';')[0]})")
            self.seconds.append(self.seconds_of(run_dir))
            rest = [k for k in todo if k != j and not finished(self.run_dir(k))]
        else:
            for j in started:  # alone, from nothing, so the failure names its run
                shutil.rmtree(self.run_dir(j))
                self._launch([j])
            rest = [k for k in todo if not finished(self.run_dir(k))]
        for j in rest:  # a half-trained run would be resumed, not trained from nothing
            if self.run_dir(j).exists():
                shutil.rmtree(self.run_dir(j))
        if rest:
            self._launch(rest)

    def _watch(self, proc: subprocess.Popen, todo: list[Job]) -> None:
        """A progress bar over runs: a run counts once its console says it is done."""
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(todo), desc=f"claim {self.claim}", unit="run", dynamic_ncols=True)
        left = list(todo)
        while left:
            for j in [j for j in left if finished(self.run_dir(j))]:
                left.remove(j)
                self.seconds.append(self.seconds_of(self.run_dir(j)))
                if bar is not None:
                    bar.update(1)
            if proc.poll() is not None and left:
                for j in [j for j in left if finished(self.run_dir(j))]:
                    left.remove(j)
                break
            time.sleep(0.5)
        if bar is not None:
            bar.close()

    def seconds_of(self, run_dir: Path) -> float:
        """A finished run's wall clock, as its claims_done.json holds it (a copied run keeps its own)."""
        return json.loads((Path(run_dir) / DONE).read_text())["seconds"]

    def estimate(self) -> float:
        """Seconds a run takes here: the median of the runs of this size finished beside this claim (any claim;
        --quick's runs sit in claims/<name>-quick, and a full run's minute is no estimate of a quick run's
        seconds), else a guess."""
        quick = set(QUICK) <= set(self.common)
        here = self.out.resolve()
        done = sorted(p for p in here.parent.glob(f"*/runs/*/{DONE}")
                      if p.parents[2] == here or p.parents[2].name.endswith("-quick") == quick)[-50:]
        seconds = sorted(json.loads(p.read_text())["seconds"] for p in done)
        return seconds[len(seconds) // 2] if seconds else (GUESS_QUICK_SECONDS if quick else GUESS_SECONDS)


def minutes_or_seconds(seconds: float) -> str:
    """A time estimate in the unit it reads best in: 40 s, not "1 min" (and never "0 min")."""
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def job_values(common: list[str], own: list[str]) -> dict:
    """A job's file: the common values (key=value; config-group choices stay on the command line), then the job's
    own, so that a job's value beats a common one (on the command line a common value would beat the file:
    --quick's max_steps would cap the equal-time LSTM)."""
    values = [o for o in common if "." in o.partition("=")[0]]
    return nested([*values, *own])


def nested(overrides) -> dict:
    """key.sub=value overrides -> {"key": {"sub": value}} (values parsed as YAML: 4 -> int, true -> bool)."""
    out: dict = {}
    for o in overrides:
        key, _, value = o.partition("=")
        if "." not in key:
            raise ValueError(f"an arm may set values, not choose config groups: {o!r}")
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(value)
    return out


def finished(run_dir: Path) -> bool:
    """A run is finished once claims_done.json says so, or its console's last word is `done:` (then the
    marker is written, with the run's wall time: from its provenance to its last console line)."""
    if (run_dir / DONE).exists():
        return True
    console = run_dir / "console.log"
    if not console.exists() or not any(line.startswith("done:") for line in console.read_text().splitlines()[-3:]):
        return False
    # Hydra writes the job's .hydra/ as it starts it; a run trained by hand has its provenance written early
    start = min((p.stat().st_mtime for p in (run_dir / ".hydra" / "config.yaml", run_dir / "provenance.json")
                 if p.exists()), default=console.stat().st_mtime)
    write_json_atomic(run_dir / DONE, {"seconds": max(0.0, console.stat().st_mtime - start)})
    return True


def launch_of(launcher: tuple[str, ...] | list[str]) -> dict:
    """A launch as a twin must match it: the Hydra launcher (and its size), the threads a run gets, torch."""
    import os

    import torch

    name = next((o.split("=", 1)[1] for o in launcher if o.startswith("hydra/launcher=")), "basic")
    jobs = next((o.split("=", 1)[1] for o in launcher if o.startswith("hydra.launcher.n_jobs=")), None)
    threads = next((int(o.split("=", 1)[1]) for o in launcher if o.startswith("train.num_threads=")), None)
    return {"launcher": name + (f" n_jobs={jobs}" if jobs else ""),
            "threads": threads if threads is not None else torch.get_num_threads() or os.cpu_count(),
            "torch": torch.__version__}


def resolved(overrides: list[str]) -> dict:
    """The run config these overrides compose to, as its config.json holds it, without the run's name."""
    import dataclasses

    return _learned(json.loads(json.dumps(dataclasses.asdict(compose(list(overrides))))))


def _learned(cfg: dict) -> dict:
    """A run config without its name (which says where it was trained, not what it learns)."""
    cfg = dict(cfg)
    cfg.pop("name", None)
    return cfg


def finished_twin(out: Path, overrides: list[str], skip: Path | None = None, launch: dict | None = None) -> Path | None:
    """A finished run beside `out` (out/../*/runs/*: this claim's or another's) whose run config equals these
    overrides' (the name aside) and whose launch (launcher, threads, torch) equals `launch`: the base arm is the
    same run in six claims, trained once. A run that does not record its launch is nobody's twin."""
    want = None
    launch = launch if launch is not None else launch_of(())
    for done in sorted(out.resolve().parent.glob(f"*/runs/*/{DONE}")):
        run = done.parent
        if (skip is not None and run == Path(skip).resolve()) or not (run / "config.json").exists():
            continue
        if json.loads(done.read_text()).get("launch") != launch:
            continue
        want = want if want is not None else resolved(overrides)
        if _as_now(_learned(json.loads((run / "config.json").read_text())), want, _defaults()) == want:
            return run
    return None


def _defaults() -> dict:
    import dataclasses

    from attention_lab.training.config import Config

    return json.loads(json.dumps(dataclasses.asdict(Config())))


def _as_now(old: dict, want: dict, defaults: dict) -> dict:
    """An older run's config with the fields added to the config since it trained (absent from its config.json)
    read as their defaults, where `want` holds the default too: a new field's default keeps the old behaviour
    (train.snapshots=0: no film frames, the run identical to every digit), any other value of it is another run."""
    out = dict(old)
    for key, value in want.items():
        if key not in old and isinstance(defaults, dict) and key in defaults and value == defaults[key]:
            out[key] = value
        elif isinstance(value, dict) and isinstance(old.get(key), dict):
            out[key] = _as_now(old[key], value, defaults.get(key, {}) if isinstance(defaults, dict) else {})
    return out


def mean_minutes(seconds: list[float]) -> float:
    return max(sum(seconds) / len(seconds) / 60.0, 0.05) if seconds else math.nan
