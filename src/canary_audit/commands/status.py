"""A run's progress as a person watches it: `python -m canary_audit status`
in the folder Snakemake runs in (running or finished).

It reads Snakemake's own log of the newest run (`.snakemake/log/`: the job
counts per rule it planned, each job's start and finish, the step counter)
and, for every job still running, the last progress line of that job's log
(training `step 120/300 ... eta 14s`, a probe pass `variant 3/7 ... (eta
20s)`), and estimates the time left from what the finished jobs of each rule
took, spread over the run's cores (at least the longest ETA a running job
reports for itself).  A rule none of whose jobs has finished yet is
estimated from the typical seconds per job the package ships
(`commands/job_seconds.json`, measured on a default run of a 2-core machine), scaled
by how fast this machine ran the jobs that did finish.  It starts nothing
and never touches the run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from canary_audit.core.jobs import VIEW_JOBS

# Typical seconds per job of each rule (package data, and where they come from).
TYPICAL = Path(__file__).with_name("job_seconds.json")

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
START = re.compile(r"^(?:local)?rule (\w+):$")
FINISH = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")
STEPS = re.compile(r"^(\d+) of (\d+) steps \((\d+)%\) done$")
COUNT = re.compile(r"^(\w+)\s+(\d+)$")
CORES = re.compile(r"^Provided cores: (\d+)$")
# A job's own progress lines (train/lora.py, probes/job.py, passes).
ETA = re.compile(r"eta (\d+(?:\.\d+)?)s")
PROGRESS = re.compile(r"(step \d+/\d+.*|variant \d+/\d+.*|hit@\d+: .*|decode: .*|teacher-forced: .*)$")


@dataclass
class Job:
    jobid: int
    rule: str
    started: datetime
    log: str | None = None
    wildcards: str = ""
    finished: datetime | None = None


@dataclass
class Run:
    """What Snakemake's log says of one run."""

    log: Path
    planned: dict[str, int] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    cores: int = 1
    steps: tuple[int, int] = (0, 0)
    first: datetime | None = None
    last: datetime | None = None


def newest_run(workdir: Path) -> Run:
    """The newest Snakemake log that ran a job (dry runs and runs that
    stopped before any job also leave logs), parsed."""
    logs = sorted((Path(workdir) / ".snakemake" / "log").glob("*.snakemake.log"))
    if not logs:
        raise FileNotFoundError(f"no Snakemake log under {Path(workdir) / '.snakemake' / 'log'}: run `status` in "
                                "the folder snakemake runs in (its working directory)")
    for log in reversed(logs):
        run = parse(log)
        if run.first is not None:
            return run
    return parse(logs[-1])


def parse(log: Path) -> Run:
    """The planned job counts, every job's start and finish, and the step
    counter, from a Snakemake log."""
    run = Run(log)
    now: datetime | None = None
    current: Job | None = None
    in_stats = False
    for line in log.read_text(errors="replace").splitlines():
        text = line.strip()
        if text == "Job stats:":
            in_stats = True
            continue
        if in_stats:
            if text.startswith("total"):
                in_stats = False
            elif m := COUNT.match(text):
                run.planned[m.group(1)] = run.planned.get(m.group(1), 0) + int(m.group(2))
            continue
        if m := CORES.match(text):
            run.cores = int(m.group(1))
        elif m := STAMP.match(text):
            now = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
            run.first, run.last = run.first or now, now
        elif (m := START.match(text)) and now is not None:
            current = Job(-1, m.group(1), now)
        elif current is not None and text.startswith("jobid:"):
            current.jobid = int(text.split(":", 1)[1])
            run.jobs[current.jobid] = current
        elif current is not None and text.startswith("log:"):
            current.log = text.split(":", 1)[1].strip().split(",")[0]
        elif current is not None and text.startswith("wildcards:"):
            current.wildcards = text.split(":", 1)[1].strip()
        elif (m := FINISH.match(text)) and now is not None:
            job = run.jobs.get(int(m.group(1)))
            if job is not None:
                job.finished = now
        elif m := STEPS.match(text):
            run.steps = (int(m.group(1)), int(m.group(2)))
    return run


