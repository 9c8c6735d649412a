#!/usr/bin/env python3
"""Stop, reshard, resume: scenarios/resume.csv through `pipecheck run`, each row meeting its
expectation, and what its reports must show:

  - a passing float64 row: every parameter's gradient and update within 1e-9 over every step,
    before and after each resume, and its message counting the tensors held bitwise at the resume;
  - steps.csv: every step once, marked with the layout that trained it (0 before the first resume,
    i from the i-th resume's step on); timeline.csv: actions of every layout;
  - the work directory: each resume's checkpoint (pipecheck's own: a manifest listing its files;
    trainers torch and torchtitan: torch.distributed.checkpoint's metadata; deepspeed: its tag's
    folder; megatron: its distributed checkpoint's metadata.json) and each layout's own reports;
  - the controls (CONTROLS): each fails saying what it must.

Rows of another trainer not installed in the Python running this test are left out (said so).
PART i/n runs the suite's rows i, i + n, i + 2n, ... (counting from 1, in the file's order) and
holds them to the same, so that CTest can run the suite in parts that each stay inside their
timeout on a slow machine; every row is in exactly one part whatever the suite holds.

    resume_test.py PIPECHECK SOURCE_DIR WORK_DIR [PART]
"""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path


# What each expect=fail row must say: AdamW's step counts reset after the load show in the update
# of the resume's step; TorchTitan refuses to resume every state from a model-only checkpoint;
# DeepSpeed leaves a tied weight used only through forward_fn out of its checkpoint, and refuses its
# per-stage optimizer state at another pipeline degree.
CONTROLS = {"torch_resume_step_reset": ["): update of ", " at step {step} on rank "],
            "titan_resume_last_save_model_only": ["Missing key in checkpoint state_dict: dataloader.next_step"],
            "ds_resume_same_layout_tied": ["resume before step {step}: rank 0 loaded weight tok_embeddings.weight "
                                           "unlike where the previous ranks ended"],
            "ds_resume_2to4": ["doesn't match the size of optimizer's group"],
            "mg_resume_no_load_optim": ["): update of ", " at step {step} on rank "]}


# The import that proves each other trainer is installed in this Python (the one pipecheck's
# trainers run with): rows of a trainer that is not are left out, and said so.
PROBES = {"torch": "torch.distributed.pipelining", "torchtitan": "torchtitan.trainer",
          "deepspeed": "deepspeed.pipe", "megatron": "megatron.core.pipeline_parallel"}


# One child process tries every import it is given (trainer, module, trainer, module, ...) and
# names each trainer whose import succeeded.
PROBE_SCRIPT = """import importlib, sys
for trainer, module in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        importlib.import_module(module)
    except Exception:
        continue
    print("installed:", trainer, flush=True)
"""


