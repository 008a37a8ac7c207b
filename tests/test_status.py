"""The progress view over a Snakemake log and the jobs' own logs: planned
and finished jobs, each running job's last progress line, and the time left
from what each rule's finished jobs took."""

from __future__ import annotations

from datetime import datetime

from conftest import ROOT

from canary_audit.commands.status import parse, report

LOG = """Provided cores: 2
Job stats:
job                      count
---------------------  -------
memorize                     3
decode_pass                  2
all                          1
total                        6

Select jobs to execute...
[Tue Dec  1 10:00:00 2026]
rule memorize:
    log: results/logs/tiny/memorize-bio-s0.log
    jobid: 4
    wildcards: model=tiny, template=bio, seed=0
[Tue Dec  1 10:00:00 2026]
rule memorize:
    log: results/logs/tiny/memorize-meta-s0.log
    jobid: 5
    wildcards: model=tiny, template=meta, seed=0
[Tue Dec  1 10:01:40 2026]
Finished jobid: 4 (Rule: memorize)
1 of 6 steps (17%) done
[Tue Dec  1 10:01:40 2026]
rule memorize:
    log: results/logs/tiny/memorize-none-s0.log
    jobid: 6
    wildcards: model=tiny, template=none, seed=0
"""


def test_status_names_running_jobs_their_progress_and_the_time_left(tmp_path, monkeypatch):
    (tmp_path / ".snakemake" / "log").mkdir(parents=True)
    (tmp_path / ".snakemake" / "log" / "2026-12-01T100000.snakemake.log").write_text(LOG)
    logs = tmp_path / "results" / "logs" / "tiny"
    logs.mkdir(parents=True)
    (logs / "memorize-meta-s0.log").write_text(
        "2026-12-01 10:01:50,000 canary_audit.train.lora INFO "
        "step 240/300 loss 0.41 (110.0s, eta 27s, 7600 tokens/s)\n")
    run = parse(tmp_path / ".snakemake" / "log" / "2026-12-01T100000.snakemake.log")
    assert run.planned == {"memorize": 3, "decode_pass": 2, "all": 1} and run.cores == 2 and run.steps == (1, 6)
    assert {j.rule for j in run.jobs.values() if j.finished is None} == {"memorize"}
    monkeypatch.setattr("canary_audit.commands.status.TYPICAL", tmp_path / "none.json")  # no typical durations here
    page = report(tmp_path, now=datetime(2026, 12, 1, 10, 2, 0))
    assert "1 of 6 jobs done, 120 s since the run started" in page
    assert "running memorize model=tiny, template=meta, seed=0 (120 s): step 240/300 loss 0.41" in page
    assert "running memorize model=tiny, template=none, seed=0 (20 s): no progress line yet" in page
    # memorize took 100 s: the meta job is past it (0 s ahead), the none job has 80 s ahead, over 2 cores;
    # the two decode jobs have no finished job to time
    assert "estimated time left: 40 s (+ 2 jobs of rules with no typical duration)" in page
    # With typical durations (memorize 50 s a job, decode 30 s): this machine ran memorize at 2x, so each
    # decode job is taken at 60 s: (80 + 2 x 60) / 2 cores = 100 s, 60 of it from typical durations.
    typical = tmp_path / "typical.json"
    typical.write_text('{"rules": {"memorize": 50, "decode_pass": 30}, "efficiency": 1.0}')
    monkeypatch.setattr("canary_audit.commands.status.TYPICAL", typical)
    page = report(tmp_path, now=datetime(2026, 12, 1, 10, 2, 0))
    assert "estimated time left: 100 s (60 s of it from typical durations" in page


def test_status_of_the_smoke_run_is_finished(smoke_run):
    page = report(smoke_run)
    assert page.splitlines()[-1] == "finished"


def test_the_estimate_150_s_into_a_recorded_default_run_is_within_30_percent(tmp_path):
    """A default run's Snakemake log (tests/data/default_run.log: its job
    lines, kept from a run on a 2-core machine), cut where 150 s had passed:
    `status` then, with the package's typical durations, is within 30% of
    the time the run actually took after it."""
    from datetime import timedelta

    from canary_audit.commands.status import STAMP

    text = (ROOT / "tests" / "data" / "default_run.log").read_text()
    run = parse(ROOT / "tests" / "data" / "default_run.log")
    cut = run.first + timedelta(seconds=150)
    kept = []
    for line in text.splitlines():
        m = STAMP.match(line.strip())
        if m and datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y") > cut:
            break
        kept.append(line)
    (tmp_path / ".snakemake" / "log").mkdir(parents=True)
    (tmp_path / ".snakemake" / "log" / "run.snakemake.log").write_text("\n".join(kept) + "\n")
    page = report(tmp_path, now=cut)
    estimate = float(page.split("estimated time left: ")[1].split(" s")[0])
    actual = (run.last - cut).total_seconds()
    assert abs(estimate - actual) <= 0.3 * actual, (estimate, actual, page)