def last_progress(log: Path) -> str:
    """A job log's last progress line (without its timestamp), or ''."""
    if not log.is_file():
        return ""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if m := PROGRESS.search(line):
            return m.group(1)
    return ""


def typical_seconds(path: Path | None = None) -> tuple[dict[str, float], float]:
    """Seconds per job of each rule on the machine the table was measured
    on, and the share of its cores that run kept busy (its job seconds over
    wall seconds and cores: Snakemake cannot keep every core busy while one
    job holds the critical path); ({}, 1.0) without the table."""
    path = path or TYPICAL
    if not path.is_file():
        return {}, 1.0
    table = json.loads(path.read_text())
    return table["rules"], float(table.get("efficiency", 1.0))


def remaining_seconds(run: Run) -> tuple[float, float, int]:
    """Seconds the jobs not yet finished should take, over the run's cores
    (at the share of them the typical run kept busy; the views at the end,
    `jobs.VIEW_JOBS`, one after the other):
    each rule's mean duration so far times its jobs left (running ones
    counted at the part of the mean still ahead); a rule with no finished
    job at its `typical` seconds times this machine's speed (the finished
    jobs' seconds against their rules' typical ones).  Returns the total,
    the part of it that rests on typical durations, and how many jobs left
    have neither a finished job nor a typical duration."""
    typical, efficiency = typical_seconds()
    cores = max(run.cores, 1) * efficiency
    done: dict[str, list[float]] = {}
    for job in run.jobs.values():
        if job.finished is not None:
            done.setdefault(job.rule, []).append((job.finished - job.started).total_seconds())
    measured = sum(sum(v) for r, v in done.items() if r in typical)
    expected = sum(typical[r] * len(v) for r, v in done.items() if r in typical)
    speed = min(max(measured / expected, 0.25), 4.0) if expected > 0 else 1.0
    left, guessed, untimed = 0.0, 0.0, 0
    for rule, count in run.planned.items():
        finished = len(done.get(rule, []))
        if rule == "all" or finished >= count:
            continue
        if finished:
            mean = sum(done[rule]) / finished
        elif rule in typical:
            mean = typical[rule] * speed
        else:
            untimed += count
            continue
        running = [j for j in run.jobs.values() if j.rule == rule and j.finished is None]
        ahead = sum(max(mean - (run.last - j.started).total_seconds(), 0.0) for j in running)
        part = (mean * (count - finished - len(running)) + ahead) / (1.0 if rule in VIEW_JOBS else cores)
        left += part
        guessed += part if not finished else 0.0
    return left, guessed, untimed


def report(workdir: Path, now: datetime | None = None) -> str:
    """The status page of the newest run in `workdir`, as of `now` (the
    clock; for a finished run, its last log line)."""
    run = newest_run(workdir)
    if run.first is None:
        return f"run log: {run.log}\nno job started yet"
    done, total = run.steps
    total = total or sum(n for rule, n in run.planned.items() if rule != "all")
    finished = bool(total) and done >= total
    now = run.last if finished else (now or datetime.now())
    run.last = max(run.last, now)
    lines = [f"run log: {run.log}",
             f"{done} of {total} jobs done, {(now - run.first).total_seconds():.0f} s since the run started"]
    running = sorted((j for j in run.jobs.values() if j.finished is None), key=lambda j: j.started)
    own_eta = 0.0  # the longest ETA a running job reports for itself: the run takes at least that
    for job in running:
        progress = last_progress(Path(workdir) / job.log) if job.log else ""
        since = (now - job.started).total_seconds()
        lines.append(f"  running {job.rule} {job.wildcards} ({since:.0f} s): {progress or 'no progress line yet'}")
        if m := ETA.search(progress):
            own_eta = max(own_eta, float(m.group(1)))
    if finished:
        lines.append("finished")
    else:
        left, guessed, untimed = remaining_seconds(run)
        left = max(left, own_eta)
        notes = []
        if guessed:
            notes.append(f"{guessed:.0f} s of it from typical durations of rules not yet timed here, "
                         "scaled to this machine: roughly +-1/3")
        if untimed:
            notes.append(f"+ {untimed} jobs of rules with no typical duration")
        lines.append(f"estimated time left: {left:.0f} s" + (f" ({'; '.join(notes)})" if notes else ""))
    return "\n".join(lines)
