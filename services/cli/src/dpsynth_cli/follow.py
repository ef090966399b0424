"""Following a job to its end (``jobs submit --watch``, ``jobs watch``, ``--wait``) and
printing how it ended in the chosen output mode.

The progress bar writes to stderr, so with ``--quiet`` stdout holds only the id the job
produced (a model, a corpus artifact, an evaluate job's id) and a script keeps it with
``X=$(dpsynth ... --watch --quiet)``.
"""

from __future__ import annotations

from typing import Any

from dpsynth_client import Client
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from dpsynth_cli.common import console, err_console, print_json
from dpsynth_cli.options import Output, print_id
from dpsynth_cli.summaries import next_steps, produced_id
from dpsynth_cli.views import progress_text

WATCH_TIMEOUT_S = 7 * 24 * 3600.0


def follow_job(client: Client, job_id: str, *, poll: float = 2.0,
               timeout: float = WATCH_TIMEOUT_S) -> dict[str, Any]:
    """Poll ``job_id`` under a progress bar (on stderr) until it ends; returns the job."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=err_console, transient=False) as progress:
        task = progress.add_task(job_id, total=None, info="")

        def show(job: dict[str, Any]) -> None:
            p = job.get("progress") or {}
            progress.update(task, total=p.get("total") or None, completed=p.get("step", 0),
                            info=progress_text(job))

        return client.wait_for_job(job_id, timeout=timeout, poll=max(0.0, poll),
                                   on_progress=show)


def report_end(job: dict[str, Any], mode: Output) -> int:
    """Print how ``job`` ended; returns the exit code (0 only when it succeeded and, with
    ``--quiet``, its product could be named).

    Human: ``job … succeeded`` and the next steps (the produced model or corpus and the
    command that comes next). JSON: the job's body, exactly as the api sent it. Quiet: the
    produced id alone. A job that did not succeed is reported on stderr in every mode.
    """
    job_id, state = job.get("job_id", "-"), job.get("state")
    if mode is Output.JSON:
        print_json(job)
    if state != "succeeded":
        error = job.get("error") or {}
        reason = f"{error.get('code')}: {error.get('message') or ''}".strip() if error else ""
        err_console.print(f"[red]job {job_id} ended {state}[/]" + (f": {reason}" if reason
                                                                    else ""),
                          highlight=False, soft_wrap=True)
        return 1
    if mode is Output.QUIET:
        made = produced_id(job)
        if made is None:
            err_console.print(f"[red]job {job_id} succeeded but lists no {job.get('type')} "
                              "product[/] (dpsynth jobs show " f"{job_id})", highlight=False)
            return 1
        print_id(made)
    elif mode is Output.HUMAN:
        console.print(f"job {job_id} succeeded", highlight=False)
        for line in next_steps(job):
            console.print(line, highlight=False, soft_wrap=True)
    return 0


def watch_job(client: Client, job_id: str, *, poll: float = 2.0,
              mode: Output = Output.HUMAN) -> int:
    """Follow ``job_id`` with a progress bar and report its end; returns the exit code
    (130 when the user stops watching with Ctrl-C: the job itself goes on)."""
    try:
        job = follow_job(client, job_id, poll=poll)
    except KeyboardInterrupt:
        err_console.print(f"stopped watching; job {job_id} goes on (dpsynth jobs watch "
                          f"{job_id} to follow it again, dpsynth jobs cancel {job_id} to stop "
                          "it)", highlight=False, soft_wrap=True)
        return 130
    return report_end(job, mode)
