#!/usr/bin/env python3
"""The ready CI pipelines in ci/ are valid YAML and run only what exists.

Every command a job runs must be one of: `make TARGET [VAR=...]` with TARGET a Makefile target and
each VAR a Makefile variable, or `build/pipecheck SUBCOMMAND [--flag ...]` with every flag one
that `pipecheck SUBCOMMAND --help` lists. The jobs must be the ones promised: a CPU job in a
Debian 12 container running the README's two commands, a GPU job on a self-hosted `gpu` runner
running `make test`, the GPU suite and a compare; each keeps the reports and the JUnit files.

Needs PyYAML (requirements.txt installs it into .venv; an active environment may lack it); exits 77 (skipped)
where the interpreter has none.
Usage: ci_pipelines_test.py PIPECHECK SOURCE_DIR
"""
import re
import shlex
import subprocess
import sys
from pathlib import Path

try:
    import yaml
except ImportError:
    print("skipped: this python3 has no yaml module (pip install pyyaml)")
    sys.exit(77)

pipecheck, source = sys.argv[1], Path(sys.argv[2])
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


makefile = (source / "Makefile").read_text()
make_targets = set(re.findall(r"^([A-Za-z][\w-]*):", makefile, re.M))
make_variables = set(re.findall(r"^([A-Z_]+)\s*\??=", makefile, re.M))
readme = (source / "README.md").read_text()
help_cache = {}


def flags_of(subcommand):
    if subcommand not in help_cache:
        result = subprocess.run([pipecheck, *subcommand.split(), "--help"], capture_output=True, text=True)
        check(result.returncode == 0, f"`pipecheck {subcommand} --help` failed: {result.stderr}")
        help_cache[subcommand] = set(re.findall(r"(--[a-z][a-z-]*)", result.stdout))
    return help_cache[subcommand]


def check_command(where, line):
    words = shlex.split(line)
    if not words:
        return
    if words[0] == "make":
        targets = [w for w in words[1:] if "=" not in w]
        check(len(targets) == 1 and targets[0] in make_targets, f"{where}: `{line}`: not a single Makefile target")
        for assignment in (w for w in words[1:] if "=" in w):
            name, value = assignment.split("=", 1)
            check(name in make_variables, f"{where}: `{line}`: {name} is not a Makefile variable")
            if name == "RUN_ARGS":  # the arguments `make run` hands to `pipecheck run`
                check_pipecheck(where, ["run", *shlex.split(value)], line)
        return
    check(words[0] == "build/pipecheck", f"{where}: `{line}`: runs {words[0]}, neither make nor build/pipecheck")
    check_pipecheck(where, words[1:], line)


def check_pipecheck(where, words, line):
    subcommand = words[0]
    if subcommand == "baseline":
        subcommand = "baseline " + words[1]
    check(subcommand.split()[0] in {"run", "compare", "invariance", "baseline", "schedule", "validate", "dump",
                                    "reference"}, f"{where}: `{line}`: no subcommand {subcommand}")
    known = flags_of(subcommand)
    for word in words:
        if word.startswith("--"):
            check(word.split("=")[0] in known, f"{where}: `{line}`: `pipecheck {subcommand}` has no flag {word}")


def words(line):
    """A command's words, the arguments inside RUN_ARGS="..." included."""
    result = []
    for word in shlex.split(line):
        result.extend(shlex.split(word.split("=", 1)[1]) if word.startswith("RUN_ARGS=") else [word])
    return result


def commands(text):
    """Lines of a shell script block, continuations joined, comments and blanks dropped."""
    joined = text.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


# GitHub Actions
github = yaml.safe_load((source / "ci/github-actions.yml").read_text())
jobs = github["jobs"]
check(set(jobs) == {"cpu", "gpu"}, f"github: jobs {sorted(jobs)}")
check(jobs["cpu"].get("container") == "debian:12", "github: the CPU job runs in a Debian 12 container")
check("self-hosted" in jobs["gpu"]["runs-on"] and "gpu" in jobs["gpu"]["runs-on"],
      "github: the GPU job runs on a self-hosted gpu runner")