def installed(trainers):
    """The trainers among `trainers` whose import succeeds in this Python ('' is pipecheck's own):
    every import in one child process, so that PyTorch, which each framework imports first, loads
    once (four processes took 18.5 s here, one takes 8.5: 2-vCPU Xeon, all four installed)."""
    probes = [x for t in sorted(trainers) if t for x in (t, PROBES[t])]
    env = dict(os.environ, DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"))
    done = subprocess.run([sys.executable, "-c", PROBE_SCRIPT, *probes], capture_output=True, text=True, env=env)
    return {""} | {line.split()[1] for line in done.stdout.splitlines() if line.startswith("installed: ")}


def suite_rows(path):
    return {r["name"]: r for r in csv.DictReader(line for line in open(path) if not line.startswith("#"))}


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    pipecheck, source, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    suite = source / "scenarios" / "resume.csv"
    out = work / "resume"
    spec = suite_rows(suite)
    if len(sys.argv) == 5:
        part, _, parts = sys.argv[4].partition("/")
        if not (part.isdigit() and parts.isdigit() and 1 <= int(part) <= int(parts)):
            sys.exit(f"resume_test.py: PART must be i/n with 1 <= i <= n, not {sys.argv[4]!r}")
        spec = {name: s for index, (name, s) in enumerate(spec.items()) if index % int(parts) == int(part) - 1}
        print(f"part {part}/{parts}: {len(spec)} rows of scenarios/resume.csv")
    trainers = {s["trainer"] for s in spec.values()}
    missing = sorted(trainers - installed(trainers))
    for trainer in missing:
        print(f"SKIPPED: the rows of trainer {trainer} ({PROBES[trainer]} does not import in {sys.executable})")
    spec = {name: s for name, s in spec.items() if s["trainer"] not in missing}
    done = subprocess.run([pipecheck, "run", "--scenarios", str(suite), "--out", str(out), "--only", ",".join(spec)],
                          capture_output=True, text=True)
    print(done.stdout[-3000:])
    if done.returncode != 0:
        print(done.stderr[-3000:])
        print("FAIL: pipecheck run scenarios/resume.csv exited", done.returncode)
        return 1
    rows = list(csv.DictReader(open(out / "summary.csv", newline="")))
    steps = list(csv.DictReader(open(out / "steps.csv", newline="")))
    timeline = list(csv.DictReader(open(out / "timeline.csv", newline="")))
    failures = []
    if {r["scenario"] for r in rows} != set(spec):
        failures.append(f"summary.csv holds {sorted(r['scenario'] for r in rows)}, the suite {sorted(spec)}")
    for row in rows:
        name, s = row["scenario"], spec[row["scenario"]]
        resumes = [int(part.split(":")[0]) for part in s["resume"].split("|")]
        if row["ok"] != "1":
            failures.append(f"{name}: {row['status']} against expect={s['expect']}: {row['message']}")
            continue
        if s["expect"] != "pass" and name not in CONTROLS:
            failures.append(f"{name}: an expect=fail row this test does not know what to hold to")
        if s["expect"] == "pass":
            if s["dtype"] == "float64":
                for column in ("grad_max_rel_err", "weights_max_rel_err"):
                    if not float(row[column]) <= 1e-9:
                        failures.append(f"{name}: {column} {row[column]} > 1e-9")
            if "tensors loaded on" not in row["message"]:
                failures.append(f"{name}: the message counts no tensors held at the resume: {row['message']}")
        elif name in CONTROLS:
            for said in (text.format(step=resumes[0]) for text in CONTROLS[name]):
                if said not in row["message"]:
                    failures.append(f"{name}: {row['status']}, but its message must say {said!r}: {row['message']}")
        # steps.csv: every step once, with the layout that ran it.
        mine = sorted((int(r["step"]), int(r["layout"])) for r in steps if r["scenario"] == name)
        expected = [(k, sum(1 for step in resumes if k >= step)) for k in range(int(s["steps"]))]
        if s["expect"] == "pass" and mine != expected:
            failures.append(f"{name}: steps.csv has (step, layout) {mine}, expected {expected}")
        layouts = {int(r["layout"]) for r in timeline if r["scenario"] == name}
        if s["expect"] == "pass" and not s["trainer"] and layouts != set(range(len(resumes) + 1)):
            failures.append(f"{name}: timeline.csv has actions of layouts {sorted(layouts)}")
        for step in resumes:
            folder = out / "work" / name / f"checkpoint_after_step{step}"
            marker = {"torch": folder / ".metadata", "torchtitan": folder / f"step-{step}" / ".metadata",
                      "deepspeed": folder / f"step{step}" / "mp_rank_00_model_states.pt",
                      "megatron": folder / "metadata.json"}.get(
                s["trainer"], folder / "manifest.json")
            if not marker.is_file():
                failures.append(f"{name}: no {marker}")
            elif not s["trainer"]:
                manifest = json.load(open(marker))
                if manifest["step"] != step or not manifest["files"]:
                    failures.append(f"{name}: {marker} says step {manifest['step']} with {len(manifest['files'])} files")
        for layout in range(len(resumes) + 1 if s["expect"] == "pass" else 0):
            if not (out / "work" / name / f"layout{layout}" / "summary.csv").is_file():
                failures.append(f"{name}: layout {layout} left no reports of its own")
    print(f"scenarios/resume.csv: {len(rows)} rows, {sum(r['status'] == 'PASS' for r in rows)} PASS")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