for name, job in jobs.items():
    ran, uploads = [], []
    for step in job["steps"]:
        if "run" in step:
            for line in commands(step["run"]):
                check_command(f"github {name}", line)
                ran.append(line)
        if step.get("uses", "").startswith("actions/upload-artifact"):
            uploads.append(step["with"]["path"])
            check(step.get("if") == "always()", f"github {name}: reports are uploaded even when a step failed")
    check(any(line == "make test" for line in ran), f"github {name}: runs `make test`")
    check(uploads, f"github {name}: uploads the reports")
    check(any("--junit" in line for line in ran), f"github {name}: writes JUnit")
    check(any("--markdown $GITHUB_STEP_SUMMARY" in line for line in ran), f"github {name}: writes the step summary")
    junit_dirs = {Path(w).parent.as_posix() + "/" for line in ran for w in words(line) if w.endswith(".xml")}
    check(all(any(d == u or d.startswith(u) for u in uploads) for d in junit_dirs),
          f"github {name}: the JUnit files {junit_dirs} are inside the uploads {uploads}")
cpu_lines = [l for s in jobs["cpu"]["steps"] if "run" in s for l in commands(s["run"])]
check(any(l.startswith("make run") for l in cpu_lines), "github cpu: runs `make run`")
gpu_lines = [l for s in jobs["gpu"]["steps"] if "run" in s for l in commands(s["run"])]
check(any("scenarios/gpu.csv" in l for l in gpu_lines), "github gpu: runs the GPU suite")
check(any(l.startswith("build/pipecheck compare") for l in gpu_lines), "github gpu: compares with a baseline")

# GitLab CI
gitlab = yaml.safe_load((source / "ci/gitlab-ci.yml").read_text())
gitlab_jobs = {k: v for k, v in gitlab.items() if isinstance(v, dict) and "script" in v}
check(set(gitlab_jobs) == {"cpu", "gpu"}, f"gitlab: jobs {sorted(gitlab_jobs)}")
check(gitlab_jobs["cpu"].get("image") == "debian:12", "gitlab: the CPU job runs in Debian 12")
check("gpu" in gitlab_jobs["gpu"].get("tags", []), "gitlab: the GPU job runs on a runner tagged gpu")
for name, job in gitlab_jobs.items():
    check(job.get("stage") in gitlab.get("stages", []), f"gitlab {name}: its stage is declared")
    for line in job["script"]:
        check_command(f"gitlab {name}", line)
    check("make test" in job["script"], f"gitlab {name}: runs `make test`")
    artifacts = job.get("artifacts", {})
    check(artifacts.get("when") == "always", f"gitlab {name}: artifacts kept when the job fails")
    junit = artifacts.get("reports", {}).get("junit")
    junit = [junit] if isinstance(junit, str) else (junit or [])
    check(junit, f"gitlab {name}: JUnit reports declared")
    written = {w for line in job["script"] for w in words(line) if w.endswith(".xml")}
    check(set(junit) == written, f"gitlab {name}: declared JUnit files {junit} are the ones written {sorted(written)}")
    check(all(any(j.startswith(p) for p in artifacts.get("paths", [])) for j in junit),
          f"gitlab {name}: the JUnit files lie inside the artifact paths")
check(any(l.startswith("make run") for l in gitlab_jobs["cpu"]["script"]), "gitlab cpu: runs `make run`")

# The README's quick start is what the CPU jobs run.
check("make run" in readme and "make test" in readme, "README: quick start names make run and make test")

for failure in failures:
    print("FAIL:", failure)
print(f"{len(failures)} problem(s); commands checked against the Makefile and `pipecheck --help`")
sys.exit(1 if failures else 0)
